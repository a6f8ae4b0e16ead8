"""Check: ``sampler.confidence: d1 / stabledrl`` commits what the releases' samplers commit.

    python tests/parity/release_confidence.py --d1 ~/d1 --release ~/StableDRL

Synthetic blocks (``block_logits``: 32 positions over a vocabulary of 64, bf16-valued logits, the
[MASK] logit lowered by ``shift``) are decoded for one step, greedily, 4 of 32 positions committed,
by d1's ``DiffuGRPOTrainer.generate`` (its model reads bf16) and by the StableDRL release's
``generate_spg`` (its model reads fp32, as under its FSDP launch), each calling a stand-in model that
returns the block's logits; and by the project's decode step under each ``sampler.confidence``. The
positions each one committed are compared block by block, over the blocks where no position has
[MASK] as its argmax (there the releases commit a [MASK] and keep the position open, which the
project never does). Prints one JSON line with the figures tests/unit/rollout/test_release_confidence.py
pins (the releases' commit sets as a digest, the blocks where the float32 default differs); exits 1 on
a difference. The releases' code is read from the paths given.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
V, L, MASK, STEPS, BLOCKS = 64, 32, 2, 8, 200
PROMPT = torch.tensor([5, 6, 7])


def block_logits(block: int, shift: float) -> torch.Tensor:
    """[1, L, V] a synthetic block: bf16-valued logits of spread 4, [MASK]'s lowered by ``shift``."""
    g = torch.Generator().manual_seed(3000 + block)
    logits = (torch.randn(1, L, V, generator=g) * 4.0).to(torch.bfloat16).float()
    logits[..., MASK] -= shift
    return logits


def mask_wins(logits: torch.Tensor) -> bool:
    return bool(logits.argmax(-1).eq(MASK).any())


def project_commits(logits: torch.Tensor, confidence: str) -> list[int]:
    """Completion positions the project's first decode step commits."""
    from stabledrl.rollout.sampling.canvas import build_canvas
    from stabledrl.rollout.sampling.decode import transfer_schedule
    from stabledrl.rollout.sampling.state import DecodeState

    canvas = build_canvas([PROMPT], L, mask_token_id=MASK, pad_token_id=0, device="cpu")
    state = DecodeState.start(canvas, L, MASK, 1)
    state.step(logits.clone(), [torch.Generator()], temperature=0.0, remasking="low_confidence",
               schedule=transfer_schedule(L, STEPS), threshold=None, noise_dtype="float64", stop_at_eos=False,
               confidence=confidence)
    return (canvas.completion[0] != MASK).nonzero().flatten().tolist()


def digest(sets: dict[int, list[int]]) -> str:
    return hashlib.sha256(json.dumps(sorted(sets.items())).encode()).hexdigest()[:16]


class _Stand(torch.nn.Module):
    """A model that returns the block's logits at the completion, in the dtype the release reads."""

    def __init__(self, logits: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.logits, self._dtype, self.calls = logits, dtype, []

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, x, attention_mask=None):
        self.calls.append(x.clone())
        out = torch.zeros(x.shape[0], x.shape[1], V)
        out[:, -L:] = self.logits
        return types.SimpleNamespace(logits=out)


def release_commits(d1_dir: Path, release: Path, shift: float) -> dict[str, dict[int, list[int]]]:
    """{release: {block: committed positions}} over the blocks where [MASK] is nobody's argmax."""
    spec = importlib.util.spec_from_file_location("d1_masks_parity", HERE / "d1_masks.py")
    masks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(masks)
    trainer = masks._d1_trainer(d1_dir, 1)
    trainer.args.fp16 = False
    sys.path.insert(0, str(release))
    svpo = importlib.import_module("networks.llada_svpo")
    out: dict[str, dict[int, list[int]]] = {"d1": {}, "stabledrl": {}}
    for block in range(BLOCKS):
        logits = block_logits(block, shift)
        if mask_wins(logits):
            continue
        d1_model = _Stand(logits, torch.bfloat16)
        trainer.generate(d1_model, PROMPT[None], steps=STEPS, gen_length=L, block_length=L, temperature=0.0,
                         remasking="low_confidence", mask_id=MASK)
        sdrl_model = _Stand(logits, torch.float32)
        svpo.generate_spg(sdrl_model, PROMPT[None], steps=STEPS, gen_length=L, block_length=L, temperature=0.0,
                          mask_id=MASK, prompt_mask=torch.ones(1, len(PROMPT)))
        for name, model in (("d1", d1_model), ("stabledrl", sdrl_model)):
            out[name][block] = (model.calls[1][0, len(PROMPT):] != MASK).nonzero().flatten().tolist()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d1", required=True, help="a checkout of dllm-reasoning/d1")
    ap.add_argument("--release", required=True, help="a checkout of the StableDRL release")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result, ok = {}, True
    for shift in (20.0, 3.0):
        theirs = release_commits(Path(args.d1).expanduser(), Path(args.release).expanduser(), shift)
        for name, sets in theirs.items():
            own = {b: project_commits(block_logits(b, shift), name) for b in sets}
            default = {b: project_commits(block_logits(b, shift), "float32") for b in sets}
            differ = sorted(b for b in sets if own[b] != sets[b])
            ok &= not differ
            result[f"{name}_shift{shift:g}"] = {
                "blocks": len(sets), "digest": digest(sets), "option_differs": differ,
                "float32_differs": {b: sets[b] for b in sets if default[b] != sets[b]}}
    print(json.dumps({"ok": ok, **result}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

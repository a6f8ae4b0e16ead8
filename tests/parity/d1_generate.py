"""Check: d1's ``generate()`` and this project's ``sampler.compat: d1`` give the same tokens.

    python tests/parity/d1_generate.py --d1 ~/d1 --llada DIR_WITH_modeling_llada.py [--rows 3 --gen 16]
    python tests/parity/d1_generate.py --d1 ~/d1 --llada DIR --dtype bfloat16 --device cuda --json

A tiny random LLaDA is written in LLaDA's released layout (``stabledrl.common.models.convert``'s export of a
deterministic project model: config.json with LLaDA's keys, ``model.transformer.*`` weights), then
loaded twice: by LLaDA's own model code (``modeling_llada.py`` / ``configuration_llada.py`` from
DIR, as d1 loads the checkpoint) and by this project's loader (the conversion to a Llama block).
A left-padded batch of prompts of different lengths (padding visible, as d1's collate pads it) is
decoded greedily in fp32 by d1's ``eval/generate.py::generate`` and by ``stabledrl.rollout.sampling`` with
``compat: d1``; the completions must be token-identical. Exits 1 naming the first difference.

``--dtype bfloat16`` casts both models to bf16 (the dtype d1 loads LLaDA in; on CUDA both decode
under fp16 autocast, as d1's eval does) and reports the agreement instead of requiring identity:
tokens equal, rows equal, and where the first difference lies. ``--rows`` / ``--gen`` / ``--width``
scale the case (``--width`` the model's hidden size, its other sizes in proportion). ``--json``
prints one JSON line of it.

``tiny_case()`` is the deterministic model and batch; ``tests/unit/rollout/test_d1_compat.py`` pins the
project's tokens on it to the figures this check printed from d1's ``generate()``.
Neither d1's code nor LLaDA's is part of the project: both are read from the paths given.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import torch

VOCAB, PAD, EOS, MASK, BOS = 97, 0, 1, 2, 3
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def tiny_case(rows: int = 4, gen_length: int = 32, block_length: int = 8, mask_tie: bool = False, width: int = 64,
              layers: int = 2):
    """(policy, padded prompts [B, P], sampler config): a fixed random LLaDA-family policy in fp32
    whose every weight is drawn from its own seeded generator (independent of init schemes).
    ``mask_tie``: the [MASK] row of the output head equals a frequent token's, so [MASK] wins some
    argmaxes (the lower id wins a tie), which d1 lets happen. ``width`` / ``layers``: a larger model
    of the same proportions (64 and 2: ``SHAPE``), its matrices scaled by sqrt(64 / width)."""
    from stabledrl.common.config.sampler import SamplerConfig
    from stabledrl.common.models.presets import build_tiny_policy

    shape = dict(SHAPE, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                 num_attention_heads=width // 16, num_key_value_heads=width // 32)
    scale = 0.15 * (64 / width) ** 0.5
    policy = build_tiny_policy("llada", vocab_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD,
                               bos_token_id=BOS, seed=0, **shape)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(policy.model.named_parameters())):
            g = torch.Generator().manual_seed(1000 + i)
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if p.dim() == 1 else noise * (1.0 if "embed" in name else scale))
        head = policy.model.lm_head.weight
        if mask_tie:
            head[MASK] = head[50]  # [MASK] ties a frequent token (argmax: the lower id, [MASK]): d1 lets it win
    g = torch.Generator().manual_seed(7)
    lengths = [5 + 4 * r for r in range(rows)]
    width = max(lengths)
    prompts = torch.full((rows, width), PAD, dtype=torch.long)
    for r, n in enumerate(lengths):
        body = torch.randint(4, VOCAB, (n - 1,), generator=g)
        prompts[r, width - n :] = torch.cat([torch.tensor([BOS]), body])
    cfg = SamplerConfig(gen_length=gen_length, block_length=block_length, steps=gen_length // 2, temperature=0.0,
                        compat="d1", max_batch_size=rows)
    return policy, prompts, cfg


def project_tokens(policy, prompts: torch.Tensor, cfg) -> torch.Tensor:
    from stabledrl.rollout.sampling import generate

    out = generate(policy, list(prompts), torch.zeros(len(prompts), dtype=torch.long), cfg)
    return out.completion_ids.cpu()


def write_released(policy, directory: Path, llada_dir: Path) -> None:
    """The policy in LLaDA's released layout, with LLaDA's model code beside it."""
    from safetensors.torch import save_file

    from stabledrl.common.models.convert import hf_to_original

    raw, state = hf_to_original("llada", policy.model.config, {k: v.contiguous() for k, v in
                                                               policy.model.state_dict().items()})
    raw.update(pad_token_id=PAD, eos_token_id=EOS, mask_token_id=MASK, init_device="cpu", torch_dtype="float32")
    (directory / "config.json").write_text(json.dumps(raw, indent=1))
    save_file(state, str(directory / "model.safetensors"))
    for name in ("modeling_llada.py", "configuration_llada.py"):
        (directory / name).write_text((llada_dir / name).read_text())


def load_released(model_dir: Path):
    """LLaDA's own model class on the released directory: what d1's ``AutoModel.from_pretrained(...,
    trust_remote_code=True)`` builds (built here directly: newer transformers' loader trips on
    LLaDA's code), every weight loaded strictly."""
    import importlib.util

    from safetensors.torch import load_file

    package = "released_llada"
    spec = importlib.util.spec_from_file_location(package, model_dir / "__init__.py",
                                                  submodule_search_locations=[str(model_dir)])
    (model_dir / "__init__.py").write_text("")
    sys.modules[package] = importlib.util.module_from_spec(spec)
    configuration = importlib.import_module(f"{package}.configuration_llada")
    modeling = importlib.import_module(f"{package}.modeling_llada")
    config = configuration.LLaDAConfig(**json.loads((model_dir / "config.json").read_text()))
    for key, value in (("use_cache", False), ("use_return_dict", True)):  # attributes newer configs dropped
        if not hasattr(config, key):
            object.__setattr__(config, key, value)
    model = modeling.LLaDAModelLM(config, init_params=False) if "init_params" in \
        modeling.LLaDAModelLM.__init__.__code__.co_varnames else modeling.LLaDAModelLM(config)
    missing, unexpected = model.load_state_dict(load_file(str(model_dir / "model.safetensors")), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"LLaDA's model code does not take the released weights: missing {missing}, "
                           f"unexpected {unexpected}")
    return model.float().eval()


def d1_tokens(d1_dir: Path, model_dir: Path, prompts: torch.Tensor, cfg, dtype: torch.dtype = torch.float32,
              device: str = "cpu") -> torch.Tensor:
    import torch.distributed as dist

    if not dist.is_initialized():  # d1's generate() asks for the rank
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkstemp()[1]}", rank=0, world_size=1)
    sys.path.insert(0, str(d1_dir / "eval"))
    d1_generate = importlib.import_module("generate").generate
    model = load_released(model_dir).to(device=device, dtype=dtype)
    out = d1_generate(model, prompts.to(device), None, steps=cfg.steps, gen_length=cfg.gen_length,
                      block_length=cfg.block_length, temperature=0.0, remasking="low_confidence", mask_id=MASK)
    return out[:, prompts.shape[1] :].cpu()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d1", required=True, help="a checkout of dllm-reasoning/d1 (its eval/generate.py is run)")
    ap.add_argument("--llada", required=True, help="a directory holding LLaDA's modeling_llada.py and "
                    "configuration_llada.py")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--gen", type=int, default=32, help="generation length (a multiple of 8)")
    ap.add_argument("--mask-tie", action="store_true", help="make [MASK] win some argmaxes (tiny_case)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="both models' dtype (bfloat16: d1's; on CUDA both decode under fp16 autocast)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--width", type=int, default=64, help="the model's hidden size (64: the tiny case)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON line of the agreement")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    policy, prompts, cfg = tiny_case(args.rows, args.gen, mask_tie=args.mask_tie, width=args.width,
                                     layers=args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        write_released(policy, Path(tmp), Path(args.llada))
        ours = project_tokens(policy.to(device=args.device, dtype=dtype), prompts, cfg)
        theirs = d1_tokens(Path(args.d1), Path(tmp), prompts, cfg, dtype, args.device)
    if args.json or args.dtype != "float32":
        return report_agreement(ours, theirs, args)
    print("prompts:", prompts.tolist())
    print("d1 generate():", theirs.tolist())
    print("compat d1:    ", ours.tolist())
    if not torch.equal(ours, theirs):
        row, pos = (ours != theirs).nonzero()[0].tolist()
        print(f"DIFFERENT: row {row}, completion position {pos}: d1 {theirs[row, pos].item()}, "
              f"project {ours[row, pos].item()}")
        return 1
    print(f"identical: {ours.numel()} tokens over {len(ours)} rows "
          f"({int((ours == MASK).sum())} left as [MASK], as d1 leaves them)")
    return 0


def report_agreement(ours: torch.Tensor, theirs: torch.Tensor, args) -> int:
    """One JSON line: tokens and rows equal, the first difference; 0 when every token is equal."""
    equal = ours == theirs
    first = [int(v) for v in (~equal).nonzero()[0].tolist()] if not bool(equal.all()) else None
    print(json.dumps({
        "dtype": args.dtype, "device": args.device, "autocast_fp16": args.device.startswith("cuda"),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "width": args.width, "layers": args.layers, "rows": int(ours.shape[0]), "gen_length": int(ours.shape[1]),
        "tokens_equal": int(equal.sum()), "tokens": int(equal.numel()), "rows_identical": int(equal.all(1).sum()),
        "first_difference_row_position": first}))
    return 0 if first is None else 1


if __name__ == "__main__":
    sys.exit(main())

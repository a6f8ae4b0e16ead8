"""A random-initialised checkpoint at a family's real shape, in its released on-disk layout, written
fast: every tensor is drawn on the device (a GPU draws 8B parameters in a fraction of a second)
and written shard by shard, never a whole model in host memory.

    <dir>/config.json                       the family's released keys (LLaDA: d_model, n_layers,
                                            ...; SDAR: model_type sdar, head_dim ...), token ids
    <dir>/model-0000k-of-0000n.safetensors  the released parameter names, ~``shard_gb`` each
    <dir>/model.safetensors.index.json      {"metadata": {"total_size"}, "weight_map"}
    <dir>/tokenizer files                   the family's released tokenizer (ids, chat template;
                                            common/models/release_tokenizers.py); tiny shapes the
                                            character tokenizer, unless --release-tokenizer (then
                                            the release's vocabulary size, 126-152k rows)

Values: matrices and embeddings N(0, 0.02) (transformers' initializer_range, as the engine
benchmark's models), RMSNorm weights 1. ``head_scale`` multiplies the LM head: a random model's
top-1 probability is about 1/V, so threshold decoding would commit one token per step; the engine
benchmark scales the head of this very initialisation by 13.5 at LLaDA-8B's shape so that the
median top-1 probability of a step reaches 0.9 (bench_full_attention's threshold run), and the system benchmark does
the same so that a threshold sampler commits several tokens per forward as a trained model does.

``layers`` keeps the shape's width and takes fewer layers (a full-parameter learner on one GPU
cannot hold 8B parameters' AdamW states: run_system.py's 2-GPU plan).

    python tests/benchmarks/random_checkpoint.py --shape llada-8b --dir /tmp/ckpt/llada-8b
    python tests/benchmarks/random_checkpoint.py --shape llada-8b --layers 11 --dir /tmp/ckpt/llada-8b-11l
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import benchlib as bl
import torch

# the released checkpoints' head-scale that gives threshold decoding its speed (module docstring)
THRESHOLD_HEAD_SCALE = {"llada": 13.5}


def write_tokenizer(family: str, directory: Path, release: bool) -> int:
    """The family's released tokenizer files (ids, layout, chat template; the ordinary vocabulary
    byte-level, common/models/release_tokenizers.py), or with ``release=False`` the character
    tokenizer (ids 0-3, no template: the CPU rehearsal's tiny shapes, whose 512-row vocabulary keeps
    them fast); returns the embedding rows it needs."""
    if not release:
        from stabledrl.common.tokenizer import build_char_tokenizer

        build_char_tokenizer().save_pretrained(directory)
        return 0
    from stabledrl.common.models.release_tokenizers import write_release_tokenizer

    return write_release_tokenizer(family, directory).vocab_size


def token_ids(directory: Path) -> dict[str, int]:
    """mask / eos / pad / bos ids of the tokenizer just written (the loader's own rules)."""
    from stabledrl.common.models.loading import resolve_token_ids
    from stabledrl.common.models.tokenizer_files import load_tokenizer

    tokenizer = load_tokenizer(directory)
    mask, eos, pad = resolve_token_ids({}, tokenizer)
    bos = tokenizer.bos_token_id
    return {
        "mask_token_id": mask,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "bos_token_id": eos if bos is None else bos,
    }


def released_layout(shape_name: str, ids: dict[str, int], vocab_size: int,
                    layers: Optional[int] = None) -> tuple[str, dict, dict[str, torch.Size]]:
    """(family, config.json dict, released parameter name -> shape) without allocating the model;
    ``layers``: that many layers instead of the shape's."""
    from stabledrl.common.models.convert import hf_to_original
    from stabledrl.common.models.presets import build_tiny_policy

    shape = {**bl.SHAPES[shape_name], "vocab_size": vocab_size}
    if layers is not None:
        shape["num_hidden_layers"] = layers
    family = shape.pop("family")
    with torch.device("meta"):
        policy = build_tiny_policy(family, mask_token_id=ids["mask_token_id"], eos_token_id=ids["eos_token_id"],
                                   pad_token_id=ids["pad_token_id"], bos_token_id=ids["bos_token_id"],
                                   dtype=torch.bfloat16, **shape)
    state = dict(policy.model.state_dict())
    raw, original = hf_to_original(family, policy.model.config, state)
    raw.update({k: v for k, v in ids.items() if k != "bos_token_id"})
    raw["bos_token_id"] = ids["bos_token_id"]
    raw["torch_dtype"] = "bfloat16"
    return family, raw, {name: t.shape for name, t in original.items()}


def write_random_checkpoint(shape_name: str, directory: Path, *, device: torch.device, seed: int = 0,
                            shard_gb: float = 5.0, head_scale: Optional[float] = None,
                            release: Optional[bool] = None, layers: Optional[int] = None) -> dict:
    """Write the checkpoint (module docstring); returns what was written and how long it took.
    ``release``: the released tokenizer (default for real shapes) or the character one (default
    for tiny shapes); ``layers``: fewer layers at the shape's width."""
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    directory = Path(directory)
    if (directory / "model.safetensors.index.json").is_file() and (directory / "config.json").is_file():
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        total = index["metadata"]["total_size"]  # bytes, bf16
        return {"shape": shape_name, "layers": layers, "directory": str(directory), "reused": True,  # an earlier call
                "parameters": total // 2, "gib": total / 2**30}  # gib: what run_system sets the in-job push against
    directory.mkdir(parents=True, exist_ok=True)
    family = bl.SHAPES[shape_name]["family"]
    release = not shape_name.startswith("tiny") if release is None else release
    vocab = max(bl.SHAPES[shape_name]["vocab_size"], write_tokenizer(family, directory, release))
    ids = token_ids(directory)
    family, raw, shapes = released_layout(shape_name, ids, vocab, layers)
    head_scale = THRESHOLD_HEAD_SCALE.get(family) if head_scale is None else head_scale
    head = "model.transformer.ff_out.weight" if family == "llada" else "lm_head.weight"
    gen = torch.Generator(device).manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    limit = int(shard_gb * 2**30)
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = shape
        size += nbytes
    total, weight_map, files = 0, {}, []
    for k, names in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in names.items():
            if len(shape) == 1:  # RMSNorm weights
                t = torch.ones(shape, dtype=torch.bfloat16, device=device)
            else:
                t = torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, 0.02, generator=gen)
                t = (t * (head_scale if name == head and head_scale else 1.0)).to(torch.bfloat16)
            tensors[name] = t.cpu()
            total += tensors[name].numel() * 2
            weight_map[name] = file
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        files.append(file)
        del tensors
    del t, gen
    if torch.device(device).type == "cuda":  # the caller's process holds no cached blocks (5 GiB) during a job after
        torch.cuda.empty_cache()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")  # last: complete
    return {"shape": shape_name, "family": family, "layers": raw.get("n_layers", raw.get("num_hidden_layers")),
            "directory": str(directory), "parameters": total // 2,
            "gib": total / 2**30, "shards": len(files), "head_scale": head_scale, "token_ids": ids,
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, choices=sorted(bl.SHAPES))
    ap.add_argument("--dir", required=True, help="the checkpoint directory")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--head-scale", type=float, default=None, help="default: 13.5 for LLaDA, none otherwise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers at the shape's width (default: the shape's)")
    ap.add_argument("--out", default=None, help="JSON record of what was written")
    ap.add_argument("--release-tokenizer", action="store_true", help="also for a tiny shape (slower on a CPU)")
    a = ap.parse_args()
    res = bl.Result("random_checkpoint", a.out, vars(a), probe=False)
    with res.part("write"):
        res.put("write", write_random_checkpoint(a.shape, Path(a.dir), device=bl.device(), seed=a.seed,
                                                 shard_gb=a.shard_gb, head_scale=a.head_scale,
                                                 release=True if a.release_tokenizer else None, layers=a.layers))
    if res.data["errors"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Check: the dtype the StableDRL release's ``generate_spg`` casts its Gumbel scores to, under its launch.

    # on a GPU, under the release's own accelerate FSDP config (mixed_precision bf16, use_orig_params):
    accelerate launch --config_file RELEASE/configs/accelerate/fsdp.yaml --num_processes 1 \\
        tests/parity/stabledrl_noise_dtype.py --release RELEASE
    # on the CPU: torch FSDP over gloo with accelerate's upcast of the flat parameters, emulated
    python tests/parity/stabledrl_noise_dtype.py --release RELEASE --cpu-emulation [--world-size 2]

``generate_spg`` (``networks/llada_svpo.py``) reads ``dtype = model.dtype`` at every call and hands it
to ``add_gumbel_noise_spg``, which computes the noisy scores in fp32 and casts them ``.to(dtype)``;
its confidence is ``softmax(logits.to(dtype))``. The release generates with the FSDP-wrapped model,
loaded in bf16 (``torch_dtype: bfloat16``) and prepared by accelerate with ``mixed_precision: bf16``,
which upcasts every FSDP flat parameter to fp32 (as DeepSpeed keeps fp32 masters); with
``use_orig_params`` the module's parameters become views of those once FSDP has run a forward. So
``model.dtype`` may read bf16 at the first call and fp32 afterwards. This script builds a tiny random
LLaDA in the release's own class (``LLaDASVPO``, from its ``networks/``), prepares it as the release
does, calls ``generate_spg`` three times and records what ``add_gumbel_noise_spg`` received.

Prints one JSON line: ``model_dtype`` before the first call, ``calls`` (the dtype handed to
``add_gumbel_noise_spg`` and the logits' dtype, per call), ``launch`` (what ran it). The release's
code is read from ``--release``; nothing of it is in the project.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def tiny_release_checkpoint(release: Path, directory: Path) -> None:
    """The tiny LLaDA of tests/parity/d1_generate.py in LLaDA's released layout, the release's model code beside it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("d1_generate_parity", HERE / "d1_generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    policy, _, _ = gen.tiny_case()
    gen.write_released(policy, directory, release / "networks")


def release_model(release: Path, directory: Path):
    """``LLaDASVPO`` (the release's class) with the tiny weights, in bf16 as its config loads it."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(release))
    configuration = importlib.import_module("networks.configuration_llada")
    svpo = importlib.import_module("networks.llada_svpo")
    config = configuration.LLaDAConfig(**json.loads((directory / "config.json").read_text()))
    for key, value in (("use_cache", False), ("use_return_dict", True)):  # attributes newer configs dropped
        if not hasattr(config, key):
            object.__setattr__(config, key, value)
    model = svpo.LLaDASVPO(config)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"the release's LLaDA does not take the tiny weights: {missing} {unexpected}")
    return svpo, model.to(torch.bfloat16).eval()


def record_calls(svpo, model, device: torch.device, calls: int = 3) -> list[dict]:
    """``generate_spg`` ``calls`` times on a tiny batch; what ``add_gumbel_noise_spg`` received each time."""
    seen = []
    original = svpo.add_gumbel_noise_spg

    def spy(logits, temperature, dtype):
        seen.append({"dtype": str(dtype), "logits_dtype": str(logits.dtype)})
        return original(logits, temperature, dtype)

    svpo.add_gumbel_noise_spg = spy
    prompt = torch.tensor([[3, 10, 11, 12], [3, 20, 21, 22]], device=device)
    out = []
    for _ in range(calls):
        before = len(seen)
        svpo.generate_spg(model, prompt, steps=4, gen_length=8, block_length=4, temperature=0.9, mask_id=2,
                          prompt_mask=torch.ones_like(prompt))
        out.append(seen[before])  # every step of a call reads the same dtype: keep its first
    svpo.add_gumbel_noise_spg = original
    return out


def upcast_like_accelerate(model) -> int:
    """accelerate's ``prepare_model`` for FSDP under mixed precision: every flat parameter that is not
    fp32 becomes fp32 (its handle told so), relying on FSDP's lazy init to re-point the views."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    upcast = 0
    for module in FSDP.fsdp_modules(model):
        if not module._has_params:
            continue
        param = module._flat_param
        if param.dtype != torch.float32 and param.device != torch.device("meta") and param.requires_grad:
            param.data = param.data.to(torch.float32)
            module._handle._orig_param_dtype = torch.float32
            upcast += 1
    return upcast


def emulate(rank: int, world_size: int, release: str, directory: str, out: str) -> None:
    """One gloo rank of the CPU emulation (torch FSDP as the release's fsdp.yaml configures it)."""
    import functools

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=world_size)
    svpo, model = release_model(Path(release), Path(directory))
    modeling = sys.modules["networks.modeling_llada"]
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={
        modeling.LLaDAModel, modeling.LLaDALlamaBlock, torch.nn.Embedding})
    bf16 = torch.bfloat16
    wrapped = FSDP(model, auto_wrap_policy=policy, mixed_precision=MixedPrecision(bf16, bf16, bf16),
                   sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                   sync_module_states=False,  # CPU modules cannot be synced; every rank loads the same weights
                   limit_all_gathers=True, device_id=torch.device("cpu"))
    upcast = upcast_like_accelerate(wrapped)
    model_dtype = str(wrapped.dtype)
    calls = record_calls(svpo, wrapped, torch.device("cpu"))
    if rank == 0:
        launch = f"cpu emulation: torch FSDP over gloo, {world_size} ranks, {upcast} flat parameters upcast as " \
                 "accelerate does"
        Path(out).write_text(json.dumps({"launch": launch, "model_dtype": model_dtype, "calls": calls,
                                         "model_dtype_after": str(wrapped.dtype)}))
    dist.destroy_process_group()


def cpu_emulation(release: Path, world_size: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        directory, out = Path(tmp) / "ckpt", Path(tmp) / "result.json"
        directory.mkdir()
        tiny_release_checkpoint(release, directory)
        mp.spawn(emulate, args=(world_size, str(release), str(directory), str(out)), nprocs=world_size)
        return json.loads(out.read_text())


def accelerate_launch(release: Path) -> dict:
    """Under ``accelerate launch`` with the release's config: its Accelerator, its prepare, on the GPU."""
    from accelerate import Accelerator

    accelerator = Accelerator()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if accelerator.is_main_process:
            tiny_release_checkpoint(release, directory)
        accelerator.wait_for_everyone()
        svpo, model = release_model(release, directory)
    model = model.to(accelerator.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=False)
    model, optimizer = accelerator.prepare(model, optimizer)
    model_dtype = str(model.dtype)
    calls = record_calls(svpo, model, accelerator.device)
    return {"launch": f"accelerate {accelerator.distributed_type} mixed_precision {accelerator.mixed_precision}, "
            f"{accelerator.num_processes} processes, torch {torch.__version__}", "model_dtype": model_dtype,
            "calls": calls, "model_dtype_after": str(model.dtype)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--release", required=True, help="a checkout of the StableDRL release (its networks/ is run)")
    ap.add_argument("--cpu-emulation", action="store_true", help="torch FSDP on gloo instead of accelerate launch")
    ap.add_argument("--world-size", type=int, default=2, help="ranks of the CPU emulation")
    args = ap.parse_args(argv)
    release = Path(args.release).expanduser().resolve()
    result = cpu_emulation(release, args.world_size) if args.cpu_emulation else accelerate_launch(release)
    if not args.cpu_emulation and int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

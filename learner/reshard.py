"""Re-sharding: a ZeRO checkpoint written at one learner shape (ranks W, ZeRO stage S) loaded into
an engine of another shape (W', S'), so that a run moves between 1-, 2-, 4- and 8-GPU nodes.

DeepSpeed's own load needs the shape the checkpoint was written at. What a shard holds does not
depend on the shape, only where it lies: every trained parameter has an fp32 master copy and two
Adam moments (exp_avg, exp_avg_sq), cut into W pieces one way or another:

    ZeRO-2   group g's parameters flattened one after the other (with DeepSpeed's alignment
             padding), the flat vector cut into W equal pieces: rank r holds piece r
    ZeRO-3   every parameter flattened and padded to a multiple of W on its own, cut into W equal
             pieces: rank r holds piece r of each, concatenated

``read_shards`` undoes either cut, one parameter at a time: ``(name, {"fp32", "exp_avg",
"exp_avg_sq"} -> full tensor)``. ``place`` writes each full tensor's piece into the new engine's
own partitions (DeepSpeed's ``_hp_mapping`` for ZeRO-2, ``ds_tensor`` partitions for ZeRO-3), sets
Adam's step count, and rebuilds the working weights from the masters (the collective all-gather of
ZeRO-2; ZeRO-3 gathers on use). Values are copied, never recomputed: after ``place`` every
parameter's master and moments are bit-identical to the ones saved, whatever W and W'.

Memory: the shard files are memory-mapped (one copy in the page cache, shared by the ranks of a
node); beyond them a rank holds one parameter's full tensors at a time.

The lr schedule's position (applied and skipped updates) and the client state are rank-independent
and read from the checkpoint's model-state file; per-rank RNG states are the caller's
(learner/engine.py: ``rank_rng_seed``).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import torch

from stabledrl.common.trust.checkpoint_files import DEEPSPEED_GLOBALS, CheckpointError, load_torch

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
# DeepSpeed prefixes the optimizer-state files with "bf16_" when the engine trains in bf16
_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def optim_file(tag_dir: Path, rank: int) -> Path:
    """Rank ``rank``'s optimizer-state file in ``tag_dir`` (its name with or without the bf16 prefix)."""
    plain = Path(tag_dir) / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    return plain if plain.is_file() else plain.with_name("bf16_" + plain.name)


class Layout(NamedTuple):
    world_size: int
    zero_stage: int


def saved_layout(tag_dir: Path) -> Layout:
    """(ranks, ZeRO stage) a DeepSpeed checkpoint tag was written at, from its file names: one
    optimizer-state file per rank; ZeRO-3 writes a model-state file per rank, ZeRO-2 one in all."""
    ranks = sorted(int(m.group(1)) for p in Path(tag_dir).iterdir() if (m := _OPTIM.match(p.name)))
    if not ranks or ranks != list(range(len(ranks))):
        raise CheckpointError(f"{tag_dir}: optimizer-state files of ranks {ranks}, expected 0 .. W-1")
    stage = 3 if (Path(tag_dir) / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file() else 2
    return Layout(len(ranks), stage)


def model_states(tag_dir: Path) -> dict[str, Any]:
    """Rank 0's model-state file (client state, step counters, parameter shapes); the same on every rank."""
    tag_dir = Path(tag_dir)
    name = "mp_rank_00_model_states.pt" if saved_layout(tag_dir).zero_stage < 3 else \
        "zero_pp_rank_0_mp_rank_00_model_states.pt"
    return load_torch(tag_dir / name, DEEPSPEED_GLOBALS, map_location="cpu", mmap=True)


def read_shards(tag_dir: Path) -> tuple[Iterator[tuple[str, dict[str, torch.Tensor]]], torch.Tensor]:
    """(every trained parameter's full fp32 master and Adam moments, one at a time; Adam's step
    count) from the shards of ``tag_dir``, at whatever shape they were written."""
    tag_dir = Path(tag_dir)
    layout = saved_layout(tag_dir)
    shapes = model_states(tag_dir)["param_shapes"]
    shards = [load_torch(optim_file(tag_dir, r), DEEPSPEED_GLOBALS,
                         map_location="cpu", mmap=True)["optimizer_state_dict"] for r in range(layout.world_size)]
    if layout.zero_stage < 3:
        flats = {"fp32": [s["single_partition_of_fp32_groups"] for s in shards]}
        states = [s["base_optimizer_state"]["state"] for s in shards]
    else:
        flats = {"fp32": [s["fp32_flat_groups"] for s in shards]}
        states = [s["optimizer_state_dict"]["state"] for s in shards]
    groups = len(flats["fp32"][0])
    for key in KEYS[1:]:
        flats[key] = [[state[g][key] for g in range(groups)] for state in states]
    steps = {float(state[g]["step"]) for state in states for g in range(groups)}
    if len(steps) != 1:
        raise CheckpointError(f"{tag_dir}: Adam step counts differ between shards ({sorted(steps)})")
    step = states[0][0]["step"].clone()
    if layout.zero_stage < 3:
        paddings = shards[0].get("param_alignment_paddings")
        return _zero2_params(flats, shapes, paddings, layout.world_size), step
    return _zero3_params(flats, shapes, layout.world_size), step


def _zero2_params(flats: dict[str, list[list[torch.Tensor]]], shapes: list[dict[str, Any]], paddings: Any,
                  world: int) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    for g, group_shapes in enumerate(shapes):
        offset = 0
        for i, (name, shape) in enumerate(group_shapes.items()):
            numel = math.prod(shape)
            yield name, {key: _span([rank[g] for rank in flats[key]], offset, numel).view(shape) for key in KEYS}
            offset += numel + (paddings[g][i] if paddings is not None else 0)


def _zero3_params(flats: dict[str, list[list[torch.Tensor]]], shapes: list[dict[str, Any]],
                  world: int) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    offset = 0  # in each rank's sub-groups, one after the other
    for group_shapes in shapes:
        for name, shape in group_shapes.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            yield name, {key: torch.cat([_span(list(rank), offset, part) for rank in flats[key]])[:numel].view(shape)
                         for key in KEYS}
            offset += part


def _span(pieces: list[torch.Tensor], start: int, numel: int) -> torch.Tensor:
    """Elements ``start .. start+numel`` of the concatenation of ``pieces`` (copied, not the whole cat)."""
    out, at = [], 0
    for piece in pieces:
        lo, hi = max(start, at), min(start + numel, at + piece.numel())
        if lo < hi:
            out.append(piece.narrow(0, lo - at, hi - lo))
        at += piece.numel()
    return torch.cat(out) if len(out) > 1 else out[0].clone()


# ---- into the new engine ----------------------------------------------------------------------
def place(engine: Any, params: Iterator[tuple[str, dict[str, torch.Tensor]]], step: torch.Tensor) -> int:
    """Write the full tensors ``params`` into ``engine``'s (a DeepSpeed engine) partitions of this
    rank, set Adam's step count to ``step`` and rebuild the working weights. Collective under
    ZeRO-2 (the all-gather of the updated weights) and ZeRO-3 (persistent parameters). Returns how
    many parameters were placed; CheckpointError when a trained parameter is missing or of
    another shape."""
    optimizer = engine.optimizer
    names = {id(p): n for n, p in engine.module.named_parameters()}
    stage3 = hasattr(optimizer, "fp32_partitioned_groups_flat")
    groups = optimizer.fp16_groups if stage3 else optimizer.bit16_groups
    flats = optimizer.fp32_partitioned_groups_flat if stage3 else optimizer.single_partition_of_fp32_groups
    slots: dict[str, tuple[int, Any, int]] = {}  # name -> (group, parameter, ZeRO-3 offset in the group's partition)
    for g, lp_params in enumerate(groups):
        offset = 0
        for p in lp_params:
            slots[names[id(p)]] = (g, p, offset)
            offset += p.ds_tensor.ds_numel if stage3 else 0
    targets = [{"fp32": flat.data, "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
               for flat in flats]
    placed: set[str] = set()
    for name, source in params:  # one parameter's full tensors at a time
        if name not in slots:
            raise CheckpointError(f"re-sharding: the checkpoint trains {name}, which this model does not train")
        g, p, offset = slots[name]
        shape = tuple(getattr(p, "ds_shape", None) or p.shape)
        if tuple(source["fp32"].shape) != shape:
            raise CheckpointError(f"re-sharding: {name} is {tuple(source['fp32'].shape)} in the checkpoint, {shape} "
                                  "in the model")
        if stage3:
            part = p.ds_tensor.ds_numel
            rank = optimizer._get_param_partition_rank(p)
            for key, target in targets[g].items():
                value = source[key].flatten()
                value = torch.nn.functional.pad(value, (0, part * optimizer.partition_count - value.numel()))
                target.narrow(0, offset, part).copy_(value.narrow(0, rank * part, part))
        elif getattr(p, "_hp_mapping", None) is not None:  # the part of p in this rank's partition
            lp, hp = p._hp_mapping.lp_fragment_address, p._hp_mapping.hp_fragment_address
            for key, target in targets[g].items():
                target.narrow(0, hp.start, hp.numel).copy_(source[key].flatten().narrow(0, lp.start, lp.numel))
        placed.add(name)
    missing = sorted(set(slots) - placed)
    if missing:
        raise CheckpointError(f"re-sharding: {len(missing)} trained parameters are missing from the checkpoint, "
                              f"e.g. {missing[:3]}")
    for g, flat in enumerate(flats):
        optimizer.optimizer.state[flat] = {"step": _step_like(step, optimizer.optimizer.param_groups[g], flat),
                                           "exp_avg": targets[g]["exp_avg"], "exp_avg_sq": targets[g]["exp_avg_sq"]}
    if stage3:
        for g in range(len(groups)):
            optimizer.fp16_partitioned_groups_flat[g].data.copy_(optimizer.fp32_partitioned_groups_flat[g].data)
            updated = optimizer.unflatten(
                optimizer.fp16_partitioned_groups_flat[g], optimizer.fp16_partitioned_groups[g]
            )
            for partitioned, q in zip(optimizer.fp16_partitioned_groups[g], updated):
                partitioned.data = q.data
        optimizer.checkpoint_event_epilogue()  # persistent parameters gathered again, hpZ copies dropped
    else:
        optimizer._link_all_hp_params()  # each parameter's fragment of the new masters
        optimizer._hp_optimizer_states_linked = False  # and of the new moments, now, not at the next step:
        optimizer._lazy_init_hp_params_optimizer_state()  # deepspeed.utils.safe_get_full_optimizer_state reads them
        optimizer.update_lp_params()
    return len(placed)


def _step_like(step: torch.Tensor, group: dict[str, Any], flat: torch.Tensor) -> torch.Tensor:
    """Adam's step count as torch keeps it for ``group``: on the parameter's device when fused or
    capturable, else a CPU scalar."""
    step = step.detach().clone().to(torch.float32)
    return step.to(flat.device) if group.get("fused") or group.get("capturable") else step

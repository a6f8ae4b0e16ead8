"""The learner's training engine: one DeepSpeed ZeRO-2/3 engine per learner rank.

``LearnerEngine.train_step(micro_batches, loss_fn)`` runs one optimizer update over any number of
micro-batches per rank with the loss normalised *globally*:

    L = Σ_r Σ_i ℓ_{r,i},   each ℓ_{r,i} already divided by the global denominator D
                           (e.g. the token count of the whole step over all ranks),

so the update is the gradient of the whole step's loss whatever the data-parallel sharding
(OpenRLHF's aggregate_loss argues the same invariance). DeepSpeed would distort this twice:

  1. ``engine.backward`` divides the loss by gradient_accumulation_steps. We own accumulation
     (``set_gradient_accumulation_boundary`` before every micro-batch, one ``step`` at the end)
     and configure gas = 1, so that factor is 1.
  2. ZeRO *averages* gradients over the W data-parallel ranks (reduce-scatter, then ÷W).
     We back-propagate W·ℓ_{r,i}, so the reduced gradient is (1/W)·Σ_r Σ_i ∇(W·ℓ_{r,i}) = ∇L.

tests/e2e/test_learner_engine.py checks the result against one process on all the data.

Ranks may hold different numbers of micro-batches; under ZeRO-3 every forward gathers parameters
collectively, so the shorter ranks repeat their first micro-batch with weight 0 (its gradient is
exactly zero, its metrics are not counted).

A step is skipped, counted, and leaves weights and Adam moments bit-identical when any rank saw a
non-finite loss (one all-reduce per step, carried with the metrics) or the global grad norm is
non-finite. DeepSpeed 0.19.8 skips non-finite grad norms by itself in bf16/fp32; a finite-norm
step with a NaN loss (e.g. a NaN in a detached term) it would apply, hence ``GuardedAdamW``.

With ``learner.lora`` the model gets LoRA adapters before DeepSpeed sees it (learner/lora.py): the
optimizer holds only the adapters, the weights read for a push are the merged adapted matrices,
and checkpoints hold only what trains (the frozen weights come back from ``model.path``).
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from stabledrl.common.actor_setup import settle_gpu
from stabledrl.common.trust.checkpoint_files import load_torch, read_latest, restricted_unpickling, verify_tag
from stabledrl.common.config.learner import LearnerConfig
from stabledrl.common.seeding import derive_seed
from stabledrl.common.transport.adapters import adapter_names
from stabledrl.common.transport.shards import partition_numel
from stabledrl.learner.async_checkpoint import marker_name, write_file
from stabledrl.learner.group import local_device
from stabledrl.learner.fused import fuse_elementwise
from stabledrl.learner.lora import adapter_named_parameters, add_adapters, plain_named_parameters
from stabledrl.common.stats import Reduce, Stat
from stabledrl.learner.losses.statistics import Metric
from stabledrl.learner.reshard import Layout, model_states, place, read_shards, saved_layout
from stabledrl.learner.zero import (
    build_optimizer,
    deepspeed_config,
    enable_gradient_checkpointing,
    gathered_named_parameters,
    is_finite,
    lr_at,
    resolve_dtype,
    zero3_numel,
)
from stabledrl.learner.checkpoint_process import ProcessWriter, storages_nbytes

LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, Metric]]]


class LearnerEngine:
    """A model wrapped in DeepSpeed ZeRO on one learner rank (the learner group must exist:
    ``stabledrl.learner.group.init_learner_group``). Every method is collective: call it on all ranks."""

    def __init__(self, model: nn.Module, cfg: LearnerConfig) -> None:
        import deepspeed

        if not dist.is_initialized():
            raise RuntimeError("LearnerEngine needs the learner process group; call init_learner_group first")
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = local_device()
        self.dtype = resolve_dtype(cfg.deepspeed.dtype, self.device)
        self.adapted = add_adapters(model, cfg.lora) if cfg.lora is not None else []
        if cfg.compile:
            fuse_elementwise(model)
        self.gradient_checkpointing = cfg.deepspeed.gradient_checkpointing and enable_gradient_checkpointing(model)
        model.train()
        self.optimizer = build_optimizer(model, cfg.optimizer)
        self.optimizer.may_step = self._may_step
        ds_config = deepspeed_config(cfg.deepspeed, cfg.optimizer, self.dtype, self.world_size)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=ds_config)
        self.applied_steps = 0  # optimizer updates applied (drives the lr schedule)
        self.optimizer_s = 0.0  # seconds in DeepSpeed's step (reduce, clip, update, gather), over the engine's life
        self.skipped_steps = 0  # steps skipped for a non-finite loss or grad norm
        self._bad_loss = False
        self.writer: Optional[ProcessWriter] = None  # save_checkpoint_async's (learner/checkpoint_process.py)
        self.reserve_due = False  # expect_background_saves
        self.resharded_from: Optional[tuple[int, int]] = None  # (ranks, stage) of a re-sharded checkpoint loaded

    @property
    def module(self) -> nn.Module:
        return self.engine.module

    # ---- training -------------------------------------------------------------------------
    def train_step(self, micro_batches: Sequence[Any], loss_fn: LossFn) -> dict[str, Stat]:
        """One optimizer update over this rank's ``micro_batches`` (see the module docstring).

        ``loss_fn(model, micro_batch) -> (loss, metrics)``: ``model`` is the DeepSpeed engine (it
        forwards calls and attribute reads to the wrapped module); ``loss`` is this micro-batch's
        share of the global loss (already ÷ the global denominator); ``metrics`` map names to
        ``Metric``s (learner/losses/statistics.py): a ``share`` (or a bare 0-d tensor) is summed over
        micro-batches and ranks like the loss, so make it a globally normalised contribution too;
        a ``max`` / ``min`` is reduced by max / min. Every rank must produce the same keys.

        Returns ``Stat``s (common/stats.py: each float with its reduction over inner iterations),
        identical on every rank: train/loss (the global loss), train/grad_norm (before clipping;
        inf when DeepSpeed skipped), train/lr, train/skipped (0/1, a count), train/skipped_total
        (the last), train/micro_batches (over all ranks) and train/<key> for each metric.
        """
        n_local = len(micro_batches)
        if n_local == 0:
            raise ValueError("train_step needs at least one micro-batch on every rank")
        counts = torch.tensor([n_local], dtype=torch.float64, device=self.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        n_steps = int(counts.item())

        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        sums: dict[str, torch.Tensor] = {}
        extremes: dict[str, tuple[Reduce, torch.Tensor]] = {}
        bad = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(n_steps):
            real = i < n_local
            self.engine.set_gradient_accumulation_boundary(i == n_steps - 1)
            loss, metrics = loss_fn(self.engine, micro_batches[i if real else 0])
            # ×W undoes ZeRO's data-parallel mean; weight 0 makes a padding pass contribute nothing
            self.engine.backward(loss * (self.world_size if real else 0.0))
            if real:
                loss = loss.detach().double()
                bad = torch.maximum(bad, (~torch.isfinite(loss)).double())
                loss_sum = loss_sum + loss
                _accumulate(sums, extremes, metrics, self.device)

        keys = sorted(sums)
        packed = torch.stack([loss_sum, bad, torch.tensor(float(n_local), dtype=torch.float64, device=self.device)]
                             + [sums[k] for k in keys])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        reduced_extremes = self._reduce_extremes(extremes)
        self._bad_loss = bool(packed[1].item() > 0)

        lr = lr_at(self.cfg.optimizer, self.applied_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.refused = False
        if self.writer is not None:  # a checkpoint being saved must be copied before the update changes it
            self.writer.wait_snapshot()
        settle_gpu(self.device)  # the backward's kernels finish first: the time below is the step's own
        t0 = time.perf_counter()
        self.engine.step()
        settle_gpu(self.device)
        self.optimizer_s += time.perf_counter() - t0
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = float("nan") if grad_norm is None else float(grad_norm)
        applied = self.engine.was_step_applied() and not self.optimizer.refused
        if applied:
            self.applied_steps += 1
            if self.reserve_due:
                self.reserve_due = False
                self._reserve_checkpoint_memory()
        else:
            self.skipped_steps += 1

        same = lambda value, reduce=Reduce.MEAN: Stat(value, reduce, replicated=True)  # noqa: E731
        out = {
            "train/loss": same(float(packed[0])),
            "train/grad_norm": same(grad_norm),
            "train/lr": same(lr),
            "train/skipped": same(0.0 if applied else 1.0, Reduce.COUNT),
            "train/skipped_total": same(float(self.skipped_steps), Reduce.LAST),
            "train/micro_batches": same(float(packed[2])),
        }
        out.update({f"train/{k}": same(float(v), Reduce.SHARE) for k, v in zip(keys, packed[3:])})
        out.update({f"train/{k}": same(v, extremes[k][0]) for k, v in reduced_extremes.items()})
        return out

    def evaluate(self, micro_batches: Sequence[Any], fn: Callable[[nn.Module, Any], Any]) -> list[Any]:
        """``fn(model, micro_batch)`` for each of this rank's micro-batches without gradients and
        without an update (``model`` is the DeepSpeed engine, in training mode as ``train_step``
        runs it); returns the values in order. Ranks with fewer micro-batches repeat their first
        one and drop the value, since under ZeRO-3 every forward gathers parameters collectively.
        Collective."""
        n_local = len(micro_batches)
        if n_local == 0:
            raise ValueError("evaluate needs at least one micro-batch on every rank")
        counts = torch.tensor([n_local], dtype=torch.float64, device=self.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        out = []
        with torch.no_grad():
            for i in range(int(counts.item())):
                value = fn(self.engine, micro_batches[i if i < n_local else 0])
                if i < n_local:
                    out.append(value)
        return out

    def _may_step(self) -> bool:
        """Asked by GuardedAdamW inside DeepSpeed's step, after the global grad norm is known."""
        norm = getattr(self.engine.optimizer, "_global_grad_norm", None)
        norm = None if norm is None else float(norm)
        # DeepSpeed marks a non-finite norm inf (or -1 in some helpers): both refused
        return not self._bad_loss and (norm is None or (is_finite(norm) and norm >= 0))

    def _reduce_extremes(self, extremes: dict[str, tuple[Reduce, torch.Tensor]]) -> dict[str, float]:
        """One MAX all-reduce for every ``max`` metric and the negated ``min`` ones."""
        if not extremes:
            return {}
        keys = sorted(extremes)
        sign = [1.0 if extremes[k][0] is Reduce.MAX else -1.0 for k in keys]
        packed = torch.stack([s * extremes[k][1] for s, k in zip(sign, keys)])
        dist.all_reduce(packed, op=dist.ReduceOp.MAX)
        return {k: s * float(v) for s, k, v in zip(sign, keys, packed)}

    # ---- weights out ----------------------------------------------------------------------
    def named_parameters_for_push(self, all_ranks: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """What a weight push sends, streamed bucket by bucket, on rank 0 (on every rank if
        ``all_ranks``): every parameter, or with LoRA the adapters A and B of every adapted module
        (``learner.lora.push: adapters``; the workers hold them unmerged: common/models/lora.py) or
        the merged adapted matrices (``merged``); the rest is frozen. Names are the plain policy's.
        Collective under ZeRO-3: every rank iterates to the end. Tensors are valid until the next
        item; they are in the training dtype on this rank's device."""
        if self.adapted and self.cfg.lora.push == "adapters":
            return adapter_named_parameters(self.adapted, zero_stage=self.cfg.deepspeed.zero_stage,
                                            bucket_bytes=self.cfg.deepspeed.gather_bucket_mb << 20,
                                            receive=all_ranks or self.rank == 0)
        return self._plain_parameters(all_ranks, only_adapted=bool(self.adapted))

    @property
    def partition_holders(self) -> int:
        """The ranks every parameter is partitioned among: all of them under ZeRO-3, else 1 (rank 0
        holds every parameter whole)."""
        return self.world_size if self.cfg.deepspeed.zero_stage == 3 else 1

    def partitions_for_push(self, sources: int) -> Iterator[tuple[str, tuple[int, ...], torch.Tensor]]:
        """This rank's part of every parameter for the sharded push (common/transport/shards.py):
        (name, full shape, flat partition) in the module's order, read where it lies, no gather,
        no copy; with LoRA adapters pushed (``learner.lora.push: adapters``), of every adapted
        module's A and B only, named as ``named_parameters_for_push`` names them (the workers
        hold them unmerged). ZeRO-3 (``sources`` = the learner's ranks): the rank's ``ds_tensor``, ceil(n / S)
        elements of the flat parameter from element rank·ceil(n / S) on, padded at the end;
        ZeRO-1/2 (``sources`` 1, rank 0 only): the full parameter. Not collective."""
        zero3 = self.cfg.deepspeed.zero_stage == 3
        if sources != (self.world_size if zero3 else 1):
            raise ValueError(f"a sharded push from this learner has {self.world_size if zero3 else 1} sources "
                             f"(ZeRO-{self.cfg.deepspeed.zero_stage}, {self.world_size} ranks), not {sources}")
        if self.adapted and self.cfg.lora.push != "adapters":
            raise ValueError("a sharded push carries every parameter or the LoRA adapters; a merged LoRA push "
                             "(learner.lora.push: merged) gathers")
        named = ([(name, p) for a in self.adapted for name, p in zip(adapter_names(a.path), (a.lora_A, a.lora_B))]
                 if self.adapted else self.engine.module.named_parameters())
        for name, p in named:
            if not zero3:
                yield name, tuple(p.shape), p.detach().reshape(-1)
                continue
            part, size = getattr(p, "ds_tensor", None), partition_numel(p.ds_numel, sources)
            if part is None or part.numel() != size:
                raise RuntimeError(f"weight push: {name} has no ZeRO-3 partition of {size} elements in memory, "
                                   "which the sharded push reads where it lies")
            yield name, tuple(p.ds_shape), part.detach().reshape(-1)

    def state_dict_for_push(self, all_ranks: bool = False) -> Optional[dict[str, torch.Tensor]]:
        """``named_parameters_for_push`` as CPU copies on rank 0 (every rank if ``all_ranks``),
        None on the others. Collective."""
        return self._cpu_copies(self.named_parameters_for_push(all_ranks), all_ranks)

    def state_dict_for_export(self, all_ranks: bool = False) -> Optional[dict[str, torch.Tensor]]:
        """Every parameter of the plain policy (adapters merged) as CPU copies on rank 0 (every
        rank if ``all_ranks``), None on the others. Collective."""
        return self._cpu_copies(self._plain_parameters(all_ranks, only_adapted=False), all_ranks)

    def adapters_for_export(self, all_ranks: bool = False) -> Optional[dict[str, torch.Tensor]]:
        """A LoRA learner's adapters A and B as the policy computes with them (its dtype), named as an
        adapter push names them (``<module>.lora_A``, ``.lora_B``), CPU copies on rank 0 (every rank
        if ``all_ranks``), None on the others. Collective."""
        if not self.adapted:
            raise ValueError("adapters_for_export needs a LoRA learner (learner.lora)")
        named = adapter_named_parameters(self.adapted, zero_stage=self.cfg.deepspeed.zero_stage,
                                         bucket_bytes=self.cfg.deepspeed.gather_bucket_mb << 20,
                                         receive=all_ranks or self.rank == 0)
        return self._cpu_copies(named, all_ranks)

    def _plain_parameters(self, all_ranks: bool, only_adapted: bool) -> Iterator[tuple[str, torch.Tensor]]:
        bucket_bytes = self.cfg.deepspeed.gather_bucket_mb << 20
        receive = all_ranks or self.rank == 0
        if not self.adapted:
            return gathered_named_parameters(self.engine.module, self.cfg.deepspeed.zero_stage, bucket_bytes, receive)
        return plain_named_parameters(self.engine.module, self.adapted, zero_stage=self.cfg.deepspeed.zero_stage,
                                      bucket_bytes=bucket_bytes, receive=receive, only_adapted=only_adapted)

    def _cpu_copies(self, named: Iterator[tuple[str, torch.Tensor]],
                    all_ranks: bool) -> Optional[dict[str, torch.Tensor]]:
        out = {name: t.to("cpu", copy=True) for name, t in named}
        return out if (all_ranks or self.rank == 0) else None

    def memory_metrics(self) -> dict[str, Stat]:
        """Parameters (all, trained) and every rank's peak memory since it started, in GiB: host
        (``learner/peak_rss_gb/rank<r>``) and, on CUDA, GPU allocated and reserved
        (``learner/peak_gpu_gb/rank<r>``, ``learner/peak_gpu_reserved_gb/rank<r>``). One
        all-gather, so the values are the same on every rank. Collective."""
        import resource

        params = list(self.engine.module.parameters())
        out = {"learner/parameters": Stat(sum(zero3_numel(p) for p in params), replicated=True),
               "learner/trained_parameters": Stat(sum(zero3_numel(p) for p in params if p.requires_grad),
                                                  replicated=True)}
        cuda = self.device.type == "cuda"
        mine = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,  # Linux: KiB
                             torch.cuda.max_memory_allocated(self.device) if cuda else 0.0,
                             torch.cuda.max_memory_reserved(self.device) if cuda else 0.0],
                            dtype=torch.float64, device=self.device) / 2**30
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        for r, (rss, allocated, reserved) in enumerate(t.tolist() for t in every):
            out[f"learner/peak_rss_gb/rank{r}"] = Stat(rss, Reduce.MAX)
            if cuda:
                out[f"learner/peak_gpu_gb/rank{r}"] = Stat(allocated, Reduce.MAX)
                out[f"learner/peak_gpu_reserved_gb/rank{r}"] = Stat(reserved, Reduce.MAX)
        return out

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: str | os.PathLike, client_state: Optional[dict] = None,
                        tag: Optional[str] = None) -> str:
        """DeepSpeed checkpoint (sharded weights + optimizer state) under ``directory/tag`` plus
        ``client_state`` (version, data cursor, ...) and each rank's RNG states. All ranks must
        see the same ``directory`` (a shared filesystem across nodes). Returns the tag."""
        self.checkpoint_written(timeout_s=None)
        tag = tag or f"step{self.applied_steps + self.skipped_steps}"
        _check_writable(Path(directory) / tag)
        state = {"client": client_state or {}, "engine": {"applied_steps": self.applied_steps,
                                                          "skipped_steps": self.skipped_steps}}
        # with LoRA the frozen weights stay out: they are model.path's, loaded again on resume
        self.engine.save_checkpoint(str(directory), tag=tag, client_state=state,
                                    exclude_frozen_parameters=bool(self.adapted))
        torch.save(_rng_states(), Path(directory) / tag / f"rng_rank{self.rank}.pt")
        dist.barrier()
        return tag

    def load_checkpoint(self, directory: str | os.PathLike, tag: Optional[str] = None, seed: int = 0) -> dict:
        """Restore weights, optimizer state, the lr schedule position and this rank's RNG states;
        returns the ``client_state`` given to ``save_checkpoint``. ``tag=None``: the latest.

        The tag is verified first (``stabledrl.common.trust.checkpoint_files.verify_tag``: manifest, sizes, no
        foreign pickles) and DeepSpeed reads it under torch's restricted unpickler. A checkpoint
        written at another number of ranks or another ZeRO stage is re-sharded
        (learner/reshard.py); at another rank count its RNG states are then
        ``rank_rng_seed(seed, step, rank)``'s."""
        self.checkpoint_written(timeout_s=None)
        tag = tag or read_latest(Path(directory))
        verify_tag(Path(directory) / tag)
        saved = saved_layout(Path(directory) / tag)
        if saved != Layout(self.world_size, self.cfg.deepspeed.zero_stage):
            return self._load_resharded(Path(directory) / tag, saved, seed)
        with restricted_unpickling():
            path, state = self.engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                                      load_lr_scheduler_states=False,
                                                      load_module_strict=not self.adapted)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag} under {directory}")
        self.applied_steps = int(state["engine"]["applied_steps"])
        self.skipped_steps = int(state["engine"]["skipped_steps"])
        _set_rng_states(load_torch(Path(directory) / tag / f"rng_rank{self.rank}.pt"))
        return state["client"]

    def _load_resharded(self, tag_dir: Path, saved: Layout, seed: int) -> dict:
        """``load_checkpoint`` of a tag written at another shape (learner/reshard.py). Every rank
        reads the shards it needs from the shared directory; the masters and moments land bit for
        bit. With another rank count the saved RNG states belong to ranks that no longer exist:
        rank r of the new shape seeds its generators from (seed, step, r) instead, so the streams
        are defined by the new shape alone (``rank_rng_seed``); with the same count (only the ZeRO
        stage changed) each rank restores its own."""
        state = model_states(tag_dir)
        params, adam_step = read_shards(tag_dir)
        with torch.no_grad():
            place(self.engine, params, adam_step)
        engine_state, client = state["engine"], state["client"]
        self.applied_steps = int(engine_state["applied_steps"])
        self.skipped_steps = int(engine_state["skipped_steps"])
        self.engine.global_steps = int(state.get("global_steps", 0))
        self.engine.global_samples = int(state.get("global_samples", 0))
        step = int(client.get("step", self.applied_steps + self.skipped_steps))
        if saved.world_size == self.world_size:  # only the ZeRO stage changed: every rank still has its streams
            _set_rng_states(load_torch(tag_dir / f"rng_rank{self.rank}.pt"))
        else:
            _seed_rngs(rank_rng_seed(seed, step, self.rank))
        self.resharded_from = saved
        dist.barrier()
        return client

    # ---- checkpoints off the training path ---------------------------------------------------
    def save_checkpoint_async(self, directory: str | os.PathLike, client_state: Optional[dict] = None,
                              tag: Optional[str] = None, on_written: Callable[[float], None] = lambda s: None) -> str:
        """``save_checkpoint`` whose files are copied to shared host memory and written by a child
        process (learner/checkpoint_process.py): returns once DeepSpeed has collected the state;
        the next update waits only for the copy. Writes no ``latest``: the caller marks the
        checkpoint complete once every rank's marker file (``marker_name``) is there.
        ``on_written(s)`` gets the save's seconds."""
        self.checkpoint_written(timeout_s=None)  # one save at a time
        torch_engine = self.engine.checkpoint_engine
        self._background_writer().on_written = on_written
        tag = tag or f"step{self.applied_steps + self.skipped_steps}"
        _check_writable(Path(directory) / tag)
        state = {"client": client_state or {}, "engine": {"applied_steps": self.applied_steps,
                                                          "skipped_steps": self.skipped_steps}}
        self.engine.checkpoint_engine = self.writer
        try:  # with LoRA the frozen weights stay out, as in save_checkpoint
            self.engine.save_checkpoint(str(directory), tag=tag, client_state=state, save_latest=False,
                                        exclude_frozen_parameters=bool(self.adapted))
        finally:
            self.engine.checkpoint_engine = torch_engine
        rng = str(Path(directory) / tag / f"rng_rank{self.rank}.pt")
        write_file(_rng_states(), rng, True)
        self.writer.start(str(Path(directory) / tag / marker_name(self.rank)), written=[rng])
        return tag

    def expect_background_saves(self) -> None:
        """The run will save in the background: reserve the writer's host memory after the next
        applied update (the optimizer state is whole then), unless ``learner.checkpoint.reserve`` is off."""
        self.reserve_due = self.cfg.checkpoint.reserve

    def _background_writer(self) -> ProcessWriter:
        """This rank's writer, made once."""
        if self.writer is None:
            zipfile = bool(getattr(self.engine.checkpoint_engine, "zipfile_serialization", True))
            self.writer = ProcessWriter(zipfile)
        return self.writer

    def _reserve_checkpoint_memory(self) -> None:
        """Have the process writer reserve host memory for this rank's state (in the background):
        the distinct storages of what DeepSpeed's save collects, the optimizer's and the module's."""
        try:
            nbytes = storages_nbytes([self.engine.optimizer.state_dict(),
                                      self.engine.module_state_dict(exclude_frozen_parameters=bool(self.adapted))])
        except Exception:  # noqa: BLE001 - an estimate only: the first save reserves what it needs
            return
        self._background_writer().reserve(nbytes)

    def checkpoint_written(self, timeout_s: Optional[float] = 0.0) -> bool:
        """Whether this rank's last ``save_checkpoint_async`` is durable, waiting at most
        ``timeout_s`` (None: until it is); raises the write's error. Local: no collective."""
        return self.writer is None or self.writer.wait_written(timeout_s)


def _check_writable(path: Path) -> None:
    """A PermissionError naming ``path`` (torch.save would report a missing parent directory)."""
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise PermissionError(13, f"learner rank checkpoint: no permission to write in {path}", str(path))


def _accumulate(sums: dict[str, torch.Tensor], extremes: dict[str, tuple[Reduce, torch.Tensor]],
                metrics: dict[str, Any], device: torch.device) -> None:
    for key, metric in metrics.items():
        reduce = metric.reduce if isinstance(metric, Metric) else Reduce.SHARE
        value = metric.value if isinstance(metric, Metric) else metric
        value = torch.as_tensor(value).detach().to(device=device, dtype=torch.float64).reshape(())
        if reduce in (Reduce.MAX, Reduce.MIN):
            pick = torch.maximum if reduce is Reduce.MAX else torch.minimum
            extremes[key] = (reduce, pick(extremes[key][1], value) if key in extremes else value)
        elif reduce is Reduce.SHARE:
            sums[key] = sums[key] + value if key in sums else value
        else:
            raise ValueError(f"metric {key!r}: the engine adds shares and takes max / min; weight a {reduce.value} "
                             "into a share first (learner/worker.py does it by the micro-batch's rows)")


def rank_rng_seed(seed: int, step: int, rank: int) -> int:
    """The seed of learner rank ``rank``'s Python / NumPy / torch (/ CUDA) generators when a run
    resumes at step ``step`` on another number of ranks than it was saved at (run.seed = ``seed``)."""
    return derive_seed("learner-rng", seed, step, rank)


def _seed_rngs(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every CUDA device too


def _rng_states() -> dict[str, Any]:
    """Every RNG of this process as tensors, ints and strings only, so that it loads back with
    ``torch.load(weights_only=True)`` (no unpickling of arbitrary objects from a checkpoint)."""
    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "torch": torch.get_rng_state(),
              "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(states["python"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])

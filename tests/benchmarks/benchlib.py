"""What every benchmark script shares: the model shapes, building a random policy directly on the
device, timing, FLOP counts and the JSON result file.

A benchmark script writes ``Result`` after every part it finishes (atomically), so a part that
crashes or a kill at the runner's timeout still leaves the parts measured before it. Nothing here
downloads anything: models are random-initialised at the real shapes, in bf16, on the GPU itself
(``torch.device`` context: no CPU initialisation of 8B parameters).

FLOPs are counted from the shapes of what actually runs (see ``forward_flops``): every Linear
layer of the decoder over every input token, the LM head over the positions whose logits are
kept, and attention (QK^T and AV) over the keys each query reads. A multiply-add is 2 FLOPs.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import suites  # noqa: E402  (beside this file, on the path of whatever imports it)
import torch  # noqa: E402

if not torch.cuda.is_available():
    torch.set_num_threads(1)  # CPU checks share 2 cores: one intra-op thread is the fastest there

NOMINAL_H100_BF16_TFLOPS = 989.4  # H100 SXM / H200 dense bf16 (NVIDIA datasheet; no sparsity)

# Real shapes (random weights). head_dim = hidden / heads for all three.
SHAPES: dict[str, dict[str, Any]] = {
    "llada-8b": dict(
        family="llada",
        vocab_size=126464,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=12288,
    ),
    "sdar-8b": dict(
        family="sdar",
        vocab_size=151936,
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=12288,
    ),
    "qwen2-1.5b": dict(
        family="dream",
        vocab_size=151936,
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
    ),
    # --tiny stand-ins: the same families and code paths at toy size (CPU validation)
    "tiny-llada": dict(
        family="llada",
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
    ),
    "tiny-sdar": dict(
        family="sdar",
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
    "tiny-qwen2": dict(
        family="dream",
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
}
# special ids inside every vocabulary above (the char tokenizer's layout)
MASK_ID, EOS_ID, PAD_ID, BOS_ID = 2, 1, 0, 3


# ---- devices and timing ---------------------------------------------------------------------
def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def compute_dtype(dev: torch.device) -> torch.dtype:
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


def sync(dev: Optional[torch.device] = None) -> None:
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], dev: torch.device) -> tuple[Any, float]:
    """(fn(), wall seconds) with the device drained before and after."""
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t0


def event_times_ms(fn: Callable[[], Any], dev: torch.device, *, warmup: int, reps: int) -> list[float]:
    """Per-call milliseconds of ``fn`` (CUDA events on GPU, host clock on CPU) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(dev)
    out = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def peak_memory_gib(dev: torch.device) -> Optional[float]:
    return round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def job_log_shown() -> Iterator[None]:
    """A job's own lines (the ``stabledrl`` loggers) on stdout, stamped as ``log`` stamps them."""
    from stabledrl.common.job_log import attached

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    with attached(handler):
        yield


# ---- models ---------------------------------------------------------------------------------
@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_policy(
    shape_name: str,
    dev: torch.device,
    dtype: torch.dtype,
    *,
    seed: int = 0,
    block_size: Optional[int] = None,
    **overrides: int,
):
    """A random-initialised DiffusionPolicy of ``SHAPES[shape_name]`` (``overrides`` replace some of
    its dims, e.g. ``num_hidden_layers``), created on ``dev`` in ``dtype``: parameters are allocated
    and initialised there (transformers' own init, run on the device), so an 8B model costs
    seconds on a GPU instead of minutes of CPU init."""
    from stabledrl.common.models.presets import build_tiny_policy

    shape = {**SHAPES[shape_name], **overrides}
    family = shape.pop("family")
    with torch.device(dev), default_dtype(dtype):
        policy = build_tiny_policy(
            family, mask_token_id=MASK_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
            block_size=block_size, seed=seed, dtype=dtype, attn_implementation="sdpa", **shape,
        )
    _rope_in_fp32(policy)
    return policy.eval()


def _rope_in_fp32(policy: torch.nn.Module) -> None:
    """``Module.to(bf16)`` rounds the rotary inverse frequencies to bf16; a checkpoint loaded with
    from_pretrained keeps them in fp32. Recompute them (default RoPE) so positions are as precise."""
    cfg = policy.model.config
    theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for module in policy.modules():
        inv = getattr(module, "inv_freq", None)
        if isinstance(inv, torch.Tensor) and inv.numel() == head_dim // 2:
            exact = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=inv.device) / head_dim)
            module.inv_freq = exact
            if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
                module.original_inv_freq = exact.clone()


@dataclass(frozen=True)
class ShapeCount:
    """Parameter counts that set the FLOPs of a forward."""

    linear: int  # decoder Linear weights (attention + MLP of every layer), no embedding, no head
    head: int  # LM head (vocab x hidden)
    embedding: int
    total: int
    layers: int
    heads: int
    head_dim: int


def count_shape(policy: torch.nn.Module) -> ShapeCount:
    cfg = policy.model.config
    head = policy.model.get_output_embeddings().weight
    embed = policy.model.get_input_embeddings().weight
    linear = sum(
        m.weight.numel() for m in policy.model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight is not head
    )
    total = sum(p.numel() for p in policy.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ShapeCount(
        linear, head.numel(), embed.numel(), total, cfg.num_hidden_layers, cfg.num_attention_heads, head_dim
    )


def forward_flops(sc: ShapeCount, *, rows: int, query_len: int, key_len: float, logit_positions: int) -> float:
    """FLOPs of one forward of ``rows`` sequences: Linear layers over rows*query_len tokens, the
    LM head over rows*logit_positions, attention 2 matmuls of query_len x key_len per head and layer
    (``key_len`` = the keys a query reads, on average)."""
    linear = 2.0 * sc.linear * rows * query_len
    head = 2.0 * sc.head * rows * logit_positions
    attention = 4.0 * rows * query_len * key_len * sc.heads * sc.head_dim * sc.layers
    return linear + head + attention


# ---- inputs ---------------------------------------------------------------------------------
def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """``n`` prompts of ``length`` token ids drawn from the ordinary ids (special ids excluded)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (length,), generator=g) for _ in range(n)]


# ---- results --------------------------------------------------------------------------------
class Result:
    """One benchmark's JSON record, rewritten atomically after every ``put``."""

    def __init__(self, name: str, path: Optional[str], args: dict, echo: bool = True, probe: bool = True) -> None:
        self.path = Path(path) if path else None
        self.echo = echo  # False on the other ranks of a multi-process benchmark
        self.data: dict[str, Any] = {
            "benchmark": name, "started": _dt.datetime.now().isoformat(timespec="seconds"), "args": args,
            # probe=False: a launcher that must not open a CUDA context takes its ranks' environment
            "environment": environment() if probe else {}, "parts": {}, "errors": {}, "notes": [],
        }
        self.write()

    def put(self, part: str, values: dict) -> None:
        self.data["parts"][part] = values
        if self.echo:
            log(f"{self.data['benchmark']}/{part}: " + json.dumps(values, default=_jsonable)[:600])
        self.write()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.write()

    def error(self, part: str, exc: BaseException) -> None:
        self.data["errors"][part] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
        log(f"{self.data['benchmark']}/{part} FAILED: {self.data['errors'][part]}")
        traceback.print_exc()
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_jsonable))
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def part(self, name: str, dev: Optional[torch.device] = None) -> Iterator[None]:
        """Run a part; its failure is recorded and does not stop the parts after it."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the next part still runs
            self.error(name, exc)
            if dev is not None and dev.type == "cuda":
                torch.cuda.empty_cache()

    def run_parts(self, bench: Any, names: Sequence[str], known: Sequence[str], dev: torch.device) -> None:
        """``bench.<name>()`` for each of ``names`` in order, each a ``part`` (a name not in ``known``
        is recorded as that part's error, and the others still run); then the peak memory."""
        for name in names:
            if name not in known:
                self.error(name, ValueError(f"unknown part {name!r}; valid: {tuple(known)}"))
                continue
            log(f"{self.data['benchmark']}: {name}")
            with self.part(name, dev):
                getattr(bench, name)()
        self.put("memory", {"peak_gib": peak_memory_gib(dev)})


def part_names(a: Any) -> list[str]:
    """``--parts`` of a class-based benchmark as a list (empty names dropped)."""
    return [p for p in a.parts.split(",") if p]


def run_benchmark(name: str, a: Any, make: Callable[[Any, Result], Any], known: Sequence[str]) -> None:
    """A class-based benchmark's main: its ``Result`` at ``a.out``, the bench built by ``make(a, res)``
    (a failure there, the model's build, is recorded and raised: nothing can run without it), then
    ``Result.run_parts`` over ``a.parts``."""
    res = Result(name, a.out, vars(a))
    try:
        bench = make(a, res)
    except Exception as exc:
        res.error("model", exc)
        raise
    res.run_parts(bench, part_names(a), known, bench.dev)


def _jsonable(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (torch.dtype, torch.device, Path)):
        return str(x)
    return float(x)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus_visible"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = None
    try:
        env["git"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - no git on the machine is fine
        env["git"] = None
    return env


LISTEN_FDS = "STABLEDRL_BENCH_LISTEN_FDS"  # the listening sockets rank 0 inherits, for its stores


def rendezvous_ports(n: int) -> tuple[list[Any], list[int]]:
    """``n`` ports for the ranks' stores on 127.0.0.1, each bound where the OS picks it and listening
    from now on (no other process can take it in between): ``launch_ranks(listeners=...)`` hands
    the sockets to rank 0, whose stores adopt them (``adopt_listeners``)."""
    from stabledrl.common.transport.store import listening_socket

    listeners = [listening_socket("127.0.0.1") for _ in range(n)]
    return listeners, [int(sock.getsockname()[1]) for sock in listeners]


def adopt_listeners(host: str = "127.0.0.1") -> None:
    """In rank 0: hold the sockets ``launch_ranks`` handed this process for the stores it hosts."""
    from stabledrl.common.transport.store import adopt_listener

    for fd in filter(None, os.environ.get(LISTEN_FDS, "").split(",")):
        adopt_listener(int(fd), host)


def launch_ranks(script: str, argv_for: Callable[[int], list[str]], world: int, listeners: Sequence[Any] = ()
                 ) -> list[int]:
    """Run ``world`` processes ``python script *argv_for(rank)``, rank r seeing only the r-th visible
    GPU (so each uses cuda:0); when one fails the others are stopped 5 s later (they would wait
    for it forever). ``listeners`` (``rendezvous_ports``) go to rank 0. Returns the exit codes."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(r) for r in range(world)]
    procs = []
    fds = [sock.fileno() for sock in listeners]
    for rank in range(world):
        env = dict(os.environ, LOCAL_RANK="0")
        if torch.cuda.is_available():
            env["CUDA_VISIBLE_DEVICES"] = devices[rank]
        if rank == 0 and fds:
            env[LISTEN_FDS] = ",".join(map(str, fds))
        procs.append(subprocess.Popen([suites.python(), script, *argv_for(rank)], env=env,
                                      pass_fds=fds if rank == 0 else ()))
    for sock in listeners:
        sock.close()  # rank 0 holds them now
    codes: list[Optional[int]] = [None] * world
    while any(c is None for c in codes):
        time.sleep(0.5)
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(5)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            codes = [p.wait() for p in procs]
    return [int(c) for c in codes]


def finish_rank() -> None:
    """End a rank of a multi-process benchmark that did its work (its results already written): a
    barrier, so no rank leaves while another still needs it, the output flushed, then ``os._exit(0)``.
    Left to the interpreter's teardown with the process group's threads alive, a rank now and then
    aborted after writing its results ("terminate called without an active exception", exit code
    -6), and the launcher rightly counted the run as failed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- profiles ---------------------------------------------------------------------------------
def profile_forwards(model: torch.nn.Module, run: Callable[[], Any], dev: torch.device, *, skip: int, active: int,
                     top: int = 20) -> dict:
    """torch.profiler over ``active`` consecutive forwards of ``model`` (and whatever runs between
    them: the sampler's decode steps) inside ``run()``, after its first ``skip`` forwards. Returns
    per forward: wall ms, device-busy ms (sum of kernel times), kernels launched, host ops; the
    ``top`` kernels by device time (CPU: the ``top`` ops by self CPU time); and the top host ops.
    wall >> device busy means the host (Python + launches) is the bottleneck, not the GPU. The run
    is cut short (an exception from the hook) once the profiled forwards are done."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    prof = profile(activities=acts)
    state = {"n": 0, "t0": None, "wall": None}

    def hook(*_):
        state["n"] += 1
        if state["n"] == skip:
            sync(dev)
            prof.start()
            state["t0"] = time.perf_counter()
        elif state["n"] == skip + active and state["t0"] is not None:
            sync(dev)
            state["wall"] = time.perf_counter() - state["t0"]
            prof.stop()
            raise _ProfileDone

    handle = model.register_forward_hook(hook)
    try:
        run()
    except _ProfileDone:
        pass
    finally:
        handle.remove()
    if state["wall"] is None:
        raise RuntimeError(f"the run made {state['n']} forwards; the profile needs {skip + active}")
    return _profile_table(prof.key_averages(), state["wall"], active, dev, top)


def profile_run(run: Callable[[], Any], dev: torch.device, *, forwards: int, top: int = 20) -> dict:
    """torch.profiler over the whole of ``run()`` (which makes ``forwards`` forwards, some of them
    graph replays that no forward hook sees): the same per-forward table as ``profile_forwards``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        run()
        sync(dev)
        wall = time.perf_counter() - t0
    return _profile_table(prof.key_averages(), wall, forwards, dev, top)


class _ProfileDone(Exception):
    """Raised from the profiling hook to end the profiled run early."""


def _profile_table(events, wall_s: float, active: int, dev: torch.device, top: int) -> dict:
    def dev_us(e) -> float:
        return float(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) or 0)

    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA") and dev_us(e) > 0]
    host_ops = [e for e in events if e.key.startswith("aten::")]
    launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
    busy_us = sum(dev_us(e) for e in kernels)
    per = float(active)
    out: dict[str, Any] = {
        "forwards_profiled": active,
        "wall_ms_per_forward": 1e3 * wall_s / per,
        "device_busy_ms_per_forward": busy_us / 1e3 / per if kernels else None,
        "device_busy_fraction": busy_us / 1e6 / wall_s if kernels else None,
        "kernels_per_forward": sum(e.count for e in kernels) / per if kernels else None,
        "kernel_launch_calls_per_forward": launches / per if launches else None,
        "host_aten_ops_per_forward": sum(e.count for e in host_ops) / per,
    }
    if kernels:
        out["by_category"] = kernel_categories(kernels, dev_us, per)
        ranked = sorted(kernels, key=dev_us, reverse=True)[:top]
        out["top_kernels"] = [{"name": e.key[:120], "calls_per_forward": e.count / per,
                               "ms_per_forward": dev_us(e) / 1e3 / per, "pct_of_busy": 100 * dev_us(e) / busy_us}
                              for e in ranked]
    ranked_host = sorted(host_ops, key=lambda e: e.self_cpu_time_total, reverse=True)[: (10 if kernels else top)]
    out["top_host_ops"] = [{"name": e.key[:120], "calls_per_forward": e.count / per,
                            "self_cpu_ms_per_forward": e.self_cpu_time_total / 1e3 / per} for e in ranked_host]
    return out


KERNEL_CATEGORIES = (  # (category, name fragments), the first match wins
    ("attention", ("sdpa", "flash", "fmha", "attention", "efficient_attention")),
    ("matmul", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_")),
    ("triton (compiled)", ("triton",)),
    ("reduce", ("reduce_kernel",)),
    ("copy / cast", ("copy", "cat", "index", "scatter", "gather")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for category, fragments in KERNEL_CATEGORIES:
        if any(f in low for f in fragments):
            return category
    return "elementwise / other"


def kernel_categories(kernels, dev_us: Callable[[Any], float], per: float) -> dict:
    """{category: {kernels, ms} per forward} of profiled kernel events (``kernel_category``)."""
    out: dict[str, dict[str, float]] = {}
    for e in kernels:
        row = out.setdefault(kernel_category(e.key), {"kernels_per_forward": 0.0, "ms_per_forward": 0.0})
        row["kernels_per_forward"] += e.count / per
        row["ms_per_forward"] += dev_us(e) / 1e3 / per
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms_per_forward"]))


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def read_peak_tflops(path: Optional[str]) -> Optional[float]:
    """The measured bf16 matmul rate from bench_matmul's JSON (None if absent or failed)."""
    if not path or not Path(path).exists():
        return None
    try:
        return float(json.loads(Path(path).read_text())["parts"]["matmul"]["tflops_median"])
    except (KeyError, ValueError, TypeError):
        return None

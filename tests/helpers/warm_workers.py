"""Ray worker processes for the tests' local Ray instances (tests/e2e/harness.py: local_ray), forked
from a process that has already imported torch, transformers and DeepSpeed.

A Ray actor's process spends ~4 CPU-seconds importing torch, transformers and DeepSpeed before its
first line of work, and the end-to-end tests start a few hundred such processes on a 2-core
machine. Here the raylet starts each worker as ``py_executable`` (a job runtime_env field), this
file's client: it hands its command line, environment, working directory and standard streams to
the warm process (``serve``), which forks a child that runs Ray's default_worker.py as the new
process would have; the client stays as the raylet's process and exits as the child exits (with
its status), and a client that dies takes its child with it. The child registers with the raylet
under its own pid, as the workers of a ``uv run`` py_executable do. Nothing of the project is
imported before the fork (only third-party packages, and no Ray: gRPC must not start before a
fork), so each worker imports and runs the project's code as a freshly started one does; its random
states are a fresh process's (Python's and NumPy's reseeded from the OS, torch's as at its import).
Those packages read some environment variables as they are imported (torch.compile's backend
override, inductor's and DeepSpeed's settings): a worker whose environment differs from the warm
process's in one of them is exec'd as a fresh process instead (``IMPORT_TIME_ENV``).
What the warm process imported is frozen (``gc.freeze``) before the first fork, as an actor's
settle_heap freezes its set-up (common/gil.py): a worker's collections never walk those objects,
which also keeps their pages shared with the warm process instead of copied into each worker.

    python warm_workers.py serve SOCKET     the warm process (started by ``start``)
    python -S warm_workers.py SOCKET ARGS   the client, as the raylet runs it

``job_env`` gives the same to the Ray instances that a test's subprocesses start (the benchmark
rehearsals' ``stabledrl train`` jobs).
"""
from __future__ import annotations

import array
import gc
import itertools
import json
import os
import signal
import socket
import struct
import sys
import time

HEADER = struct.Struct("!I")
MAX_FDS = 64  # the descriptors a client hands on: its streams and those its parent passed it
# what every actor of the tests imports before its first line of work (third-party only; torch.compile's
# dynamo and inductor too: DeepSpeed's engine imports them at its optimizer check, through
# its Muon optimizer's module-level torch.compile, ~0.8 CPU-seconds in every learner rank)
PRELOAD = ("torch", "numpy", "yaml", "pydantic", "safetensors.torch", "transformers",
           "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.qwen3.modeling_qwen3", "deepspeed", "peft", "torch._dynamo",
           "torch._inductor.compile_fx", "deepspeed.runtime.zero.muon.muon_optimizer")
# environment the packages read as they are imported (torch._dynamo.config reads
# TORCH_COMPILE_OVERRIDE_BACKENDS, inductor's config TORCHINDUCTOR_*, DeepSpeed DS_*): a worker whose
# environment differs from the warm process's in one of them starts cold, as Ray would start it. Not
# inductor's cache folder: read at each compile, and written into the environment by torch itself
IMPORT_TIME_ENV = ("TORCH", "PYTORCH", "TRITON", "DS_", "DEEPSPEED", "TRANSFORMERS", "HF_", "TOKENIZERS", "PEFT")
READ_LATER = {"TORCHINDUCTOR_CACHE_DIR"}
# what the warm process sets before its imports, as every actor sets it (common/actor_setup.py) and Ray
# sets it for an actor of < 2 CPUs: a worker's environment without them reads as with them
WARM_DEFAULTS = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def import_time_env(env: dict, defaults: dict = WARM_DEFAULTS) -> dict:
    """What of ``env`` the preloaded packages read as they are imported (``defaults`` where unset: what
    the warm process sets, and what the packages set for themselves as they are imported)."""
    return {k: v for k, v in {**defaults, **env}.items() if k.startswith(IMPORT_TIME_ENV) and k not in READ_LATER}


# ------------------------------------------------------------------------------------------- client
def client(path: str, args: list[str]) -> None:
    inherited = []  # the descriptors this process was started with: its streams, and any a parent passed on
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            continue
        inherited.append(int(name))
    deadline = time.monotonic() + 120
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            break
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    body = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "fds": inherited}).encode()
    s.sendmsg([HEADER.pack(len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", inherited))])
    s.sendall(body)
    reader = s.makefile("r")
    child = int(reader.readline())

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    line = reader.readline().split()
    if len(line) == 2 and line[0] == "signal":
        signal.signal(int(line[1]), signal.SIG_DFL)
        os.kill(os.getpid(), int(line[1]))
        time.sleep(1)
    os._exit(int(line[1]) if len(line) == 2 and line[0] == "exit" else 1)


# --------------------------------------------------------------------------------------- warm side
def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, HEADER.size, MAX_FDS)
    while len(head) < HEADER.size:
        head += conn.recv(HEADER.size - len(head))
    (size,) = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("the client left before its request was read")
        body += chunk
    return json.loads(body), fds


# interpreter options a forked child can honour (-S and -s: the warm process's site is already set up)
FLAGS = {"-u", "-B", "-S", "-s", "-q"}


def python_command(argv: list[str]):
    """What a ``python`` command line runs, as (kind, target, args, flags): ``script`` and its path,
    ``module`` (-m) and its name, or ``code`` (-c) and its text; None for any other option (-I, -E,
    -X, -W, ...), which the child leaves to a fresh interpreter."""
    flags = set()
    for i, arg in enumerate(argv):
        if arg in ("-c", "-m"):
            if i + 1 >= len(argv):
                return None
            return ("code" if arg == "-c" else "module", argv[i + 1], argv[i + 2:], flags)
        if arg in FLAGS:
            flags.add(arg)
            continue
        if arg.startswith("-"):
            return None
        return ("script", arg, argv[i + 1:], flags)
    return None


def _become_worker(request: dict, fds: list[int], torch_rng, imported_with: dict, defaults: dict) -> None:
    """In the forked child: the process the client's command line would have started (a fresh one,
    exec'd, where the request's import-time environment is not ``imported_with``)."""
    import random

    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.setpgid(0, 0)  # a process group of its own, as the raylet gives a worker (it kills a worker's group)
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024) for fd in fds]  # out of the targets' way first
    for fd in fds:
        os.close(fd)
    for target, fd in zip(request["fds"], high):
        os.dup2(fd, target)  # inheritable, as the client's was
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    command = python_command(request["argv"])
    mine = import_time_env(os.environ, defaults)
    if command is None or mine != imported_with:
        differs = sorted(k for k in set(mine) | set(imported_with) if mine.get(k) != imported_with.get(k))
        why = f"the environment differs in {', '.join(differs)}" if differs else "a command line it does not run"
        print(f"warm_workers: started fresh, {why}", file=sys.stderr)
        os.execv(sys.executable, [sys.executable, *request["argv"]])
    kind, target, args, flags = command
    # sys.path as `python` builds it: the script's folder (the working directory for -m and -c), then
    # PYTHONPATH, then the rest
    first = os.path.dirname(os.path.abspath(target)) if kind == "script" else os.getcwd()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *(p for p in sys.path[1:] if p not in extra)]
    sys.argv = [os.path.abspath(target) if kind == "script" else "-c" if kind == "code" else target, *args]
    if "-B" in flags:
        sys.dont_write_bytecode = True
    if "-u" in flags or os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)
    random.seed()
    import numpy
    import torch

    numpy.random.seed()
    torch.set_rng_state(torch_rng)
    import runpy

    code = 0
    try:
        if kind == "script":
            runpy.run_path(os.path.abspath(target), run_name="__main__")
        elif kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            import builtins

            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    os._exit(code)


def serve(path: str) -> None:
    import ctypes
    import selectors

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: end with the test process that started us
    for key, value in WARM_DEFAULTS.items():
        os.environ.setdefault(key, value)
    before = dict(os.environ)
    import torch

    torch_rng = torch.get_rng_state()  # a fresh process's, before anything draws from it
    import importlib
    import threading
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            importlib.import_module(name)
    assert threading.active_count() == 1, threading.enumerate()  # nothing may run beside the fork
    # what the imports set for themselves (DeepSpeed: PYTORCH_NVML_BASED_CUDA_CHECK), as they would in a
    # fresh worker whose environment lacks it
    defaults = {**WARM_DEFAULTS, **{k: v for k, v in os.environ.items() if before.get(k) != v}}
    imported_with = import_time_env(os.environ, defaults)
    # what is imported now is each worker's before its first line, and stays alive in each: frozen, so
    # no collection in a worker walks it (and copies its pages, which fork shares until written)
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # the clients connect only once everything is imported
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    children: dict[int, socket.socket] = {}  # child pid -> its client's connection
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    while not stop:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    sel.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_worker(request, fds, torch_rng, imported_with, defaults)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
                try:
                    conn.sendall(f"{pid}\n".encode())
                except OSError:
                    pass
            elif key.data == "wake":
                os.read(wake_r, 4096)
            else:  # a client's connection: closed, so its child goes too
                try:
                    alive = key.fileobj.recv(1)
                except OSError:
                    alive = b""
                if not alive:
                    sel.unregister(key.fileobj)
                    try:
                        os.kill(key.data, signal.SIGKILL)
                    except OSError:
                        pass
        while children:  # reap, and tell each ended child's client how it ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                how = f"signal {os.WTERMSIG(status)}"
            else:
                how = f"exit {os.waitstatus_to_exitcode(status)}"
            try:
                conn.sendall(f"{how}\n".encode())
            except OSError:
                pass
            try:
                sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------- test process
_SERVERS: dict[str, dict] = {}  # the import-time environment (JSON) -> its warm process: proc, path
_STARTED = itertools.count()  # warm processes started by this process: each socket's own number


def _server(env: dict | None) -> dict:
    """The warm process of this test process for ``env`` (default: this process's environment), started
    once for each import-time environment (it ends with this process)."""
    import atexit
    import subprocess
    import tempfile

    env = dict(os.environ if env is None else env)
    key = json.dumps(import_time_env(env), sort_keys=True)
    server = _SERVERS.get(key)
    if server is None or server["proc"].poll() is not None:
        path = os.path.join(tempfile.gettempdir(), f"warm-{os.getpid()}-{next(_STARTED)}.sock")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", path], stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)  # no process group shared with the tests
        if not _SERVERS:
            atexit.register(stop)
        server = _SERVERS[key] = {"proc": proc, "path": path}
    return server


def start(env: dict | None = None) -> str:
    """The client of the warm process for ``env`` (default: this process's environment): the runtime_env
    ``py_executable`` that starts Ray's workers through it."""
    return f"{sys.executable} -S {os.path.abspath(__file__)} {_server(env)['path']}"


def runtime_env(env: dict | None = None) -> dict:
    """The Ray runtime_env whose workers start through the warm process for ``env``."""
    return {"py_executable": start(env)}


def job_env(env: dict | None = None) -> dict[str, str]:
    """This process's environment updated with ``env``, with every Ray job that a child process of it
    starts (a ``stabledrl train`` under a benchmark runner) taking its workers from the warm process
    of that environment: the job runtime_env that ``ray job submit`` hands its driver the same way."""
    full = {**os.environ, **(env or {})}
    job = {"runtime_env": runtime_env(full)}
    return {**full, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job)}


def python(env: dict | None = None) -> tuple[str, dict[str, str]]:
    """A ``python`` for a benchmark runner and the scripts it starts: an executable that runs each of
    its command lines as a child forked from the warm process (a fresh interpreter for an option
    ``python_command`` does not take), and the runner's environment: ``job_env(env)`` naming that
    executable in STABLEDRL_BENCH_PYTHON, which the benchmark scripts start their scripts with
    (tests/benchmarks/suites.py: ``python``)."""
    full = job_env(env)
    server = _server(full)
    launcher = f"{server['path']}.python"  # one per warm process, written once
    if not os.path.exists(launcher):
        with open(launcher, "w") as f:
            f.write(f'#!/bin/sh\nexec {start(full)} "$@"\n')
        os.chmod(launcher, 0o755)
    return launcher, {**full, "STABLEDRL_BENCH_PYTHON": launcher}


def stop() -> None:
    for server in _SERVERS.values():
        proc = server["proc"]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except Exception:
                proc.kill()
        try:
            os.unlink(f"{server['path']}.python")
        except OSError:
            pass


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[1], sys.argv[2:])

"""The peer benchmark's roofline: the FLOPs of each loop's forwards, the rate each part achieved
against the card's measured bf16 matmul rate (bench_matmul.py), where its GPU-seconds went, and the
ceiling that the release's sampler leaves the project.

FLOPs, counted from the shapes (LLaDA's layout: L decoder layers of width d, a gated MLP of width m,
vocabulary V):

    the decoder layers, per token of a forward:      2 P,  P = L (4 d^2 + 3 d m)  (q, k, v, o; the MLP's
                                                     three matrices; norms and embeddings are no matmuls;
                                                     k and v narrower with grouped-query heads)
    attention, per token of a forward of T tokens:   4 L d T  (Q K^T and A V, 2 d T each, every layer)
    the head, per position whose logits it computes: 2 d V

so a forward of rows of T tokens, logits at H positions a row, costs rows (T (2 P + 4 L d T) + 2 d V H).
A backward costs twice its forward's matrix work (input and weight gradients); with LoRA once (the
frozen matrices get no weight gradient; the adapters' own are left out). Activation checkpointing's
recomputed forward is not counted: these are model FLOPs, as MFU counts them.

- generation at the release's sampler (no cache, a fixed number of steps): every step a forward of
  the whole canvas (prompt + completion, padded to the call's longest prompt). The releases compute
  the head at every position (H = T, then fp32 logits and Gumbel noise over T x V); the project only
  at the block being decoded (H = the block length).
- generation with a cache (Fast-dLLM's prefix or dual cache): a full forward of the canvas when a
  block starts, then forwards of the block alone (dual) or of the block and what follows it (prefix)
  that read the other positions' keys and values from the cache: per row, Lq tokens through the
  layers and Lq x T query-key pairs in attention. The sampler counts both as it runs
  (``rollout/forward_tokens``, ``rollout/forward_attended``); records from before it counted them
  show no generation rate for a cached sampler. The ceiling is the release's sampler's: a cached
  loop gets none.
- scoring (the behaviour policy's, a reference's, d1's old policy's log-likelihoods; no gradient) and
  the learner's forwards: T = prompt + completion per view; the project's head at the completion
  (H = gen), the releases' at every position.

Where the FLOPs come from. The releases' harnesses count every forward the release's own code runs
(peer_events.Recorder.forward: its rows, T, whether it builds a graph, whether it is inside the
sampler): nothing is modelled. The project's are counted from its job's records: the generation's
rows x forwards, tokens and attention pairs (``rollout/forward_rows``, ``rollout/forward_tokens``,
``rollout/forward_attended``), the samples' prompt
tokens (``rollout/prompt_tokens``), the estimator's views and the inner iterations.

Wall-time shares (of the loop's GPU-seconds: window x GPUs): generate, score (behaviour / old /
reference), learner forward and backward, optimizer (DeepSpeed's or the release's step), push,
reward (CPU, on the rollout worker's clock), idle (the project: what no actor of a GPU was doing;
the releases: the time their events do not cover is counted as the learner's, waits included).

The ceiling (``ceiling``): the project's own FLOPs per sample at the release's sampler, generation
and scoring at ``BEST["generate"]`` and the learner at ``BEST["learner"]`` of the matmul rate (the
project's targets for each: the best a loop is held to), nothing else in the way (no push, no idle):
the samples/s/GPU no implementation of the same work reaches, and that over the release's. The
target a pair is held to is then ``min(1.5, 0.9 x that ratio)``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

BEST = {"generate": 0.75, "learner": 0.55}  # the efficiency targets: the ceiling's assumed rates
SPEED_TARGET = 1.5  # at the release's sampler, project / release samples/s/GPU


def shape_of(model_dir: str | Path) -> dict[str, int]:
    """L, d, m, V of a checkpoint (its config.json in LLaDA's released names or transformers')."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    pick = lambda *names: next(int(cfg[n]) for n in names if n in cfg)  # noqa: E731
    heads = pick("n_heads", "num_attention_heads")
    kv = int(cfg.get("n_kv_heads") or cfg.get("num_key_value_heads") or heads)
    return {"layers": pick("n_layers", "num_hidden_layers"), "d": pick("d_model", "hidden_size"),
            "m": pick("mlp_hidden_size", "intermediate_size"),
            "vocab": pick("embedding_size", "vocab_size"), "kv_share": kv / heads}


def layer_params(shape: dict[str, int]) -> int:
    """P: the decoder layers' matrix parameters (attention's four, keys and values narrower with
    grouped-query heads; the MLP's three)."""
    d, m, kv = shape["d"], shape["m"], shape.get("kv_share", 1.0)
    return int(shape["layers"] * ((2 + 2 * kv) * d * d + 3 * d * m))


def forward_flops(shape: dict[str, int], rows: float, tokens: float, tokens_sq: float, head: float) -> float:
    """A forward's FLOPs from its totals: rows, tokens (rows x T), tokens_sq (rows x T^2), head positions."""
    del rows  # the count is carried for the record; the FLOPs follow from the token totals
    return tokens * 2 * layer_params(shape) + tokens_sq * 4 * shape["layers"] * shape["d"] + \
        head * 2 * shape["d"] * shape["vocab"]


def backward_factor(lora: bool) -> float:
    """Forward plus backward over forward: 3 (full), 2 (LoRA: input gradients only)."""
    return 2.0 if lora else 3.0


# ---- the releases: counted from their own forwards ---------------------------------------------------
def peer_flops(phases: dict[str, dict[str, float]], shape: dict[str, int], lora: bool) -> dict[str, float]:
    """FLOPs per phase from the harness's forward counts (``phases``: generate / score / train ->
    rows, tokens, tokens_sq; the releases compute the head at every position)."""
    out = {}
    for phase, c in phases.items():
        f = forward_flops(shape, c.get("rows", 0), c.get("tokens", 0), c.get("tokens_sq", 0), c.get("tokens", 0))
        out[phase] = f * (backward_factor(lora) if phase == "train" else 1.0)
    return out


# ---- the project: counted from its records ------------------------------------------------------------
def project_flops(totals: dict[str, float], shape: dict[str, int], *, gen_length: int, block_length: int,
                  views: int, inner_iterations: int, lora: bool, reference_forwards: float,
                  cached: bool) -> dict[str, Optional[float]]:
    """FLOPs of the timed steps from the job's totals over them: ``forward_rows`` / ``forward_tokens``
    of generation, ``samples`` and ``prompt_tokens`` (every sample's prompt). ``views``: forwards of
    one estimate (the estimator's draws); ``reference_forwards``: the learner's estimates without a
    gradient per sample over the step (a reference's, an old policy's under per-iteration masks).
    ``forward_attended``: attention's query-key pairs (rows x T^2 for full forwards of T tokens); without
    it (older records) every forward is taken as one of the whole canvas, which a ``cached`` sampler's
    are not: no generation FLOPs then."""
    samples = totals.get("samples", 0.0)
    tokens = totals.get("prompt_tokens", 0.0) + samples * gen_length  # one view of every sample
    mean_t = tokens / samples if samples else 0.0
    one = views * forward_flops(shape, samples, tokens, tokens * mean_t, samples * gen_length)  # an estimate each
    gen = None
    rows, ft, attended = totals.get("forward_rows"), totals.get("forward_tokens"), totals.get("forward_attended")
    if rows and (attended or not cached):
        gen = forward_flops(shape, rows, ft, attended or ft * ft / rows, rows * block_length)
    return {"generate": gen, "score": one, "learner_score": one * reference_forwards,
            "train": one * inner_iterations * backward_factor(lora)}


# ---- rates, shares, the ceiling -----------------------------------------------------------------------
def rates(flops: dict[str, Optional[float]], seconds: dict[str, float], matmul_tflops: Optional[float]) -> dict:
    """Achieved TFLOP/s of generation, of scoring (forwards without a gradient: a rollout worker's
    behaviour estimate, a release's old policy and reference) and of the learner's step (training,
    with a reference the learner scores, over its forward, backward and optimizer seconds), and each
    over the matmul rate."""
    out: dict[str, Any] = {}
    learner_s = seconds.get("learner", 0.0) + seconds.get("optimizer", 0.0) + seconds.get("learner_score", 0.0)
    parts = {"generate": (flops.get("generate"), seconds.get("generate", 0.0)),
             "score": (flops.get("score"), seconds.get("score", 0.0)),
             "learner": ((flops.get("train") or 0.0) + (flops.get("learner_score") or 0.0), learner_s)}
    for name, (f, s) in parts.items():
        tflops = f / s / 1e12 if f and s > 0 else None
        out[f"{name}_tflops"] = tflops
        out[f"{name}_of_matmul"] = tflops / matmul_tflops if tflops and matmul_tflops else None
    return out


def shares(seconds: dict[str, float], gpu_s: float) -> dict[str, float]:
    """Each activity's share of the GPU-seconds; idle the rest (never below 0)."""
    if gpu_s <= 0:
        return {}
    out = {k: v / gpu_s for k, v in seconds.items() if k != "learner_score"}
    out["score"] = (seconds.get("score", 0.0) + seconds.get("learner_score", 0.0)) / gpu_s
    out["idle"] = max(0.0, 1.0 - sum(v for k, v in out.items() if k != "idle"))
    return out


def ceiling(flops: dict[str, Optional[float]], samples: float, matmul_tflops: Optional[float],
            best: Optional[dict[str, float]] = None) -> Optional[float]:
    """Samples per second per GPU of the project's FLOPs at the best rates (``BEST``), nothing else."""
    best = best or BEST
    if not samples or not matmul_tflops or flops.get("generate") is None:
        return None
    rate = matmul_tflops * 1e12
    forwards = flops["generate"] + (flops.get("score") or 0.0) + (flops.get("learner_score") or 0.0)
    seconds = forwards / (best["generate"] * rate) + (flops.get("train") or 0.0) / (best["learner"] * rate)
    return samples / seconds


def target(ceiling_ratio: Optional[float]) -> float:
    """The release-sampler target: 1.5x; where the ceiling itself is below 1.5x, 90% of it."""
    if ceiling_ratio is None or ceiling_ratio >= SPEED_TARGET:
        return SPEED_TARGET
    return 0.9 * ceiling_ratio

"""The table of the component benchmarks' targets from run_all's ``results.json`` (every lookup
tolerates a missing job or part: a failed benchmark shows as "-" with its status, never breaks the
table); another suite's table lists its jobs (their figures are in the record).

    python tests/benchmarks/report.py tests/benchmarks/results/<run>.json   # re-print a table
"""
from __future__ import annotations

import json
import sys
from typing import Any, Optional


def get(data: dict, *path: Any) -> Any:
    for key in path:
        if isinstance(data, dict):
            data = data.get(key, data.get(str(key)))
        else:
            return None
    return data


def part(data: dict, job: str, name: str) -> dict:
    return get(data, "jobs", job, "result", "parts", name) or {}


def fmt(x: Optional[float], spec: str = ".1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def met(value: Optional[float], goal: float, higher: bool = True) -> str:
    if value is None:
        return "-"
    return "yes" if (value >= goal if higher else value <= goal) else "no"


def card(data: dict) -> str:
    for rec in (data.get("jobs") or {}).values():
        gpu = get(rec, "result", "environment", "gpu")
        if gpu:
            return gpu
    return "CPU" if data.get("tiny") else "?"


def rows(data: dict) -> list[tuple[str, str, str, str, str]]:
    """(target, measured, goal, met, detail) per line."""
    out = []
    mm0, mm1 = part(data, "matmul_gpu0", "matmul"), part(data, "matmul_gpu1", "matmul")
    out.append(
        (
            "1 bf16 matmul rate (8192^3)",
            f"{fmt(mm0.get('tflops_median'))} / {fmt(mm1.get('tflops_median'))} TFLOP/s",
            "denominator",
            "",
            "GPU 0 / GPU 1; copy "
            f"{fmt(part(data, 'matmul_gpu0', 'copy').get('tb_per_s_read_plus_write'), '.2f')} TB/s (read+write)",
        )
    )

    nv = part(data, "full_attention", "naive")
    out.append(
        (
            "2 naive full-attention sampling, % of measured matmul",
            fmt(nv.get("engine_pct_of_measured_matmul"), ".1f", "%"),
            ">= 60%",
            met(nv.get("engine_pct_of_measured_matmul"), 60),
            f"engine {fmt(nv.get('engine_tflops'))} TFLOP/s; forward alone "
            f"{fmt(nv.get('forward_only_pct_of_measured_matmul'), '.1f', '%')}; decode step "
            f"{fmt(get(nv, 'decode_step_ms', 'float64_noise'), '.1f')} ms of "
            f"{fmt(_ms(nv.get('s_per_step')), '.0f')} ms/step"
            f"; B={nv.get('batch', '-')}",
        )
    )

    nc = nv.get("compiled") or {}
    out.append(
        (
            "2b the same, decoder layers compiled (sampler.compile), % of measured matmul",
            fmt(nc.get("engine_pct_of_measured_matmul"), ".1f", "%"),
            "report",
            "",
            f"{fmt(nc.get('speedup_vs_eager'), '.2f', 'x')} the eager step; forward alone "
            f"{fmt(nc.get('forward_only_ms'), '.0f')} ms (eager {fmt(nv.get('forward_only_ms'), '.0f')}); "
            f"first generation {fmt(nc.get('first_generation_s'), '.0f')} s; tokens equal to eager "
            f"{fmt(100 * nc['tokens_equal_to_eager'] if 'tokens_equal_to_eager' in nc else None, '.1f', '%')}",
        )
    )

    ca = part(data, "full_attention", "cached")
    by = ca.get("by_steps") or {}
    eq = ", ".join(
        f"{s} steps: {fmt(get(v, 'speedup_vs_naive_equal_steps'), '.1f', 'x')}"
        for s, v in sorted(by.items(), key=lambda kv: int(kv[0]))
    )
    model = ca.get("speedup_vs_naive_steps_gen_at_k_tokens_per_forward") or {}
    out.append(("3a dual cache vs naive, equal steps", eq or "-", "", "",
                "cost model vs naive@gen steps at k tokens/forward: "
                + ", ".join(f"k={k}: {fmt(v, '.1f', 'x')}" for k, v in model.items())))
    pa = part(data, "full_attention", "parallel")
    out.append(
        (
            "3b dual cache + threshold 0.9 vs naive (1 token/step)",
            fmt(pa.get("speedup_vs_naive_steps_gen"), ".1f", "x"),
            ">= 10x",
            met(pa.get("speedup_vs_naive_steps_gen"), 10),
            f"{fmt(pa.get('tokens_per_s'), '.0f')} tokens/s at k={fmt(pa.get('tokens_per_forward_per_row'), '.2f')} "
            f"tokens/forward (LM head x{fmt(pa.get('alpha'), '.3g')}), {pa.get('forwards', '-')} forwards, "
            f"{pa.get('refreshes', '-')} refreshes for {pa.get('blocks', '-')} blocks; cost model "
            f"{fmt(pa.get('cost_model_prediction_s'), '.2f')} s vs {fmt(pa.get('seconds'), '.2f')} s measured; "
            f"vs naive at gen/2 steps {fmt(pa.get('speedup_vs_naive_steps_half_gen'), '.1f', 'x')}",
        )
    )
    ag, agt = part(data, "full_attention", "agreement"), part(data, "full_attention", "agreement_threshold")
    modes = [m for m in ("dual", "prefix") if isinstance(ag.get(m), dict)]
    out.append(
        (
            "3c cached vs exact, same state: argmax agreement",
            ", ".join(f"{m} {fmt(_pct(get(ag, m, 'same_state_argmax_agreement')), '.1f', '%')}" for m in modes) or "-",
            "report",
            "",
            "; ".join(
                f"{m}: mean TV {fmt(get(ag, m, 'same_state_mean_tv_distance'), '.3f')} over "
                f"{get(ag, m, 'same_state_positions')} masked positions, trajectory token agreement "
                f"{fmt(_pct(get(ag, m, 'token_agreement')), '.1f', '%')}"
                for m in modes
            )
            + f"; temperature 0, {ag.get('rows', '-')} rows, {ag.get('steps', '-')} steps, LM head "
            f"x{fmt(ag.get('lm_head_alpha'), '.3g')}; with threshold, trajectory: dual "
            f"{fmt(_pct(get(agt, 'dual', 'token_agreement')), '.1f', '%')}",
        )
    )
    out.append(_profile_row("3d profile: dual-cache step", part(data, "full_attention", "profile")))
    fg = part(data, "full_attention", "cuda_graph")
    if fg:
        th, fx = fg.get("threshold") or {}, fg.get("fixed") or {}
        out.append(
            (
                "3e experiment: dual-cache step as a CUDA graph, + threshold vs naive",
                fmt(th.get("speedup_vs_naive_steps_gen"), ".1f", "x"),
                ">= 10x",
                met(th.get("speedup_vs_naive_steps_gen"), 10),
                f"threshold: {fmt(th.get('tokens_per_s'), '.0f')} tokens/s, {th.get('forwards', '-')} forwards, "
                f"{fmt(th.get('speedup_vs_eager_threshold'), '.2f', 'x')} the eager run, tokens equal: "
                f"{th.get('tokens_equal_eager')}; fixed {fx.get('steps', '-')} steps: "
                f"{fmt(fx.get('speedup_vs_eager_dual'), '.2f', 'x')} eager dual, "
                f"{fmt(fx.get('speedup_vs_naive_equal_steps'), '.1f', 'x')} naive, "
                f"tokens equal: {fx.get('tokens_equal_eager')}",
            )
        )

    bd = part(data, "block_diffusion", "speed").get("by_steps") or {}
    ex = part(data, "block_diffusion", "exactness")
    best = max((get(v, "tokens_per_s") or 0 for v in bd.values()), default=None)
    one = next((v for s, v in bd.items() if get(v, "tokens_per_step_per_row") == 1.0), {})
    out.append(
        (
            "4 block diffusion 8B, B=128, block 4: tokens/s",
            f"{fmt(one.get('tokens_per_s'), '.0f')} (1 token/step)",
            ">= 3000",
            met(one.get("tokens_per_s"), 3000),
            "; ".join(
                f"{fmt(get(v, 'tokens_per_step_per_row'), '.0f')} tok/step: {fmt(get(v, 'tokens_per_s'), '.0f')}/s "
                f"({fmt(get(v, 'ms_per_forward'), '.1f')} ms/fwd)"
                for v in bd.values()
            )
            + f"; cached == uncached tokens: fp32 {fmt(_pct(get(ex, 'fp32', 'token_agreement')), '.1f', '%')}, "
            f"{_low(ex)} {fmt(_pct(get(ex, _low(ex), 'token_agreement') or ex.get('token_agreement')), '.1f', '%')}"
            if best
            else "-",
        )
    )
    fp32 = get(ex, "fp32", "token_agreement")
    if fp32 is not None:
        out.append(
            (
                f"4a exact cache == reference path, fp32 (same widths, {get(ex, 'fp32', 'layers')} layers)",
                fmt(_pct(fp32), ".1f", "%"),
                "100%",
                met(fp32, 1.0),
                f"{ex.get('rows', '-')} rows x {ex.get('gen', '-')} tokens, temperature 0; {_low(ex)} full model: "
                f"{fmt(_pct(get(ex, _low(ex), 'token_agreement')), '.1f', '%')} (flat random logits: rounding flips)",
            )
        )

    gr = part(data, "block_diffusion", "graphed").get("by_run") or {}
    if gr:
        steady = next(
            (v for k, v in gr.items() if k.endswith("_again") and get(v, "tokens_per_step_per_row") == 1.0), {}
        )
        first = next((v for k, v in gr.items() if k.endswith("_first")), {})
        out.append(
            (
                "4 block diffusion 8B, B=128, block 4, sampler cuda_graph=True: tokens/s",
                f"{fmt(steady.get('tokens_per_s'), '.0f')} (1 token/step)",
                ">= 3000",
                met(steady.get("tokens_per_s"), 3000),
                f"{fmt(steady.get('speedup_vs_eager'), '.2f', 'x')} eager, "
                f"{fmt(steady.get('ms_per_forward'), '.1f')} ms/fwd "
                "(replays only); first generation of the shape (capture included) "
                f"{fmt(first.get('tokens_per_s'), '.0f')}/s"
                + "".join(
                    f"; {k}: {fmt(get(v, 'tokens_per_s'), '.0f')}/s" for k, v in gr.items() if v not in (steady, first)
                )
                + f"; {steady.get('captures', '-')} capture(s), {steady.get('replays', '-')} replays in all; "
                "fp32 graphed == "
                f"reference: {fmt(_pct(get(ex, 'fp32', 'graphed_token_agreement')), '.1f', '%')} (replayed again: "
                f"identical {get(ex, 'fp32', 'graphed_replay_identical')}; after in-place weight changes: "
                f"{fmt(_pct(get(ex, 'fp32', 'graphed_after_inplace_weights_agreement')), '.1f', '%')}, "
                f"{get(ex, 'fp32', 'graphed_captures')} capture)",
            )
        )
    gp = part(data, "block_diffusion", "graph_profile")
    if gp:
        out.append(_profile_row("4e profile: graphed block-diffusion generation (short)", gp))
    fold = part(data, "block_diffusion", "gqa_fold")
    if fold:
        out.append(
            (
                "4b experiment: GQA folded into the query (no repeat_kv)",
                f"{fmt(fold.get('tokens_per_s'), '.0f')} tokens/s",
                "report",
                "",
                f"{fmt(fold.get('speedup_vs_stock'), '.2f', 'x')} the stock path; tokens equal to it: "
                f"{fmt(_pct(fold.get('token_agreement_with_stock')), '.1f', '%')}",
            )
        )
    out.append(_profile_row("4c profile: block-diffusion step", part(data, "block_diffusion", "profile")))
    graph = part(data, "block_diffusion", "cuda_graph")
    if graph:
        runs = {k: v for k, v in graph.items() if isinstance(v, dict) and "tokens_per_s" in v}
        best_graph = max((v["tokens_per_s"] for v in runs.values()), default=None)
        out.append(
            (
                "4d experiment: in-block step as a CUDA graph, tokens/s (1 token/step)",
                fmt(best_graph, ".0f"),
                ">= 3000",
                met(best_graph, 3000),
                "; ".join(
                    f"{k}: {fmt(v.get('tokens_per_s'), '.0f')}/s ({fmt(v.get('ms_per_forward'), '.1f')} ms/fwd, "
                    f"{fmt(v.get('speedup_vs_eager'), '.2f', 'x')} eager, {v.get('replays')} replays)"
                    for k, v in runs.items()
                )
                + "; fp32 graphed == reference: "
                f"{fmt(_pct(get(graph, 'fp32_exactness', 'token_agreement')), '.1f', '%')}",
            )
        )

    for job in ("learner_1gpu", "learner_2gpu"):
        parts = get(data, "jobs", job, "result", "parts") or {}
        for name, v in parts.items():
            if name.startswith("zero") and name.endswith("_profile"):
                out.append(_step_profile_row(f"5p profile: one learner step, {name[:-8]}", v))
                continue
            if not (name.startswith("zero") and "_ckpt_" in name):
                continue
            if v.get("out_of_memory"):
                out.append((f"5 learner {name}: MFU", "out of memory", ">= 40%", "-",
                            f"{v.get('micro_batch_rows')} rows on a {fmt(v.get('device_memory_gib'), '.0f')} GiB card; "
                            "larger micro-batches skipped"))
                continue
            mfu = v.get("mfu_vs_measured_matmul")
            mb = f", micro-batch {v['micro_batch_rows']} rows" if v.get("micro_batch_rows") else ""
            mb += ", fused AdamW" if get(v, "adamw", "fused") else ""
            out.append(
                (
                    f"5 learner {v.get('world')} GPU ZeRO-{v.get('zero_stage')} ckpt {v.get('checkpointing')}{mb}: MFU",
                    fmt(_pct(mfu), ".1f", "%"),
                    ">= 40%",
                    met(_pct(mfu), 40),
                    f"vs nominal 989: {fmt(_pct(v.get('mfu_vs_nominal_989')), '.1f', '%')}; "
                    f"{fmt(v.get('step_s_median'), '.2f')} s/step, {fmt(v.get('samples_per_s'), '.1f')} samples/s, "
                    f"peak {fmt(v.get('peak_memory_gib'), '.1f')} GiB",
                )
            )
    gather = part(data, "learner_2gpu", "zero3_gather")
    if gather:
        out.append(
            (
                "5b ZeRO-3 gather of the full weights (2 ranks)",
                fmt(gather.get("seconds"), ".2f", " s"),
                "report",
                "",
                f"{gather.get('params_on_rank0', '-')} params, {gather.get('bucket_mb', '-')} MiB buckets",
            )
        )

    pushes = {k: v for k, v in (get(data, "jobs", "push", "result", "parts") or {}).items() if k.startswith("push_")}
    for name, v in pushes.items():
        out.append(
            (
                f"6 weight push 8B bf16 ({name[5:]} buckets) / raw broadcast",
                fmt(v.get("ratio_to_raw_per_tensor"), ".2f", "x"),
                "<= 2x",
                met(v.get("ratio_to_raw_per_tensor"), 2, higher=False),
                f"{fmt(v.get('median_s'), '.3f')} s, {fmt(v.get('gb_per_s'), '.0f')} GB/s; vs raw bucket broadcasts "
                f"{fmt(v.get('ratio_to_raw_buckets'), '.2f', 'x')}; bit-identical: {v.get('weights_bit_identical')}",
            )
        )
    if not pushes:
        out.append(("6 weight push / raw broadcast", "-", "<= 2x", "-", _status(data, "push")))
    e0, e1 = part(data, "async", "eta0"), part(data, "async", "eta1")
    ratio = part(data, "async", "speedup").get("eta1_over_eta0_samples_per_s")
    out.append(("7 asynchrony: eta=1 / eta=0 samples trained per s", fmt(ratio, ".2f", "x"), ">= 1.6x", met(ratio, 1.6),
                f"eta0 {fmt(e0.get('samples_per_s'), '.1f')}/s, eta1 {fmt(e1.get('samples_per_s'), '.1f')}/s; "
                f"dropped at eta1: {e1.get('dropped_total', '-')}" if e0 or e1 else _status(data, "async")))
    lp, ratio = part(data, "lora_push", "setup"), part(data, "lora_push", "ratio")
    m, d = part(data, "lora_push", "merged"), part(data, "lora_push", "adapters")
    low = min(ratio.get("bytes_merged_over_adapters") or 0, ratio.get("learner_s_merged_over_adapters") or 0) or None
    out.append(
        (
            f"8 LoRA push ({lp.get('shape', '-')}, r {lp.get('rank', '-')}): merged / adapters, bytes and learner s",
            f"{fmt(ratio.get('bytes_merged_over_adapters'), '.1f', 'x')} bytes, "
            f"{fmt(ratio.get('learner_s_merged_over_adapters'), '.1f', 'x')} s",
            ">= 10x",
            met(low, 10),
            f"merged {fmt(m.get('wire_gb'), '.2f')} GB in {fmt(m.get('learner_s'), '.3f')} s, adapters "
            f"{fmt(d.get('wire_gb'), '.2f')} GB in {fmt(d.get('learner_s'), '.3f')} s on the learner; worker load "
            f"{fmt(m.get('worker_s'), '.3f')} / {fmt(d.get('worker_s'), '.3f')} s (the adapters it holds "
            f"{fmt(d.get('worker_extra_gb'), '.2f')} GB)",
        )
    )
    first, later, raw = (part(data, "ipc_push", n) for n in ("first_push", "push", "raw_copy"))
    ratio = later.get("first_over_later_total")
    out.append(
        (
            "9 same-device push (ipc): first push / a later one, send + receive",
            fmt(ratio, ".2f", "x"),
            "-",
            "-",
            f"first {fmt(first.get('send_s'), '.3f')} + {fmt(first.get('receive_s'), '.3f')} s, later "
            f"{fmt(later.get('median_send_s'), '.3f')} + {fmt(later.get('median_receive_s'), '.3f')} s (send + "
            f"receive); the sender's raw device copy {fmt(raw.get('median_s'), '.3f')} s; bit-identical: "
            f"{first.get('weights_bit_identical')}/{later.get('weights_bit_identical')}"
            if later else _status(data, "ipc_push"),
        )
    )
    return out


def _profile_row(label: str, pr: dict) -> tuple[str, str, str, str, str]:
    if not pr:
        return (label, "-", "report", "", "not run")
    top = (pr.get("top_kernels") or [{}])[0]
    host = (pr.get("top_host_ops") or [{}])[0]
    return (
        label,
        f"{fmt(pr.get('wall_ms_per_forward'), '.1f')} ms wall / "
        f"{fmt(pr.get('device_busy_ms_per_forward'), '.1f')} ms GPU busy per forward",
        "report",
        "",
        f"GPU busy {fmt(_pct(pr.get('device_busy_fraction')), '.0f', '%')}; "
        f"{fmt(pr.get('kernels_per_forward'), '.0f')} kernels and {fmt(pr.get('host_aten_ops_per_forward'), '.0f')} "
        f"host ops per forward; top kernel {str(top.get('name', '-'))[:60]} "
        f"{fmt(top.get('pct_of_busy'), '.0f', '%')}; top host op {host.get('name', '-')}",
    )


def _step_profile_row(label: str, pr: dict) -> tuple[str, str, str, str, str]:
    top = pr.get("top_kernels") or []
    return (
        label,
        f"{fmt(pr.get('wall_ms_per_step'), '.0f')} ms wall / {fmt(pr.get('device_busy_ms_per_step'), '.0f')} ms "
        "GPU busy per step",
        "report",
        "",
        f"{pr.get('micro_batch_rows', '-')}-row micro-batches; top kernels: "
        + ", ".join(f"{str(k.get('name'))[:40]} {fmt(k.get('pct_of_busy'), '.0f', '%')}" for k in top[:4])
        + f"; {fmt(pr.get('host_aten_ops_per_step'), '.0f')} host ops per step",
    )


def _low(ex: dict) -> str:
    """The key of the exactness run in the compute dtype (bfloat16 on GPU, float32 on a CPU)."""
    return next((k for k in ("bfloat16", "float16", "float32") if k in ex), "bfloat16")


def _status(data: dict, job: str) -> str:
    rec = get(data, "jobs", job) or {}
    return f"{rec.get('status', 'not run')}: {rec.get('reason') or get(rec, 'result', 'errors') or ''}"[:300]


def _pct(x: Optional[float]) -> Optional[float]:
    return None if x is None else 100 * x


def _ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else 1e3 * x


def table(data: dict) -> str:
    suite = data.get("suite", "components")
    lines = [f"suite: {suite}  card: {card(data)}  gpus: {data.get('gpus')}  tiny: {data.get('tiny')}  "
             f"wall: {data.get('wall_s')} s", ""]
    if suite == "components":
        lines += ["| target | measured | goal | met | detail |", "|---|---|---|---|---|"]
        lines += [f"| {' | '.join(str(c).replace('|', '/') for c in r)} |" for r in rows(data)]
        lines.append("")
    lines += ["| job | status | wall s | failed parts |", "|---|---|---|---|"]
    for name, rec in (data.get("jobs") or {}).items():
        errors = ", ".join(get(rec, "result", "errors") or {}) or rec.get("reason", "")
        lines.append(f"| {name} | {rec.get('status')} | {rec.get('wall_s', '-')} | {errors} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(open(sys.argv[1]).read())))

"""The `eval`, `plot` and `study` subcommands of `stabledrl` (``stabledrl/cli/main.py`` adds them).

    stabledrl eval  --config X (--model DIR | --checkpoint DIR) [--k K] [--num-prompts N] [overrides]
    stabledrl eval  --model EXPORT [...]          # an export carries its job's sealed config
    stabledrl eval  --config X --protocol d1 [--model DIR | --checkpoint DIR] [--out DIR] [--lengths ..]
    stabledrl plot  RUN_DIR [RUN_DIR ...] --out fig.png [--group parent]
    stabledrl study [--config deploy/configs/study_cpu.yaml] [overrides] | --report STUDY_DIR

Configs are validated before anything heavy starts; a bad one exits 2 naming the field.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import load_job_config
from stabledrl.common.sandbox.scorer import RewardFailureRate
from stabledrl.common.tasks import DataError
from stabledrl.common.tasks.graders import check_math_grader
from stabledrl.common.trust.checkpoint_files import CheckpointError
from stabledrl.common.trust.run_dir import check_eval_trust
from stabledrl.common.trust.seal import RunTrustError, check_key
from stabledrl.evaluation.regrade_d1 import regrade_command
from stabledrl.evaluation.results import ResultsMismatch
from stabledrl.recipes.plot import load_runs, plot_runs

PROTOCOL_NEEDS = """\
what --protocol d1 needs:
  data      GSM8K test (openai/gsm8k, main) and MATH500 (HuggingFaceH4/MATH-500) in the Hugging Face datasets
            cache (or reachable to download); d1's Countdown and Sudoku files under data/d1/
            (countdown_cd3_test.jsonl, 4x4_test_sudoku.csv from dllm-reasoning/d1's dataset/ folder; a missing
            file stops the run with the command that fetches it). eval.protocol.benchmarks.X.source points
            elsewhere.
  graders   d1's own readings, built in (MATH: MATH's is_equiv, no extra package). --graders latex adds a
            MATH500 row by the project's LaTeX equivalence; --graders math-verify one by Math-Verify
            (installed with stabledrl). run.json records the
            graders and package versions.
  model     the config's model (or --model / --checkpoint) and a GPU per worker (CPU workers without GPUs).
  --generation d1   decodes as d1's eval.py: batch left-padded, no attention mask, fp16 autocast on CUDA.
  --regrade-d1 PATH needs only d1's generation JSON files (a d1 checkout); no model, no GPU, no --config.
"""
STUDY_CPU = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "study_cpu.yaml"
COMMANDS = ("eval", "plot", "study")


def counted(least: int):
    """An argparse type: an integer of at least ``least`` (``--num-prompts -3`` is refused, not
    read as 'all but the last 3')."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is less than {least}")
        return value

    parse.__name__ = f"integer >= {least}"
    return parse


def ema_weight(text: str) -> float:
    """An argparse type: a weight in [0, 1) (1 or more would never forget the first value, or grow)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is not in [0, 1)")
    return value


def add_commands(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "eval", help="held-out pass@1 / pass@k of an exported model or a checkpoint; --protocol d1: the papers' table "
        "(stabledrl/evaluation/protocol_command.py)", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=PROTOCOL_NEEDS)
    ev.add_argument("--config", default=None, help="the job config the policy was trained with (task, sampler, eval); "
                    "required except with --regrade-d1 and with --model EXPORT (an export carries its job's config)")
    source = ev.add_mutually_exclusive_group()
    source.add_argument("--model", help="a model directory (run.export_final writes output_dir/final_model)")
    source.add_argument("--checkpoint", help="a DeepSpeed checkpoint: output_dir, output_dir/checkpoints or one tag "
                        "(a LoRA job's: its adapters on the config's model, unmerged)")
    ev.add_argument("--adapter", help="a PEFT LoRA adapter folder (a LoRA run writes output_dir/final_adapter), put "
                    "unmerged onto the base: --model, else the config's model")
    ev.add_argument("--k", type=counted(1), default=1, help="also report pass@k (k <= samples per prompt)")
    ev.add_argument(
        "--num-prompts",
        type=counted(1),
        default=None,
        help="first N held-out prompts (default "
        "eval.num_prompts); with --protocol: a subsample of N rows of every benchmark, drawn as the protocol "
        "draws",
    )
    ev.add_argument(
        "--samples", type=counted(1), default=None, help="samples per prompt (default max(k, eval.samples_per_prompt))"
    )
    ev.add_argument("--show", type=counted(0), default=0, help="print the completions of the first N prompts")
    ev.add_argument("--out", default=None, help="also write the result as JSON here; with --protocol: the output "
                    "directory (results.jsonl, table.md, table.json; default runs/eval/PROTOCOL-NAME)")
    ev.add_argument("--protocol", choices=("d1",), default=None, help="evaluate a published protocol (greedy, lengths "
                    "128/256/512, GSM8K, MATH500, Countdown, Sudoku) over every GPU; without --model/--checkpoint "
                    "the config's own model")
    ev.add_argument("--benchmarks", default=None, help="with --protocol: comma-separated subset, e.g. gsm8k,math500")
    ev.add_argument("--lengths", default=None, help="with --protocol: generation lengths, e.g. 256 or 128,256,512")
    ev.add_argument("--workers", type=counted(1), default=None, help="with --protocol: eval workers (default: one per "
                    "GPU of the cluster; without GPUs rollout.num_workers)")
    ev.add_argument("--graders", default=None, help="with --protocol or --regrade-d1: MATH500 also graded by these, "
                    "each in its own row: latex, math-verify")
    ev.add_argument("--generation", choices=("stabledrl", "d1"), default=None, help="with --protocol: decode as this "
                    "project does (default) or exactly as d1's eval (left padding, no attention mask, fp16 autocast, "
                    "second BOS); docs/protocol.md")
    ev.add_argument("--regrade-d1", metavar="PATH", default=None, help="grade d1's generation files (a d1 checkout: "
                    "its eval/eval_baselines, or a directory of *_generations.json) with this project's d1 graders and "
                    "print the table; --out writes every decision as JSON")
    add_trust_flags(ev)
    ev.add_argument("overrides", nargs="*", help="dotted overrides of the config, e.g. sampler.temperature=0")

    pl = sub.add_parser("plot", help="reward, held-out accuracy, ratios, grad norm, clipping, staleness to PNG")
    pl.add_argument("runs", nargs="+", help="run directories (holding metrics.jsonl) or metrics.jsonl files")
    pl.add_argument("--out", required=True, help="PNG to write")
    pl.add_argument("--group", choices=("none", "parent"), default="none",
                    help="parent: runs in one directory share a colour (a study's METHOD/seedN), mean drawn thick")
    pl.add_argument("--smooth", type=ema_weight, default=0.8, help="EMA weight of the reward panel, in [0, 1) (0: raw)")
    pl.add_argument("--title", default=None)

    st = sub.add_parser("study", help="GRPO vs StableDRL vs StableDRL+DiPOD vs DRPO over seeds: table + figure")
    st.add_argument("--config", default=str(STUDY_CPU), help=f"study config (default: {STUDY_CPU})")
    st.add_argument("--report", metavar="STUDY_DIR", default=None,
                    help="only rebuild table.md, results.json, figure.png (and the docs/study.md section) from "
                    "STUDY_DIR")
    st.add_argument("--dry-run", action="store_true", help="print the runs and the first run's config, then exit")
    st.add_argument("overrides", nargs="*", help="dotted overrides, e.g. job.run.steps=10 seeds=[0] output_dir=/tmp/s")


def add_trust_flags(parser: argparse.ArgumentParser) -> None:
    """The two ways a user overrides the checks of a run directory (common/trust/seal.py), on
    `train` and `eval`."""
    parser.add_argument("--trust-run", action="store_true", help="use a run's config that the run did not seal "
                        "(copied from another machine or edited) although it names reward code to run")
    parser.add_argument("--allow-weaker-sandbox", action="store_true", help="let this config confine the reward less "
                        "than the run's own config did (isolation, Landlock, network, paths, limits)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "eval" and not args.regrade_d1:
            check_key(create=False)  # what verifies a run's files: a bad key fails here, in one line
        return {"eval": _eval, "plot": _plot, "study": _study}[args.command](args)
    except (ConfigError, CheckpointError, RunTrustError, DataError) as e:
        print(f"stabledrl: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:  # plot: a directory without metrics.jsonl (the message names it)
        print(f"stabledrl: {e.args[0] if e.args and isinstance(e.args[0], str) else e}", file=sys.stderr)
        return 2
    except RewardFailureRate as e:
        print(f"stabledrl: {args.command} failed: {e}", file=sys.stderr)
        return 1


def _eval(args: argparse.Namespace) -> int:
    from stabledrl.evaluation.offline import carried_config, eval_command  # torch: only to evaluate a policy

    graders = [g for g in args.graders.split(",") if g] if args.graders else None
    if args.regrade_d1:
        for name in graders or []:
            try:
                check_math_grader(name)
            except ValueError as e:
                raise ConfigError(f"--graders: {e}") from None
        regrade_command(args.regrade_d1, graders or [], args.out)
        return 0
    args.config = args.config or carried_config(*(d for d in (args.adapter, args.model) if d is not None))
    args.math_graders = graders
    cfg = load_job_config(args.config, args.overrides)
    check_eval_trust(Path(args.config), args.checkpoint, args.model, cfg.model_dump(mode="json"),
                     trust_run=args.trust_run, allow_weaker=args.allow_weaker_sandbox)
    if args.adapter is not None and args.checkpoint is not None:
        raise ConfigError("eval: --adapter goes onto a base model (--model, else the config's); a checkpoint holds its "
                          "own weights (a LoRA job's, its adapters): give one of them")
    if args.protocol:
        return _protocol_eval(args, cfg)
    if args.model is None and args.checkpoint is None and args.adapter is None:
        raise ConfigError("eval: give --model, --checkpoint or --adapter (or --protocol to evaluate the config's own "
                          "model)")
    if args.k < 1 or (args.samples is not None and args.samples < args.k):
        raise ConfigError(f"--k must be >= 1 and at most --samples (got k={args.k}, samples={args.samples})")
    note = greedy_note(cfg, max(args.k, args.samples or cfg.eval.samples_per_prompt))
    if note:
        print(note, file=sys.stderr)
    eval_command(cfg, model_dir=args.model, checkpoint=args.checkpoint, adapter=args.adapter, k=args.k,
                 num_prompts=args.num_prompts, samples_per_prompt=args.samples, out=args.out, show=args.show)
    return 0


def greedy_note(cfg, samples: int) -> str:
    """A line saying pass@k is pass@1 where every sample of a prompt is the same completion: greedy
    decoding (temperature 0) that unmasks by confidence draws nothing at random ('' otherwise)."""
    sampler = cfg.eval.sampler_for(cfg.sampler)
    if samples < 2 or sampler.temperature != 0 or sampler.remasking != "low_confidence":
        return ""
    return (f"stabledrl eval: note: decoding is greedy (temperature 0), so the {samples} samples of a prompt are one "
            "completion and pass@k equals pass@1; to sample, add eval.temperature=1.0")


def _protocol_eval(args: argparse.Namespace, cfg) -> int:
    from stabledrl.evaluation.protocol_command import protocol_command, protocol_config  # torch and Ray

    try:
        lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else None
    except ValueError:
        raise ConfigError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
    benchmarks = args.benchmarks.split(",") if args.benchmarks else None
    protocol = protocol_config(cfg, args.protocol, benchmarks=benchmarks, lengths=lengths, num_prompts=args.num_prompts,
                               math_graders=args.math_graders, generation=args.generation)
    try:
        protocol_command(cfg, protocol, model_dir=args.model, checkpoint=args.checkpoint, adapter=args.adapter,
                         out=args.out, workers=args.workers)
    except (DataError, ResultsMismatch, CheckpointError) as e:  # refused before sampling (or a model that cannot load)
        print(f"stabledrl: {e}", file=sys.stderr)
        return 2
    return 0


def _plot(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs, group=args.group)
    status = plot_runs(runs, args.out, title=args.title, smooth=args.smooth)
    missing = [title for title, s in status.items() if s != "drawn"]
    print(
        f"stabledrl plot: {len(runs)} run(s) -> {args.out}"
        + (f" (not logged: {', '.join(missing)})" if missing else "")
    )
    return 0


def _study(args: argparse.Namespace) -> int:
    from stabledrl.recipes.study import load_study_config, load_study_dir, run_config, write_report  # torch and Ray

    if args.report:
        study = load_study_dir(args.report)
        written = write_report(study, command=f"stabledrl study --report {args.report}")
        print(f"stabledrl study: {len(written['runs'])} runs -> {written['table']}, {written['figure']}")
        return 0
    study = load_study_config(args.config, args.overrides)
    if args.dry_run:
        import yaml

        print("runs: " + ", ".join(f"{m}/seed{s}" for m, s in study.runs))
        first = run_config(study, *study.runs[0])
        print(yaml.safe_dump(first.model_dump(mode="json"), sort_keys=False), end="")
        return 0
    return _run_study(study, " ".join(["stabledrl study --config", args.config, *map(shlex.quote, args.overrides)]))


def _run_study(study, command: str) -> int:
    from stabledrl.recipes.study import run_study, save_study_config, write_report  # torch and Ray

    study_file = save_study_config(study)
    print(f"stabledrl study: {len(study.runs)} runs ({len(study.methods)} methods x {len(study.seeds)} seeds), "
          f"{study.concurrency} at a time; output in {study.output_dir}", flush=True)
    result = run_study(study, study_file=study_file)
    timing = {"warm start": result.warmstart_s, "runs": result.wall_s - result.warmstart_s, "total": result.wall_s}
    t0 = time.monotonic()
    written = write_report(study, statuses=result.statuses, timing=timing, command=command)
    print((study.output_dir / "table.md").read_text())
    statuses = list(result.statuses.values())
    print(f"stabledrl study: {statuses.count('finished')}/{len(statuses)} runs finished in {result.wall_s:.0f} s "
          f"(warm start {result.warmstart_s:.0f} s, report {time.monotonic() - t0:.0f} s); "
          f"table {written['table']}, figure {written['figure']}")
    failed = [f"{o.method}/seed{o.seed}: {o.status} {o.error}" for o in result.outcomes if o.status != "finished"]
    for line in failed:
        print(f"  {line}", file=sys.stderr)
    return 1 if any(o.status == "failed" for o in result.outcomes) else 0

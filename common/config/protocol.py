"""The ``eval.protocol`` section: a published evaluation protocol, offline or during training.

    stabledrl eval --config run/config.yaml --protocol d1 --checkpoint run/checkpoints
    eval:
      protocol:
        name: d1
        gen_lengths: [128, 256, 512]
        benchmarks: {gsm8k: {}, math500: {num_prompts: 100}}

The protocol (``stabledrl.common.tasks.protocols``) fixes the prompts, the answer format and the graders of
every benchmark; this section picks the benchmarks, where their data lies, and the decoding
(d1: greedy, block 32, steps = length / 2, one column per generation length).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from stabledrl.common.config.base import StrictModel
from stabledrl.common.config.task import DataSource

# what the 'math-verify' grader (common/tasks/graders.py) says when its package is missing
MATH_VERIFY_MISSING = ("the MATH grader 'math-verify' needs the math-verify package, a dependency of stabledrl "
                       "missing from this environment: reinstall stabledrl, or pip install 'math-verify[antlr4_13_2]'")

# the world size each of d1's published generation files came from (its batches depend on it)
D1_PUBLISHED_WORLD_SIZES = {("countdown", n): 7 for n in (128, 256, 512)} | {
    ("sudoku", n): 7 for n in (128, 256, 512)} | {("math500", 128): 2, ("math500", 256): 6, ("math500", 512): 6}
D1_RUN_EVAL_WORLD_SIZE = 8  # d1's eval/run_eval.sh: GPU_IDS=(0 1 2 3 4 5 6 7)


def d1_world_size(benchmark: str, gen_length: int) -> int:
    """The ranks d1's published files of ``benchmark`` at ``gen_length`` came from (run_eval.sh's 8 where
    the files do not say)."""
    return D1_PUBLISHED_WORLD_SIZES.get((benchmark, gen_length), D1_RUN_EVAL_WORLD_SIZE)


BenchmarkName = Literal["gsm8k", "math500", "countdown", "sudoku"]


class BenchmarkConfig(StrictModel):
    """One benchmark of the protocol; every field left out takes the protocol's choice."""

    source: Optional[DataSource] = Field(
        None, description="where the benchmark's rows are (a file or a Hugging Face dataset); None: the protocol's "
        "(GSM8K test split and MATH500 from the datasets cache, Countdown and Sudoku from d1's files under data/d1/)"
    )
    num_prompts: Optional[int] = Field(
        None, ge=1, description="evaluate a subsample of this many rows, drawn as the protocol draws it (d1: numpy "
        "RandomState(42).choice without replacement); None: the protocol's set (d1: all of GSM8K and MATH500, 256 "
        "of Countdown and Sudoku)"
    )


def _all_benchmarks() -> dict[str, BenchmarkConfig]:
    return {name: BenchmarkConfig() for name in ("gsm8k", "math500", "countdown", "sudoku")}


class ProtocolConfig(StrictModel):
    """A published evaluation protocol: its prompts and graders, at several generation lengths."""

    name: Literal["d1"] = Field("d1", description="the protocol: 'd1' (d1 and SPG's release evaluate with it; the "
                                "StableDRL release's own evaluation differs: common/tasks/protocols.py)")
    benchmarks: dict[BenchmarkName, BenchmarkConfig] = Field(
        default_factory=_all_benchmarks, min_length=1,
        description="benchmarks to evaluate (rows of the table): gsm8k, math500, countdown, sudoku",
    )
    gen_lengths: list[int] = Field(
        [128, 256, 512], min_length=1, description="generation lengths (columns of the table), each a multiple of "
        "block_length"
    )
    block_length: Optional[int] = Field(
        32, ge=1, description="semi-autoregressive block (d1: 32); None: the policy's own block size (block-diffusion "
        "policies such as SDAR / TraDo need theirs)"
    )
    steps_per_token: float = Field(
        0.5, gt=0.0, le=1.0,
        description="denoising steps = gen_length × this (d1: gen_length / 2, two tokens per step)"
    )
    temperature: float = Field(0.0, ge=0.0, description="0: greedy decoding (d1); T > 0 samples, seeded per prompt")
    remasking: Literal["low_confidence", "random"] = Field(
        "low_confidence", description="as sampler.remasking (d1: low_confidence)"
    )
    cache: Literal["auto", "none", "prefix", "dual"] = Field(
        "auto", description="as sampler.cache (auto: the exact one)"
    )
    batch_size: int = Field(16, ge=1, description="prompts per sampler call on one worker (memory, not results)")
    max_prompt_tokens: int = Field(
        4096, ge=1, description="a templated prompt longer than this stops the evaluation, naming the row (no "
        "benchmark row is dropped silently)"
    )
    seed: int = Field(0, description="sampling seed when temperature > 0 (prompt i draws from (seed, prompt id))")
    math_graders: list[Literal["latex", "math-verify"]] = Field(
        [], description="MATH500 graded again by these graders, each in its own row of the table (the MATH500 row "
        "is d1's grader, MATH's is_equiv, always): 'latex' (the project's LaTeX equivalence: exact numbers, reduced "
        "fractions, units and \\text{} stripped), 'math-verify' (Math-Verify's symbolic comparison)"
    )
    generation: Literal["stabledrl", "d1"] = Field(
        "stabledrl", description="how prompts are batched and decoded: 'stabledrl' (each prompt alone: padding "
        "hidden, the policy's dtype, one BOS, completions read up to the first EOS); 'd1' (as d1's eval: the batch "
        "left-padded with the pad token and no attention mask, fp16 autocast on CUDA, d1's second BOS, the whole "
        "window decoded with special tokens kept). docs/protocol.md says what each changes"
    )

    d1_world_size: Optional[int] = Field(
        None, ge=1, description="generation d1: the GPUs d1's run was spread over (its rank r decodes rows r, r + W, "
        "...); with the batch size it fixes which rows share a padded batch. None: the count d1's published files "
        "came from, per benchmark and length (Countdown and Sudoku 7; MATH500 2 at 128 tokens, 6 at 256 and 512; "
        "GSM8K, whose files do not say, run_eval.sh's 8: stabledrl.common.config.protocol.d1_world_size)"
    )
    d1_batch_size: Optional[int] = Field(
        None, ge=1, description="generation d1: prompts per d1 batch; None: d1's run_eval.sh (4 at length 512, "
        "else 8)"
    )

    def d1_batch(self, gen_length: int) -> int:
        return self.d1_batch_size or (4 if gen_length >= 512 else 8)

    def d1_ranks(self, benchmark: str, gen_length: int) -> int:
        """generation d1: the world size whose rank split decides ``benchmark``'s batches at ``gen_length``."""
        return self.d1_world_size or d1_world_size(benchmark, gen_length)

    @field_validator("math_graders")
    @classmethod
    def _graders_run_here(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("math_graders: each grader once")
        if "math-verify" in v:  # the other graders need nothing beyond the project
            try:
                import math_verify  # noqa: F401  (imported only when a config names its grader)
            except ImportError:
                raise ValueError(MATH_VERIFY_MISSING) from None
        return v

    @field_validator("gen_lengths")
    @classmethod
    def _distinct_lengths(cls, v: list[int]) -> list[int]:
        if any(length < 1 for length in v) or len(set(v)) != len(v):
            raise ValueError("generation lengths must be distinct positive integers")
        return sorted(v)

    @model_validator(mode="after")
    def _d1_generation_is_greedy(self) -> "ProtocolConfig":
        if self.generation == "d1" and (self.temperature != 0 or self.remasking != "low_confidence"):
            raise ValueError("generation: 'd1' is d1's greedy decoding: it needs temperature 0 and remasking "
                             "low_confidence")
        return self

    @model_validator(mode="after")
    def _lengths_fit_blocks(self) -> "ProtocolConfig":
        for length in self.gen_lengths:
            if self.block_length is not None and length % self.block_length:
                raise ValueError(f"gen_lengths: {length} is not a multiple of block_length={self.block_length}")
            if self.block_length is not None:
                blocks, steps = length // self.block_length, self.steps(length)
                if steps % blocks:
                    raise ValueError(f"steps_per_token: {steps} steps for length {length} do not split over its "
                                     f"{blocks} blocks")
        return self

    def steps(self, gen_length: int) -> int:
        return max(1, round(gen_length * self.steps_per_token))

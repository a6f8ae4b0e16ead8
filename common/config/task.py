"""The ``task`` config section: which task, where its prompts come from, how they are rewarded.

Discriminated by ``name``; the per-task knobs live on each task's model. Example::

    task:
      name: countdown
      source: {kind: generated, n: 10000, seed: 0}
      held_out: 200
      number_use: exactly_once
      reward: {format_weight: 0.1, custom: "rewards/my_reward.py:score", on_failure: drop}

File data (any task)::

    task:
      name: gsm8k
      source: {kind: file, path: data/gsm8k_train.parquet, columns: {prompt: question}}
      held_out_source: {kind: file, path: data/gsm8k_test.jsonl, columns: {prompt: question}}
      on_bad_row: skip

A Hugging Face dataset (hub id from the local datasets cache, or a ``save_to_disk`` directory)::

    task:
      name: gsm8k
      source: {kind: hf, dataset: openai/gsm8k, config: main, split: train, columns: {prompt: question}}
      held_out_source: {kind: hf, dataset: openai/gsm8k, config: main, split: test, columns: {prompt: question}}

The record schema per task (canonical field names; ``columns`` maps them to the file's names) is
in ``common/tasks/data.py``.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from stabledrl.common.config.base import MAX_MIB, MAX_SECONDS, StrictModel, validate

_CUSTOM_SPEC = re.compile(r"^[^:\s][^:]*:[A-Za-z_][A-Za-z0-9_]*$")
BUILT_IN_PARTS = ("custom", "correctness", "format", "anti_short")  # the reward's own parts


def reward_part_names(specs: list[str]) -> list[str]:
    """The part each custom function's value is logged under: its name in the spec, with its
    position appended where an earlier function or a part of the reward's own has that name."""
    names: list[str] = []
    for i, spec in enumerate(specs):
        name = spec.rpartition(":")[2]
        names.append(f"{name}_{i + 1}" if name in names or name in BUILT_IN_PARTS else name)
    return names


class GeneratedSource(StrictModel):
    """Prompts made by the task's generator (arithmetic, countdown, sudoku4)."""

    kind: Literal["generated"] = "generated"
    n: int = Field(10000, ge=1, description="rows to generate, all distinct (held-out rows are taken from these)")
    seed: int = Field(0, description="generator seed; row i is a function of (task, seed, i) only")


class FileSource(StrictModel):
    """Prompts read from a local JSONL, Parquet or CSV file."""

    kind: Literal["file"] = "file"
    path: str = Field(description="local path of a .jsonl / .json (one object per line), .parquet or .csv file "
                      "(a header line; values are read as text)")
    format: Literal["auto", "jsonl", "parquet", "csv"] = Field("auto", description="'auto' picks by file extension")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="canonical field -> column name in the file or dotted path into nested fields, e.g. "
        "{prompt: question} or {answer: reward_model.ground_truth}; unmapped fields keep their name",
    )


class HFDatasetSource(StrictModel):
    """Prompts from a Hugging Face dataset: a hub id read through the ``datasets`` library and its
    local cache, or a directory written by ``save_to_disk``."""

    kind: Literal["hf"] = "hf"
    dataset: str = Field(
        description="hub id ('openai/gsm8k'; read from the datasets cache, fetched only where the hub is reachable "
        "and HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are unset) or a local directory written by save_to_disk"
    )
    config: Optional[str] = Field(
        None, description="dataset configuration, e.g. 'main' for openai/gsm8k; None = default"
    )
    split: str = Field("train", description="split to read, e.g. 'train' or 'test'")
    revision: Optional[str] = Field(None, description="hub revision (branch, tag or commit); None = the default branch")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="canonical field -> column name or dotted path into nested fields, e.g. "
        "{prompt: question} or {answer: reward_model.ground_truth}",
    )


def _source_kind(value: object) -> str:
    """A data source's ``kind``; a mapping without one is a file (what older configs wrote)."""
    if isinstance(value, dict):
        return str(value.get("kind", "file"))
    return str(getattr(value, "kind", "file"))


DataSource = Annotated[
    Union[Annotated[FileSource, Tag("file")], Annotated[HFDatasetSource, Tag("hf")]], Discriminator(_source_kind)
]
Source = Annotated[Union[GeneratedSource, FileSource, HFDatasetSource], Field(discriminator="kind")]


class SandboxConfig(StrictModel):
    """What a reward may take when it runs in the sandbox (``isolation: process``): each call runs in a
    fresh process forked from the sandbox, in its own session and temporary directory; the limits
    below apply to it, and every process it leaves behind is killed when the call ends."""

    memory_mb: int = Field(4096, ge=64, le=MAX_MIB, description="address-space limit (RLIMIT_AS) of a reward "
                           "process, in MiB; an allocation beyond it fails (MemoryError) and the call counts as a "
                           "'limit' failure")
    cpu_seconds: float = Field(10.0, gt=0, le=MAX_SECONDS, description="CPU time limit (RLIMIT_CPU) of one reward "
                               "call, all its threads together (a batched call: times its completions); past it the "
                               "call is killed and counted as a 'limit' failure")
    file_size_mb: int = Field(64, ge=1, le=MAX_MIB,
                              description="largest file (RLIMIT_FSIZE) a reward may write, in MiB")
    disk_mb: int = Field(256, ge=1, le=MAX_MIB, description="bytes, in MiB, that reward code may hold in its "
                         "directory at once, every file of the import and of the call together (deleted files still "
                         "open included): the sandbox's directory is a private tmpfs of this size (in RAM), where the "
                         "kernel allows a mount namespace; a write beyond it fails with 'No space left on device'")
    landlock: bool = Field(True, description="confine files with Linux Landlock where the kernel offers it: read only "
                           "Python, the project, the reward file and read_paths; write only the call's own temporary "
                           "directory; no signals to other processes. false (or no Landlock): as root, rewards run "
                           "as user nobody instead")
    allow_network: bool = Field(False, description="allow IPv4/IPv6 sockets (TCP and UDP); otherwise a seccomp filter "
                                "denies every socket (Unix ones too, always) and Landlock ABI >= 4 every TCP connect")
    read_paths: list[str] = Field(default_factory=list, description="more files or directories a reward may read "
                                  "(e.g. a lookup table), absolute or relative to the working directory")
    pass_env: list[str] = Field(default_factory=list, description="environment variables handed to reward code; the "
                                "rest of the worker's environment (tokens, credentials) is withheld")


class RewardConfig(StrictModel):
    """Reward = correctness_weight * correctness + format_weight * format [+ anti_short_weight * anti_short],
    computed in a sandbox."""

    correctness_weight: float = Field(1.0, ge=0, description="weight of the task's checker (or the custom function)")
    format_weight: float = Field(0.1, ge=0, description="weight of the well-formed-answer part (0 disables it)")
    anti_short_weight: float = Field(
        0.0, ge=0, description="weight of the StableDRL release's anti-short term (common/tasks/anti_short.py): 1 "
        "unless the completion is under 200 visible characters and mostly a \\boxed{} answer; 0 disables it. The "
        "StableDRL recipes set 1.0 as the release adds it to every reward",
    )
    custom: Optional[Union[str, list[str]]] = Field(
        None,
        description="the reward function(s) replacing the task's checker: 'path/to/file.py:function' or "
        "'package.module:function', or a list of them (their weighted sum, custom_weights). Each takes one of two "
        "forms (docs/rewards.md): fn(completion: str, row: stabledrl.common.tasks.Row) -> float, row.record being "
        "the whole data record; or TRL's batched fn(prompts, completions, **columns) -> list[float | None]. A "
        "relative file path is relative to the working directory the config is loaded in, made absolute then (so "
        "the run's config.yaml names the file absolutely); a module of Python's standard library (os:system) is "
        "refused unless allowed_modules names it",
    )
    custom_weights: Optional[list[float]] = Field(
        None, description="weight of each custom function, in order (TRL's reward_weights); None: 1 each",
    )
    allowed_roots: list[str] = Field(
        default_factory=list, description="directories the custom reward file must lie in (resolved, symlinks "
        "followed); empty: anywhere that passes the ownership and write-permission checks of every directory on its "
        "path")
    allowed_modules: list[str] = Field(
        default_factory=list, description="standard-library modules a 'module:function' custom reward may name "
        "(refused otherwise: os:system is no reward)")
    isolation: Literal["auto", "inline", "process"] = Field(
        "auto",
        description="'process' runs rewards in a child process (timeouts are enforced, crashes contained); "
        "'inline' runs them in the worker (exceptions and bad values are still caught); "
        "'auto' = process iff custom is set",
    )
    timeout_s: float = Field(5.0, gt=0, le=MAX_SECONDS, description="time limit per completion (enforced with "
                             "isolation=process); a batched reward scores a batch in one call, whose limit is "
                             "timeout_s times its completions, and a call past it fails every completion of the batch")
    import_timeout_s: float = Field(60.0, gt=0, le=MAX_SECONDS, description="time limit of importing the custom reward "
                                    "(its module-level code) in the sandbox; past it the job stops, naming the file")
    max_abs: float = Field(1e6, gt=0, description="largest |reward| (and |part|) accepted; a finite value beyond it "
                           "is a failed call ('out_of_range'): 1e300 would overflow the loss")
    on_failure: Literal["zero", "drop"] = Field(
        "zero",
        description="a failing reward (exception, non-number, NaN/inf, timeout) gives reward 0, or drops the sample",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits of the process sandbox")
    max_failed_fraction: float = Field(
        0.5, gt=0, le=1, description="the job stops, naming the reward and its failure counts, once more than this "
        "fraction of its calls failed (after failure_check_after calls); 1 never stops")
    failure_check_after: int = Field(64, ge=1, description="reward calls counted before max_failed_fraction applies")

    @field_validator("custom")
    @classmethod
    def _custom_spec(cls, v: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        specs = [v] if isinstance(v, str) else v or []
        if isinstance(v, list) and not v:
            raise ValueError("an empty list: name at least one function, or leave custom unset")
        for spec in specs:
            if not _CUSTOM_SPEC.match(spec):
                raise ValueError(f"{spec!r} must be 'path/to/file.py:function' or 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _custom_target(self) -> "RewardConfig":
        """A relative reward file becomes absolute (against the working directory); a standard
        library module is refused unless allowed_modules names it."""
        specs = [self._resolved(spec) for spec in self.custom_specs]
        if self.custom is not None:
            object.__setattr__(self, "custom", specs[0] if isinstance(self.custom, str) else specs)
        if self.custom_weights is not None and len(self.custom_weights) != len(specs):
            raise ValueError(f"custom_weights: {len(self.custom_weights)} weights for {len(specs)} custom functions; "
                             "give one per function, in order")
        return self

    def _resolved(self, spec: str) -> str:
        target, _, attr = spec.rpartition(":")
        if target.endswith(".py") or "/" in target:
            return f"{os.path.abspath(os.path.expanduser(target))}:{attr}"
        top = target.partition(".")[0]
        if (top in sys.stdlib_module_names or top in sys.builtin_module_names) and top not in self.allowed_modules \
                and target not in self.allowed_modules:
            raise ValueError(f"custom: {target!r} is a module of Python's standard library, not a reward; name a file "
                             "(path/to/file.py:function) or your own package, or list it in allowed_modules")
        return spec

    @property
    def custom_specs(self) -> list[str]:
        """The custom functions' specs, in order ([] without any)."""
        return [self.custom] if isinstance(self.custom, str) else list(self.custom or [])

    @property
    def custom_names(self) -> list[str]:
        """What each custom function's value is logged as (``rollout/reward/<name>``; several only)."""
        return reward_part_names(self.custom_specs)

    def describe_custom(self) -> str:
        """The custom reward in words, for messages: 'custom reward a.py:f' or '... a.py:f, b.py:g'."""
        return "custom reward " + ", ".join(self.custom_specs)

    @property
    def resolved_isolation(self) -> Literal["inline", "process"]:
        if self.isolation == "auto":
            return "process" if self.custom else "inline"
        return self.isolation


class _TaskBase(StrictModel):
    source: Source = Field(default_factory=GeneratedSource, description="where the prompts come from")
    held_out: Union[Annotated[int, Field(ge=0)], Annotated[float, Field(gt=0, lt=1)]] = Field(
        0,
        description="held-out rows taken from the source: an int is an exact count (the rows with the smallest "
        "split hash), a float in (0, 1) a fraction (rows whose hash falls below it; "
        "membership never depends on other rows)",
    )
    held_out_source: Optional[DataSource] = Field(
        None, description="a separate held-out file or dataset split (then held_out must be 0)"
    )
    split_seed: int = Field(0, description="seed of the train / held-out split hash")
    max_prompt_tokens: int = Field(
        512, ge=1,
        description="rows whose prompt, as the model reads it (chat template included), has more of the model's tokens "
        "are bad rows (handled by on_bad_row)",
    )
    long_prompts: Literal["refuse", "keep_last"] = Field(
        "refuse", description="a prompt over max_prompt_tokens: 'refuse' makes its row a bad row (on_bad_row); "
        "'keep_last' keeps its last max_prompt_tokens tokens, as d1 truncates its prompts (max_prompt_length, "
        "from the left: the start of the template goes first) wherever prompts are encoded"
    )
    on_bad_row: Literal["error", "skip"] = Field(
        "error",
        description="'error': stop at the first bad row, naming its row number; 'skip': drop bad rows and count them",
    )
    system_prompt: Optional[str] = Field(
        None,
        description="system message of the chat template (chat models), or text put before the prompt with a blank "
        "line (plain tokenizers); None = no system message (no built-in task sets one)",
    )
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto",
        description="'auto': prompts go through the tokenizer's chat template (system + user turn, "
        "add_generation_prompt) when it has one, else plain text; 'on': a template is required; 'off': always the "
        "plain rendered text (data that is already templated). The same encoding serves rollouts, the warm start, "
        "evaluation and max_prompt_tokens",
    )
    template: Optional[str] = Field(
        None, description="prompt template containing '{prompt}' once; None = the task's default"
    )
    reward: RewardConfig = Field(default_factory=RewardConfig)

    @field_validator("template")
    @classmethod
    def _one_slot(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v.count("{prompt}") != 1:
            raise ValueError("must contain '{prompt}' exactly once")
        return v

    @model_validator(mode="after")
    def _held_out_once(self) -> "_TaskBase":
        if self.held_out_source is not None and self.held_out:
            raise ValueError("held_out: set held_out or held_out_source, not both")
        return self


class ArithmeticConfig(_TaskBase):
    """Short integer problems ('23+41=' -> '64'): what the CPU quickstart trains on."""

    name: Literal["arithmetic"] = Field(description="task name (selects this section's schema)")
    digits: int = Field(2, ge=1, le=4, description="largest operand has this many digits")
    operators: list[Literal["+", "-", "*", "/"]] = Field(["+", "-"], min_length=1, description="operators to draw from")
    terms: int = Field(2, ge=2, le=4, description="operands per problem")
    allow_negative: bool = Field(False, description="allow negative answers (else subtractions are reordered)")


class CountdownConfig(_TaskBase):
    """Reach the target with + - * / and the given numbers (TinyZero, d1)."""

    name: Literal["countdown"] = Field(description="task name (selects this section's schema)")
    min_numbers: int = Field(3, ge=2, le=6, description="fewest numbers per puzzle (TinyZero's set: 3 to 4)")
    max_numbers: int = Field(4, ge=2, le=6, description="most numbers per puzzle")
    max_number: int = Field(100, ge=2, le=1000, description="numbers are drawn from 1..max_number")
    max_target: int = Field(1000, ge=1, description="generated targets lie in 1..max_target")
    number_use: Literal["exactly_once", "at_most_once"] = Field(
        "exactly_once",
        description="'exactly_once' (TinyZero, d1: the multiset of numbers used equals the given one) or "
        "'at_most_once' (the released StableDRL/SPG loader: a sub-multiset)",
    )

    @model_validator(mode="after")
    def _range(self) -> "CountdownConfig":
        if self.min_numbers > self.max_numbers:
            raise ValueError("min_numbers must be <= max_numbers")
        return self


class Sudoku4Config(_TaskBase):
    """4x4 Sudoku given as 16 digits, 0 = empty (d1's format)."""

    name: Literal["sudoku4"] = Field(description="task name (selects this section's schema)")
    empty_cells: int = Field(10, ge=1, le=12, description="empty cells per generated puzzle")
    unique: bool = Field(True, description="generate only puzzles with a unique solution")
    scoring: Literal["cells", "valid"] = Field(
        "cells",
        description="'cells' (d1): fraction of empty cells equal to the reference solution; "
        "'valid': 1 iff the grid is a valid solution consistent with the clues",
    )

    @model_validator(mode="after")
    def _cells_need_unique(self) -> "Sudoku4Config":
        if self.scoring == "cells" and not self.unique and isinstance(self.source, GeneratedSource):
            raise ValueError(
                "scoring 'cells' compares with one solution: generate unique puzzles or use scoring 'valid'"
            )
        return self


GSM8K_TEMPLATE = "{prompt}\nSolve it step by step, then write the final answer as a number after '####'."
MATH_TEMPLATE = "{prompt}\nReason step by step and put your final answer in \\boxed{}."


_MATH_VERIFY_GRADER = (
    "'math-verify': the StableDRL release's check, Math-Verify's parse of the reference text and of the whole "
    "completion, then verify with its 5 s limit, any error wrong (common/tasks/whole_completion.py; needs the "
    "math-verify package)"
)


def math_verify_available() -> Optional[str]:
    """None when Math-Verify imports, else what to install (common/tasks/whole_completion.py grades with it)."""
    try:
        import math_verify  # noqa: F401  (imported only when a config names the grader that uses it)
    except ImportError:
        return "the math-verify package: pip install 'math-verify[antlr4_13_2]'"
    return None


def _math_verify_installed(grader: str) -> str:
    missing = math_verify_available() if grader == "math-verify" else None
    if missing:
        raise ValueError(f"grader 'math-verify' needs {missing}")
    return grader


class Gsm8kConfig(_TaskBase):
    """Grade-school word problems; the answer is the final number (file data only)."""

    name: Literal["gsm8k"] = Field(description="task name (selects this section's schema)")
    source: DataSource = Field(description="a file or a Hugging Face dataset (gsm8k has no generator)")
    template: Optional[str] = Field(
        GSM8K_TEMPLATE, description="the prompt as the model reads it, containing '{prompt}' once; the default adds "
        "the instruction the checker reads answers by ('####'); '{prompt}' sends the data's prompt as it is",
    )
    grader: Literal["number", "math-verify"] = Field(
        "number", description="how correctness is decided: 'number' (the number after '####', else the last in the "
        "answer tag, else the last anywhere, compared as decimals: common/tasks/gsm8k.py); " + _MATH_VERIFY_GRADER,
    )

    @field_validator("grader")
    @classmethod
    def _grader_installed(cls, v: str) -> str:
        return _math_verify_installed(v)


class MathConfig(_TaskBase):
    """Competition math with a \\boxed{} answer (file data only)."""

    name: Literal["math"] = Field(description="task name (selects this section's schema)")
    source: DataSource = Field(description="a file or a Hugging Face dataset (math has no generator)")
    template: Optional[str] = Field(
        MATH_TEMPLATE, description="the prompt as the model reads it, containing '{prompt}' once; the default adds "
        "the instruction the checker reads answers by (\\boxed{}); '{prompt}' sends the data's prompt as it is "
        "(free-form data: consider the generic task)",
    )
    box: Literal["last", "first"] = Field("last", description="which \\boxed{} of a completion is its answer")
    grader: Literal["latex", "math-verify"] = Field(
        "latex", description="how correctness is decided: 'latex' (the box's content against the reference's, "
        "equal after LaTeX normalisation: common/tasks/latex.py); " + _MATH_VERIFY_GRADER,
    )
    max_level: Optional[int] = Field(
        None, ge=1, description="keep problems whose 'level' column ('Level 3') is at most this, read as the "
        "StableDRL release reads it (a level that is no integer counts as 5); None keeps every level "
        "(the release: 4). Filtered rows are counted, never an error",
    )
    max_problem_chars: Optional[int] = Field(
        None, ge=1, description="keep problems of at most this many characters (the release: fewer than 1500, so "
        "1499); None: no bound",
    )
    max_problem_words: Optional[int] = Field(
        None, ge=1, description="keep problems of at most this many whitespace-separated words (the release: 300); "
        "None: no bound",
    )

    @field_validator("grader")
    @classmethod
    def _grader_installed(cls, v: str) -> str:
        return _math_verify_installed(v)


class GenericRewardConfig(RewardConfig):
    """The generic task's reward: the user's functions (required), weighted as any task's; no format
    part, the task having no answer format of its own."""

    format_weight: float = Field(0.0, ge=0, description="the generic task has no format check: 0 (score the format "
                                 "in a reward function of your own)")

    @model_validator(mode="after")
    def _functions_decide(self) -> "GenericRewardConfig":
        if not self.custom:
            raise ValueError("custom: the generic task has no checker of its own; name your reward function(s), e.g. "
                             "custom: rewards.py:accuracy (docs/rewards.md)")
        if self.format_weight:
            raise ValueError("format_weight: the generic task has no format check of its own; set 0 and score the "
                             "format in a reward function")
        return self


class GenericConfig(_TaskBase):
    """Any prompt column (or chat messages) plus any other columns; the user's reward functions
    decide (docs/data.md). Nothing is added to the prompt unless template says so."""

    name: Literal["generic"] = Field(description="task name (selects this section's schema)")
    source: DataSource = Field(description="a file or a Hugging Face dataset (the generic task has no generator)")
    template: Optional[str] = Field(
        "{prompt}", description="the prompt as the model reads it, containing '{prompt}' once: '{prompt}' sends the "
        "data's prompt as it is; write an instruction around it to add one, e.g. '{prompt}\\n\\nAnswer in one word.'",
    )
    reward: Optional[GenericRewardConfig] = Field(None, description="the user's reward functions: reward.custom is "
                                                  "required (docs/rewards.md)")
    correct_at: float = Field(
        1.0, description="held-out evaluation counts a completion correct when its reward (the weighted total) is at "
        "least this; pass@k and the job's accuracy line follow",
    )

    @model_validator(mode="after")
    def _reward_given(self) -> "GenericConfig":
        if self.reward is None:
            raise ValueError("reward.custom: the generic task has no checker of its own; name your reward "
                             "function(s), e.g. reward: {custom: rewards.py:accuracy} (docs/rewards.md)")
        return self


TaskConfig = Annotated[
    Union[ArithmeticConfig, CountdownConfig, Sudoku4Config, Gsm8kConfig, MathConfig, GenericConfig],
    Field(discriminator="name"),
]
AnyTaskConfig = Union[ArithmeticConfig, CountdownConfig, Sudoku4Config, Gsm8kConfig, MathConfig, GenericConfig]


class _Section(StrictModel):
    task: TaskConfig


def parse_task_config(data: dict) -> AnyTaskConfig:
    """Validate a ``task`` section on its own; errors name fields as ``task.<path>``."""
    return validate(_Section, {"task": data}, source="task config").task

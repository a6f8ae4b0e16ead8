"""The user's reward functions (``task.reward.custom``): one or several, each in one of two forms,
told apart by its signature.

    def score(completion: str, row: Row) -> float                      # one completion at a time
    def accuracy(prompts, completions, **columns) -> list[float | None]  # TRL's reward_funcs, batched

One completion (the project's own form): ``completion`` is the decoded text up to the first EOS,
``row`` the prompt's Row (``row.record``: every column of the data record). Any two positional
parameters fit.

Batched (TRL's ``GRPOTrainer`` convention): a function with a ``completions`` parameter is called
once per batch with keyword lists, one item per completion: ``prompts`` (the data's prompt, or
its chat messages), ``completions`` (the text; ``[{"role": "assistant", "content": text}]`` where
the prompt was chat messages, as TRL passes conversational data) and every column of the data
record by its name (``prompt`` and ``completion`` excepted; a generated task's rows give
``answer`` and their task fields). It returns one value per completion; ``None`` means "not
applicable to this completion". Only the columns it names are passed unless it takes
``**kwargs``; a parameter that is no column fails the call naming the columns there are.

Several functions combine as TRL combines them: reward = Σ_i w_i · f_i over the functions that
returned a number (``task.reward.custom_weights``, default 1 each); a completion for which every
function returned None has no reward (a ``non_number`` failure). One function's value is the
``custom`` part of the reward; with several, each one's value is also a part of its own name
(logged as ``rollout/reward/<name>``; a name the reward already uses gets its position appended).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.task import reward_part_names
from stabledrl.common.tasks.base import NonNumericReward, RewardResult, Row, as_reward_number

Form = Literal["sample", "batch"]
SAMPLE_SIGNATURE = "fn(completion: str, row: Row) -> float (one completion)"
BATCH_SIGNATURE = "fn(prompts, completions, **columns) -> list[float | None] (TRL's reward_funcs, batched)"
Outcome = Union[RewardResult, BaseException]


class RewardSignatureError(ConfigError):
    """A reward function whose signature fits neither form, or that asks for a column the data lacks."""


def reward_form(fn: Callable[..., Any], spec: str) -> Form:
    """'batch' for a function with a ``completions`` parameter, 'sample' for one taking two
    positional arguments; RewardSignatureError naming the function and both forms otherwise."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as one completion
        return "sample"
    params = list(signature.parameters.values())
    named = {p.name: p for p in params}
    if "completions" in named and named["completions"].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                inspect.Parameter.KEYWORD_ONLY):
        return "batch"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_two = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    if takes_two and len(required) <= 2 and all(p in positional for p in required):
        return "sample"
    raise RewardSignatureError(
        f"task.reward.custom: {spec} has the signature {signature}, which fits neither accepted form: "
        f"{SAMPLE_SIGNATURE} or {BATCH_SIGNATURE}")


@dataclass(frozen=True)
class RewardFunction:
    """One user function: its part name, spec, callable, form and weight."""

    name: str
    spec: str
    fn: Callable[..., Any]
    form: Form
    weight: float

    def values(self, completions: Sequence[str], rows: Sequence[Row]) -> list[Union[Optional[float], BaseException]]:
        """The function's value for each completion (None: not applicable; an exception: that
        completion's failure). A batched call that raises, or returns no list of the right
        length, fails every completion of the batch: it is one call."""
        if self.form == "sample":
            return [_attempt(lambda c=c, r=r: _number(self.fn(c, r), self.name)) for c, r in zip(completions, rows)]
        try:
            got = self.fn(**self._arguments(completions, rows))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the batch's failure
            return [e] * len(completions)
        got = got.tolist() if hasattr(got, "tolist") else got
        if not isinstance(got, (list, tuple)) or len(got) != len(completions):
            size = f"{len(got)} values" if isinstance(got, (list, tuple)) else type(got).__name__
            error = NonNumericReward(f"{self.name} returned {size} for {len(completions)} completions; a batched "
                                     "reward returns one value (or None) per completion")
            return [error] * len(completions)
        return [_attempt(lambda v=v: _number(v, self.name)) for v in got]

    def _arguments(self, completions: Sequence[str], rows: Sequence[Row]) -> dict[str, Any]:
        """TRL's keyword lists: prompts, completions and every column, aligned by completion."""
        columns = [_columns(r) for r in rows]
        names = list(dict.fromkeys(k for c in columns for k in c if k not in ("prompt", "completion")))
        arguments = {
            "prompts": [[dict(m) for m in r.messages] if r.messages else r.prompt for r in rows],
            "completions": [[{"role": "assistant", "content": c}] if r.messages else c
                            for c, r in zip(completions, rows)],
            **{k: [c.get(k) for c in columns] for k in names},
        }
        params = inspect.signature(self.fn).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            arguments = {k: v for k, v in arguments.items() if k in params}
        missing = [p.name for p in params.values() if p.default is p.empty and p.name not in arguments
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            raise RewardSignatureError(
                f"{self.spec} needs {', '.join(map(repr, missing))}, which the data does not have (its columns: "
                f"{', '.join(names) or 'none'}; every reward also gets prompts and completions)")
        return arguments


def _columns(row: Row) -> Mapping[str, Any]:
    """A row's columns for a batched reward: the data record, or a generated row's answer and fields."""
    return row.record if row.record else {"answer": row.answer, **row.meta}


def _number(value: Any, name: str) -> Optional[float]:
    return None if value is None else as_reward_number(value, name)


def _attempt(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - that completion's failure
        return e


def combine(functions: Sequence[RewardFunction], values: Sequence[Union[Optional[float], BaseException]]) -> Outcome:
    """One completion's reward from each function's value: Σ w_i f_i over the numbers (module
    docstring); the first function's exception when one failed."""
    failed = next((v for v in values if isinstance(v, BaseException)), None)
    if failed is not None:
        return failed
    present = [(f, v) for f, v in zip(functions, values) if v is not None]
    if not present:
        return NonNumericReward(f"every reward function ({', '.join(f.name for f in functions)}) returned None for "
                                "this completion: none applies to it")
    total = sum(f.weight * v for f, v in present)
    parts = {f.name: v for f, v in present} if len(functions) > 1 else {}
    return RewardResult(total=total, parts=parts)


class RewardFunctions:
    """The functions of ``task.reward.custom``, imported on first use (``load``), called per
    completion or per batch as their forms say."""

    def __init__(self, specs: Sequence[str], weights: Optional[Sequence[float]] = None,
                 allowed_roots: Sequence[str] = (),
                 load_one: Optional[Callable[[str, Sequence[str]], Callable[..., Any]]] = None) -> None:
        self.specs, self.allowed_roots = list(specs), tuple(allowed_roots)
        self.weights = list(weights) if weights is not None else [1.0] * len(self.specs)
        self._load_one = load_one
        self._functions: Optional[list[RewardFunction]] = None

    def load(self) -> list[RewardFunction]:
        if self._functions is None:
            from stabledrl.common.tasks.build import load_reward_function  # build imports this module

            load_one = self._load_one or load_reward_function
            functions = []
            for name, spec, weight in zip(reward_part_names(self.specs), self.specs, self.weights):
                fn = load_one(spec, self.allowed_roots)
                functions.append(RewardFunction(name, spec, fn, reward_form(fn, spec), float(weight)))
            self._functions = functions
        return self._functions

    @property
    def batched(self) -> bool:
        """Whether any function is batched (then a request's completions are scored in one call)."""
        return any(f.form == "batch" for f in self.load())

    def __call__(self, completion: str, row: Row) -> RewardResult:
        outcome = self.batch([completion], [row])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def batch(self, completions: Sequence[str], rows: Sequence[Row]) -> list[Outcome]:
        functions = self.load()
        values = [f.values(completions, rows) for f in functions]
        return [combine(functions, [v[i] for v in values]) for i in range(len(completions))]

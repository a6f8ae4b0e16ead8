"""Generated tasks: solvable puzzles, references the checkers accept, short quickstart prompts, config."""
import pytest

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks import TASKS, DataError, build_task, generate_rows
from stabledrl.common.tasks.expression import evaluate, solve_countdown, uses_numbers
from stabledrl.common.tasks.sudoku import consistent, is_valid_solution, solutions
from stabledrl.common.tokenizer import DEFAULT_ALPHABET


def rows(name, n=300, seed=0, **kw):
    task = build_task(parse_task_config({"name": name, **kw}))
    return task, generate_rows(task, n, seed, max_prompt_tokens=512)


def test_every_task_is_registered():
    assert TASKS.names() == ["arithmetic", "countdown", "generic", "gsm8k", "math", "sudoku4"]


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "sudoku4"])
def test_reference_completions_get_full_reward(name):
    task, generated = rows(name)
    for row in generated:
        r = task.reward(task.reference_completion(row), row)
        assert r.parts == {"correctness": 1.0, "format": 1.0}, (row, task.reference_completion(row))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"digits": 1, "operators": ["+", "-", "*", "/"]},
        {"digits": 3, "terms": 3, "operators": ["*", "/", "-"], "allow_negative": True},
    ],
)
def test_arithmetic_answers_are_the_exact_value(kw):
    task, generated = rows("arithmetic", n=80, **kw)
    for row in generated:
        value, used = evaluate(row.prompt.rstrip("="))
        assert value == int(row.answer) and len(used) == kw.get("terms", 2)
        assert kw.get("allow_negative") or int(row.answer) >= 0


def test_quickstart_arithmetic_is_short_and_in_the_alphabet():
    task, generated = rows("arithmetic", n=2000)
    assert max(len(task.render_prompt(r)) for r in generated) <= 12
    assert max(len(task.reference_completion(r)) for r in generated) <= 4
    text = "".join(task.render_prompt(r) + task.reference_completion(r) for r in generated)
    assert set(text) <= set(DEFAULT_ALPHABET)


def test_countdown_puzzles_are_solvable_under_both_rules():
    _, generated = rows("countdown", n=200, min_numbers=3, max_numbers=5)
    for row in generated:
        numbers, target = row.meta["numbers"], row.meta["target"]
        value, used = evaluate(row.meta["solution"])
        assert value == target and 1 <= target <= 1000
        assert uses_numbers(used, numbers, exactly_once=True)  # hence also at most once
        assert 3 <= len(numbers) <= 5 and all(1 <= n <= 100 for n in numbers)


def test_countdown_solver_agrees_with_the_rule():
    assert solve_countdown([2, 3, 5, 7], 22) is not None
    assert solve_countdown([5, 3, 100], 8, exactly_once=True) is None  # 100 cannot be absorbed
    found = solve_countdown([5, 3, 100], 8, exactly_once=False)
    assert found is not None and evaluate(found)[0] == 8 and uses_numbers(evaluate(found)[1], [5, 3, 100], False)


@pytest.mark.parametrize("empty", [1, 6, 10, 12])
def test_sudoku_puzzles_are_unique_and_consistent(empty):
    _, generated = rows("sudoku4", n=60, empty_cells=empty)
    for row in generated:
        puzzle, solution = row.meta["puzzle"], row.meta["solution"]
        assert puzzle.count("0") == empty
        assert is_valid_solution(solution) and consistent(solution, puzzle)
        assert solutions(puzzle, limit=2) == [solution]


def test_sudoku_non_unique_generation_is_valid():
    _, generated = rows("sudoku4", n=40, empty_cells=12, unique=False, scoring="valid")
    assert all(
        is_valid_solution(r.meta["solution"]) and consistent(r.meta["solution"], r.meta["puzzle"]) for r in generated
    )
    assert any(len(solutions(r.meta["puzzle"], limit=2)) == 2 for r in generated)


def test_generation_is_deterministic_distinct_and_prefix_stable():
    task, a = rows("countdown", n=100, seed=3)
    _, b = rows("countdown", n=40, seed=3)
    _, c = rows("countdown", n=40, seed=4)
    assert a[:40] == b and a[:40] != c
    assert len({r.prompt_id for r in a}) == 100


def test_exhausted_problem_space_is_an_error():
    task = build_task(parse_task_config({"name": "arithmetic", "digits": 1, "operators": ["+"]}))
    assert len(generate_rows(task, 100, 0, max_prompt_tokens=12)) == 100  # all 10 x 10 problems
    with pytest.raises(DataError, match="distinct"):
        generate_rows(task, 101, 0, max_prompt_tokens=12)
    with pytest.raises(DataError, match="max_prompt_tokens"):
        generate_rows(task, 10, 0, max_prompt_tokens=3)


def test_templates_and_system_prompt():
    task = build_task(
        parse_task_config({"name": "arithmetic", "template": "Q: {prompt} A:", "system_prompt": "Be exact."})
    )
    _, generated = rows("arithmetic", n=1)
    row = generated[0]
    assert task.render_prompt(row) == f"Be exact.\n\nQ: {row.prompt} A:"
    assert task.messages(row) == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": f"Q: {row.prompt} A:"},
    ]
    braces = build_task(parse_task_config({"name": "countdown", "template": "{prompt} \\boxed{} {x}"}))
    assert braces.render_prompt(row) == f"{row.prompt} \\boxed{{}} {{x}}"


@pytest.mark.parametrize("data,field", [
    ({"name": "gsm8k"}, "task.source"),
    ({"name": "arithmetic", "template": "no slot"}, "task.template"),
    ({"name": "arithmetic", "reward": {"custom": "no_colon"}}, "task.reward.custom"),
    ({"name": "arithmetic", "reward": {"on_failure": "explode"}}, "task.reward.on_failure"),
    ({"name": "arithmetic", "held_out": 1.5}, "task.held_out"),
    ({"name": "arithmetic", "held_out": 5, "held_out_source": {"path": "x.jsonl"}}, "task.held_out: set held_out or"),
    ({"name": "countdown", "min_numbers": 5, "max_numbers": 3}, "task.min_numbers must be"),
    ({"name": "sudoku4", "unique": False}, "task.scoring 'cells'"),
    ({"name": "sudoku4", "digits": 2}, "task.digits"),
    ({"name": "nope"}, "task.name: 'nope' is not one of"),
])
def test_config_errors_name_the_field(data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_task_config(data)


def test_config_defaults():
    cfg = parse_task_config({"name": "countdown"})
    assert cfg.number_use == "exactly_once" and cfg.source.kind == "generated" and cfg.on_bad_row == "error"
    assert cfg.reward.resolved_isolation == "inline"
    assert (
        parse_task_config({"name": "countdown", "reward": {"custom": "m.py:f"}}).reward.resolved_isolation == "process"
    )

"""The job's log (common/job_log.py): the rooms log through the standard library's loggers, and an
entry point shows their lines as `stabledrl train` always has: INFO on stdout as written, one a
line; warnings on stderr; a study's run named in front of each of its lines."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

from stabledrl.common.job_log import labelled, log_shown, show_log

ROOT = Path(__file__).resolve().parents[3]
ROOMS = ("common", "rollout", "learner", "coordinator", "stabledrl")


def test_the_lines_go_to_stdout_as_written_and_warnings_to_stderr(capsys):
    driver = logging.getLogger("stabledrl.coordinator.driver")
    undo = show_log()
    try:
        driver.info("step 30: held-out pass@1 73.5% on 200 prompts")
        driver.debug("not shown")
        logging.getLogger("stabledrl.rollout.sampling.graphs").warning("cuda_graph=True on a cpu device")
        with labelled("[grpo/seed0] "):
            driver.info("step 1/2: reward 0.5")
        driver.info("after the run")
    finally:
        undo()
    out, err = capsys.readouterr()
    assert out == "step 30: held-out pass@1 73.5% on 200 prompts\n[grpo/seed0] step 1/2: reward 0.5\nafter the run\n"
    assert err == "cuda_graph=True on a cpu device\n"
    assert not logging.getLogger("stabledrl").handlers and logging.getLogger("stabledrl").propagate
    driver.info("shown nowhere once undone")
    assert capsys.readouterr() == ("", "")


def test_the_lines_reach_no_root_handler_twice(capsys):
    root, seen = logging.getLogger(), []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Seen()
    root.addHandler(handler)
    try:
        assert log_shown()  # the user's own logging: stabledrl.train leaves it alone
        undo = show_log()
        logging.getLogger("stabledrl.coordinator.driver").info("once")
        undo()
    finally:
        root.removeHandler(handler)
    assert capsys.readouterr().out == "once\n" and seen == []


def log_parameters(path: Path) -> list[str]:
    """Functions of ``path`` that take a log callable (a parameter named ``log``), as 'line name'."""
    return [f"{node.lineno} {node.name}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(a.arg == "log" for a in node.args.args + node.args.kwonlyargs)]


def test_no_function_takes_a_log_callable():
    found = [f"{path.relative_to(ROOT)}:{f}" for room in ROOMS for path in sorted((ROOT / room).rglob("*.py"))
             for f in log_parameters(path)]
    assert not found, "log callables threaded through calls:\n" + "\n".join(found)


def test_the_check_sees_a_log_parameter(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("class A:\n    def __init__(self, cfg, *, log=print):\n        pass\n")
    assert log_parameters(bad) == ["2 __init__"]

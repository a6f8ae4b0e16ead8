"""Bad input to `stabledrl train` that only reading it reveals (the data, the model directory):
one line on stderr naming the file, row or field and what to do, exit 2, no traceback, and no
actor started (the driver reads all of it before the first actor)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import stabledrl.cli.main as cli
from test_config_mistakes import JOB

GOOD = '{"prompt": "1+2=", "answer": "3"}\n'


def bad_data(tmp_path: Path, case: str) -> tuple[dict, str]:
    """(task.source, a fragment of the message) for each kind of bad data the probe tried."""
    f = tmp_path / "data.jsonl"
    if case == "missing file":
        return {"kind": "file", "path": str(tmp_path / "nope.jsonl")}, "nope.jsonl"
    if case == "empty jsonl":
        f.write_text("")
    elif case == "non-utf-8":
        f.write_bytes(GOOD.encode() + b'{"prompt": "\xff\xfe", "answer": "1"}\n')
    elif case == "broken line":
        f.write_text(GOOD + "{broken\n")
    elif case == "wrong columns":
        f.write_text('{"question": "1+2=", "solution": "3"}\n' * 3)
        return {"kind": "file", "path": str(f)}, "no column"
    elif case == "10 MB row":
        f.write_text(GOOD + json.dumps({"prompt": "1+" * (5 << 20) + "1=", "answer": "2"}) + "\n")
        return {"kind": "file", "path": str(f)}, "more than max_prompt_tokens"
    elif case == "fake parquet":
        f = tmp_path / "data.parquet"
        f.write_text("this is not parquet")
        return {"kind": "file", "path": str(f)}, "as parquet"
    elif case == "empty save_to_disk dir":
        (tmp_path / "ds").mkdir()
        return {"kind": "hf", "dataset": str(tmp_path / "ds")}, "save_to_disk"
    return {"kind": "file", "path": str(f)}, str(f)


CASES = ["missing file", "empty jsonl", "non-utf-8", "broken line", "wrong columns", "10 MB row", "fake parquet",
         "empty save_to_disk dir"]


@pytest.fixture
def no_cluster(monkeypatch):
    """The driver up to its first actor, without Ray: the cluster offers plenty, no actor may start."""
    import stabledrl.coordinator.driver as driver

    monkeypatch.setattr(cli, "_start_ray", lambda cfg: None)
    monkeypatch.setattr(driver.ray, "cluster_resources", lambda: {"CPU": 64.0})

    def refuse(*args, **kwargs):
        raise AssertionError("an actor was started")

    monkeypatch.setattr(driver, "start_actors", refuse)
    monkeypatch.setattr(driver, "start_control", refuse)


def run_job(tmp_path: Path, capsys, **sections) -> tuple[int, str]:
    data = {**JOB, "run": {"output_dir": str(tmp_path / "out"), "tensorboard": False}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    code = cli.main(["train", "--config", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES)
def test_bad_data_stops_the_job_with_one_line_and_no_traceback(tmp_path, capsys, no_cluster, case):
    source, fragment = bad_data(tmp_path, case)
    code, err = run_job(tmp_path, capsys, task={"source": source, "held_out": 0})
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("stabledrl: ") and err.count("\n") == 1, err
    assert fragment in err, err


def test_a_chat_template_that_jinjas_sandbox_stops_is_named(tmp_path, capsys, no_cluster):
    from tests.unit.common.test_checkpoint_loading import model_dir

    directory = model_dir(tmp_path / "model")
    tok = json.loads((directory / "tokenizer_config.json").read_text())
    tok["chat_template"] = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (directory / "tokenizer_config.json").write_text(json.dumps(tok))
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    code, err = run_job(tmp_path, capsys, model={"path": str(directory), "preset": None}, task={"chat_template": "on"})
    assert code == 2 and "Traceback" not in err, err
    assert "SecurityError" in err and "chat template" in err and str(directory) in err, err


def test_a_malicious_bin_in_model_path_is_refused_by_the_driver_before_any_actor(tmp_path, capsys, no_cluster):
    from malicious_pickles import write
    from tests.unit.common.test_checkpoint_loading import model_dir

    directory = model_dir(tmp_path / "model")
    for f in directory.glob("*.safetensors"):
        f.unlink()
    file = write(directory / "pytorch_model.bin", "zip_os_system", tmp_path / "PWNED")
    code, err = run_job(tmp_path, capsys, model={"path": str(directory), "preset": None})
    assert code == 2 and f"{file} would unpickle posix.system" in err, err
    assert not (tmp_path / "PWNED").exists()


def test_protocol_eval_refuses_a_malicious_model_before_ray_starts(tmp_path, capsys, monkeypatch):
    import ray

    from malicious_pickles import write
    from tests.unit.common.test_checkpoint_loading import eval_config, model_dir

    directory = model_dir(tmp_path / "model")
    for f in directory.glob("*.safetensors"):
        f.unlink()
    file = write(directory / "pytorch_model.bin", "zip_os_system", tmp_path / "PWNED")
    assert cli.main(["eval", "--config", str(eval_config(tmp_path)), "--protocol", "d1", "--model", str(directory),
                     "--out", str(tmp_path / "eval")]) == 2
    assert f"{file} would unpickle posix.system" in capsys.readouterr().err
    assert not ray.is_initialized() and not (tmp_path / "PWNED").exists()

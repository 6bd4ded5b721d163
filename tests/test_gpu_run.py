"""The GPU run's steps after the build (scripts/gpu_run.py: twins, replay, speed, overhead, the report)
on tiny shapes with the llama_cpp this suite runs on, so CI compiles once. The build from the carried
sdist is checked end to end by the CPU test in docs/gpu-run.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import gpu_run as gpu_run_script
import pytest
import tomllib
from test_cli import assert_one_line_error
from test_schedule import recorded  # noqa: F401  (a tiny pair's bench with every schedule)

from ead_cli import bench

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
STEPS = ["twins", "replay", "speed", "overhead"]


def gpu_run(*args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_run.py"), *args],
        capture_output=True,
        timeout=300,
        env={**os.environ, "OUT": str(out)},
    )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory, tiny_small: Path) -> Path:
    """What pack_gpu_run.sh carries: the pair's tokenizer alone."""
    out = tmp_path_factory.mktemp("bundle") / "tokenizer.gguf"
    command = [sys.executable, str(SCRIPTS / "write_twin.py"), "--tokenizer-only"]
    result = subprocess.run([*command, "--tokenizer-from", str(tiny_small), "--out", str(out)], timeout=60)
    assert result.returncode == 0
    return out


def test_the_steps_after_the_build_write_one_report(
    recorded: Path,  # noqa: F811
    tokenizer: Path,
    tmp_path: Path,
) -> None:
    schedules = recorded / bench.RESULTS_FILE
    _, records = bench.read_results(schedules)
    names = list(dict.fromkeys(record["strategy"] for record in records))
    assert names[0] == "large-only" and len(names) == 8
    common = [
        "--python", sys.executable, "--cpu", "--work", str(tmp_path / "work"), "--bundle", str(tmp_path),
        "--small", "qwen2-tiny", "--large", "qwen2-tiny", "--tokenizer", str(tokenizer),
        "--schedules", str(schedules), "--strategies", ",".join(names), "--threads", "1",
        "--overhead-tokens", "8", "--overhead-runs", "1",
    ]  # fmt: skip
    first = gpu_run(*common, "--step", "twins", out=tmp_path / "out1")
    assert first.returncode == 0, first.stderr
    twin = tmp_path / "work" / "twins" / "qwen2-tiny.gguf"
    assert bytes(gguf.GGUFReader(twin).fields["ead.twin"].parts[-1]) == b"qwen2-tiny"
    # a later call resumes: the twin is kept, the report has every step done so far
    second = gpu_run(
        *common, "--step", "replay", "--step", "speed", "--step", "overhead", out=tmp_path / "out"
    )
    assert second.returncode == 0, second.stderr
    report = json.loads((tmp_path / "out" / "gpu-run.json").read_text())
    assert report["kind"] == "gpu run" and report["cpu_test"] is True and report["tiny"] is False
    assert "CPU test" in report["note"] and "twins" in report["note"]
    assert isinstance(report["machine"]["gpus"], list) and report["machine"]["cpus"] >= 1
    assert report["bundle"] is None  # no MANIFEST.json: the tokenizer came from the test
    assert len(report["checkout"]) == 40  # this checkout's commit
    assert report["settings"]["strategies"] == names and report["settings"]["large"] == ["qwen2-tiny"]
    assert list(report["steps"]) == STEPS
    assert all(step["ok"] and step["seconds"] > 0 for step in report["steps"].values())

    twins = report["steps"]["twins"]["twins"]
    assert list(twins) == ["qwen2-tiny"] and twins["qwen2-tiny"]["bytes"] == twin.stat().st_size

    (pair,) = report["steps"]["replay"]["pairs"].values()
    assert pair["rc"] == 0 and "--n-gpu-layers" in pair["command"]
    replayed = pair["report"]
    assert replayed["models"]["large"]["twin"] == "qwen2-tiny" and replayed["threads"] == 1
    assert [row["strategy"] for row in replayed["strategies"]] == names
    assert replayed["strategies"][0]["wall_rel"] == 1.0
    for row in replayed["strategies"]:
        mine = [record for record in records if record["strategy"] == row["strategy"]]
        assert row["samples"] == 2 and row["generated"] == sum(record["generated"] for record in mine)
        assert row["wall_s"] > 0

    (priced,) = report["steps"]["speed"]["pairs"].values()
    assert [len(rates["tokens_per_s"]) for rates in priced["report"]["rates"]] == [8, 8]
    assert len(priced["report"]["checks"]) == 8  # checked against the replay of the same call set

    overhead = report["steps"]["overhead"]["models"]["qwen2-tiny"]["report"]
    assert overhead["tokens"] == 8 and overhead["runs"] == 1 and overhead["threads"] == 1
    assert overhead["ratio"] > 0 and overhead["model"] == "qwen2-tiny.gguf"


def test_bad_runs_are_one_line(tmp_path: Path) -> None:
    result = gpu_run("--python", sys.executable, "--step", "build", out=tmp_path)
    assert_one_line_error(result, 2, "--python uses an installed llama_cpp")
    result = gpu_run(
        "--step", "build", "--bundle", str(tmp_path / "none"), "--work", str(tmp_path), out=tmp_path
    )
    assert_one_line_error(result, 2, "llama_cpp_python-0.3.36.tar.gz is missing (the build step needs it)")
    assert not (tmp_path / "venv").exists()
    result = gpu_run("--step", "replay", "--schedules", str(tmp_path / "none.jsonl"), out=tmp_path)
    assert_one_line_error(result, 2, "none.jsonl is missing (the replay step needs it)")


def test_the_runs_venv_sees_the_packages_of_a_python_that_is_itself_a_venv(tmp_path: Path) -> None:
    """A device's python3 may be a venv: ``venv --system-site-packages`` over it reaches only the base
    interpreter's packages, so numpy went missing and ead-cli's requirements did not resolve. Here: a
    venv over this suite's Python, the run's venv over *its* python, as the build step makes it."""
    parent, venv = tmp_path / "parent", tmp_path / "venv"
    assert gpu_run_script.make_venv(sys.executable, parent, limit=120)["rc"] == 0
    made = gpu_run_script.make_venv(str(parent / "bin" / "python"), venv, limit=120)
    parent_site = gpu_run_script.site_dirs(str(parent / "bin" / "python"))["site"]
    assert made["rc"] == 0 and made["parent_venv_site"] == parent_site
    python = str(venv / "bin" / "python")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    probe = "import json, sys, numpy, llama_cpp, ead_cli; print(json.dumps([sys.prefix, ead_cli.__file__]))"
    imported = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert imported.returncode == 0, imported.stderr
    prefix, ead_file = json.loads(imported.stdout)
    assert prefix == str(venv) and not ead_file.startswith(str(tmp_path))  # the parent's, not a copy
    # ead-cli's requirements resolve from what the run's venv sees, with no index (pip: the parent's)
    with open(ROOT / "pyproject.toml", "rb") as handle:
        requirements = tomllib.load(handle)["project"]["dependencies"]
    command = [python, "-m", "pip", "install", "--dry-run", "--no-index", *requirements]
    resolved = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    assert "Would install" not in resolved.stdout and "numpy" in resolved.stdout

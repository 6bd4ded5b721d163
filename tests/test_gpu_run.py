"""The GPU run's steps after the build (scripts/gpu_run.py: twins, replay, speed, overhead, the report)
on tiny shapes with the llama_cpp this suite runs on, so CI compiles once. The build from the carried
sdist is checked end to end by the CPU test in docs/gpu-run.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import gguf
import gpu_run as gpu_run_script
import pytest
from test_cli import assert_one_line_error
from test_schedule import recorded  # noqa: F401  (a tiny pair's bench with every schedule)

from ead_cli.bench.results import RESULTS_FILE, read_results
from ead_cli.hardware import repack_choice

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
    schedules = recorded / RESULTS_FILE
    _, records = read_results(schedules)
    names = list(dict.fromkeys(record["strategy"] for record in records))
    assert names[0] == "large-only" and len(names) == 8
    common = [
        "--python", sys.executable, "--cpu", "--work", str(tmp_path / "work"), "--bundle", str(tmp_path),
        "--small", "qwen2-tiny", "--large", "qwen2-tiny", "--tokenizer", str(tokenizer),
        "--schedules", str(schedules), "--strategies", ",".join(names), "--threads", "1",
        "--overhead-tokens", "8", "--overhead-runs", "1", "--replays", "2",
    ]  # fmt: skip
    first = gpu_run(*common, "--step", "twins", out=tmp_path / "out1")
    assert first.returncode == 0, first.stderr
    twin = tmp_path / "work" / "twins" / "qwen2-tiny.gguf"
    assert bytes(gguf.GGUFReader(twin).fields["ead.twin"].parts[-1]) == b"qwen2-tiny"
    # a later call, killed from outside (as a device kills a command past its time) in its last step:
    # its report, written after every command, still has every figure before the kill
    later = ["--step", "replay", "--step", "speed", "--step", "overhead"]
    killed = kill_in_step("overhead", *common, *later, out=tmp_path / "out")
    assert list(killed["steps"]) == STEPS
    assert all(killed["steps"][step]["ok"] and "finished" not in killed["steps"][step] for step in STEPS[:3])
    assert killed["steps"]["replay"]["pairs"]["qwen2-tiny+qwen2-tiny"]["report"]["strategies"]
    assert killed["steps"]["speed"]["pairs"]["qwen2-tiny+qwen2-tiny"]["report"]["rates"]
    assert killed["steps"]["overhead"]["ok"] is False and killed["steps"]["overhead"]["finished"] is False
    # a call that resumes the killed step: the report has every step done so far
    second = gpu_run(*common, "--step", "overhead", out=tmp_path / "out")
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

    (repeated,) = report["steps"]["replay"]["repeats"]["qwen2-tiny+qwen2-tiny"]  # --replays 2
    assert repeated["rc"] == 0 and repeated["command"][-1].endswith("qwen2-tiny+qwen2-tiny-run2")
    assert [row["strategy"] for row in repeated["report"]["strategies"]] == names
    median = report["steps"]["replay"]["medians"]["qwen2-tiny+qwen2-tiny"]
    assert median["rc"] == 0 and median["command"][-2:] == [pair["command"][-1], repeated["command"][-1]]
    assert "median" in median["report"] and all(name in median["report"] for name in names)

    (priced,) = report["steps"]["speed"]["pairs"].values()
    assert [len(rates["tokens_per_s"]) for rates in priced["report"]["rates"]] == [8, 8]
    assert len(priced["report"]["checks"]) == 8  # checked against the replay of the same call set

    overhead = report["steps"]["overhead"]["models"]["qwen2-tiny"]["report"]
    assert overhead["tokens"] == 8 and overhead["runs"] == 1 and overhead["threads"] == 1
    assert overhead["ratio"] > 0 and overhead["model"] == "qwen2-tiny.gguf"
    assert overhead["gate_pair_needed_ratio"] > 0  # the gate on two contexts, against the bare pair loop

    # every command that loads a model got the repack decision made here, by ead's own rule
    choice = repack_choice()
    decided = {"enabled": choice.enabled, "word": choice.word, "reason": choice.reason}
    decided["automatic"] = choice.automatic
    loads = [*report["steps"]["replay"]["pairs"].values(), *report["steps"]["speed"]["pairs"].values()]
    loads += [repeated, *report["steps"]["overhead"]["models"].values()]
    assert all(report["steps"][step]["repack"] == decided for step in STEPS[1:])
    assert [load["env"] for load in loads] == [{"EAD_REPACK": choice.word}] * 4
    assert overhead["repack"] == choice.word  # what bench_overhead's runner loaded with


def kill_in_step(step: str, *args: str, out: Path) -> dict:
    """Run gpu_run.py, SIGKILL it and the command it runs once its report shows ``step`` under way (no
    chance to write anything more); the report it left."""
    report_file = out / "gpu-run.json"
    command = [sys.executable, str(SCRIPTS / "gpu_run.py"), *args]
    with subprocess.Popen(command, env={**os.environ, "OUT": str(out)}, stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            report = json.loads(report_file.read_text()) if report_file.exists() else {"steps": {}}
            if report["steps"].get(step, {}).get("finished") is False:
                break
            time.sleep(0.02)
        assert process.poll() is None, f"gpu_run.py ended before {step}: {process.stderr.read()}"
        # stopped first, it starts no command and reaps none while its commands are found and killed (one
        # that ended meanwhile stays a zombie until then, so its group is still there to kill)
        process.send_signal(signal.SIGSTOP)
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for child in children:  # each command runs in its own session: its process group
            os.killpg(int(child), signal.SIGKILL)
        process.kill()
    return json.loads(report_file.read_text())


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
    # a call after the build on a machine that was given back meanwhile (a bare one): no venv there
    result = gpu_run("--step", "speed", "--work", str(tmp_path / "bare"), out=tmp_path)
    assert_one_line_error(result, 2, "has no venv (the speed step needs the build step's)")
    assert not (tmp_path / "bare").exists()


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
    requirements = [r for r in metadata.requires("ead-cli") or [] if "extra ==" not in r]
    command = [python, "-m", "pip", "install", "--dry-run", "--no-index", *requirements]
    resolved = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    assert "Would install" not in resolved.stdout and "numpy" in resolved.stdout


def test_the_limit_bounds_the_whole_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--limit`` is the call's, not each command's (a device kills the whole call at ten minutes): a
    command under way at the call's deadline is killed there, one after it does not start, and the
    report says so (a bounded-time check: a generous margin)."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    args = gpu_run_script.parse(
        ["--python", sys.executable, "--work", str(tmp_path), "--limit", "2", "--step", "speed"]
    )
    call = gpu_run_script.Run(args)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    began = time.monotonic()
    done = call.step("replay", lambda: {"ok": False, "commands": [call.run(sleeper) for _ in range(2)]})
    assert time.monotonic() - began < 2 + 30 and call.left() <= 0
    killed, never = done["commands"]
    assert killed["rc"] == 124 and "timed out after" in killed["stderr"] and killed["seconds"] < 2 + 30
    assert never["rc"] == 124 and never["stderr"] == "not started: no time left" and never["seconds"] == 0
    report = json.loads((tmp_path / "out" / "gpu-run.json").read_text())
    assert report["steps"]["replay"]["commands"] == [killed, never]
    assert report["settings"]["limit_s"] == 2
    result = gpu_run(
        "--python", sys.executable, "--work", str(tmp_path), "--limit", "0", "--step", "speed", out=tmp_path
    )
    assert_one_line_error(result, 2, "--limit must be at least 1 second")
    result = gpu_run("--python", sys.executable, "--replays", "0", "--step", "replay", out=tmp_path)
    assert_one_line_error(result, 2, "--replays must be at least 1")


def test_a_printed_report_is_read_from_the_whole_output_and_a_bad_one_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_overhead.py's JSON outgrows the output tail the report keeps (384 tokens x 11 runs did on
    the H200): it is parsed from the whole output; output that is not one JSON object is recorded as
    such, and the call goes on."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    args = gpu_run_script.parse(["--python", sys.executable, "--work", str(tmp_path), "--step", "overhead"])
    call = gpu_run_script.Run(args)
    rates = list(range(2000))
    big = [sys.executable, "-c", f"import json; print(json.dumps({{'rates': {rates}}}))"]
    twice = [sys.executable, "-c", "print('{}'); print('{}')"]
    done = call.step(
        "overhead",
        lambda: {
            "ok": True,
            "commands": [call.run(c, figures=gpu_run_script.printed_json) for c in (big, twice)],
        },
    )
    read, bad = done["commands"]
    assert read["report"] == {"rates": rates} and len(read["stdout"]) == gpu_run_script.TAIL
    assert bad["report"] == {
        "error": "its output is not one JSON object: Extra data: line 2 column 1 (char 3)"
    }
    report = json.loads((tmp_path / "out" / "gpu-run.json").read_text())
    assert report["steps"]["overhead"]["commands"][0]["report"]["rates"] == rates


def test_a_prebuilt_wheel_that_does_not_install_is_reported_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pack_gpu_run.sh --wheel carries a llama-cpp-python built elsewhere (no compile on the device); one
    that does not install, load or offload there is reported as not ok, which leaves the build step to
    compile the carried sources (that compile is the CPU test's, docs/gpu-run.md)."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    bundle = tmp_path / "bundle"
    common = ["--python", sys.executable, "--work", str(tmp_path), "--bundle", str(bundle), "--step", "speed"]
    assert gpu_run_script.Run(gpu_run_script.parse(common)).install_prebuilt() is None  # none carried
    (bundle / "prebuilt").mkdir(parents=True)
    (bundle / "prebuilt" / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"not a zip")
    (bundle / "wheels").mkdir()
    tried = gpu_run_script.Run(gpu_run_script.parse(common)).install_prebuilt()
    assert tried is not None and tried["ok"] is False and tried["install"]["rc"] != 0
    assert tried["wheel"] == "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    assert tried["install_ead_cli"] is None and tried["repack"] is None
    assert tried["why_not"] == "the wheel did not install, load or offload: compiled instead"


def test_the_loader_finds_cuda_in_the_nvidia_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel built elsewhere links libcublas.so.13; a device's PyTorch keeps it in nvidia-* wheels,
    where the loader does not look: those folders (and only those with CUDA's libraries) are named, and
    put first on the loader's path of every command the run starts."""
    site_packages = tmp_path / "site-packages"
    for folder, library in [("cu13", "libcublas.so.13"), ("cudnn", "libcudnn.so.9"), ("runtime", "")]:
        (site_packages / "nvidia" / folder / "lib").mkdir(parents=True)
        if library:
            (site_packages / "nvidia" / folder / "lib" / library).write_bytes(b"")
    monkeypatch.setattr(gpu_run_script.site, "getsitepackages", lambda: [str(site_packages)])
    monkeypatch.setattr(gpu_run_script.site, "getusersitepackages", lambda: str(tmp_path / "none"))
    found = gpu_run_script.cuda_library_dirs()
    assert found[0] == str(site_packages / "nvidia" / "cu13" / "lib")
    toolkit = Path("/usr/local/cuda/lib64")  # named where this machine has a toolkit with its runtime
    assert found[1:] == ([str(toolkit)] if list(toolkit.glob("libcudart.so*")) else [])
    # the run's commands get them first on the loader's path; this process's environment is left alone
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/before")
    common = ["--python", sys.executable, "--work", str(tmp_path), "--step", "speed"]
    call = gpu_run_script.Run(gpu_run_script.parse(common))
    shown = call.run([sys.executable, "-c", "import os; print(os.environ['LD_LIBRARY_PATH'])"])
    assert shown["rc"] == 0 and shown["stdout"].split() == [os.pathsep.join([*found, "/before"])]
    assert call.about["cuda_library_dirs"] == found and os.environ["LD_LIBRARY_PATH"] == "/before"
    cpu = gpu_run_script.Run(gpu_run_script.parse([*common, "--cpu"]))
    assert cpu.libraries == [] and "env" not in cpu.run([sys.executable, "-c", "pass"])

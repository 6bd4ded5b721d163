"""ead-cli on the oldest releases its pyproject.toml declares it works with, on the oldest Python it declares
where one is installed: a lower bound that lies (typer 0.28 beside ``typer>=0.12``, kept by pip where a
Python had it already) had every ``ead`` command end in a traceback on a user's machine; here a newer API
used fails the suite instead. The suite's own Python is newer (3.11 here), where a name new in its standard
library passes.

The venv installs from the package index as set-up does (with pip's cache warm, about 20 s here), and
borrows this suite's llama-cpp-python build (pinned, not bounded) rather than compiling it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import llama_cpp
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from serve_process import Server
from test_cli import pair_args
from test_registry import _Hub, models_dir  # noqa: F401  (every cache in tmp_path)
from test_scripts import installed_python
from test_serve import http_server

from ead_cli.registry import tomllib  # tomli before Python 3.11

ROOT = Path(__file__).resolve().parent.parent
JSONL = ["--max-tokens", "12", "--format", "jsonl", "hi"]  # an answer's tokens, one JSON line each
EXTRAS = ("serve",)  # plot's matplotlib and test's tools run in no test here


def project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def python_version(python: Path | str) -> str:
    """The full version of ``python`` ("3.10.13")."""
    probe = "import platform; print(platform.python_version())"
    return subprocess.check_output([python, "-c", probe], text=True, timeout=60).strip()


def declared_requirements(venv: Path) -> list[Requirement]:
    """pyproject.toml's run-time requirements and those of ``EXTRAS`` that apply to the venv's Python
    (tomli before 3.11)."""
    table = project()
    lines = table["dependencies"] + [
        line for extra in EXTRAS for line in table["optional-dependencies"][extra]
    ]
    version = python_version(venv / "bin" / "python")
    python = {"python_full_version": version, "python_version": ".".join(version.split(".")[:2])}
    requirements = [Requirement(line) for line in lines]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(python)]


def lowest(specifier: SpecifierSet) -> Version:
    """The oldest version ``specifier`` allows: its ``>=`` or ``==`` bound (each of ead's has one)."""
    (bound,) = [spec.version for spec in specifier if spec.operator in (">=", "==")]
    return Version(bound)


OLDEST_PYTHON = str(lowest(SpecifierSet(project()["requires-python"])))  # "3.10"


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


@pytest.fixture(scope="module")
def lowest_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with ead-cli and every declared requirement at its lower bound, on the oldest Python declared
    where one is installed (else this suite's); its llama-cpp-python is this suite's (the package and its
    metadata, reached through a ``.pth``: pip sees the pin met; its library is loaded by ctypes, so any
    Python 3 loads it)."""
    work = tmp_path_factory.mktemp("lowest")
    venv = work / "venv"
    base = installed_python(OLDEST_PYTHON) or sys.executable
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    borrowed = work / "borrowed"
    borrowed.mkdir()
    package = Path(llama_cpp.__file__).parent
    (borrowed / "llama_cpp").symlink_to(package)
    (dist_info,) = package.parent.glob("llama_cpp_python-*.dist-info")
    (borrowed / dist_info.name).symlink_to(dist_info)
    (site / "borrowed_llama_cpp.pth").write_text(f"{borrowed}\n")
    constraints = work / "lowest.txt"
    constraints.write_text("".join(f"{r.name}=={lowest(r.specifier)}\n" for r in declared_requirements(venv)))
    install = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--constraint",
        str(constraints),
        "-e",
        f"{ROOT}[{','.join(EXTRAS)}]",
    ]
    result = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return venv


def test_the_venv_holds_each_declared_lower_bound(lowest_venv: Path) -> None:
    listed = subprocess.check_output(
        [lowest_venv / "bin" / "python", "-m", "pip", "list", "--format", "json"], text=True
    )
    installed = {canonical(d["name"]): Version(d["version"]) for d in json.loads(listed)}
    wanted = {canonical(r.name): lowest(r.specifier) for r in declared_requirements(lowest_venv)}
    assert {name: installed.get(name) for name in wanted} == wanted


def test_the_venv_runs_the_oldest_python_declared(lowest_venv: Path) -> None:
    """requires-python's floor, where one is installed: every module of ead_cli imports on it (a name from
    a newer standard library fails here; the tests below run the commands)."""
    oldest = installed_python(OLDEST_PYTHON)
    if oldest is None:
        pytest.skip(f"no Python {OLDEST_PYTHON} here (on PATH or pyenv's): the venv runs this suite's")
    python = lowest_venv / "bin" / "python"
    assert python_version(python) == python_version(oldest)
    walk = (
        "import importlib, pkgutil, ead_cli\n"
        "for module in pkgutil.walk_packages(ead_cli.__path__, 'ead_cli.'):\n"
        "    if not module.name.endswith('__main__'):\n"
        "        importlib.import_module(module.name)\n"
    )
    imported = subprocess.run([python, "-c", walk], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr


def tokens_written(ead: Path, command: list[str], env: dict[str, str]) -> list[tuple[int, object]]:
    """Each token of ``command``'s JSON lines with what wrote it (``by``: a model, or an exit depth)."""
    result = subprocess.run([ead, *command], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert objects[-1]["type"] == "summary"
    return [(o["token"], o.get("model", o.get("depth"))) for o in objects[:-1]]


def test_ead_runs_on_the_declared_lower_bounds(lowest_venv: Path, tiny_pair: tuple[Path, Path]) -> None:
    """``ead --help``, a tiny pair's answer and one of ``ead depth`` (gguf reads the head's weights): the
    same tokens, written by the same models or at the same depths, as on this suite's own releases."""
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"}
    old, new = lowest_venv / "bin" / "ead", Path(sys.executable).with_name("ead")
    shown = subprocess.run([old, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "generate" in shown.stdout and "serve" in shown.stdout
    pair = ["generate", *pair_args(tiny_pair), "--tau", "3", *JSONL]
    depth = ["depth", "generate", str(tiny_pair[0]), "--fixed-depth", "1", "--threads", "1", *JSONL]
    for command in (pair, depth):
        written = tokens_written(old, command, env)
        assert len(written) == 12 and written == tokens_written(new, command, env)


def test_ead_serve_runs_on_the_declared_lower_bounds(
    lowest_venv: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """``ead serve`` on the serve extra's lower bounds (fastapi, starlette, uvicorn, h11, sse-starlette,
    pydantic): an answer whole and streamed holds generate's tokens, and a bad request is a 400 with
    OpenAI's error object."""
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"}
    new = Path(sys.executable).with_name("ead")
    expected = tokens_written(new, ["generate", *pair_args(tiny_pair), "--tau", "3", *JSONL], env)
    body = {
        "model": "ead",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    old = str(lowest_venv / "bin" / "ead")
    with Server([*pair_args(tiny_pair), "--tau", "3"], tmp_path / "server.log", ead=old) as server:
        url = f"{server.base_url}/chat/completions"
        whole = httpx.post(url, json=body, timeout=60).json()
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
            frames = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        bad = httpx.post(url, json={**body, "messages": "hi"}, timeout=60)
        # max_tokens' own validators (one each for chats and for a text completion's echo)
        completions = f"{server.base_url}/completions"
        alone = {"prompt": "def f(", "max_tokens": 0, "echo": True, "logprobs": 1}
        echoed = httpx.post(completions, json=alone, timeout=60)
        unechoed = httpx.post(completions, json={**alone, "echo": False}, timeout=60)
        assert server.stop() == 0
    assert "Traceback" not in server.log()
    assert [(token["token"], token["model"]) for token in whole["ead"]["tokens"]] == expected
    assert [(frame["ead"]["token"], frame["ead"]["model"]) for frame in frames[:-1]] == expected
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert echoed.status_code == 200 and echoed.json()["choices"][0]["text"] == "def f("
    assert unechoed.status_code == 400 and unechoed.json()["error"]["param"] == "max_tokens"


def test_a_hub_download_runs_on_the_declared_lower_bounds(
    lowest_venv: Path,
    models_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``ead models pull`` on huggingface_hub's lower bound, from a hub on loopback (the routes
    snapshot_download reads): the file lands whole, and a download that breaks off is said as one."""
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        '[models.tiny]\ndescription = "a test model"\nparams = 1e6\nrepo = "ead-test/tiny-GGUF"\n'
        'pattern = "tiny*.gguf"\n'
    )
    pull = [lowest_venv / "bin" / "ead", "models", "pull", "tiny", "--catalog", str(catalog)]
    said = []
    for hub in (type("BreaksOff", (_Hub,), {"sent": 1000}), _Hub):  # nothing cached by the first
        with http_server(hub) as url:
            env = {**os.environ, "HF_ENDPOINT": url}
            said.append(subprocess.run(pull, capture_output=True, text=True, env=env, timeout=120))
    broken, pulled = said
    assert pulled.returncode == 0, pulled.stderr
    assert Path(pulled.stdout.strip()).read_bytes() == _Hub.data
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert "download of model 'tiny' from the hub at " in broken.stderr and " broke off (" in broken.stderr

"""The README's set-up scripts as a new user meets them, run for real: scripts/setup.sh's refusals and its
recovery from a half-made .venv (in a stand-in tree, so no test rebuilds the real one), and where
build_llama_server.sh finds its cache, what install_chromium.sh takes for an installed Chromium."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, timeout=600, env={**os.environ, **env})


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_setup_refuses_an_old_or_missing_python_in_one_line(tmp_path: Path) -> None:
    """The check runs before .venv is touched. The stand-in answers as a Python 3.9 would; bash had
    put its own 'No such file or directory' inside the message for a missing one."""
    missing = tmp_path / "no-such-python"
    result = run([str(SCRIPTS / "setup.sh")], PYTHON=str(missing))
    assert_one_line_error(result, 1, f"{missing} does not run here", "set PYTHON")
    answer = '[ "$1" = --version ] && echo Python 3.9.18 || echo 3.9'
    old = executable(tmp_path / "python3.9", f"#!/bin/sh\n{answer}\nexit 1\n")
    result = run([str(SCRIPTS / "setup.sh")], PYTHON=str(old))
    assert_one_line_error(result, 1, "needs Python 3.10 or newer", f"{old} is Python 3.9", "set PYTHON")


def stand_in_tree(root: Path) -> Path:
    """setup.sh beside a package of no dependencies whose smoke module only says it ran."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPTS / "setup.sh", root / "scripts" / "setup.sh")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "ead-cli-stand-in"\nversion = "0"\n'
        '[tool.setuptools]\npackages = ["ead_cli"]\n'
        '[project.scripts]\nead = "ead_cli:main"\n'
    )
    (root / "ead_cli").mkdir()
    (root / "ead_cli" / "__init__.py").write_text("def main() -> None:\n    pass\n")
    (root / "ead_cli" / "smoke.py").write_text("print('smoke stand-in ran')\n")
    return root / "scripts" / "setup.sh"


def test_setup_remakes_a_venv_left_without_pip(tmp_path: Path) -> None:
    """What `python3 -m venv` leaves where ensurepip is missing (Debian without python3-venv), and what a
    stopped pip upgrade leaves: a python without pip. Running set-up again must mend it, not fail forever
    with 'No module named pip'. Here on a PATH whose sha256sum is missing, as on macOS: set-up had
    stopped at its first line of work."""
    setup = stand_in_tree(tmp_path / "tree")
    venv = tmp_path / "tree" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "sha256sum", "#!/bin/sh\necho 'sha256sum: command not found' >&2\nexit 127\n")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = run([str(setup)], PYTHON=sys.executable, PATH=path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"smoke stand-in ran" in result.stdout  # installed, then the smoke module ran
    stamp = (venv / ".ead-installed").read_text().strip()
    assert stamp == hashlib.sha256((tmp_path / "tree" / "pyproject.toml").read_bytes()).hexdigest()


def test_setup_remakes_a_venv_whose_python_is_gone(tmp_path: Path) -> None:
    """A .venv whose python link dangles (the Python that made it uninstalled or upgraded away, or a
    .venv copied from another machine) still has its ead script and stamp: set-up had taken it as
    installed and stopped at '.venv/bin/python: No such file or directory'. In a folder with a space."""
    setup = stand_in_tree(tmp_path / "a tree")
    assert run([str(setup)], PYTHON=sys.executable).returncode == 0
    python = tmp_path / "a tree" / ".venv" / "bin" / "python"
    python.unlink()
    python.symlink_to(tmp_path / "uninstalled-python")
    result = run([str(setup)], PYTHON=sys.executable)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"smoke stand-in ran" in result.stdout
    assert subprocess.run([python, "-c", ""], timeout=60).returncode == 0


def installed_python(version: str) -> str | None:
    """A Python ``version`` ("3.10") that runs here, on PATH or pyenv's; None where there is none."""
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for found in [shutil.which(f"python{version}"), *map(str, pyenv)]:
        if found and subprocess.run([found, "-c", ""], capture_output=True, timeout=60).returncode == 0:
            return found
    return None


def older_python() -> str | None:
    """A Python older than ead-cli's 3.10, to make a .venv of another project with."""
    return installed_python("3.9") or installed_python("3.8")


def test_setup_remakes_a_venv_of_an_older_python(tmp_path: Path) -> None:
    """A .venv some other tool made with Python 3.9 has a working pip, so set-up had installed into it and
    stopped at pip's 'requires a different Python', with advice about the package index. It is made
    anew with PYTHON, which set-up has checked."""
    old = older_python()
    if old is None:
        pytest.skip("no Python older than 3.10 here")
    setup = stand_in_tree(tmp_path / "tree")
    pyproject = tmp_path / "tree" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('version = "0"\n', 'version = "0"\nrequires-python = ">=3.10"\n')
    )
    venv = tmp_path / "tree" / ".venv"
    subprocess.run([old, "-m", "venv", str(venv)], check=True, timeout=300)
    result = run([str(setup)], PYTHON=sys.executable)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    version = subprocess.run(
        [venv / "bin" / "python", "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert version.strip() == str(sys.version_info[:2])


def test_setup_ends_a_failed_install_with_what_to_do(tmp_path: Path) -> None:
    """A package pip cannot get (offline, the index out of reach; here a dependency on a file that is not
    there, so nothing asks an index): pip's lines say what is missing, and set-up's last line had been
    nothing at all. It now says what to do, exits 1 and leaves no stamp, so the next run installs."""
    setup = stand_in_tree(tmp_path / "tree")
    pyproject = tmp_path / "tree" / "pyproject.toml"
    missing = tmp_path / "missing-package"
    pyproject.write_text(
        pyproject.read_text().replace(
            'version = "0"\n', f'version = "0"\ndependencies = ["gone @ file://{missing}"]\n'
        )
    )
    result = run([str(setup)], PYTHON=sys.executable)
    last = result.stderr.decode().strip().splitlines()[-1]
    assert (result.returncode, result.stdout) == (1, b""), result.stderr.decode()[-2000:]
    assert last.startswith("error: pip could not install ead-cli into .venv"), last
    assert "run ./scripts/setup.sh again" in last
    assert not (tmp_path / "tree" / ".venv" / ".ead-installed").exists()


def test_setup_builds_again_for_cmake_args_when_it_remakes_the_venv(tmp_path: Path) -> None:
    """CMAKE_ARGS said once is remembered in .venv; a .venv made anew (its python gone) forgets it, so the
    same CMAKE_ARGS must build again: set-up had decided before remaking the .venv, skipped the build and
    let pip take llama-cpp-python from its wheel cache (a CPU wheel for a GPU set-up). llama-cpp-python is
    a stand-in wheel here, so 'building' takes a second."""
    setup = stand_in_tree(tmp_path / "tree")
    pyproject = tmp_path / "tree" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "# pins llama-cpp-python==0.0.1\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    dist = "llama_cpp_python-0.0.1"
    with zipfile.ZipFile(wheels / f"{dist}-py3-none-any.whl", "w") as wheel:
        metadata = "Metadata-Version: 2.1\nName: llama-cpp-python\nVersion: 0.0.1\n"
        wheel.writestr(f"{dist}.dist-info/METADATA", metadata)
        tags = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        wheel.writestr(f"{dist}.dist-info/WHEEL", tags)
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    env = {"PYTHON": sys.executable, "PIP_FIND_LINKS": str(wheels), "CMAKE_ARGS": "-DGGML_CUDA=on"}
    for remade in (False, True):
        if remade:
            python = tmp_path / "tree" / ".venv" / "bin" / "python"
            python.unlink()
            python.symlink_to(tmp_path / "uninstalled-python")
        result = run([str(setup)], **env)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        assert b"building llama-cpp-python==0.0.1 with CMAKE_ARGS=-DGGML_CUDA=on" in result.stderr
        assert (tmp_path / "tree" / ".venv" / ".ead-cmake-args").read_text() == "-DGGML_CUDA=on\n"
    assert b"building" not in run([str(setup)], **env).stderr  # the same CMAKE_ARGS again: nothing to do
    (wheels / f"{dist}-py3-none-any.whl").unlink()  # a build that fails: its own advice, not the offline one
    result = run([str(setup)], **{**env, "CMAKE_ARGS": "-DGGML_VULKAN=on"})
    last = result.stderr.decode().strip().splitlines()[-1]
    assert (result.returncode, result.stdout) == (1, b""), result.stderr.decode()[-2000:]
    assert "the build with CMAKE_ARGS=-DGGML_VULKAN=on failed: change CMAKE_ARGS" in last
    assert (tmp_path / "tree" / ".venv" / ".ead-cmake-args").read_text() == "-DGGML_CUDA=on\n"


@pytest.mark.parametrize("script", ["setup.sh", "demo.sh", "test.sh", "build_llama_server.sh"])
def test_scripts_run_when_started_with_sh(tmp_path: Path, script: str) -> None:
    """`sh scripts/demo.sh` (dash, not bash, where sh is Debian's) had stopped at 'set: Illegal option
    -o pipefail'. Each script starts again under bash and then refuses a bad setting in its own words:
    a PYTHON that does not run (setup.sh, with which demo.sh and test.sh begin), a missing sdist in an
    empty cache (build_llama_server.sh, so nothing builds)."""
    missing = tmp_path / "missing"
    env = {"PYTHON": str(missing), "EAD_CACHE": str(tmp_path / "cache"), "EAD_LLAMA_SDIST": str(missing)}
    result = run(["sh", str(SCRIPTS / script)], **env)
    if script == "build_llama_server.sh":
        assert (result.returncode, result.stdout) == (1, b"")
        assert result.stderr.decode().splitlines() == [
            f"[build_llama_server] error: EAD_LLAMA_SDIST={missing} does not exist"
        ]
    else:
        assert_one_line_error(result, 1, f"{missing} does not run here")


def test_build_llama_server_finds_its_cache_with_home_unset() -> None:
    """As ead does (Path.home() reads the passwd entry): the script had stopped at 'HOME: unbound
    variable', so test.sh failed before any test. Only where the binary is built, so nothing builds."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    built = sorted((home / ".cache" / "ead-cli" / "llama-server").glob("*/llama-server"))
    if not built:
        pytest.skip("no llama-server built in the passwd home's cache")
    env = {k: v for k, v in os.environ.items() if k not in {"HOME", "EAD_CACHE", "XDG_CACHE_HOME"}}
    result = subprocess.run(
        [str(SCRIPTS / "build_llama_server.sh")], capture_output=True, text=True, timeout=60, env=env
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert Path(result.stdout.strip()) in built


@pytest.mark.skipif(
    shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="without cmake or a C++ compiler the script stops before the download",
)
def test_build_llama_server_says_what_to_do_without_the_sdist(tmp_path: Path) -> None:
    """Offline (here: no index and an empty folder of links, so pip cannot find the sdist and nothing
    builds), pip's 'No matching distribution' had been the last line and test.sh stopped there; the
    script's own line says the index or EAD_LLAMA_SDIST is needed."""
    (tmp_path / "links").mkdir()
    links = str(tmp_path / "links")
    result = run(
        [str(SCRIPTS / "build_llama_server.sh")],
        EAD_CACHE=str(tmp_path / "cache"),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=links,
    )
    assert (result.returncode, result.stdout) == (1, b""), result.stderr.decode()
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("[build_llama_server] error: pip could not download llama-cpp-python==0.3.36")
    assert "EAD_LLAMA_SDIST" in last
    assert not (tmp_path / "cache" / "llama-server" / "0.3.36" / "llama-server").exists()


def test_install_chromium_takes_chromium_browser_as_installed(tmp_path: Path) -> None:
    """Ubuntu's name, which the page test accepts: the script had asked apt-get for Debian's chromium on
    every test run (as root; elsewhere it said the page test would be skipped, which it was not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "chromium-browser", "#!/bin/sh\n")
    executable(bin_dir / "apt-get", f"#!/bin/sh\ntouch {tmp_path / 'apt-get-ran'}\nexit 1\n")
    (bin_dir / "id").symlink_to(shutil.which("id"))
    bash = shutil.which("bash")
    result = run([bash, str(SCRIPTS / "install_chromium.sh")], PATH=str(bin_dir))
    assert (result.returncode, result.stderr) == (0, b"")
    assert not (tmp_path / "apt-get-ran").exists()


def test_install_agents_says_in_one_line_when_it_cannot(tmp_path: Path) -> None:
    """Without npm, or with an npm that fails (no registry in reach), one note, exit 0 (the agent tests
    skip), and nothing marked installed: the next run tries again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bash = shutil.which("bash")
    for tool in ("mkdir", "touch"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    cache = tmp_path / "cache"
    without = run([bash, str(SCRIPTS / "install_agents.sh")], PATH=str(bin_dir), EAD_CACHE=str(cache))
    assert (without.returncode, without.stdout) == (0, b"")
    assert without.stderr.decode().splitlines() == [
        "note: no npm: the agent tests of ead serve (Claude Code, Codex) will be skipped"
    ]
    executable(bin_dir / "npm", "#!/bin/sh\necho 'npm error network' >&2\nexit 1\n")
    failed = run([bash, str(SCRIPTS / "install_agents.sh")], PATH=str(bin_dir), EAD_CACHE=str(cache))
    assert (failed.returncode, failed.stdout) == (0, b"")
    assert failed.stderr.decode().splitlines()[-1] == (
        "note: npm could not install Claude Code and Codex: the agent tests of ead serve will be skipped"
    )
    assert [path.name for path in (cache / "agents").iterdir()] == []

"""Habits users bring, through real subprocesses: ``ead --version``, shell completion as Typer offers it,
and ``python -m ead_cli`` behaving like ``ead``."""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import subprocess
import sys
from pathlib import Path

from test_cli import EAD, assert_one_line_error, ead

PYTHON_M = [sys.executable, "-m", "ead_cli"]


def python_m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON_M, *args], capture_output=True, timeout=120)


def test_version_comes_from_the_package_metadata() -> None:
    expected = f"ead {importlib.metadata.version('ead-cli')}\n".encode()
    for result in (ead("--version"), python_m("--version")):
        assert (result.returncode, result.stdout, result.stderr) == (0, expected, b"")


def test_python_m_is_the_same_command() -> None:
    for args in (["--help"], ["models", "--help"], ["generate", "--help"]):
        assert python_m(*args).stdout == ead(*args).stdout
    for args in (["generate", "--tau", "nan", "x"], ["no-such-command"]):
        via_module, via_script = python_m(*args), ead(*args)
        assert via_module.returncode == via_script.returncode == 2
        assert assert_one_line_error(via_module, 2) == assert_one_line_error(via_script, 2)


def in_bash(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``ead ARGS`` started by a real bash, as a user's terminal would: Typer detects the shell from the
    parent process. HOME is tmp_path, so the install writes there. (Not the last command of the -c
    string, so bash does not exec it in its own place.)"""
    command = " ".join(shlex.quote(word) for word in (EAD, *args))
    return subprocess.run(
        ["bash", "-c", f"{command}; exit $?"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=120,
    )


def test_show_completion_prints_the_bash_script(tmp_path: Path) -> None:
    result = in_bash(tmp_path, "--show-completion")
    assert result.returncode == 0, result.stderr
    assert "_EAD_COMPLETE=complete_bash" in result.stdout and "complete -o default -F" in result.stdout
    assert not (tmp_path / ".bashrc").exists()


def test_install_completion_writes_the_script_and_it_completes(tmp_path: Path) -> None:
    result = in_bash(tmp_path, "--install-completion")
    assert result.returncode == 0, result.stderr
    script = tmp_path / ".bash_completions" / "ead.sh"
    assert f"bash completion installed in {script}" in result.stdout
    assert "_EAD_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    # What bash runs on <TAB>: the program with the completion variables set.
    for words, expected in (
        ("ead gen", "generate"),
        ("ead models r", "rm"),
        ("ead generate --pol", "--policy"),
    ):
        completed = subprocess.run(
            [EAD],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "_EAD_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - 1),
            },
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr
        assert expected in completed.stdout.split(), (words, completed.stdout)

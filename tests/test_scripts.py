"""The README's set-up scripts as a new user meets them, run for real: scripts/setup.sh's refusals."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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

"""Running a generated program against its task's tests.

Sandbox. The program ``code + test + check(entry_point) + print(<random sentinel>)`` runs as
``python -I`` in a fresh temporary directory that holds only ``program.py`` (its output goes to unnamed
files elsewhere, so a program that deletes files or its folder cannot take it away), with stdin closed,
a minimal environment, a wall-clock limit (10 s by default; the whole process group is killed at it) and,
via ``resource`` limits, 2 GiB of address space, CPU seconds, 16 MiB of output files, no core files and
no new processes or threads (the kernel counts both; not enforced for root, whose program may start as
many as it likes until the limit ends them). On Linux the caller adopts, for the run, what the program's
processes leave behind as they die (a subreaper), so a daemon in a session or process group of its own
is found and killed too when the program ends.
A sample passes only if the program exits with status 0 *and* printed the sentinel line (however much
output follows it), so ``sys.exit(0)`` before the checks is a failure. Any crash, hang or syntax error is
a failed sample.
This limits accidents; it is not a security boundary against hostile code: the program runs as the user,
so it can read and write their files, use the network and signal their processes (the bench itself), and
a deliberately hostile one can fake a pass (read the sentinel from its own source and print it, or return
an object equal to anything).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from ..errors import EadError
from ..options import SAMPLE_TIMEOUT_S
from .tasks import Task

MEMORY_BYTES = 2 << 30
OUTPUT_BYTES = 16 << 20
_TAIL_BYTES = 4096


@dataclass(frozen=True)
class Execution:
    """How a sandboxed program ended. ``returncode`` None: killed at the wall-clock limit."""

    returncode: int | None
    stdout: str  # the last few KiB
    stderr: str
    printed_mark: bool = False  # run_program's ``mark`` was a line of stdout, however much output followed


@dataclass(frozen=True)
class Outcome:
    """A checked sample: ``error`` says why it failed (the last line of stderr, or how it ended)."""

    status: str  # "passed", "failed" or "timeout"
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _apply_limits(limits: Sequence[tuple[int, int]]) -> None:
    """In the child before exec: lower each limit (never above an existing hard limit)."""
    for which, value in limits:
        hard = resource.getrlimit(which)[1]
        capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (capped, capped))


def _has_line(handle: BinaryIO, line: str) -> bool:
    """Whether the output holds ``line`` as a line of its own, searched in the whole file (mapped, not read
    into memory): an atexit handler or a leftover child may print more than the tail after it."""
    if os.fstat(handle.fileno()).st_size == 0:  # an empty file cannot be mapped
        return False
    with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as output:
        return output.find(f"\n{line}\n".encode()) >= 0


def _tail(handle: BinaryIO) -> str:
    handle.seek(max(0, os.fstat(handle.fileno()).st_size - _TAIL_BYTES))
    return handle.read().decode("utf-8", errors="replace")


def _signal_name(number: int) -> str:
    """SIGKILL, SIGXCPU...; a real-time signal has no name in ``signal.Signals``, so its number."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _set_subreaper(on: bool) -> bool:
    """Linux: whether this process now adopts its orphaned descendants (a daemon the program starts) in
    place of init, so that they can be found and ended; elsewhere nothing, and False."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    return False


def _children() -> set[int]:
    """This process's children, from /proc (a stat's parent pid follows the last ')' of its name)."""
    children: set[int] = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
            if int(Path(entry.path, "stat").read_bytes().rpartition(b")")[2].split()[1]) == me:
                children.add(int(entry.name))
    return children


def _end_strays(before: set[int]) -> None:
    """Kill and reap every child this process did not have before the program: what the program left
    outside its process group (a new session or group), adopted here as its parents died. Their own
    children are adopted in turn as they die, so until none is left."""
    while strays := _children() - before:
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in strays:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def run_program(
    source: str,
    *,
    timeout_s: float = SAMPLE_TIMEOUT_S,
    mark: str | None = None,
) -> Execution:
    """Run Python source in a fresh temporary directory under time and resource limits; with ``mark``,
    say whether the program printed it as a line of its own (after a newline)."""
    limits = [
        (resource.RLIMIT_AS, MEMORY_BYTES),
        (resource.RLIMIT_CPU, math.ceil(timeout_s) + 1),
        (resource.RLIMIT_FSIZE, OUTPUT_BYTES),
        (resource.RLIMIT_CORE, 0),
    ]
    if hasattr(resource, "RLIMIT_NPROC"):
        limits.append((resource.RLIMIT_NPROC, 0))
    with tempfile.TemporaryDirectory(prefix="ead-bench-", ignore_cleanup_errors=True) as folder:
        work = Path(folder)
        (work / "program.py").write_text(source, encoding="utf-8")
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": folder, "TMPDIR": folder}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            adopting = _set_subreaper(True)
            before = _children() if adopting else set()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-I", "program.py"],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=partial(_apply_limits, limits),
                )
            except OSError as error:
                if adopting:
                    _set_subreaper(False)
                raise EadError(f"could not start the sandbox: {error}") from None
            try:
                returncode: int | None = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:  # also ends anything the program left running in its process group, or outside it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if adopting:
                    _end_strays(before | {process.pid})
                    _set_subreaper(False)
            printed_mark = mark is not None and _has_line(out, mark)
            return Execution(returncode, _tail(out), _tail(err), printed_mark)


def check_solution(
    task: Task, code: str, *, timeout_s: float = SAMPLE_TIMEOUT_S
) -> Outcome:
    """Run the task's tests on the code; pass only if the checks ran to the end (a sentinel after them)."""
    sentinel = f"ead-bench-passed-{secrets.token_hex(8)}"
    # The sentinel gets a line of its own even if the code printed text without a newline.
    program = f"{code}\n\n{task.test}\n\ncheck({task.entry_point})\nprint({chr(10) + sentinel!r})\n"
    result = run_program(program, timeout_s=timeout_s, mark=sentinel)
    if result.returncode is None:
        return Outcome("timeout", f"no result within {timeout_s:g} s")
    if result.returncode == 0 and result.printed_mark:
        return Outcome("passed")
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    if errors:
        error = errors[-1].strip()
    elif result.returncode < 0:
        error = f"killed by {_signal_name(-result.returncode)}"
    else:
        error = f"exit status {result.returncode} before the checks finished"
    return Outcome("failed", error[:300])

"""Running a generated program against its task's tests.

Sandbox. The program ``code + test + check(entry_point) + print(<random sentinel>)`` runs as
``python -I`` in a fresh temporary directory that holds only ``program.py`` (its output goes to unnamed
files elsewhere, so a program that deletes files or its folder cannot take it away), with stdin closed,
a minimal environment, a session and process group of its own (a program that kills its group ends
itself, not the bench), a wall-clock limit (10 s by default; the whole process group is killed at it) and,
via ``resource`` limits, 2 GiB of address space, CPU seconds, 16 MiB of output files, no core files and
no new processes or threads (the kernel counts both; not enforced for root, whose program may start as
many as it likes until the limit ends them). On Linux the caller adopts, for the run, what the program's
processes leave behind as they die (a subreaper), so a daemon in a session or process group of its own
is found and killed too when the program ends; and the program is killed with the bench, should the
bench be killed outright (kill -9) before it can end it.
Whom it runs as. A bench run as root runs each program as nobody (its uid and gid, no supplementary
groups, dropped in the child before exec), the folder and program handed to it: the limit of no new
processes holds, and the program can neither signal the bench (or any process of root's) nor write root's
files. That needs nobody to be able to run the bench's Python, which is tried once per interpreter, at a
bench's start (``sandbox_note``); where nobody cannot (a venv whose Python lies under /root, closed to
others), the programs run as root after all, and the bench says so in a one-line note: better a bench
with root's gaps, said, than none. A bench that is not root runs them as its own user.
A sample passes only if the program exits with status 0 *and* printed the sentinel line (however much
output follows it), so ``sys.exit(0)`` before the checks is a failure. Any crash, hang or syntax error is
a failed sample.
This limits accidents; it is not a security boundary against hostile code. As nobody, the program can
still read what every user may, write where every user may (/tmp, /dev/shm), use the network and signal
other processes of nobody's (another bench's programs); as the bench's user (or root, after the note) it
can read and write their files, use the network and signal their processes, the bench's included. And
whoever it runs as, a deliberately hostile one can fake a pass in its own process (read the sentinel from
its own source and print it, or return an object equal to anything).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import mmap
import os
import pwd
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ..errors import EadError, shown_path
from ..options import SAMPLE_TIMEOUT_S
from ..signals import popen_with_signals_held
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


def _apply_limits(limits: Sequence[tuple[int, int]], die_with_bench: Callable[[], None]) -> None:
    """In the child before exec: lower each limit (never above an existing hard limit), and die with the
    bench, which a kill -9 keeps from ending the program at its time limit."""
    for which, value in limits:
        hard = resource.getrlimit(which)[1]
        capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (capped, capped))
    die_with_bench()


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


def _last_line(text: str) -> str | None:
    """The last line that is not blank, stripped (a program's error is the last line of its stderr)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def signal_name(number: int) -> str:
    """SIGKILL, SIGXCPU...; a real-time signal has no name in ``signal.Signals``, so its number."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _libc_prctl() -> Callable[..., int] | None:
    """Linux's prctl, found once in the bench: never first in a forked child, where the loader's lock may be
    held by a thread that fork left behind."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


def _prctl(option: int, value: int) -> bool:
    """prctl with one argument: whether it took; False where there is no prctl."""
    prctl = _libc_prctl()
    return prctl is not None and prctl(option, value, 0, 0, 0) == 0


def _set_subreaper(on: bool) -> bool:
    """Linux: whether this process now adopts its orphaned descendants (a daemon the program starts) in
    place of init, so that they can be found and ended."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


def dying_with_this_process() -> Callable[[], None]:
    """A child's last step before exec (Linux): to be killed when this process dies, which a kill -9 (the
    OOM killer) leaves no time to end its children; a child whose parent died already exits. Kept across
    exec, cleared by a change of user (so taken after the drop to nobody), not inherited by the child's
    own children. prctl is found here, in the parent."""
    parent = os.getpid()
    _libc_prctl()

    def in_child() -> None:
        if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != parent:
            os._exit(1)

    return in_child


class User(NamedTuple):
    """Whom a program runs as, where the bench is root."""

    name: str
    uid: int
    gid: int


def _nobody() -> User:
    """The unprivileged user: the system's nobody, or 65534 (its usual ids) where it has no such entry."""
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam("nobody")
        return User(entry.pw_name, entry.pw_uid, entry.pw_gid)
    return User("nobody", 65534, 65534)


@functools.cache
def _program_user(executable: str) -> tuple[User | None, str | None]:
    """Whom the programs run as (None: the bench's own user), decided once per interpreter, and a note
    where that is root after all. A root bench runs them as nobody if nobody can run ``executable`` on a
    program in a sandbox folder (tried once: a venv whose Python lies under /root cannot be reached);
    otherwise as root, with a note saying so, rather than no bench at all."""
    if os.geteuid() != 0:
        return None, None
    nobody = _nobody()
    try:
        probe = _run("pass\n", timeout_s=SAMPLE_TIMEOUT_S, mark=None, user=nobody)
    except EadError as error:
        reason = str(error)
    else:
        if probe.returncode == 0:
            return nobody, None
        ended = "no answer in time" if probe.returncode is None else f"exit status {probe.returncode}"
        reason = _last_line(probe.stderr) or ended
    return None, (
        f"note: the programs run as root: {nobody.name} cannot run {shown_path(executable)} here "
        f"({reason}); with a Python {nobody.name} can run, they would run as {nobody.name}, away from root's "
        "files and processes"
    )


def sandbox_note() -> str | None:
    """Checked at a bench's start: a line to show where the bench is root and its programs must run as root
    too (see ``_program_user``); None where they run as nobody or the bench is not root."""
    return _program_user(sys.executable)[1]


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
    """Run Python source in a fresh temporary directory under time and resource limits, as nobody where
    the bench is root and nobody can run its Python; with ``mark``, say whether the program printed it as
    a line of its own (after a newline)."""
    return _run(source, timeout_s=timeout_s, mark=mark, user=_program_user(sys.executable)[0])


def _run(source: str, *, timeout_s: float, mark: str | None, user: User | None) -> Execution:
    """run_program as ``user`` (None: as the bench's user), the folder and program theirs."""
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
            uid, gid, groups = (user.uid, user.gid, []) if user else (None, None, None)
            try:
                if user is not None:  # theirs to read, write in and delete, as it would be the bench user's
                    for path in (work, work / "program.py"):
                        os.chown(path, user.uid, user.gid)
                process = popen_with_signals_held(
                    [sys.executable, "-I", "program.py"],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    user=uid,  # dropped in the child before exec: supplementary groups, group, then user
                    group=gid,
                    extra_groups=groups,
                    # runs after the drop
                    preexec_fn=partial(_apply_limits, limits, dying_with_this_process()),
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


def check_solution(task: Task, code: str, *, timeout_s: float = SAMPLE_TIMEOUT_S) -> Outcome:
    """Run the task's tests on the code; pass only if the checks ran to the end (a sentinel after them)."""
    sentinel = f"ead-bench-passed-{secrets.token_hex(8)}"
    # The sentinel gets a line of its own even if the code printed text without a newline.
    program = f"{code}\n\n{task.test}\n\ncheck({task.entry_point})\nprint({chr(10) + sentinel!r})\n"
    result = run_program(program, timeout_s=timeout_s, mark=sentinel)
    if result.returncode is None:
        return Outcome("timeout", f"no result within {timeout_s:g} s")
    if result.returncode == 0 and result.printed_mark:
        return Outcome("passed")
    error = _last_line(result.stderr)
    if error is None and result.returncode < 0:
        error = f"killed by {signal_name(-result.returncode)}"
    elif error is None:
        error = f"exit status {result.returncode} before the checks finished"
    return Outcome("failed", error[:300])

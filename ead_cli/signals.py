"""Keep SIGINT and SIGTERM for the main thread, where Python handles them.

The kernel delivers a process-directed signal to any thread that does not block it. If a Ctrl-C lands
on a worker thread (numpy's OpenBLAS pool, llama.cpp's threads), Python still records it, but the main
thread sleeping in readline's select() is not woken: the prompt ignores Ctrl-C until the next key. A
thread inherits the signal mask of the thread that starts it, so these signals are held back while
third-party code may start threads; one that arrives meanwhile stays pending and is handled as soon as
the call returns.
"""

from __future__ import annotations

import _signal
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_pthread_sigmask = _signal.pthread_sigmask
_SIG_BLOCK, _SIG_SETMASK = _signal.SIG_BLOCK, _signal.SIG_SETMASK


class main_thread_signals:
    """Block SIGINT and SIGTERM in this thread (and so in threads started meanwhile) for the block.

    A class, not a generator: a Ctrl-C raised as ``contextmanager``'s ``__enter__`` returns from the
    generator would leave the signals blocked until the generator was collected."""

    def __enter__(self) -> None:
        self._previous = block_signals()

    def __exit__(self, *exc_info: object) -> None:
        restore_signals(self._previous)


def block_signals() -> set[int]:
    """Block SIGINT and SIGTERM in this thread and return the previous mask for ``restore_signals``: two
    plain calls for the per-token path. ``_signal``'s own call skips ``signal``'s conversion of each mask
    to enums (the pair ~1.5 us on a 2-core AMD EPYC; the context manager ~2 us).

    A signal that arrives just before the mask is set is raised by Python just after it: the mask is
    then put back, or the thread would hold Ctrl-C back for good (a chat's prompt deaf to it)."""
    previous = _pthread_sigmask(_SIG_BLOCK, ())  # reads the mask; a signal raised here changed nothing
    try:
        _pthread_sigmask(_SIG_BLOCK, _SIGNALS)
    except BaseException:
        _pthread_sigmask(_SIG_SETMASK, previous)
        raise
    return previous


def restore_signals(previous: set[int]) -> None:
    """Put back the mask ``block_signals`` returned."""
    _pthread_sigmask(_SIG_SETMASK, previous)


def popen_with_signals_held(
    command: Sequence[str], *, preexec_fn: Callable[[], None], **popen_args: Any
) -> subprocess.Popen:
    """``subprocess.Popen`` with a ``preexec_fn``, SIGINT and SIGTERM held back in this thread meanwhile.

    With a ``preexec_fn`` Python runs its fork hooks in this process (logging's lock), and a Ctrl-C whose
    KeyboardInterrupt was raised inside one was printed as "Exception ignored" and lost: a bench went on
    to its end. Held back, it stays pending and is raised once the child has started. The child lets the
    signals through again as its last step before exec: the program it runs gets the mask it would have
    had."""

    def in_child() -> None:
        preexec_fn()
        restore_signals(previous)

    previous = block_signals()
    try:
        return subprocess.Popen(command, preexec_fn=in_child, **popen_args)
    finally:
        restore_signals(previous)


def stop_requested() -> bool:
    """Whether a Ctrl-C or SIGTERM waits, held back, for this thread to unblock it. Only the main thread
    is stopped so: Python raises nothing in another (``ead serve``'s engine thread finishes its answer
    while the main thread shuts the server down), and there a signal is only pending for the moment
    before the main thread takes it. A signal the process ignores (a shell starts a script's background
    job with SIGINT ignored) is pending only while held back and dropped when let through: no stop."""
    if threading.current_thread() is not threading.main_thread():
        return False
    pending = signal.sigpending() & _SIGNALS
    return bool(pending) and any(signal.getsignal(number) is not signal.SIG_IGN for number in pending)


class CtrlCGate:
    """SIGINT's handler while a chat holds a terminal: a Ctrl-C raises KeyboardInterrupt only while the gate
    is open, as Python's own handler does; one that comes while it is closed is remembered for the next
    ``open``. Python raises a handler's exception at whichever call or loop comes next, so a second Ctrl-C
    come while the REPL handled the first (readline takes a while to clean up after one) was raised between
    the REPL's handlers, outside any, and ended the session. The REPL opens it as a turn begins and closes
    it (``is_open = False``: a store, where Python runs no handler) first thing as the turn ends.

    It never closes itself, and raises through Python's own handler: CPython runs the handler again as
    ``input()`` returns from a Ctrl-C, with the first KeyboardInterrupt still set, where a handler that
    returns, or makes an exception itself, is a SystemError (the C handler only sets one)."""

    def __init__(self) -> None:
        self.is_open = False
        self.missed = False
        self._previous: object = None

    def __call__(self, signum: int, frame: object) -> None:
        if not self.is_open:
            self.missed = True
            return
        signal.default_int_handler(signum, frame)  # type: ignore[arg-type]

    def open(self) -> bool:
        """Let Ctrl-C raise; whether one came while the gate was closed."""
        missed, self.missed = self.missed, False
        self.is_open = True
        return missed

    def __enter__(self) -> CtrlCGate:
        """Handle SIGINT so, in the main thread (the only one where Python may set a handler), unless the
        process ignores it (a shell's background job): that stays so."""
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._previous = None


class Terminated(BaseException):
    """SIGTERM, raised in the main thread: stop like Ctrl-C (keep what was printed), exit 143.

    Not a KeyboardInterrupt, so code that treats Ctrl-C as "stop this answer" (the chat prompt) does not
    swallow a request to end the process.
    """


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def terminate_on_sigterm() -> None:
    """Turn SIGTERM into the Terminated exception (the default action would lose buffered output)."""
    signal.signal(signal.SIGTERM, _raise_terminated)

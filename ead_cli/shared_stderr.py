"""The process's stderr, which ead's log lines share with C code that prints to it directly.

llama.cpp's grammar parser prints a grammar it cannot parse, whole, with fprintf to file descriptor 2:
in ``ead serve`` a client's schema would land in the operator's log, newlines and all. ``captured``
puts descriptor 2 in a file for such a call; ``LOCK`` is held by it and by whatever writes log lines
meanwhile (``ead serve``'s), so no line of theirs is caught with it. Writers that do not take it
(uvicorn's log handlers, Python's warnings, another thread's C code) may still write in that window:
whatever the call did not print itself goes on to the real stderr when the window closes. No imports
beyond the standard library: the command line imports this before numpy, whose thread pool must start
with signals held.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LOCK = threading.Lock()
Span = tuple[int, int]  # [start, end) in the bytes descriptor 2 received


@dataclass
class Caught:
    """What the call in a ``captured`` block printed itself, once the block is over."""

    printed: bytes = b""


@contextmanager
def captured(own: Callable[[bytes], Span]) -> Iterator[Caught]:
    """Descriptor 2 in a temporary file for the block. ``own`` finds the call's own print among what
    the file received (every thread's writes); that part is kept in the ``Caught`` yielded, and the rest,
    other threads' lines, is written to the real stderr when the block ends, so the log loses none."""
    caught = Caught()
    with LOCK, tempfile.TemporaryFile() as file:
        sys.stderr.flush()
        kept = os.dup(2)
        try:
            os.dup2(file.fileno(), 2)
            yield caught
        finally:
            os.dup2(kept, 2)
            os.close(kept)
            file.seek(0)
            received = file.read()
            start, end = own(received)
            caught.printed = received[start:end]
            _write_all(received[:start] + received[end:])


def _write_all(data: bytes) -> None:
    """Bytes to descriptor 2, however many writes it takes; none if it is gone (a closed pipe): the
    call they were caught around has done its work all the same."""
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data) :]


def write_line(line: str) -> None:
    """A line on stderr at once, never while a call's prints are being captured."""
    with LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

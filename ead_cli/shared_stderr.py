"""The process's stderr, which ead's log lines share with C code that prints to it directly.

llama.cpp's grammar parser prints a grammar it cannot parse, whole, with fprintf to file descriptor 2:
in ``ead serve`` a client's schema would land in the operator's log, newlines and all. ``captured``
puts descriptor 2 in a file for such a call; ``LOCK`` is held by it and by whatever writes log lines
meanwhile (``ead serve``'s), so no line of theirs is caught with it. No imports beyond the standard
library: the command line imports this before numpy, whose thread pool must start with signals held.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

LOCK = threading.Lock()


@contextmanager
def captured() -> Iterator[IO[bytes]]:
    """Descriptor 2 in a temporary file for the block (read it, from the start, within the block)."""
    with LOCK, tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        kept = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            yield caught
        finally:
            os.dup2(kept, 2)
            os.close(kept)


def write_line(line: str) -> None:
    """A line on stderr at once, never while a call's prints are being captured."""
    with LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

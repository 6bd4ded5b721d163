"""A Ctrl-C at an exact point of a run, for the tests of what a cut answer counts and shows and of what a
cut write leaves behind."""

from __future__ import annotations

import _thread
import contextlib
import sys
from collections.abc import Iterable, Iterator
from types import CodeType, FrameType

import pytest


@contextlib.contextmanager
def ctrl_c_at_return(function: CodeType, nth: int) -> Iterator[list[int]]:
    """SIGINT tripped as ``function`` (its code) returns for the ``nth`` time: Python raises it at its next
    check, wherever the block then is; the block must end in that KeyboardInterrupt. Yields the returns
    counted (a list of ones, as long as the returns seen)."""
    returns: list[int] = []

    def trip(frame: FrameType, event: str, _: object) -> None:
        if event == "return" and frame.f_code is function:
            returns.append(1)
            if len(returns) == nth:
                _thread.interrupt_main()

    sys.setprofile(trip)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield returns
    finally:
        sys.setprofile(None)


def indices_before_ctrl_c(events: Iterable, function: CodeType, nth: int) -> list[int]:
    """Iterate ``events`` with a Ctrl-C tripped as ``function`` returns for the ``nth`` time
    (``ctrl_c_at_return``). The indices handed out before it."""
    handed_out = []
    with ctrl_c_at_return(function, nth):
        for event in events:
            handed_out.append(event.index)
    return handed_out

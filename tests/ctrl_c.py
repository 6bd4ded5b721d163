"""A Ctrl-C at an exact point of a generation, for the tests of what a cut answer counts and shows."""

from __future__ import annotations

import _thread
import sys
from collections.abc import Iterable
from types import CodeType, FrameType

import pytest


def indices_before_ctrl_c(events: Iterable, function: CodeType, nth: int) -> list[int]:
    """Iterate ``events`` with SIGINT tripped as ``function`` (its code) returns for the ``nth`` time:
    Python raises it at its next check, wherever the loop then is. The indices handed out before it."""
    returns: list[int] = []

    def trip(frame: FrameType, event: str, _: object) -> None:
        if event == "return" and frame.f_code is function:
            returns.append(1)
            if len(returns) == nth:
                _thread.interrupt_main()

    handed_out = []
    sys.setprofile(trip)
    try:
        with pytest.raises(KeyboardInterrupt):
            for event in events:
                handed_out.append(event.index)
    finally:
        sys.setprofile(None)
    return handed_out

"""A figure read back from a file checked by value: the bench's results and replay, models.toml's
numbers, depth's evaluation. A JSON or TOML number may be a bool (``true`` is an int to Python), NaN or
infinite, none of which a figure is; one place says so, for every reader."""

from __future__ import annotations

import math
from typing import Any


def is_figure(value: Any) -> bool:
    """A finite number, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_amount(value: Any) -> bool:
    """Seconds, a rate, FLOPs: a finite number, at least 0."""
    return is_figure(value) and value >= 0


def is_share(value: Any) -> bool:
    return is_figure(value) and 0 <= value <= 1

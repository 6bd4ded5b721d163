"""Prompt-lookup drafts: free guesses at the next tokens, copied from earlier in the same sequence.

Code repeats itself (names, signatures, the prompt's docstring and tests), so the tokens that followed the
latest earlier occurrence of the sequence's last few tokens are often what comes next. The technique of
llama.cpp's ngram-simple (and of prompt lookup decoding): match the longest suffix of ``MAX_MATCH`` down
to ``min_match`` tokens, most recent occurrence first, and propose up to ``limit`` tokens after it. A
verifier reads the proposal in one batch and keeps the prefix it agrees with, so a wrong guess costs one
wider batch and never changes the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAX_MATCH = 8  # longer suffixes first: the longer the match, the likelier the continuation


def propose(tokens: Sequence[int], *, min_match: int, limit: int) -> list[int]:
    """Up to ``limit`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``tokens`` (between ``min_match`` and ``MAX_MATCH`` tokens long, ``MAX_MATCH`` raised to ``min_match``
    where it is smaller) that occurred before; [] if none."""
    if min_match < 1 or limit < 1:
        return []
    history = np.asarray(tokens, dtype=np.int64)
    size = history.shape[0]
    for match in range(min(max(MAX_MATCH, min_match), size - 1), min_match - 1, -1):
        suffix = history[size - match :]
        # Windows starting at 0 .. size - match - 1: every occurrence that ends before the suffix itself.
        windows = sliding_window_view(history[: size - 1], match)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + match
            return history[start : start + limit].tolist()
    return []

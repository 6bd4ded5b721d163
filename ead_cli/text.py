"""Turning a token stream into printable text: whole UTF-8 characters, stop strings held back."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Incremental detokenizer with stop strings.

    Bytes of a character split over tokens (or over a model switch) wait until the character is whole.
    Text that could be the start of a stop string is held back until it is clearly not one, so a stop
    string never reaches the output.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to show (nothing once stopped)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        if not self._stop:
            released, self._pending = self._pending, ""
            return released
        # The earliest match ends the text: one token can bring two stop strings (``xon``, --stop n
        # --stop o), and the first one given may be the later one in the text.
        found = min((at for at in map(self._pending.find, self._stop) if at >= 0), default=-1)
        if found >= 0:
            self.stopped = True
            released, self._pending = self._pending[:found], ""
            return released
        keep = self._held_back()
        released = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return released

    def copy(self) -> TextStream:
        """An independent stream in the same state: to look ahead without committing."""
        twin = TextStream(self._stop)
        twin._decoder.setstate(self._decoder.getstate())
        twin._pending, twin.stopped = self._pending, self.stopped
        return twin

    def flush(self) -> str:
        """At the end: release what was held back (a partial stop string, an unfinished character)."""
        if self.stopped:
            return ""
        released = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return released

    def _held_back(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of a stop string."""
        pending = self._pending
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest

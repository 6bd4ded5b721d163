"""One generation as the caller sees it, the same for every loop (ead's decoders, ead depth), in the
style of mlx-lm's ``stream_generate`` and llm's ``Response``: iterate it for the token events; ``text()``
runs it to the end and returns the answer; ``summary()`` gives the figures once the last event is out,
or after an interrupt (then they count what was generated up to it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Generic, Protocol, TypeVar


class HasText(Protocol):
    text: str


Event = TypeVar("Event", bound=HasText)
Figures = TypeVar("Figures")


class Response(Generic[Event, Figures]):
    """A generation's events (one pass), its text so far, and its summary."""

    def __init__(
        self,
        events: Iterator[Event],
        summary: Callable[[], Figures],
        last_counted: Callable[[], Event | None] | None = None,
    ) -> None:
        self._events = events
        self._summary = summary
        self._last_counted = last_counted
        self._pieces: list[str] = []
        self._last: Event | None = None

    def __iter__(self) -> Iterator[Event]:
        """The events as they come; leaving the loop early (or an interrupt) ends the generation."""
        with closing(self._events):  # type: ignore[type-var]
            for event in self._events:
                self._pieces.append(event.text)
                self._last = event
                yield event

    def text(self) -> str:
        """Run to the end (what is left of it) and return the whole text."""
        for _ in self:
            pass
        return "".join(self._pieces)

    def summary(self) -> Figures:
        return self._summary()

    @property
    def last_event(self) -> Event | None:
        """The newest event the summary counts: after a Ctrl-C it may be one the loop never handed out
        (the signal came between counting and yielding it), which the caller then shows itself."""
        return self._last_counted() if self._last_counted else self._last

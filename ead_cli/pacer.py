"""When the small model's drafts pay: a pure state machine over the measured speed of decoding rounds.

Speculative decoding is exact whichever model proposes, so whether the small model drafts is a question
of speed alone, and the answer depends on the machine: on a 2-core AMD EPYC the 0.5B decodes only 1.7x
as fast as the 1.5B and its drafts cost more than they save; where batches are cheap (a GPU, AMX) they
pay. ``DraftPacer`` measures both kinds of round as they run (tokens written per second) and drafts
while drafting is the faster of the two. A losing kind is tried again now and then (after 16, 32, 64 ...
plain rounds), since a draft's worth changes with the text (boilerplate, then a hard line).

No clock here: the decoder times its rounds and reports them (``record``), so tests drive it with any
figures they like.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Round = Literal["draft", "plain"]

WARMUP_ROUNDS = 3  # rounds of each kind measured before the rates are compared
FIRST_RETRY = 16  # plain rounds before a losing draft is tried again; doubled after each loss
MAX_RETRY = 256
DECAY = 0.8  # weight of the older rounds in each kind's rate: recent text counts most


@dataclass
class _Rate:
    """Decayed sums of tokens written and seconds spent by one kind of round."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds
        self.rounds += 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class DraftPacer:
    """Whether the next round asks the small model for a draft (``should_draft``), from the rounds so far
    (``record``). Starts by drafting; keeps the faster kind; retries drafting after a back-off."""

    draft: _Rate = field(default_factory=_Rate)
    plain: _Rate = field(default_factory=_Rate)
    retry_after: int = FIRST_RETRY
    plain_since_draft: int = 0

    def should_draft(self) -> bool:
        if self.draft.rounds < WARMUP_ROUNDS:
            return True
        if self.plain.rounds < WARMUP_ROUNDS:
            return False
        if self.draft.per_second >= self.plain.per_second:
            return True
        return self.plain_since_draft >= self.retry_after

    def record(self, kind: Round, tokens: int, seconds: float) -> None:
        """A round of ``kind`` wrote ``tokens`` tokens in ``seconds``."""
        if kind == "plain":
            self.plain.add(tokens, seconds)
            self.plain_since_draft += 1
            return
        retried = self.plain_since_draft >= self.retry_after and self.plain.rounds >= WARMUP_ROUNDS
        self.draft.add(tokens, seconds)
        self.plain_since_draft = 0
        if retried:
            won = self.draft.per_second >= self.plain.per_second
            self.retry_after = FIRST_RETRY if won else min(self.retry_after * 2, MAX_RETRY)

"""Switching policies: pure state machines over the stream of per-step entropies.

Models are numbered from 0 (the smallest) upwards. At each step the decoder asks the model
``policy.active`` for its logits, computes their entropy H and calls ``policy.observe(H)``, which
returns the model that writes this step's token; afterwards ``policy.active`` names the model whose
logits the next step evaluates.

*When* a switch takes effect is the ``switch_point``:
- ``"after"``: the model evaluated at this step writes its token; a switch applies from the next
  token on (the paper's reading).
- ``"before"``: the model the policy switches to writes the very token whose entropy triggered the
  switch; the evaluated model's prediction for that position is discarded.

Each step's entropy is observed once: in ``"before"`` mode the new model's entropy at the trigger
position is not fed back, so every policy sees exactly one entropy per generated token.

Policies that look at the text too (line bursts, patterns) set ``wants_text``; the decoder then calls
``see(text)`` with each written token's text after ``observe``. Others cost nothing for it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from typing import Literal

SwitchPoint = Literal["before", "after"]
SWITCH_POINTS: tuple[SwitchPoint, ...] = ("before", "after")
Burst = int | Literal["line", "adaptive"]
BURST_KINDS = ("line", "adaptive")
ADAPT_RUN = 4  # consecutive steps on one side of tau that move an adaptive tau
ADAPT_STEPS = 8  # an adaptive tau crosses its range in this many moves
TEXT_TAIL = 256  # characters of generated text that patterns are matched against

# Built-in patterns for code (``--pattern @code``): the large model writes the rest of the line after
# a function signature starts, after a string literal opens a line's first argument, and at deep nesting.
CODE_PATTERNS = (
    r"^[ \t]*(async[ \t]+)?def[ \t]+\w*",
    r"^[ \t]*(class)[ \t]+\w*",
    r"^[ \t]{12,}\S",
)


class AdaptiveTau:
    """A threshold that falls after a run of uncertain steps and rises after a run of confident ones.

    After ``ADAPT_RUN`` consecutive steps at or above tau it moves down by (high - low) / ADAPT_STEPS,
    after as many below it moves up by as much, never leaving [low, high]: hard stretches call the
    large model sooner, easy ones let the small model keep the pen.
    """

    def __init__(self, tau: float, low: float, high: float) -> None:
        if not 0 <= low < high:
            raise ValueError(f"tau range must satisfy 0 <= low < high, got {low}:{high}")
        self.low, self.high = low, high
        self.value = min(max(tau, low), high)
        self._step = (high - low) / ADAPT_STEPS
        self._run = 0  # > 0: steps at or above tau in a row; < 0: below

    def update(self, entropy: float) -> None:
        above = entropy >= self.value
        self._run = max(self._run, 0) + 1 if above else min(self._run, 0) - 1
        if abs(self._run) >= ADAPT_RUN:
            delta = -self._step if above else self._step
            self.value = min(max(self.value + delta, self.low), self.high)
            self._run = 0


class Policy(ABC):
    """Common state: the active model and a rolling window of entropies."""

    wants_text = False

    def __init__(
        self,
        *,
        window: int = 1,
        switch_point: SwitchPoint = "after",
        start: int = 0,
        tau: float | None = None,
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if switch_point not in SWITCH_POINTS:
            raise ValueError(f"switch point must be 'before' or 'after', got {switch_point!r}")
        self.switch_point: SwitchPoint = switch_point
        self.active = start
        self._window: deque[float] = deque(maxlen=window)
        self._window_sum = 0.0
        self._tau = tau
        self._adaptive = AdaptiveTau(tau, *tau_range) if tau is not None and tau_range else None

    @property
    def tau(self) -> float | None:
        """The threshold in force (it moves with an adaptive range); None for a policy without one."""
        return self._adaptive.value if self._adaptive else self._tau

    @property
    def rolling(self) -> float:
        """Mean of the last ``window`` entropies; before the window fills, of those seen so far."""
        return self._window_sum / len(self._window) if self._window else 0.0

    def observe(self, entropy: float) -> int:
        """Take the entropy of the active model at this step; return the model that writes the token."""
        window = self._window
        if len(window) == window.maxlen:
            self._window_sum -= window[0]
        window.append(entropy)
        self._window_sum += entropy
        writer, self.active = self._step(entropy, self.active)
        if self._adaptive:
            self._adaptive.update(entropy)
        return writer

    def see(self, text: str) -> None:
        """The text of the token just written (called only when ``wants_text``)."""
        raise NotImplementedError(f"{type(self).__name__} sets wants_text without reading the text")

    @abstractmethod
    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        """Return (writer of this step's token, model to evaluate next)."""


class Fixed(Policy):
    """One model writes everything: the small-only and large-only baselines."""

    def __init__(self, model: int = 0, *, window: int = 1) -> None:
        super().__init__(window=window, start=model)

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        return evaluated, evaluated


class EAD(Policy):
    """The paper's rule: rolling mean entropy over ``window`` steps against ``tau``, with hysteresis.

    A counter c counts steps since the last switch (it starts at 0 on the small model). At each step:
    large if mean >= tau and c >= min_run; small if mean < tau and c >= min_run; otherwise keep the
    current model. A tie (mean == tau) goes to the large model. The window is not cleared on a switch.
    Before the window fills, the mean is over the steps seen so far; with min_run >= window this never
    matters, because no switch can happen before the window is full.
    """

    def __init__(
        self,
        tau: float,
        *,
        window: int = 5,
        min_run: int = 10,
        switch_point: SwitchPoint = "after",
        small: int = 0,
        large: int = 1,
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        if min_run < 0:
            raise ValueError(f"min-run must be at least 0, got {min_run}")
        super().__init__(window=window, switch_point=switch_point, start=small, tau=tau, tau_range=tau_range)
        self.min_run = min_run
        self.small = small
        self.large = large
        self.since_switch = 0

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        self.since_switch += 1
        wanted = self.large if self.rolling >= self.tau else self.small
        if wanted == evaluated or self.since_switch < self.min_run:
            return evaluated, evaluated
        self.since_switch = 0
        if self.switch_point == "before":
            return wanted, wanted
        return evaluated, wanted


class Gate(Policy):
    """The small model's own entropy gates each token: at or above ``tau`` the large model writes a burst.

    ``burst``: the tokens the large model writes per trigger; ``"line"``: until its text ends a line;
    ``"adaptive"``: while its own entropy stays at or above tau (it writes the step where it falls
    under, having been evaluated there anyway). With ``switch_point="before"`` the burst starts with
    the very token the small model was unsure of; with ``"after"`` the small model writes that token
    and the burst starts on the next. ``patterns``: regular expressions matched (multi-line) against
    the end of the text so far; a match hands the rest of that line to the large model, whatever
    the entropy.
    """

    def __init__(
        self,
        tau: float,
        *,
        burst: Burst = 1,
        window: int = 1,
        switch_point: SwitchPoint = "before",
        small: int = 0,
        large: int = 1,
        patterns: Sequence[str] = (),
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        if burst not in BURST_KINDS and not (isinstance(burst, int) and burst >= 1):
            raise ValueError(f"burst must be a count of at least 1, 'line' or 'adaptive', got {burst!r}")
        super().__init__(window=window, switch_point=switch_point, start=small, tau=tau, tau_range=tau_range)
        self.burst = burst
        self.small = small
        self.large = large
        self.burst_left = 0  # a counted burst: tokens to go; "line" and "adaptive" bursts use _bursting
        self._bursting = False
        self._line_burst = False
        self._patterns = tuple(_compile(pattern) for pattern in patterns)
        self.wants_text = burst == "line" or bool(self._patterns)
        self._tail = ""

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        if self._bursting:
            if self.burst == "adaptive" and not self._line_burst and entropy < self.tau:
                self._bursting = False
                return evaluated, self.small
            return evaluated, self.large
        if self.burst_left:
            self.burst_left -= 1
            return evaluated, self.large if self.burst_left else self.small
        if self.rolling < self.tau:
            return evaluated, evaluated
        if isinstance(self.burst, str):
            self._bursting, self._line_burst = True, self.burst == "line"
            return (self.large if self.switch_point == "before" else evaluated), self.large
        if self.switch_point == "before":
            self.burst_left = self.burst - 1
            return self.large, self.large if self.burst_left else self.small
        self.burst_left = self.burst
        return evaluated, self.large

    def see(self, text: str) -> None:
        self._tail = (self._tail + text)[-TEXT_TAIL:]
        if self._line_burst and "\n" in text:
            self._bursting = self._line_burst = False
            self.active = self.small
        elif (
            self._patterns
            and not self._bursting
            and not self.burst_left
            and any(pattern.search(self._tail) for pattern in self._patterns)
        ):
            self._bursting = self._line_burst = True
            self.active = self.large


def _compile(pattern: str) -> re.Pattern[str]:
    """A pattern that must match up to the end of the text (so it fires once, where it completes)."""
    try:
        return re.compile(f"(?:{pattern})\\Z", re.MULTILINE)
    except re.error as error:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {error}") from None


MODES = ("ead", "small", "large", "spec")
POLICIES = ("ead", "gate")
DEFAULT_TAU = {"ead": 0.5, "gate": 1.0}


def make_policy(
    mode: str = "ead",
    policy: str = "gate",
    *,
    tau: float | None = None,
    window: int | None = None,
    min_run: int = 10,
    burst: Burst = 1,
    switch_point: SwitchPoint = "before",
    patterns: Sequence[str] = (),
    tau_range: tuple[float, float] | None = None,
) -> Policy:
    """Build a policy for a two-model run from command-line style options (ValueError if invalid).

    ``mode`` small/large pins one model (the baselines); ``mode`` ead switches with ``policy``
    (``spec`` is not a policy: the engine builds a SpeculativeDecoder for it).
    ``window`` defaults to 5 for ead (the paper's w) and 1 for gate (the step's own entropy).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    tau = DEFAULT_TAU[policy] if tau is None else tau
    if not tau >= 0:  # written so, NaN fails it too
        raise ValueError(f"tau must be at least 0, got {tau}")
    if window is None:
        window = 5 if policy == "ead" else 1
    if mode in ("small", "large"):
        return Fixed(0 if mode == "small" else 1, window=window)
    if policy == "ead":
        if patterns or burst != 1:
            raise ValueError("--pattern and --burst apply to --policy gate")
        return EAD(tau, window=window, min_run=min_run, switch_point=switch_point, tau_range=tau_range)
    expanded = [p for name in patterns for p in (CODE_PATTERNS if name == "@code" else (name,))]
    return Gate(
        tau,
        burst=burst,
        window=window,
        switch_point=switch_point,
        patterns=expanded,
        tau_range=tau_range,
    )

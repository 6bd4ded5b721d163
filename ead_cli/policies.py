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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Literal

SwitchPoint = Literal["before", "after"]
SWITCH_POINTS: tuple[SwitchPoint, ...] = ("before", "after")


class Policy(ABC):
    """Common state: the active model and a rolling window of entropies."""

    def __init__(self, *, window: int = 1, switch_point: SwitchPoint = "after", start: int = 0) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if switch_point not in SWITCH_POINTS:
            raise ValueError(f"switch point must be 'before' or 'after', got {switch_point!r}")
        self.switch_point: SwitchPoint = switch_point
        self.active = start
        self._window: deque[float] = deque(maxlen=window)
        self._window_sum = 0.0

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
        return writer

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
    ) -> None:
        if min_run < 0:
            raise ValueError(f"min-run must be at least 0, got {min_run}")
        super().__init__(window=window, switch_point=switch_point, start=small)
        self.tau = tau
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

    ``burst`` is the number of tokens the large model writes per trigger. With ``switch_point="before"``
    the burst starts with the very token the small model was unsure of; with ``"after"`` the small
    model writes that token and the burst covers the next ``burst`` tokens. The large model's own
    entropy during a burst does not extend or cut it.
    """

    def __init__(
        self,
        tau: float,
        *,
        burst: int = 1,
        window: int = 1,
        switch_point: SwitchPoint = "before",
        small: int = 0,
        large: int = 1,
    ) -> None:
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        super().__init__(window=window, switch_point=switch_point, start=small)
        self.tau = tau
        self.burst = burst
        self.small = small
        self.large = large
        self.burst_left = 0

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        if self.burst_left:
            self.burst_left -= 1
            return evaluated, self.large if self.burst_left else self.small
        if self.rolling < self.tau:
            return evaluated, evaluated
        if self.switch_point == "before":
            self.burst_left = self.burst - 1
            return self.large, self.large if self.burst_left else self.small
        self.burst_left = self.burst
        return evaluated, self.large


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
    burst: int = 1,
    switch_point: SwitchPoint = "before",
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
    if tau < 0:
        raise ValueError(f"tau must be at least 0, got {tau}")
    if window is None:
        window = 5 if policy == "ead" else 1
    if mode in ("small", "large"):
        return Fixed(0 if mode == "small" else 1, window=window)
    if policy == "ead":
        return EAD(tau, window=window, min_run=min_run, switch_point=switch_point)
    return Gate(tau, burst=burst, window=window, switch_point=switch_point)

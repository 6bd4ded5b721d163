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

Two more hooks, for policies that need them and free for the others:
- ``escalating``: a cascade (three or more models) asks the next model up at the same step: while it is
  True after ``observe``, the decoder evaluates the returned model and calls ``observe`` again with its
  entropy. Those chained entropies do not enter the rolling window (it stays the step's first model's).
- ``holding`` and ``take_back(now)``: a lookahead policy may take back tokens already written; the
  decoder holds them unshown while ``holding`` and, after each token, removes the newest
  ``take_back(now)`` of them (``now``: the answer ends, so decide on what there is).
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import quoted

SwitchPoint = Literal["before", "after"]
SWITCH_POINTS: tuple[SwitchPoint, ...] = ("before", "after")
Burst = int | Literal["line", "adaptive"]
BURST_KINDS = ("line", "adaptive")
ADAPT_RUN = 4  # consecutive steps on one side of tau that move an adaptive tau
ADAPT_STEPS = 8  # an adaptive tau crosses its range in this many moves
TEXT_TAIL = 256  # characters of generated text that patterns are matched against
# The longest rolling window: far past any context's length (a longer one means no more), far below the
# C bound of the window's deque, which a huge one would overflow in a traceback.
MAX_WINDOW = 2**20
Tau = float | Sequence[float]  # one threshold per level below the top: a cascade of n models has n - 1

# Built-in patterns for code (``--pattern @code``): the large model writes the rest of the line after
# a function signature starts, after a string literal opens a line's first argument, and at deep nesting.
CODE_PATTERNS = (
    r"^[ \t]*(async[ \t]+)?def[ \t]+\w*",
    r"^[ \t]*(class)[ \t]+\w*",
    r"^[ \t]{12,}\S",
)


def check_taus(taus: Sequence[float], tau_range: tuple[float, float] | None = None) -> None:
    """Thresholds of at least 0 bits, at least one, and one alone within an adaptive range."""
    if not all(t >= 0 for t in taus):  # written so, NaN fails it too
        raise ValueError(f"--tau must be at least 0, got {', '.join(map(str, taus))}")
    if not taus:
        raise ValueError("--tau needs at least one threshold")
    if tau_range and len(taus) != 1:
        raise ValueError("--tau-range takes two models (one threshold)")
    if tau_range and not 0 <= tau_range[0] < tau_range[1] < math.inf:  # as a tau, a bound is finite
        raise ValueError(
            f"--tau-range must satisfy 0 <= low < high, both finite, got {tau_range[0]}:{tau_range[1]}"
        )


class ExactMean:
    """The mean of the last ``maxlen`` floats (of all, without one), rounded once from the exact sum: a sum
    rounded at each step falls under a tie with tau (0.1 + 0.6 + 0.2 + 0.1 is 0.9999999999999999; fsum
    over 0.2, 0.2, 0.3 then divided by 3 rounds twice, under 0.23333333333333334), and summing the
    window anew each step costs its length. Each value is held as an integer count of 2**-1074 (every
    finite float is one), so a step adds one and takes one away; NaN and infinities are counted aside
    and rule the mean only while in the window."""

    _SCALE = 1074  # the smallest float is 2**-1074

    def __init__(self, maxlen: int | None = None) -> None:
        self._values: deque[float] = deque(maxlen=maxlen)
        self._sum = 0  # of the finite values, in units of 2**-1074
        self._nan = self._inf = self._minus_inf = 0

    def __len__(self) -> int:
        return len(self._values)

    @property
    def maxlen(self) -> int | None:
        return self._values.maxlen

    def append(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._count(self._values[0], -1)
        self._values.append(value)
        self._count(value, 1)

    def replace_last(self, value: float) -> None:
        self._count(self._values[-1], -1)
        self._values[-1] = value
        self._count(value, 1)

    def clear(self) -> None:
        self._values.clear()
        self._sum = self._nan = self._inf = self._minus_inf = 0

    @property
    def value(self) -> float:
        """The mean, correctly rounded (int / int is, in Python); 0.0 of no values."""
        if self._nan or (self._inf and self._minus_inf):
            return math.nan
        if self._inf or self._minus_inf:
            return math.inf if self._inf else -math.inf
        return self._sum / (len(self._values) << self._SCALE) if self._values else 0.0

    def _count(self, value: float, sign: int) -> None:
        if math.isnan(value):
            self._nan += sign
        elif value == math.inf:
            self._inf += sign
        elif value == -math.inf:
            self._minus_inf += sign
        else:
            numerator, denominator = value.as_integer_ratio()  # the denominator a power of 2, <= 2**1074
            self._sum += sign * numerator * ((1 << self._SCALE) // denominator)


def check_window(window: int) -> None:
    if window < 1:
        raise ValueError(f"--window must be at least 1, got {window}")
    if window > MAX_WINDOW:
        raise ValueError(
            f"--window must be at most {MAX_WINDOW} steps (more than any context holds), got {window}"
        )


def check_switch_point(switch_point: str) -> None:
    if switch_point not in SWITCH_POINTS:
        raise ValueError(f"--switch-point must be 'before' or 'after', got {quoted(switch_point)}")


def check_min_run(min_run: int) -> None:
    if min_run < 0:
        raise ValueError(f"--min-run must be at least 0, got {min_run}")


def check_burst(burst: Burst) -> None:
    if burst not in BURST_KINDS and not (isinstance(burst, int) and burst >= 1):
        raise ValueError(f"--burst must be a count of at least 1, 'line' or 'adaptive', got {burst!r}")


def check_span(span: int) -> None:
    if span < 1:
        raise ValueError(f"--draft must be at least 1, got {span}")


class AdaptiveTau:
    """A threshold that falls after a run of uncertain steps and rises after a run of confident ones.

    After ``ADAPT_RUN`` consecutive steps at or above tau it moves down by (high - low) / ADAPT_STEPS,
    after as many below it moves up by as much, never leaving [low, high]: hard stretches call the
    large model sooner, easy ones let the small model keep the pen.
    """

    def __init__(self, tau: float, low: float, high: float) -> None:
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
    """Common state: the active model, a rolling window of entropies and the thresholds.

    ``tau``: one threshold, or one per level below the top (models 0 .. n-1, n = len(tau) + 1).
    """

    wants_text = False
    escalating = False
    holding = False

    def __init__(
        self,
        *,
        window: int = 1,
        switch_point: SwitchPoint = "after",
        start: int = 0,
        tau: Tau | None = None,
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        check_window(window)
        check_switch_point(switch_point)
        taus = () if tau is None else as_taus(tau)
        if tau is not None:
            check_taus(taus, tau_range)
        self.switch_point: SwitchPoint = switch_point
        self.active = start
        self.levels = len(taus) + 1  # the models, from 0 (smallest) to levels - 1
        self._level = start  # the model whose entropy was observed last
        self._window = ExactMean(maxlen=window)
        self._taus = taus
        self._adaptive = AdaptiveTau(taus[0], *tau_range) if taus and tau_range else None

    @property
    def tau(self) -> float | None:
        """The threshold in force at the model observed last (with an adaptive range it moves); None for
        a policy without one."""
        return self._tau_at(min(self._level, len(self._taus) - 1)) if self._taus else None

    def _tau_at(self, level: int) -> float:
        """The threshold between model ``level`` and the next one up."""
        return self._adaptive.value if self._adaptive else self._taus[level]

    @property
    def rolling(self) -> float:
        """Mean of the last ``window`` entropies; before the window fills, of those seen so far."""
        return self._window.value

    def observe(self, entropy: float) -> int:
        """Take the entropy of the active model at this step; return the model that writes the token."""
        self._level = self.active
        first = not self.escalating  # the step's first entropy; a cascade's chained ones stay out
        if first:
            self._window.append(entropy)
        writer, self.active = self._step(entropy, self.active)
        if self._adaptive and first:
            self._adaptive.update(entropy)
        return writer

    def amend(self, entropy: float) -> None:
        """Put the measured entropy in place of the stand-in observed last, where ``settled`` held for
        every value (its decisions stay; the rolling mean shown becomes the measured one)."""
        self._window.replace_last(entropy)

    @property
    def may_settle(self) -> bool:
        """Whether ``settled`` can ever answer True (else the decoder does not look for bounds)."""
        return False

    def settled(self, low: float, high: float) -> bool:
        """Whether ``observe`` would pick the same writer and next model, and leave the policy in the
        same state for its later steps, for every entropy in [low, high]: then the decoder may observe
        any value of the range without measuring the entropy (``Decoder(entropy="needed")``). A policy
        that reads the value itself (a rolling mean over several steps) answers False, the default."""
        return False

    def _thresholds_settled(self, low: float, high: float) -> bool:
        """Whether every comparison of this step's entropy with a threshold in force (``entropy >= tau``)
        comes out the same across [low, high], with a window of one step (the rolling mean is the
        entropy itself) and no chained cascade step pending."""
        if self._window.maxlen != 1 or self.escalating:
            return False
        for tau in (self._adaptive.value,) if self._adaptive else self._taus:  # a loop: asked twice a token
            if not (low >= tau or high < tau):  # so written, a NaN bound settles nothing
                return False
        return True

    def see(self, text: str) -> None:
        """The text of the token just written (called only when ``wants_text``)."""
        raise NotImplementedError(f"{type(self).__name__} sets wants_text without reading the text")

    def take_back(self, now: bool = False) -> int:
        """How many of the newest tokens to take back now (only a lookahead policy ever does)."""
        return 0

    @abstractmethod
    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        """Return (writer of this step's token, model to evaluate next)."""


class Fixed(Policy):
    """One model writes everything: the small-only and large-only baselines."""

    def __init__(self, model: int = 0, *, window: int = 1) -> None:
        super().__init__(window=window, start=model)

    @property
    def may_settle(self) -> bool:
        return True

    def settled(self, low: float, high: float) -> bool:
        return True  # the entropy is never read

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        return evaluated, evaluated


class EAD(Policy):
    """The paper's rule: rolling mean entropy over ``window`` steps against ``tau``, with hysteresis.

    A counter c counts steps since the last switch (it starts at 0 on the small model). At each step:
    large if mean >= tau and c >= min_run; small if mean < tau and c >= min_run; otherwise keep the
    current model. A tie (mean == tau) goes to the large model. The window is not cleared on a switch.
    Before the window fills, the mean is over the steps seen so far; with min_run >= window this never
    matters, because no switch can happen before the window is full.

    A cascade (one tau per level below the top) moves one level at a time by the same rule: up from
    level i when the mean reaches tau[i], down when it falls under tau[i-1]. Two models: the rule above.
    """

    def __init__(
        self,
        tau: Tau,
        *,
        window: int = 5,
        min_run: int = 10,
        switch_point: SwitchPoint = "after",
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        check_min_run(min_run)
        super().__init__(window=window, switch_point=switch_point, tau=tau, tau_range=tau_range)
        self.min_run = min_run
        self.since_switch = 0

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        self.since_switch += 1
        wanted = evaluated
        if evaluated < self.levels - 1 and self.rolling >= self._tau_at(evaluated):
            wanted = evaluated + 1
        elif evaluated > 0 and self.rolling < self._tau_at(evaluated - 1):
            wanted = evaluated - 1
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

    A cascade (one tau per level below the top; switch point "before"): a trigger asks the next model
    up at the same step, and it writes the token (and the burst) unless its own entropy reaches its
    tau too, in which case the next one is asked, up to the top. An adaptive burst by level i lasts
    while its entropy stays at or above tau[i-1], the threshold that called it.
    """

    def __init__(
        self,
        tau: Tau,
        *,
        burst: Burst = 1,
        window: int = 1,
        switch_point: SwitchPoint = "before",
        patterns: Sequence[str] = (),
        tau_range: tuple[float, float] | None = None,
    ) -> None:
        check_burst(burst)
        super().__init__(window=window, switch_point=switch_point, tau=tau, tau_range=tau_range)
        if self.levels > 2 and switch_point == "after":
            raise ValueError("a cascade of three or more models gates with --switch-point before")
        self.burst = burst
        self.top = self.levels - 1
        self.burst_left = 0  # a counted burst: tokens to go; "line" and "adaptive" bursts use _bursting
        self._bursting = False
        self._line_burst = False
        self._patterns = tuple(_compile(pattern) for pattern in patterns)
        self.wants_text = burst == "line" or bool(self._patterns)
        self._tail = ""

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        self.escalating = False
        if self._bursting:
            if self.burst == "adaptive" and not self._line_burst and entropy < self._tau_at(evaluated - 1):
                self._bursting = False
                return evaluated, 0
            return evaluated, evaluated
        if self.burst_left:
            self.burst_left -= 1
            return evaluated, evaluated if self.burst_left else 0
        if evaluated == 0 and self.rolling < self._tau_at(0):
            return evaluated, evaluated
        if evaluated and entropy < self._tau_at(evaluated):  # a level asked in a cascade is sure: it writes
            return self._burst_by(evaluated)
        if evaluated + 1 < self.top:  # ask the next level up at this same step
            self.escalating = True
            return evaluated + 1, evaluated + 1
        if self.switch_point == "before":
            return self._burst_by(self.top)
        if isinstance(self.burst, str):
            self._bursting, self._line_burst = True, self.burst == "line"
        else:
            self.burst_left = self.burst
        return evaluated, self.top

    @property
    def may_settle(self) -> bool:
        return self._window.maxlen == 1

    def settled(self, low: float, high: float) -> bool:
        return self._thresholds_settled(low, high)  # every read of the entropy compares it with a tau

    def _burst_by(self, level: int) -> tuple[int, int]:
        """Model ``level`` writes this token and starts its burst."""
        if isinstance(self.burst, str):
            self._bursting, self._line_burst = True, self.burst == "line"
            return level, level
        self.burst_left = self.burst - 1
        return level, level if self.burst_left else 0

    def see(self, text: str) -> None:
        self._tail = (self._tail + text)[-TEXT_TAIL:]
        if self._line_burst and "\n" in text:
            self._bursting = self._line_burst = False
            self.active = 0
        elif (
            self._patterns
            and not self._bursting
            and not self.burst_left
            and any(pattern.search(self._tail) for pattern in self._patterns)
        ):
            self._bursting = self._line_burst = True
            self.active = self.top


class Lookahead(Policy):
    """The small model drafts ``span`` tokens ahead; their mean entropy decides: under ``tau`` they
    stand, at or above it the large model rewrites the span (the drafted tokens are taken back).

    Unlike the gate, the decision sees the entropy *after* the uncertain token too: a draft whose one
    unsure token leads on to confident ones stands. The cost: drafted tokens wait unshown until their
    span is decided, and a rewritten span throws the small model's work away. ``rolling`` is the mean
    over the current draft. Two models only.
    """

    def __init__(self, tau: Tau, *, span: int = 4, tau_range: tuple[float, float] | None = None) -> None:
        check_span(span)
        super().__init__(tau=tau, tau_range=tau_range)
        if self.levels != 2:
            raise ValueError("--policy lookahead takes two models")
        self.span = span
        self._draft = ExactMean()  # the open draft's entropies
        self._mean = 0.0
        self._take_back = 0
        self._rewrite_left = 0

    @property
    def holding(self) -> bool:  # type: ignore[override]
        """The newest token may still be taken back."""
        return bool(self._draft) or self._take_back > 0

    @property
    def rolling(self) -> float:
        return self._mean

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        if evaluated == 1:
            self._rewrite_left -= 1
            return 1, 1 if self._rewrite_left > 0 else 0
        self._draft.append(entropy)
        self._mean = self._draft.value
        if len(self._draft) == self.span:
            self._decide()
        return 0, self.active

    def _decide(self) -> None:
        if self._mean >= self._tau_at(0):
            self._take_back = self._rewrite_left = len(self._draft)
            self.active = 1
        self._draft.clear()

    def take_back(self, now: bool = False) -> int:
        if now and self._draft:
            self._decide()
        count, self._take_back = self._take_back, 0
        return count


def _compile(pattern: str) -> re.Pattern[str]:
    """A pattern that must match up to the end of the text (so it fires once, where it completes). One
    that matches the empty text ('', 'x*', '$') matches at the end of every text: it fires at every token."""
    try:
        compiled = re.compile(f"(?:{pattern})\\Z", re.MULTILINE)
    except re.error as error:
        raise ValueError(f"pattern {quoted(pattern)} is not a valid regular expression: {error}") from None
    if compiled.search(""):
        raise ValueError(
            f"pattern {quoted(pattern)} matches the empty text: it would hand every token to the large model"
        )
    return compiled


MODES = ("ead", "small", "large", "spec")


@dataclass(frozen=True)
class Settings:
    """What a policy is built from: one threshold per level below the top, and the policy options."""

    taus: tuple[float, ...]
    window: int
    min_run: int
    burst: Burst
    switch_point: SwitchPoint
    patterns: tuple[str, ...]
    tau_range: tuple[float, float] | None
    span: int

    def __post_init__(self) -> None:
        """Each value in its range whatever the mode and policy: one that is invalid is refused even where
        it would go unused (``--mode large --min-run -5``), before any model loads."""
        check_taus(self.taus, self.tau_range)
        check_window(self.window)
        check_min_run(self.min_run)
        check_burst(self.burst)
        check_switch_point(self.switch_point)
        check_span(self.span)
        for pattern in _expanded(self.patterns):
            _compile(pattern)


@dataclass(frozen=True)
class PolicyKind:
    """A switching policy, declared once: ``--policy NAME``, what it does (the CLI's help), its default
    threshold and window, the text options it reads (``burst``, ``patterns``: refused for the others),
    how it is built, and how ``ead bench`` sweeps it: the options it multiplies (PolicyOptions fields,
    besides its thresholds, ``--NAME-tau``) and its thresholds by default (empty: ``tau`` alone).
    ``register`` adds one; the CLI's choices, make_policy, ead chat and the bench's families read the
    table."""

    name: str
    summary: str
    tau: float
    window: int
    build: Callable[[Settings], Policy]
    text_options: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()  # of SHAPING, the options it reads: given to another, unused
    sweeps: tuple[str, ...] = ()
    bench_taus: tuple[float, ...] = ()

    @property
    def rule_options(self) -> frozenset[str]:
        """The options besides τ that decide what this policy does with a τ (PolicyOptions fields): a τ
        calibrated under some values of them hands another share under others."""
        return self.reads | self.text_options | {"tau_range"}

    @property
    def swept_taus(self) -> tuple[float, ...]:
        """The thresholds ``ead bench`` tries unless told."""
        return self.bench_taus or (self.tau,)


POLICY_KINDS: dict[str, PolicyKind] = {}
# The options that shape one policy or another, by the option table's names: a policy reads its ``reads``.
SHAPING = frozenset({"window", "min_run", "switch_point", "draft"})


def register(kind: PolicyKind) -> PolicyKind:
    """Make a policy kind known by its name (a new one: a class, and one call of this beside it)."""
    POLICY_KINDS[kind.name] = kind
    return kind


def defaults_by_policy(field: str) -> str:
    """A default of every policy kind, in one phrase: ``gate 1, ead 0.5, lookahead 1`` (``tau``), as the
    CLI's help and docs/switching.md's table say it."""
    return ", ".join(f"{kind.name} {getattr(kind, field):g}" for kind in POLICY_KINDS.values())


def _expanded(patterns: Sequence[str]) -> list[str]:
    """``@code`` stands for the built-in code patterns."""
    return [p for name in patterns for p in (CODE_PATTERNS if name == "@code" else (name,))]


register(
    PolicyKind(
        "gate",
        "per-token",
        tau=1.0,
        window=1,
        build=lambda s: Gate(
            s.taus,
            burst=s.burst,
            window=s.window,
            switch_point=s.switch_point,
            patterns=_expanded(s.patterns),
            tau_range=s.tau_range,
        ),
        text_options=frozenset({"burst", "patterns"}),
        reads=frozenset({"window", "switch_point"}),
        sweeps=("switch_point", "verify", "burst"),
    )
)
register(
    PolicyKind(
        "ead",
        "the paper's rolling-window rule",
        tau=0.5,
        window=5,
        build=lambda s: EAD(
            s.taus, window=s.window, min_run=s.min_run, switch_point=s.switch_point, tau_range=s.tau_range
        ),
        reads=frozenset({"window", "min_run", "switch_point"}),
        sweeps=("window", "min_run", "switch_point", "verify"),
        bench_taus=(0.125, 0.25, 0.5, 1.0),
    )
)
register(
    PolicyKind(
        "lookahead",
        "the small model drafts --draft tokens and the large one rewrites them if their mean entropy "
        "reaches tau",
        tau=1.0,
        window=1,
        build=lambda s: Lookahead(s.taus, span=s.span, tau_range=s.tau_range),
        reads=frozenset({"draft"}),
        sweeps=("draft", "verify"),
    )
)


def make_policy(
    mode: str = "ead",
    policy: str = "gate",
    *,
    tau: Tau | None = None,
    levels: int = 2,
    window: int | None = None,
    min_run: int = 10,
    burst: Burst = 1,
    switch_point: SwitchPoint = "before",
    patterns: Sequence[str] = (),
    tau_range: tuple[float, float] | None = None,
    span: int = 4,
) -> Policy:
    """Build a policy for ``levels`` models from command-line style options (ValueError if invalid).

    ``mode`` small/large pins the smallest or the largest model (the baselines); ``mode`` ead switches
    with ``policy``, a name in ``POLICY_KINDS``; ``spec`` pins the largest, whose tokens it keeps (the
    engine builds a SpeculativeDecoder instead: this checks its options). ``tau``: one threshold per level
    below the top; a single one is repeated for a cascade. ``window`` and ``tau`` default to the policy's
    own. ``span``: the lookahead draft. Every value is checked whatever the mode (``Settings``); the
    switching ones are then unused outside ``ead``, so one command line serves every mode.
    """
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {quoted(mode)}")
    if policy not in POLICY_KINDS:
        raise ValueError(f"--policy must be one of {', '.join(POLICY_KINDS)}, got {quoted(policy)}")
    kind = POLICY_KINDS[policy]
    taus = as_taus(kind.tau if tau is None else tau)
    taus = _taus(taus, levels) if levels >= 2 else taus  # a model loaded alone: its run checked the count
    policy_window = kind.window if window is None else window
    settings = Settings(taus, policy_window, min_run, burst, switch_point, tuple(patterns), tau_range, span)
    if mode != "ead" and levels >= 1:  # one model at work: loaded alone, or beside others
        return Fixed(0 if mode == "small" else levels - 1, window=window or 1)
    if levels < 2:
        raise ValueError(f"switching takes at least two models, got {levels}")
    given = {"patterns"} if patterns else set()
    if burst != 1:
        given.add("burst")
    if given - kind.text_options:
        takers = [name for name, other in POLICY_KINDS.items() if other.text_options]
        raise ValueError(f"--pattern and --burst apply to --policy {' and '.join(takers)}")
    return kind.build(settings)


def parse_tau(text: str) -> float | tuple[float, ...]:
    """``"1.5"`` -> 1.5; ``"1,2"`` -> (1.0, 2.0), a cascade's thresholds (ValueError unless finite)."""
    taus = tuple(float(part) for part in text.split(","))
    if not all(math.isfinite(tau) for tau in taus):
        raise ValueError(f"thresholds must be finite, got {quoted(text)}")
    return taus[0] if len(taus) == 1 else taus


def as_taus(tau: Tau) -> tuple[float, ...]:
    """One threshold or several, as a tuple."""
    return (tau,) if isinstance(tau, int | float) else tuple(tau)


def format_tau(tau: Tau) -> str:
    return ",".join(f"{t:g}" for t in as_taus(tau))


def _taus(tau: Tau, levels: int) -> tuple[float, ...]:
    """One threshold per level below the top: a single value serves every level."""
    taus = as_taus(tau)
    if len(taus) == 1:
        return taus * (levels - 1)
    if len(taus) != levels - 1:
        wanted = "one threshold" if levels == 2 else f"{levels - 1} thresholds (or one for all)"
        raise ValueError(f"{levels} models take {wanted}, got {len(taus)}")
    return taus

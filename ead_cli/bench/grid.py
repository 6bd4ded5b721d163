"""The strategy grid of ``ead bench``: which decoders a bench compares, and their names.

Strategies (``families()``): small-only, large-only, one family per switching policy of the policy table
(``policies.POLICY_KINDS``: each at its ``--NAME-tau`` thresholds, times the options its ``sweeps`` name:
``gate`` x switch point x verify x burst, ``ead`` x window x min-run x switch point x verify,
``lookahead`` x span (the draft lengths) x verify), and ``spec`` (speculative decoding) at each draft
length (x draft entropy stop). A strategy is a name and the PolicyOptions ``build_decoder`` takes; the
name lists the options that differ from their defaults, e.g. ``ead tau=0.5 window=3``. Named only,
never by default: ``server-large``, ``server-spec`` (per ``--server-draft``), ``server-ngram`` (per
``--server-ngram``) and ``server-stack`` (llama.cpp's draft model and n-gram type together: each draft
length x each type), llama.cpp's own loops in the built llama-server (native.py); their samples have
no schedule and carry the server's timings in ``server``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import EadError, quoted
from ..option_table import OPTIONS
from ..options import PolicyOptions
from ..policies import BURST_KINDS, POLICY_KINDS, SWITCH_POINTS, Burst, PolicyKind, SwitchPoint

# llama.cpp's own loops in a llama-server (native.py runs them): the server strategies.
KINDS = ("large", "spec", "ngram")
# What this build's --spec-type offers without a draft model (``llama-server --help``).
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_TYPE = "draft-simple"  # speculation with a draft model; the server ignores -md without it
MAX_DRAFT = 64


@dataclass(frozen=True)
class NativeOptions:
    """One llama-server configuration: the kind, and the draft length or n-gram type it takes."""

    kind: str
    draft: int | None = None  # spec: --spec-draft-n-max
    spec_type: str | None = None  # ngram: --spec-type; spec: an n-gram type stacked on the draft model

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise EadError(f"unknown server strategy {self.kind!r} (one of {', '.join(KINDS)})", exit_code=2)
        if (self.draft is not None) != (self.kind == "spec"):
            raise EadError("a draft length belongs to server-spec alone", exit_code=2)
        if self.draft is not None:
            check_server_draft(self.draft)
        if (self.spec_type is None) == (self.kind == "ngram") and self.kind != "spec":
            raise EadError("an n-gram type belongs to server-ngram and server-stack alone", exit_code=2)
        if self.spec_type is not None:
            check_ngram_type(self.spec_type)

    @property
    def name(self) -> str:
        """``server-large``, ``server-spec draft=3``, ``server-ngram type=ngram-mod``, and the stack of
        both, ``server-spec draft=3 type=ngram-mod``."""
        if self.kind == "spec":
            return f"server-spec draft={self.draft}" + (f" type={self.spec_type}" if self.spec_type else "")
        if self.kind == "ngram":
            return f"server-ngram type={self.spec_type}"
        return "server-large"

    def flags(self, small: Path, threads: int, threads_batch: int) -> list[str]:
        """The server's options for this configuration (the large model and the common ones aside).
        A stack gives ``--spec-type`` both kinds: llama.cpp then drafts with whichever proposes."""
        if self.kind == "spec":
            types = DRAFT_TYPE + (f",{self.spec_type}" if self.spec_type else "")
            return [
                "--spec-type", types, "--spec-draft-model", str(small),
                "--spec-draft-n-max", str(self.draft),
                "-td", str(threads), "-tbd", str(threads_batch),
            ]  # fmt: skip
        if self.kind == "ngram":
            return ["--spec-type", str(self.spec_type)]
        return []


def check_server_draft(draft: int) -> None:
    if not 1 <= draft <= MAX_DRAFT:
        raise EadError(f"--server-draft: {draft} is not in [1, {MAX_DRAFT}]", exit_code=2)


def check_ngram_type(name: str) -> None:
    if name not in NGRAM_TYPES:
        raise EadError(f"--server-ngram: {quoted(name)} is not one of {', '.join(NGRAM_TYPES)}", exit_code=2)


LARGE_ONLY = "large-only"
LONE_MODELS = {"small-only": "small", LARGE_ONLY: "large"}  # the lone models' strategies: their families


@dataclass(frozen=True)
class Strategy:
    """A named way of decoding: the policy options ``build_decoder`` takes, or a llama-server
    configuration (native.py) for llama.cpp's own loop."""

    name: str
    policy: PolicyOptions | NativeOptions


NOT_NAMED = ("mode", "policy", "given", "mode_given")  # the label says the first two; the rest is bookkeeping


def strategy_name(policy: PolicyOptions | NativeOptions) -> str:
    """``small-only``, ``large-only``, or the policy with every option that differs from its default,
    e.g. ``ead tau=0.5 window=3``; new PolicyOptions fields show up without changes here. A server
    strategy is named by native.py: ``server-spec draft=3``."""
    if isinstance(policy, NativeOptions):
        return policy.name
    label = policy.policy if policy.mode == "ead" else policy.mode
    if policy.mode in ("small", "large"):
        label = f"{policy.mode}-only"
    default = PolicyOptions(mode=policy.mode, policy=policy.policy)
    parts = [label]
    for option in fields(policy):
        value = getattr(policy, option.name)
        if option.name not in NOT_NAMED and value != getattr(default, option.name):
            parts.append(f"{option.name}={_label(value)}")
    return " ".join(parts)


def _label(value: Any) -> str:
    """0.5 -> "0.5"; (0.5, 2.0) -> "0.5:2"; ("@code", "x") -> "@code|x". A float is shown whole where six
    significant digits are not it (0.1234567): two values named alike had been one strategy, the second
    dropped from the sweep and a resume at either taking the other's samples."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    if isinstance(value, tuple):
        numbers = all(isinstance(part, int | float) for part in value)
        return (":" if numbers else "|").join(_label(part) for part in value)
    return str(value)


@dataclass(frozen=True)
class Grid:
    """The values swept; each family takes the ones it uses."""

    taus: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # per policy; else its swept_taus
    windows: tuple[int | None, ...] = (None,)  # None: the policy's default
    min_runs: tuple[int, ...] = (10,)
    switch_points: tuple[SwitchPoint, ...] = ("before",)
    drafts: tuple[int, ...] = (4,)
    draft_stops: tuple[float | None, ...] = (None,)  # None: drafts run to full length
    lookups: tuple[int, ...] = (0,)  # prompt-lookup match lengths for ead's own loops (0: off)
    lookup_drafts: tuple[int, ...] = (16,)  # their guess lengths, with each match length above 0
    verifies: tuple[float | None, ...] = (None,)  # None: no check on catch-up
    bursts: tuple[Burst, ...] = (1,)
    patterns: tuple[str, ...] = ()  # gate: every strategy gets them all
    tau_range: tuple[float, float] | None = None  # ead and gate: adaptive tau for every strategy
    server_drafts: tuple[int, ...] = (3,)  # server-spec: llama.cpp's draft lengths (its default: 3)
    server_ngrams: tuple[str, ...] = ("ngram-mod",)  # server-ngram: --spec-type values

    def values(self, option: str) -> tuple[Any, ...]:
        """The values swept for a PolicyOptions field a policy names in its ``sweeps``."""
        return getattr(self, SWEPT[option])


# A PolicyOptions field a policy may sweep, and the Grid's values for it.
SWEPT = {
    "window": "windows",
    "min_run": "min_runs",
    "switch_point": "switch_points",
    "draft": "drafts",
    "verify": "verifies",
    "burst": "bursts",
}

Family = Callable[[Grid], list[PolicyOptions] | list[NativeOptions]]


def _policy_family(kind: PolicyKind) -> Family:
    """A policy at each of its thresholds times every option it sweeps; patterns for the policies that
    read text, the adaptive tau range for all."""

    def strategies(grid: Grid) -> list[PolicyOptions]:
        shared: dict[str, Any] = {"tau_range": grid.tau_range}
        if "patterns" in kind.text_options:
            shared["patterns"] = grid.patterns
        axes = [grid.values(option) for option in kind.sweeps]
        return [
            PolicyOptions("ead", kind.name, tau=tau, **dict(zip(kind.sweeps, values, strict=True)), **shared)
            for tau in grid.taus.get(kind.name) or kind.swept_taus
            for values in itertools.product(*axes)
        ]

    return strategies


def families() -> dict[str, Family]:
    """Strategy families by name, in the order they run: the lone models, each policy of the table (so a
    registered policy is swept without an edit here), speculative decoding, and llama.cpp's loops."""
    return {
        "small": lambda grid: [PolicyOptions(mode="small")],
        "large": lambda grid: [PolicyOptions(mode="large")],
        **{name: _policy_family(kind) for name, kind in POLICY_KINDS.items()},
        "spec": lambda grid: [
            PolicyOptions(mode="spec", draft=draft, draft_entropy_stop=stop)
            for draft, stop in itertools.product(grid.drafts, grid.draft_stops)
        ],
        "server-large": lambda grid: [NativeOptions("large")],
        "server-spec": lambda grid: [NativeOptions("spec", draft=draft) for draft in grid.server_drafts],
        "server-ngram": lambda grid: [NativeOptions("ngram", spec_type=name) for name in grid.server_ngrams],
        "server-stack": lambda grid: [
            NativeOptions("spec", draft=draft, spec_type=name)
            for draft, name in itertools.product(grid.server_drafts, grid.server_ngrams)
        ],
    }


def all_families() -> str:
    """The default sweep: ead's own loops (the server families need the built llama-server; name them)."""
    return ",".join(name for name in families() if not name.startswith("server-"))


def _parse_list(spec: str, option: str, convert: Callable[[str], Any], minimum: float) -> tuple[Any, ...]:
    values: list[Any] = []
    for part in spec.split(","):
        try:
            value = convert(part.strip())
        except ValueError:
            raise EadError(f"{option}: {quoted(part.strip())} is not a valid value", exit_code=2) from None
        if not (value >= minimum) or math.isinf(value):
            raise EadError(f"{option}: {part.strip()} is below {minimum:g} or not finite", exit_code=2)
        if value not in values:
            values.append(value)
    return tuple(values)


def parse_grid(
    taus: Mapping[str, str],
    window: str | None,
    min_run: str,
    switch_point: str,
    draft: str,
    draft_entropy_stop: str | None,
    verify: str | None = None,
    burst: str = "1",
    server_draft: str = "3",
    server_ngram: str = "ngram-mod",
    lookup: str = "0",
    lookup_draft: str = "16",
) -> Grid:
    """The sweep from comma-separated option values (``taus``: per policy name, its ``--NAME-tau``); any
    bad value is a one-line usage error."""
    points = tuple(dict.fromkeys(part.strip() for part in switch_point.split(",")))
    for point in points:
        if point not in SWITCH_POINTS:
            choices = ", ".join(SWITCH_POINTS)
            raise EadError(f"--switch-point: {quoted(point)} is not one of {choices}", exit_code=2)
    return Grid(
        taus={name: _parse_list(spec, f"--{name}-tau", float, 0) for name, spec in taus.items()},
        windows=(None,) if window is None else _swept(window, "window"),
        min_runs=_swept(min_run, "min_run"),
        switch_points=points,  # type: ignore[arg-type]
        drafts=_swept(draft, "draft"),
        draft_stops=(None,)
        if draft_entropy_stop is None
        else _swept(draft_entropy_stop, "draft_entropy_stop"),
        lookups=_swept(lookup, "lookup"),
        lookup_drafts=_swept(lookup_draft, "lookup_draft"),
        verifies=(None,) if verify is None else _parse_verify(verify),
        bursts=tuple(
            dict.fromkeys(
                part if part in BURST_KINDS else _parse_list(part, "--burst", int, 1)[0]
                for part in (piece.strip() for piece in burst.split(","))
            )
        ),
        server_drafts=_parse_server_drafts(server_draft),
        server_ngrams=_parse_server_ngrams(server_ngram),
    )


def _swept(spec: str, name: str) -> tuple[Any, ...]:
    """A swept option's values, held to the option table's lower bound."""
    option = OPTIONS[name]
    return _parse_list(spec, option.flag, option.kind, option.minimum or 0)


def _parse_server_drafts(spec: str) -> tuple[int, ...]:
    drafts = _parse_list(spec, "--server-draft", int, 1)
    for draft in drafts:
        check_server_draft(draft)
    return drafts


def _parse_server_ngrams(spec: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in spec.split(",")))
    for name in names:
        check_ngram_type(name)
    return names


def _parse_verify(spec: str) -> tuple[float | None, ...]:
    """Ratios in (0, 1]; "none" stands for no check, to compare with and without in one run."""
    parts = [part.strip() for part in spec.split(",")]
    ratios = [part for part in parts if part.lower() != "none"]
    values = _parse_list(",".join(ratios), "--verify", float, 0) if ratios else ()
    for value in values:
        if not 0 < value <= 1:
            raise EadError(f"--verify: {value:g} is not in (0, 1]", exit_code=2)
    return ((None,) if len(ratios) < len(parts) else ()) + values


def build_strategies(wanted_families: str, grid: Grid) -> list[Strategy]:
    """The strategies of the comma-separated families (in ``families()`` order), each named once; a swept
    option given (not at its default) that none of them takes is refused (``check_options_apply``)."""
    known = families()
    parts = [part.strip() for part in wanted_families.split(",") if part.strip()]
    wanted = [LONE_MODELS.get(name, name) for name in parts]  # large-only, as the report names it
    unknown = [name for name in wanted if name not in known]
    if not wanted:  # as ``ead bench speed`` says it
        raise EadError(f"--strategies: {quoted(wanted_families)} names no strategy", exit_code=2)
    if unknown:
        family = unknown[0].split()[0]
        if family in known:  # a swept strategy's name, copied from the report
            raise EadError(
                f"--strategies: {quoted(unknown[0])} is a strategy as the report names it: give its family, "
                f"{family}, and set its values by their options",
                exit_code=2,
            )
        raise EadError(f"--strategies: {quoted(unknown[0])} is not one of {', '.join(known)}", exit_code=2)
    strategies = _strategies(wanted, grid)
    check_options_apply(wanted_families, wanted, grid, strategies)
    return strategies


def _strategies(wanted: list[str], grid: Grid) -> list[Strategy]:
    """The strategies of these known families on ``grid``, each named once."""
    strategies: dict[str, Strategy] = {}
    for family, make in families().items():
        if family in wanted:
            for made in make(grid):
                # Prompt lookup applies to every loop of ead's own: each strategy once per match length
                # and guess length (lookup off: once).
                variants = (
                    [
                        replace(made, lookup=n, lookup_draft=d)
                        for n in grid.lookups
                        for d in (grid.lookup_drafts if n else (made.lookup_draft,))
                    ]
                    if isinstance(made, PolicyOptions)
                    else [made]
                )
                for policy in variants:
                    strategies.setdefault(strategy_name(policy), Strategy(strategy_name(policy), policy))
    return list(strategies.values())


# A Grid field and the option that sets it (each policy's thresholds: its --NAME-tau).
GRID_OPTIONS = {
    "windows": OPTIONS["window"].flag,
    "min_runs": OPTIONS["min_run"].flag,
    "switch_points": OPTIONS["switch_point"].flag,
    "drafts": OPTIONS["draft"].flag,
    "draft_stops": OPTIONS["draft_entropy_stop"].flag,
    "lookups": OPTIONS["lookup"].flag,
    "lookup_drafts": OPTIONS["lookup_draft"].flag,
    "verifies": OPTIONS["verify"].flag,
    "bursts": OPTIONS["burst"].flag,
    "patterns": OPTIONS["pattern"].flag,
    "tau_range": OPTIONS["tau_range"].flag,
    "server_drafts": "--server-draft",
    "server_ngrams": "--server-ngram",
}


def _given_options(grid: Grid) -> list[tuple[str, Grid]]:
    """Each swept option set away from its default: its flag, and the grid with it at its default."""
    default = Grid()
    given = [
        (f"--{name}-tau", replace(grid, taus={key: value for key, value in grid.taus.items() if key != name}))
        for name, taus in grid.taus.items()
        if name in POLICY_KINDS and tuple(taus) != POLICY_KINDS[name].swept_taus
    ]
    given += [
        (flag, replace(grid, **{name: getattr(default, name)}))
        for name, flag in GRID_OPTIONS.items()
        if getattr(grid, name) != getattr(default, name)
    ]
    return given


def check_options_apply(spec: str, wanted: list[str], grid: Grid, strategies: list[Strategy]) -> None:
    """A swept option given that changes none of the strategies is refused, naming the families it
    applies to: ``--strategies gate --window 3`` had run gate alone, the window dropped unsaid. Told by
    building the strategies again with the option at its default, so that a policy registered later and
    an option added to a family are checked without an edit here."""
    for flag, unset in _given_options(grid):
        if _strategies(wanted, unset) != strategies:
            continue
        takers = [
            family for family in families() if _strategies([family], unset) != _strategies([family], grid)
        ]
        where = f"it applies to {', '.join(takers)}" if takers else "nothing here takes it: see its --help"
        raise EadError(
            f"{flag} is given, but no strategy of --strategies {quoted(spec)} takes it ({where})", exit_code=2
        )

"""The policy table (``policies.POLICY_KINDS``): a new policy is one class and one ``register`` call, and
the options, the decoder, the bench's names and the docs' table follow from it.

``EveryNth`` below is the tiny example docs/switching.md points to: the large model writes every n-th
token, whatever the entropy (a threshold is still taken, as ``levels`` comes from it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import ead_cli
from ead_cli.bench.grid import Grid, all_families, build_strategies, families, parse_grid, strategy_name
from ead_cli.engine import build_decoder
from ead_cli.errors import EadError
from ead_cli.options import GenerationOptions, PolicyOptions
from ead_cli.policies import POLICY_KINDS, Policy, PolicyKind, Settings, defaults_by_policy, register
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner

SWITCHING = (Path(ead_cli.__file__).resolve().parent.parent / "docs" / "switching.md").read_text()


class EveryNth(Policy):
    """The large model writes tokens n, 2n, 3n, ... (counted from 1)."""

    def __init__(self, tau: tuple[float, ...], *, every: int) -> None:
        super().__init__(tau=tau)
        self.every = every
        self.written = 0

    def _step(self, entropy: float, evaluated: int) -> tuple[int, int]:
        self.written += 1
        return evaluated, 1 if (self.written + 1) % self.every == 0 else 0


@pytest.fixture
def every_third() -> Iterator[PolicyKind]:
    """The example registered for one test (the window option stands in for n)."""
    kind = register(
        PolicyKind("every-nth", "the large model writes every n-th token", tau=0.0, window=3,
                   build=lambda s: EveryNth(s.taus, every=s.window), sweeps=("window",))
    )  # fmt: skip
    yield kind
    del POLICY_KINDS[kind.name]


def test_a_registered_policy_is_built_checked_and_named(every_third: PolicyKind) -> None:
    options = PolicyOptions(policy="every-nth", window=4)
    policy = options.make_policy()
    assert isinstance(policy, EveryNth) and policy.every == 4
    assert strategy_name(options) == "every-nth window=4"
    with pytest.raises(EadError, match="--pattern and --burst apply to --policy gate"):
        PolicyOptions(policy="every-nth", burst=2)


def test_a_registered_policy_decodes(every_third: PolicyKind, runners: list[Runner]) -> None:
    decoder = build_decoder(runners, PolicyOptions(policy="every-nth"), GenerationOptions(max_tokens=9))
    models = [event.model for event in decoder.run(encode_prompt(runners[0], "Count to ten."))]
    assert len(models) == 9
    assert [i for i, model in enumerate(models, 1) if model == "large"] == [3, 6, 9]


def test_a_registered_policy_is_a_bench_family_swept_over_its_thresholds_and_options(
    every_third: PolicyKind,
) -> None:
    assert list(families())[2:6] == ["gate", "ead", "lookahead", "every-nth"]  # after the lone models
    assert "every-nth" in all_families().split(",")
    default = [s.name for s in build_strategies("every-nth", Grid())]
    assert default == ["every-nth tau=0"]  # its own tau, its own window
    grid = parse_grid({"every-nth": "0,0.5"}, "3,4", "10", "before", "4", None)
    strategies = build_strategies("every-nth", grid)
    assert [s.name for s in strategies] == [
        "every-nth tau=0 window=3",
        "every-nth tau=0 window=4",
        "every-nth tau=0.5 window=3",
        "every-nth tau=0.5 window=4",
    ]
    assert {type(s.policy.make_policy()) for s in strategies} == {EveryNth}


def test_an_unknown_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(EadError, match="policy must be one of gate, ead, lookahead, got 'nope'"):
        PolicyOptions(policy="nope")


def table_row(option: str) -> str:
    return next(line for line in SWITCHING.splitlines() if line.startswith(f"| `{option}"))


def test_the_switching_table_names_every_policy_and_its_defaults() -> None:
    choices = re.match(r"\| `--policy ([^`]*)`", table_row("--policy")).group(1)
    assert choices.split("\\|") == list(POLICY_KINDS)
    assert all(f"`{name}`" in table_row("--policy") for name in POLICY_KINDS)
    assert f"(default: {defaults_by_policy('tau')})" in table_row("--tau")
    assert f"(default: {defaults_by_policy('window')})" in table_row("--window")


def test_settings_carry_every_option_a_policy_can_read() -> None:
    """A policy's build sees what make_policy was given (the table's contract with new policies)."""
    seen: list[Settings] = []
    register(PolicyKind("spy", "records its settings", tau=2.0, window=7,
                        build=lambda s: seen.append(s) or EveryNth(s.taus, every=2)))  # fmt: skip
    try:
        PolicyOptions(policy="spy", min_run=3, switch_point="after", tau_range=(1.0, 3.0), draft=5)
    finally:
        del POLICY_KINDS["spy"]
    assert seen == [Settings((2.0,), 7, 3, 1, "after", (), (1.0, 3.0), 5)]  # checked when made

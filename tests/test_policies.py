"""Policies are pure state machines: every rule and edge case on hand-written entropy sequences."""

import pytest

from ead_cli.policies import EAD, Fixed, Gate, Policy, make_policy


def drive(policy: Policy, entropies: list[float]) -> tuple[list[int], list[int]]:
    """Feed entropies; return (writer of each step, model evaluated at each step)."""
    writers, evaluated = [], []
    for entropy in entropies:
        evaluated.append(policy.active)
        writers.append(policy.observe(entropy))
    return writers, evaluated


def test_fixed_never_switches() -> None:
    policy = Fixed(1, window=3)
    writers, evaluated = drive(policy, [0.0, 9.0, 3.0, 0.0])
    assert writers == evaluated == [1, 1, 1, 1]
    assert policy.rolling == pytest.approx(4.0)  # mean of the last 3


def test_ead_switch_after_waits_min_run_then_hands_over_on_the_next_token() -> None:
    policy = EAD(0.5, window=5, min_run=10, switch_point="after")
    writers, evaluated = drive(policy, [1.0] * 12)
    # c reaches 10 on the 10th step: that step is still written by the small model.
    assert writers == [0] * 10 + [1, 1]
    assert evaluated == [0] * 10 + [1, 1]


def test_ead_switch_before_lets_the_new_model_write_the_trigger_token() -> None:
    policy = EAD(0.5, window=5, min_run=10, switch_point="before")
    writers, evaluated = drive(policy, [1.0] * 12)
    assert writers == [0] * 9 + [1, 1, 1]
    assert evaluated == [0] * 10 + [1, 1]  # the small model was asked at step 10; its token was discarded


def test_ead_low_entropy_stays_small() -> None:
    policy = EAD(0.5, window=5, min_run=10)
    writers, _ = drive(policy, [0.49] * 40)
    assert set(writers) == {0}
    assert policy.active == 0


def test_ead_tie_goes_to_the_large_model() -> None:
    policy = EAD(0.5, window=1, min_run=0, switch_point="before")
    assert drive(policy, [0.5])[0] == [1]


def test_ead_uses_the_window_mean_not_the_last_value() -> None:
    # One spike of 2.4 among zeros: mean 0.48 < 0.5, no switch; a spike of 2.5 gives mean 0.5.
    policy = EAD(0.5, window=5, min_run=0, switch_point="before")
    assert drive(policy, [0.0, 0.0, 0.0, 0.0, 2.4]) == ([0] * 5, [0] * 5)
    policy = EAD(0.5, window=5, min_run=0, switch_point="before")
    assert drive(policy, [0.0, 0.0, 0.0, 0.0, 2.5])[0] == [0, 0, 0, 0, 1]


def test_ead_mean_before_the_window_fills_is_over_the_steps_seen() -> None:
    policy = EAD(0.5, window=5, min_run=0, switch_point="before")
    writers, _ = drive(policy, [1.0])
    assert writers == [1]
    assert policy.rolling == pytest.approx(1.0)


def test_ead_hysteresis_keeps_the_large_model_for_min_run_steps() -> None:
    policy = EAD(0.5, window=1, min_run=3, switch_point="after")
    # up at step 3 (c=3), then zeros: the large model keeps the pen 3 steps (c counts again from 0).
    writers, evaluated = drive(policy, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert evaluated == [0, 0, 0, 1, 1, 1, 0, 0]
    assert writers == evaluated


def test_ead_window_is_not_cleared_by_a_switch() -> None:
    policy = EAD(0.5, window=3, min_run=1, switch_point="after")
    drive(policy, [3.0])  # switch to large after step 1
    assert policy.active == 1
    drive(policy, [0.0, 0.0])
    # mean of [3, 0, 0] = 1.0 >= 0.5 at step 2, so still large; at step 3 the mean is 1.0 too.
    assert policy.active == 1
    drive(policy, [0.0])  # window [0, 0, 0]
    assert policy.active == 0


def test_gate_before_burst_one_the_large_model_writes_exactly_the_uncertain_token() -> None:
    policy = Gate(1.0, burst=1, switch_point="before")
    writers, evaluated = drive(policy, [0.2, 1.5, 0.3, 0.1, 2.0, 0.0])
    assert writers == [0, 1, 0, 0, 1, 0]
    assert evaluated == [0, 0, 0, 0, 0, 0]  # the large model is never asked for its own next token


def test_gate_after_the_small_model_writes_the_trigger_and_the_large_one_the_next() -> None:
    policy = Gate(1.0, burst=1, switch_point="after")
    writers, evaluated = drive(policy, [0.2, 1.5, 0.0, 0.3])
    assert writers == [0, 0, 1, 0]
    assert evaluated == [0, 0, 1, 0]


def test_gate_burst_ignores_the_large_models_entropy() -> None:
    policy = Gate(1.0, burst=3, switch_point="before")
    writers, _ = drive(policy, [1.2, 9.0, 0.0, 0.0, 0.0])
    assert writers == [1, 1, 1, 0, 0]


def test_gate_tie_triggers() -> None:
    assert drive(Gate(1.0), [1.0])[0] == [1]


def test_gate_with_a_window_smooths_the_trigger() -> None:
    policy = Gate(1.0, window=2, switch_point="before")
    writers, _ = drive(policy, [1.5, 0.0, 1.9, 0.2])
    # means: 1.5 (trigger), 0.75, 0.95, 1.05 (trigger)
    assert writers == [1, 0, 0, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fast"}, "mode must be one of"),
        ({"policy": "magic"}, "policy must be one of"),
        ({"tau": -0.1}, "tau must be at least 0"),
        ({"window": 0}, "window must be at least 1"),
        ({"policy": "ead", "min_run": -1}, "min-run must be at least 0"),
        ({"burst": 0}, "burst must be at least 1"),
        ({"switch_point": "during"}, "switch point must be"),
    ],
)
def test_make_policy_rejects_invalid_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(**kwargs)


def test_make_policy_defaults() -> None:
    gate = make_policy()
    assert isinstance(gate, Gate)
    assert (gate.tau, gate.burst, gate.switch_point, gate._window.maxlen) == (1.0, 1, "before", 1)
    ead = make_policy(policy="ead")
    assert isinstance(ead, EAD)
    assert (ead.tau, ead.min_run, ead._window.maxlen) == (0.5, 10, 5)
    small, large = make_policy(mode="small"), make_policy(mode="large")
    assert isinstance(small, Fixed) and small.active == 0
    assert isinstance(large, Fixed) and large.active == 1

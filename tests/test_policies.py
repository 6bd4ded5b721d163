"""Policies are pure state machines: every rule and edge case on hand-written entropy sequences."""

import pytest

from ead_cli.policies import EAD, AdaptiveTau, Fixed, Gate, Policy, make_policy


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


def test_gate_adaptive_burst_lasts_while_the_large_models_entropy_stays_high() -> None:
    policy = Gate(1.0, burst="adaptive", switch_point="before")
    writers, evaluated = drive(policy, [0.5, 2.0, 3.0, 1.0, 0.2, 0.3])
    # trigger at step 2 (large writes it), large unsure at 3 and 4 (tie stays), sure at 5: it writes
    # that token too (it was evaluated there), then the small model resumes.
    assert writers == [0, 1, 1, 1, 1, 0]
    assert evaluated == [0, 0, 1, 1, 1, 0]


def test_gate_adaptive_burst_after_starts_on_the_next_token() -> None:
    policy = Gate(1.0, burst="adaptive", switch_point="after")
    writers, evaluated = drive(policy, [2.0, 0.1, 0.1])
    assert writers == [0, 1, 0]
    assert evaluated == [0, 1, 0]


def see_each(policy: Policy, steps: list[tuple[float, str]]) -> list[int]:
    """Feed (entropy, text of the token written) pairs; return the writers."""
    writers = []
    for entropy, text in steps:
        writers.append(policy.observe(entropy))
        policy.see(text)
    return writers


def test_gate_line_burst_lasts_until_the_large_model_ends_the_line() -> None:
    policy = Gate(1.0, burst="line", switch_point="before")
    assert policy.wants_text
    writers = see_each(
        policy, [(0.1, "x ="), (2.0, " fib"), (0.0, "(n"), (5.0, ")\n"), (0.0, "y"), (1.5, "\n"), (0, "z")]
    )
    # the trigger token " fib" starts the burst; ")\n" ends it; "\n" as a trigger token ends its own burst
    assert writers == [0, 1, 1, 1, 0, 1, 0]


def test_patterns_hand_the_rest_of_the_line_to_the_large_model_whatever_the_entropy() -> None:
    policy = make_policy(tau=100.0, patterns=["@code"])
    steps = [
        (0.0, "import math\n"),
        (0.0, "def"),
        (0.0, " is"),
        (0.0, "_prime"),
        (0.0, "(n):\n"),
        (0.0, "    x"),
    ]
    writers = see_each(policy, steps)
    # "def is" completes the signature pattern: the large model writes "_prime" and "(n):\n"
    assert writers == [0, 0, 0, 1, 1, 0]
    assert policy.active == 0


def test_a_user_pattern_fires_where_it_completes_only() -> None:
    policy = Gate(100.0, patterns=[r"\bTODO"])
    writers = see_each(policy, [(0.0, "# TO"), (0.0, "DO"), (0.0, ": fix"), (0.0, "\n"), (0.0, "a")])
    assert writers == [0, 0, 1, 1, 0]


def test_adaptive_tau_moves_one_step_per_run_of_four_within_its_range() -> None:
    tau = AdaptiveTau(1.0, 0.5, 1.5)  # steps of 0.125
    for _ in range(4):
        tau.update(2.0)
    assert tau.value == pytest.approx(0.875)
    for _ in range(3):
        tau.update(0.0)
    assert tau.value == pytest.approx(0.875)  # a run of three moves nothing
    tau.update(0.0)
    assert tau.value == pytest.approx(1.0)
    for _ in range(100):
        tau.update(0.0)
    assert tau.value == 1.5
    for _ in range(100):
        tau.update(9.0)
    assert tau.value == 0.5


def test_a_policy_with_a_tau_range_reports_and_uses_the_moving_tau() -> None:
    policy = Gate(1.0, tau_range=(0.5, 1.5))
    writers, _ = drive(policy, [0.9] * 8 + [1.1])
    # eight confident steps lift tau to 1.25: 1.1 no longer triggers (it would at the fixed 1.0)
    assert policy.tau == pytest.approx(1.25)
    assert writers == [0] * 9
    assert make_policy(policy="ead", tau=0.5, tau_range=(0.25, 1.0)).tau == 0.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fast"}, "mode must be one of"),
        ({"policy": "magic"}, "policy must be one of"),
        ({"tau": -0.1}, "tau must be at least 0"),
        ({"window": 0}, "window must be at least 1"),
        ({"policy": "ead", "min_run": -1}, "min-run must be at least 0"),
        ({"burst": 0}, "burst must be a count of at least 1"),
        ({"switch_point": "during"}, "switch point must be"),
        ({"burst": "sometimes"}, "burst must be a count of at least 1, 'line' or 'adaptive'"),
        ({"patterns": ["(unclosed"]}, "pattern '\\(unclosed' is not a valid regular expression"),
        ({"policy": "ead", "patterns": ["def"]}, "--pattern and --burst apply to --policy gate"),
        ({"policy": "ead", "burst": "line"}, "--pattern and --burst apply to --policy gate"),
        ({"tau_range": (1.0, 0.5)}, "tau range must satisfy 0 <= low < high"),
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

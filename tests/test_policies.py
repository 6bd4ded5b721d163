"""Policies are pure state machines: every rule and edge case on hand-written entropy sequences."""

import itertools
import math
import random
from fractions import Fraction

import pytest

from ead_cli.policies import EAD, AdaptiveTau, ExactMean, Fixed, Gate, Lookahead, Policy, make_policy


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


def test_ead_tie_is_the_exact_mean_rounded_once() -> None:
    """0.2, 0.2 and 0.3 have the mean 0.23333333333333334 (the exact sum of the three floats, divided by 3,
    rounded once); summed correctly (fsum) and then divided, it rounds twice, to 0.2333333333333333, under
    that tau: the tie had gone to the small model."""
    tau = float(sum(map(Fraction, (0.2, 0.2, 0.3))) / 3)
    policy = EAD(tau, window=3, min_run=0, switch_point="before")
    assert drive(policy, [0.2, 0.2, 0.3])[0] == [0, 0, 1]
    assert policy.rolling == tau


@pytest.mark.parametrize("seed", range(20))
def test_exact_mean_is_the_exact_mean_of_the_window_rounded_once(seed: int) -> None:
    """Against the mean of the window's floats in exact fractions, step by step, values entering and
    leaving it, the last replaced now and then (amend), NaN and infinities ruling it only while in it."""
    rng = random.Random(seed)
    window = rng.randint(1, 9)
    exact, seen = ExactMean(maxlen=window), []
    specials = (math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1.7976931348623157e308)
    for _ in range(300):
        value = rng.choice(specials) if rng.random() < 0.1 else rng.uniform(0, 4) * rng.choice((1, 1e-300))
        if seen and rng.random() < 0.2:
            exact.replace_last(value)
            seen[-1] = value
        else:
            exact.append(value)
            seen.append(value)
        last = seen[-window:]
        if any(math.isnan(v) for v in last) or {math.inf, -math.inf} <= set(last):
            assert math.isnan(exact.value)
        elif math.inf in last or -math.inf in last:
            assert exact.value == (math.inf if math.inf in last else -math.inf)
        else:
            assert exact.value == float(sum(map(Fraction, last)) / len(last))
    exact.clear()
    assert (len(exact), exact.value) == (0, 0.0)


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
        ({"mode": "fast"}, "--mode must be one of"),
        ({"policy": "magic"}, "--policy must be one of"),
        ({"tau": -0.1}, "--tau must be at least 0"),
        ({"window": 0}, "--window must be at least 1"),
        ({"window": 2**63}, "--window must be at most 1048576 steps"),  # a C bound, not an OverflowError
        ({"policy": "ead", "min_run": -1}, "--min-run must be at least 0"),
        ({"burst": 0}, "--burst must be a count of at least 1"),
        ({"switch_point": "during"}, "--switch-point must be"),
        ({"burst": "sometimes"}, "--burst must be a count of at least 1, 'line' or 'adaptive'"),
        ({"patterns": ["(unclosed"]}, "pattern '\\(unclosed' is not a valid regular expression"),
        ({"patterns": [""]}, "pattern '' matches the empty text: it would hand every token to the large"),
        ({"patterns": ["def", "x*"]}, "pattern 'x\\*' matches the empty text"),
        ({"policy": "ead", "patterns": ["def"]}, "--pattern and --burst apply to --policy gate"),
        ({"policy": "ead", "burst": "line"}, "--pattern and --burst apply to --policy gate"),
        ({"tau_range": (1.0, 0.5)}, "--tau-range must satisfy 0 <= low < high"),
        ({"tau": (1.0, 2.0)}, "2 models take one threshold, got 2"),
        ({"tau": (1.0, 2.0, 3.0), "levels": 3}, "3 models take 2 thresholds"),
        ({"tau": (1.0, float("nan")), "levels": 3}, "--tau must be at least 0"),
        ({"levels": 1}, "switching takes at least two models"),
        ({"levels": 3, "switch_point": "after"}, "models gates with --switch-point before"),
        ({"levels": 3, "tau_range": (0.5, 1.5)}, "--tau-range takes two models"),
        ({"policy": "lookahead", "levels": 3}, "--policy lookahead takes two models"),
        ({"policy": "lookahead", "span": 0}, "--draft must be at least 1"),
        ({"policy": "lookahead", "burst": 2}, "--pattern and --burst apply to --policy gate"),
        ({"policy": "gate", "min_run": -1}, "--min-run must be at least 0"),  # checked though unused
        ({"mode": "large", "tau": -0.1}, "--tau must be at least 0"),
        ({"mode": "small", "window": 0}, "--window must be at least 1"),
        ({"mode": "large", "tau": (1.0, 2.0)}, "2 models take one threshold, got 2"),
        ({"mode": "spec", "burst": 0}, "--burst must be a count of at least 1"),
        ({"mode": "spec", "span": 0}, "--draft must be at least 1"),
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


def test_make_policy_for_a_cascade_repeats_one_tau_and_pins_the_top_for_large() -> None:
    gate = make_policy(tau=1.5, levels=3)
    assert isinstance(gate, Gate) and gate.levels == 3 and gate._taus == (1.5, 1.5)
    ead = make_policy(policy="ead", tau=(0.5, 1.0), levels=4 - 1)
    assert isinstance(ead, EAD) and ead._taus == (0.5, 1.0)
    assert make_policy(mode="large", levels=4).active == 3
    assert make_policy(mode="small", levels=4).active == 0


# ------------------------------------------------------------------------------------------- lookahead


def drive_lookahead(policy: Policy, entropies: list[float]) -> tuple[list[int], list[int]]:
    """Like ``drive``, but a token taken back is rewritten by the large model at the same position:
    returns (final writer per position, tokens taken back after each step)."""
    writers: list[int] = []
    taken: list[int] = []
    for entropy in entropies:
        writers.append(policy.observe(entropy))
        back = policy.take_back()
        taken.append(back)
        if back:
            del writers[-back:]
    return writers, taken


def test_lookahead_keeps_a_confident_draft_and_rewrites_an_uncertain_one() -> None:
    policy = Lookahead(1.0, span=3)
    # draft 1: mean 0.2 stands; draft 2: mean 4/3 is taken back, the large model writes 3, then a new draft
    writers, taken = drive_lookahead(policy, [0.2, 0.3, 0.1, 2.0, 2.0, 0.0, 5.0, 5.0, 5.0, 0.0])
    assert taken == [0, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    assert writers == [0, 0, 0, 1, 1, 1, 0]
    assert policy.active == 0 and policy.holding  # the next draft has one token and is open


def test_lookahead_lets_one_unsure_token_stand_when_confident_ones_follow() -> None:
    """Where the gate would call the large model at 3 bits, the lookahead sees the span's mean."""
    policy = Lookahead(1.0, span=4)
    writers, taken = drive_lookahead(policy, [3.0, 0.1, 0.1, 0.1])
    assert writers == [0, 0, 0, 0] and taken == [0, 0, 0, 0]
    assert policy.rolling == pytest.approx(0.825)
    assert not policy.holding


def test_lookahead_rewrites_a_draft_whose_mean_is_tau_however_its_sum_rounds() -> None:
    """The tie goes to the large model, as in the ead rule: 0.1 + 0.6 + 0.2 + 0.1 is 1 exactly, but summed
    as it came (each addition rounded down) it had been 0.9999999999999999, and the span stood."""
    policy = Lookahead(0.25, span=4)
    assert drive_lookahead(policy, [0.1, 0.6, 0.2, 0.1]) == ([], [0, 0, 0, 4])  # the span taken back
    assert policy.rolling == 0.25


def test_lookahead_holds_the_draft_until_it_is_decided() -> None:
    policy = Lookahead(1.0, span=3)
    holding = []
    for entropy in [0.0, 0.0, 0.0, 9.0, 9.0, 9.0]:
        policy.observe(entropy)
        holding.append(policy.holding)
        policy.take_back()
    # open, open, decided (stands: shown at once); open, open, taken back (held until the decoder asks)
    assert holding == [True, True, False, True, True, True]


def test_lookahead_decides_an_open_draft_early_when_the_answer_ends() -> None:
    policy = Lookahead(1.0, span=8)
    policy.observe(3.0)
    policy.observe(0.5)
    assert policy.take_back() == 0 and policy.holding
    assert policy.take_back(now=True) == 2 and policy.active == 1
    confident = Lookahead(1.0, span=8)
    confident.observe(0.5)
    assert confident.take_back(now=True) == 0 and not confident.holding and confident.active == 0


def test_other_policies_never_take_back_or_hold() -> None:
    for policy in (Gate(0.0), EAD(0.0, min_run=0), Fixed(0)):
        policy.observe(5.0)
        assert policy.take_back(now=True) == 0 and not policy.holding and not policy.escalating


# --------------------------------------------------------------------------------------------- cascade


def drive_cascade(policy: Policy, steps: list[list[float]]) -> tuple[list[int], list[list[int]]]:
    """Each step lists the entropies of the models asked in turn, as the decoder feeds a cascade.
    Returns (writer per step, models asked per step); fails if a step's list does not match the asks."""
    writers, asked = [], []
    for entropies in steps:
        models = [policy.active]
        writer = policy.observe(entropies[0])
        for entropy in entropies[1:]:
            assert policy.escalating
            models.append(writer)
            writer = policy.observe(entropy)
        assert not policy.escalating
        writers.append(writer)
        asked.append(models)
    return writers, asked


def test_gate_cascade_asks_each_level_up_until_one_is_sure() -> None:
    policy = Gate((1.0, 2.0))
    writers, asked = drive_cascade(policy, [[0.5], [1.5, 1.0], [1.5, 2.5], [0.2]])
    # sure small; unsure small, sure mid writes; unsure small and mid, the top writes unasked; sure small
    assert writers == [0, 1, 2, 0]
    assert asked == [[0], [0, 1], [0, 1], [0]]
    assert policy.rolling == pytest.approx(0.2)  # the window holds each step's first entropy only


def test_gate_cascade_bursts_stay_with_the_level_that_wrote() -> None:
    policy = Gate((1.0, 2.0, 3.0), burst=2)
    writers, asked = drive_cascade(policy, [[1.5, 2.5, 1.0], [9.0], [0.0]])
    assert writers == [2, 2, 0] and asked == [[0, 1, 2], [2], [0]]
    adaptive = Gate((1.0, 2.0), burst="adaptive")
    writers, _ = drive_cascade(adaptive, [[1.5, 0.5], [1.5], [0.9], [0.0]])
    # the mid model keeps the pen while its entropy stays at or above tau[0] = 1.0 (which called it)
    assert writers == [1, 1, 1, 0]


def test_ead_cascade_climbs_and_descends_one_level_at_a_time() -> None:
    policy = EAD((0.5, 1.5), window=1, min_run=0, switch_point="before")
    writers, evaluated = drive(policy, [1.0, 2.0, 2.0, 1.0, 0.2, 0.2])
    assert evaluated == [0, 1, 2, 2, 1, 0]
    assert writers == [1, 2, 2, 1, 0, 0]


def test_ead_with_one_tau_is_the_two_model_rule() -> None:
    entropies = [0.1, 0.9, 0.9, 0.9, 0.2, 0.1, 0.1, 0.8, 0.0, 0.0, 0.0, 0.9]
    one = drive(EAD(0.5, window=2, min_run=2), entropies)
    listed = drive(EAD((0.5,), window=2, min_run=2), entropies)
    assert one == listed and 1 in one[0] and 0 in one[0]


SETTLING = {
    "fixed": lambda: Fixed(0),
    "gate": lambda: Gate(1.0),
    "gate after, burst 3": lambda: Gate(1.0, burst=3, switch_point="after"),
    "gate adaptive burst": lambda: Gate(1.0, burst="adaptive"),
    "gate line burst": lambda: Gate(1.0, burst="line"),
    "gate adaptive tau": lambda: Gate(1.0, tau_range=(0.5, 2.0)),
    "gate cascade": lambda: Gate([1.0, 2.0]),
    "gate window 3": lambda: Gate(1.0, window=3),
    "ead": lambda: EAD(1.0, window=3, min_run=2),
}


@pytest.mark.parametrize("name", list(SETTLING))
def test_a_settled_step_decides_alike_for_any_entropy_in_its_range(name: str) -> None:
    """Where ``settled(low, high)`` says so, a policy fed ``low`` or ``high`` for a step whose entropy lies
    in [low, high] picks the same models at that step and at every later one as one fed the entropy."""
    rng = random.Random(name)
    exact, lows, highs = SETTLING[name](), SETTLING[name](), SETTLING[name]()
    settled_steps = 0
    for step in range(3000):
        entropy = rng.choice((0.0, 0.5, 0.99, 1.0, 1.01, 1.5, 2.0, 2.5, 4.0)) * rng.uniform(0.9, 1.1)
        low, high = max(0.0, entropy - rng.uniform(0, 1.5)), entropy + rng.uniform(0, 1.5)
        assert exact.active == lows.active == highs.active
        if lows.settled(low, high):
            assert highs.settled(low, high)
            settled_steps += 1
            picks = {exact.observe(entropy), lows.observe(low), highs.observe(high)}
        else:
            picks = {exact.observe(entropy), lows.observe(entropy), highs.observe(entropy)}
        assert len(picks) == 1, f"step {step}"
        assert exact.escalating == lows.escalating == highs.escalating
        while exact.escalating:  # a cascade's chained step: never settled, measured
            assert not lows.settled(0.0, 100.0)
            chained = rng.uniform(0.0, 3.0)
            assert len({exact.observe(chained), lows.observe(chained), highs.observe(chained)}) == 1
        if exact.wants_text:
            text = "\n" if step % 5 == 0 else "x"
            for policy in (exact, lows, highs):
                policy.see(text)
    if name in ("gate window 3", "ead"):
        assert settled_steps == 0  # a rolling mean over several steps reads the value itself
        assert not exact.may_settle
    else:
        assert settled_steps > 300
        assert exact.may_settle


def random_entropies(rng: random.Random, steps: int) -> list[float]:
    """Stretches of calm and of uncertain steps, with ties at the thresholds the tests below use."""
    entropies: list[float] = []
    while len(entropies) < steps:
        level = rng.choice((0.0, 0.2, 0.5, 1.0, 2.0, 4.0))
        entropies += [level * rng.choice((0.5, 1.0, 1.0, 1.5)) for _ in range(rng.randint(1, 15))]
    return entropies[:steps]


def mean_of_last(seen: list[float], window: int) -> float:
    """The mean of the last ``window`` values (of all, before as many), correctly rounded: a tie with tau
    must be a tie whatever entropies went through the window before."""
    last = seen[-window:]
    return float(sum(map(Fraction, last)) / len(last))


def runs(writers: list[int]) -> list[int]:
    """The lengths of the stretches one model writes without a break."""
    return [len(list(stretch)) for _, stretch in itertools.groupby(writers)]


@pytest.mark.parametrize("seed", range(40))
def test_ead_follows_the_documented_rule_on_random_entropies(seed: int) -> None:
    """docs/switching.md's rule, restated plainly and run beside the policy: the mean H of the last w
    entropies (of the steps seen, before w) and c, the steps since the last switch (from 0 on the small
    model): large if H >= tau and c >= d_min, small if H < tau and c >= d_min, else keep; 'before': the
    model switched to writes the trigger token, 'after': from the next one."""
    rng = random.Random(seed)
    tau, window, min_run = rng.choice((0.2, 0.5, 1.0, 2.0)), rng.randint(1, 8), rng.randint(0, 12)
    switch_point = rng.choice(("before", "after"))
    policy = EAD(tau, window=window, min_run=min_run, switch_point=switch_point)
    entropies = random_entropies(rng, 300)
    model, since_switch, seen = 0, 0, []
    for step, entropy in enumerate(entropies):
        seen.append(entropy)
        mean = mean_of_last(seen, window)
        since_switch += 1
        wanted = 1 if mean >= tau else 0
        writer = model
        if wanted != model and since_switch >= min_run:
            model, since_switch = wanted, 0
            writer = model if switch_point == "before" else writer
        assert policy.observe(entropy) == writer, f"step {step}"
        assert policy.active == model, f"step {step}"
        assert policy.rolling == mean


@pytest.mark.parametrize("seed", range(40))
def test_ead_a_model_keeps_the_pen_at_least_min_run_tokens(seed: int) -> None:
    """d_min, whatever the entropies: every stretch between two switches holds at least --min-run tokens
    (at least one); the first may be one shorter with 'before', whose switch token is the new model's."""
    rng = random.Random(seed)
    min_run, switch_point = rng.randint(0, 12), rng.choice(("before", "after"))
    policy = EAD(rng.choice((0.5, 1.0)), window=rng.randint(1, 6), min_run=min_run, switch_point=switch_point)
    writers, _ = drive(policy, random_entropies(rng, 400))
    lengths = runs(writers)
    assert len(lengths) > 2, "the entropies should make the policy switch back and forth"
    assert min(lengths[1:-1]) >= max(min_run, 1)
    assert lengths[0] >= min_run - (switch_point == "before")


@pytest.mark.parametrize(
    "make",
    [lambda w: EAD(1.0, window=w, min_run=3), lambda w: Gate(1.0, window=w), lambda w: Fixed(1, window=w)],
)
@pytest.mark.parametrize("window", [1, 2, 5, 17])
def test_rolling_is_the_mean_of_the_last_window_entropies(make, window: int) -> None:
    """--window: the rolling mean (what the policy compares and JSON lines show as ``rolling``) is over
    the last w entropies observed, or every one seen before w, whichever model gave them."""
    rng = random.Random(window)
    policy, seen = make(window), []
    for entropy in random_entropies(rng, 200):
        policy.observe(entropy)
        seen.append(entropy)
        assert policy.rolling == mean_of_last(seen, window)


@pytest.mark.parametrize("seed", range(20))
def test_gate_bursts_of_n_start_at_a_sure_small_step_and_last_n_tokens(seed: int) -> None:
    """--burst N (window 1): the large model writes exactly where the small model's entropy reached tau
    ('before': that token and the N - 1 after it; 'after': the N after it), whatever its own entropies."""
    rng = random.Random(seed)
    burst, switch_point = rng.randint(1, 5), rng.choice(("before", "after"))
    policy = Gate(1.0, burst=burst, switch_point=switch_point)
    writers, _ = drive(policy, entropies := random_entropies(rng, 300))
    expected, left = [], 0
    for entropy in entropies:
        if left:
            expected.append(1)
            left -= 1
        elif entropy >= 1.0:
            expected.append(1 if switch_point == "before" else 0)
            left = burst - 1 if switch_point == "before" else burst
        else:
            expected.append(0)
    assert writers == expected
    assert 1 in writers and 0 in writers

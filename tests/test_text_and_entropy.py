"""Entropy from raw logits, and the incremental text stream (UTF-8 across tokens, stop strings)."""

import math
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from tiny_models import open_pair

from ead_cli.decoder import Decoder, TokenEvent
from ead_cli.depth.readout import entropy_bits as float64_entropy_bits
from ead_cli.entropy import (
    FLOOR_SAMPLE,
    HEAD_LIMIT,
    EntropyMeter,
    entropy_bits,
    entropy_floor_bits,
    max_entropy_bits,
)
from ead_cli.policies import EAD, Gate, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams
from ead_cli.text import TextStream

N_VOCAB = 151936  # Qwen2.5's vocabulary: the rows the loop meters at every token


def test_uniform_logits_have_log2_v_bits() -> None:
    assert entropy_bits(np.zeros(151936, dtype=np.float32)) == pytest.approx(math.log2(151936), rel=1e-5)
    assert max_entropy_bits(256) == 8.0


def test_entropy_matches_the_definition_and_ignores_shifts() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    p = np.exp(logits) / np.exp(logits).sum()
    expected = float(-(p * np.log2(p)).sum())
    assert entropy_bits(logits) == pytest.approx(expected, rel=1e-6)
    assert entropy_bits(logits + 1000.0) == pytest.approx(expected, rel=1e-5)


def test_a_meter_reused_on_many_rows_matches_float64_on_each() -> None:
    rng = np.random.default_rng(0)
    meter = EntropyMeter(151936)
    for scale in (0.1, 3.0, 30.0):  # near-uniform, typical, near-certain
        logits = (rng.standard_normal(151936) * scale).astype(np.float32)
        z = logits.astype(np.float64) - logits.max()
        p = np.exp(z) / np.exp(z).sum()
        expected = float(-(p[p > 0] * np.log2(p[p > 0])).sum())
        assert meter(logits) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_a_certain_distribution_has_zero_entropy_even_with_huge_logits() -> None:
    logits = np.full(1000, -1e4, dtype=np.float32)
    logits[7] = 1e4
    assert entropy_bits(logits) == pytest.approx(0.0, abs=1e-6)


def adversarial_rows() -> dict[str, np.ndarray]:
    """Rows that break naive formulas: ties at the top, banned (-inf) tokens, ranges far beyond exp's,
    a spike over a flat floor, subnormal spreads."""
    rng = np.random.default_rng(7)
    typical = (rng.standard_normal(N_VOCAB) * 2.5).astype(np.float32)  # the 0.5B's spread
    rows = {"typical": typical, "uniform": np.zeros(N_VOCAB, dtype=np.float32)}
    rows["two tied tops"] = np.full(N_VOCAB, -30.0, dtype=np.float32)
    rows["two tied tops"][[3, N_VOCAB - 1]] = 12.0
    rows["banned tokens"] = typical.copy()
    rows["banned tokens"][::3] = -np.inf
    rows["huge range"] = (rng.standard_normal(N_VOCAB) * 1e30).astype(np.float32)
    rows["shifted far up"] = typical + np.float32(1e6)
    rows["spike over a flat floor"] = np.full(N_VOCAB, -1e4, dtype=np.float32)
    rows["spike over a flat floor"][42] = 1e4
    rows["subnormal spread"] = (rng.standard_normal(N_VOCAB) * 1e-40).astype(np.float32)
    return rows


@pytest.mark.parametrize("name", list(adversarial_rows()))
def test_the_meter_matches_float64_on_adversarial_rows(name: str) -> None:
    row = adversarial_rows()[name]
    meter = EntropyMeter(N_VOCAB)
    assert meter(row) == pytest.approx(float(float64_entropy_bits(row)[0]), abs=1e-4)
    assert meter(row) == meter(row.copy())  # the scratch rows carry nothing from one call to the next


def test_infinite_and_nan_logits_have_their_limits() -> None:
    meter = EntropyMeter(4)
    inf = np.inf
    assert meter(np.array([1.0, inf, inf, 0.0], dtype=np.float32)) == 1.0  # two certain tokens: one bit
    assert meter(np.array([5.0, -inf, -inf, -inf], dtype=np.float32)) == 0.0
    assert math.isnan(meter(np.array([1.0, np.nan, 0.0, 2.0], dtype=np.float32)))
    assert math.isnan(meter(np.full(4, -inf, dtype=np.float32)))


def test_the_meter_matches_float64_on_the_real_models_rows(real_pair: tuple) -> None:
    """Every row the 0.5B and the 1.5B predict along a greedy answer: within 1e-4 bits."""
    worst = 0.0
    for path in real_pair:
        with Runner(path, name="model", n_ctx=512, n_threads=1) as runner:
            tokens = encode_prompt(runner, "Write a Python function that checks whether a number is prime.")
            prompt_len = len(tokens)
            for _ in range(24):
                row = runner.sync(tokens, prompt_len=prompt_len, own_tail=True)
                worst = max(worst, abs(runner.entropy(row) - float(float64_entropy_bits(row)[0])))
                tokens.append(int(np.argmax(row)))
    assert worst < 1e-4


@pytest.mark.parametrize("name", sorted(adversarial_rows()))
def test_a_max_handed_over_gives_the_same_entropy_to_the_bit(name: str) -> None:
    row = adversarial_rows()[name]
    meter = EntropyMeter(row.shape[0])
    alone = meter(row)
    assert meter(row, row[int(row.argmax())]) == alone  # the decoder hands a greedy step's argmax over


def peaked_rows() -> dict[str, np.ndarray]:
    """Rows shaped like a real model's: a few logits near the top, thousands within 20 nats, the rest far."""
    rng = np.random.default_rng(11)
    rows = {}
    for name, spread, spikes, lift in (
        ("sure", 2.5, 1, 30.0),
        ("two-way", 2.5, 2, 27.0),
        ("0.5B-like", 2.5, 20, 25.0),  # ~3,000 logits within 20 nats of the top, as the 0.5B's median row
        ("unsure", 2.5, 40, 14.0),  # most of the row within 20 nats: no head bounds, the exact pass
    ):
        row = (rng.standard_normal(N_VOCAB) * spread).astype(np.float32)
        row[rng.choice(N_VOCAB, spikes, replace=False)] = lift - rng.exponential(1.0, spikes)
        rows[name] = row
    return rows


@pytest.mark.parametrize("name", sorted(adversarial_rows()) + sorted(peaked_rows()))
def test_the_entropy_floor_never_exceeds_the_entropy(name: str) -> None:
    row = {**peaked_rows(), **adversarial_rows()}[name]
    floor = entropy_floor_bits(row, row.max())
    assert 0.0 <= floor <= max_entropy_bits(row.shape[0])
    exact = float64_meter(row)
    assert math.isnan(exact) or floor <= exact + 1e-9
    if name in peaked_rows() or name in ("typical", "banned tokens", "huge range", "spike over a flat floor"):
        assert floor == 0.0  # a real model's spread (or a -inf logit in the sample): no floor


@pytest.mark.parametrize("name", sorted(peaked_rows()) + sorted(adversarial_rows()))
def test_head_bounds_hold_the_entropy(name: str) -> None:
    row = {**peaked_rows(), **adversarial_rows()}[name]
    bounds = EntropyMeter(N_VOCAB).head_bounds(row, row.max())
    exact = float64_meter(row)
    if bounds is None:  # too many logits near the top (or a top that is not finite): the exact pass
        assert name == "unsure" or name in adversarial_rows()
        return
    low, high = bounds
    assert low - 1e-9 <= exact <= high + 1e-9
    if name in peaked_rows():
        assert np.count_nonzero(row > row.max() - 20) <= HEAD_LIMIT
        assert high - low < 0.05  # tight enough to settle all but near-ties


@pytest.mark.parametrize("name", sorted(peaked_rows()) + sorted(adversarial_rows()))
def test_settle_offers_only_ranges_that_hold_the_meters_own_value(name: str) -> None:
    """The ranges ``settle`` asks about hold the exact pass's float32 value (widened by its tolerance),
    so a decision settled on them is the decision that value would give."""
    row = {**peaked_rows(), **adversarial_rows()}[name]
    meter = EntropyMeter(N_VOCAB)
    own = meter(row)
    offered: list[tuple[float, float]] = []
    assert meter.settle(row, row.max(), lambda low, high: bool(offered.append((low, high)))) is None
    assert offered  # the floor at least, on every row with a finite top
    assert all(low <= own <= high for low, high in offered)
    low, high = offered[-1]
    assert meter.settle(row, row.max(), lambda a, b: (a, b) == (low, high)) == low


def test_the_entropy_floor_is_tight_on_a_narrow_row_and_empty_on_a_wide_one() -> None:
    """It reads the row's first FLOOR_SAMPLE logits: at most log2 of that, and within the sample's
    spread of it (its mean lies no further under the top)."""
    rng = np.random.default_rng(3)
    uniform = np.zeros(N_VOCAB, dtype=np.float32)
    assert entropy_floor_bits(uniform, 0.0) == pytest.approx(math.log2(FLOOR_SAMPLE))
    assert entropy_floor_bits(uniform[:300], 0.0) == pytest.approx(math.log2(300))  # a short row: all of it
    for spread in (0.05, 0.5, 2.0, 8.0, 40.0):  # a random twin's rows are narrow, a real model's wide
        row = (rng.uniform(-spread, 0.0, N_VOCAB)).astype(np.float32)
        floor, exact = entropy_floor_bits(row, row.max()), float64_meter(row)
        assert floor <= exact + 1e-9
        assert floor >= min(max(math.log2(FLOOR_SAMPLE) - spread / math.log(2), 0.0), 12.0) - 1e-6
        assert floor <= max(math.log2(FLOOR_SAMPLE) - spread / 2 / math.log(2) + 0.1, 0.0)  # mean: mid-spread
    twin_like = (rng.standard_normal(N_VOCAB) * 0.3).astype(np.float32)  # a twin's rows: ~17.2 bits
    assert 9.0 < entropy_floor_bits(twin_like, twin_like.max()) < float64_meter(twin_like)
    banned = uniform.copy()
    banned[7] = -math.inf
    assert entropy_floor_bits(banned, 0.0) == 0.0
    outside = uniform.copy()
    outside[FLOOR_SAMPLE + 7] = -math.inf  # past the sample: not read
    assert entropy_floor_bits(outside, 0.0) == entropy_floor_bits(uniform, 0.0) <= float64_meter(outside)
    assert entropy_floor_bits(uniform, math.nan) == 0.0


def float64_meter(row: np.ndarray) -> float:
    return float(float64_entropy_bits(row)[0])


def answer(paths: tuple[Path, Path], policy: Policy, reference: bool, temp: float) -> list[TokenEvent]:
    """The tiny pair's events, each runner metering entropy its own way or by the float64 reference."""
    runners = open_pair(paths)
    try:
        if reference:
            for runner in runners:
                runner.entropy = float64_meter
        prompt = encode_prompt(runners[0], "Write a haiku about the sea")
        sampling = SamplingParams(temp=temp, seed=3)
        decoder = Decoder(runners, ("small", "large"), policy, sampling, max_tokens=96)
        return list(decoder.run(prompt))
    finally:
        for runner in runners:
            runner.close()


@pytest.mark.parametrize("temp", [0.0, 0.8])
@pytest.mark.parametrize("make_policy", [lambda: Gate(3.0), lambda: EAD(2.5, window=3, min_run=2)])
def test_the_loop_writes_and_switches_as_with_float64_entropy(
    tiny_pair: tuple[Path, Path], make_policy: Callable[[], Policy], temp: float
) -> None:
    ours = answer(tiny_pair, make_policy(), reference=False, temp=temp)
    exact = answer(tiny_pair, make_policy(), reference=True, temp=temp)
    assert [(e.token, e.model, e.text) for e in ours] == [(e.token, e.model, e.text) for e in exact]
    assert [e.entropy for e in ours] == pytest.approx([e.entropy for e in exact], abs=1e-4)
    assert {e.model for e in ours} == {"small", "large"}  # the decisions were live both ways


def test_a_character_split_over_tokens_is_printed_whole() -> None:
    stream = TextStream()
    data = "é日".encode()  # c3 a9 e6 97 a5
    pieces = [stream.push(data[i : i + 1]) for i in range(len(data))]
    assert pieces == ["", "é", "", "", "日"]


def test_an_unfinished_character_at_the_end_becomes_a_replacement() -> None:
    stream = TextStream()
    assert stream.push(b"a\xe6\x97") == "a"
    assert stream.flush() == "\ufffd"


def test_a_stop_string_split_across_tokens_is_never_printed() -> None:
    stream = TextStream(["\n\n###"])
    out = [stream.push(b) for b in [b"def f():", b"\n", b"\n#", b"##", b" more"]]
    assert "".join(out) == "def f():"
    assert stream.stopped
    assert stream.flush() == ""


def test_the_earliest_of_several_stop_strings_in_one_token_ends_the_text() -> None:
    """A token that brings two stop strings at once (``xon`` with --stop n --stop o) ends before the
    first of them in the text, whatever their order on the command line: 'o' was printed."""
    for stops in (["n", "o"], ["o", "n"], ["on", "o"], ["xo", "on"]):
        stream = TextStream(stops)
        assert stream.push(b"xon") == ("" if "xo" in stops else "x"), stops
        assert stream.stopped


def test_text_that_only_looked_like_a_stop_string_is_released() -> None:
    stream = TextStream(["END"])
    assert stream.push(b"the EN") == "the "
    assert stream.push(b"D") == ""
    assert stream.stopped
    stream = TextStream(["END"])
    assert stream.push(b"the EN") == "the "
    assert stream.push(b"ough") == "ENough"
    assert not stream.stopped


def test_held_back_text_is_flushed_at_the_end() -> None:
    stream = TextStream(["STOP"])
    assert stream.push(b"go ST") == "go "
    assert stream.flush() == "ST"


def test_the_kept_logits_view_follows_llama_cpps_row(runners: list[Runner]) -> None:
    """A batch with several rows of logits moves the last row; the runner's view must move with it."""
    runner = runners[0]
    tokens = encode_prompt(runner, "Write a haiku about the sea")

    def fresh() -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(runner.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(runner.n_vocab,)).copy()

    row = runner.sync(tokens, prompt_len=len(tokens), own_tail=False)
    assert np.array_equal(row, fresh())
    rows = runner.verify([*tokens, 5, 6, 7], prompt_len=len(tokens), rows=4)
    assert np.array_equal(runner.logits(), rows[-1])
    assert np.array_equal(runner.logits(), fresh())
    row = runner.sync([*tokens, 5, 6, 7, int(np.argmax(rows[-1]))], prompt_len=len(tokens), own_tail=True)
    assert np.array_equal(row, fresh())


def test_a_line_less_indented_than_min_indent_ends_the_text_at_its_first_character() -> None:
    """llama-server's n_indent: the first line is never judged; a later one that starts with fewer
    blanks (spaces and tabs, one each) is cut after its blanks, a blank line too, and the text ends
    there as cut short (llama-server's stop_type "limit"), not by a stop string."""
    stream = TextStream(min_indent=4)
    pieces = [stream.push(b) for b in [b"x = 1", b"\n    y = 2\n\t", b"  ", b"z", b" = 3", b"\n"]]
    assert "".join(pieces) == "x = 1\n    y = 2\n\t  " and stream.stopped and stream.cut_short
    for text, kept in [("a\n    \n    b\nc", "a\n    \n    b\n"), ("a\n\n    b", "a\n"), ("a\n\tb", "a\n\t")]:
        stream = TextStream(min_indent=4)
        assert stream.push(text.encode()) == kept and stream.cut_short, text
    stream = TextStream(["b"], min_indent=4)
    assert stream.push(b"a\n  b") == "a\n  " and stream.stopped and not stream.cut_short  # the stop string
    stream = TextStream(min_indent=4)
    assert stream.push(b"  a\n    b\n        c") == "  a\n    b\n        c" and not stream.stopped

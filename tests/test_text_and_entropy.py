"""Entropy from raw logits, and the incremental text stream (UTF-8 across tokens, stop strings)."""

import math

import numpy as np
import pytest

from ead_cli.entropy import EntropyMeter, entropy_bits, max_entropy_bits
from ead_cli.text import TextStream


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

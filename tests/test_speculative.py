"""Speculative decoding over the shared runners: lossless under greedy, caches rolled back exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_decoder import PROMPT

from ead_cli.decoder import Decoder, SpeculativeDecoder
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams, probabilities


def run(decoder: Decoder | SpeculativeDecoder, runners: list[Runner]) -> list[int]:
    return [event.token for event in decoder.run(encode_prompt(runners[0], PROMPT))]


@pytest.mark.parametrize("draft", [1, 3, 8])
def test_greedy_speculative_text_is_the_large_models_own(runners: list[Runner], draft: int) -> None:
    large_only = run(Decoder(runners, ("small", "large"), Fixed(1), SamplingParams(), max_tokens=60), runners)
    for runner in runners:
        runner.truncate(0)  # read from scratch: the prefill counts below are the whole prompt's
    spec = SpeculativeDecoder(runners, ("small", "large"), SamplingParams(), draft=draft, max_tokens=60)
    assert run(spec, runners) == large_only
    summary = spec.summary()
    assert summary.generated == 60
    assert summary.drafted > 0
    assert summary.acceptance_rate is not None and 0.0 <= summary.acceptance_rate <= 1.0
    small, large = summary.models
    assert small.written + large.written == 60
    prompt = len(encode_prompt(runners[0], PROMPT))  # the large model's first read checks a draft too
    assert small.prefill_tokens == large.prefill_tokens == summary.prompt_tokens == prompt
    # The large model writes one token per verification round; the small model the accepted drafts.
    assert small.written == round(summary.acceptance_rate * summary.drafted)


def test_rollback_leaves_both_caches_as_a_fresh_read(
    runners: list[Runner], tiny_pair: tuple[Path, Path]
) -> None:
    spec = SpeculativeDecoder(runners, ("small", "large"), SamplingParams(), draft=5, max_tokens=50)
    prompt = encode_prompt(runners[0], PROMPT)
    tokens = prompt + [event.token for event in spec.run(prompt)]
    assert spec.summary().acceptance_rate < 1.0  # some drafts were rejected and rolled back
    for runner, path in zip(runners, tiny_pair, strict=True):
        mine = runner.sync(tokens, prompt_len=len(prompt), own_tail=False).copy()
        with Runner(path, name="fresh", n_ctx=512, n_threads=1) as fresh:
            expected = fresh.sync(tokens, prompt_len=len(prompt), own_tail=False)
            np.testing.assert_allclose(mine, expected, rtol=0, atol=0.01)


def test_an_entropy_stop_shortens_drafts(runners: list[Runner]) -> None:
    full = SpeculativeDecoder(runners, ("small", "large"), SamplingParams(), draft=8, max_tokens=60)
    large_only = run(full, runners)
    stopped = SpeculativeDecoder(
        runners, ("small", "large"), SamplingParams(), draft=8, entropy_stop=2.0, max_tokens=60
    )
    assert run(stopped, runners) == large_only
    assert stopped.summary().drafted < full.summary().drafted


def test_sampled_speculative_decoding_is_reproducible(runners: list[Runner]) -> None:
    params = SamplingParams(temp=0.8, seed=3)
    first = run(SpeculativeDecoder(runners, ("small", "large"), params, draft=4, max_tokens=40), runners)
    again = run(SpeculativeDecoder(runners, ("small", "large"), params, draft=4, max_tokens=40), runners)
    assert first == again


def test_probabilities_follow_the_sampler_chain_order() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    greedy = probabilities(logits, SamplingParams(temp=0))
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0]
    # top-p 0.8 keeps {0.5, 0.3}; min-p 0.05 keeps both; temperature 1 renormalises them.
    kept = probabilities(logits, SamplingParams(temp=1.0, top_k=0, top_p=0.8, min_p=0.0))
    np.testing.assert_allclose(kept, [0.625, 0.375, 0.0, 0.0], rtol=1e-6)
    # min-p 0.5 drops tokens under half the top probability: only 0.5 and 0.3 stay of the top-3.
    kept = probabilities(logits, SamplingParams(temp=1.0, top_k=3, top_p=1.0, min_p=0.5))
    np.testing.assert_allclose(kept, [0.625, 0.375, 0.0, 0.0], rtol=1e-6)
    # temperature 0.5 sharpens what top-k 2 kept: p ∝ q^2.
    kept = probabilities(logits, SamplingParams(temp=0.5, top_k=2, top_p=1.0, min_p=0.0))
    np.testing.assert_allclose(kept, [0.25 / 0.34, 0.09 / 0.34, 0.0, 0.0], rtol=1e-5)


@pytest.mark.parametrize(("draft", "lookup"), [(16, 0), (1, 1)])
def test_a_draft_longer_than_a_batch_is_cut_to_what_one_batch_checks(
    tiny_pair: tuple[Path, Path], draft: int, lookup: int
) -> None:
    """Batches of 8 tokens (--ctx 16 makes them 16): the large model's rows for a draft come from one
    llama.cpp batch, as each batch overwrites the last one's logits; a draft of 16 tokens (or a lookup
    guess of up to 64) had been judged by rows of other positions."""
    runners = [
        Runner(path, name=role, n_ctx=256, n_threads=1, n_batch=8)
        for path, role in zip(tiny_pair, ("small", "large"), strict=True)
    ]
    try:
        large_only = run(
            Decoder(runners, ("small", "large"), Fixed(1), SamplingParams(), max_tokens=80), runners
        )
        spec = SpeculativeDecoder(
            runners,
            ("small", "large"),
            SamplingParams(),
            draft=draft,
            max_tokens=80,
            lookup=lookup,
            lookup_draft=64,
        )
        assert run(spec, runners) == large_only
        summary = spec.summary()
        assert (summary.looked_up if lookup else summary.drafted) > 0
        with pytest.raises(ValueError, match="9 rows of logits do not fit one batch of 8 tokens"):
            runners[1].verify(list(range(20)), prompt_len=10, rows=9)
    finally:
        for runner in runners:
            runner.close()

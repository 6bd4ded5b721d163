"""Prompt-lookup drafts: the pure proposal on hand-written sequences, and the lossless loop that checks
them with the large model (the text stays the large model's own; sampled, the token law stays p)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_decoder import PROMPT
from tiny_models import MIDDLE_ENTROPY_BITS

from ead_cli.decoder import Decoder, SpeculativeDecoder
from ead_cli.lookup import MAX_MATCH, propose
from ead_cli.policies import EAD, Fixed, Gate
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner, common_prefix
from ead_cli.sampling import SamplingParams, probabilities


def test_the_tokens_after_the_latest_earlier_occurrence_of_the_suffix_are_proposed() -> None:
    #          0  1  2  3  4  5  6  7  8  9
    sequence = [5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 7]
    assert propose(sequence, min_match=3, limit=2) == [2, 5]  # the latest occurrence (at 4), not the first
    assert propose(sequence, min_match=3, limit=10) == [2, 5, 6, 7]  # up to the end of the history
    assert propose([1, 2, 3, 9, 9, 9, 2, 3], min_match=1, limit=3) == [9, 9, 9]  # "2 3" matched before "3"


def test_longer_matches_win_over_more_recent_shorter_ones() -> None:
    sequence = [1, 2, 3, 4, 8, 3, 4, 9, 1, 2, 3, 4]
    # "1 2 3 4" occurred at 0 (followed by 8); "3 4" alone occurred later at 5 (followed by 9).
    assert propose(sequence, min_match=2, limit=1) == [8]


def test_no_match_is_sought_longer_than_the_maximum() -> None:
    sequence = [*range(9), 50, *range(1, 9), 60, *range(9)]
    # All 9 tokens of the suffix occurred at 0 (followed by 50); its last MAX_MATCH (8) also later at 10.
    assert MAX_MATCH == 8
    assert propose(sequence, min_match=2, limit=1) == [60]


def test_a_minimum_match_longer_than_the_default_maximum_still_proposes() -> None:
    sequence = [*range(12), 99, *range(12)]  # a 12-token run seen before, then 99
    assert propose(sequence, min_match=12, limit=1) == [99]
    assert propose(sequence, min_match=13, limit=1) == []


def test_no_proposal_without_a_long_enough_earlier_match() -> None:
    assert propose([1, 2, 3, 4, 5], min_match=1, limit=4) == []
    assert propose([1, 2, 9, 1, 2], min_match=3, limit=4) == []  # "1 2" occurred, but 3 tokens are asked
    assert propose([7], min_match=1, limit=4) == []
    assert propose([], min_match=1, limit=4) == []
    assert propose([1, 1, 1], min_match=0, limit=4) == []  # 0: lookup is off
    assert propose([1, 2, 1, 2], min_match=1, limit=0) == []


def test_a_run_of_one_token_proposes_its_continuation() -> None:
    assert propose([4, 4, 4, 4], min_match=2, limit=3) == [4]  # "4 4 4" at 0 is followed by one 4


def run(decoder: Decoder | SpeculativeDecoder, runners: list[Runner]) -> list[int]:
    return [event.token for event in decoder.run(encode_prompt(runners[0], PROMPT))]


def test_the_ngram_mod_emulation_chains_long_drafts_and_forgets_after_three_poor_ones() -> None:
    """scripts/lookup_sim.py's stand-in for llama.cpp's ngram-mod: windows of n tokens map to the token
    that followed them last, a draft chains them and counts only from n_min tokens, and three drafts in
    a row with under half kept empty the table (common/speculative.cpp)."""
    from lookup_sim import NgramMod, walk_ngram_mod

    drafter = NgramMod(n_match=2, n_min=3, n_max=4)
    text = [1, 2, 3, 4, 5, 6, 1, 2]
    assert drafter.add(text, 0) == 6 and drafter.table[(1, 2)] == 3
    assert drafter.draft(text) == [3, 4, 5, 6]  # chained window by window, cut at n_max
    assert drafter.draft([9, 7, 8]) == []  # (7, 8) never followed by anything
    short = NgramMod(n_match=2, n_min=3, n_max=4)
    short.add([1, 2, 3, 4], 0)
    assert short.draft([1, 2]) == []  # 3, 4, then (3, 4) unknown: two tokens, under n_min
    for _ in range(2):
        drafter.accepted(1, 4)
    assert drafter.table
    drafter.accepted(1, 4)
    assert drafter.table == {}

    class PerToken:  # one second per token, whatever the batch: a draft saves nothing, counts are exact
        def seconds(self, size: int) -> float:
            return float(size)

    repeated = [7, 8, 9, 10, 11, 12, 13]
    answer = ([*repeated, *repeated], 7)  # the prompt, then the same seven tokens as the answer
    walked = walk_ngram_mod([answer], PerToken(), NgramMod(n_match=2, n_min=2, n_max=8))  # type: ignore[arg-type]
    # One decode (the pair 13, 7 is new), then the prompt's chain 9-13 as one draft; four of it are read
    # before the answer ends.
    assert (walked["decodes"], walked["batches"], walked["guessed"], walked["kept"]) == (1, 1, 5, 4)


@pytest.mark.parametrize(("found", "kept"), [(10, 10), (14, 14), (15, 15), (20, 15), (31, 31), (40, 31)])
def test_a_trimmed_guess_fills_a_multiple_of_16_rows_with_the_read_token(found: int, kept: int) -> None:
    """scripts/lookup_sim.py's trimmed guesses: a guess of 15 tokens or more is cut to 16k - 1 tokens,
    a shorter one kept whole; what is kept is the start of the plain guess."""
    from lookup_sim import trimmed_guess

    tokens = [7, 8, *range(100, 98 + found), 7, 8]  # the guess after "7 8": all that followed it
    plain = propose(tokens, min_match=2, limit=64)
    assert len(plain) == found
    assert trimmed_guess(2, 64)(tokens, 0) == plain[:kept]


@pytest.mark.parametrize("lookup", [1, 2])
def test_greedy_lookup_keeps_the_large_models_text(runners: list[Runner], lookup: int) -> None:
    large_only = run(Decoder(runners, ("small", "large"), Fixed(1), SamplingParams(), max_tokens=80), runners)
    spec = SpeculativeDecoder(
        runners, ("small", "large"), SamplingParams(), draft=4, entropy_stop=2.0, lookup=lookup, max_tokens=80
    )
    events = list(spec.run(encode_prompt(runners[0], PROMPT)))
    assert [event.token for event in events] == large_only
    summary = spec.summary()
    assert summary.looked_up > 0 and summary.lookup_acceptance is not None
    small, large = summary.models
    # Accepted lookup tokens are the large model's (its own argmax); the small model wrote accepted drafts.
    assert small.written == round((summary.acceptance_rate or 0.0) * summary.drafted)
    assert large.written == 80 - small.written
    assert all(np.isfinite(event.entropy) for event in events)


def test_a_guess_holds_at_most_lookup_draft_tokens_and_its_length_changes_no_token(
    runners: list[Runner],
) -> None:
    from ead_cli.bench.schedule import ScheduleRecorder

    def guesses(draft: int) -> tuple[list[int], list[int]]:
        decoder = Decoder(runners, ("small", "large"), Fixed(1), SamplingParams(), max_tokens=80, lookup=1,
                          lookup_draft=draft)  # fmt: skip
        with ScheduleRecorder(runners) as recorder:
            tokens = run(decoder, runners)
        return tokens, [len(step[3]) - 1 for step in recorder.steps if step[1] == "c" and step[4] > 1]

    short_tokens, short = guesses(2)
    long_tokens, long = guesses(8)
    assert short_tokens == long_tokens
    assert short and max(short) == 2 and max(long) == 8


def test_a_sampled_lookup_token_is_kept_with_its_probability_and_the_law_stays_p(runners: list[Runner]):
    """The rejection rule with a certain proposal (q = 1 on the looked-up token): keep it with
    probability p(token), else draw from p without it; over many draws the written token follows p."""
    n_vocab = runners[1].n_vocab
    logits = np.full(n_vocab, -30.0, dtype=np.float32)
    logits[:4] = np.log([0.5, 0.3, 0.15, 0.05])
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    p = probabilities(logits, params)
    spec = SpeculativeDecoder(runners, ("small", "large"), params, draft=2, lookup=2)
    rows = np.stack([logits, logits])
    counts = np.zeros(4)
    kept = 0
    for _ in range(4000):
        accepted, correction, _ = spec._judge([1], [1], [None], rows)
        kept += accepted
        counts[1 if accepted else correction] += 1
    assert abs(kept / 4000 - p[1]) < 0.03
    np.testing.assert_allclose(counts / counts.sum(), p[:4], atol=0.03)


GREEDY = SamplingParams()
POLICIES = {
    "large": lambda: Fixed(1),
    "small": lambda: Fixed(0),
    "gate": lambda: Gate(MIDDLE_ENTROPY_BITS),
    "ead": lambda: EAD(MIDDLE_ENTROPY_BITS, window=2, min_run=3),
}


def events_of(
    runners: list[Runner],
    policy: str,
    lookup: int,
    verify: float | None = None,
    sampling: SamplingParams = GREEDY,
) -> tuple:
    for runner in runners:
        runner.truncate(0)
    decoder = Decoder(
        runners, ("small", "large"), POLICIES[policy](), sampling, max_tokens=80, lookup=lookup, verify=verify
    )
    events = list(decoder.run(encode_prompt(runners[0], PROMPT)))
    return events, decoder.summary()


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("verify", [None, 0.5])
def test_guesses_change_no_token_and_no_decision_only_how_rows_are_computed(
    runners: list[Runner], policy: str, verify: float | None
) -> None:
    plain, plain_summary = events_of(runners, policy, 0, verify)
    guessed, summary = events_of(runners, policy, 1, verify)
    assert [(e.token, e.model) for e in guessed] == [(e.token, e.model) for e in plain]
    np.testing.assert_allclose([e.entropy for e in guessed], [e.entropy for e in plain], atol=1e-3)
    assert summary.switches == plain_summary.switches
    # Steps served from a confirmed guess are no decode at all: fewer decodes, more read in batches.
    decodes = sum(report.decode_tokens for report in summary.models)
    plain_decodes = sum(report.decode_tokens for report in plain_summary.models)
    assert decodes < plain_decodes
    assert sum(r.catchup_tokens for r in summary.models) > sum(r.catchup_tokens for r in plain_summary.models)


@pytest.mark.parametrize("policy", ["large", "gate"])
def test_sampled_tokens_are_drawn_from_the_confirmed_guess_row_not_the_batchs_last(
    runners: list[Runner], policy: str
) -> None:
    """llama.cpp's sampler reads the row it is told: the confirmed guess's, as entropy and policy do (the
    batch's last row predicts a position further on). The same seed draws the same text with lookup."""
    sampling = SamplingParams(temp=0.7, seed=11)
    plain, plain_summary = events_of(runners, policy, 0, sampling=sampling)
    guessed, summary = events_of(runners, policy, 1, sampling=sampling)
    assert [(e.token, e.model) for e in guessed] == [(e.token, e.model) for e in plain]
    assert sum(r.decode_tokens for r in summary.models) < sum(r.decode_tokens for r in plain_summary.models)


def test_after_guessing_every_cache_holds_exactly_the_answer(
    runners: list[Runner], tiny_pair: tuple[Path, Path]
) -> None:
    events, _ = events_of(runners, "gate", 1, 0.5)
    tokens = encode_prompt(runners[0], PROMPT) + [event.token for event in events]
    for runner, path in zip(runners, tiny_pair, strict=True):
        assert runner.align(tokens) == runner.n_past  # nothing guessed is left past what was read
        mine = runner.sync(tokens, prompt_len=len(tokens), own_tail=False).copy()
        with Runner(path, name="fresh", n_ctx=512, n_threads=1) as fresh:
            expected = fresh.sync(tokens, prompt_len=len(tokens), own_tail=False)
            np.testing.assert_allclose(mine, expected, rtol=0, atol=0.01)


def test_a_runner_answers_a_confirmed_guess_from_its_batch_and_drops_a_wrong_one(tiny_small: Path) -> None:
    with (
        Runner(tiny_small, name="s", n_ctx=256, n_threads=1) as runner,
        Runner(tiny_small, name="plain", n_ctx=256, n_threads=1) as plain,
    ):
        prompt = runner.tokenize("hello hello", add_special=True)
        runner.sync(prompt[:-1], prompt_len=len(prompt) - 1, own_tail=False)
        plain.sync(prompt[:-1], prompt_len=len(prompt) - 1, own_tail=False)
        guess = [int(t) for t in runner.tokenize(" there friend", add_special=False)]
        runner.sync(prompt, prompt_len=len(prompt) - 1, own_tail=True, guess=lambda: guess)  # with the guess
        assert runner.n_past == len(prompt) and runner.stats.catchup.tokens == 1 + len(guess)
        decoded = runner.stats.decode.tokens
        for count in range(1, len(guess) + 1):  # each confirmed token: the row a decode would give
            tokens = prompt + guess[:count]
            row = runner.sync(tokens, prompt_len=len(prompt) - 1, own_tail=True).copy()
            expected = plain.sync(tokens, prompt_len=len(prompt) - 1, own_tail=True)
            np.testing.assert_allclose(row, expected, rtol=0, atol=0.01)
        assert runner.stats.decode.tokens == decoded and runner.n_past == len(prompt) + len(guess)
        # A guess the text leaves: the cache keeps what agreed and drops the rest before reading on.
        runner.truncate(len(prompt) - 1)
        runner.sync(prompt, prompt_len=len(prompt) - 1, own_tail=True, guess=lambda: guess)
        assert len(guess) >= 2
        other = prompt + guess[:1] + [(guess[1] + 1) % runner.n_vocab]  # follows the guess once, then leaves
        row = runner.sync(other, prompt_len=len(prompt) - 1, own_tail=True).copy()
        plain.truncate(len(prompt))
        expected = plain.sync(other, prompt_len=len(prompt) - 1, own_tail=True)
        np.testing.assert_allclose(row, expected, rtol=0, atol=0.01)
        assert runner.align(other) == len(other) == runner.n_past


def test_common_prefix_counts_the_leading_tokens_two_sequences_share_up_to_a_limit() -> None:
    """What a cache holding one sequence keeps for another: a guess confirmed, an aligned prompt."""
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2  # one ends inside the other
    assert common_prefix([1, 2, 3], [1, 2, 3], 1) == 1  # no more than the limit (a cache's length)
    assert common_prefix([1, 2, 3], [1, 2, 3], 9) == 3
    assert common_prefix([], [1]) == 0
    assert common_prefix([7], [8]) == 0

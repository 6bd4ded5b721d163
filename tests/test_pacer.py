"""The draft pacer: a pure state machine over measured rounds (no clock, no model), and the lossless loop
that obeys it on the tiny pair (the text stays the large model's whatever the pacer decides)."""

from __future__ import annotations

from test_decoder import PROMPT

from ead_cli.decoder import Decoder, SpeculativeDecoder
from ead_cli.pacer import FIRST_RETRY, MAX_RETRY, WARMUP_ROUNDS, DraftPacer
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams


def measured(draft_rate: float, plain_rate: float) -> DraftPacer:
    """A pacer past its warm-up: drafts wrote ``draft_rate`` tokens a second, plain rounds ``plain_rate``."""
    pacer = DraftPacer()
    for _ in range(WARMUP_ROUNDS):
        assert pacer.should_draft()
        pacer.record("draft", 4, 4 / draft_rate)
    for _ in range(WARMUP_ROUNDS):
        assert not pacer.should_draft()  # the plain rounds are measured next
        pacer.record("plain", 1, 1 / plain_rate)
    return pacer


def test_the_faster_kind_of_round_is_kept() -> None:
    assert measured(draft_rate=40.0, plain_rate=25.0).should_draft()
    assert not measured(draft_rate=20.0, plain_rate=25.0).should_draft()


def test_a_losing_draft_is_retried_after_a_back_off_that_doubles_while_it_keeps_losing() -> None:
    pacer = measured(draft_rate=20.0, plain_rate=25.0)
    waits = []
    for _ in range(7):
        plain_rounds = 0
        while not pacer.should_draft():
            pacer.record("plain", 1, 1 / 25.0)
            plain_rounds += 1
        waits.append(plain_rounds)
        pacer.record("draft", 4, 4 / 20.0)  # the retry loses again
    # Counted from the last draft (the warm-up's plain rounds count), doubling up to the cap.
    assert waits == [FIRST_RETRY - WARMUP_ROUNDS, 32, 64, 128, 256, MAX_RETRY, MAX_RETRY]


def test_a_retry_that_wins_resumes_drafting_and_resets_the_back_off() -> None:
    pacer = measured(draft_rate=20.0, plain_rate=25.0)
    for _ in range(FIRST_RETRY - WARMUP_ROUNDS):
        assert not pacer.should_draft()
        pacer.record("plain", 1, 1 / 25.0)
    assert pacer.should_draft()
    for _ in range(5):  # the text turned easy: drafts now write 4 tokens in the time of one plain round
        pacer.record("draft", 4, 1 / 25.0)
    assert pacer.should_draft()
    assert pacer.retry_after == FIRST_RETRY


def test_recent_rounds_outweigh_old_ones() -> None:
    pacer = measured(draft_rate=100.0, plain_rate=25.0)  # drafts paid at first
    for _ in range(10):
        pacer.record("draft", 1, 1 / 10.0)  # then a hard stretch: one token per slow round
    assert not pacer.should_draft()


def tokens_of(decoder: Decoder | SpeculativeDecoder, runners: list[Runner]) -> list[int]:
    return [event.token for event in decoder.run(encode_prompt(runners[0], PROMPT))]


def test_the_text_is_the_large_models_whether_the_pacer_drafts_or_not(runners: list[Runner]) -> None:
    roles, greedy = ("small", "large"), SamplingParams()
    large_only = tokens_of(Decoder(runners, roles, Fixed(1), greedy, max_tokens=12), runners)
    fresh = SpeculativeDecoder(runners, roles, greedy, draft=4, max_tokens=12, pacer=DraftPacer())
    assert tokens_of(fresh, runners) == large_only
    assert fresh.summary().drafted > 0  # a fresh pacer measures drafts first

    losing = measured(draft_rate=1.0, plain_rate=1000.0)  # drafts measured far slower than the large model
    paced = SpeculativeDecoder(runners, roles, greedy, draft=4, max_tokens=12, pacer=losing)
    assert tokens_of(paced, runners) == large_only
    summary = paced.summary()
    small, large = summary.models
    assert summary.drafted == 0 and small.written == 0 and large.written == 12
    assert losing.plain.rounds == WARMUP_ROUNDS + 12  # every step was one plain round, recorded
    assert losing.draft.rounds == WARMUP_ROUNDS

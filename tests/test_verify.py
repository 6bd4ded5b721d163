"""--verify: the large model checks the small one's tokens on catch-up and rewrites from the first it
rejects. Real llama.cpp on the tiny pair."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, ead, pair_args
from tiny_models import open_pair

from ead_cli.decoder import Decoder, TokenEvent
from ead_cli.policies import EAD, Fixed, Gate, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPT = "Write a haiku about the sea, s'il vous plaît: 日本"
NEVER = 1e-30  # a ratio no tiny-model token falls below: verification that never rejects


@pytest.fixture
def fresh_pair(tiny_pair: tuple[Path, Path]) -> Iterator[list[Runner]]:
    """Cold caches for every run compared, so no run reads a token alone that another read in a batch."""
    opened: list[list[Runner]] = []

    def open_one(n_ctx: int = 512, n_batch: int = 512) -> list[Runner]:
        runners = [
            Runner(path, name=role, n_ctx=n_ctx, n_threads=1, n_batch=n_batch)
            for path, role in zip(tiny_pair, ("small", "large"), strict=True)
        ]
        opened.append(runners)
        return runners

    yield open_one
    for runners in opened:
        for runner in runners:
            runner.close()


def run(
    runners: list[Runner], policy: Policy, verify: float | None, max_tokens: int = 80, **kwargs
) -> tuple[Decoder, list[TokenEvent]]:
    decoder = Decoder(
        runners, ("small", "large"), policy, SamplingParams(), max_tokens=max_tokens, verify=verify, **kwargs
    )
    return decoder, list(decoder.run(encode_prompt(runners[0], PROMPT)))


@pytest.mark.parametrize("n_batch", [512, 8])  # 8: held runs longer than a batch are checked in parts
@pytest.mark.parametrize("policy", [Gate(3.0), EAD(2.5, window=2, min_run=3, switch_point="after")])
def test_ratio_one_keeps_only_the_large_models_own_choices(fresh_pair, n_batch: int, policy: Policy) -> None:
    """At ratio 1 a small token stands only where it is the large model's argmax: greedy output equals
    the large model's, like speculative decoding with a draft as long as the small model's run."""
    _, large_only = run(fresh_pair(), Fixed(1), None)
    decoder, checked = run(fresh_pair(n_batch=n_batch), policy, 1.0)
    assert [e.token for e in checked] == [e.token for e in large_only]
    summary = decoder.summary()
    assert summary.rollbacks > 0
    assert summary.checked >= summary.rollbacks
    assert summary.rolled_back >= summary.rollbacks
    assert sum(report.written for report in summary.models) == summary.generated == len(checked)


@pytest.mark.parametrize("n_batch", [512, 8])
def test_the_prompt_read_in_a_checked_batch_counts_as_prefill(fresh_pair, n_batch: int) -> None:
    """The large model's first read checks the small one's first tokens, from the prompt's last token
    (its row predicts the first answer token): that token had been counted as catch-up. Every prompt
    token is prefill, every answer token it read catch-up, and the batch's seconds are shared by both."""
    decoder, _ = run(fresh_pair(n_batch=n_batch), Fixed(0), NEVER, max_tokens=40)
    summary = decoder.summary()
    small, large = summary.models
    assert summary.checked == 40 and large.written == 0
    assert small.prefill_tokens == large.prefill_tokens == summary.prompt_tokens > 0
    # two checks (32 held, then the last 8): the second reads the first's last token again, for its row
    assert large.catchup_tokens == 40 + 1 and large.decode_tokens == 0
    assert large.prefill_s > 0 and large.catchup_s > 0


def test_a_small_model_that_agrees_with_the_large_one_keeps_every_token(tiny_small: Path) -> None:
    """The same weights on both sides: every small token is the large model's choice and stands
    (0.99 leaves room for the ~0.004 logit noise between batched and one-by-one reads)."""
    runners = open_pair((tiny_small, tiny_small))
    try:
        decoder, events = run(runners, Gate(3.0), 0.99)
    finally:
        for runner in runners:
            runner.close()
    summary = decoder.summary()
    assert summary.rollbacks == 0
    assert summary.checked > 0
    assert "small" in {e.model for e in events}


def test_a_ratio_nothing_falls_below_changes_no_token(fresh_pair) -> None:
    _, plain = run(fresh_pair(), Gate(3.0), None)
    decoder, checked = run(fresh_pair(), Gate(3.0), NEVER)
    assert [(e.token, e.model, e.entropy) for e in checked] == [(e.token, e.model, e.entropy) for e in plain]
    summary = decoder.summary()
    assert summary.rollbacks == summary.rolled_back == 0
    assert summary.checked > 0


def test_every_small_token_is_shown_only_after_the_large_model_has_read_up_to_it(fresh_pair) -> None:
    runners = fresh_pair()
    decoder = Decoder(runners, ("small", "large"), Gate(3.0), SamplingParams(), max_tokens=80, verify=NEVER)
    prompt = encode_prompt(runners[0], PROMPT)
    shown: list[TokenEvent] = []
    for event in decoder.run(prompt):
        if event.model == "small":
            assert runners[1].n_past >= len(prompt) + event.index  # its row there judged this token
        shown.append(event)
    assert any(e.model == "small" for e in shown)
    assert decoder.tokens == prompt + [e.token for e in shown]


def test_held_tokens_never_shown_are_not_part_of_the_answer(fresh_pair) -> None:
    """Stopped early by the caller, the decoder's tokens are the prompt and what it showed."""
    runners = fresh_pair()
    decoder = Decoder(runners, ("small", "large"), Gate(3.0), SamplingParams(), max_tokens=80, verify=NEVER)
    prompt = encode_prompt(runners[0], PROMPT)
    events = decoder.run(prompt)
    shown = [next(events).token for _ in range(5)]
    events.close()  # what a Ctrl-C in the consumer does
    assert decoder.tokens == prompt + shown
    assert decoder.summary().finish_reason == "interrupted"


def test_a_stop_string_among_held_tokens_ends_the_answer_there(fresh_pair) -> None:
    _, plain = run(fresh_pair(), Gate(3.0), None, max_tokens=60)
    full = "".join(e.text for e in plain)
    stop = full[25:28]
    assert stop and stop in full
    _, expected = run(fresh_pair(), Gate(3.0), None, max_tokens=60, stop=[stop])
    decoder, checked = run(fresh_pair(), Gate(3.0), NEVER, max_tokens=60, stop=[stop])
    assert "".join(e.text for e in checked) == full[: full.index(stop)]
    assert [e.token for e in checked] == [e.token for e in expected]
    assert decoder.summary().finish_reason == "stop"
    # the small model stopped writing at the stop string instead of running on to max tokens
    assert decoder.summary().generated == len(checked) < 60


@pytest.mark.parametrize("ratio", [NEVER, 1.0])
def test_a_full_context_ends_with_length_and_checks_the_last_tokens(fresh_pair, ratio: float) -> None:
    reference_policy = Gate(1000.0) if ratio == NEVER else Fixed(1)
    reference = fresh_pair(n_ctx=256)
    _, expected = run(reference, reference_policy, None, max_tokens=1000)
    decoder, checked = run(fresh_pair(n_ctx=256), Gate(1000.0), ratio, max_tokens=1000)
    assert [e.token for e in checked] == [e.token for e in expected]
    summary = decoder.summary()
    assert summary.finish_reason == "length"
    assert summary.prompt_tokens + summary.generated == reference[0].n_ctx + 1
    assert summary.checked >= summary.generated - 1  # the small model never gave up the pen, yet was checked


def test_held_tokens_are_checked_at_least_every_check_every_tokens(fresh_pair) -> None:
    """A small model that never hands over is still checked in runs of check_every: what a rejection
    throws away stays bounded (not the whole rest of the answer each time)."""
    runners = fresh_pair()
    decoder = Decoder(
        runners, ("small", "large"), Gate(1000.0), SamplingParams(), max_tokens=60, verify=1.0, check_every=4
    )
    events = list(decoder.run(encode_prompt(runners[0], PROMPT)))
    summary = decoder.summary()
    assert len(events) == 60
    assert summary.rollbacks > 0
    assert summary.rolled_back <= 4 * summary.rollbacks


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"verify": 0.0}, r"--verify must be in \(0, 1\]"),
        ({"verify": -0.1}, r"--verify must be in \(0, 1\]"),
        ({"verify": 1.5}, r"--verify must be in \(0, 1\]"),
        ({"verify": 0.5, "check_every": 0}, "check_every must be at least 1"),
    ],
)
def test_bad_verify_settings_are_refused(tiny_pair: tuple[Path, Path], settings: dict, message: str) -> None:
    runners = open_pair(tiny_pair)
    try:
        with pytest.raises(ValueError, match=message):
            Decoder(runners, ("small", "large"), Gate(1.0), SamplingParams(), **settings)
    finally:
        for runner in runners:
            runner.close()


def test_cli_reports_checks_and_rollbacks(tiny_pair: tuple[Path, Path]) -> None:
    args = ["--tau", "3", "--verify", "1", "--max-tokens", "30", "--stats", "hi"]
    result = ead("generate", *pair_args(tiny_pair), *args)
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert "checked " in err and "rollbacks " in err and "tokens discarded" in err


@pytest.mark.parametrize("mode", ["small", "spec"])
def test_cli_refuses_a_bad_verify_in_any_mode(tiny_pair: tuple[Path, Path], mode: str) -> None:
    result = ead("generate", *pair_args(tiny_pair), "--verify", "0", "--mode", mode, "hi")
    assert_one_line_error(result, 2, "--verify must be in (0, 1], got 0")


def test_a_given_mode_without_switching_leaves_verify_unused(tiny_pair: tuple[Path, Path]) -> None:
    """--verify is a switching option like --tau: --mode small is the small model alone, unchecked."""
    args = ["--mode", "small", "--max-tokens", "30", "--stats", "hi"]
    alone = ead("generate", *pair_args(tiny_pair), *args)
    unused = ead("generate", *pair_args(tiny_pair), "--verify", "1", *args)
    assert unused.returncode == 0, unused.stderr
    assert unused.stdout == alone.stdout and "checked " not in unused.stderr.decode()


def test_one_checked_token_is_said_in_the_singular(tiny_pair: tuple[Path, Path]) -> None:
    """--stats counts the checked tokens as every count is said ('checked 1 small tokens' it had been):
    a τ no entropy reaches leaves the small model the one token, which the end of the answer checks."""
    args = ["--tau", "1000", "--verify", "1e-30", "--max-tokens", "1", "--stats", "hi"]
    result = ead("generate", *pair_args(tiny_pair), *args)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.decode().splitlines()
    assert "checked 1 small token · rollbacks 0 (0 tokens discarded)" in lines

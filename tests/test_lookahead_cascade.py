"""Lookahead (drafted spans taken back) and cascades (three or more models) in the real decoder, on
tiny llama.cpp models, and through the command line."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, ead
from tiny_models import write_tiny_model

from ead_cli.decoder import Decoder, TokenEvent
from ead_cli.engine import role_names
from ead_cli.policies import EAD, Fixed, Gate, Lookahead, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPT = "Write a haiku about the sea, s'il vous plaît: 日本"
HIGH = 1000.0  # bits no tiny model reaches: a threshold that never triggers


@pytest.fixture(scope="session")
def tiny_mid(tiny_dir: Path) -> Path:
    """A third model with the pair's vocabulary and its own weights: the middle of a cascade."""
    return write_tiny_model(tiny_dir / "mid.gguf", seed=5)


@pytest.fixture
def fresh() -> Iterator[Callable[..., list[Runner]]]:
    """Cold runners per run, so every run compared reads its tokens the same way."""
    opened: list[Runner] = []

    def open_models(*paths: Path) -> list[Runner]:
        runners = [
            Runner(path, name=role, n_ctx=512, n_threads=1)
            for path, role in zip(paths, role_names(len(paths)), strict=True)
        ]
        opened.extend(runners)
        return runners

    yield open_models
    for runner in opened:
        runner.close()


def run(
    runners: list[Runner], policy: Policy, max_tokens: int = 60, **kwargs
) -> tuple[Decoder, list[TokenEvent]]:
    decoder = Decoder(
        runners, role_names(len(runners)), policy, SamplingParams(), max_tokens=max_tokens, **kwargs
    )
    return decoder, list(decoder.run(encode_prompt(runners[0], PROMPT)))


def tokens(events: list[TokenEvent]) -> list[int]:
    return [event.token for event in events]


# ------------------------------------------------------------------------------------------- lookahead


def test_lookahead_at_tau_zero_rewrites_every_span_into_the_large_models_text(fresh, tiny_pair) -> None:
    _, large = run(fresh(*tiny_pair), Fixed(1))
    decoder, events = run(fresh(*tiny_pair), Lookahead(0.0, span=4))
    assert tokens(events) == tokens(large)
    assert {event.model for event in events} == {"large"}
    summary = decoder.summary()
    assert summary.large_share == 1.0
    assert len(events) == 60
    assert summary.rollbacks == 15 and summary.rolled_back == 60  # 15 spans of 4, each taken back whole
    assert [event.index for event in events] == list(range(len(events)))


def test_lookahead_at_a_high_tau_keeps_the_small_models_text(fresh, tiny_pair) -> None:
    _, small = run(fresh(*tiny_pair), Fixed(0))
    decoder, events = run(fresh(*tiny_pair), Lookahead(HIGH, span=4))
    assert tokens(events) == tokens(small)
    assert decoder.summary().rollbacks == 0


def test_lookahead_at_a_middle_tau_uses_both_and_reports_what_it_threw_away(fresh, tiny_pair) -> None:
    _, small = run(fresh(*tiny_pair), Fixed(0), max_tokens=80)
    entropies = sorted(event.entropy for event in small)
    middle = entropies[len(entropies) // 2]
    decoder, events = run(fresh(*tiny_pair), Lookahead(middle, span=3), max_tokens=80)
    summary = decoder.summary()
    assert {event.model for event in events} == {"small", "large"}
    assert summary.rollbacks > 0 and summary.rolled_back >= summary.rollbacks
    assert summary.generated == len(events)
    assert summary.models[1].written == sum(event.model == "large" for event in events)
    # spans of 3 stand or are rewritten whole: every run of one model but the last is a multiple of 3
    runs = [len(list(group)) for _, group in itertools.groupby(event.model for event in events)]
    assert all(run % 3 == 0 for run in runs[:-1]), runs


def test_lookahead_decides_an_open_draft_at_a_stop_string(fresh, tiny_pair) -> None:
    _, small = run(fresh(*tiny_pair), Fixed(0))
    text = "".join(event.text for event in small)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip()
    _, expected = run(fresh(*tiny_pair), Fixed(0), stop=[stop])
    decoder, events = run(fresh(*tiny_pair), Lookahead(HIGH, span=16), stop=[stop])
    assert "".join(e.text for e in events) == "".join(e.text for e in expected)
    assert decoder.summary().finish_reason == "stop"


def test_lookahead_with_verify_one_writes_the_large_models_text(fresh, tiny_pair) -> None:
    """Spans that stand are then checked on catch-up: at ratio 1 only the large model's argmax stays."""
    _, large = run(fresh(*tiny_pair), Fixed(1))
    decoder, events = run(fresh(*tiny_pair), Lookahead(HIGH, span=4), verify=1.0)
    assert tokens(events) == tokens(large)
    assert decoder.summary().checked > 0


# --------------------------------------------------------------------------------------------- cascade


def test_a_cascade_whose_middle_is_always_sure_writes_the_middle_models_text(fresh, tiny_pair, tiny_mid):
    small, large = tiny_pair
    _, mid_only = run(fresh(small, tiny_mid, large), Fixed(1))
    decoder, events = run(fresh(small, tiny_mid, large), Gate((0.0, HIGH)))
    assert tokens(events) == tokens(mid_only)
    assert {event.model for event in events} == {"mid"}
    summary = decoder.summary()
    assert [report.role for report in summary.models] == ["small", "mid", "large"]
    assert [report.written for report in summary.models] == [0, len(events), 0]
    assert summary.models[2].decode_tokens == summary.models[2].catchup_tokens == 0  # never asked


def test_a_cascade_that_always_escalates_writes_the_top_models_text(fresh, tiny_pair, tiny_mid) -> None:
    small, large = tiny_pair
    _, top_only = run(fresh(small, tiny_mid, large), Fixed(2))
    decoder, events = run(fresh(small, tiny_mid, large), Gate((0.0, 0.0)))
    assert tokens(events) == tokens(top_only)
    assert decoder.summary().large_share == 1.0


def test_a_cascade_at_middle_thresholds_uses_every_level(fresh, tiny_pair, tiny_mid) -> None:
    small, large = tiny_pair
    _, small_only = run(fresh(small, tiny_mid, large), Fixed(0), max_tokens=80)
    entropies = sorted(event.entropy for event in small_only)
    tau = entropies[len(entropies) // 3]
    for policy in (Gate((tau, tau)), EAD((tau, tau), window=1, min_run=0, switch_point="before")):
        decoder, events = run(fresh(small, tiny_mid, large), policy, max_tokens=80)
        assert {event.model for event in events} == {"small", "mid", "large"}, type(policy).__name__
        summary = decoder.summary()
        assert sum(report.written for report in summary.models) == summary.generated == len(events)


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_cascade_with_models_and_one_tau_per_level(tiny_pair, tiny_mid) -> None:
    small, large = tiny_pair
    models = ",".join(str(p) for p in (small, tiny_mid, large))
    base = ["generate", "--threads", "1", "--max-tokens", "20", "--format", "jsonl", "hi"]
    cascade = ead(*base, "--models", models, "--tau", f"0,{HIGH}", "--stats")
    assert cascade.returncode == 0, cascade.stderr
    mid_alone = ead(*base, "--small", str(tiny_mid), "--large", str(large), "--mode", "small")
    assert [line.split('"model"')[0] for line in cascade.stdout.decode().splitlines()[:-1]] == [
        line.split('"model"')[0] for line in mid_alone.stdout.decode().splitlines()[:-1]
    ]
    assert '"model": "mid"' in cascade.stdout.decode()
    stats = cascade.stderr.decode()
    assert all(role in stats for role in ("small", "mid", "large"))


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--tau", "1,2,3"], ["3 models take 2 thresholds"]),
        (["--tau", "1,x"], ["--tau must be a finite number of bits"]),
        (["--small", "a.gguf"], ["--models names every model"]),
        (["--mode", "spec"], ["speculative decoding takes two models"]),
        (["--policy", "lookahead"], ["--policy lookahead takes two models"]),
    ],
)
def test_cli_cascade_usage_errors_come_before_any_model_loads(tiny_pair, tiny_mid, extra, fragments) -> None:
    models = ",".join(str(p) for p in (tiny_pair[0], tiny_mid, tiny_pair[1]))
    result = ead("generate", "--models", models, *extra, "hi")
    assert_one_line_error(result, 2, *fragments)


@pytest.mark.parametrize("models", ["a.gguf", "a.gguf,", "a.gguf,,b.gguf", " , "])
def test_cli_models_with_one_name_or_an_empty_one_are_refused_as_typed(models: str) -> None:
    """The message had shown Python's tuple, ('a.gguf', '', 'b.gguf'), and called two models too few."""
    given = ",".join(name.strip() for name in models.split(","))
    result = ead("generate", "--models", models, "hi")
    error = assert_one_line_error(result, 2)
    assert error == f"error: --models takes two or more models, comma-separated, none empty, got {given!r}"


def test_cli_cascade_refuses_a_model_with_another_tokenizer(tiny_pair, tiny_other_vocab) -> None:
    models = ",".join(str(p) for p in (tiny_pair[0], tiny_pair[1], tiny_other_vocab))
    result = ead("generate", "--models", models, "--threads", "1", "hi")
    assert_one_line_error(result, 1, tiny_other_vocab.name)


def test_cli_lookahead_end_to_end(tiny_pair) -> None:
    args = ["generate", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    lookahead = ["--policy", "lookahead", "--tau", "0", "--draft", "3", "--stats"]
    result = ead(*args, *lookahead, "--max-tokens", "12", "hi")
    large = ead(*args, "--mode", "large", "--max-tokens", "12", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == large.stdout
    assert "rollbacks" in result.stderr.decode()
    bad = ead(*args, "--policy", "lookahead", "--draft", "0", "hi")
    assert_one_line_error(bad, 2, "draft must be in [1, 64]")


def test_cli_cascade_colours_the_middle_level_and_names_it_in_the_legend(tiny_pair, tiny_mid) -> None:
    models = ",".join(str(p) for p in (tiny_pair[0], tiny_mid, tiny_pair[1]))
    args = ["generate", "--models", models, "--tau", f"0,{HIGH}", "--threads", "1", "--max-tokens", "8", "hi"]
    result = ead(*args, env={"FORCE_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    assert "\x1b[32m" in result.stdout.decode() and "\x1b[36m" not in result.stdout.decode()
    assert "\x1b[32m■ mid\x1b[0m: mid.gguf" in result.stderr.decode()

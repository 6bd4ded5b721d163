"""The decoding loop on real llama.cpp with tiny GGUF models: catch-up, baselines, stops, figures."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from tiny_models import open_pair, write_tiny_model

from ead_cli.decoder import Decoder, TokenEvent
from ead_cli.entropy import EntropyMeter
from ead_cli.errors import EadError
from ead_cli.policies import EAD, Fixed, Gate, Policy
from ead_cli.prompt import check_fits, encode_prompt
from ead_cli.runner import PromptProgress, Runner
from ead_cli.sampling import SamplingParams

PROMPT = "Write a haiku about the sea, s'il vous plaît: 日本"


def generate(
    runners: list[Runner], policy: Policy, max_tokens: int = 60, **kwargs
) -> tuple[Decoder, list[int], list[TokenEvent]]:
    sampling = kwargs.pop("sampling", SamplingParams())
    decoder = Decoder(runners, ("small", "large"), policy, sampling, max_tokens=max_tokens, **kwargs)
    prompt = encode_prompt(runners[0], PROMPT)
    events = list(decoder.run(prompt))
    return decoder, prompt, events


def bare_greedy(path: Path, prompt: list[int], count: int) -> list[int]:
    """A plain llama-cpp-python greedy loop, the reference the engine must reproduce exactly."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False)
    out: list[int] = []
    llm.eval(prompt)
    for _ in range(count):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        token = int(np.argmax(logits))
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            break
        llm.eval([token])
    llm.close()
    return out


def test_large_mode_reproduces_a_bare_greedy_loop(runners: list[Runner], tiny_large: Path) -> None:
    _, prompt, events = generate(runners, Fixed(1), max_tokens=40)
    assert [e.token for e in events] == bare_greedy(tiny_large, prompt, 40)
    assert {e.model for e in events} == {"large"}


def test_a_threshold_no_entropy_reaches_gives_the_small_models_text(runners: list[Runner]) -> None:
    _, _, small_only = generate(runners, Fixed(0))
    for runner in runners:
        runner.truncate(0)
    decoder, _, ead = generate(runners, EAD(1000.0, min_run=0))
    assert [e.token for e in ead] == [e.token for e in small_only]
    assert decoder.summary().large_share == 0.0
    assert runners[1].stats.tokens_read == 0  # the large model never had to read anything


def test_a_middle_threshold_uses_both_models(runners: list[Runner]) -> None:
    decoder, _, events = generate(runners, Gate(3.0), max_tokens=80)
    models = [e.model for e in events]
    assert "small" in models and "large" in models
    summary = decoder.summary()
    assert summary.switches > 0
    assert summary.large_share == pytest.approx(models.count("large") / len(models))
    assert sum(m.written for m in summary.models) == summary.generated == len(events)


@pytest.mark.parametrize("policy", [Gate(3.0, burst=2), EAD(2.5, window=2, min_run=3, switch_point="after")])
def test_catch_up_keeps_each_models_state_equal_to_a_fresh_read(
    runners: list[Runner], tiny_pair: tuple[Path, Path], policy: Policy
) -> None:
    decoder, prompt, events = generate(runners, policy, max_tokens=80)
    assert decoder.summary().switches >= 2
    tokens = prompt + [e.token for e in events]
    for runner, path in zip(runners, tiny_pair, strict=True):
        caught_up = runner.sync(tokens, prompt_len=len(prompt), own_tail=False).copy()
        with Runner(path, name="fresh", n_ctx=512, n_threads=1) as fresh:
            expected = fresh.sync(tokens, prompt_len=len(prompt), own_tail=False)
            # Batched and one-by-one reads differ by ~0.004 here (f16 KV cache); one token missing or
            # misplaced in the cache moves the logits by more than 0.25.
            np.testing.assert_allclose(caught_up, expected, rtol=0, atol=0.01)
            assert int(np.argmax(caught_up)) == int(np.argmax(expected))


def test_event_text_joins_into_the_whole_decoded_answer(runners: list[Runner]) -> None:
    _, _, events = generate(runners, Gate(3.0), max_tokens=120)
    raw = b"".join(runners[0].token_bytes(e.token) for e in events)
    assert "".join(e.text for e in events) == raw.decode("utf-8", errors="replace")


def test_a_character_split_across_a_switch_prints_whole(runners: list[Runner]) -> None:
    """Feed 'é' (two byte tokens) as if the small model wrote one byte and the large one the other."""
    from ead_cli.text import TextStream

    stream = TextStream()
    first, second = runners[0].tokenize("é", add_special=False)
    assert stream.push(runners[0].token_bytes(first)) == ""
    assert stream.push(runners[1].token_bytes(second)) == "é"


def test_events_carry_the_policys_entropy_and_rolling_mean(runners: list[Runner]) -> None:
    _, _, events = generate(runners, EAD(1000.0, window=3), max_tokens=10)
    entropies = [e.entropy for e in events]
    for i, event in enumerate(events):
        window = entropies[max(0, i - 2) : i + 1]
        assert event.rolling == pytest.approx(sum(window) / len(window))
        assert 0.0 <= event.entropy <= np.log2(runners[0].n_vocab) + 1e-6


def test_normalised_entropy_is_a_fraction_of_log2_v(runners: list[Runner]) -> None:
    _, _, plain = generate(runners, Fixed(0), max_tokens=5)
    for runner in runners:
        runner.truncate(0)
    _, _, normalised = generate(runners, Fixed(0), max_tokens=5, normalize=True)
    bits = np.log2(runners[0].n_vocab)
    assert [e.entropy / bits for e in plain] == pytest.approx([e.entropy for e in normalised])


def test_stop_string_ends_the_answer_without_printing_it(runners: list[Runner]) -> None:
    _, _, events = generate(runners, Fixed(0), max_tokens=60)
    full = "".join(e.text for e in events)
    stop = full[20:23]
    assert stop and stop in full
    for runner in runners:
        runner.truncate(0)
    decoder, _, stopped = generate(runners, Fixed(0), max_tokens=60, stop=[stop])
    text = "".join(e.text for e in stopped)
    assert text == full[: full.index(stop)]
    assert decoder.summary().finish_reason == "stop"


@pytest.mark.parametrize("limit", [0, 1, 7])
def test_max_tokens_is_exact(runners: list[Runner], limit: int) -> None:
    decoder, _, events = generate(runners, Gate(3.0), max_tokens=limit)
    assert len(events) == limit
    assert decoder.summary().finish_reason == "length"


def test_a_full_context_ends_with_length(tiny_pair: tuple[Path, Path]) -> None:
    runners = open_pair(tiny_pair, 64)
    decoder, prompt, events = generate(runners, Gate(3.0), max_tokens=500)
    assert decoder.summary().finish_reason == "length"
    assert decoder.n_ctx == 256  # llama.cpp rounds the context up to a multiple of 256
    assert len(prompt) + len(events) == decoder.n_ctx + 1  # the last token never needs a slot
    for runner in runners:
        runner.close()


def test_a_prompt_longer_than_the_context_is_refused(runners: list[Runner]) -> None:
    prompt = encode_prompt(runners[0], "word " * 600)
    with pytest.raises(EadError, match=r"the prompt is \d+ tokens, too many for the context of 512 tokens"):
        check_fits(prompt, runners)


def test_sampling_is_reproducible_with_a_seed(runners: list[Runner]) -> None:
    def sample(seed: int) -> list[int]:
        for runner in runners:
            runner.truncate(0)
        params = SamplingParams(temp=0.9, seed=seed)
        return [e.token for e in generate(runners, Gate(3.0), max_tokens=40, sampling=params)[2]]

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other


def test_figures_account_for_every_token_read(runners: list[Runner]) -> None:
    decoder, prompt, events = generate(runners, Gate(3.0), max_tokens=80)
    summary = decoder.summary()
    tokens = len(prompt) + len(events)
    for report, runner in zip(summary.models, runners, strict=True):
        assert report.prefill_tokens == len(prompt)
        # Each model has read everything up to the last token it needed: at most all but the newest.
        assert report.prefill_tokens + report.decode_tokens + report.catchup_tokens <= tokens - 1
        assert runner.n_past == report.prefill_tokens + report.decode_tokens + report.catchup_tokens
        expected = 2 * (runner.body_params * runner.n_past + runner.head_params * runner.stats.logits_rows)
        assert report.flops == pytest.approx(expected)
    assert summary.flops == pytest.approx(sum(m.flops for m in summary.models))
    small, large = summary.models
    assert summary.param_cost == pytest.approx(
        (small.written * small.params + large.written * large.params) / (summary.generated * large.params)
    )
    assert large.catchup_tokens > 0 and small.catchup_tokens > 0


def test_models_larger_than_the_available_memory_are_refused(tiny_pair: tuple[Path, Path]) -> None:
    from ead_cli.runner import check_memory, memory_available

    size = sum(path.stat().st_size for path in tiny_pair)
    check_memory(tiny_pair, size)  # exactly enough
    check_memory(tiny_pair, None)  # unknown: no check
    with pytest.raises(EadError, match=r"the models need about 0\.0 GiB of memory but 0\.0 GiB is available"):
        check_memory(tiny_pair, size - 1)
    available = memory_available()
    assert available is not None and available > 0  # Linux: /proc/meminfo


def test_a_split_model_counts_all_its_shards(tmp_path: Path) -> None:
    from ead_cli.runner import shard_paths

    for k in (1, 2, 3):
        (tmp_path / f"m-q4-0000{k}-of-00003.gguf").write_bytes(b"GGUF")
    (tmp_path / "m-q4-00001-of-00002.gguf").write_bytes(b"GGUF")  # another split: not ours
    shards = shard_paths(tmp_path / "m-q4-00001-of-00003.gguf")
    assert [p.name for p in shards] == [f"m-q4-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    assert shard_paths(tmp_path / "single.gguf") == [tmp_path / "single.gguf"]


class TextRecordingGate(Gate):
    """A gate that keeps the text the decoder shows it."""

    def __init__(self, tau: float) -> None:
        super().__init__(tau)
        self.wants_text = True
        self.seen: list[str] = []

    def see(self, text: str) -> None:
        self.seen.append(text)


def test_a_policy_that_wants_text_sees_each_written_token_in_order(runners: list[Runner]) -> None:
    policy = TextRecordingGate(3.0)
    _, _, events = generate(runners, policy, max_tokens=50)
    assert {e.model for e in events} == {"small", "large"}
    expected = [runners[0].token_bytes(e.token).decode("utf-8", "replace") for e in events]
    assert policy.seen == expected


NEEDED_POLICIES = {
    "fixed small": lambda tau: Fixed(0),
    "fixed large": lambda tau: Fixed(1),
    "gate": lambda tau: Gate(tau),
    "gate after, burst 2": lambda tau: Gate(tau, burst=2, switch_point="after"),
    "gate adaptive tau": lambda tau: Gate(tau, tau_range=(tau - 0.5, tau + 0.5)),
    "ead": lambda tau: EAD(tau, window=3, min_run=2),
}


@pytest.fixture(scope="module")
def narrow_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Runner]]:
    """A tiny pair whose rows spread over a few nats (logit scale 0.5: ~7.8 of 8.06 bits), where the
    entropy floor lies 3.3-6.2 bits: a gate at 5 bits is settled by it at some steps, not at others."""
    folder = tmp_path_factory.mktemp("narrow")
    paths = (folder / "small.gguf", folder / "large.gguf")
    for seed, path in enumerate(paths):
        write_tiny_model(path, seed=seed, logit_scale=0.5)
    pair = open_pair(paths)
    yield pair
    for runner in pair:
        runner.close()


@pytest.mark.parametrize("temp", [0.0, 0.8])
@pytest.mark.parametrize("name", list(NEEDED_POLICIES))
@pytest.mark.parametrize("rows", ["middle", "narrow"])
def test_entropy_measured_only_where_needed_writes_and_switches_alike(
    request: pytest.FixtureRequest, rows: str, name: str, temp: float
) -> None:
    """``entropy="needed"``: the same tokens, models and text as measuring every step; the steps it
    measured show the very same entropy, the others NaN. On the middle pair (the gates switch both ways)
    the head bounds settle the steps (a 267-token row is all head: exact in float64), on the narrow
    pair (above tau at every step) the head bounds or the floor."""
    runners = request.getfixturevalue("runners" if rows == "middle" else "narrow_pair")
    tau = 3.0 if rows == "middle" else 5.0
    sampling = SamplingParams(temp=temp, seed=5)
    results = []
    for mode in ("exact", "needed"):
        for runner in runners:
            runner.truncate(0)
        policy = NEEDED_POLICIES[name](tau)
        results.append(generate(runners, policy, max_tokens=120, sampling=sampling, entropy=mode)[2])
    exact, needed = results
    seen = [(e.token, e.model, e.text, e.tau) for e in needed]
    assert seen == [(e.token, e.model, e.text, e.tau) for e in exact]
    measured = [(n, e) for n, e in zip(needed, exact, strict=True) if not math.isnan(n.entropy)]
    assert all(n.entropy == e.entropy and n.rolling == e.rolling for n, e in measured)
    skipped = len(needed) - len(measured)
    if name.startswith("fixed"):
        assert skipped == len(needed)
    elif name == "ead":
        assert skipped == 0  # a rolling mean over three steps reads every value
    else:
        assert skipped > len(needed) // 2
        assert rows == "narrow" or {e.model for e in needed} == {"small", "large"}


def test_an_unknown_entropy_mode_is_refused(runners: list[Runner]) -> None:
    with pytest.raises(ValueError, match="entropy must be one of exact, needed"):
        Decoder(runners, ("small", "large"), Fixed(0), SamplingParams(), entropy="bounded")


class _LaunchWatchingMeter(EntropyMeter):
    """The runner's own meter, noting where its model had read to when each exact pass finished."""

    def __init__(self, runner: Runner) -> None:
        super().__init__(runner.n_vocab)
        self.runner = runner
        self.read_when_measured: list[int] = []

    def shifted_entropy(self) -> float:
        self.read_when_measured.append(self.runner.n_past)
        return super().shifted_entropy()


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_reading_ahead_a_shown_entropy_is_measured_behind_the_next_launch(
    runners: list[Runner], temp: float, window: int
) -> None:
    """A single model's loop shows each step's entropy (``entropy="exact"``: ead serve, ead chat) but
    never reads it. Reading ahead, the exact pass copies the row (the next decode overwrites it: the test
    above fails without the copy) and finishes after that decode is launched: each token's entropy is
    measured with the token already read, the same entropies and rolling means as measuring first."""
    large = runners[1]
    prompt = encode_prompt(large, PROMPT)
    meter = large.entropy
    results = []
    try:
        for ahead in (False, True):
            large.truncate(0)
            large.reads_ahead = ahead
            large.entropy = watching = _LaunchWatchingMeter(large)
            decoder = Decoder(
                runners,
                ("small", "large"),
                Fixed(1, window=window),
                SamplingParams(temp=temp, seed=5),
                max_tokens=40,
            )
            events = list(decoder.run(prompt))
            results.append(([(e.token, e.entropy, e.rolling) for e in events], watching.read_when_measured))
    finally:
        large.entropy, large.reads_ahead = meter, False
    (plain, plain_read), (ahead, ahead_read) = results
    assert ahead == plain and all(math.isfinite(entropy) for _, entropy, _ in ahead)
    positions = [len(prompt) + index for index in range(len(plain))]  # read before the token is
    assert plain_read == positions
    assert ahead_read[:-1] == [position + 1 for position in positions[:-1]]


def test_llama_cpps_greedy_sampler_picks_the_argmax_the_loop_takes_ties_included() -> None:
    """A greedy step takes the row's argmax (the first maximum) in place of llama.cpp's greedy sampler:
    the same token on rows with ties at the top, spread anywhere in the row."""
    rng = np.random.default_rng(2)
    greedy = llama_cpp.llama_sampler_init_greedy()
    try:
        for case in range(200):
            row = rng.standard_normal(4096).astype(np.float32)
            if case % 2:  # a tie at the top, between two to five tokens
                row[rng.choice(4096, int(rng.integers(2, 6)), replace=False)] = row.max() + 1.0
            data = (llama_cpp.llama_token_data * row.shape[0])(
                *(llama_cpp.llama_token_data(i, float(x), 0.0) for i, x in enumerate(row))
            )
            candidates = llama_cpp.llama_token_data_array(data, row.shape[0], -1, False)
            llama_cpp.llama_sampler_apply(greedy, ctypes.byref(candidates))
            assert data[candidates.selected].id == int(row.argmax())
    finally:
        llama_cpp.llama_sampler_free(greedy)


@pytest.mark.parametrize("stop", [(), ("a stop string never written",)])
@pytest.mark.parametrize("temp", [0.0, 0.8])
@pytest.mark.parametrize("lookup", [0, 1])
@pytest.mark.parametrize("name", ["gate", "ead", "fixed large"])
def test_reading_ahead_changes_no_token_no_decision_and_no_count(
    runners: list[Runner], name: str, lookup: int, temp: float, stop: tuple[str, ...]
) -> None:
    """``Runner.reads_ahead`` (on by default where llama.cpp offloads to a GPU; forced here on the CPU):
    the next step's read is launched before a token's event is handed out (before its text is decoded
    too, unless a stop string may end the answer there). Each event then arrives with its token already
    read by the model that evaluates the next step, and nothing else changes: tokens, writers,
    entropies, text and every model's counts."""
    sampling = SamplingParams(temp=temp, seed=5)
    prompt = encode_prompt(runners[0], PROMPT)
    results = []
    for ahead in (False, True):
        read_when_shown = []
        for runner in runners:
            runner.truncate(0)
            runner.reads_ahead = ahead
        policy = NEEDED_POLICIES[name](3.0)
        decoder = Decoder(
            runners, ("small", "large"), policy, sampling, max_tokens=80, lookup=lookup, stop=stop
        )
        events = []
        for event in decoder.run(prompt):
            events.append(event)
            read_when_shown.append(runners[policy.active].n_past)
        summary = decoder.summary()
        counts = [
            (m.written, m.prefill_tokens, m.decode_tokens, m.catchup_tokens, m.guessed, m.guessed_kept)
            for m in summary.models
        ]
        results.append((events, counts, [runner.n_past for runner in runners], read_when_shown))
    for runner in runners:
        runner.reads_ahead = False
    (plain, plain_counts, plain_past, plain_read), (ahead, counts, past, read) = results
    assert [(e.token, e.model, e.text, e.entropy, e.rolling) for e in ahead] == [
        (e.token, e.model, e.text, e.entropy, e.rolling) for e in plain
    ]
    assert counts == plain_counts and past == plain_past
    positions = [len(prompt) + index + 1 for index in range(len(ahead))]
    # Every event but the last came with its token read by the next step's model (a confirmed lookup
    # guess had it read earlier still); without reading ahead, the next step reads it after the event.
    assert all(n >= p for n, p in zip(read[:-1], positions, strict=False))
    assert sum(n < p for n, p in zip(plain_read[:-1], positions, strict=False)) > len(plain) // 2


def test_prompt_progress_at_each_batch_of_the_prompt_and_the_answer_unchanged(
    tiny_pair: tuple[Path, Path],
) -> None:
    """A prompt read in batches of 16 reports each batch each model reads (the tokens the cache kept
    counted as read), nothing while the answer is written, and the answer is the one without."""
    roles = ("small", "large")
    runners = [
        Runner(p, name=r, n_ctx=512, n_threads=1, n_batch=16) for p, r in zip(tiny_pair, roles, strict=True)
    ]
    reported: list[PromptProgress] = []

    def answer(prompt: list[int]) -> list[tuple[int, str]]:
        decoder = Decoder(runners, roles, EAD(tau=2), SamplingParams(), max_tokens=12)
        return [(event.token, event.model) for event in decoder.run(prompt)]

    try:
        prompt = encode_prompt(runners[0], PROMPT * 3)
        plain = answer(prompt)
        for runner in runners:
            runner.truncate(0)
            runner.on_progress = reported.append
        told = answer(prompt)
        first = len(reported)
        again = answer(prompt)  # the caches hold the prompt: its last token read again
    finally:
        for runner in runners:
            runner.close()
    assert told == again == plain and {model for _, model in told} == {"small", "large"}
    for model in roles:
        read = [(p.read, p.total, p.cached) for p in reported[:first] if p.model == model]
        assert read == [(end, len(prompt), 0) for end in [*range(16, len(prompt), 16), len(prompt)]]
    assert [(p.read, p.total, p.cached) for p in reported[first:]] == [
        (len(prompt), len(prompt), len(prompt) - 1)
    ]

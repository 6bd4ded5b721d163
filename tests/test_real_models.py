"""The default demo pair end to end: real Qwen2.5-Coder 0.5B + 1.5B Instruct weights, greedy."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from ead_cli.decoder import Decoder, SpeculativeDecoder
from ead_cli.policies import CODE_PATTERNS, EAD, Fixed, Gate, Lookahead, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

pytestmark = pytest.mark.real
PROMPT = "Write a Python function that checks whether a number is prime"
TOKENS = 48


@pytest.fixture(scope="module")
def runners(real_pair: tuple[Path, Path]):
    pair = [
        Runner(path, name=role, n_ctx=1024, n_threads=1)
        for path, role in zip(real_pair, ("small", "large"), strict=True)
    ]
    yield pair
    for runner in pair:
        runner.close()


def generate(
    runners: list[Runner], policy: Policy, verify: float | None = None
) -> tuple[list[int], list[str], Decoder]:
    """A run from cold caches, as every `ead generate` process starts (a warm cache re-reads the last
    prompt token alone, which moves logits by float noise and can flip a near-tie)."""
    for runner in runners:
        runner.truncate(0)
    decoder = Decoder(runners, ("small", "large"), policy, SamplingParams(), max_tokens=TOKENS, verify=verify)
    events = list(decoder.run(encode_prompt(runners[0], PROMPT)))
    return [e.token for e in events], [e.model for e in events], decoder


def test_a_greedy_run_is_reproducible(runners: list[Runner]) -> None:
    first = generate(runners, Gate(1.0))[:2]
    assert generate(runners, Gate(1.0))[:2] == first


def test_large_mode_equals_a_bare_llama_cpp_python_greedy_loop(runners: list[Runner], real_pair) -> None:
    tokens, models, _ = generate(runners, Fixed(1))
    prompt = encode_prompt(runners[0], PROMPT)
    llm = llama_cpp.Llama(model_path=str(real_pair[1]), n_ctx=1024, n_threads=1, verbose=False)
    llm.eval(prompt)
    bare = []
    for _ in range(TOKENS):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        bare.append(int(np.argmax(logits)))
        llm.eval([bare[-1]])
    llm.close()
    assert tokens == bare
    assert set(models) == {"large"}


def test_ead_at_a_threshold_no_entropy_reaches_is_the_small_models_text(runners: list[Runner]) -> None:
    small_tokens, _, _ = generate(runners, Fixed(0))
    tokens, models, decoder = generate(runners, EAD(1e9))
    assert tokens == small_tokens
    assert set(models) == {"small"}
    assert decoder.summary().models[1].prefill_tokens == 0  # the large model never had to read anything


@pytest.mark.parametrize("policy", [Gate(1.0), EAD(0.5, min_run=5)])
def test_a_middle_threshold_uses_both_models(runners: list[Runner], policy: Policy) -> None:
    _, models, decoder = generate(runners, policy)
    summary = decoder.summary()
    assert 0 < models.count("large") < TOKENS
    assert summary.switches >= 1
    assert 0.0 < summary.large_share < 1.0
    small, large = summary.models
    assert large.prefill_tokens == summary.prompt_tokens
    assert small.params < large.params
    assert summary.param_cost == pytest.approx(
        (small.written * small.params + large.written * large.params) / (TOKENS * large.params)
    )


@pytest.mark.parametrize(
    "policy",
    [
        Gate(1.0, burst="line"),
        Gate(1.0, burst="adaptive"),
        Gate(1.0, tau_range=(0.5, 2.0)),
        Gate(1e9, patterns=CODE_PATTERNS),  # no entropy reaches tau: only the patterns call the large model
    ],
)
def test_each_gate_extension_uses_both_models_on_the_demo_pair(runners: list[Runner], policy: Policy) -> None:
    _, models, decoder = generate(runners, policy)
    assert 0 < models.count("large") < TOKENS
    assert decoder.summary().switches >= 1


def test_verify_checks_the_small_models_tokens_on_the_demo_pair(runners: list[Runner]) -> None:
    tokens, models, decoder = generate(runners, Gate(1.0), verify=0.1)
    summary = decoder.summary()
    assert len(tokens) == TOKENS and "small" in models
    assert summary.checked >= models.count("small")  # every small token shown was checked first
    assert summary.rolled_back >= summary.rollbacks


def test_lookahead_rewrites_uncertain_spans_on_the_demo_pair(runners: list[Runner]) -> None:
    tokens, models, decoder = generate(runners, Lookahead(0.5, span=4))
    summary = decoder.summary()
    assert len(tokens) == TOKENS and 0 < models.count("large") < TOKENS
    assert summary.rollbacks >= 1 and summary.rolled_back >= summary.rollbacks
    # every rewritten span is as long as the draft it replaced: large runs come in fours but the last
    large_runs = [len(list(run)) for model, run in itertools.groupby(models) if model == "large"]
    assert all(length % 4 == 0 for length in large_runs[:-1]), large_runs


NEAR_TIE = 0.05  # logits; batched and one-by-one reads of the same tokens differ by up to ~0.015 here


def test_greedy_speculative_decoding_writes_only_the_large_models_choices(
    runners: list[Runner], real_pair
) -> None:
    """Every token is the large model's argmax given the tokens before it. The texts of spec and of the
    large model alone may still part at a float near-tie: a verification batch reads the draft with
    other numerics than one-by-one decoding (as in llama.cpp), so a top-2 gap of ~0.01 logits may go
    either way. So: each token must be the argmax, or within NEAR_TIE of it."""
    for runner in runners:
        runner.truncate(0)
    spec = SpeculativeDecoder(runners, ("small", "large"), SamplingParams(), draft=4, max_tokens=TOKENS)
    prompt = encode_prompt(runners[0], PROMPT)
    tokens = [e.token for e in spec.run(prompt)]
    assert len(tokens) == TOKENS
    assert spec.summary().acceptance_rate > 0.3
    with Runner(real_pair[1], name="check", n_ctx=1024, n_threads=1) as fresh:
        rows = fresh.verify(prompt + tokens, prompt_len=len(prompt), rows=TOKENS + 1)
        gaps = [float(rows[i].max() - rows[i][token]) for i, token in enumerate(tokens)]
    assert max(gaps) < NEAR_TIE
    assert sum(gap == 0.0 for gap in gaps) >= TOKENS - 2


def test_the_cli_streams_jsonl_on_the_default_pair() -> None:
    ead = Path(sys.executable).with_name("ead")
    result = subprocess.run(
        [str(ead), "generate", "--threads", "1", "--max-tokens", "12", "--format", "jsonl", PROMPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert [t["index"] for t in tokens] == list(range(12))
    assert {t["model"] for t in tokens} <= {"small", "large"}
    assert summary["type"] == "summary" and summary["generated"] == 12
    assert summary["finish_reason"] == "length"


def demo(*args: str) -> tuple[dict, str]:
    """The README's first command, as a user runs it: the summary object and stderr."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "demo.sh"
    result = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["type"] == "summary"
    return summary, result.stderr


def test_the_demo_script_answers_its_own_question() -> None:
    """Options only: the script supplies the prompt."""
    summary, stderr = demo("--max-tokens", "6", "--threads", "1", "--format", "jsonl")
    assert summary["generated"] == 6
    assert summary["prompt_tokens"] > 20  # the default question, in the chat template
    assert "6 tokens (length)" in stderr  # --stats, on stderr


def test_the_demo_script_takes_a_prompt_after_double_dash() -> None:
    """A prompt that starts with - goes after --, as ead generate's does; the script had put its own
    question before the --, so ead saw two prompts ('Got unexpected extra argument(s)')."""
    summary, _ = demo("--max-tokens", "2", "--threads", "1", "--format", "jsonl", "--", "-v or -q?")
    assert summary["generated"] == 2
    assert summary["prompt_tokens"] < 40  # this short prompt, not the default question


def test_large_mode_with_penalties_equals_llama_cpps_own_chain(runners: list[Runner], real_pair) -> None:
    """llama-cli's usual --repeat-penalty 1.1 with OpenAI-style presence and frequency penalties, against
    llama.cpp's penalties sampler (the prompt accepted first, as llama-server does) on the real 1.5B."""
    params = SamplingParams(repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
    for runner in runners:
        runner.truncate(0)
    decoder = Decoder(runners, ("small", "large"), Fixed(1), params, max_tokens=TOKENS)
    prompt = encode_prompt(runners[0], PROMPT)
    tokens = [event.token for event in decoder.run(prompt)]
    llm = llama_cpp.Llama(model_path=str(real_pair[1]), n_ctx=1024, n_threads=1, verbose=False)
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(
        sampler, llama_cpp.llama_sampler_init_penalties(llm.n_vocab(), 64, 1.1, 0.5, 0.5)
    )
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
    for token in prompt:
        llama_cpp.llama_sampler_accept(sampler, token)
    llm.eval(prompt)
    chain = []
    for _ in range(TOKENS):
        chain.append(llama_cpp.llama_sampler_sample(sampler, llm.ctx, -1))
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, chain[-1]):
            break
        llm.eval(chain[-1:])
    llama_cpp.llama_sampler_free(sampler)
    llm.close()
    assert tokens == chain
    assert tokens != generate(runners, Fixed(1))[0]  # the penalties changed the answer

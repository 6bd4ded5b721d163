"""Repetition penalties and logit bias with llama.cpp's semantics: ead's text, token for token, against
llama.cpp's own sampler chain (its penalties and logit-bias samplers, the prompt accepted first, as
llama-server does) over the same tiny model, through every loop that chooses or checks a token."""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
from serve_process import Server
from test_cli import assert_one_line_error, ead, pair_args
from test_serve import serving

from ead_cli.decoder import Decoder, SpeculativeDecoder
from ead_cli.errors import EadError
from ead_cli.policies import Fixed, Gate, Lookahead, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import CANDIDATE, SamplingParams
from ead_cli.serve.schemas import PENALTIES

# Code that repeats itself: prompt lookup finds guesses in it, and the penalties have tokens to count.
PROMPT = "def f(x):\n    return x + x + x + x\n\ndef g(x):\n    return x + x"
COUNT = 60
REPEAT = SamplingParams(repeat_penalty=1.3)
# frequency and presence values whose products with a count are exact in float32, so no fused
# multiply-add in llama.cpp's build can round them otherwise
ALL = SamplingParams(repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.5, presence_penalty=0.25)


def chain(
    params: SamplingParams, vocab: llama_cpp.llama_vocab_p, prompt: Sequence[int]
) -> llama_cpp.llama_sampler_p:
    """llama.cpp's chain as common_sampler_init builds it: the logit bias, the penalties, DRY (where
    ``params`` turns it on), then greedy or top-k, top-p, min-p, temperature and a seeded draw; the prompt
    accepted, as llama-server's slot does."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    if params.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))(*params.logit_bias)
        add(sampler, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases))
    add(
        sampler,
        llama_cpp.llama_sampler_init_penalties(
            n_vocab,
            params.repeat_last_n,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        ),
    )
    if params.dry_on:
        add(sampler, llama_dry(params, vocab))
    if params.temp == 0:
        add(sampler, llama_cpp.llama_sampler_init_greedy())
    else:
        add(sampler, llama_cpp.llama_sampler_init_top_k(params.top_k))
        add(sampler, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        add(sampler, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(sampler, llama_cpp.llama_sampler_init_temp(params.temp))
        add(sampler, llama_cpp.llama_sampler_init_dist(params.seed))
    for token in prompt:
        llama_cpp.llama_sampler_accept(sampler, token)
    return sampler


def llama_dry(params: SamplingParams, vocab: llama_cpp.llama_vocab_p) -> llama_cpp.llama_sampler_p:
    """llama.cpp's DRY sampler with ``params``' settings."""
    breakers = [breaker.encode() for breaker in params.dry_sequence_breakers]
    texts = (ctypes.c_char_p * len(breakers))(*breakers)
    numbers = (params.dry_multiplier, params.dry_base, params.dry_allowed_length, params.dry_penalty_last_n)
    return llama_cpp.llama_sampler_init_dry(vocab, *numbers, texts, len(breakers))


def llama_cpp_text(paths: Sequence[Path], params: SamplingParams, prompt: list[int], writers: Sequence[int]):
    """llama.cpp's tokens for ``writers`` (the model that writes each step, an index into ``paths``):
    every model reads every token, each step's token drawn by one chain from the writer's row."""
    models = [llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, verbose=False) for path in paths]
    sampler = chain(params, models[0]._model.vocab, prompt)
    for model in models:
        model.eval(prompt)
    out: list[int] = []
    for writer in writers:
        token = llama_cpp.llama_sampler_sample(sampler, models[writer].ctx, -1)
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(models[writer]._model.vocab, token):
            break
        for model in models:
            model.eval([token])
    llama_cpp.llama_sampler_free(sampler)
    for model in models:
        model.close()
    return out


def decoded(
    runners: list[Runner], policy: Policy, params: SamplingParams, count: int = COUNT, **kwargs
) -> tuple[Decoder, list]:
    decoder = Decoder(runners, ("small", "large"), policy, params, max_tokens=count, **kwargs)
    return decoder, list(decoder.run(encode_prompt(runners[0], PROMPT)))


@pytest.mark.parametrize("params", [REPEAT, ALL], ids=["repeat", "all"])
@pytest.mark.parametrize("lookup", [0, 2])
@pytest.mark.parametrize("writer", [0, 1])
def test_one_model_writes_llama_cpps_greedy_text_with_penalties(
    fresh, tiny_pair: tuple[Path, Path], params: SamplingParams, lookup: int, writer: int
) -> None:
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    _, events = decoded(runners, Fixed(writer), params, lookup=lookup, lookup_draft=8)
    expected = llama_cpp_text(tiny_pair, params, prompt, [writer] * COUNT)
    assert [event.token for event in events] == expected
    plain = llama_cpp_text(tiny_pair, SamplingParams(), prompt, [writer] * COUNT)
    assert expected != plain  # the penalties changed the text
    if lookup and params is REPEAT:
        assert runners[writer].stats.guessed_kept > 0  # rows taken from a confirmed guess were penalised


@pytest.mark.parametrize(
    "policy", [lambda: Gate(3.0), lambda: Lookahead(2.0, span=4)], ids=["gate", "lookahead"]
)
def test_the_pair_switching_writes_llama_cpps_text_for_its_schedule(
    fresh, tiny_pair: tuple[Path, Path], policy: Callable[[], Policy]
) -> None:
    """Each model's token drawn from its own row with the penalties of the text both wrote: the
    schedule is ead's (the raw entropy decides it), every token then llama.cpp's; a lookahead draft
    taken back leaves no count behind."""
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    decoder, events = decoded(runners, policy(), REPEAT, lookup=2, lookup_draft=8)
    writers = [("small", "large").index(event.model) for event in events]
    assert set(writers) == {0, 1}
    assert [event.token for event in events] == llama_cpp_text(tiny_pair, REPEAT, prompt, writers)
    if isinstance(decoder.policy, Lookahead):
        assert decoder.summary().rollbacks > 0


@pytest.mark.parametrize("params", [REPEAT, ALL], ids=["repeat", "all"])
def test_verify_judges_each_held_token_with_the_penalties_of_its_own_history(
    fresh, tiny_pair: tuple[Path, Path], tiny_large: Path, params: SamplingParams
) -> None:
    """At ratio 1 a small token stands only where it is the large model's penalised argmax, so the text
    is llama.cpp's large model with penalties, rollbacks and all; and where the small model is the large
    one, whose every token is that argmax, nothing is rolled back."""
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    decoder, events = decoded(runners, Gate(3.0), params, verify=1.0)
    expected = llama_cpp_text(tiny_pair, params, prompt, [1] * COUNT)
    assert [event.token for event in events] == expected
    assert decoder.summary().rollbacks > 0
    decoder, events = decoded(fresh((tiny_large, tiny_large)), Gate(3.0), params, verify=1.0)
    assert [event.token for event in events] == expected
    summary = decoder.summary()
    assert summary.checked > COUNT // 4 and summary.rollbacks == 0


@pytest.mark.parametrize("params", [REPEAT, ALL], ids=["repeat", "all"])
@pytest.mark.parametrize("lookup", [0, 2])
def test_speculative_decoding_keeps_llama_cpps_text_with_penalties(
    fresh, tiny_large: Path, params: SamplingParams, lookup: int
) -> None:
    """The large model drafting for itself: every draft is accepted, so each verified row after the
    first must count the draft tokens before it to give llama.cpp's token."""
    runners = fresh((tiny_large, tiny_large))
    prompt = encode_prompt(runners[0], PROMPT)
    decoder = SpeculativeDecoder(
        runners, ("small", "large"), params, draft=4, max_tokens=COUNT, lookup=lookup, lookup_draft=8
    )
    tokens = [event.token for event in decoder.run(prompt)]
    assert tokens == llama_cpp_text((tiny_large,), params, prompt, [0] * COUNT)
    summary = decoder.summary()
    assert summary.acceptance_rate == 1.0 and summary.drafted > COUNT // 2


def test_a_logit_bias_is_llama_cpps(fresh, tiny_pair: tuple[Path, Path]) -> None:
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    plain = llama_cpp_text(tiny_pair, SamplingParams(), prompt, [1] * COUNT)
    favoured, banned = 97, plain[0]  # 'a'; the first token greedy chose
    params = SamplingParams(repeat_penalty=1.1, logit_bias=((favoured, 7.5), (banned, -100.0)))
    _, events = decoded(runners, Fixed(1), params, lookup=2)
    tokens = [event.token for event in events]
    assert tokens == llama_cpp_text(tiny_pair, params, prompt, [1] * COUNT)
    assert banned not in tokens and favoured in tokens


def test_sampled_text_with_penalties_is_llama_cpps_draw_for_draw(fresh, tiny_pair: tuple[Path, Path]) -> None:
    """temp > 0: the penalised row goes through ead's chain, one draw of its seeded generator a token,
    as llama_sampler_sample's would."""
    params = SamplingParams(
        temp=0.8, seed=7, repeat_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25
    )
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    _, events = decoded(runners, Fixed(1), params)
    assert [event.token for event in events] == llama_cpp_text(tiny_pair, params, prompt, [1] * COUNT)


def test_penalised_is_llama_cpps_penalties_sampler_bit_for_bit() -> None:
    """Positive and negative logits, tokens inside and outside the window, counts above one."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 4, 64).astype(np.float32)
    history = [5, 9, 9, 1, 5, 5, 40, 9, 63, 0, 12, 9]
    params = SamplingParams(repeat_penalty=1.7, repeat_last_n=8, frequency_penalty=-0.3, presence_penalty=1.9)
    sampler = llama_cpp.llama_sampler_init_penalties(64, 8, 1.7, -0.3, 1.9)
    for token in history:
        llama_cpp.llama_sampler_accept(sampler, token)
    candidates = np.empty(64, CANDIDATE)
    candidates["id"], candidates["logit"], candidates["p"] = np.arange(64), logits, 0
    data = candidates.ctypes.data_as(llama_cpp.llama_token_data_p)
    array = llama_cpp.llama_token_data_array(data=data, size=64, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    llama_cpp.llama_sampler_free(sampler)
    row = params.penalised(logits, history)
    assert row.tobytes() == candidates["logit"].tobytes()
    assert not np.array_equal(row, logits)
    assert params.penalised(logits, history, 0) is not logits  # a copy, nothing counted before position 0
    assert np.array_equal(params.penalised(logits, history, 0), logits)
    assert SamplingParams().penalised(logits, history) is logits  # off: the row itself, no copy
    # -1: the whole context (llama-server's and llama-cli's), so every token before the row
    whole = SamplingParams(repeat_penalty=1.7, repeat_last_n=-1, presence_penalty=1.9).penalised(
        logits, history
    )
    sampler = llama_cpp.llama_sampler_init_penalties(64, len(history), 1.7, 0.0, 1.9)
    for token in history:
        llama_cpp.llama_sampler_accept(sampler, token)
    candidates["logit"] = logits
    array = llama_cpp.llama_token_data_array(data=data, size=64, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    llama_cpp.llama_sampler_free(sampler)
    assert whole.tobytes() == candidates["logit"].tobytes()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"repeat_penalty": 0.0}, "--repeat-penalty must be above 0 and finite (1: off), got 0.0"),
        ({"repeat_penalty": float("inf")}, "--repeat-penalty must be above 0 and finite (1: off), got inf"),
        (
            {"repeat_last_n": -2},
            "--repeat-last-n must be at least -1 (-1: the whole context, 0: none), got -2",
        ),
        ({"presence_penalty": 2.5}, "--presence-penalty must be in [-2, 2], got 2.5"),
        ({"frequency_penalty": -2.01}, "--frequency-penalty must be in [-2, 2], got -2.01"),
        ({"frequency_penalty": float("nan")}, "--frequency-penalty must be in [-2, 2], got nan"),
        ({"logit_bias": ((5, 101.0),)}, "--logit-bias must be in [-100, 100], got 101.0 for token 5"),
    ],
)
def test_out_of_range_values_are_one_line_usage_errors(fields: dict, message: str) -> None:
    with pytest.raises(EadError) as caught:
        SamplingParams(**fields)
    assert str(caught.value) == message
    assert caught.value.exit_code == 2


def cli_tokens(pair: tuple[Path, Path], *args: str) -> list[int]:
    result = ead("generate", *pair_args(pair), "--format", "jsonl", "--max-tokens", str(COUNT), *args, PROMPT)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.decode().splitlines() if line.startswith("note:")]
    assert not re.search(r"--(repeat|presence|frequency|logit)", "".join(notes))  # greedy decoding reads them
    return [json.loads(line)["token"] for line in result.stdout.decode().splitlines()[:-1]]


def test_generate_takes_llama_clis_penalty_options(tiny_pair: tuple[Path, Path], tiny_small: Path) -> None:
    with Runner(tiny_small, name="small", n_ctx=512, n_threads=1) as runner:
        prompt = encode_prompt(runner, PROMPT)
    options = ("--repeat-penalty", "1.3", "--repeat-last-n", "16", "--frequency-penalty", "0.5")
    expected = llama_cpp_text(tiny_pair, ALL, prompt, [1] * COUNT)
    assert (
        cli_tokens(tiny_pair, *options, "--presence-penalty", "0.25") == expected
    )  # the large model, lookup on
    assert cli_tokens(tiny_pair, *options, "--presence-penalty", "0.25", "--mode", "spec") == expected
    whole = llama_cpp_text(tiny_pair, replace(ALL, repeat_last_n=4096), prompt, [1] * COUNT)
    assert whole != expected
    assert cli_tokens(tiny_pair, *options, "--presence-penalty", "0.25", "--repeat-last-n", "-1") == whole
    favoured, banned = 97, llama_cpp_text(tiny_pair, SamplingParams(), prompt, [1])[0]
    biased = SamplingParams(repeat_penalty=1.1, logit_bias=((favoured, 7.5), (banned, -100.0)))
    tokens = cli_tokens(
        tiny_pair, "--repeat-penalty", "1.1", "-l", f"{favoured}+7.5", "--logit-bias", f"{banned}-100"
    )
    assert tokens == llama_cpp_text(tiny_pair, biased, prompt, [1] * COUNT)  # llama-cli's -l
    assert banned not in tokens and favoured in tokens


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeat-penalty", "0"], "error: --repeat-penalty must be above 0 and finite (1: off), got 0.0"),
        (["--repeat-penalty", "inf"], "error: --repeat-penalty must be above 0 and finite (1: off), got inf"),
        (
            ["--repeat-last-n", "-2"],
            "error: --repeat-last-n must be at least -1 (-1: the whole context, 0: none), got -2",
        ),
        (["--presence-penalty", "2.5"], "error: --presence-penalty must be in [-2, 2], got 2.5"),
        (["--frequency-penalty", "-3"], "error: --frequency-penalty must be in [-2, 2], got -3.0"),
        (["-l", "300+1"], "error: --logit-bias: token id 300 is not in the vocabulary (ids 0-266)"),
        (["--logit-bias", "30x1"], "error: --logit-bias must be TOKEN_ID+BIAS or TOKEN_ID-BIAS, got '30x1'"),
        # the form is right: the bias is out of bounds ('3+inf' had been "must be TOKEN_ID+BIAS or..."),
        # and llama.cpp's docs' ban, -inf, is named
        (["-l", "3+inf"], "error: --logit-bias must be in [-100, 100], got inf for token 3"),
        (
            ["-l", "3-inf"],
            "error: --logit-bias must be in [-100, 100], got -inf for token 3 (llama-cli's ban: -100 all but "
            "bans it here)",
        ),
        (["-l", "3+nan"], "error: --logit-bias must be TOKEN_ID+BIAS or TOKEN_ID-BIAS, got '3+nan'"),
        (["-l", "3-101"], "error: --logit-bias must be in [-100, 100], got -101.0 for token 3"),
    ],
)
def test_a_bad_penalty_is_one_line_on_the_command_line(
    tiny_pair: tuple[Path, Path], args: list[str], message: str
) -> None:
    assert assert_one_line_error(ead("generate", *pair_args(tiny_pair), *args, "hi"), 2) == message
    if args[0] in ("-l", "--repeat-last-n"):  # chat and serve refuse them at their start, once
        assert assert_one_line_error(ead("chat", *pair_args(tiny_pair), *args, stdin="hi\n"), 2) == message
        assert assert_one_line_error(ead("serve", *pair_args(tiny_pair), *args, "--port", "0"), 2) == message


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The large model alone with prompt lookup (serve's default mode), a context of 512."""
    with serving(
        [*pair_args(tiny_pair), "--ctx", "512"], tmp_path_factory.mktemp("serve") / "server.log"
    ) as running:
        yield running


def completed(server: Server, prompt: list[int], **fields: object) -> list[int]:
    """A text completion's tokens for a prompt of token ids, greedy."""
    body = {"prompt": prompt, "max_tokens": COUNT, "temperature": 0, **fields}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return [token["token"] for token in reply.json()["ead"]["tokens"]]


def test_openai_and_llama_server_fields_write_llama_cpps_text(server: Server, tiny_large: Path) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    with Runner(tiny_large, name="large", n_ctx=512, n_threads=1) as runner:
        prompt = encode_prompt(runner, PROMPT)
    reply = client.completions.create(
        model="ead",
        prompt=prompt,
        max_tokens=COUNT,
        temperature=0,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        extra_body={"repeat_penalty": 1.3, "repeat_last_n": 16},
    )
    tokens = [token["token"] for token in reply.model_extra["ead"]["tokens"]]
    assert tokens == llama_cpp_text((tiny_large,), ALL, prompt, [0] * COUNT)
    plain = llama_cpp_text((tiny_large,), SamplingParams(), prompt, [0] * COUNT)
    favoured, banned = 97, plain[0]
    biased = SamplingParams(repeat_penalty=1.1, logit_bias=((favoured, 7.5), (banned, -100.0)))
    reply = client.completions.create(
        model="ead",
        prompt=prompt,
        max_tokens=COUNT,
        temperature=0,
        logit_bias={str(favoured): 7.5, str(banned): -100},
        extra_body={"repeat_penalty": 1.1},
    )
    tokens = [token["token"] for token in reply.model_extra["ead"]["tokens"]]
    assert tokens == llama_cpp_text((tiny_large,), biased, prompt, [0] * COUNT)
    assert banned not in tokens and favoured in tokens
    assert completed(server, prompt) == plain  # nothing carried over from the requests before


def test_a_samplers_list_that_leaves_the_penalties_out_turns_them_off(
    server: Server, tiny_large: Path
) -> None:
    """llama-server runs the samplers a request's ``samplers`` names (the logit bias always): a list
    without "penalties" answers as if none were given, its default order (as names or letters) with them."""
    with Runner(tiny_large, name="large", n_ctx=512, n_threads=1) as runner:
        prompt = encode_prompt(runner, PROMPT)
    plain = llama_cpp_text((tiny_large,), SamplingParams(), prompt, [0] * COUNT)
    penalised = llama_cpp_text((tiny_large,), ALL, prompt, [0] * COUNT)
    assert plain != penalised
    fields = {"repeat_penalty": 1.3, "repeat_last_n": 16, "frequency_penalty": 0.5, "presence_penalty": 0.25}
    default = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    for samplers, expected in (
        (["top_k", "top_p", "min_p", "temperature"], plain),
        (["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"], plain),
        (default, penalised),
        ("edskypmxt", penalised),
    ):
        assert completed(server, prompt, **fields, samplers=samplers) == expected, samplers
    bias = {str(plain[0]): -100}  # the logit bias stays: llama.cpp's chain always runs it
    unpenalised = completed(server, prompt, **fields, samplers=default[1:], logit_bias=bias)
    assert unpenalised == completed(server, prompt, logit_bias=bias) and plain[0] not in unpenalised


def test_the_servers_options_are_a_requests_defaults(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    options = ["--repeat-penalty", "1.3", "--repeat-last-n", "-1", "--presence-penalty", "0.25"]
    args = [*pair_args(tiny_pair), "--ctx", "512", *options, "--frequency-penalty", "0.5"]
    with Runner(tiny_pair[1], name="large", n_ctx=512, n_threads=1) as runner:
        prompt = encode_prompt(runner, PROMPT)
    plain = llama_cpp_text(tiny_pair[1:], SamplingParams(), prompt, [0] * COUNT)
    with serving(args, tmp_path / "server.log") as running:
        whole = replace(ALL, repeat_last_n=512)  # -1: the whole context
        assert completed(running, prompt) == llama_cpp_text(tiny_pair[1:], whole, prompt, [0] * COUNT)
        assert completed(running, prompt, repeat_penalty=1, presence_penalty=0, frequency_penalty=0) == plain
        assert completed(running, prompt, samplers=["top_k", "top_p", "min_p", "temperature"]) == plain


def ollama_chat(server: Server, options: dict[str, object]) -> list[int]:
    body = {"model": "ead", "messages": [{"role": "user", "content": PROMPT}], "stream": False}
    body["options"] = {"num_predict": COUNT, "temperature": 0, **options}
    reply = httpx.post(f"{server.url}/api/chat", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return [token["token"] for token in reply.json()["ead"]["tokens"]]


def test_ollamas_options_are_the_same_penalties(server: Server) -> None:
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": COUNT, "temperature": 0}
    fields = {"repeat_penalty": 1.3, "presence_penalty": 0.25, "frequency_penalty": 0.5}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json={**chat, **fields, "repeat_last_n": 512})
    assert reply.status_code == 200, reply.text
    expected = [token["token"] for token in reply.json()["ead"]["tokens"]]
    assert ollama_chat(server, {**fields, "repeat_last_n": -1}) == expected  # -1: the whole context
    reply = httpx.post(f"{server.url}/v1/chat/completions", json={**chat, **fields, "repeat_last_n": -1})
    assert [token["token"] for token in reply.json()["ead"]["tokens"]] == expected  # llama-server's -1
    assert ollama_chat(server, {**fields, "repeat_last_n": 16}) != expected
    assert ollama_chat(server, {}) != expected


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"repeat_penalty": 0}, "repeat_penalty", "greater than 0"),
        ({"repeat_last_n": -2}, "repeat_last_n", "greater than or equal to -1"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "greater than or equal to -2"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "less than or equal to 100"),
        ({"logit_bias": {"a": 1}}, "logit_bias", "logit_bias: its keys are token ids, got 'a'"),
        ({"logit_bias": {"-1": 1}}, "logit_bias", "logit_bias: its keys are token ids, got '-1'"),
        (
            {"logit_bias": {"267": 1}},
            "logit_bias",
            "logit_bias: token id 267 is not in the vocabulary (ids 0-266)",
        ),
    ],
)
def test_a_bad_penalty_is_a_400_and_the_server_serves_on(
    server: Server, fields: dict, param: str, fragment: str
) -> None:
    for path, request in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        reply = httpx.post(f"{server.url}{path}", json={**request, "max_tokens": 2, **fields}, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"].startswith(param) and fragment in error["message"], error
    if param in PENALTIES:  # ollama's own spelling, in ollama's shape (its repeat_last_n takes -1)
        options = {param: -2} if param == "repeat_last_n" else fields
        body = {"model": "ead", "prompt": "hi", "stream": False, "options": options}
        reply = httpx.post(f"{server.url}/api/generate", json=body, timeout=60)
        assert reply.status_code == 400, reply.text[:200]
        assert f"options.{param}" in reply.json()["error"], reply.text
    assert len(completed(server, [104, 105], max_tokens=2)) == 2


def test_chat_takes_the_penalties_as_options_and_as_commands(tiny_pair: tuple[Path, Path]) -> None:
    """``ead chat --repeat-penalty`` and ``/repeat-penalty`` answer a first message as ``ead generate``
    does with the option; the settings line says the penalties in force."""
    message = "def f(x): return x + x + x + x + x + x"
    args = [*pair_args(tiny_pair), "--max-tokens", "30"]
    generated = ead("generate", *args, "--repeat-penalty", "1.3", message)
    assert generated.returncode == 0, generated.stderr
    by_option = ead("chat", *args, "--repeat-penalty", "1.3", stdin=message + "\n")
    by_command = ead("chat", *args, stdin=f"/repeat-penalty 1.3\n{message}\n")
    plain = ead("chat", *args, stdin=message + "\n")
    assert by_option.stdout == by_command.stdout == generated.stdout != plain.stdout
    settings = "temp 0 · repeat-penalty 1.3 · repeat-last-n 64 · presence-penalty 0 · frequency-penalty 0 · "
    assert f"{settings}max-tokens 30 (from the next answer)" in by_command.stderr.decode()
    assert "repeat-penalty" not in plain.stderr.decode()


def test_a_grammar_chooses_among_the_penalised_logits(fresh, tiny_large: Path) -> None:
    """JSON mode's grammar heads ead's chain, the penalties act before it: the same tokens as llama.cpp's
    chain of a grammar, the penalties (the prompt accepted into them) and greedy."""
    grammar = 'root ::= [a-e ]+ "."'
    params = SamplingParams(grammar=grammar, repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=2.0)
    runners = fresh((tiny_large, tiny_large))
    prompt = encode_prompt(runners[0], PROMPT)
    _, events = decoded(runners, Fixed(1), params)
    model = llama_cpp.Llama(model_path=str(tiny_large), n_ctx=512, n_threads=1, verbose=False)
    penalties = llama_cpp.llama_sampler_init_penalties(model.n_vocab(), 16, 1.3, 2.0, 0.0)
    for token in prompt:
        llama_cpp.llama_sampler_accept(penalties, token)  # the grammar takes the answer's tokens alone
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(
        sampler, llama_cpp.llama_sampler_init_grammar(model._model.vocab, grammar.encode(), b"root")
    )
    llama_cpp.llama_sampler_chain_add(sampler, penalties)
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
    model.eval(prompt)
    expected = []
    for _ in events:
        expected.append(llama_cpp.llama_sampler_sample(sampler, model.ctx, -1))
        model.eval(expected[-1:])
    llama_cpp.llama_sampler_free(sampler)
    model.close()
    tokens = [event.token for event in events]
    assert tokens == expected and len(tokens) > 8
    _, plain = decoded(fresh((tiny_large, tiny_large)), Fixed(1), SamplingParams(grammar=grammar))
    assert [event.token for event in plain] != tokens  # the penalties moved the choice among the letters

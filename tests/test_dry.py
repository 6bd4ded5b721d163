"""llama.cpp's DRY sampler ("don't repeat yourself"): ead's tokens against llama.cpp's own chain with its DRY
sampler (the prompt accepted first, as llama-server does) over the same tiny models, through the loops that
choose or check a token (one model with prompt lookup, the pair switching, a lookahead's taken-back
draft, --verify 1's rollbacks), on the command line and over HTTP."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
from serve_process import Server
from test_cli import assert_one_line_error, ead
from test_penalties import PROMPT, decoded, llama_cpp_text
from test_samplers import SAMPLED, SCRIPT, args_for, ead_tokens, llama_cpp_tokens
from test_serve import serving
from tiny_models import write_tiny_model

from ead_cli.policies import Fixed, Gate, Lookahead
from ead_cli.prompt import encode_prompt
from ead_cli.sampling import CANDIDATE, DryPenalty, SamplingParams

# tokens compared: past them the greedy text of the small model with DRY meets a near-tie (logits 0.005
# apart) that llama-cpp-python's evaluation, 0.01 off ead's, breaks the other way
COUNT = 56
DRY = SamplingParams(dry_multiplier=0.8)
# its other numbers off their defaults: a base, a length and a window of llama.cpp's choosing
TUNED = SamplingParams(dry_multiplier=0.5, dry_base=3.0, dry_allowed_length=1, dry_penalty_last_n=12)
BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's defaults


@pytest.mark.parametrize("params", [DRY, TUNED], ids=["default", "tuned"])
@pytest.mark.parametrize("lookup", [0, 2])
@pytest.mark.parametrize("writer", [0, 1])
def test_one_model_writes_llama_cpps_greedy_text_with_dry(
    fresh, tiny_pair: tuple[Path, Path], params: SamplingParams, lookup: int, writer: int
) -> None:
    """Each row (a confirmed guess's too) penalised for the text before it, as llama.cpp's DRY sampler
    penalises it, greedy: DRY comes before the choice, so it changes greedy text too."""
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    _, events = decoded(runners, Fixed(writer), params, COUNT, lookup=lookup, lookup_draft=8)
    expected = llama_cpp_text(tiny_pair, params, prompt, [writer] * COUNT)
    assert [event.token for event in events] == expected
    assert expected != llama_cpp_text(tiny_pair, SamplingParams(), prompt, [writer] * COUNT)


@pytest.mark.parametrize(
    "policy", [lambda: Gate(3.0), lambda: Lookahead(2.0, span=4)], ids=["gate", "lookahead"]
)
def test_the_pair_switching_writes_llama_cpps_dry_text_for_its_schedule(
    fresh, tiny_pair: tuple[Path, Path], policy
) -> None:
    """Each model's token from its own row with DRY over the text both wrote; a lookahead's draft taken
    back leaves nothing in DRY's window."""
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    decoder, events = decoded(runners, policy(), DRY, COUNT, lookup=2, lookup_draft=8)
    writers = [("small", "large").index(event.model) for event in events]
    assert set(writers) == {0, 1}
    assert [event.token for event in events] == llama_cpp_text(tiny_pair, DRY, prompt, writers)
    if isinstance(decoder.policy, Lookahead):
        assert decoder.summary().rollbacks > 0


def test_verify_checks_each_held_token_with_dry_over_its_own_history(
    fresh, tiny_pair: tuple[Path, Path]
) -> None:
    """At ratio 1 a small token stands only where it is the large model's argmax after DRY, so the text is
    llama.cpp's large model with DRY, through rollbacks."""
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    decoder, events = decoded(runners, Gate(3.0), DRY, COUNT, verify=1.0)
    assert [event.token for event in events] == llama_cpp_text(tiny_pair, DRY, prompt, [1] * COUNT)
    assert decoder.summary().rollbacks > 0


def test_sampled_text_with_dry_is_llama_cpps_draw_for_draw(fresh, tiny_pair: tuple[Path, Path]) -> None:
    params = replace(DRY, temp=0.8, seed=7)
    runners = fresh()
    prompt = encode_prompt(runners[0], PROMPT)
    _, events = decoded(runners, Fixed(1), params, COUNT)
    expected = llama_cpp_text(tiny_pair, params, prompt, [1] * COUNT)
    assert [event.token for event in events] == expected
    assert expected != llama_cpp_text(tiny_pair, replace(params, dry_multiplier=0.0), prompt, [1] * COUNT)


def test_its_window_follows_the_tokens_it_is_told_through_rollbacks(tiny_large: Path) -> None:
    """The penalty is a function of the tokens before the row: told a history that grew by one, that
    was cut back, or another altogether, it gives what a sampler fed that history alone gives."""
    llm = llama_cpp.Llama(model_path=str(tiny_large), n_ctx=64, n_threads=1, verbose=False)
    vocab, n_vocab = llm._model.vocab, llm.n_vocab()
    rng = np.random.default_rng(5)
    row = rng.normal(0, 3, n_vocab).astype(np.float32)
    params = SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=12)
    told = DryPenalty(params, vocab, context=64)
    repeated = [40, 41, 42, 43] * 5  # the next 40 would extend a long repeat

    def fed_alone(history: list[int]) -> np.ndarray:
        fresh_one = DryPenalty(params, vocab, context=64)
        penalised = fresh_one.penalised(row, history)
        fresh_one.close()
        return penalised

    histories = [repeated[:9], repeated[:10], repeated[:16], repeated[:7], [9] * 3 + repeated[:12], repeated]
    for history in histories:
        assert told.penalised(row, history).tobytes() == fed_alone(history).tobytes()
    assert told.penalised(row, repeated)[40] < row[40]  # a repeat's next token is penalised
    assert told.penalised(row, repeated, end=2)[40] == row[40]  # nothing repeated before position 2
    told.close()
    # llama.cpp's own sampler over the same history, fed token by token
    breakers = (ctypes.c_char_p * len(BREAKERS))(*(breaker.encode() for breaker in BREAKERS))
    sampler = llama_cpp.llama_sampler_init_dry(vocab, 0.8, 1.75, 2, 12, breakers, len(BREAKERS))
    for token in repeated:
        llama_cpp.llama_sampler_accept(sampler, token)
    candidates = np.empty(n_vocab, CANDIDATE)
    candidates["id"], candidates["logit"], candidates["p"] = np.arange(n_vocab), row, 0
    data = candidates.ctypes.data_as(llama_cpp.llama_token_data_p)
    array = llama_cpp.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    llama_cpp.llama_sampler_free(sampler)
    assert fed_alone(repeated).tobytes() == candidates["logit"].tobytes()
    llm.close()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bigram model that writes "6*7 " on a line again and again (its end banned): repeats with a
    breaker, '*', inside them."""
    return write_tiny_model(tmp_path_factory.mktemp("dry") / "scripted.gguf", seed=0, script=SCRIPT)


@pytest.mark.parametrize(
    ("flags", "breakers"),
    [
        ([], BREAKERS),
        (["--dry-sequence-breaker", "none"], ()),
        (
            ["--dry-sequence-breaker", "x", "--dry-sequence-breaker", "none", "--dry-sequence-breaker", "7"],
            ("7",),
        ),
        (["--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "7"], ("\n", "7")),
    ],
)
def test_generate_takes_llama_clis_dry_options(scripted: Path, flags: list[str], breakers: tuple) -> None:
    """--dry-multiplier and --dry-sequence-breaker as llama-cli takes them: given breakers replace the
    defaults, 'none' drops those before it, escapes processed; each set its own text, llama.cpp's."""
    base = [*args_for((scripted, scripted)), "--mode", "large", "--raw", "--max-tokens", "30", "--ignore-eos"]
    ours = ead_tokens(*base, "--dry-multiplier", "0.8", *flags, "x\n")[0]
    theirs = llama_cpp_tokens(scripted, 30, prompt="x\n", dry=replace(DRY, dry_sequence_breakers=breakers))[0]
    assert ours == theirs
    assert ours != ead_tokens(*base, "x\n")[0]
    if breakers != BREAKERS:
        assert ours != ead_tokens(*base, "--dry-multiplier", "0.8", "x\n")[0]


@pytest.mark.parametrize(("sampled", "count"), [([], 40), (SAMPLED, 15)], ids=["greedy", "sampled"])
def test_generates_dry_tokens_are_llama_cpps(tiny_large: Path, sampled: list[str], count: int) -> None:
    """Greedy or drawn (as many tokens as ead's and llama-cpp-python's evaluations keep the same draws:
    their logits differ in the third decimal), the text changed by DRY."""
    base = ["--small", str(tiny_large), "--large", str(tiny_large), "--threads", "1", "--mode", "large"]
    base += ["--raw", "--max-tokens", str(count), *sampled]
    temp, seed = (1.5, 3) if sampled else (0.0, 0)
    theirs = llama_cpp_tokens(tiny_large, count, temp, seed, ignore_eos=False, prompt="hi", dry=DRY)
    assert ead_tokens(*base, "--dry-multiplier", "0.8", "hi")[0] == theirs[0]
    assert ead_tokens(*base, "hi")[0] != theirs[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dry-multiplier", "-1"], "--dry-multiplier must be at least 0 and finite (0: off), got -1.0"),
        (["--dry-multiplier", "inf"], "--dry-multiplier must be at least 0 and finite (0: off), got inf"),
        (["--dry-base", "0.5"], "--dry-base must be at least 1 and finite, got 0.5"),
        (["--dry-allowed-length", "-1"], "--dry-allowed-length must be at least 0, got -1"),
        (["--dry-penalty-last-n", "-1"], "--dry-penalty-last-n must be at least 0, got -1"),
        (["--dry-penalty-last-n", "2147483648"], "--dry-penalty-last-n must be at most 2147483647"),
        (
            ["--dry-sequence-breaker", ""],
            "--dry-sequence-breaker must be 1 to 40 bytes (llama.cpp's limit), got ''",
        ),
        (["--dry-sequence-breaker", "é" * 21], "--dry-sequence-breaker must be 1 to 40 bytes"),
        (["--mode", "spec", "--dry-multiplier", "0.8"], "--dry-multiplier cannot go with --mode spec"),
    ],
)
def test_a_bad_dry_value_is_one_line(tiny_pair: tuple[Path, Path], flags: list[str], message: str) -> None:
    assert_one_line_error(ead("generate", *args_for(tiny_pair), *flags, "hi"), 2, message)


def test_dry_options_left_unused_are_said(tiny_pair: tuple[Path, Path]) -> None:
    """Its other options without a multiplier, and all of them under Mirostat, whose chain has no DRY:
    said, not refused; Mirostat's draws are the same with them."""
    base = [*args_for(tiny_pair), "--mode", "large", "--raw", "--max-tokens", "12"]
    said = ead("generate", *base, "--dry-base", "2", "--dry-sequence-breaker", "7", "hi")
    assert said.returncode == 0
    assert "--dry-multiplier 0 leaves --dry-base, --dry-sequence-breaker unused" in said.stderr.decode()
    mirostat = [*SAMPLED, "--mirostat", "2"]
    with_dry = ead("generate", *base, *mirostat, "--dry-multiplier", "0.8", "hi")
    assert "--mirostat 2 leaves --dry-multiplier unused" in with_dry.stderr.decode()
    assert with_dry.stdout == ead("generate", *base, *mirostat, "hi").stdout


@pytest.fixture(scope="module")
def dry_server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving([*args_for(tiny_pair)], tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def native(server: Server, **fields: object) -> dict:
    body = {"prompt": "hi", "n_predict": 40, "temperature": 0, "return_tokens": True, **fields}
    reply = httpx.post(f"{server.url}/completion", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_requests_dry_fields_are_llama_servers(dry_server: Server, tiny_pair: tuple[Path, Path]) -> None:
    """llama-server's dry_* fields on /completion (its token ids), /v1/completions (the openai client's
    extra_body) and ollama's options: llama.cpp's tokens; the settings say them and list "dry" first among
    the samplers; a base below 1 is the server's, as llama-server reads it; a ``samplers`` that leaves out
    "dry" runs none."""
    fields = {
        "dry_multiplier": 0.8,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
        "dry_sequence_breakers": ["\n"],
    }
    answer = native(dry_server, **fields)
    theirs = llama_cpp_tokens(
        tiny_pair[1], 40, ignore_eos=False, prompt="hi", dry=replace(DRY, dry_sequence_breakers=("\n",))
    )[0]
    assert answer["tokens"] == theirs
    settings = answer["generation_settings"]
    assert {name: settings[name] for name in fields} == fields and settings["dry_base"] == 1.75
    assert settings["samplers"][0] == "dry"
    plain = native(dry_server)
    assert plain["tokens"] != theirs and "dry" not in plain["generation_settings"]["samplers"]
    assert native(dry_server, **fields, dry_base=0.5)["tokens"] == theirs
    assert (
        native(dry_server, **fields, samplers=["top_k", "top_p", "min_p", "temperature"])["tokens"]
        == plain["tokens"]
    )
    client = openai.OpenAI(base_url=dry_server.base_url, api_key="none")
    asked = {"model": "ead", "prompt": "hi", "max_tokens": 40, "temperature": 0}
    assert client.completions.create(**asked, extra_body=fields).choices[0].text == answer["content"]
    options = {"temperature": 0, "num_predict": 40, **fields}
    body = {"model": "ead", "prompt": "hi", "raw": True, "stream": False, "options": options}
    ollama = httpx.post(f"{dry_server.url}/api/generate", json=body, timeout=60)
    assert ollama.status_code == 200 and ollama.json()["response"] == answer["content"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"dry_multiplier": -0.5}, "dry_multiplier"),
        ({"dry_allowed_length": -1}, "dry_allowed_length"),
        ({"dry_penalty_last_n": 2**31}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": ["x" * 41]}, "dry_sequence_breakers.0"),
        ({"dry_multiplier": 0.8, "ead": {"mode": "spec"}}, "dry_multiplier"),
    ],
)
def test_a_bad_dry_field_is_a_400_and_the_server_goes_on(
    dry_server: Server, fields: dict, param: str
) -> None:
    body = {"model": "ead", "prompt": "hi", "max_tokens": 2, **fields}
    reply = httpx.post(f"{dry_server.base_url}/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    plain = {"model": "ead", "prompt": "hi", "max_tokens": 2}
    assert httpx.post(f"{dry_server.base_url}/completions", json=plain, timeout=60).status_code == 200


def test_the_servers_dry_options_are_a_requests_defaults(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """ead serve --dry-multiplier and --dry-sequence-breaker: a request that gives no dry_* field draws
    with them; one that gives dry_multiplier 0 without."""
    breaker = replace(DRY, dry_sequence_breakers=("\n",))
    theirs = llama_cpp_tokens(tiny_pair[1], 40, ignore_eos=False, prompt="hi", dry=breaker)[0]
    options = ["--dry-multiplier", "0.8", "--dry-sequence-breaker", "\\n"]
    with serving([*args_for(tiny_pair), *options], tmp_path / "server.log") as running:
        assert native(running)["tokens"] == theirs
        assert native(running)["generation_settings"]["dry_sequence_breakers"] == ["\n"]
        assert native(running, dry_multiplier=0)["tokens"] != theirs

"""llama.cpp's samplers beyond the penalties: ``--ignore-eos`` (llama-cli's, llama-server's ``ignore_eos``),
which bans every end-of-generation token with a logit bias of -inf, locally typical sampling, top-n-sigma
and XTC in llama.cpp's default chain order, and Mirostat (1 and 2.0) in place of that chain. ead's text,
token for token, against llama.cpp's own sampler chain over the same tiny model, on the command line and
over HTTP."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import openai
import pytest
from serve_process import Server
from test_cli import assert_one_line_error, ead
from test_penalties import llama_dry
from test_serve import serving
from tiny_models import write_tiny_model

from ead_cli.sampling import SamplingParams

# A bigram model that writes "6*7 " after a newline, then ends its turn: it stops early where it may
SCRIPT = ["Ċ", "6", "*", "7", "Ġ", "<|im_end|>"]
PROMPT = "x\n"
SCRIPTED = "6*7 "
COUNT = 12


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("scripted")
    return tuple(  # type: ignore[return-value]
        write_tiny_model(folder / f"scripted{seed}.gguf", seed=seed, script=SCRIPT) for seed in (0, 1)
    )


def args_for(pair: tuple[Path, Path]) -> list[str]:
    return ["--small", str(pair[0]), "--large", str(pair[1]), "--threads", "1", "--ctx", "256"]


def llama_cpp_tokens(
    path: Path,
    count: int,
    temp: float = 0.0,
    seed: int = 0,
    *,
    ignore_eos: bool = True,
    prompt: str = PROMPT,
    typical: float = 1.0,
    top_n_sigma: float = -1.0,
    xtc: tuple[float, float] = (0.0, 0.1),
    mirostat: tuple[int, float, float] = (0, 5.0, 0.1),
    dry: SamplingParams | None = None,
) -> tuple[list[int], str]:
    """llama.cpp's answer to ``prompt``, as common_sampler_init builds its chain: with ``ignore_eos``
    every end-of-generation token's logit bias -inf; then greedy, or its default order, every sampler in
    it (those off at llama.cpp's off values): top-n-sigma, top-k 40, typical, top-p 0.95, min-p 0.05,
    XTC (``xtc``: probability, threshold; seeded as the draw is), the temperature and a seeded draw
    (ead's defaults); or, with ``mirostat`` (version, tau, eta) on, the temperature and Mirostat's draw
    alone; ``dry``: llama.cpp's DRY with its settings after the bias, greedy or not, the prompt accepted
    into the chain first, as llama-server accepts it; up to ``count`` tokens and their text."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
    vocab = llm._model.vocab
    ends = [token for token in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, token)]
    assert ends  # the model has end-of-generation tokens to ban
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    if ignore_eos:
        biases = (llama_cpp.llama_logit_bias * len(ends))(*((token, -math.inf) for token in ends))
        add(sampler, llama_cpp.llama_sampler_init_logit_bias(llm.n_vocab(), len(ends), biases))
    if dry is not None:
        add(sampler, llama_dry(dry, vocab))
    version, tau, eta = mirostat
    if temp == 0:
        add(sampler, llama_cpp.llama_sampler_init_greedy())
    elif version == 1:
        add(sampler, llama_cpp.llama_sampler_init_temp(temp))
        add(sampler, llama_cpp.llama_sampler_init_mirostat(llm.n_vocab(), seed, tau, eta, 100))
    elif version == 2:
        add(sampler, llama_cpp.llama_sampler_init_temp(temp))
        add(sampler, llama_cpp.llama_sampler_init_mirostat_v2(seed, tau, eta))
    else:
        add(sampler, llama_cpp.llama_sampler_init_top_n_sigma(top_n_sigma))
        add(sampler, llama_cpp.llama_sampler_init_top_k(40))
        add(sampler, llama_cpp.llama_sampler_init_typical(typical, 1))
        add(sampler, llama_cpp.llama_sampler_init_top_p(0.95, 1))
        add(sampler, llama_cpp.llama_sampler_init_min_p(0.05, 1))
        add(sampler, llama_cpp.llama_sampler_init_xtc(*xtc, 1, seed))
        add(sampler, llama_cpp.llama_sampler_init_temp(temp))
        add(sampler, llama_cpp.llama_sampler_init_dist(seed))
    prompt_tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    for token in prompt_tokens:
        llama_cpp.llama_sampler_accept(sampler, token)
    llm.eval(prompt_tokens)
    out: list[int] = []
    for _ in range(count):
        token = llama_cpp.llama_sampler_sample(sampler, llm.ctx, -1)
        out.append(token)
        if token in ends:
            break
        llm.eval([token])
    llama_cpp.llama_sampler_free(sampler)
    text = llm.detokenize(out).decode(errors="replace")
    llm.close()
    return out, text


def ead_tokens(*args: str) -> tuple[list[int], str]:
    """``ead generate``'s tokens and finish reason (its JSON lines)."""
    result = ead("generate", *args, "--format", "jsonl")
    assert result.returncode == 0, result.stderr.decode()
    events = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return [event["token"] for event in events if event["type"] == "token"], events[-1]["finish_reason"]


@pytest.mark.parametrize(("mode", "writer"), [("large", 1), ("small", 0)])
def test_ignore_eos_writes_to_the_limit_as_llama_cpp_does(
    scripted: tuple[Path, Path], mode: str, writer: int
) -> None:
    """Without --ignore-eos the model ends its turn after four tokens; with it, it writes --max-tokens,
    llama.cpp's tokens, greedy or sampled (the same seed, the same draws), whichever model writes."""
    base = [*args_for(scripted), "--mode", mode, "--raw", "--max-tokens", str(COUNT)]
    ended, reason = ead_tokens(*base, PROMPT)
    assert (len(ended), reason) == (len(SCRIPT) - 1, "stop")
    expected, text = llama_cpp_tokens(scripted[writer], COUNT)
    assert expected[: len(ended) - 1] == ended[:-1] and text.startswith(SCRIPTED)
    assert ead_tokens(*base, "--ignore-eos", PROMPT) == (expected, "length")
    sampled = llama_cpp_tokens(scripted[writer], COUNT, temp=0.9, seed=7)[0]
    assert ead_tokens(*base, "--ignore-eos", "--temp", "0.9", "--seed", "7", PROMPT) == (sampled, "length")


def test_ignore_eos_takes_no_value(scripted: tuple[Path, Path]) -> None:
    result = ead("generate", *args_for(scripted), "--ignore-eos=yes", PROMPT)
    assert_one_line_error(result, 2, "--ignore-eos")


@pytest.fixture(scope="module")
def server(scripted: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving([*args_for(scripted)], tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def test_a_requests_ignore_eos_writes_to_max_tokens_as_llama_server_does(
    server: Server, scripted: tuple[Path, Path]
) -> None:
    """llama-server's ``ignore_eos``: the answer runs to max_tokens (finish_reason "length"), llama.cpp's
    tokens; without it the model ends its turn (finish_reason "stop")."""
    client = openai.OpenAI(base_url=server.base_url, api_key="none")
    asked = {"model": "ead", "prompt": PROMPT, "max_tokens": COUNT, "temperature": 0}
    ended = client.completions.create(**asked)
    assert (ended.choices[0].text, ended.choices[0].finish_reason) == (SCRIPTED, "stop")
    kept_on = client.completions.create(**asked, extra_body={"ignore_eos": True})
    expected = llama_cpp_tokens(scripted[1], COUNT)[1]  # the default mode's writer
    assert (kept_on.choices[0].text, kept_on.choices[0].finish_reason) == (expected, "length")
    assert kept_on.usage is not None and kept_on.usage.completion_tokens == COUNT
    off = client.completions.create(**asked, extra_body={"ignore_eos": False})
    assert off.choices[0].text == SCRIPTED
    # llama-server's own /completion: its stop type and generation_settings say so
    body = {"prompt": PROMPT, "n_predict": COUNT, "temperature": 0, "ignore_eos": True}
    native = httpx.post(f"{server.url}/completion", json=body, timeout=60).json()
    assert (native["content"], native["stop_type"]) == (expected, "limit")
    assert native["generation_settings"]["ignore_eos"] is True


# JSON mode's 6, then at most llama.cpp's blank: met within the limit, the grammar allows only the end
SIX = {
    "model": "ead",
    "prompt": PROMPT,
    "max_tokens": 64,
    "temperature": 0,
    "response_format": {"type": "json_schema", "json_schema": {"name": "six", "schema": {"const": 6}}},
}


def dead_end(server: Server, **fields: object) -> str:
    """The 400 a grammar met under a ban of the end gives: its message."""
    reply = httpx.post(f"{server.base_url}/completions", json={**SIX, **fields}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "response_format"
    return reply.json()["error"]["message"]


MET = "response_format: the grammar allows no token here: no answer can meet it, or only by its end, which"


def test_a_grammar_met_under_a_requests_ignore_eos_names_that_field(server: Server) -> None:
    """The caller gave ``ignore_eos`` in the request, no --ignore-eos: the 400 names what it gave."""
    assert dead_end(server, ignore_eos=True) == f"{MET} the request's ignore_eos bans"


def test_serves_ignore_eos_is_its_requests_default(scripted: tuple[Path, Path], tmp_path: Path) -> None:
    """``ead serve --ignore-eos``: every answer runs to its limit, unless a request's ignore_eos is false;
    a grammar met under it names the server's flag, or the request's field where it gave it too."""
    asked = {"model": "ead", "prompt": PROMPT, "max_tokens": COUNT, "temperature": 0}
    with serving([*args_for(scripted), "--ignore-eos"], tmp_path / "server.log") as running:
        client = openai.OpenAI(base_url=running.base_url, api_key="none")
        kept_on = client.completions.create(**asked).choices[0]
        ended = client.completions.create(**asked, extra_body={"ignore_eos": False}).choices[0]
        assert dead_end(running) == f"{MET} the server's --ignore-eos bans"
        assert dead_end(running, ignore_eos=True) == f"{MET} the request's ignore_eos bans"
    assert (kept_on.text, kept_on.finish_reason) == (llama_cpp_tokens(scripted[1], COUNT)[1], "length")
    assert (ended.text, ended.finish_reason) == (SCRIPTED, "stop")


def test_an_ignore_eos_that_is_no_boolean_is_a_400_and_the_server_goes_on(server: Server) -> None:
    body = {"model": "ead", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": "yes"}
    reply = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "ignore_eos"
    body["ignore_eos"] = False
    assert httpx.post(f"{server.base_url}/completions", json=body, timeout=60).status_code == 200


# Each of llama.cpp's samplers ead adds to its chain, given as on the command line and as llama_cpp_tokens
# takes it; values that cut this tiny model's candidates, so each changes the draws
CHAIN_SAMPLERS = [
    (["--typical", "0.5"], {"typical": 0.5}),
    (["--top-n-sigma", "0.5"], {"top_n_sigma": 0.5}),
    (["--xtc-probability", "0.9", "--xtc-threshold", "0.05"], {"xtc": (0.9, 0.05)}),
    (["--mirostat", "2", "--mirostat-ent", "3"], {"mirostat": (2, 3.0, 0.1)}),
    (["--mirostat", "1", "--mirostat-ent", "3", "--mirostat-lr", "0.5"], {"mirostat": (1, 3.0, 0.5)}),
]
SAMPLED = ["--temp", "1.5", "--seed", "3"]


@pytest.mark.parametrize(("flags", "chain"), CHAIN_SAMPLERS)
def test_typical_top_n_sigma_xtc_and_mirostat_draw_as_llama_cpps_chain_does(
    tiny_large: Path, flags: list[str], chain: dict
) -> None:
    """The same seed, the same draws as llama.cpp's default chain with the sampler on, and others than
    without it; greedy decoding leaves it unused (said in a note), its tokens unchanged."""
    base = ["--small", str(tiny_large), "--large", str(tiny_large), "--threads", "1", "--mode", "large"]
    base += ["--raw", "--max-tokens", "24"]
    theirs = llama_cpp_tokens(tiny_large, 24, 1.5, 3, ignore_eos=False, prompt="hi", **chain)[0]
    ours = ead_tokens(*base, *SAMPLED, *flags, "hi")[0]
    assert ours == theirs
    assert ours != ead_tokens(*base, *SAMPLED, "hi")[0]
    greedy = ead("generate", *base, "--temp", "0", *flags, "hi")
    assert greedy.returncode == 0 and greedy.stdout == ead("generate", *base, "--temp", "0", "hi").stdout
    assert f"--temp 0 leaves {flags[0]}" in greedy.stderr.decode()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--typical", "0"], "--typical must be in (0, 1]"),
        (["--top-n-sigma", "nan"], "--top-n-sigma must be finite (0 or less: off), got nan"),
        (["--xtc-probability", "1.5"], "--xtc-probability must be in [0, 1]"),
        (["--xtc-threshold", "-0.1"], "--xtc-threshold must be in [0, 1]"),
        (["--mode", "spec", "--temp", "1", "--typical", "0.5"], "--typical cannot go with --mode spec"),
        (["--mirostat", "3"], "--mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got 3"),
        (["--mirostat-ent", "nan"], "--mirostat-ent must be at least 0 and finite, got nan"),
        (["--mirostat-lr", "-0.1"], "--mirostat-lr must be at least 0 and finite, got -0.1"),
        (["--mode", "spec", "--temp", "1", "--mirostat", "2"], "--mirostat cannot go with --mode spec"),
        (
            ["--mode", "ead", "--verify", "0.5", "--temp", "1", "--mirostat", "2"],
            "--mirostat cannot go with --verify: Mirostat's running target cannot take a token back",
        ),
    ],
)
def test_a_bad_sampler_value_is_one_line(
    tiny_pair: tuple[Path, Path], flags: list[str], message: str
) -> None:
    result = ead("generate", *args_for(tiny_pair), *flags, "hi")
    assert_one_line_error(result, 2, message)


# The same samplers as llama-server's request fields, each with llama_cpp_tokens' spelling of it
SERVED_SAMPLERS = [
    ({"typical_p": 0.5}, {"typical": 0.5}),
    ({"top_n_sigma": 0.5}, {"top_n_sigma": 0.5}),
    ({"xtc_probability": 0.9, "xtc_threshold": 0.05}, {"xtc": (0.9, 0.05)}),
    ({"mirostat": 2, "mirostat_tau": 3.0}, {"mirostat": (2, 3.0, 0.1)}),
    ({"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.5}, {"mirostat": (1, 3.0, 0.5)}),
]


@pytest.fixture(scope="module")
def sampling_server(
    tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with serving([*args_for(tiny_pair)], tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


@pytest.mark.parametrize(("fields", "chain"), SERVED_SAMPLERS)
def test_a_requests_samplers_draw_as_llama_cpps_chain_does(
    sampling_server: Server, tiny_pair: tuple[Path, Path], fields: dict, chain: dict
) -> None:
    """llama-server's typical_p, top_n_sigma, xtc_* and mirostat* on /completion (its token ids) and
    /v1/completions (the openai client's extra_body): llama.cpp's draws for the seed; the settings say
    them."""
    sampled = {"prompt": "hi", "n_predict": 24, "temperature": 1.5, "seed": 3, "return_tokens": True}
    native = httpx.post(f"{sampling_server.url}/completion", json={**sampled, **fields}, timeout=60).json()
    theirs = llama_cpp_tokens(tiny_pair[1], 24, 1.5, 3, ignore_eos=False, prompt="hi", **chain)[0]
    assert native["tokens"] == theirs
    assert {name: native["generation_settings"][name] for name in fields} == fields
    client = openai.OpenAI(base_url=sampling_server.base_url, api_key="none")
    asked = {"model": "ead", "prompt": "hi", "max_tokens": 24, "temperature": 1.5, "seed": 3}
    assert client.completions.create(**asked, extra_body=fields).choices[0].text == native["content"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"typical_p": 0}, "typical_p"),
        ({"xtc_probability": 1.5}, "xtc_probability"),
        ({"top_n_sigma": "1"}, "top_n_sigma"),
        ({"typical_p": 0.5, "ead": {"mode": "spec"}}, "typical_p"),
        ({"mirostat": 3}, "mirostat"),
        ({"mirostat": 2.0}, "mirostat"),
        ({"mirostat_tau": -1}, "mirostat_tau"),
        ({"mirostat": 2, "ead": {"mode": "spec"}}, "mirostat"),
        ({"mirostat": 2, "ead": {"verify": 0.5}}, "mirostat"),
    ],
)
def test_a_bad_sampler_field_is_a_400_and_the_server_goes_on(
    sampling_server: Server, fields: dict, param: str
) -> None:
    body = {"model": "ead", "prompt": "hi", "max_tokens": 2, "temperature": 1, **fields}
    reply = httpx.post(f"{sampling_server.base_url}/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    plain = {"model": "ead", "prompt": "hi", "max_tokens": 2}
    assert httpx.post(f"{sampling_server.base_url}/completions", json=plain, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("fields", "bad"),
    [({"typical_p": 0.5}, {"typical_p": 0}), ({"mirostat": 2, "mirostat_tau": 3.0}, {"mirostat": 3})],
)
def test_ollamas_sampler_options_are_llama_servers(sampling_server: Server, fields: dict, bad: dict) -> None:
    """ollama's options.typical_p and mirostat*, as the top-level fields draw; out of their bounds,
    ollama's 400 naming the option."""
    options = {"temperature": 1.5, "seed": 3, "num_predict": 24, **fields}
    body = {"model": "ead", "prompt": "hi", "raw": True, "stream": False, "options": options}
    answer = httpx.post(f"{sampling_server.url}/api/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    sampled = {"prompt": "hi", "n_predict": 24, "temperature": 1.5, "seed": 3, **fields}
    native = httpx.post(f"{sampling_server.url}/completion", json=sampled, timeout=60).json()
    assert answer.json()["response"] == native["content"]
    plain = {"prompt": "hi", "n_predict": 24, "temperature": 1.5, "seed": 3}
    assert (
        native["content"]
        != httpx.post(f"{sampling_server.url}/completion", json=plain, timeout=60).json()["content"]
    )
    body["options"] = options | bad
    refused = httpx.post(f"{sampling_server.url}/api/generate", json=body, timeout=60)
    assert refused.status_code == 400 and f"options.{next(iter(bad))}" in refused.json()["error"]


def test_mirostat_runs_in_place_of_the_penalties_as_llama_cpps_chain_does(tiny_large: Path) -> None:
    """llama.cpp's Mirostat chain has no penalties sampler: --repeat-penalty and the rest change no draw
    under it, and a note says that --mirostat leaves them unused; without it, they do change the draws."""
    base = ["--small", str(tiny_large), "--large", str(tiny_large), "--threads", "1", "--mode", "large"]
    base += ["--raw", "--max-tokens", "24", *SAMPLED]
    mirostat = ["--mirostat", "2", "--mirostat-ent", "3"]
    penalised = ["--repeat-penalty", "1.5", "--top-k", "2", "hi"]
    assert ead_tokens(*base, *mirostat, *penalised) == ead_tokens(*base, *mirostat, "hi")
    assert ead_tokens(*base, *penalised) != ead_tokens(*base, "hi")
    said = ead("generate", *base, *mirostat, *penalised).stderr.decode()
    assert "--mirostat 2 leaves --top-k, --repeat-penalty unused" in said


def test_a_grammar_that_must_end_where_ignore_eos_bans_the_end_says_so(scripted: tuple[Path, Path]) -> None:
    """A grammar met leaves only the end of generation, which --ignore-eos bans: one line naming both, the
    text written so far kept (as any grammar's dead end), exit 1."""
    args = [*args_for(scripted), "--mode", "large", "--raw", "--max-tokens", str(COUNT), "--ignore-eos"]
    result = ead("generate", *args, "--grammar", 'root ::= "6"', PROMPT)
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err
    assert result.stdout.decode().rstrip("\n") == "6"
    assert err.splitlines()[-1] == (
        "error: the grammar allows no token here: no answer can meet it, or only by its end, which "
        "--ignore-eos bans"
    )


def test_a_requests_samplers_list_runs_the_samplers_it_names(sampling_server: Server) -> None:
    """llama-server runs only the samplers ``samplers`` names: typical_p with a list that leaves out
    "typ_p" draws as without it; with its default order, which names it (as names or --sampler-seq's
    letters), as with it alone."""

    def tokens(**fields: object) -> list[int]:
        sampled = {"prompt": "hi", "n_predict": 24, "temperature": 1.5, "seed": 3, "return_tokens": True}
        reply = httpx.post(f"{sampling_server.url}/completion", json={**sampled, **fields}, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["tokens"]

    plain, typical = tokens(), tokens(typical_p=0.5)
    assert plain != typical
    assert tokens(typical_p=0.5, samplers=["top_k", "top_p", "min_p", "temperature"]) == plain
    default = ["dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    assert tokens(typical_p=0.5, samplers=default) == typical
    assert tokens(typical_p=0.5, samplers="dskypmxt") == typical


def test_completions_generation_settings_list_the_samplers_that_run(sampling_server: Server) -> None:
    """llama-server's /completion lists the samplers run, in its names and chain order: typical,
    top-n-sigma and XTC among ead's four where a request turns them on, not ead's four alone."""
    body = {"prompt": PROMPT, "n_predict": 2, "typical_p": 0.5, "top_n_sigma": 1.0, "xtc_probability": 0.5}
    settings = httpx.post(f"{sampling_server.url}/completion", json=body, timeout=60).json()
    assert settings["generation_settings"]["samplers"] == [
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    ]
    plain = httpx.post(
        f"{sampling_server.url}/completion", json={"prompt": PROMPT, "n_predict": 2}, timeout=60
    )
    assert plain.json()["generation_settings"]["samplers"] == ["top_k", "top_p", "min_p", "temperature"]

"""Fill-in-the-middle on a real `ead serve` over a tiny pair with FIM tokens: llama-server's /infill
(whole and streamed, through httpx), ``suffix`` on /v1/completions (the openai client) and on ollama's
/api/generate (the ollama client), each the same answer; the prompt and greedy answer of a real
llama-server's /infill on the same model; the editor plugins' requests (llama.vim's, llama.vscode's)
answered in llama-server's shape, with its response_fields, n_indent, t_max_predict_ms and infill
sampler; and bad requests, each a 400 naming its field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_fim import long_text
from test_serve import TAU, serving
from test_serve_native import post
from test_serve_safety import wait_until
from tiny_models import write_tiny_model

from ead_cli.bench import native
from ead_cli.remote import built_server

N_CTX = 4096  # past the batch (512) and twice the answer: room for extra files (the models' training
# context too: llama-server caps its slot's context there)
MAX_TOKENS = 16
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
EXTRA = [{"filename": "util.py", "text": "X = 1\n"}, {"text": "Y = 2\n"}]
LARGE = {"mode": "large"}  # the large model alone writes: the answer a llama-server on it gives
OLLAMA_GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def fim_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fim")
    return tuple(
        write_tiny_model(folder / f"{name}.gguf", seed=seed, vocab="fim", n_ctx_train=N_CTX)
        for seed, name in ((0, "small"), (1, "large"))
    )  # type: ignore[return-value]


@pytest.fixture(scope="module")
def server(fim_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [*pair_args(fim_pair), *TAU, "--ctx", str(N_CTX), "--no-reuse", "--max-tokens", str(MAX_TOKENS)]
    with serving(args, tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def infill(server: Server, **body: Any) -> dict[str, Any]:
    reply = post(server, "/infill", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_infills_choices_and_a_batch_of_prefixes_each_fill_the_middle(server: Server) -> None:
    """/infill's n_cmpl 2: a list of two objects, each the infill its seed gets alone; /v1/completions'
    batch of two prefixes with one suffix: each the suffixed completion of its prefix alone."""
    asked = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6, "temperature": 1.5}
    both = infill(server, **asked, n_cmpl=2, seed=3)
    assert [each["index"] for each in both] == [0, 1]
    alone = [infill(server, **asked, seed=seed)["content"] for seed in (3, 4)]
    assert [each["content"] for each in both] == alone and alone[0] != alone[1]
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    prefixes = [PREFIX, "def sub(a, b):\n    "]
    batch = client.completions.create(
        model="ead", prompt=prefixes, suffix=SUFFIX, max_tokens=6, temperature=0
    )
    each = [
        client.completions.create(model="ead", prompt=prefix, suffix=SUFFIX, max_tokens=6, temperature=0)
        for prefix in prefixes
    ]
    assert [choice.text for choice in batch.choices] == [answer.choices[0].text for answer in each]
    assert batch.usage.prompt_tokens == sum(answer.usage.prompt_tokens for answer in each)


def test_infill_whole_and_streamed_is_the_suffixed_completion(server: Server) -> None:
    whole = infill(
        server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8, temperature=0, return_tokens=True
    )
    opening = "<|repo_name|>myproject\n<|file_sep|>filename\n"
    assert whole["prompt"] == f"{opening}<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    assert whole["tokens_predicted"] == len(whole["tokens"]) == 8 and whole["stop_type"] == "limit"
    assert {token["model"] for token in whole["ead"]["tokens"]} == {"small", "large"}  # the pair wrote it

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    text = client.completions.create(model="ead", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0)
    assert text.choices[0].text == whole["content"] and text.usage.prompt_tokens == whole["tokens_evaluated"]
    pieces = client.completions.create(
        model="ead", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in pieces if chunk.choices) == whole["content"]

    events = []
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/infill", json=body, timeout=120) as streamed:
        for line in streamed.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    assert [event["stop"] for event in events] == [False] * 8 + [True]
    assert "".join(event["content"] for event in events) == whole["content"]
    assert [token for event in events[:-1] for token in event["tokens"]] == whole["tokens"]
    assert events[-1]["prompt"] == whole["prompt"] and events[-1]["stop_type"] == "limit"


def test_extra_files_and_the_prompt_after_the_prefix_go_where_llama_server_puts_them(server: Server) -> None:
    whole = infill(
        server, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=EXTRA, prompt="ret", n_predict=1
    )
    assert whole["prompt"] == (
        "<|repo_name|>myproject\n<|file_sep|>util.py\nX = 1\n<|file_sep|>tmp\nY = 2\n"
        f"<|file_sep|>filename\n<|fim_prefix|>{PREFIX}ret<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    )
    at_the_end = infill(server, input_prefix=PREFIX, input_suffix="", n_predict=1)  # nothing after the cursor
    assert at_the_end["prompt"].endswith(f"<|fim_prefix|>{PREFIX}<|fim_suffix|><|fim_middle|>")


def test_ollamas_generate_with_a_suffix_is_the_same_completion(server: Server) -> None:
    expected = infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8, temperature=0)
    talk = ollama.Client(host=server.url, timeout=120)
    assert talk.show("ead").capabilities == ["completion", "insert"]  # what clients look for before a suffix
    answer = talk.generate(model="ead", prompt=PREFIX, suffix=SUFFIX, options=OLLAMA_GREEDY, raw=True)
    assert answer.response == expected["content"] and answer.prompt_eval_count == expected["tokens_evaluated"]
    streamed = talk.generate(model="ead", prompt=PREFIX, suffix=SUFFIX, options=OLLAMA_GREEDY, stream=True)
    assert "".join(part.response for part in streamed) == expected["content"]


def test_response_fields_keep_the_fields_named_each_under_its_path(server: Server) -> None:
    """llama-server's json_get_nested_values: a path's keys split at '/', a path the answer lacks left
    out; streamed, on the last object alone (llama-server writes each token's event whole)."""
    asked = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 3, "temperature": 0}
    whole = infill(server, **asked)
    named = ["content", "timings/predicted_n", "generation_settings/n_predict", "timings/nope", "", "stop"]
    picked = infill(server, **asked, response_fields=named)
    assert picked == {
        "content": whole["content"],
        "timings/predicted_n": 3,
        "generation_settings/n_predict": 3,
        "stop": True,
    }
    assert infill(server, **asked, response_fields=[""]) == {}  # llama.vim's prefetch: nothing back
    body = {**asked, "stream": True, "response_fields": ["content", "stop"]}
    with httpx.stream("POST", f"{server.url}/infill", json=body, timeout=120) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"content": "", "stop": True}  # streamed, the text is the events'
    assert all("tokens_predicted" in event for event in events[:-1])
    assert "".join(event["content"] for event in events) == whole["content"]


def test_n_indent_and_t_max_predict_ms_end_an_answer_of_newlines_as_llama_server_does(server: Server) -> None:
    """A bias makes every token a newline: with n_indent the second line, blank, is cut at once; with
    t_max_predict_ms 1 the answer ends at a newline once a millisecond has passed, long before its
    limit; both as llama-server's stop type "limit". Without either, the limit ends it."""
    newline = post(server, "/tokenize", {"content": "\n"}).json()["tokens"]
    asked = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 64, "temperature": 0}
    asked |= {"logit_bias": {str(newline[0]): 100}}
    assert infill(server, **asked)["content"] == "\n" * 64
    indented = infill(server, **asked, n_indent=1)
    assert indented["content"] == "\n" and indented["stop_type"] == "limit"
    assert indented["tokens_predicted"] == 2  # ead stops at the line, not a token later as llama-server
    timed = infill(server, **asked, t_max_predict_ms=1)
    assert timed["content"] == "\n" * timed["tokens_predicted"] and timed["tokens_predicted"] < 64
    assert timed["stop_type"] == "limit"


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_n_indent_counts_a_tab_and_a_space_one_each_as_llama_server_does(tmp_path: Path) -> None:
    """A model that writes "a", a newline, a tab, a space and "b": with n_indent 2 the line is indented
    enough and the answer ends at its end of turn; with 3 it is cut after its blanks. The text and the
    stop type are llama-server's."""
    script = ["<|fim_middle|>", "a", "Ċ", "ĉ", "Ġ", "b", "<|im_end|>"]
    model = write_tiny_model(tmp_path / "indent.gguf", vocab="fim", n_ctx_train=N_CTX, script=script)
    greedy = {"input_prefix": "", "input_suffix": "", "n_predict": 8, "temperature": 0}
    bodies = [{**greedy, "n_indent": n_indent} for n_indent in (2, 3)]
    args = ["-c", str(N_CTX), "-t", "1"]
    theirs = [llama_server_infill(model, tmp_path / f"{i}.log", body, args) for i, body in enumerate(bodies)]
    alone = ["--small", str(model), "--large", str(model), "--threads", "1"]
    with Server(alone, tmp_path / "ead.log") as ead:
        ours = [infill(ead, **body) for body in bodies]
        assert ead.stop() == 0
    ended = [(answer["content"], answer["stop_type"]) for answer in ours]
    assert ended == [("a\n\t b", "eos"), ("a\n\t ", "limit")]
    assert ended == [(answer["content"], answer["stop_type"]) for answer in theirs]


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_infill_samplers_answer_is_llama_servers(
    server: Server, fim_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """llama.vim's samplers (top_k, top_p, infill: min_p and the temperature unnamed, so off) and a seed
    draw llama-server's tokens on the large model alone; samplers out of ead's order, or the infill
    sampler in speculative decoding (whose acceptance test has no infill), stay a 400."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": MAX_TOKENS, "seed": 5}
    body |= {"top_k": 40, "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"], "return_tokens": True}
    args = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-n", str(MAX_TOKENS), "-t", "1"]
    theirs = llama_server_infill(fim_pair[1], tmp_path / "llama-server.log", body, args)
    ours = infill(server, **body, ead=LARGE)
    assert ours["tokens"] == theirs["tokens"] and ours["content"] == theirs["content"]
    plain = infill(server, **{**body, "samplers": ["top_k", "top_p"]}, ead=LARGE)
    assert plain["tokens"] != ours["tokens"]  # the infill sampler changed the draws
    for refused in ({**body, "samplers": ["infill", "top_k"]}, {**body, "ead": {"mode": "spec"}}):
        reply = post(server, "/infill", refused)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "samplers", reply.text


# The requests llama.vim (autoload/llama.vim: llama#fim, s:ring_update) and llama.vscode
# (src/llama-server.ts: createRequestPayload) send to /infill, each a completion at the cursor and a
# request that only reads the ring buffer's chunks of other files into the cache (n_predict: 0).
EDITOR_REQUESTS = sorted((Path(__file__).parent / "editor_requests").glob("*.json"))


@pytest.mark.parametrize("request_file", EDITOR_REQUESTS, ids=lambda path: path.stem)
def test_the_editor_plugins_requests_are_answered_in_llama_servers_shape(
    server: Server, request_file: Path
) -> None:
    body = json.loads(request_file.read_text())
    reply = post(server, "/infill", body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    fields = body.get("response_fields")
    if fields:  # only the fields named that the answer has, each under its path
        assert list(answer) == [field for field in fields if field]
        assert isinstance(answer.get("content", ""), str)
        return
    assert answer["stop"] is True and answer["tokens_predicted"] <= max(body["n_predict"], 1)
    if body["n_predict"] == 0:  # llama-server writes a token before it checks its limit
        assert answer["tokens_predicted"] == 1 and answer["stop_type"] == "limit"
    extra = "".join(f"<|file_sep|>{file['filename']}\n{file['text']}" for file in body["input_extra"])
    assert answer["prompt"].startswith(f"<|repo_name|>myproject\n{extra}<|file_sep|>filename\n")


# The samplers of ead's chain, under their generation_settings fields: one left out of ``samplers`` is
# there at its off value, as ead runs it (llama-server lists its unused setting)
CHAIN_FIELDS = {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "temperature": "temperature"}
CHAIN_FIELDS |= {"repeat_last_n": "penalties", "repeat_penalty": "penalties"}


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_generation_settings_are_llama_servers_where_ead_has_them(
    server: Server, fim_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each editor request's generation_settings: every field ead writes is llama-server's, of its JSON
    type, with its value (the samplers named, n_predict as asked, penalties, biases, the samplers ead
    does not run at their off values) but the seed drawn (llama-server's 4294967295 where none is given)
    and the samplers left out."""
    bodies = [json.loads(path.read_text()) for path in EDITOR_REQUESTS]
    bodies = [{key: value for key, value in body.items() if key != "response_fields"} for body in bodies]
    bodies[0] |= {"logit_bias": {"5": 1.5}, "repeat_penalty": 1.1, "repeat_last_n": 32}
    bodies[0]["samplers"] = ["penalties", *bodies[0]["samplers"]]
    args = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-n", str(MAX_TOKENS), "-t", "1"]
    with native.llama_server(fim_pair[1], args, tmp_path / "llama-server.log") as peer:
        wait_loaded(peer)
        theirs = [httpx.post(f"{peer.url}/infill", json=body, timeout=300).json() for body in bodies]
    for body, their in zip(bodies, theirs, strict=True):
        ours = infill(server, **body, ead=LARGE)["generation_settings"]
        expected = their["generation_settings"]
        left_out = {name for name, sampler in CHAIN_FIELDS.items() if sampler not in ours["samplers"]}
        for name, value in ours.items():
            assert type(value) is type(expected[name]), name
            if name != "seed" and name not in left_out:
                wanted = pytest.approx(expected[name]) if type(value) is float else expected[name]
                assert value == wanted, name
        assert len(ours) >= 24  # the fields ead has a value for


EMPTY = {"input_prefix": "", "input_suffix": ""}
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/infill", {"input_suffix": ""}, "input_prefix", "input_prefix: Field required"),
        ("/infill", {**EMPTY, "input_suffix": 1}, "input_suffix", "input_suffix: Input should be a valid"),
        ("/infill", {**EMPTY, "input_extra": {"text": "x"}}, "input_extra", "input_extra: Input should"),
        ("/infill", {**EMPTY, "input_extra": [{}]}, "input_extra.0.text", "input_extra.0.text: Field"),
        ("/infill", {**EMPTY, "input_extra": [{"text": "\0"}]}, "input_extra.0.text", "input_extra.0.text c"),
        ("/infill", {**EMPTY, "input_prefix": "a\x00"}, "input_prefix", "the input_prefix contains a NUL"),
        ("/infill", {**EMPTY, "input_suffix": "\x00"}, "input_suffix", "the input_suffix contains a NUL"),
        ("/infill", {**EMPTY, "prompt": ["a"]}, "prompt", "prompt: Input should be a valid string"),
        ("/infill", {**EMPTY, "prompt": "y " * 5000}, "prompt", "the prompt is 10024 tokens"),
        ("/infill", {**EMPTY, "prompt": "<|im_end|>" * 5000}, "prompt", "the prompt holds 4096 or more"),
        ("/v1/completions", {"prompt": [1, 2], "suffix": "x"}, "suffix", "suffix: fill-in-the-middle reads"),
        ("/v1/chat/completions", {"messages": HI, "suffix": "x"}, "suffix", "suffix: fill-in-the-middle is"),
    ],
)  # fmt: skip
def test_bad_requests_are_a_400_naming_the_field(
    server: Server, path: str, body: dict[str, Any], param: str, message: str
) -> None:
    reply = post(server, path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"].startswith(message), error
    assert infill(server, input_prefix="a", input_suffix="b", n_predict=1)["tokens_predicted"] == 1


def test_ollamas_suffix_with_a_system_text_is_its_400(server: Server) -> None:
    body = {"model": "ead", "prompt": "a", "suffix": "b", "system": "be brief", "stream": False}
    reply = post(server, "/api/generate", body)
    assert reply.status_code == 400
    assert reply.json() == {"error": "system: a fill-in-the-middle prompt has no place for a system text"}


def wait_loaded(peer: native.Server) -> None:
    """Until llama-server has loaded its model: it listens first, answering 503 on /health meanwhile."""
    wait_until(lambda: httpx.get(f"{peer.url}/health", timeout=10).status_code == 200, 60)


def llama_server_infill(model: Path, log: Path, body: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """A real llama-server's /infill answer on ``model``."""
    with native.llama_server(model, args, log) as peer:
        wait_loaded(peer)
        reply = httpx.post(f"{peer.url}/infill", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_prompt_and_greedy_answer_are_llama_servers(
    server: Server, fim_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """llama-server with ead serve's context, batch and answer limit (its -n, which sizes the room left
    to the extra files) reads the same prompt and writes the same greedy answer as the large model alone;
    a long prefix and suffix cut to the same tokens (ead reads them near the cut alone)."""
    body = {
        "input_prefix": long_text(2000) + PREFIX,
        "input_suffix": SUFFIX + long_text(2000),
        "input_extra": EXTRA,
        "prompt": "ret",
        "n_predict": MAX_TOKENS,
        "temperature": 0,
        "return_tokens": True,
    }
    args = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-n", str(MAX_TOKENS), "-t", "1"]
    theirs = llama_server_infill(fim_pair[1], tmp_path / "llama-server.log", body, args)
    ours = infill(server, **body, ead=LARGE)
    assert ours["prompt"] == theirs["prompt"] and ours["tokens_evaluated"] == theirs["tokens_evaluated"]
    assert ours["tokens"] == theirs["tokens"] and ours["content"] == theirs["content"]
    assert ours["stop_type"] == theirs["stop_type"]


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_extra_files_room_is_sized_by_the_servers_limit_as_llama_servers(
    server: Server, fim_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """llama-server leaves the extra files the context less a batch and twice its own -n, whatever the
    request's n_predict: a file longer than that room is cut to the same last tokens."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 1, "temperature": 0}
    body |= {"input_extra": [{"filename": "big.py", "text": "x = 1\n" * 1000}]}
    args = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-n", str(MAX_TOKENS), "-t", "1"]
    theirs = llama_server_infill(fim_pair[1], tmp_path / "llama-server.log", body, args)
    ours = infill(server, **body, ead=LARGE)
    assert not theirs["prompt"].startswith("<|repo_name|>")  # the file was cut: its start is gone
    assert ours["prompt"] == theirs["prompt"] and ours["tokens_evaluated"] == theirs["tokens_evaluated"]


@pytest.mark.real
@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_real_coder_fills_the_middle_as_llama_server_does(
    real_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The demo's 0.5B coder, alone, on ead serve and on llama-server: the same prompt and greedy middle,
    ended by an end-of-generation token before the limit."""
    after = "\n\n\ndef sub(a, b):\n    return a - b\n"  # code after the cursor: the middle ends
    body = {"input_prefix": PREFIX, "input_suffix": after, "n_predict": 64}
    body |= {"temperature": 0, "return_tokens": True}
    args = ["-c", "2048", "-b", "512", "-ub", "512", "-n", "64", "-t", "2"]
    theirs = llama_server_infill(real_pair[0], tmp_path / "llama-server.log", body, args)
    small = str(real_pair[0])
    command = ["--small", small, "--large", small, "--ctx", "2048", "--max-tokens", "64", "--mode", "large"]
    with Server(command, tmp_path / "server.log") as ead:
        ours = infill(ead, **body)
        assert ead.stop() == 0
    assert ours["prompt"] == theirs["prompt"] and ours["tokens"] == theirs["tokens"]
    assert ours["content"] == theirs["content"] and ours["content"]
    assert ours["stop_type"] == theirs["stop_type"] == "eos"

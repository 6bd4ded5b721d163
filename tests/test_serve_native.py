"""llama-server's own routes on a real `ead serve` with the tiny pair, through httpx and curl: POST
/completion (its native completion: the same answer as /v1/completions for the same request, in
llama-server's shapes, whole and streamed), GET /props and POST /apply-template."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, LONG, PROMPT, TAU, serving

from ead_cli import __version__
from ead_cli.runner import Runner

# every prompt read whole: the same request gets the same answer on every route, to the bit
ARGS = [*TAU, *CTX, "--no-reuse", "--max-tokens", "33", "--top-k", "7", "--min-p", "0.1"]


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving([*pair_args(tiny_pair), *ARGS], tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def native(server: Server, **body: Any) -> dict[str, Any]:
    reply = post(server, "/completion", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def openai_text(server: Server, **body: Any) -> dict[str, Any]:
    reply = post(server, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_completion_is_the_answer_of_v1_completions_in_llama_servers_shape(
    server: Server, tiny_pair: tuple[Path, Path]
) -> None:
    whole = native(server, prompt=PROMPT, n_predict=12, temperature=0, return_tokens=True)
    openai = openai_text(server, prompt=PROMPT, max_tokens=12, temperature=0)
    choice, usage = openai["choices"][0], openai["usage"]
    assert whole["content"] == choice["text"] and whole["content"]
    assert whole["tokens"] == [token["token"] for token in openai["ead"]["tokens"]]
    assert [token["model"] for token in whole["ead"]["tokens"]] == [
        t["model"] for t in openai["ead"]["tokens"]
    ]
    assert {token["model"] for token in whole["ead"]["tokens"]} == {"small", "large"}  # both models wrote
    assert whole["tokens_predicted"] == usage["completion_tokens"] == 12
    assert whole["tokens_evaluated"] == usage["prompt_tokens"]
    assert (whole["stop"], whole["stop_type"], whole["stopping_word"]) == (True, "limit", "")
    assert (whole["stopped_limit"], whole["stopped_eos"], whole["stopped_word"]) == (True, False, False)
    assert whole["model"] == "ead" and whole["truncated"] is False and whole["tokens_cached"] == 0
    assert whole["has_new_line"] == ("\n" in whole["content"])
    assert whole["prompt"] == PROMPT  # the prompt as read (this vocabulary adds no BOS)
    timings = whole["timings"]
    assert timings["predicted_n"] == 12 and timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["predicted_ms"] > 0 and timings["predicted_per_second"] == pytest.approx(
        12_000 / timings["predicted_ms"]
    )
    settings = whole["generation_settings"]
    assert (settings["n_predict"], settings["temperature"], settings["top_k"], settings["min_p"]) == (
        12,
        0,
        7,
        0.1,
    )
    assert settings["seed"] == whole["ead"]["seed"] and settings["stream"] is False
    assert whole["ead"]["summary"]["generated"] == 12

    # without return_tokens, as llama-server, the ids are left out; token ids as the prompt, the same answer
    ids = post(server, "/tokenize", {"content": PROMPT}).json()["tokens"]
    by_ids = native(server, prompt=ids, n_predict=12, temperature=0)
    assert by_ids["content"] == whole["content"] and by_ids["tokens"] == []
    # n_predict -1: as far as the context goes (clamped there), as max_tokens is; its settings say -1, as
    # llama-server's
    unbounded = native(server, prompt=PROMPT, n_predict=-1, temperature=0, stop=[whole["content"][3:6]])
    assert unbounded["stop_type"] == "word" and unbounded["generation_settings"]["n_predict"] == -1


def test_max_tokens_minus_one_is_no_limit_on_v1_as_n_predict_is(server: Server) -> None:
    """max_tokens -1 (llama-server 0.3.36 takes it, n_predict's alias: no limit where its -n is the
    default) had been a 400 on /v1: the answer runs past the server's --max-tokens (33) to its end, here
    a stop string met after the 33rd token."""
    short = openai_text(server, prompt=PROMPT, temperature=0)["choices"][0]["text"]  # the server's 33
    longer = openai_text(server, prompt=PROMPT, max_tokens=80, temperature=0)["choices"][0]["text"]
    stop = longer[-8:]
    assert longer.find(stop) >= len(short)  # met past the server's limit only
    for field in ("max_tokens", "max_completion_tokens"):
        reply = openai_text(server, prompt=PROMPT, temperature=0, stop=[stop], **{field: -1})
        choice = reply["choices"][0]
        assert (choice["finish_reason"], choice["text"]) == ("stop", longer[: longer.find(stop)])


def test_penalties_are_taken_as_llama_server_spells_them(server: Server) -> None:
    """repeat_penalty and the others, llama-server's own fields, change the answer as on /v1/completions."""
    penalties = {"repeat_penalty": 1.5, "repeat_last_n": 16, "frequency_penalty": 0.5}
    penalties["presence_penalty"] = 0.5
    plain = native(server, prompt=PROMPT, n_predict=24, temperature=0)
    penalised = native(server, prompt=PROMPT, n_predict=24, temperature=0, **penalties)
    assert penalised["content"] != plain["content"]
    v1 = openai_text(server, prompt=PROMPT, max_tokens=24, temperature=0, **penalties)
    assert penalised["content"] == v1["choices"][0]["text"]


def test_a_stop_string_ends_it_as_a_word_and_the_server_default_as_a_limit(server: Server) -> None:
    free = native(server, prompt=PROMPT, temperature=0)  # no n_predict: the server's --max-tokens
    assert free["tokens_predicted"] == free["generation_settings"]["n_predict"] == 33
    word = free["content"][10:13]
    stopped = native(server, prompt=PROMPT, temperature=0, stop=["never written", word])
    assert free["content"].startswith(stopped["content"]) and word not in stopped["content"]
    assert (stopped["stop_type"], stopped["stopping_word"], stopped["stopped_word"]) == ("word", word, True)
    assert stopped["generation_settings"]["stop"] == ["never written", word]


def events(lines: list[str]) -> list[dict[str, Any]]:
    """A native stream's events: each a ``data: {...}`` line, no [DONE]."""
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert "[DONE]" not in data
    return [json.loads(item) for item in data]


def check_stream(parts: list[dict[str, Any]], whole: dict[str, Any]) -> None:
    """Streamed, a part per token (its text and id, stop false), then the last object, whose content and
    tokens are empty (the parts had them) and whose figures are the whole answer's."""
    *tokens, last = parts
    assert [part["stop"] for part in tokens] == [False] * len(tokens) and last["stop"] is True
    assert "".join(part["content"] for part in tokens) == whole["content"]
    assert [part["tokens"] for part in tokens] == [[token["token"]] for token in whole["ead"]["tokens"]]
    assert [part["tokens_predicted"] for part in tokens] == list(range(1, len(tokens) + 1))
    assert {part["tokens_evaluated"] for part in tokens} == {whole["tokens_evaluated"]}
    assert [part["ead"]["model"] for part in tokens] == [token["model"] for token in whole["ead"]["tokens"]]
    assert (last["content"], last["tokens"]) == ("", [])
    for field in ("tokens_predicted", "tokens_evaluated", "stop_type", "stopping_word", "prompt"):
        assert last[field] == whole[field], field
    assert last["timings"]["predicted_n"] == whole["timings"]["predicted_n"]
    assert last["generation_settings"]["stream"] is True and last["ead"]["summary"]["generated"] == len(
        tokens
    )


def test_completion_streamed_through_httpx_is_the_whole_answer_token_by_token(server: Server) -> None:
    body = {"prompt": PROMPT, "n_predict": 20, "temperature": 0}
    whole = native(server, **body)
    with httpx.stream(
        "POST", f"{server.url}/completion", json={**body, "stream": True}, timeout=120
    ) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        parts = events(list(reply.iter_lines()))
    assert len(parts) == 21
    check_stream(parts, whole)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_completion_streamed_through_curl(server: Server) -> None:
    body = {"prompt": PROMPT, "n_predict": 9, "temperature": 0, "stop": ["zzz"]}
    whole = native(server, **body)
    streamed = json.dumps({**body, "stream": True})
    curl = subprocess.run(
        ["curl", "-sSN", f"{server.url}/completion", "-H", "Content-Type: application/json", "-d", streamed],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert curl.returncode == 0, curl.stderr
    check_stream(events(curl.stdout.splitlines()), whole)


def test_n_probs_gives_each_tokens_probabilities_as_v1s_logprobs_do(server: Server) -> None:
    """llama-server's completion_probabilities: each token's id, text, bytes and log-probability, and its
    n likeliest alternatives', the values /v1/completions' logprobs give; streamed, with the parts."""
    body = {"prompt": PROMPT, "n_predict": 10, "temperature": 0}
    whole = native(server, **body, n_probs=3)
    openai = openai_text(server, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3)["choices"][0]
    probabilities = whole["completion_probabilities"]
    ids = [token["token"] for token in whole["ead"]["tokens"]]
    assert [entry["id"] for entry in probabilities] == ids and len(ids) == 10
    assert [entry["logprob"] for entry in probabilities] == openai["logprobs"]["token_logprobs"]
    for entry, alternatives in zip(probabilities, openai["logprobs"]["top_logprobs"], strict=True):
        top = entry["top_logprobs"]
        assert [alternative["logprob"] for alternative in top] == list(alternatives.values())
        assert top[0]["id"] == entry["id"] and top[0]["logprob"] == entry["logprob"]  # greedy: the likeliest
        assert bytes(entry["bytes"]).decode("utf-8", errors="ignore") == entry["token"]
    assert "completion_probabilities" not in native(server, **body)  # not asked: not written
    with httpx.stream(
        "POST", f"{server.url}/completion", json={**body, "n_probs": 3, "stream": True}
    ) as reply:
        parts = events(list(reply.iter_lines()))
    assert [entry for part in parts for entry in part.get("completion_probabilities", [])] == probabilities
    # a stop string's tokens, which the answer never shows, get none (as llama-server trims them)
    longer = native(server, **{**body, "n_predict": 33}, n_probs=3)
    stop = longer["content"][10:13]
    stopped = native(server, **{**body, "n_predict": 33}, n_probs=3, stop=[stop])
    shown = stopped["completion_probabilities"]
    assert stopped["stop_type"] == "word" and shown == longer["completion_probabilities"][: len(shown)]
    assert len(shown) < stopped["tokens_predicted"]
    written = b"".join(bytes(entry["bytes"]) for entry in shown).decode("utf-8", errors="replace")
    assert written.startswith(stopped["content"])


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_a_client_that_leaves_a_stream_stops_its_generation(server: Server) -> None:
    before = len(server.log().splitlines())
    body = json.dumps({"prompt": PROMPT, "n_predict": LONG, "stream": True})
    args = ["curl", "-sN", f"{server.url}/completion", "-H", "Content-Type: application/json", "-d", body]
    curl = subprocess.Popen(args, stdout=subprocess.PIPE)
    assert curl.stdout is not None and curl.stdout.readline().startswith(b'data: {"index": 0, "content": ')
    curl.kill()
    curl.wait(timeout=30)
    assert native(server, prompt=PROMPT, n_predict=3)["tokens_predicted"] == 3  # the engine is free
    new = server.log().splitlines()[before:]
    stopped = [line for line in new if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new


def test_json_schema_is_json_mode(server: Server) -> None:
    """llama-server's json_schema is response_format's schema: every finished answer has its keys."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    finished = 0
    for seed in range(4):
        whole = native(server, prompt="x", json_schema=schema, n_predict=200, temperature=0.8, seed=seed)
        assert whole["generation_settings"]["grammar"]
        if whole["stop_type"] == "limit":
            continue  # cut off by n_predict: the grammar held to there
        finished += 1
        assert isinstance(json.loads(whole["content"], strict=False)["n"], int), whole["content"]
    assert finished


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({}, "prompt", "prompt: Field required"),
        (
            {"prompt": "hi", "n_predict": -2},
            "n_predict",
            "n_predict: Input should be greater than or equal to -1",
        ),
        ({"prompt": "hi", "n_predict": "5"}, "n_predict", "n_predict: Input should be a valid integer"),
        (
            {"prompt": "hi", "n_predict": 5, "max_tokens": 6},
            "n_predict",
            "n_predict 5 and max_tokens 6 differ",
        ),
        ({"prompt": "hi", "n_probs": 21}, "n_probs", "n_probs: Input should be less than or equal to 20"),
        (
            {"prompt": "hi", "n_probs": 2, "ead": {"verify": 0.5}},
            "n_probs",
            "n_probs: log-probabilities follow",
        ),
        ({"prompt": "hi", "n_probs": 2, "logprobs": 3}, "n_probs", "n_probs 2 and logprobs 3 differ"),
        ({"prompt": "hi", "response_fields": "content"}, "response_fields", "response_fields: Input should"),
        ({"prompt": "hi", "repeat_penalty": 0}, "repeat_penalty", "repeat_penalty: Input should be greater"),
        ({"prompt": "hi", "grammar": 'root ::= "a"'}, "grammar", "grammar is not supported"),
        ({"prompt": "hi", "temperature": 5}, "temperature", "temperature: Input should be less than or"),
        ({"prompt": "hi", "top_k": True}, "top_k", "top_k: Input should be a valid integer"),
        ({"prompt": [1, "a"]}, "prompt.1", "prompt.1: Input should be a valid integer"),
        (
            {"prompt": "hi", "json_schema": {"type": "string", "maxLength": 5000}},
            "json_schema",
            "json_schema repeats",
        ),
        (
            {"prompt": "hi", "json_schema": {}, "response_format": {"type": "json_object"}},
            "json_schema",
            "json_schema and response_format each give the answer's format",
        ),
        ({"prompt": "hi", "ead": {"tau": -1}}, "ead.tau", "tau must be at least 0"),
    ],
)
def test_bad_requests_are_a_400_in_llama_servers_words(
    server: Server, body: dict[str, Any], param: str, fragment: str
) -> None:
    before = server.log().splitlines()
    reply = post(server, "/completion", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"] and error["param"] == param, error
    assert server.log().splitlines()[len(before) :] == [f"error: POST /completion 400: {error['message']}"]
    assert native(server, prompt="hi", n_predict=2)["tokens_predicted"] == 2  # and it keeps serving


def test_a_schema_no_answer_meets_ends_a_stream_with_an_error_event_naming_json_schema(
    server: Server,
) -> None:
    body = {"prompt": "x", "n_predict": 8, "json_schema": {"pattern": "^[b-a]$"}, "stream": True}
    with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=120) as reply:
        data = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    error = json.loads(data[-1])["error"]
    assert error["param"] == "json_schema" and "allows no token" in error["message"], error
    whole = post(server, "/completion", {**body, "stream": False})
    assert whole.status_code == 400 and whole.json()["error"]["param"] == "json_schema"


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_a_bare_curl_d_is_answered_on_every_route_as_llama_server_answers_it(server: Server) -> None:
    """``curl URL -d '{...}'`` without a Content-Type sends a form's type, which llama-server reads as JSON:
    ead reads it so where no web page sent it (no Origin), on llama-server's routes and OpenAI's. From a
    page, a form is still a 415: a page may post one anywhere without asking first."""
    cases = (
        ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0}, "content"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 6, "temperature": 0}, "choices"),
        ("/tokenize", {"content": PROMPT}, "tokens"),
    )
    for path, body, key in cases:
        curl = subprocess.run(
            ["curl", "-sS", f"{server.url}{path}", "-d", json.dumps(body)], capture_output=True, timeout=120
        )
        assert curl.returncode == 0, curl.stderr
        assert json.loads(curl.stdout)[key] == post(server, path, body).json()[key], path
        from_page = httpx.post(
            f"{server.url}{path}",
            content=json.dumps(body),
            headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": server.url},
            timeout=120,
        )
        assert from_page.status_code == 415, path
        assert from_page.json()["error"]["code"] == "unsupported_media_type"
    untyped = httpx.post(f"{server.url}/tokenize", content=json.dumps({"content": PROMPT}), timeout=60)
    assert untyped.status_code == 200 and untyped.json()["tokens"]  # no Content-Type at all
    plain = httpx.post(
        f"{server.url}/tokenize", content=b"{}", headers={"Content-Type": "text/plain"}, timeout=60
    )
    assert plain.status_code == 415  # what a page sends without asking, curl's -d never


def test_props_give_the_servers_real_settings(server: Server, tiny_pair: tuple[Path, Path]) -> None:
    props = httpx.get(f"{server.url}/props", timeout=60).json()
    served = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["ead"]
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == served["n_ctx"] == 16384
    params = settings["params"]
    assert (params["n_predict"], params["temperature"], params["top_k"], params["top_p"]) == (33, 0, 7, 0.95)
    assert params["min_p"] == 0.1 and params["seed"] == -1  # no --seed: each request draws one
    assert params["samplers"] == ["top_k", "top_p", "min_p", "temperature"] and params["grammar"] == ""
    assert props["total_slots"] == 1 and props["model_alias"] == "ead"
    assert props["model_path"] == str(tiny_pair[1]) and props["ead"] == served
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        template = runner.chat_template
    assert template and props["chat_template"] == template
    assert props["build_info"].startswith(f"ead-cli {__version__} (llama-cpp-python ")
    assert props["endpoint_metrics"] is False and props["is_sleeping"] is False


def test_apply_template_gives_the_prompt_the_chat_route_gives_the_model(server: Server) -> None:
    """The prompt /apply-template gives, sent to /completion, is the chat's own answer (the chat route
    renders and reads the same text)."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
    assert prompt.index("Be brief.") < prompt.index(PROMPT)
    chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0})
    completed = native(server, prompt=prompt, n_predict=10, temperature=0)
    assert completed["content"] == chat.json()["choices"][0]["message"]["content"]
    assert completed["tokens_evaluated"] == chat.json()["usage"]["prompt_tokens"]
    # a conversation ending in an assistant message: its text opens the answer, the prompt ends with it
    prefilled = post(server, "/apply-template", {"messages": [*HI, {"role": "assistant", "content": "Sure"}]})
    assert prefilled.json()["prompt"].endswith("Sure")
    empty = post(server, "/apply-template", {"messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"


def test_every_route_takes_the_api_key(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """As llama-server asks its key of every route but /health."""
    with serving([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        for method, path, body in (
            ("POST", "/completion", {"prompt": "hi", "n_predict": 2}),
            ("GET", "/props", None),
            ("POST", "/apply-template", {"messages": HI}),
            ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 2}),
            # llama-server's paths without /v1: the same routes, the same key check
            ("POST", "/chat/completions", {"messages": HI, "max_tokens": 2}),
            ("POST", "/completions", {"prompt": "hi", "max_tokens": 2}),
            ("POST", "/responses", {"input": "hi", "max_output_tokens": 2}),
            ("GET", "/models", None),
            ("GET", "/models/ead", None),
        ):
            refused = httpx.request(method, f"{server.url}{path}", json=body, timeout=60)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            keyed = {"Authorization": "Bearer s3cret"}
            assert httpx.request(method, f"{server.url}{path}", json=body, headers=keyed).status_code == 200
        for health in ("/health", "/v1/health"):  # llama-server's both, without the key
            assert httpx.get(f"{server.url}{health}", timeout=60).status_code == 200
        infill = {"input_prefix": "def f(", "input_suffix": ")"}
        assert httpx.post(f"{server.url}/infill", json=infill, timeout=60).status_code == 401
        # past the key, the tiny pair's vocabulary, without FIM tokens, is the refusal
        with_key = httpx.post(f"{server.url}/infill", json=infill, headers=keyed, timeout=60)
        assert with_key.status_code == 400 and with_key.json()["error"]["param"] == "input_suffix"


def test_tokens_cached_counts_the_prompt_the_caches_kept(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """With the caches kept between requests (no --no-reuse), the same prompt again is read from them
    (all but its last token, read again for its logits): tokens_cached and timings say so."""
    with serving([*pair_args(tiny_pair), *TAU], tmp_path / "server.log") as server:
        first, again = (native(server, prompt=PROMPT, n_predict=4, temperature=0) for _ in range(2))
    assert first["tokens_cached"] == first["timings"]["cache_n"] == 0
    assert again["tokens_cached"] == again["timings"]["cache_n"] == again["tokens_evaluated"] - 1 > 0
    assert again["timings"]["prompt_n"] == 1


@pytest.mark.real
def test_apply_template_then_completion_is_the_chats_answer_on_the_real_pair(
    real_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The way llama-server's docs build a chat by hand, on the demo pair switching: the template applied,
    then /completion, gives the chat route's answer, ended by the model's end of turn (eos)."""
    messages = [{"role": "user", "content": "Name the capital of France in one word."}]
    with Server([*pair_args(real_pair), "--mode", "ead", "--no-reuse"], tmp_path / "server.log") as server:
        prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
        completed = native(server, prompt=prompt, n_predict=40, temperature=0)
        chat = post(
            server, "/v1/chat/completions", {"messages": messages, "max_tokens": 40, "temperature": 0}
        )
    assert completed["content"] == chat.json()["choices"][0]["message"]["content"]
    assert "Paris" in completed["content"]
    assert (completed["stop_type"], completed["stopped_eos"], completed["stopping_word"]) == ("eos", True, "")
    assert completed["tokens_predicted"] == chat.json()["usage"]["completion_tokens"] < 40

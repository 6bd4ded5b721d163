"""llama-server's utility routes on a real `ead serve` with the tiny pair: POST /tokenize and /detokenize
by the models' tokenizer, and GET /metrics (--metrics) in Prometheus's text format, read with curl, its
counts equal to what the answers' usage and figures say."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, JSON, LONG, PROMPT, TAU, frames, serving, stream_request

from ead_cli.runner import Runner

TEXT = "hello wörld 日本<|im_end|>\n"  # a character split across tokens, and a special token


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--metrics"]
    with serving(args, tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_tokenize_gives_the_models_ids_and_detokenize_gives_the_text_back(
    server: Server, tiny_pair: tuple[Path, Path]
) -> None:
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        expected = runner.tokenize(TEXT, add_special=False)
        as_text = runner.tokenize(TEXT, add_special=False, parse_special=False)
        im_end = runner.tokenize("<|im_end|>", add_special=False)
    assert len(im_end) == 1 and im_end[0] in expected and len(as_text) > len(expected)

    ids = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert ids == expected
    assert post(server, "/tokenize", {"content": TEXT, "parse_special": False}).json()["tokens"] == as_text
    for tokens in (ids, as_text):  # the text under vLLM's name too, which lm-eval reads
        assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": TEXT, "prompt": TEXT}
    assert post(server, "/detokenize", {"tokens": []}).json() == {"content": "", "prompt": ""}

    pieces = post(server, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids
    # as llama-server: a piece that is no UTF-8 on its own (part of a character) as its bytes' values
    split = [piece["piece"] for piece in pieces if isinstance(piece["piece"], list)]
    assert split and all(isinstance(byte, int) for part in split for byte in part)
    spelled = b"".join(
        bytes(piece) if isinstance(piece, list) else piece.encode()
        for piece in (entry["piece"] for entry in pieces)
    )
    assert spelled.decode() == TEXT
    assert {"id": im_end[0], "piece": "<|im_end|>"} in pieces


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/tokenize", {}, "content: Field required (or vLLM's prompt)"),
        ("/tokenize", {"content": 5}, "content: Input should be a valid string"),
        (
            "/tokenize",
            {"content": "hi", "with_pieces": "yes"},
            "with_pieces: Input should be a valid boolean",
        ),
        ("/detokenize", {"tokens": "hi"}, "tokens: Input should be a valid array"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens.1: Input should be greater than or equal to 0"),
        ("/detokenize", {"tokens": [1, 267]}, "tokens: token id 267 is not in the vocabulary (ids 0-266)"),
        # llama.cpp's tokenizer takes time quadratic in the special tokens it reads: bounded
        (
            "/tokenize",
            {"content": "<|im_end|>" * 16385},
            "content: it holds more than 16384 special tokens (such as '<|im_end|>'): "
            'send "parse_special": false to read their texts as text',
        ),
    ],
)
def test_bad_bodies_get_a_400_error_object_and_one_log_line(
    server: Server, path: str, body: dict, message: str
) -> None:
    before = server.log().splitlines()
    reply = post(server, path, body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["message"] == message and error["type"] == "invalid_request_error"
    assert error["param"] == message.partition(":")[0]
    assert server.log().splitlines()[len(before) :] == [f"error: POST {path} 400: {message}"]
    assert post(server, "/tokenize", {"content": "hi"}).status_code == 200  # and it keeps serving


def test_special_tokens_past_the_bound_are_tokenized_as_text(server: Server) -> None:
    content = "<|im_end|>" * 16385
    reply = post(server, "/tokenize", {"content": content, "parse_special": False})
    assert reply.status_code == 200
    assert post(server, "/detokenize", reply.json()).json()["content"] == content


def scrape(server: Server) -> dict[str, float]:
    """GET /metrics with curl, every family with its HELP and TYPE: each sample's value by its name (and
    labels)."""
    reply = subprocess.run(
        ["curl", "-sS", "-D", "-", f"{server.url}/metrics"], capture_output=True, text=True, timeout=60
    )
    head, _, text = reply.stdout.partition("\n\n")  # text mode: curl's CRLFs read as newlines
    assert head.startswith("HTTP/1.1 200") and "content-type: text/plain; version=0.0.4" in head.lower()
    samples, described = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge") and f"# HELP {name} " in text
            described.add(name)
        elif not line.startswith("# HELP "):
            name, value = line.rsplit(" ", 1)
            assert name.partition("{")[0] in described
            samples[name] = float(value)
    return samples


def test_metrics_count_what_the_answers_usage_says(server: Server) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    before = scrape(server)
    assert before['ead:tokens_total{model="small"}'] >= 0 and before['ead:tokens_total{model="large"}'] >= 0
    chat = {"model": "ead", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24}
    usages, figures = [], []
    for _ in range(2):  # the second reads its prompt from the caches
        whole = client.chat.completions.create(**chat, temperature=0)
        usages.append(whole.usage)
        figures.append(whole.model_extra["ead"]["summary"])
    streamed = list(
        client.completions.create(
            model="ead",
            prompt="def fib(n):",
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usages.append(streamed[-1].usage)
    figures.append(streamed[-2].model_extra["ead"]["summary"])
    assert usages[1].prompt_tokens_details.cached_tokens > 0

    after = scrape(server)

    def added(name: str) -> float:
        return after[name] - before[name]

    cached = sum(usage.prompt_tokens_details.cached_tokens for usage in usages)
    assert added("llamacpp:prompt_tokens_cached_total") == cached
    assert added("llamacpp:prompt_tokens_total") == sum(usage.prompt_tokens for usage in usages) - cached
    assert added("llamacpp:tokens_predicted_total") == sum(usage.completion_tokens for usage in usages) == 57
    for role in ("small", "large"):
        written = sum(
            model["written"] for summary in figures for model in summary["models"] if model["role"] == role
        )
        assert added(f'ead:tokens_total{{model="{role}"}}') == written
    assert added('ead:tokens_total{model="small"}') > 0 and added('ead:tokens_total{model="large"}') > 0
    assert added("ead:switches_total") == sum(summary["switches"] for summary in figures) > 0
    prefill = sum(model["prefill_s"] for summary in figures for model in summary["models"])
    assert added("llamacpp:prompt_seconds_total") == pytest.approx(prefill)
    large, total = after['ead:tokens_total{model="large"}'], after["llamacpp:tokens_predicted_total"]
    assert after["ead:large_share"] == pytest.approx(large / total)
    assert after["llamacpp:requests_processing"] == after["llamacpp:requests_deferred"] == 0


def test_metrics_say_the_requests_generating_and_waiting(server: Server) -> None:
    first_http, first = stream_request(server.url, LONG)
    received = frames(first)  # kept: a generator closed when dropped would close the response
    assert next(received)["ead"]["index"] == 0  # generating
    second_http, second = stream_request(server.url, 5)  # waits
    assert second.status_code == 200
    samples = scrape(server)
    assert samples["llamacpp:requests_processing"] == 1 and samples["llamacpp:requests_deferred"] == 1
    for http, response in ((second_http, second), (first_http, first)):
        response.close()
        http.close()


def test_without_metrics_it_is_a_501_and_every_utility_route_takes_the_api_key(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """As llama-server: /metrics needs --metrics (else 501, not_supported_error), and with --api-key
    /metrics, /tokenize and /detokenize need the key as /v1 does (/health alone stays open), and vLLM's
    /tokenizer_info too."""
    with serving([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        routes = (
            ("GET", "/metrics"),
            ("POST", "/tokenize"),
            ("POST", "/detokenize"),
            ("GET", "/tokenizer_info"),
        )
        for method, path in routes:
            reply = httpx.request(method, f"{server.url}{path}", json={"content": "hi"}, timeout=60)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
        keyed = {**JSON, "Authorization": "Bearer s3cret"}
        tokens = httpx.post(f"{server.url}/tokenize", json={"content": "hi"}, headers=keyed).json()["tokens"]
        back = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}, headers=keyed)
        assert back.json() == {"content": "hi", "prompt": "hi"}
        info = httpx.get(f"{server.url}/tokenizer_info", headers=keyed, timeout=60)
        assert info.status_code == 200 and info.json()["eos_token"]
        reply = subprocess.run(
            [
                "curl",
                "-sS",
                "-w",
                "\n%{http_code}",
                "-H",
                "Authorization: Bearer s3cret",
                f"{server.url}/metrics",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        body, status = reply.stdout.rsplit("\n", 1)
        assert status == "501"
        error = json.loads(body)["error"]
        assert error["message"] == "metrics are off: start ead serve with --metrics"
        assert error["type"] == "not_supported_error"
        answer = httpx.post(
            f"{server.base_url}/chat/completions", json={"messages": HI}, headers=keyed, timeout=60
        )
        assert answer.status_code == 200

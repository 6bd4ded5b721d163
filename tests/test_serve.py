"""`ead serve` for real: a subprocess on a loopback port with the tiny pair, driven by real clients (the
official openai library, Simon Willison's llm CLI, curl, httpx), its answers checked against generate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import EAD, Server
from test_cli import pair_args

PROMPT = "hello wörld 日本"
TAU = ["--tau", "3"]  # the tiny pair's entropies cross 3 bits now and then: both models write


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with Server([*pair_args(tiny_pair), *TAU], log) as running:
        yield running
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def generate_jsonl(pair: tuple[Path, Path], *args: str) -> tuple[list[dict], dict]:
    """`ead generate --format jsonl`: the token objects and the summary."""
    result = subprocess.run(
        [EAD, "generate", *pair_args(pair), *TAU, "--format", "jsonl", *args],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return objects[:-1], objects[-1]


def attribution(tokens: list[dict]) -> list[tuple[int, str]]:
    return [(token["token"], token["model"]) for token in tokens]


def test_chat_streamed_and_whole_equal_generate_token_for_token(
    client: openai.OpenAI, tiny_pair: tuple[Path, Path]
) -> None:
    expected, summary = generate_jsonl(tiny_pair, "--max-tokens", "24", PROMPT)
    assert {token["model"] for token in expected} == {"small", "large"}
    messages = [{"role": "user", "content": PROMPT}]

    chunks = list(
        client.chat.completions.create(
            model="ead", messages=messages, max_tokens=24, temperature=0, stream=True
        )
    )
    tokens = [chunk.model_extra["ead"] for chunk in chunks[:-1]]
    assert attribution(tokens) == attribution(expected)
    assert [token["entropy"] for token in tokens] == pytest.approx([t["entropy"] for t in expected])
    assert "".join(chunk.choices[0].delta.content for chunk in chunks[:-1]) == "".join(
        token["text"] for token in expected
    )
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.choices[0].delta.content is None
    assert last.usage.completion_tokens == 24 and last.usage.prompt_tokens == summary["prompt_tokens"]
    figures = last.model_extra["ead"]["summary"]
    assert figures["large_share"] == summary["large_share"] and figures["switches"] == summary["switches"]
    assert [m["written"] for m in figures["models"]] == [m["written"] for m in summary["models"]]

    whole = client.chat.completions.create(model="ead", messages=messages, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == "".join(token["text"] for token in expected)
    assert whole.choices[0].finish_reason == "length"
    assert attribution(whole.model_extra["ead"]["tokens"]) == attribution(expected)
    assert whole.usage.total_tokens == summary["prompt_tokens"] + 24


def test_completions_equal_generate_raw(client: openai.OpenAI, tiny_pair: tuple[Path, Path]) -> None:
    expected, _ = generate_jsonl(tiny_pair, "--max-tokens", "16", "--raw", "def fib(n):")
    request = {"model": "ead", "prompt": "def fib(n):", "max_tokens": 16, "temperature": 0}
    streamed = list(client.completions.create(**request, stream=True))
    assert attribution([chunk.model_extra["ead"] for chunk in streamed[:-1]]) == attribution(expected)
    whole = client.completions.create(**request)
    assert whole.choices[0].text == "".join(token["text"] for token in expected)
    assert whole.choices[0].text == "".join(chunk.choices[0].text for chunk in streamed)


def test_request_options_and_the_ead_object(client: openai.OpenAI, tiny_pair: tuple[Path, Path]) -> None:
    """seed, temperature, stop and the ead object reach the engine as the same options of generate do."""
    args = ["--max-tokens", "12", "--temp", "0.9", "--seed", "7", "--policy", "ead", "--min-run", "2"]
    expected, _ = generate_jsonl(tiny_pair, *args, PROMPT)
    whole = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0.9,
        seed=7,
        extra_body={"ead": {"policy": "ead", "min_run": 2}, "unknown_field": [1, 2]},
    )
    assert attribution(whole.model_extra["ead"]["tokens"]) == attribution(expected)
    small_only = client.chat.completions.create(
        model="ead",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        extra_body={"ead": {"mode": "small"}},
    )
    assert {token["model"] for token in small_only.model_extra["ead"]["tokens"]} == {"small"}
    text = whole.choices[0].message.content
    stop = text[3:5]
    assert stop.strip()
    stopped = client.chat.completions.create(
        model="ead",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0.9,
        seed=7,
        stop=[stop],
        extra_body={"ead": {"policy": "ead", "min_run": 2}},
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


def test_models_and_health(client: openai.OpenAI, server: Server, tiny_pair: tuple[Path, Path]) -> None:
    models = client.models.list().data
    assert [model.id for model in models] == ["ead"]
    assert models[0].model_extra["ead"]["models"] == {"small": tiny_pair[0].name, "large": tiny_pair[1].name}
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "generating": False, "waiting": 0}


def test_llm_cli_answers_through_the_server(server: Server, tmp_path: Path) -> None:
    """Simon Willison's llm, configured with the server as an OpenAI-compatible model."""
    llm = shutil.which("llm", path=str(Path(EAD).parent))
    assert llm is not None, "llm is in the test extra"
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: ead-tiny\n  model_name: ead\n  api_base: {server.base_url}\n"
    )
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    args = [llm, "-m", "ead-tiny", "-o", "max_tokens", "10", "-o", "temperature", "0", PROMPT]
    result = subprocess.run(args, capture_output=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    whole = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 10, "temperature": 0},
        timeout=60,
    ).json()
    assert result.stdout.decode().rstrip("\n") == whole["choices"][0]["message"]["content"].rstrip("\n")


def test_curl_sees_each_frame_while_the_answer_is_written(server: Server) -> None:
    """curl -N gets frames as they are produced: the first while the engine is still generating."""
    body = json.dumps(
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1500, "stream": True}
    )
    curl = subprocess.Popen(
        ["curl", "-sN", f"{server.base_url}/chat/completions", "-H", "Content-Type: application/json",
         "-d", body],
        stdout=subprocess.PIPE,
    )
    assert curl.stdout is not None
    first = curl.stdout.readline()
    assert first.startswith(b"data: {")
    assert httpx.get(f"{server.url}/health").json()["generating"] is True  # not all at the end
    rest = curl.stdout.read().decode()
    assert curl.wait(timeout=60) == 0
    frames = [first.decode().strip(), *(line for line in rest.splitlines() if line.startswith("data: "))]
    assert frames[-1] == "data: [DONE]"
    assert len(frames) == 1500 + 2  # a frame per token, the last with the figures, then [DONE]
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "length"

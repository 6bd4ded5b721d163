"""OpenAI's ``n`` on /v1/chat/completions and /v1/completions, and llama-server's ``n_cmpl`` on /completion:
several choices of one answer, each drawn with the request's seed plus its index, whole and streamed,
through the openai client and over raw HTTP; a text completion's batch of prompts, each answered in turn;
the other APIs keep one choice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import serving
from test_serve_native import check_stream, events

HI = [{"role": "user", "content": "hi"}]
DRAWN = {"temperature": 1.5, "max_tokens": 6}


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), "--ctx", "256"], tmp_path_factory.mktemp("n") / "server.log"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def completed(server: Server, path: str = "/v1/completions", **fields: object) -> Any:
    reply = httpx.post(f"{server.url}{path}", json={"prompt": "hi", **DRAWN, **fields}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_text_completions_choices_are_the_answers_of_their_seeds(server: Server) -> None:
    """Choice i is the answer a request with seed + i gets alone; the choices differ, the usage counts
    the prompt once and every choice's tokens; each choice carries its own ead fields."""
    answer = completed(server, n=3, seed=5)
    choices = answer["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    alone = [completed(server, seed=5 + index)["choices"][0]["text"] for index in range(3)]
    assert [choice["text"] for choice in choices] == alone
    assert len(set(alone)) == 3
    assert [choice["ead"]["seed"] for choice in choices] == [5, 6, 7] and "ead" not in answer
    generated = sum(choice["ead"]["summary"]["generated"] for choice in choices)
    usage = answer["usage"]
    assert usage["completion_tokens"] == generated == 18
    assert usage["prompt_tokens"] == choices[0]["ead"]["summary"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + generated
    again = completed(server, n=3, seed=5)["choices"]  # a seed given draws them again
    assert [choice["text"] for choice in again] == alone


def test_the_openai_clients_n_gives_its_choices_whole_and_streamed(client: openai.OpenAI) -> None:
    """chat.completions.create(n=2): two choices whole; streamed, each chunk's choice indexed, the deltas
    of each index adding up to that choice's whole text, the usage (include_usage) of both last."""
    asked = {"model": "ead", "messages": HI, "seed": 11, "n": 2, **DRAWN}
    whole = client.chat.completions.create(**asked)
    texts = [choice.message.content for choice in whole.choices]
    assert [choice.index for choice in whole.choices] == [0, 1] and texts[0] != texts[1]
    streamed = ["", ""]
    finishes: dict[int, str] = {}
    chunks = list(
        client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True})
    )
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        streamed[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finishes[choice.index] = choice.finish_reason
    assert streamed == texts and finishes == {0: "length", 1: "length"}
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12
    )
    assert len({chunk.id for chunk in chunks}) == 1


def test_greedy_choices_are_one_answer(client: openai.OpenAI) -> None:
    """Without a draw every seed writes the same text: n greedy choices are that answer n times."""
    answer = client.completions.create(model="ead", prompt="hi", max_tokens=6, temperature=0, n=3)
    assert len({choice.text for choice in answer.choices}) == 1 and len(answer.choices) == 3


@pytest.mark.parametrize("name", ["n_cmpl", "n"])
def test_llama_servers_completion_gives_a_list_of_its_choices(server: Server, name: str) -> None:
    """/completion with n_cmpl (or n, its alias) 3: a list of llama-server's objects in order, each the
    answer its seed gets alone, with its own index, figures and seed; one choice stays an object."""
    answer = completed(server, "/completion", **{name: 3}, seed=5)
    assert isinstance(answer, list) and [each["index"] for each in answer] == [0, 1, 2]
    alone = [completed(server, "/completion", seed=5 + index) for index in range(3)]
    assert [each["content"] for each in answer] == [each["content"] for each in alone]
    assert len({each["content"] for each in alone}) == 3
    assert [each["ead"]["seed"] for each in answer] == [5, 6, 7]
    assert [each["tokens_predicted"] for each in answer] == [6, 6, 6]
    assert {each["tokens_evaluated"] for each in answer} == {alone[0]["tokens_evaluated"]}
    assert isinstance(alone[0], dict) and alone[0]["index"] == 0


def test_llama_servers_streamed_choices_come_in_turn_each_indexed(server: Server) -> None:
    """Streamed, each choice's events in turn, each event with its choice's index, each choice's ending
    with its last object: each the whole choice's answer token by token."""
    body = {"prompt": "hi", **DRAWN, "seed": 9, "n_cmpl": 2}
    whole = completed(server, "/completion", **body)
    with httpx.stream("POST", f"{server.url}/completion", json={**body, "stream": True}, timeout=60) as reply:
        assert reply.status_code == 200
        parts = events(list(reply.iter_lines()))
    indexes = [part["index"] for part in parts]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}
    for index, choice in enumerate(whole):
        check_stream([part for part in parts if part["index"] == index], choice)
    assert whole[0]["content"] != whole[1]["content"]


def test_n_cmpl_is_ns_other_name_on_openais_routes(server: Server) -> None:
    answer = completed(server, n_cmpl=2, seed=3)
    assert [choice["ead"]["seed"] for choice in answer["choices"]] == [3, 4]
    assert [choice["text"] for choice in answer["choices"]] == [
        choice["text"] for choice in completed(server, n=2, seed=3)["choices"]
    ]


def test_a_batch_of_prompts_answers_each_in_turn_indexed_as_openai_and_llama_server(server: Server) -> None:
    """A list of prompts (texts, or token ids) with n 2: prompt i's choice j at index 2i + j, each the
    answer that prompt gets alone with seed + j; the usage counts each prompt once; /completion gives
    the same answers as a list of llama-server's objects."""
    prompts = ["hi", "tell me"]
    answer = completed(server, prompt=prompts, n=2, seed=5)
    choices = answer["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2, 3]
    alone = [completed(server, prompt=prompt, n=2, seed=5) for prompt in prompts]
    assert [choice["text"] for choice in choices] == [c["text"] for each in alone for c in each["choices"]]
    assert [choice["ead"]["seed"] for choice in choices] == [5, 6, 5, 6]
    usage, read = answer["usage"], [each["usage"]["prompt_tokens"] for each in alone]
    assert read[0] != read[1] and usage["prompt_tokens"] == sum(read)
    assert usage["completion_tokens"] == 24 and usage["total_tokens"] == sum(read) + 24
    ids = [choice["ead"]["summary"]["prompt_tokens"] for choice in choices]
    assert ids == [read[0], read[0], read[1], read[1]]
    native = completed(server, "/completion", prompt=prompts, n_cmpl=2, seed=5)
    assert [each["index"] for each in native] == [0, 1, 2, 3]
    assert [each["content"] for each in native] == [choice["text"] for choice in choices]
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": "tell me"}, timeout=60).json()["tokens"]
    by_ids = completed(server, prompt=[tokens, [*tokens, *tokens]], seed=5)["choices"]
    assert [choice["text"] for choice in by_ids] == [
        completed(server, prompt=ids, seed=5)["choices"][0]["text"] for ids in (tokens, [*tokens, *tokens])
    ]


def test_a_streamed_batch_gives_each_prompts_choices_in_turn(client: openai.OpenAI) -> None:
    """The openai client's batch, streamed: each index's deltas add up to its whole text; the usage of
    every prompt and choice last."""
    asked = {"model": "ead", "prompt": ["hi", "tell me"], "seed": 2, **DRAWN}
    whole = client.completions.create(**asked)
    streamed = ["", ""]
    chunks = list(client.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        streamed[choice.index] += choice.text
    assert streamed == [choice.text for choice in whole.choices]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {"prompt": "hi", "n": 17}, "n: at most 16 choices per request by ead serve"),
        ("/v1/chat/completions", {"messages": HI, "n": 0}, "n: Input should be greater than or equal to 1"),
        (
            "/completion",
            {"prompt": "hi", "n_cmpl": 17},
            "n_cmpl: at most 16 choices per request by ead serve",
        ),
        ("/completion", {"prompt": "hi", "n_cmpl": 0}, "n_cmpl: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": "hi", "n": 2, "n_cmpl": 3}, "n 2 and n_cmpl 3 differ"),
        ("/api/chat", {"model": "ead", "messages": HI, "stream": False, "n": 2}, None),
    ],
)
def test_n_past_what_a_route_writes_is_a_400_and_the_server_goes_on(
    server: Server, path: str, body: dict, message: str | None
) -> None:
    """OpenAI's routes and llama-server's /completion write up to 16 choices; two counts that differ are
    a 400; ollama's API has no n (a field it ignores, as ollama does)."""
    reply = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    if message is None:
        assert reply.status_code == 200, reply.text
        return
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith(message)
    assert completed(server)["choices"][0]["index"] == 0

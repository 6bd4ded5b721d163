"""A text completion's `echo` through `ead serve`: the prompt before the answer, and with `logprobs` the
prompt's log-probabilities under the model that writes the answer alone, checked against llama.cpp's own
logits of every position (llama-cpp-python's `logits_all`); vLLM's tokenizer routes, which lm-eval reads."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, JSON, TAU, serving

from ead_cli.runner import SCORED_ROWS

PROMPT = "def fib(n):\n    return"


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX], tmp_path_factory.mktemp("serve-echo") / "server.log"
    ) as running:
        yield running


def reference_rows(model: Path, tokens: list[int], cuts: tuple[int, ...] = ()) -> np.ndarray:
    """llama.cpp's log-probabilities at every position of ``tokens`` (row i predicts token i + 1), flash
    attention on, as ead's "auto" loads these models (off, its rows differ by up to 3e-3), read in
    batches of 128 as ead scores a prompt, and cut at ``cuts`` too (a cut's tail past it shorter than
    128, as the tests' are). llama.cpp's rows depend on those pieces: past 128 they differ from a
    single batch's by up to 0.02 on the tiny models."""
    llm = llama_cpp.Llama(
        str(model),
        n_ctx=16384,
        n_batch=SCORED_ROWS,
        n_ubatch=SCORED_ROWS,
        logits_all=True,
        n_threads=1,
        flash_attn=True,
        verbose=False,
    )
    bounds = sorted({0, len(tokens), *range(0, len(tokens), SCORED_ROWS), *cuts})
    try:
        for start, end in itertools.pairwise(bounds):
            llm.eval(tokens[start:end])
        logits = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    peak = logits.max(axis=1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))


def reference_logprobs(model: Path, tokens: list[int], cuts: tuple[int, ...] = ()) -> list[float]:
    """Each token's log-probability after the first (``reference_rows``)."""
    rows = reference_rows(model, tokens, cuts)
    return [float(rows[i, token]) for i, token in enumerate(tokens[1:])]


def tokenized(server: Server, text: str) -> list[int]:
    reply = httpx.post(f"{server.url}/tokenize", json={"content": text}, timeout=30)
    return reply.json()["tokens"]


def completion(server: Server, **body: object) -> dict:
    reply = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_echo_puts_the_prompt_before_the_answer_whole_and_streamed(server: Server) -> None:
    asked = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    plain = completion(server, **asked)["choices"][0]["text"]
    echoed = completion(server, **asked, echo=True)["choices"][0]
    assert echoed["text"] == PROMPT + plain and echoed["logprobs"] is None

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    chunks = list(client.completions.create(model="ead", **asked, echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT  # the prompt first, in a chunk of its own
    assert "".join(chunk.choices[0].text for chunk in chunks) == PROMPT + plain


@pytest.mark.parametrize("mode", ["large", "small"])
def test_echoed_log_probabilities_are_the_writing_model_s(
    server: Server, tiny_pair: tuple[Path, Path], mode: str
) -> None:
    """The prompt's rows are the model's that writes the answer alone (the large one's, the small one's
    in mode small), each token's after the first, which nothing predicts (null); the answer's follow,
    each offset past the prompt's text."""
    tokens = tokenized(server, PROMPT)
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": True}
    reply = completion(server, **body, ead={"mode": mode})
    logprobs = reply["choices"][0]["logprobs"]
    # the reading for them is the answer's: the whole prompt read by that model, none of it cached
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    report = reply["ead"]["summary"]["models"][mode == "large"]
    assert report["prefill_tokens"] == len(tokens) and report["prefill_s"] > 0
    assert len(logprobs["tokens"]) == len(tokens) + 4
    prompt_rows = logprobs["token_logprobs"][: len(tokens)]
    assert prompt_rows[0] is None and logprobs["top_logprobs"][0] is None
    expected = reference_logprobs(tiny_pair[mode == "large"], tokens)
    assert prompt_rows[1:] == pytest.approx(expected, abs=1e-5)
    other = reference_logprobs(tiny_pair[mode != "large"], tokens)
    assert max(abs(a - b) for a, b in zip(prompt_rows[1:], other, strict=True)) > 0.05  # not the other's
    rows = zip(logprobs["tokens"][1:], prompt_rows[1:], logprobs["top_logprobs"][1:], strict=False)
    for name, value, top in rows:
        assert top[name] == value and len(top) in (2, 3)  # the two likeliest and the token read
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[len(tokens)] == len(PROMPT)  # the answer's first token starts after the prompt
    assert "".join(logprobs["tokens"][: len(tokens)]) == PROMPT


def test_echo_of_token_ids_and_of_a_batch(server: Server) -> None:
    """lm-eval's shape: a batch of token-id prompts, each answered with its own prompt echoed (its text
    and log-probabilities) before one token; the same rows as each prompt asked alone as text."""
    texts = [PROMPT, "hello wörld"]
    batch = [tokenized(server, text) for text in texts]
    body = {"max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
    whole = completion(server, prompt=batch, **body)["choices"]
    assert [choice["index"] for choice in whole] == [0, 1]
    for choice, text, ids in zip(whole, texts, batch, strict=True):
        alone = completion(server, prompt=text, **body)["choices"][0]
        assert choice["text"] == alone["text"] and choice["text"].startswith(text)
        rows = choice["logprobs"]["token_logprobs"]
        assert len(rows) == len(ids) + 1
        assert rows == pytest.approx(alone["logprobs"]["token_logprobs"], abs=1e-5, nan_ok=False)


def test_a_one_token_prompt_echoes_one_null_row(server: Server) -> None:
    """Nothing predicts a prompt's first token: a prompt of one has its null row alone, then the answer's."""
    token = tokenized(server, "def")[0]
    body = {"prompt": [token], "max_tokens": 2, "temperature": 0, "logprobs": 1, "echo": True}
    choice = completion(server, **body)["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and choice["text"].startswith(logprobs["tokens"][0])
    assert len(logprobs["token_logprobs"]) == 3 and all(value < 0 for value in logprobs["token_logprobs"][1:])


def test_streamed_echo_sends_the_prompt_s_log_probabilities_first(server: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 1, "echo": True}
    whole = completion(server, **body)["choices"][0]["logprobs"]
    events = []
    with httpx.stream(
        "POST", f"{server.base_url}/completions", json={**body, "stream": True}, timeout=60
    ) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    first = events[0]["choices"][0]
    assert first["text"] == PROMPT and first["logprobs"]["token_logprobs"][0] is None
    streamed = [
        value
        for event in events
        if event["choices"] and event["choices"][0]["logprobs"]
        for value in event["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert streamed == pytest.approx(whole["token_logprobs"], abs=1e-5)
    offsets = [
        offset
        for event in events
        if event["choices"] and event["choices"][0]["logprobs"]
        for offset in event["choices"][0]["logprobs"]["text_offset"]
    ]
    assert offsets == whole["text_offset"]


def flushed(server: Server) -> None:
    """The caches taken by a prompt that shares nothing with PROMPT: the next reads it whole."""
    completion(server, prompt="x", max_tokens=1)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_max_tokens_0_with_echo_reads_the_prompt_alone(server: Server, logprobs: int | None) -> None:
    """OpenAI's legacy scoring request (and vLLM's): the prompt echoed and read, no answer; with
    logprobs the same rows as an answer's echo, the reading in the usage (none of it cached)."""
    tokens = tokenized(server, PROMPT)
    body = {"prompt": PROMPT, "temperature": 0, "echo": True, "logprobs": logprobs}
    flushed(server)
    reply = completion(server, **body, max_tokens=0)
    choice = reply["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    usage = reply["usage"]
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(tokens)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    large = reply["ead"]["summary"]["models"][1]
    assert large["prefill_tokens"] == len(tokens) and large["written"] == 0
    if logprobs is None:
        assert choice["logprobs"] is None
    else:
        rows = choice["logprobs"]["token_logprobs"]
        with_answer = completion(server, **body, max_tokens=1)["choices"][0]["logprobs"]
        assert len(rows) == len(tokens) and rows == with_answer["token_logprobs"][: len(tokens)]
        assert choice["logprobs"]["tokens"] == with_answer["tokens"][: len(tokens)]
    streamed = [
        chunk.choices[0]
        for chunk in openai.OpenAI(
            base_url=server.base_url, api_key="unused", max_retries=0
        ).completions.create(model="ead", **body, max_tokens=0, stream=True)
    ]
    assert "".join(choice.text for choice in streamed) == PROMPT
    assert streamed[-1].finish_reason == "length"


def test_the_choices_of_n_score_the_prompt_once(server: Server) -> None:
    """Each choice gets the prompt's log-probabilities; the first reads the prompt for them, the others
    find them and the prompt cached (as a repeat of the request does, while the cache holds it)."""
    tokens = tokenized(server, PROMPT)
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0.8, "logprobs": 1, "echo": True, "seed": 5}
    flushed(server)
    choices = completion(server, **body, n=3)["choices"]
    prompt_rows = [choice["logprobs"]["token_logprobs"][: len(tokens)] for choice in choices]
    assert prompt_rows[0] == prompt_rows[1] == prompt_rows[2] and prompt_rows[0][0] is None
    read = [choice["ead"]["summary"]["models"][1]["prefill_tokens"] for choice in choices]
    assert read[0] == len(tokens) and max(read[1:]) <= 1  # at most the last token again, for its row
    again = completion(server, **body)
    assert again["choices"][0]["logprobs"]["token_logprobs"][: len(tokens)] == prompt_rows[0]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(tokens) - 1
    flushed(server)  # the cache no longer holds it: read and scored again, to the same rows
    fresh = completion(server, **body)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["choices"][0]["logprobs"]["token_logprobs"][: len(tokens)] == pytest.approx(
        prompt_rows[0], abs=1e-6
    )


def test_a_prompt_that_begins_as_the_last_scored_one_reads_past_it_alone(
    server: Server, tiny_pair: tuple[Path, Path]
) -> None:
    """lm-eval's multiple choice, one question's choices in turn (a batch here): the second prompt shares
    the first's context, whose scores it keeps; it reads from the context's last token on (that token's
    row scores its own choice). Its rows are llama.cpp's read in those pieces; a fresh scoring's, read
    whole, are llama.cpp's read whole, and differ from them by rounding alone."""
    context = "def add(a, b):\n    " * 8
    texts = [context + "return a + b", context + "pass"]
    ids = [tokenized(server, text) for text in texts]
    shared = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    assert shared > SCORED_ROWS + 1  # the kept part spans a batch of the first prompt's reading
    body = {"max_tokens": 0, "temperature": 0, "logprobs": 1, "echo": True}
    flushed(server)
    both = completion(server, prompt=ids, **body)["choices"]
    read = [choice["ead"]["summary"]["models"][1]["prefill_tokens"] for choice in both]
    assert read == [len(ids[0]), len(ids[1]) - shared + 1]
    first, second = (choice["logprobs"]["token_logprobs"] for choice in both)
    assert first[0] is None and len(first) == len(ids[0])
    assert first[1:] == pytest.approx(reference_logprobs(tiny_pair[1], ids[0]), abs=1e-5)
    assert second[0] is None and len(second) == len(ids[1])
    pieces = reference_logprobs(tiny_pair[1], ids[1], cuts=(shared - 1,))
    assert second[1:] == pytest.approx(pieces, abs=1e-5)
    assert second[1:shared] == first[1:shared]  # kept, not read again
    flushed(server)
    fresh = completion(server, prompt=ids[1], **body)
    assert fresh["ead"]["summary"]["models"][1]["prefill_tokens"] == len(ids[1])
    whole = fresh["choices"][0]["logprobs"]["token_logprobs"]
    assert whole[1:] == pytest.approx(reference_logprobs(tiny_pair[1], ids[1]), abs=1e-5)
    assert whole[1:] == pytest.approx(second[1:], abs=0.05)


@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/completions", {"prompt": "def f(", "max_tokens": 0}, "max_tokens", "taken with echo"),
        (
            "/v1/completions",
            {"prompt": "def f(", "max_tokens": -2, "echo": True},
            "max_tokens",
            "0 (with echo",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            "max_tokens",
            "at least 1, got 0",
        ),
    ],
)
def test_max_tokens_0_without_echo_is_a_400(
    server: Server, path: str, body: dict, param: str, fragment: str
) -> None:
    reply = httpx.post(f"{server.url}{path}", json=body, headers=JSON, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert fragment in error["message"] and error["param"] == param and "\n" not in error["message"]
    assert completion(server, prompt="def f(", max_tokens=1)["choices"]  # and it serves on


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "echo": True},
            "/v1/completions",
        ),
        ("/v1/completions", {"prompt": "def f(", "suffix": "):", "echo": True}, "fill-in-the-middle"),
        ("/completion", {"prompt": "def f(", "echo": True}, "/v1/completions echoes the prompt"),
        ("/v1/completions", {"prompt": "def f(", "echo": 1}, "echo"),
    ],
)
def test_echo_where_it_cannot_be_given_is_a_400(server: Server, path: str, body: dict, fragment: str) -> None:
    reply = httpx.post(f"{server.url}{path}", json={**body, "max_tokens": 2}, headers=JSON, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert fragment in error["message"] and error["param"] == "echo" and "\n" not in error["message"]
    assert completion(server, prompt="def f(", max_tokens=1)["choices"]  # and it serves on


def test_vllm_s_tokenizer_routes(server: Server) -> None:
    """What lm-eval's remote tokenizer reads: /tokenizer_info's special tokens, /tokenize's ``prompt``
    (counted, as vLLM answers) and /detokenize's text under vLLM's name too."""
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=30).json()
    assert info["tokenizer_class"] == "llama.cpp" and info["model_max_length"] == 16384
    assert info["eos_token"] and info["add_bos_token"] is False
    eos = httpx.post(f"{server.url}/tokenize", json={"prompt": info["eos_token"]}, timeout=30).json()
    assert eos["count"] == 1 and eos["max_model_len"] == 16384
    ids = tokenized(server, PROMPT)
    vllm = httpx.post(
        f"{server.url}/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}, timeout=30
    )
    assert vllm.json()["tokens"] == ids
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()
    assert text == {"content": PROMPT, "prompt": PROMPT}
    both = {"content": PROMPT, "prompt": "other"}
    refused = httpx.post(f"{server.url}/tokenize", json=both, timeout=30)
    assert refused.status_code == 400 and "content" in refused.json()["error"]["message"]
    missing = httpx.post(f"{server.url}/tokenize", json={}, timeout=30)
    assert missing.status_code == 400 and "prompt" in missing.json()["error"]["message"]


@pytest.mark.parametrize("choices", [0, 3])
def test_the_scoring_bench_runs_on_the_tiny_pair(tiny_pair: tuple[Path, Path], choices: int) -> None:
    """scripts/bench_echo.py: each text's tokens and seconds both ways (scored and read, or a question's
    choices scored together and apart, the largest difference between their rows beside them), its JSON
    whole (figures are not asserted: they are the machine's)."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_echo.py"
    args = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--texts", "2", "--repeats", "1", "--choices", str(choices)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    kinds = ("apart", "together") if choices else ("read", "scored")
    name = f"{kinds[1]}_vs_{kinds[0]}"
    assert [row["task"] for row in result["texts"]] == ["HumanEval/1", "HumanEval/3"]
    for row in result["texts"]:
        assert row["tokens"] > 50 * max(choices, 1)
        assert row[kinds[0]]["server_s"] > 0 and row[kinds[1]]["server_s"] > 0
        assert row[name] == row[kinds[1]]["server_s"] / row[kinds[0]]["server_s"]
        # the same rows, read whole or past a kept context: rounding apart (none to compare unscored)
        assert ("largest_logprob_difference" in row) == bool(choices)
        assert 0 <= row.get("largest_logprob_difference", 0) < 0.05
    assert result[f"{name}_range"][0] <= result[f"{name}_median"] <= result[f"{name}_range"][1]
    assert result.get("choices", 0) == choices

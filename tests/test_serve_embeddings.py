"""Embeddings on a real `ead serve --embeddings` with the tiny pair, through real clients: the openai
client's ``embeddings.create``, the official ollama client's ``embed`` and ``embeddings``, httpx and curl
for llama-server's routes, and a real llama-server --embeddings --pooling mean beside it. Values are
checked: each vector the large model's mean-pooled embedding (the library's, computed here), normalised
where the API normalises, a batch equal to its inputs one by one, a generation beside them unchanged."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import HI, JSON, TAU, serving
from test_serve_fim import wait_loaded
from test_serve_safety import wait_until
from test_serve_utility import scrape

from ead_cli.bench import native
from ead_cli.embedding import Embedder, normalized
from ead_cli.remote import built_server
from ead_cli.runner import Runner

N_CTX = 2048  # the served context: the embedding context too
N_EMBD = 64  # the tiny models' width
TEXTS = ["hello wörld 日本", "def fib(n):", "hello wörld 日本"]
LONG_TEXT = "ab " * 1500  # 3001 tokens: past the context
OFF = "embeddings are off: start ead serve with --embeddings"


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # --no-reuse: a generation asked twice is the same to the bit, with embeddings beside it or not
    args = [*pair_args(tiny_pair), *TAU, "--ctx", str(N_CTX), "--no-reuse", "--embeddings", "--metrics"]
    with serving(args, tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def embedder(tiny_pair: tuple[Path, Path]) -> Iterator[Embedder]:
    """The library's embedder on the model the server embeds with: the large one."""
    with Runner(tiny_pair[1], name="large", n_ctx=N_CTX, n_threads=1) as runner:
        embedding = Embedder(runner)
        yield embedding
        embedding.close()


def raw(embedder: Embedder, text: str) -> np.ndarray:
    return embedder.embed(embedder.tokens(text))


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_the_openai_client_gets_the_large_models_normalised_mean(server: Server, embedder: Embedder) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    # the client asks for base64 unless told (and decodes it); floats when asked
    batch = client.embeddings.create(model="ead", input=TEXTS)
    floats = client.embeddings.create(model="ead", input=TEXTS, encoding_format="float")
    assert batch.model == "ead" and [item.index for item in batch.data] == [0, 1, 2]
    vectors = np.array([item.embedding for item in batch.data])
    assert vectors.shape == (3, embedder.n_embd) == (3, N_EMBD)  # the model's width
    np.testing.assert_array_equal(vectors, [item.embedding for item in floats.data])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    expected = [normalized(raw(embedder, text)) for text in TEXTS]
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert np.array_equal(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1], atol=0.01)
    for text, vector in zip(TEXTS, vectors, strict=True):  # a batch is its inputs one by one
        alone = client.embeddings.create(model="ead", input=text, encoding_format="float")
        np.testing.assert_array_equal(alone.data[0].embedding, vector)
    tokens = [embedder.tokens(text) for text in TEXTS]
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == sum(map(len, tokens))
    by_ids = client.embeddings.create(model="ead", input=tokens[:2], encoding_format="float")
    np.testing.assert_array_equal([item.embedding for item in by_ids.data], vectors[:2])
    one_list = client.embeddings.create(model="ead", input=tokens[1], encoding_format="float")
    np.testing.assert_array_equal(one_list.data[0].embedding, vectors[1])


def test_base64_is_the_little_endian_float32_bytes(server: Server) -> None:
    asked = {"model": "ead", "input": TEXTS[:2]}
    numbers = post(server, "/v1/embeddings", asked).json()["data"]
    coded = post(server, "/v1/embeddings", {**asked, "encoding_format": "base64"}).json()["data"]
    for number, code in zip(numbers, coded, strict=True):
        decoded = np.frombuffer(base64.b64decode(code["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.float32(number["embedding"]))
    assert post(server, "/v1/embeddings", {**asked, "dimensions": N_EMBD}).json()["data"] == numbers


def test_llama_servers_routes_in_its_shape_and_norms(server: Server, embedder: Embedder) -> None:
    vector = raw(embedder, TEXTS[0])
    for path, body in (("/embedding", {"content": TEXTS[0]}), ("/embeddings", {"input": [TEXTS[0]]})):
        reply = subprocess.run(
            [
                "curl",
                "-sS",
                f"{server.url}{path}",
                "-H",
                "Content-Type: application/json",
                "-d",
                json.dumps(body),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        (answer,) = json.loads(reply.stdout)
        assert answer["index"] == 0 and len(answer["embedding"]) == 1
        np.testing.assert_allclose(answer["embedding"][0], normalized(vector), atol=1e-6)
    for norm in (-1, 0, 1, 2, 3):  # llama-server's embd_normalize
        (answer,) = post(server, "/embedding", {"content": TEXTS[0], "embd_normalize": norm}).json()
        np.testing.assert_allclose(answer["embedding"][0], normalized(vector, norm), rtol=1e-5, atol=1e-6)
    (unnormalised,) = post(server, "/embedding", {"content": TEXTS[0], "embd_normalize": -1}).json()
    np.testing.assert_allclose(unnormalised["embedding"][0], vector, atol=1e-6)
    assert post(server, "/embeddings", {"input": TEXTS}).status_code == 200
    tokens = sum(len(embedder.tokens(text)) for text in TEXTS)
    assert re.fullmatch(
        rf"POST /embeddings 200: 3 embeddings of {tokens} tokens, \d+\.\d\d s", server.log().splitlines()[-1]
    )


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_the_vectors_are_llama_servers_pooling_mean(
    server: Server, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A real llama-server --embeddings --pooling mean (the whole text in one micro-batch) on the same
    model gives the same vectors, within rounding."""
    args = ["-c", "512", "-b", "512", "-ub", "512", "-t", "1", "--embeddings", "--pooling", "mean"]
    with native.llama_server(tiny_pair[1], args, tmp_path / "llama-server.log") as peer:
        wait_loaded(peer)
        texts = [*TEXTS[:2], "x = [i * i for i in range(10)]\n" * 10]
        theirs = httpx.post(f"{peer.url}/v1/embeddings", json={"input": texts}, timeout=60).json()["data"]
    ours = post(server, "/v1/embeddings", {"input": texts}).json()["data"]
    for mine, other in zip(ours, theirs, strict=True):
        # 3e-8 apart for a short text, 2.5e-5 for one of 150 tokens: batches of 128 and one of 512
        np.testing.assert_allclose(mine["embedding"], other["embedding"], atol=1e-4)


def test_the_ollama_client_embed_and_embeddings(server: Server, embedder: Embedder) -> None:
    client = ollama.Client(host=server.url)
    embedded = client.embed(model="ead", input=TEXTS)
    assert embedded.model == "ead" and len(embedded.embeddings) == 3
    vectors = np.array(embedded.embeddings)
    np.testing.assert_allclose(vectors, [normalized(raw(embedder, text)) for text in TEXTS], atol=1e-6)
    assert embedded.prompt_eval_count == sum(len(embedder.tokens(text)) for text in TEXTS)
    np.testing.assert_array_equal(client.embed(model="ead:latest", input=TEXTS[1]).embeddings, vectors[1:2])
    short = np.array(client.embed(model="ead", input=TEXTS[1], dimensions=16).embeddings[0])
    np.testing.assert_allclose(short, normalized(raw(embedder, TEXTS[1])[:16]), atol=1e-6)
    assert client.embed(model="ead", input=TEXTS[1], dimensions=N_EMBD + 1).embeddings == [list(vectors[1])]
    assert client.embed(model="ead", input=[]).embeddings == []  # ollama's load request

    # the old route: one prompt, its vector unnormalised
    old = client.embeddings(model="ead", prompt=TEXTS[1]).embedding
    np.testing.assert_allclose(old, raw(embedder, TEXTS[1]), atol=1e-6)
    assert client.embeddings(model="ead", prompt="").embedding == []


def test_ollama_truncates_a_long_input_unless_told_not_to(server: Server, embedder: Embedder) -> None:
    client = ollama.Client(host=server.url)
    tokens = embedder.runner.tokenize(LONG_TEXT, add_special=True)
    assert len(tokens) > N_CTX
    cut = client.embed(model="ead", input=LONG_TEXT).embeddings[0]
    np.testing.assert_allclose(cut, normalized(embedder.embed(tokens[:N_CTX])), atol=1e-6)
    assert client.embed(model="ead", input=LONG_TEXT, truncate=True).embeddings[0] == cut
    by_ids = post(server, "/v1/embeddings", {"input": tokens[:N_CTX], "encoding_format": "float"})
    np.testing.assert_allclose(by_ids.json()["data"][0]["embedding"], cut, atol=1e-7)
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="ead", input=LONG_TEXT, truncate=False)
    assert refused.value.status_code == 400
    assert refused.value.error == (
        f"input is {len(tokens)} tokens: the embedding context takes at most {N_CTX} "
        "(raise --ctx or shorten it)"
    )


def test_ollamas_num_ctx_below_the_served_context_cuts_or_refuses_there(
    server: Server, embedder: Embedder
) -> None:
    """ollama loads the model with a request's options.num_ctx: an input past it is cut to it (the
    default) or, with truncate false, a 400; an input within it is embedded whole; /api/embeddings never
    cuts."""
    client = ollama.Client(host=server.url)
    tokens = embedder.runner.tokenize(TEXTS[0], add_special=True)
    small = {"num_ctx": len(tokens) - 2}
    answer = client.embed(model="ead", input=TEXTS[0], options=small)
    assert answer.prompt_eval_count == len(tokens) - 2
    np.testing.assert_allclose(answer.embeddings[0], normalized(embedder.embed(tokens[:-2])), atol=1e-6)
    whole = client.embed(model="ead", input=TEXTS[0], options={"num_ctx": len(tokens)})
    assert whole.prompt_eval_count == len(tokens)
    for refused_by in (
        lambda: client.embed(model="ead", input=TEXTS[0], options=small, truncate=False),
        lambda: client.embeddings(model="ead", prompt=TEXTS[0], options=small),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            refused_by()
        assert refused.value.status_code == 400
        assert refused.value.error.endswith(
            f" is {len(tokens)} tokens: the context asked for takes at most {len(tokens) - 2} "
            f"(ask for up to {N_CTX} or shorten it)"
        ), refused.value.error


def test_metrics_count_the_embedding_requests_and_their_tokens(server: Server, embedder: Embedder) -> None:
    """In ead's own counters: llama-server counts no embedding in its prompt tokens (its metrics count a
    prompt when an answer's first token is drawn), and neither does ead."""
    before = scrape(server)
    two = post(server, "/v1/embeddings", {"model": "ead", "input": TEXTS[:2], "encoding_format": "float"})
    one = post(server, "/embedding", {"content": TEXTS[1]})
    ollama_embed = post(server, "/api/embed", {"model": "ead", "input": TEXTS[0]})
    load = post(server, "/api/embed", {"model": "ead"})  # ollama's load request: nothing embedded
    assert [reply.status_code for reply in (two, one, ollama_embed, load)] == [200] * 4
    refused = post(server, "/v1/embeddings", {"model": "ead", "input": LONG_TEXT})
    assert refused.status_code == 400
    after = scrape(server)
    tokens = two.json()["usage"]["prompt_tokens"] + len(embedder.tokens(TEXTS[1]))
    tokens += ollama_embed.json()["prompt_eval_count"]
    assert after["ead:embedding_requests_total"] - before["ead:embedding_requests_total"] == 3
    assert after["ead:embedding_tokens_total"] - before["ead:embedding_tokens_total"] == tokens
    assert after["llamacpp:prompt_tokens_total"] == before["llamacpp:prompt_tokens_total"]


def test_the_request_gauges_count_an_embedding_as_llama_server_does(server: Server) -> None:
    """llama-server's ``requests_processing`` counts its slots at work and ``requests_deferred`` the tasks
    waiting for one, an embedding's as a generation's (its /tokenize takes no slot): an embedding at work
    had been in neither gauge, nor one waiting behind it. Each request here embeds 16 inputs of ~1,300
    tokens, long enough to be seen at work."""
    body = {"model": "ead", "input": ["ab " * 650] * 16, "encoding_format": "float"}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, server, "/v1/embeddings", body)
        wait_until(lambda: scrape(server)["llamacpp:requests_processing"] == 1, 60)
        second = pool.submit(post, server, "/v1/embeddings", body)
        wait_until(lambda: scrape(server)["llamacpp:requests_deferred"] == 1, 60)
        assert scrape(server)["llamacpp:requests_processing"] == 1  # one embedding at a time
        assert first.result().status_code == second.result().status_code == 200
    after = scrape(server)
    assert after["llamacpp:requests_processing"] == after["llamacpp:requests_deferred"] == 0


TOO_LONG = f"is 3001 tokens: the embedding context takes at most {N_CTX} (raise --ctx or shorten it)"


@pytest.mark.parametrize(
    ("path", "body", "status", "message", "code"),
    [
        ("/v1/embeddings", {"input": LONG_TEXT}, 400, f"input {TOO_LONG}", "context_length_exceeded"),
        (
            "/v1/embeddings",
            {"input": ["hi", LONG_TEXT]},
            400,
            f"input.1 {TOO_LONG}",
            "context_length_exceeded",
        ),
        ("/v1/embeddings", {"input": ""}, 400, "input is empty", "invalid_value"),
        ("/v1/embeddings", {"input": ["hi", ""]}, 400, "input.1 is empty", "invalid_value"),
        (
            "/v1/embeddings",
            {"input": []},
            400,
            "input: List should have at least 1 item after validation, not 0",
            "invalid_value",
        ),
        ("/v1/embeddings", {"model": "ead"}, 400, "input: Field required (or llama-server's content)", None),
        (
            "/v1/embeddings",
            {"input": [[1, 267]]},
            400,
            "input.0: token id 267 is not in the vocabulary (ids 0-266)",
            "invalid_value",
        ),
        (
            "/v1/embeddings",
            {"input": ["hi"] * 2049},
            400,
            "input: List should have at most 2048 items after validation, not 2049",
            "invalid_value",
        ),
        ("/v1/embeddings", {"input": "a\u0000b"}, 400, "input contains a NUL byte", "invalid_value"),
        (
            "/v1/embeddings",
            {"input": "hi", "dimensions": 16},
            400,
            f"dimensions: the model's embeddings have {N_EMBD} dimensions, and it takes no other",
            "unsupported_parameter",
        ),
        (
            "/v1/embeddings",
            {"input": "hi", "encoding_format": "hex"},
            400,
            "encoding_format: Input should be 'float' or 'base64'",
            "invalid_value",
        ),
        (
            "/v1/embeddings",
            {"input": "hi", "model": "gpt"},
            404,
            "the model 'gpt' is not served here: this server serves 'ead' (ead serve --any-model answers "
            "any name)",
            "model_not_found",
        ),
        (
            "/embedding",
            {"content": "hi", "embd_normalize": -2},
            400,
            "embd_normalize: Input should be greater than or equal to -1",
            "invalid_value",
        ),
        (
            "/embeddings",
            {"content": "<|im_end|>" * (N_CTX + 1)},
            400,
            f"content holds more than {N_CTX} special tokens (such as '<|im_end|>'): the embedding context "
            f"takes at most {N_CTX} (raise --ctx or shorten it)",
            "context_length_exceeded",
        ),
    ],
)
def test_bad_requests_get_an_openai_error_and_one_log_line(
    server: Server, path: str, body: dict, status: int, message: str, code: str | None
) -> None:
    before = server.log().splitlines()
    reply = post(server, path, body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error == {
        "message": message,
        "type": "invalid_request_error",
        "param": error["param"],
        "code": code,
    }
    assert error["param"] == message.partition(":")[0].partition(" ")[0] or status == 404
    assert server.log().splitlines()[len(before) :] == [f"error: POST {path} {status}: {message}"]
    assert post(server, path, {"input": "hi"}).status_code == 200  # and it keeps serving


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/embed", {"model": "ead", "input": 5}, 400, "input: Input should be a valid string"),
        ("/api/embed", {"model": "ead", "input": ["hi", 5]}, 400, "input.1: Input should be a valid string"),
        ("/api/embed", {"model": "ead", "input": ["hi", ""]}, 400, "input.1 is empty"),
        (
            "/api/embed",
            {"model": "ead", "input": "hi", "dimensions": -1},
            400,
            "dimensions: Input should be greater than or equal to 0",
        ),
        (
            "/api/embed",
            {"model": "ead", "input": "hi", "options": {"num_ctx": N_CTX + 1}},
            400,
            f"options.num_ctx {N_CTX + 1} is past the context served, {N_CTX} tokens "
            "(ead serve --ctx sets it)",
        ),
        (
            "/api/embed",
            {"model": "llama3", "input": "hi"},
            404,
            "model 'llama3' not found: this server serves 'ead:latest' "
            "(ead serve --any-model answers any name)",
        ),
        ("/api/embeddings", {"model": "ead", "prompt": LONG_TEXT}, 400, f"prompt {TOO_LONG}"),
        ("/api/embeddings", {"prompt": "hi"}, 400, "model: Field required"),
    ],
)
def test_bad_ollama_requests_get_ollamas_error_and_one_log_line(
    server: Server, path: str, body: dict, status: int, message: str
) -> None:
    before = server.log().splitlines()
    reply = httpx.post(f"{server.url}{path}", content=json.dumps(body), timeout=60)  # as curl -d sends it
    assert reply.status_code == status
    assert reply.json() == {"error": message}
    assert server.log().splitlines()[len(before) :] == [f"error: POST {path} {status}: {message}"]
    assert post(server, path, {"model": "ead", "input": "hi", "prompt": "hi"}).status_code == 200


def test_embeddings_beside_a_generation_leave_it_as_it_was(server: Server, embedder: Embedder) -> None:
    """A long greedy generation streams while embeddings are asked: its text is the one it has alone,
    and the embeddings are theirs."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    asked = {"model": "ead", "messages": HI, "max_tokens": 1500, "temperature": 0}
    vectors: list[list[float]] = []

    def embed_meanwhile() -> None:
        for text in TEXTS * 4:
            vectors.append(client.embeddings.create(model="ead", input=text).data[0].embedding)

    stream = client.chat.completions.create(**asked, stream=True)
    pieces = [next(stream).choices[0].delta.content or ""]
    beside = threading.Thread(target=embed_meanwhile)
    beside.start()
    pieces += [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    beside.join()
    alone = client.chat.completions.create(**asked)
    assert "".join(pieces) == alone.choices[0].message.content and alone.usage.completion_tokens > 100
    expected = [normalized(raw(embedder, text)) for text in TEXTS * 4]
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


def test_without_embeddings_every_route_is_a_501_in_its_apis_shape(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """As llama-server without --embeddings: 501, not_supported_error (ollama's routes: its shape); and
    with --api-key the routes need the key as /v1 does."""
    with serving([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        keyed = {**JSON, "Authorization": "Bearer s3cret"}
        for path in ("/v1/embeddings", "/embedding", "/embeddings", "/api/embed", "/api/embeddings"):
            body = {"model": "ead", "input": "hi", "prompt": "hi"}
            assert httpx.post(f"{server.url}{path}", json=body, timeout=60).status_code == 401
            before = server.log().splitlines()
            reply = httpx.post(f"{server.url}{path}", json=body, headers=keyed, timeout=60)
            assert reply.status_code == 501
            if path.startswith("/api/"):
                assert reply.json() == {"error": OFF}
            else:
                assert reply.json()["error"] == {
                    "message": OFF,
                    "type": "not_supported_error",
                    "param": None,
                    "code": None,
                }
            assert server.log().splitlines()[len(before) :] == [f"error: POST {path} 501: {OFF}"]
        answer = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI}, headers=keyed)
        assert answer.status_code == 200


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_with_the_large_model_on_a_llama_server_the_small_one_embeds(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The largest local model embeds: here the small one, the large being on a llama-server."""
    with native.llama_server(tiny_pair[1], ["-c", "512", "-t", "1"], tmp_path / "peer.log") as peer:
        args = ["--small", str(tiny_pair[0]), "--large", peer.url, "--threads", "1", "--embeddings"]
        with serving(args, tmp_path / "server.log") as server:
            vector = post(server, "/embedding", {"content": TEXTS[0], "embd_normalize": -1}).json()[0]
    with Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1) as runner:
        embedder = Embedder(runner)
        try:
            expected = raw(embedder, TEXTS[0])
        finally:
            embedder.close()
    np.testing.assert_allclose(vector["embedding"][0], expected, atol=1e-6)


@pytest.mark.real
def test_the_demo_pairs_vectors_put_a_function_nearer_its_description(
    real_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The demo pair's large model (Qwen2.5-Coder 1.5B), mean-pooled: 1536 numbers, and a function
    nearer its description than a question about bread (the figures docs/serve.md gives)."""
    texts = [
        "def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)",
        "Fibonacci numbers, recursively",
        "How do I bake bread?",
    ]
    with serving([*pair_args(real_pair), "--embeddings"], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        vectors = np.array(
            [item.embedding for item in client.embeddings.create(model="ead", input=texts).data]
        )
    assert vectors.shape == (3, 1536)
    code_and_words, code_and_bread = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert code_and_words == pytest.approx(0.48, abs=0.01) and code_and_bread == pytest.approx(0.27, abs=0.01)

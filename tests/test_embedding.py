"""The library's embeddings (``ead_cli/embedding.py``) on a tiny model: llama.cpp's own mean pooling,
whatever the batches; a context beside a generation's; the limits of an input; the normalisations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from ead_cli.embedding import EMBED_BATCH, Embedder, normalized
from ead_cli.errors import EadError
from ead_cli.runner import Runner

TEXT = "hello wörld 日本, " * 20  # some 300 tokens: three of the embedder's batches


@pytest.fixture
def embedder(tiny_large: Path) -> Iterator[Embedder]:
    with Runner(tiny_large, name="large", n_ctx=512, n_threads=1) as runner:
        embedding = Embedder(runner)
        yield embedding
        embedding.close()


def test_the_vector_is_llama_cpps_mean_pooling(embedder: Embedder, tiny_large: Path) -> None:
    """llama.cpp pooling the whole text in one micro-batch (llama-server's --pooling mean) gives the
    vector the embedder averages over its batches of 128 tokens."""
    tokens = embedder.tokens(TEXT)
    assert len(tokens) > 2 * EMBED_BATCH
    pooled = llama_cpp.Llama(
        str(tiny_large),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=1,
        verbose=False,
    )
    try:
        assert pooled.tokenize(TEXT.encode()) == tokens
        expected = np.array(pooled.embed(TEXT, normalize=False), dtype=np.float32)
    finally:
        pooled.close()
    vector = embedder.embed(tokens)
    assert vector.shape == (embedder.n_embd,) == (64,)
    # rounding alone: llama.cpp's pooling is a float32 matrix product, this mean is summed in float64
    # (3e-5 apart with one batch of 512, 4e-5 with batches of 128)
    np.testing.assert_allclose(vector, expected, atol=1e-4)
    assert np.dot(normalized(vector), normalized(expected)) > 0.999999
    assert np.array_equal(embedder.embed(tokens), vector)  # the cache is cleared for each text


def test_an_embedding_leaves_a_generations_cache_as_it_was(tiny_large: Path) -> None:
    """The embedder's context is its own: the runner's cache and its next logits are untouched."""
    with Runner(tiny_large, name="large", n_ctx=512, n_threads=1) as runner:
        prompt = runner.tokenize("def fib(n):", add_special=False)
        before = runner.sync(prompt, prompt_len=len(prompt), own_tail=False).copy()
        embedder = Embedder(runner)
        try:
            embedder.embed(embedder.tokens(TEXT))
        finally:
            embedder.close()
        runner.truncate(len(prompt) - 1)
        again = runner.sync(prompt, prompt_len=len(prompt), own_tail=False)
        np.testing.assert_allclose(again, before, rtol=1e-4, atol=1e-4)


def test_an_input_past_the_context_is_refused_or_cut(embedder: Embedder) -> None:
    long = "ab " * 600
    whole = embedder.runner.tokenize(long, add_special=True)
    assert len(whole) > embedder.n_ctx == 512
    with pytest.raises(EadError, match=rf"^the input is {len(whole)} tokens: the embedding context takes at"):
        embedder.tokens(long)
    assert embedder.tokens(long, truncate=True) == whole[:512]
    assert embedder.tokens("hi") == embedder.runner.tokenize("hi", add_special=True)
    specials = "<|im_end|>" * 600  # cut where the 513th starts, before the tokenizer reads them
    with pytest.raises(EadError, match=r"holds more than 512 special tokens \(such as '<\|im_end\|>'\)"):
        embedder.tokens(specials)
    cut = embedder.tokens(specials, truncate=True)
    assert len(cut) == 512 and len(set(cut)) == 1
    for bad, message in (("", "the input is empty"), ("a\x00b", "the input contains a NUL byte")):
        with pytest.raises(EadError, match=f"^{message}$"):
            embedder.tokens(bad)


def test_the_normalisations_are_llama_servers() -> None:
    vector = np.array([3.0, -4.0, 0.0], dtype=np.float32)
    np.testing.assert_allclose(normalized(vector), [0.6, -0.8, 0.0])
    np.testing.assert_allclose(normalized(vector, -1), vector)
    np.testing.assert_allclose(normalized(vector, 0), [3 * 32760 / 4, -32760, 0.0])
    np.testing.assert_allclose(normalized(vector, 1), [3 / 7, -4 / 7, 0.0])
    np.testing.assert_allclose(normalized(vector, 3), vector / (27 + 64) ** (1 / 3))
    assert not normalized(np.zeros(3, dtype=np.float32)).any()

"""A model's text embeddings (``ead serve --embeddings``): a second llama.cpp context over a runner's
loaded weights, in embedding mode, each text's token vectors mean-pooled as llama-server's ``--pooling
mean`` pools them; and llama.cpp's normalisations of a vector.

The context shares the weights (no second copy in memory) but not the KV cache, so an embedding never
touches the cache a generation is reading, and may run on another thread beside it. llama.cpp's own mean
pooling needs a text in one micro-batch (a context's n_ubatch as large as its longest input), and an
embedding context computes the output head for every token it reads: a 4096-token batch of Qwen2.5's
151,936-entry vocabulary holds 2.5 GB of logits. So the context pools nothing (every token's vector, the
output norm's, which llama.cpp's mean pooling averages), reads a text in batches of ``EMBED_BATCH``
tokens (or the runner's smaller --batch-size), and the mean is taken here: the same vector, with
logits for 128 rows at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np

from .errors import EadError, shown_path
from .prompt import check_text, context_advice, nth_special_token, special_token_pattern
from .remote import RemoteRunner
from .runner import ContextOwner, Runner
from .signals import main_thread_signals

POOLING = "mean"  # Qwen2.5's GGUFs name no pooling of their own; llama-server's --pooling mean
EMBED_BATCH = 128  # tokens read at a time: llama.cpp holds n_vocab logits for each (78 MB for Qwen2.5)


class InputTooLong(EadError):
    """An input past the embedding context (OpenAI's ``context_length_exceeded``)."""


def model_to_embed(runners: Sequence[Runner | RemoteRunner]) -> Runner:
    """The largest local model of a run (runners come smallest first): the one that answers in ead serve's
    default mode, whose reading of a text is the most refined; the smallest is always local."""
    return [runner for runner in runners if isinstance(runner, Runner)][-1]


class Embedder(ContextOwner):
    """Embeddings by ``runner``'s model, in a context of its own as long as the runner's (``n_ctx``: the
    longest input taken). Not thread-safe: one embedding at a time (ead serve's embedding thread)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.n_ctx = runner.n_ctx
        self.n_embd = runner.n_embd
        self._specials = special_token_pattern(runner)
        self._ctx = None
        self._batch = None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self.n_ctx
        # the runner's batches (--batch-size, --ubatch-size), up to EMBED_BATCH
        self.n_batch = min(EMBED_BATCH, runner.n_batch)
        params.n_batch = self.n_batch
        params.n_ubatch = min(self.n_batch, runner.n_ubatch)
        params.n_threads, params.n_threads_batch = runner.n_threads, runner.n_threads_batch
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE  # pooled here: see the module's docstring
        with main_thread_signals():
            self._ctx = llama_cpp.llama_init_from_model(runner.model, params)
        if not self._ctx:
            raise EadError(
                f"llama.cpp could not create an embedding context of {self.n_ctx} tokens for "
                f"{shown_path(runner.path)}"
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):  # every token in sequence 0 alone, each one's vector read
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
            self._batch.logits[i] = True

    def tokens(
        self, text: str, *, truncate: bool = False, what: str = "the input", n_ctx: int | None = None
    ) -> list[int]:
        """The text's tokens as llama-server reads an input to embed (special tokens' texts as those
        tokens, a BOS where the vocabulary wants one). One longer than the context (``n_ctx``: a smaller
        one a request asks for, as ollama's num_ctx; None, the embedder's) is refused, or with
        ``truncate`` cut to its first ``n_ctx`` tokens, as ollama cuts it; a text with more special
        tokens' texts than that is refused or cut before it is tokenized (llama.cpp's tokenizer takes
        time quadratic in their number). ``what`` names the input in a refusal."""
        check_text(text, what)
        n_ctx = self._context(n_ctx)
        past = nth_special_token(text, self._specials, n_ctx + 1)
        if past is not None:
            if not truncate:
                raise InputTooLong(
                    f"{what} holds more than {n_ctx} special tokens (such as {past.group()!r}): "
                    f"{self._too_long(n_ctx)}"
                )
            text = text[: past.start()]  # a special token is a token of its own: the ones before it stay
        ids = self.runner.tokenize(text, add_special=True)
        return self.fitting(ids, truncate=truncate, what=what, n_ctx=n_ctx)

    def fitting(
        self, ids: list[int], *, truncate: bool = False, what: str = "the input", n_ctx: int | None = None
    ) -> list[int]:
        """An input's token ids, refused where there are none, and past the context (``n_ctx``, as
        ``tokens`` takes it) refused or cut."""
        if not ids:
            raise EadError(f"{what} is empty")
        n_ctx = self._context(n_ctx)
        if len(ids) > n_ctx and not truncate:
            raise InputTooLong(f"{what} is {len(ids)} tokens: {self._too_long(n_ctx)}")
        return ids[:n_ctx]

    def _context(self, asked: int | None) -> int:
        """The context an input must fit: the one asked for, at most the embedder's."""
        return self.n_ctx if asked is None else min(asked, self.n_ctx)

    def _too_long(self, n_ctx: int) -> str:
        if n_ctx < self.n_ctx:
            return f"the context asked for takes at most {n_ctx} (ask for up to {self.n_ctx} or shorten it)"
        advice = context_advice([self.runner])
        return f"the embedding context takes at most {self.n_ctx} ({advice} or shorten it)"

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The mean of the tokens' vectors (the model's last hidden states, output-normed), unnormalised:
        llama.cpp's mean pooling, whatever the batches the text is read in."""
        if not 0 < len(tokens) <= self.n_ctx:
            raise EadError(f"an input to embed takes 1 to {self.n_ctx} tokens, got {len(tokens)}")
        llama_cpp.llama_memory_clear(self._memory, True)
        total = np.zeros(self.n_embd, dtype=np.float64)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            for i, token in enumerate(chunk):
                self._batch.token[i] = token
                self._batch.pos[i] = start + i
            self._batch.n_tokens = len(chunk)
            status = llama_cpp.llama_decode(self._ctx, self._batch)
            if status != 0:
                raise EadError(f"llama.cpp failed to embed the input (llama_decode returned {status})")
            rows = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(self._ctx), (len(chunk), self.n_embd))
            total += rows.sum(axis=0, dtype=np.float64)
        return (total / len(tokens)).astype(np.float32)

    def close(self) -> None:
        """Free the batch and the context (the runner owns the model; safe to call twice)."""
        self._free_context()


def normalized(vector: np.ndarray, norm: int = 2) -> np.ndarray:
    """``vector`` over its norm, as llama.cpp's common_embd_normalize (llama-server's ``embd_normalize``):
    -1 none, 0 the largest magnitude scaled to int16's range (32760), 2 Euclidean (L2), any other p the
    p-norm (1: taxicab); a zero vector stays zero."""
    values = vector.astype(np.float64)
    if norm == -1:
        size = 1.0
    elif norm == 0:
        size = float(np.abs(values).max(initial=0.0)) / 32760.0
    else:  # scaled by the largest first, so that no power overflows
        largest = float(np.abs(values).max(initial=0.0))
        size = largest * float(np.sum((np.abs(values) / largest) ** norm) ** (1.0 / norm)) if largest else 0.0
    return (values * (1.0 / size if size > 0 else 0.0)).astype(np.float32)

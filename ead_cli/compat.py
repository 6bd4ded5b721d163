"""Refuse to let models decode one token stream together unless they share a tokenizer.

Models that write one answer together hand token ids to each other, so an id must mean the same text
in every model and the same ids must end a generation. The check reads the vocabularies through
llama.cpp (a model loaded with ``vocab_only`` is enough) and takes ~0.2 s for a pair of Qwen2.5
vocabularies of 151,936 tokens: one ctypes call per id and model for the text and one for the
end-of-generation flag, via ``map`` so no Python frame runs per id.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import llama_cpp

from ead_cli.errors import EadError

# Qwen2.5 7B and larger pad their vocabulary to 152,064 ids while 0.5B-3B have 151,936: the ids beyond
# the smaller vocabulary are unused padding, so a size difference up to this fraction is accepted.
MAX_SIZE_DIFFERENCE = 0.01

_VOCAB_TYPES = {
    llama_cpp.LLAMA_VOCAB_TYPE_NONE: "none",
    llama_cpp.LLAMA_VOCAB_TYPE_SPM: "SentencePiece (SPM)",
    llama_cpp.LLAMA_VOCAB_TYPE_BPE: "byte-level BPE",
    llama_cpp.LLAMA_VOCAB_TYPE_WPM: "WordPiece",
    llama_cpp.LLAMA_VOCAB_TYPE_UGM: "Unigram",
    llama_cpp.LLAMA_VOCAB_TYPE_RWKV: "RWKV",
    llama_cpp.LLAMA_VOCAB_TYPE_PLAMO2: "PLaMo-2",
}


@dataclass(frozen=True)
class _Vocab:
    name: str
    handle: llama_cpp.llama_vocab_p
    kind: int
    texts: list[bytes]
    eog: frozenset[int]

    @classmethod
    def read(cls, name: str, model: llama_cpp.llama_model_p) -> _Vocab:
        handle = llama_cpp.llama_model_get_vocab(model)
        ids = range(llama_cpp.llama_vocab_n_tokens(handle))
        texts = list(map(partial(llama_cpp.llama_vocab_get_text, handle), ids))
        eog = frozenset(itertools.compress(ids, map(partial(llama_cpp.llama_vocab_is_eog, handle), ids)))
        return cls(name, handle, llama_cpp.llama_vocab_type(handle), texts, eog)

    def is_unused(self, token: int) -> bool:
        """Padding ids (``[PAD151665]`` in Qwen): no model produces them, so their names may differ."""
        return bool(llama_cpp.llama_vocab_get_attr(self.handle, token) & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED)

    def show(self, token: int) -> str:
        return repr(self.texts[token].decode("utf-8", errors="replace"))


def check_tokenizers(models: Sequence[tuple[str, llama_cpp.llama_model_p]]) -> None:
    """Raise ``EadError`` unless every model shares the first one's tokenizer.

    Each entry is a display name and a loaded llama.cpp model. Compared with the first model: the
    vocabulary type, the size (within ``MAX_SIZE_DIFFERENCE``), the text of every id both have except
    unused padding ids, and the set of end-of-generation ids. Callers must still keep sampled ids below
    the smallest vocabulary size, since the padding ids of the larger vocabulary exist in only one model.
    """
    if len(models) < 2:
        return
    first = _Vocab.read(*models[0])
    for name, model in models[1:]:
        _compare(first, _Vocab.read(name, model))


def _compare(a: _Vocab, b: _Vocab) -> None:
    def refuse(reason: str) -> EadError:
        return EadError(f"models {a.name!r} and {b.name!r} do not share a tokenizer: {reason}")

    if a.kind != b.kind:
        kinds = [_VOCAB_TYPES.get(v.kind, f"type {v.kind}") for v in (a, b)]
        raise refuse(f"{a.name} uses a {kinds[0]} vocabulary but {b.name} a {kinds[1]} one")
    n_a, n_b = len(a.texts), len(b.texts)
    if abs(n_a - n_b) > MAX_SIZE_DIFFERENCE * max(n_a, n_b):
        raise refuse(f"{a.name} has {n_a} tokens but {b.name} has {n_b}")
    common = min(n_a, n_b)
    differing = itertools.compress(range(common), map(operator.ne, a.texts[:common], b.texts[:common]))
    for token in differing:
        if not (a.is_unused(token) and b.is_unused(token)):
            raise refuse(f"token {token} is {a.show(token)} in {a.name} but {b.show(token)} in {b.name}")
    if a.eog != b.eog:
        token = min(a.eog ^ b.eog)
        ends, runs_on = (a, b) if token in a.eog else (b, a)
        raise refuse(
            f"token {token} ({ends.show(token)}) ends a generation in {ends.name} but not in {runs_on.name}"
        )


def tokenizer_record(runner: object) -> dict[str, object] | None:
    """What a recorded token stream needs of the models it is replayed on: the vocabulary size and a
    fingerprint of its tokenizer (None for a model without a local vocabulary)."""
    model = getattr(runner, "model", None)
    if model is None:
        return None
    vocab = _Vocab.read("", model)
    return {"tokens": len(vocab.texts), "sha256": tokenizer_digest(vocab, len(vocab.texts))}


def tokenizer_digest(vocab: _Vocab, count: int) -> str:
    """SHA-256 of the texts of ids below ``count`` (unused padding ids, which may differ, left out)
    and of the end-of-generation ids below it."""
    digest = hashlib.sha256(vocab.kind.to_bytes(4, "little"))
    for token in range(count):
        text = b"" if vocab.is_unused(token) else vocab.texts[token]
        digest.update(len(text).to_bytes(4, "little") + text)
    digest.update(repr(sorted(token for token in vocab.eog if token < count)).encode())
    return digest.hexdigest()


def check_recorded_tokenizer(recorded: dict[str, object], name: str, model: llama_cpp.llama_model_p) -> None:
    """Refuse a model whose tokenizer differs from the recorded one (in one line, naming the model)."""
    vocab = _Vocab.read(name, model)
    count = int(recorded["tokens"])  # type: ignore[call-overload]
    if len(vocab.texts) < count or abs(len(vocab.texts) - count) > MAX_SIZE_DIFFERENCE * count:
        raise EadError(f"{name} has {len(vocab.texts)} tokens but the schedules were recorded with {count}")
    if tokenizer_digest(vocab, count) != recorded["sha256"]:
        raise EadError(f"{name} does not have the tokenizer the schedules were recorded with")

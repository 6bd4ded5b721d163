"""The tiny test models load in llama.cpp, round-trip any UTF-8 text and have the documented entropies."""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from tiny_models import (
    CHATML,
    MIDDLE_ENTROPY_BITS,
    NEAR_DETERMINISTIC_SCALE,
    NEAR_UNIFORM_SCALE,
    vocabulary,
    write_tiny_model,
)

PROMPT = "hello wörld 日本"
CHAT_PROMPT = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def load(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False, logits_all=False)


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def entropy_bits(logits: np.ndarray) -> float:
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    nonzero = p[p > 0]
    return float(-(nonzero * np.log2(nonzero)).sum())


def greedy(llm: llama_cpp.Llama, prompt: str, n: int) -> tuple[list[int], list[float]]:
    """Greedy-generate ``n`` tokens from a fresh context; return them and the entropy before each."""
    llm.reset()
    llm.eval(llm.tokenize(prompt.encode(), add_bos=False, special=True))
    tokens, entropies = [], []
    for _ in range(n):
        logits = last_logits(llm)
        entropies.append(entropy_bits(logits))
        tokens.append(int(logits.argmax()))
        llm.eval([tokens[-1]])
    return tokens, entropies


def test_tiny_model_loads_fast_with_qwen_like_vocab(tiny_small: Path) -> None:
    start = time.perf_counter()
    llm = load(tiny_small)
    assert time.perf_counter() - start < 1.0
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llm.n_vocab() == 267
    assert llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_BPE
    assert llama_cpp.llama_vocab_get_text(vocab, llm.token_eos()) == b"<|im_end|>"
    assert llama_cpp.llama_vocab_eot(vocab) == llm.token_eos()
    assert not llama_cpp.llama_vocab_get_add_bos(vocab)
    eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    assert [llama_cpp.llama_vocab_get_text(vocab, i) for i in eog] == [b"<|endoftext|>", b"<|im_end|>"]
    assert llm.metadata["tokenizer.chat_template"] == CHATML


@pytest.mark.parametrize("text", [PROMPT, "é", "emoji 😀🎉 done", "the other\nline"])
def test_any_utf8_text_round_trips(tiny_small: Path, text: str) -> None:
    llm = load(tiny_small)
    tokens = llm.tokenize(text.encode(), add_bos=False)
    assert llm.detokenize(tokens) == text.encode()


def test_multibyte_characters_split_across_byte_tokens(tiny_small: Path) -> None:
    llm = load(tiny_small)
    tokens = llm.tokenize("日".encode(), add_bos=False)
    assert [llm.detokenize([t]) for t in tokens] == [b"\xe6", b"\x97", b"\xa5"]


def test_merges_and_control_tokens_tokenize(tiny_small: Path) -> None:
    llm = load(tiny_small)
    assert [llm.detokenize([t]) for t in llm.tokenize(b"there", add_bos=False)] == [b"th", b"er", b"e"]
    chat = llm.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert chat[0] == 265
    assert chat[-1] == llm.token_eos() == 266


def test_greedy_generation_runs_on_without_ending(tiny_pair: tuple[Path, Path]) -> None:
    for path in tiny_pair:
        llm = load(path)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        tokens, _ = greedy(llm, CHAT_PROMPT, 50)
        assert not any(llama_cpp.llama_vocab_is_eog(vocab, t) for t in tokens)
        assert len(set(tokens)) > 5


def test_near_uniform_scale_is_near_uniform(tmp_path: Path) -> None:
    llm = load(write_tiny_model(tmp_path / "uniform.gguf", logit_scale=NEAR_UNIFORM_SCALE))
    _, entropies = greedy(llm, PROMPT, 50)
    assert min(entropies) > 8.0  # log2(267) = 8.06


def test_near_deterministic_scale_is_near_one_hot(tmp_path: Path) -> None:
    llm = load(write_tiny_model(tmp_path / "sharp.gguf", logit_scale=NEAR_DETERMINISTIC_SCALE))
    _, entropies = greedy(llm, PROMPT, 50)
    assert np.median(entropies) < 0.05
    assert np.mean(np.array(entropies) < 0.5) >= 0.9


def test_middle_scale_crosses_the_middle_threshold(tiny_pair: tuple[Path, Path]) -> None:
    for path in tiny_pair:
        _, entropies = greedy(load(path), PROMPT, 50)
        above = np.mean(np.array(entropies) > MIDDLE_ENTROPY_BITS)
        assert 0.1 <= above <= 0.5, above


def test_logit_scale_scales_logits_but_keeps_the_greedy_path(tmp_path: Path) -> None:
    base = load(write_tiny_model(tmp_path / "s2.gguf", logit_scale=2.0))
    sharp = load(write_tiny_model(tmp_path / "s40.gguf", logit_scale=40.0))
    tokens = base.tokenize(PROMPT.encode(), add_bos=False)
    base.eval(tokens)
    sharp.eval(tokens)
    np.testing.assert_allclose(last_logits(sharp), 20 * last_logits(base), rtol=1e-3, atol=1e-3)
    assert greedy(base, PROMPT, 20)[0] == greedy(sharp, PROMPT, 20)[0]


def test_different_seeds_predict_differently(tiny_pair: tuple[Path, Path]) -> None:
    small, large = (load(p) for p in tiny_pair)
    tokens = small.tokenize(PROMPT.encode(), add_bos=False)
    assert large.tokenize(PROMPT.encode(), add_bos=False) == tokens
    small.eval(tokens)
    large.eval(tokens)
    assert np.abs(last_logits(small) - last_logits(large)).max() > 1.0
    assert greedy(small, PROMPT, 20)[0] != greedy(large, PROMPT, 20)[0]


def test_a_script_is_written_whatever_came_before_and_a_token_it_repeats_is_refused(tmp_path: Path) -> None:
    """A bigram model: each token of the script follows the one before it, after any prompt that ends with
    the first (a chat's, or other text); a token named twice would need two successors."""
    script = ["Ċ", "6", "*", "7", "Ġ", "<|im_end|>"]
    llm = load(write_tiny_model(tmp_path / "script.gguf", script=script))
    texts = vocabulary()[0]
    for prompt in (CHAT_PROMPT, f"{PROMPT}\n"):
        tokens, entropies = greedy(llm, prompt, len(script) - 1)
        assert [texts[token] for token in tokens] == script[1:]
        assert max(entropies) < 0.01
    with pytest.raises(ValueError, match="each token once"):
        write_tiny_model(tmp_path / "twice.gguf", script=["a", "b", "a", "c"])

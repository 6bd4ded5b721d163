"""Models decode together only if they share a tokenizer; the check names the first difference."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest
from tiny_models import write_tiny_model

from ead_cli.compat import check_tokenizers
from ead_cli.errors import EadError


def load_vocab(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, vocab_only=True)


def check(*paths: Path) -> None:
    """Run the check on the models at ``paths``, named by file name (kept loaded for the call)."""
    llms = [load_vocab(p) for p in paths]
    check_tokenizers([(p.name, llm.model) for p, llm in zip(paths, llms, strict=True)])


def test_same_vocabulary_passes(tiny_pair: tuple[Path, Path]) -> None:
    small, large = tiny_pair
    check(small, large)
    check(large, small, small)


def test_a_single_model_needs_no_check(tiny_small: Path) -> None:
    check(tiny_small)


def test_other_vocabulary_is_refused_at_the_first_differing_token(
    tiny_small: Path, tiny_large: Path, tiny_other_vocab: Path
) -> None:
    with pytest.raises(EadError) as refused:
        check(tiny_small, tiny_large, tiny_other_vocab)
    assert str(refused.value) == (
        "models 'small.gguf' and 'other_vocab.gguf' do not share a tokenizer: "
        "token 258 is 'er' in small.gguf but 're' in other_vocab.gguf"
    )
    assert refused.value.exit_code == 1


def test_vocabulary_sizes_far_apart_are_refused_with_both_sizes(
    tiny_small: Path, tiny_other_size: Path
) -> None:
    with pytest.raises(EadError) as refused:
        check(tiny_other_size, tiny_small)
    assert str(refused.value) == (
        "models 'other_size.gguf' and 'small.gguf' do not share a tokenizer: "
        "other_size.gguf has 331 tokens but small.gguf has 267"
    )


def test_padded_vocabulary_within_one_percent_passes(tiny_small: Path, tmp_path: Path) -> None:
    padded = write_tiny_model(tmp_path / "padded.gguf", seed=4, vocab="padded")
    assert load_vocab(padded).n_vocab() == load_vocab(tiny_small).n_vocab() + 2
    check(tiny_small, padded)
    check(padded, tiny_small)


def test_different_end_of_generation_ids_are_refused(tiny_small: Path, tmp_path: Path) -> None:
    other_eot = write_tiny_model(tmp_path / "eot.gguf", seed=5, eot_token="<|im_start|>")
    with pytest.raises(EadError) as refused:
        check(tiny_small, other_eot)
    assert str(refused.value) == (
        "models 'small.gguf' and 'eot.gguf' do not share a tokenizer: "
        "token 265 ('<|im_start|>') ends a generation in eot.gguf but not in small.gguf"
    )


@pytest.mark.real
def test_real_pair_shares_a_tokenizer(real_pair: tuple[Path, Path]) -> None:
    small, large = (load_vocab(path) for path in real_pair)
    assert small.n_vocab() == large.n_vocab() == 151_936
    check_tokenizers([("small", small.model), ("large", large.model)])

"""Shared fixtures: tiny GGUF models written once per test session (a few ms each)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest
from tiny_models import THINKING_TEMPLATE, open_pair, write_tiny_model

from ead_cli import registry
from ead_cli.hardware import repack_choice
from ead_cli.runner import Runner


@pytest.fixture(autouse=True)
def bare_llama_loads_as_ead_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that compare ead with llama-cpp-python's own ``Llama`` load it with llama.cpp's defaults,
    which repack weights; where that crashes (an active AMX buffer: ggml-org/llama.cpp#20824), ``Llama``
    loads as ead does, without repacking."""
    if repack_choice().enabled:
        return
    default_params = llama_cpp.llama_cpp.llama_model_default_params

    def without_repacking() -> llama_cpp.llama_model_params:
        params = default_params()
        params.use_extra_bufts = False
        return params

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", without_repacking)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_small(tiny_dir: Path) -> Path:
    """The "small" model of a pair: base vocabulary, seed 0, middle entropy."""
    return write_tiny_model(tiny_dir / "small.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_large(tiny_dir: Path) -> Path:
    """The "large" model: the small one's vocabulary, another seed, so it predicts differently."""
    return write_tiny_model(tiny_dir / "large.gguf", seed=1)


@pytest.fixture(scope="session")
def tiny_pair(tiny_small: Path, tiny_large: Path) -> tuple[Path, Path]:
    return tiny_small, tiny_large


@pytest.fixture(scope="session")
def tiny_think_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """A thinking pair: the <think> tokens, and a template that opens the block (the answer starts inside
    it) and reads enable_thinking."""
    small, large = (
        write_tiny_model(
            tiny_dir / f"think{seed}.gguf", seed=seed, vocab="think", chat_template=THINKING_TEMPLATE
        )
        for seed in (0, 1)
    )
    return small, large


@pytest.fixture(scope="session")
def tiny_other_vocab(tiny_dir: Path) -> Path:
    """Same vocabulary size as the pair, but token 258 is 're' where the pair has 'er'."""
    return write_tiny_model(tiny_dir / "other_vocab.gguf", seed=2, vocab="other")


@pytest.fixture(scope="session")
def tiny_other_size(tiny_dir: Path) -> Path:
    """64 more merged tokens than the pair: 331 tokens instead of 267."""
    return write_tiny_model(tiny_dir / "other_size.gguf", seed=3, vocab="bigger")


@pytest.fixture(scope="session")
def real_pair() -> tuple[Path, Path]:
    """The default demo pair (Qwen2.5-Coder 0.5B and 1.5B Instruct), resolved as a user's run would:
    from the ead cache, assembled once from the offline packages that ./scripts/setup.sh installs."""
    catalog = registry.load_catalog()
    small, large = (
        registry.resolve(alias, catalog, allow_download=False) for alias in (catalog.small, catalog.large)
    )
    return small, large


@pytest.fixture
def runners(tiny_pair: tuple[Path, Path]) -> Iterator[list[Runner]]:
    """The tiny pair loaded, closed after the test."""
    pair = open_pair(tiny_pair, 512)
    yield pair
    for runner in pair:
        runner.close()


@pytest.fixture
def fresh(tiny_pair: tuple[Path, Path]) -> Iterator:
    """Runners with cold caches, one pair per run compared (the penalties' and DRY's tests)."""
    opened: list[list[Runner]] = []

    def open_one(paths: tuple[Path, Path] = tiny_pair) -> list[Runner]:
        opened.append(open_pair(paths))
        return opened[-1]

    yield open_one
    for runners in opened:
        for runner in runners:
            runner.close()

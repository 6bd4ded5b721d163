"""ead-cli: entropy-adaptive decoding across GGUF models that share a tokenizer."""

from importlib.metadata import PackageNotFoundError, version

from .signals import main_thread_signals

with main_thread_signals():
    import numpy  # noqa: F401  (OpenBLAS starts its thread pool at import: it must not take a Ctrl-C)

try:
    __version__ = version("ead-cli")  # one source of truth: pyproject.toml, through the installed metadata
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

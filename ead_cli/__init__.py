"""ead-cli: entropy-adaptive decoding across GGUF models that share a tokenizer."""

from .signals import main_thread_signals

with main_thread_signals():
    import numpy  # noqa: F401  (OpenBLAS starts its thread pool at import: it must not take a Ctrl-C)

__version__ = "0.1.0"

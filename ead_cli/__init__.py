"""ead-cli: entropy-adaptive decoding across GGUF models that share a tokenizer."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ead-cli")  # one source of truth: pyproject.toml, through the installed metadata
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

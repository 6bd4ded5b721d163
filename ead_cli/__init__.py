"""ead-cli: entropy-adaptive decoding across GGUF models that share a tokenizer."""

__version__ = "0.1.0"

"""``ead serve --metrics``: ``GET /metrics`` in Prometheus's text format, llama-server's names where a
figure means what its does (``llamacpp:prompt_tokens_total``, ...) and ead's own (``ead:...``): the
tokens each model wrote, the switches, the large model's share, the embeddings. The counters add up the
summaries the engine gives each answer (``Metrics.record``) and the embedding requests it answers
(``Metrics.record_embedding``: ead's own counters, as llama-server counts an embedding in none of its
own), the request gauges read its queues (``Engine.requests``: generations and embeddings, as
llama-server's count its slots at work and the tasks waiting for one)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..decoder import Summary

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text exposition format
# Each family a scrape lists, in order: its name, type and help (llama-server's words for its own).
FAMILIES = (
    ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens kept in the caches."),
    ("llamacpp:prompt_seconds_total", "counter", "Prompt process time (every model's)."),
    ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time (every model's)."),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing."),
    ("llamacpp:requests_deferred", "gauge", "Number of requests deferred."),
    ("ead:tokens_total", "counter", "Tokens written by each model."),
    ("ead:switches_total", "counter", "Times the model writing an answer changed."),
    ("ead:large_share", "gauge", "Share of the generated tokens the large model wrote."),
    ("ead:embedding_requests_total", "counter", "Embedding requests answered."),
    ("ead:embedding_tokens_total", "counter", "Tokens read to embed."),
)


def cached_tokens(summary: Summary) -> int:
    """The prompt tokens the caches kept from the request before (not read again): of the model that
    read the most, as one alone may leave another idle. None below 0: a llama-server that lost its cache
    books the answer's tokens it reads again with the prompt's."""
    return max(0, summary.prompt_tokens - max(model.prefill_tokens for model in summary.models))


def prompt_seconds(summary: Summary) -> float:
    """The seconds an answer's models spent reading its prompt (llama-server's prompt time)."""
    return sum(model.prefill_s for model in summary.models)


def generation_seconds(summary: Summary) -> float:
    """The seconds an answer's models spent generating, a large model's catch-up included (llama-server's
    predicted time)."""
    return sum(model.decode_s + model.catchup_s for model in summary.models)


@dataclass
class _Totals:
    prompt_tokens: int = 0  # read (not kept in the caches)
    cached_tokens: int = 0
    prompt_s: float = 0.0
    generated: int = 0
    generation_s: float = 0.0
    switches: int = 0
    embedding_requests: int = 0
    embedding_tokens: int = 0


class Metrics:
    """What the answers so far add up to, by the models' roles (small, mid..., large), recorded by the
    engine's thread and read by the server's."""

    def __init__(self, roles: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._totals = _Totals()
        self._written = dict.fromkeys(roles, 0)

    def record(self, summary: Summary) -> None:
        """An answer's figures, whole or cut off: what it read and wrote was computed all the same."""
        cached = cached_tokens(summary)
        with self._lock:
            totals = self._totals
            totals.prompt_tokens += summary.prompt_tokens - cached
            totals.cached_tokens += cached
            totals.prompt_s += prompt_seconds(summary)
            totals.generated += summary.generated
            totals.generation_s += generation_seconds(summary)
            totals.switches += summary.switches
            for model in summary.models:
                self._written[model.role] += model.written

    def record_embedding(self, tokens: int) -> None:
        """An embedding request answered, of ``tokens`` tokens read, its inputs' together."""
        with self._lock:
            self._totals.embedding_requests += 1
            self._totals.embedding_tokens += tokens

    def exposition(self, processing: int, deferred: int) -> str:
        """The text a Prometheus scrape reads; ``processing`` and ``deferred``: the requests at work and
        waiting now, generations and embeddings (``Engine.requests``)."""
        with self._lock:
            totals, written = _Totals(**vars(self._totals)), dict(self._written)
        large = next(reversed(written))  # the largest model's role: the last
        share = written[large] / totals.generated if totals.generated else 0.0
        values: dict[str, list[tuple[str, float]]] = {
            "llamacpp:prompt_tokens_total": [("", totals.prompt_tokens)],
            "llamacpp:prompt_tokens_cached_total": [("", totals.cached_tokens)],
            "llamacpp:prompt_seconds_total": [("", totals.prompt_s)],
            "llamacpp:tokens_predicted_total": [("", totals.generated)],
            "llamacpp:tokens_predicted_seconds_total": [("", totals.generation_s)],
            "llamacpp:requests_processing": [("", processing)],
            "llamacpp:requests_deferred": [("", deferred)],
            "ead:tokens_total": [(f'{{model="{role}"}}', count) for role, count in written.items()],
            "ead:switches_total": [("", totals.switches)],
            "ead:large_share": [("", share)],
            "ead:embedding_requests_total": [("", totals.embedding_requests)],
            "ead:embedding_tokens_total": [("", totals.embedding_tokens)],
        }
        lines = []
        for name, kind, help_text in FAMILIES:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{labels} {value}" for labels, value in values[name]]
        return "\n".join(lines) + "\n"

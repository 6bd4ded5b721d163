"""Reading a probe layer: the eval-callback tap that stops llama.cpp's graph, and the estimators of
the readout's entropy (full, top-k, low-rank) with their FLOP cost.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import llama_cpp
import numpy as np

from .readout import (
    NAME_OFFSET,
    Head,
    HeadWeights,
    low_rank_factors,
)


class LayerTap:
    """llama.cpp's graph eval callback: asks for the output of the blocks in ``wanted`` only and hands
    each (as a ggml tensor address) to ``see``, which returns False to stop the rest of the graph.

    An exception inside a ctypes callback cannot propagate: it is kept and raised after the decode."""

    def __init__(self) -> None:
        self.wanted: dict[bytes, int] = {}
        self.see: Callable[[int, int], bool] | None = None
        self.seconds = 0.0
        self.error: BaseException | None = None
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._call)

    def want(self, layers: Sequence[int]) -> None:
        self.wanted = {f"l_out-{layer - 1}".encode(): layer for layer in layers}

    def _call(self, tensor: int, ask: bool, _data: int | None) -> bool:
        layer = self.wanted.get(ctypes.string_at(tensor + NAME_OFFSET))
        if ask:
            return layer is not None
        if layer is None or self.see is None or self.error is not None:
            return True
        began = perf_counter()
        try:
            return self.see(layer, tensor)
        except BaseException as error:  # raised again by check() after llama_decode
            self.error = error
            return True
        finally:
            self.seconds += perf_counter() - began

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error


@dataclass(frozen=True)
class Reading:
    """An estimator's look at one hidden state: entropy (bits), top-1 probability, and the full logits
    when it computed them (so the exit layer's token needs no second readout)."""

    entropy: float
    top1: float
    logits: np.ndarray | None


def distribution_figures(logits: np.ndarray) -> tuple[float, float]:
    z = logits.astype(np.float64) - float(np.max(logits))
    p = np.exp(z)
    total = p.sum()
    entropy = float(-(p * (z - math.log(total))).sum() / total / math.log(2.0))
    return entropy, float(1.0 / total)


class Estimator:
    """Full softmax: the exact entropy, at the cost of a full readout per probe."""

    name = "full"

    def __init__(self, head: Head) -> None:
        self.head = head

    def start_token(self) -> None:
        """A new token's probes begin (the top-K estimator forgets its candidates)."""

    def read(self, hidden: np.ndarray) -> Reading:
        logits = self.head.logits(hidden)[0]
        entropy, top1 = distribution_figures(logits)
        return Reading(entropy, top1, logits)

    def flops(self, probes_read: int) -> float:
        return estimator_flops(self.name, probes_read, self.head.weights, k=0, rank=0)


def extra_readout(estimator: str, probes_read: int) -> bool:
    """Whether a token that exits below L needs a full readout beyond its probes' own: not where the
    exit probe read out in full (every full probe, top-K's first)."""
    return estimator == "lowrank" or (estimator == "topk" and probes_read > 1)


def estimator_flops(name: str, probes_read: int, weights: HeadWeights, *, k: int, rank: int) -> float:
    """FLOPs of a token's probe readouts: full rows; top-K: one full row, then K rows each; low-rank:
    r x (V + d) each."""
    full = 2.0 * weights.n_vocab * weights.n_embd
    if name == "topk":
        return full + max(probes_read - 1, 0) * 2.0 * k * weights.n_embd if probes_read else 0.0
    if name == "lowrank":
        return probes_read * 2.0 * rank * (weights.n_vocab + weights.n_embd)
    return probes_read * full


class TopK(Estimator):
    """The first probe of a token reads out in full; its K most likely tokens are the candidates whose
    rows (float32) later probes of the same token read: the entropy of the renormalised top-K."""

    name = "topk"

    def __init__(self, head: Head, k: int) -> None:
        super().__init__(head)
        self.k = min(k, head.weights.n_vocab)
        self._rows: np.ndarray | None = None

    def start_token(self) -> None:
        self._rows = None

    def read(self, hidden: np.ndarray) -> Reading:
        if self._rows is None:
            reading = super().read(hidden)
            top = np.argpartition(-reading.logits, self.k - 1)[: self.k]
            self._rows = self.head.dense_rows(np.sort(top))
            return reading
        logits = self._rows @ self.head.normed(hidden)[0]
        entropy, top1 = distribution_figures(logits)
        return Reading(entropy, top1, None)

    def flops(self, probes_read: int) -> float:
        return estimator_flops(self.name, probes_read, self.head.weights, k=self.k, rank=0)


class LowRank(Estimator):
    """logits ~ A (B x): rank r of the output matrix (A: n_vocab x r, B: r x n_embd), cached per model.
    The matrix has rank n_embd at most: a larger r is n_embd, as top-K's K is n_vocab at most."""

    name = "lowrank"

    def __init__(self, head: Head, rank: int, cache: Path) -> None:
        super().__init__(head)
        self.rank = min(rank, head.weights.n_embd)
        self.a, self.b = low_rank_factors(head, self.rank, cache)

    def read(self, hidden: np.ndarray) -> Reading:
        logits = self.a @ (self.b @ self.head.normed(hidden)[0])
        entropy, top1 = distribution_figures(logits)
        return Reading(entropy, top1, None)

    def flops(self, probes_read: int) -> float:
        return estimator_flops(self.name, probes_read, self.head.weights, k=0, rank=self.rank)

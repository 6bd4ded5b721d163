"""Shannon entropy of a next-token distribution, in bits, from raw logits."""

import math

import numpy as np

_LN2 = math.log(2.0)


class EntropyMeter:
    """Entropy (bits) of softmax(logits), before any temperature, for rows of one vocabulary size.

    Stable for any logit range: with z = logits - max and S = sum(exp z),
    H = ln S - sum(exp(z) * z) / S nats. The scratch rows are allocated once, so the per-token path
    makes no 600 KB allocations, and both sums are BLAS dot products (several times faster than
    numpy's pairwise ``sum``): ~0.1 ms for 152k logits.
    """

    def __init__(self, n_vocab: int) -> None:
        self._shifted = np.empty(n_vocab, dtype=np.float32)
        self._exp = np.empty(n_vocab, dtype=np.float32)
        self._ones = np.ones(n_vocab, dtype=np.float32)

    def __call__(self, logits: np.ndarray) -> float:
        shifted, exp = self._shifted, self._exp
        np.subtract(logits, logits.max(), out=shifted)
        np.exp(shifted, out=exp)
        total = float(np.dot(exp, self._ones))
        return (math.log(total) - float(np.dot(exp, shifted)) / total) / _LN2


def entropy_bits(logits: np.ndarray) -> float:
    """Entropy (bits) of softmax(logits) for a one-off row (loops keep an ``EntropyMeter``)."""
    return EntropyMeter(logits.shape[-1])(logits)


def max_entropy_bits(n_vocab: int) -> float:
    """log2 |V|: the entropy of a uniform distribution, used to normalise entropies to [0, 1]."""
    return math.log2(n_vocab)

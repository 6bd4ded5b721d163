"""Shannon entropy of a next-token distribution, in bits, from raw logits."""

import math

import numpy as np

_LN2 = math.log(2.0)


class EntropyMeter:
    """Entropy (bits) of softmax(logits), before any temperature, for rows of one vocabulary size.

    Stable for any finite logit range: with z = logits - max and S = sum(exp z),
    H = ln S - sum(exp(z) * z) / S nats. Passes over the row: max, shift, exp, then S by numpy's
    pairwise sum and the other sum as a BLAS dot product; the scratch rows are allocated once, so the
    per-token path makes no 600 KB allocations. The exp pass is the floor of any exact entropy: ~55 us
    for 151,936 logits on one core with the row in cache (docs/results.md#loop-overhead). Float32 sums:
    within 1e-4 bits of a float64 computation (~3e-5 on the real models' rows). Rows float32 cannot
    take (a -inf logit, as a logit bias bans a token with; +inf; a range past 3.4e38) take a float64 path.
    """

    def __init__(self, n_vocab: int) -> None:
        self._shifted = np.empty(n_vocab, dtype=np.float32)
        self._exp = np.empty(n_vocab, dtype=np.float32)

    def __call__(self, logits: np.ndarray, top: float | None = None) -> float:
        """The entropy; ``top``, where the caller has it (a greedy step's argmax), is ``logits.max()``."""
        shifted, exp = self._shifted, self._exp
        if top is None:
            top = logits.max()
        if math.isfinite(top):
            with np.errstate(over="ignore", invalid="ignore"):  # a shift past -3.4e38 is -inf: 0 * -inf
                np.subtract(logits, top, out=shifted)
                np.exp(shifted, out=exp)
                weighted = float(np.dot(exp, shifted))
            total = float(np.add.reduce(exp))
            if math.isfinite(weighted):
                return (math.log(total) - weighted / total) / _LN2
        return _entropy_in_float64(logits)


def _entropy_in_float64(logits: np.ndarray) -> float:
    """The same entropy where float32 overflows, and its limits: +inf logits share all the probability
    equally, -inf logits get none. NaN logits (or none finite) have no entropy: NaN."""
    if np.isnan(logits).any():
        return math.nan
    top = np.isposinf(logits)
    if top.any():
        return math.log2(int(np.count_nonzero(top)))
    finite = logits[np.isfinite(logits)].astype(np.float64)
    if finite.size == 0:
        return math.nan
    z = finite - finite.max()
    weights = np.exp(z)
    total = weights.sum()
    return (math.log(total) - float(np.dot(weights, z)) / total) / _LN2


def entropy_floor_bits(top: float, bottom: float, n_vocab: int) -> float:
    """A lower bound (bits) on the entropy of softmax over ``n_vocab`` logits, all in [bottom, top].

    The top token's probability is at most 1 / (1 + (n - 1) e^(bottom - top)) (every other token has
    at least e^(bottom - top) of its weight), and the entropy is at least the min-entropy -log2 p_max.
    Tight for rows whose logits spread over a few nats (a random-weight twin's: within ~3 bits of
    log2 n), 0 for a real model's (spread over 30-50 nats). A NaN logit bounds nothing: 0.
    """
    spread = float(top) - float(bottom)
    if not spread >= 0:  # NaN, or an inverted range
        return 0.0
    return math.log2(1.0 + (n_vocab - 1) * math.exp(-spread)) if spread < 700 else 0.0


def entropy_bits(logits: np.ndarray) -> float:
    """Entropy (bits) of softmax(logits) for a one-off row (loops keep an ``EntropyMeter``)."""
    return EntropyMeter(logits.shape[-1])(logits)


def max_entropy_bits(n_vocab: int) -> float:
    """log2 |V|: the entropy of a uniform distribution, used to normalise entropies to [0, 1]."""
    return math.log2(n_vocab)

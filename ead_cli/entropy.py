"""Shannon entropy of a next-token distribution, in bits, from raw logits."""

import math
from collections.abc import Callable

import numpy as np

_LN2 = math.log(2.0)
TOLERANCE_BITS = 1e-4  # the meter's float32 sums against float64 (tested); bounds are widened by it
HEAD_NATS = 20.0  # head_bounds sums the logits within this of the top exactly; the rest is bounded
HEAD_LIMIT = 8192  # more logits than this in the head: a bound would cost about what the exact pass does
FLOOR_SAMPLE = 4096  # entropy_floor_bits reads the row's first this many logits (16 KB of its 600 KB)


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
        self._head = np.empty(n_vocab, dtype=np.bool_)
        self._floor_first = False  # which bound settled a step last: a model's rows look alike

    def settle(
        self, logits: np.ndarray, top: float, settles: Callable[[float, float], bool], scale: float = 1.0
    ) -> float | None:
        """Without the exact pass, a value that the caller's decision treats as the entropy would be:
        the low end of bounds on the entropy (bits x ``scale``, widened by ``TOLERANCE_BITS`` so that
        the exact pass's own value lies inside) for which ``settles(low, high)``; None where neither
        bound (``head_bounds``, ``entropy_floor_bits``) settles it. The one that settled last goes first."""
        if not math.isfinite(top):  # NaN or +inf rows: only the exact pass knows their limits
            return None
        for floor in (self._floor_first, not self._floor_first):
            if floor:
                low, high = entropy_floor_bits(logits, top), math.log2(logits.shape[0])
            else:
                bounds = self.head_bounds(logits, top)
                if bounds is None:
                    continue
                low, high = bounds
            low, high = (low - TOLERANCE_BITS) * scale, (high + TOLERANCE_BITS) * scale
            if settles(low, high):
                self._floor_first = floor
                return low
        return None

    def head_bounds(self, logits: np.ndarray, top: float) -> tuple[float, float] | None:
        """(low, high) bounds in bits on the entropy, from the logits within ``HEAD_NATS`` of the top
        (``top``: the row's max), summed in float64, and the rest, of which each weighs at most e^-20 of
        the top: with t the rest's share of the probability (at most t_max, from their count) and H_A
        the head's own entropy, H = h(t) + (1 - t) H_A + t H_rest, 0 <= H_rest <= ln(rest). Tight for a
        real model's rows (its head: a median of ~3,300 logits for the 0.5B; the bounds ~0.01 bits
        apart); None where more than ``HEAD_LIMIT`` logits are that close, or the top is not finite."""
        top = float(top)
        if not math.isfinite(top):
            return None
        edge = np.float32(top - HEAD_NATS)  # rounded as the comparison rounds it: the rest is <= edge
        if float(edge) - top > -HEAD_NATS / 2:  # a top past ~1e8: float32 cannot tell 20 nats apart
            return None
        head = self._head
        np.greater(logits, edge, out=head)
        count = int(np.count_nonzero(head))
        if count > HEAD_LIMIT:
            return None
        z = logits[head].astype(np.float64) - top
        weights = np.exp(z)
        total = float(weights.sum())
        head_nats = max(math.log(total) - float(np.dot(weights, z)) / total, 0.0)
        rest = logits.shape[0] - count
        if rest == 0:
            return head_nats / _LN2, head_nats / _LN2
        rest_weight = rest * math.exp(float(edge) - top)
        t_max = rest_weight / (total + rest_weight)
        t = min(t_max, rest / (rest + math.exp(head_nats)))  # where h(t) + (1 - t) H_A + t ln(rest) peaks
        high = _binary_entropy_nats(t) + (1.0 - t) * head_nats + t * math.log(rest)
        return (1.0 - t_max) * head_nats / _LN2, high / _LN2

    def __call__(self, logits: np.ndarray, top: float | None = None) -> float:
        """The entropy; ``top``, where the caller has it (a greedy step's argmax), is ``logits.max()``."""
        return self.shifted_entropy() if self.shift(logits, top) else _entropy_in_float64(logits)

    def shift(self, logits: np.ndarray, top: float | None = None) -> bool:
        """The exact pass's first step, logits - top into the meter's scratch row: a copy, so the rest
        (``shifted_entropy``) may run after whatever overwrites ``logits`` (a GPU's next decode). False
        where the top is not finite (then only ``__call__``'s float64 path knows the entropy)."""
        if top is None:
            top = logits.max()
        if not math.isfinite(top):
            return False
        with np.errstate(over="ignore", invalid="ignore"):  # a shift past -3.4e38 is -inf
            np.subtract(logits, top, out=self._shifted)
        return True

    def shifted_entropy(self) -> float:
        """The entropy of the row ``shift`` copied last."""
        shifted, exp = self._shifted, self._exp
        with np.errstate(over="ignore", invalid="ignore"):  # 0 * -inf
            np.exp(shifted, out=exp)
            weighted = float(np.dot(exp, shifted))
        total = float(np.add.reduce(exp))
        if math.isfinite(weighted):
            return (math.log(total) - weighted / total) / _LN2
        return _entropy_in_float64(shifted)  # -inf logits: the shift moved every finite one alike


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


def _binary_entropy_nats(t: float) -> float:
    return 0.0 if t <= 0.0 or t >= 1.0 else -t * math.log(t) - (1.0 - t) * math.log1p(-t)


def entropy_floor_bits(logits: np.ndarray, top: float) -> float:
    """A lower bound (bits) on the entropy of softmax(logits), whose max is ``top``, from the row's first
    ``FLOOR_SAMPLE`` logits S alone: one pass over 16 KB where the row's minimum took one over 600 KB.

    The entropy is at least the min-entropy -log2 p_max = log2 sum_i e^(l_i - top); that sum is at least
    S's share of it, and by Jensen's inequality that is at least |S| e^(mean over S of l - top). Tight
    for rows whose logits lie within a few nats of each other (a random-weight twin's: ~2 bits under
    log2 |S|, so it settles any tau below ~10 bits there), 0 for a real model's (its mean lies 15-30 nats
    under the top). The mean is summed in float64; a -inf or NaN logit in S bounds nothing: 0.
    """
    sample = logits[:FLOOR_SAMPLE]
    mean = float(np.add.reduce(sample, dtype=np.float64)) / sample.shape[0]
    floor = math.log2(sample.shape[0]) - (float(top) - mean) / _LN2
    return floor if floor > 0.0 else 0.0  # NaN too


def entropy_bits(logits: np.ndarray) -> float:
    """Entropy (bits) of softmax(logits) for a one-off row (loops keep an ``EntropyMeter``)."""
    return EntropyMeter(logits.shape[-1])(logits)


def max_entropy_bits(n_vocab: int) -> float:
    """log2 |V|: the entropy of a uniform distribution, used to normalise entropies to [0, 1]."""
    return math.log2(n_vocab)

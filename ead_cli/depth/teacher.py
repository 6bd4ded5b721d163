"""Teacher forcing: one full-depth pass over a corpus captures every probe's readout, from which a
profile is built (``calibrate``) and operating points are replayed without generating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import EadError
from . import CALIBRATION_TOKENS
from .corpus import check_windows, corpus_windows, read_corpus
from .model import DepthModel, DepthOptions
from .probes import estimator_flops, extra_readout
from .profile import PROMPT_ROWS, Profile, build_profile, check_counts, probe_layers
from .readout import (
    Head,
    entropy_bits,
    file_digest,
    read_rows,
)


@dataclass
class Capture:
    """Teacher-forced readings of windows of text, one column per scored token (rows PROMPT_ROWS-1 on of
    each window: the window's first PROMPT_ROWS tokens are its prompt): per probe layer the exact
    entropy, each estimator's entropy and the log-probability (nats) of the true next token."""

    layers: tuple[int, ...]
    entropy: np.ndarray  # (probes, tokens)
    logprob: np.ndarray  # (probes, tokens)
    top1: np.ndarray  # (tokens,) top-1 probability at the first probe
    positions: np.ndarray  # (tokens,) answer position, from 1 in each window
    window: np.ndarray  # (tokens,) which window
    estimates: dict[str, np.ndarray] = field(default_factory=dict)  # estimator -> (probes, tokens)


def teacher_force(
    model: DepthModel,
    windows: Sequence[Sequence[int]],
    layers: Sequence[int],
    *,
    estimators: Sequence[str] = (),
    top_k: int = 64,
    rank: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> Capture:
    """One full-depth pass per window with every probe layer's output kept, read out in full (batched),
    and by the named estimators."""
    runner, tap = model.runner, model.tap
    head = Head(model.weights, model.runner.n_threads_batch)  # batched readouts: compute-bound, as batches
    lowrank = (
        model.estimator(DepthOptions(estimator="lowrank", rank=rank)) if "lowrank" in estimators else None
    )
    columns: dict[str, list] = {key: [] for key in ("entropy", "logprob", "top1", "positions", "window")}
    estimates: dict[str, list] = {name: [] for name in estimators}
    parts: dict[int, list[np.ndarray]] = {}  # per layer, a window's rows: one part per micro-batch

    def keep(layer: int, tensor: int) -> bool:
        parts.setdefault(layer, []).append(read_rows(tensor))
        return True

    tap.see = keep
    tap.want(layers)  # the last block too: every row's output is asked for, so it has them all
    try:
        for number, window in enumerate(windows):
            n = len(window)
            runner.truncate(0)
            parts.clear()
            runner.feed(list(window), 0, n, "prefill", rows=n)
            tap.check()
            hidden = {layer: np.concatenate(rows) for layer, rows in parts.items()}
            rows = slice(PROMPT_ROWS - 1, n - 1)
            targets = np.asarray(window[PROMPT_ROWS:n])
            ent, logp, est = [], [], {name: [] for name in estimators}
            first_logits = None
            for layer in layers:
                chunks = np.array_split(hidden[layer][rows], max(1, (n - PROMPT_ROWS) // 32))
                logits = np.concatenate([head.logits(chunk) for chunk in chunks])
                z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
                log_total = np.log(np.exp(z).sum(axis=1))
                ent.append(entropy_bits(logits))
                logp.append(z[np.arange(len(targets)), targets] - log_total)
                if first_logits is None:
                    first_logits = logits
                    columns["top1"].append(np.exp(-log_total))
                    candidates = np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]
                if "topk" in est:
                    est["topk"].append(
                        entropy_bits(np.take_along_axis(logits, candidates, axis=1))
                        if layer != layers[0]
                        else ent[-1]
                    )
                if "lowrank" in est:
                    normed = head.normed(hidden[layer][rows])
                    est["lowrank"].append(entropy_bits((lowrank.a @ (lowrank.b @ normed.T)).T))
            columns["entropy"].append(np.stack(ent))
            columns["logprob"].append(np.stack(logp))
            columns["positions"].append(np.arange(1, len(targets) + 1))
            columns["window"].append(np.full(len(targets), number))
            for name in estimators:
                estimates[name].append(np.stack(est[name]))
            if progress is not None:
                progress(number + 1, len(windows))
    finally:
        tap.see = None
    return Capture(
        layers=tuple(layers),
        entropy=np.concatenate(columns["entropy"], axis=1),
        logprob=np.concatenate(columns["logprob"], axis=1),
        top1=np.concatenate(columns["top1"]),
        positions=np.concatenate(columns["positions"]),
        window=np.concatenate(columns["window"]),
        estimates={name: np.concatenate(parts, axis=1) for name, parts in estimates.items()},
    )


def calibration_corpus(corpus: Sequence[str], *, probe_every: int, tokens: int) -> dict[str, list[str]]:
    """The texts of each corpus named, after the checks that need no model: made before one loads. Each
    corpus reads whole windows of its share of ``tokens`` (``check_windows``)."""
    check_counts((probe_every, "--probe-every"))
    names = [name for name in corpus if name]  # "code," or "": a blank would be read as the folder "."
    if not names:
        raise EadError("--corpus names no corpus: give code, prose or text files, comma-separated", 2)
    check_windows(tokens, len(names))
    return {name: read_corpus([name])[0] for name in names}


def calibrate(
    model: DepthModel,
    corpus: Mapping[str, Sequence[str]],
    *,
    probe_every: int = 4,
    tokens: int = CALIBRATION_TOKENS,
    progress: Callable[[int, int], None] | None = None,
) -> Profile:
    """The profile of a model from teacher forcing over each corpus's calibration half (every other text
    from the first; ``ead depth eval`` holds out the other half). ``corpus``: ``calibration_corpus``'s."""
    layers = probe_layers(model.n_layer, probe_every)
    share = tokens // max(len(corpus), 1)  # each corpus its share, read in whole windows
    windows = [
        w for texts in corpus.values() for w in corpus_windows(model.runner, texts, tokens=share, part=0)
    ]
    name = ",".join(corpus)
    capture = teacher_force(model, windows, layers, progress=progress)
    meta = {
        "model": model.path.name,
        "digest": file_digest(model.path),
        "n_layer": model.n_layer,
        "corpus": name,
        "tokens": int(capture.entropy.shape[1]),
    }
    return build_profile(capture.entropy, capture.positions, capture.top1, probes=layers, meta=meta)


# ------------------------------------------------------------------------------------ operating points


def replay(capture: Capture, options: DepthOptions, profile: Profile | None, model: DepthModel) -> dict:
    """Run an exit rule over teacher-forced readings (a simulation: exact for the monotone schedule, as
    the generation test checks): perplexity with each token scored at its exit layer, depths, FLOPs."""
    weights, block_flops, n_layer = model.weights, model.block_flops, model.n_layer
    layers = capture.layers
    index = {layer: i for i, layer in enumerate(layers)}
    decide = capture.estimates.get(options.estimator, capture.entropy)
    head_flops = 2.0 * weights.n_vocab * weights.n_embd
    depths = np.empty(capture.entropy.shape[1], dtype=int)
    logprob = np.empty(capture.entropy.shape[1])
    flops = 0.0
    backfill = 0
    limit = n_layer
    computed: list[int] = []
    for column in range(capture.entropy.shape[1]):
        position = int(capture.positions[column])
        if position == 1:
            limit = options.fixed_depth or n_layer
            computed = [n_layer] * PROMPT_ROWS
        if options.rule == "fixed":
            depth, read = options.fixed_depth, int(options.fixed_depth < n_layer)
        else:
            if options.rule == "confidence":
                tau = dict.fromkeys(layers, options.confidence)
            else:
                tau = profile.thresholds(
                    options.condition, options.margin, position, float(capture.top1[column])
                )
            depth, read = limit, 0
            for layer in layers:
                if layer > limit or layer == n_layer:
                    break
                read += 1
                if decide[index[layer], column] <= tau[layer]:
                    depth = layer
                    break
            if depth < n_layer and depth not in index:
                raise EadError(f"depth {depth} is not a probe layer")
        name = "full" if options.rule == "fixed" else options.estimator
        flops += (
            estimator_flops(name, read, weights, k=options.top_k, rank=options.rank) + depth * block_flops
        )
        if depth == n_layer or extra_readout(name, read):
            flops += head_flops
        if options.schedule == "free":
            backfill += sum(max(0, depth - done) for done in computed)
            computed = [max(done, depth) for done in computed] + [depth]
        else:
            limit = depth
        depths[column] = depth
        logprob[column] = capture.logprob[index[depth], column]
    full = len(depths) * (n_layer * block_flops + head_flops)
    flops += backfill * block_flops
    return {
        "rule": options.label,
        "tokens": len(depths),
        "perplexity": float(np.exp(-logprob.mean())),
        "mean_depth": float(depths.mean()),
        "mean_depth_frac": float(depths.mean() / n_layer),
        "p50": float(np.percentile(depths, 50)),
        "p90": float(np.percentile(depths, 90)),
        "flop_ratio": flops / full,
        "flop_reduction": 1.0 - flops / full,
        "backfill_blocks": backfill,
        "depths": depths.tolist(),
    }

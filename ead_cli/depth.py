"""``ead depth``: entropy-matched adaptive depth (EMAD), one model stopping each token's pass early.

After block l the hidden state, read out through the model's head (``readout.Head``), has entropy H_l.
A teacher-forcing **profile** gives the mean H_l per probe layer (made non-increasing by isotonic
regression); a token exits at the first probe layer l <= D_{t-1} where H_l <= profile_l - margin, and is
drawn from that layer's readout; otherwise D_t = D_{t-1}. Under the **monotone** schedule (D starts at L
each answer) no later token reads a block an earlier one skipped, so stopping llama.cpp's graph there is
a real early exit: the eval callback (``LayerTap``) sees each probe layer's output and returns false
when the rule fires; ggml's scheduler then stops the rest of the token's graph and ``llama_decode``
returns 0 with the cells of the blocks that ran. The same rule also runs as a **simulation** (full depth
every token, probes only observed): both must agree token for token. The **free** schedule (depth may
rise again) can only be simulated; the blocks earlier tokens skipped and a deeper token needs
(backfill) are counted.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter

import llama_cpp
import numpy as np

from .calibrate import config_file
from .errors import EadError
from .readout import (
    NAME_OFFSET,
    Head,
    HeadWeights,
    entropy_bits,
    file_digest,
    load_head,
    low_rank_factors,
    read_rows,
)
from .registry import ead_cache_dir
from .runner import Runner, default_threads
from .sampling import Sampler, SamplingParams
from .text import TextStream

SCHEDULES = ("monotone", "free")
CONDITIONS = ("none", "position", "confidence", "both")
ESTIMATORS = ("full", "topk", "lowrank")
POSITION_EDGES = (32, 128)  # answer positions [1-32], [33-128], 129+
CONFIDENCE_EDGES = (0.4, 0.7)  # top-1 probability at the first probe: [0-0.4], [0.4-0.7], [0.7-1]
WINDOW = 256  # tokens per teacher-forcing pass
PROMPT_ROWS = 32  # in teacher forcing, the first tokens of a window are its prompt (read at full depth)


def probe_layers(n_layer: int, every: int) -> tuple[int, ...]:
    """Every ``every`` blocks, and always the last (layers count blocks from 1)."""
    if not 1 <= every <= n_layer:
        raise EadError(
            f"--probe-every must be in [1, {n_layer}] for a model of {n_layer} blocks, got {every}", 2
        )
    return tuple(sorted({*range(every, n_layer + 1, every), n_layer}))


def isotonic_nonincreasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-increasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, max(weight, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean2, weight2, count2 = blocks.pop()
            mean1, weight1, count1 = blocks.pop()
            total = weight1 + weight2
            blocks.append([(mean1 * weight1 + mean2 * weight2) / total, total, count1 + count2])
    return [mean for mean, _, count in blocks for _ in range(count)]


def position_bucket(position: int) -> int:
    return sum(position > edge for edge in POSITION_EDGES)


def confidence_bucket(top1: float) -> int:
    return sum(top1 >= edge for edge in CONFIDENCE_EDGES)


def bucket(condition: str, position: int, top1: float) -> int:
    """The row of a conditioning table a token falls in (0 without conditioning)."""
    if condition == "position":
        return position_bucket(position)
    if condition == "confidence":
        return confidence_bucket(top1)
    if condition == "both":
        return 3 * position_bucket(position) + confidence_bucket(top1)
    return 0


# ---------------------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class Profile:
    """Mean entropy per probe layer from teacher forcing, smoothed non-increasing; per condition a table
    (bucket x probe) of the same, where a bucket had no tokens its row is the unconditioned profile."""

    model: str
    digest: str
    n_layer: int
    probes: tuple[int, ...]
    raw: tuple[float, ...]
    tables: dict[str, list[list[float]]]
    counts: dict[str, list[int]]
    corpus: str
    tokens: int

    @property
    def smooth(self) -> list[float]:
        return self.tables["none"][0]

    def thresholds(self, condition: str, margin: float, position: int, top1: float) -> dict[int, float]:
        row = self.tables[condition][bucket(condition, position, top1)]
        return {layer: value - margin for layer, value in zip(self.probes, row, strict=True)}

    def to_json(self) -> dict:
        return asdict(self) | {"smooth": self.smooth, "version": 1}

    @classmethod
    def from_json(cls, data: dict, where: str) -> Profile:
        try:
            profile = cls(
                model=str(data["model"]),
                digest=str(data["digest"]),
                n_layer=int(data["n_layer"]),
                probes=tuple(int(p) for p in data["probes"]),
                raw=tuple(float(v) for v in data["raw"]),
                tables={k: [[float(v) for v in row] for row in rows] for k, rows in data["tables"].items()},
                counts={k: [int(v) for v in rows] for k, rows in data["counts"].items()},
                corpus=str(data["corpus"]),
                tokens=int(data["tokens"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise EadError(
                f"the depth profile {where} is corrupt ({error!r}): run ead depth calibrate again"
            ) from None
        if set(profile.tables) != set(CONDITIONS) or any(
            len(row) != len(profile.probes) for rows in profile.tables.values() for row in rows
        ):
            raise EadError(
                f"the depth profile {where} is corrupt (bad tables): run ead depth calibrate again"
            )
        return profile


def build_profile(
    entropies: np.ndarray, positions: np.ndarray, top1: np.ndarray, *, probes: Sequence[int], meta: dict
) -> Profile:
    """A profile from teacher-forced entropies (probe x token), answer positions and first-probe top-1."""
    if entropies.shape[1] == 0:
        raise EadError("the corpus gave no tokens to calibrate on")
    raw = entropies.mean(axis=1)
    tables: dict[str, list[list[float]]] = {}
    counts: dict[str, list[int]] = {}
    overall = isotonic_nonincreasing(raw.tolist(), [1.0] * len(raw))
    for condition in CONDITIONS:
        size = {"none": 1, "position": 3, "confidence": 3, "both": 9}[condition]
        rows, sizes = [], []
        keys = np.array([bucket(condition, int(p), float(c)) for p, c in zip(positions, top1, strict=True)])
        for index in range(size):
            chosen = entropies[:, keys == index]
            sizes.append(int(chosen.shape[1]))
            rows.append(
                overall
                if chosen.shape[1] == 0
                else isotonic_nonincreasing(chosen.mean(axis=1).tolist(), [1.0] * len(raw))
            )
        tables[condition], counts[condition] = rows, sizes
    return Profile(
        probes=tuple(probes), raw=tuple(float(v) for v in raw), tables=tables, counts=counts, **meta
    )


def profile_dir() -> Path:
    """Next to ead's calibration file: $EAD_CONFIG's folder, else $XDG_CONFIG_HOME/ead-cli, + depth/."""
    return config_file().parent / "depth"


def profile_path(model: Path) -> Path:
    return profile_dir() / f"{model.name}.json"


def save_profile(profile: Profile, path: Path) -> Path:
    """Written whole to a temporary name, then renamed: never half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8"
    ) as out:
        json.dump(profile.to_json(), out, indent=1)
        out.write("\n")
    os.replace(out.name, path)
    return path


def load_profile(model: Path, path: Path | None = None) -> Profile:
    """The profile of this model file, or a one-line error (missing, corrupt, made for another file)."""
    path = path or profile_path(model)
    if not path.exists():
        raise EadError(
            f"no depth profile for {model.name} (looked for {path}): run ead depth calibrate {model.name}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EadError(f"cannot read the depth profile {path}: {error}") from None
    if not isinstance(data, dict):
        raise EadError(
            f"the depth profile {path} is corrupt (not a JSON object): run ead depth calibrate again"
        )
    profile = Profile.from_json(data, str(path))
    if profile.digest != file_digest(model):
        raise EadError(
            f"the depth profile {path} was made for another model file ({profile.model}): calibrate again"
        )
    return profile


# ---------------------------------------------------------------------------------------------- corpora


def builtin_corpus(name: str) -> list[str]:
    """Texts every Python install has offline: ``code`` (the standard library's .py sources, sorted) or
    ``prose`` (the language reference's topics in pydoc_data/topics.py)."""
    import sysconfig

    if name == "prose":
        from pydoc_data.topics import topics

        return [topics[key] for key in sorted(topics)]
    if name == "code":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return [path.read_text(encoding="utf-8", errors="replace") for path in sorted(stdlib.glob("*.py"))]
    raise EadError(f"unknown built-in corpus {name!r}: use 'code', 'prose' or file paths", 2)


def read_corpus(spec: Sequence[str]) -> tuple[list[str], str]:
    """Texts from built-in corpus names and files; a one-line error for a missing or empty one."""
    texts: list[str] = []
    for item in spec:
        if item in ("code", "prose"):
            texts += builtin_corpus(item)
            continue
        path = Path(item)
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            raise EadError(f"cannot read corpus file {item}: {error}", 2) from None
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise EadError(f"the corpus {','.join(spec)} is empty", 2)
    return texts, ",".join(spec)


def corpus_windows(
    runner: Runner, texts: Sequence[str], *, tokens: int, part: int, parts: int = 2
) -> list[list[int]]:
    """Windows of WINDOW tokens from every ``parts``-th text, starting at text ``part`` (so part 0 and
    part 1 are disjoint: calibration and held-out), until ``tokens`` tokens."""
    windows: list[list[int]] = []
    budget = tokens
    for text in texts[part::parts]:
        ids = runner.tokenize(text, add_special=False, parse_special=False)
        for start in range(0, len(ids) - WINDOW + 1, WINDOW):
            if budget <= 0:
                return windows
            windows.append(ids[start : start + WINDOW])
            budget -= WINDOW
        if budget <= 0:
            break
    if not windows:  # short texts: one window of whatever there is
        ids = [
            i
            for text in texts[part::parts]
            for i in runner.tokenize(text, add_special=False, parse_special=False)
        ]
        windows = [ids[:WINDOW]] if len(ids) > PROMPT_ROWS + 1 else []
    if not windows:
        raise EadError("the corpus is too short: it needs at least a few dozen tokens", 2)
    return windows


# ------------------------------------------------------------------------------------------ the probes


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


def _distribution_figures(logits: np.ndarray) -> tuple[float, float]:
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
        entropy, top1 = _distribution_figures(logits)
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
        entropy, top1 = _distribution_figures(logits)
        return Reading(entropy, top1, None)

    def flops(self, probes_read: int) -> float:
        return estimator_flops(self.name, probes_read, self.head.weights, k=self.k, rank=0)


class LowRank(Estimator):
    """logits ~ A (B x): rank r of the output matrix (A: n_vocab x r, B: r x n_embd), cached per model."""

    name = "lowrank"

    def __init__(self, head: Head, rank: int, cache: Path) -> None:
        super().__init__(head)
        self.rank = rank
        self.a, self.b = low_rank_factors(head, rank, cache)

    def read(self, hidden: np.ndarray) -> Reading:
        logits = self.a @ (self.b @ self.head.normed(hidden)[0])
        entropy, top1 = _distribution_figures(logits)
        return Reading(entropy, top1, None)

    def flops(self, probes_read: int) -> float:
        return estimator_flops(self.name, probes_read, self.head.weights, k=0, rank=self.rank)


# ------------------------------------------------------------------------------------------ generation


@dataclass(frozen=True)
class DepthOptions:
    """The exit rule and how it runs. Exactly one rule: EMAD (the profile and ``margin``), fixed
    truncation (``fixed_depth``, L is plain full depth) or a confidence exit (``confidence`` bits)."""

    margin: float = 0.0
    probe_every: int = 4
    schedule: str = "monotone"
    condition: str = "none"
    estimator: str = "full"
    fixed_depth: int | None = None
    confidence: float | None = None
    top_k: int = 64
    rank: int = 64
    simulate: bool = False

    def __post_init__(self) -> None:
        for value, choices, option in (
            (self.schedule, SCHEDULES, "--schedule"),
            (self.condition, CONDITIONS, "--condition"),
            (self.estimator, ESTIMATORS, "--estimator"),
        ):
            if value not in choices:
                raise EadError(f"{option} must be one of {', '.join(choices)}, got {value!r}", 2)
        if not self.margin >= 0:
            raise EadError(f"--margin must be at least 0 bits, got {self.margin}", 2)
        if self.fixed_depth is not None and self.confidence is not None:
            raise EadError("--fixed-depth and --confidence are two baselines: give one", 2)
        if self.confidence is not None and not self.confidence >= 0:
            raise EadError(f"--confidence must be at least 0 bits, got {self.confidence}", 2)
        if self.top_k < 1 or self.rank < 1:
            raise EadError("--top-k and --rank must be at least 1", 2)

    @property
    def rule(self) -> str:
        if self.fixed_depth is not None:
            return "fixed"
        return "confidence" if self.confidence is not None else "emad"

    @property
    def label(self) -> str:
        if self.fixed_depth is not None:
            return f"fixed k={self.fixed_depth}"
        if self.confidence is not None:
            return f"confidence h0={self.confidence:g}"
        extra = "".join(
            f" {name}={value}"
            for name, value, default in (
                ("condition", self.condition, "none"),
                ("schedule", self.schedule, "monotone"),
                ("estimator", self.estimator, "full"),
            )
            if value != default
        )
        return f"emad m={self.margin:g}{extra}"


@dataclass(frozen=True, slots=True)
class DepthEvent:
    """One generated token: the depth (blocks) it exited at and the entropies its probes saw."""

    index: int
    token: int
    text: str
    depth: int
    probes: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class DepthSummary:
    """What a generation did. FLOPs count the generated tokens' passes: blocks run (2 x body params / L
    each) plus every readout (probe estimators and the exit layer's full readout, or llama.cpp's head at
    full depth), against L blocks + one head per token; ``backfill_blocks`` only under the free schedule."""

    generated: int
    finish_reason: str
    rule: str
    n_layer: int
    probes: tuple[int, ...]
    depths: tuple[int, ...]
    mean_depth: float
    p50: float
    p90: float
    histogram: dict[str, int]
    flops: float
    full_flops: float
    backfill_blocks: int
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    probe_s: float
    wall_s: float

    @property
    def flop_ratio(self) -> float:
        return self.flops / self.full_flops if self.full_flops else 1.0

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.decode_s / max(self.generated - 1, 1)


class DepthModel:
    """One model loaded with the probe callback, its head, and its profile (EMAD only)."""

    def __init__(
        self,
        path: Path,
        *,
        n_threads: int | None = None,
        n_ctx: int | None = 4096,
        profile: Profile | None = None,
        repack: bool | None = None,
    ) -> None:
        self.path = Path(path)
        self.n_threads = n_threads or default_threads()
        self.weights = load_head(self.path)
        self.tap = LayerTap()
        self.runner = Runner(
            self.path,
            name="model",
            n_ctx=n_ctx,
            n_threads=self.n_threads,
            n_gpu_layers=0,
            eval_callback=self.tap.callback,
            repack=repack,
        )
        self.n_layer = self.weights.n_layer
        # A full readout of one row is memory-bound: one thread avoids the barrier waits of a busy machine.
        self.head = Head(self.weights, 1)
        self.profile = profile
        self.block_flops = 2.0 * self.runner.body_params / self.n_layer
        self.head_flops = 2.0 * self.weights.n_vocab * self.weights.n_embd
        self._estimators: dict[tuple, Estimator] = {}
        self.cache = ead_cache_dir() / "depth"  # low-rank factors, computed once per model file

    def close(self) -> None:
        self.runner.close()

    def estimator(self, options: DepthOptions) -> Estimator:
        key = (options.estimator, options.top_k, options.rank)
        if key not in self._estimators:
            if options.estimator == "topk":
                self._estimators[key] = TopK(self.head, options.top_k)
            elif options.estimator == "lowrank":
                cache = self.cache / f"{self.path.name}-{file_digest(self.path)}-r{options.rank}.npz"
                self._estimators[key] = LowRank(self.head, options.rank, cache)
            else:
                self._estimators[key] = Estimator(self.head)
        return self._estimators[key]

    def probes(self, options: DepthOptions) -> tuple[int, ...]:
        if options.fixed_depth is not None:
            if not 1 <= options.fixed_depth <= self.n_layer:
                raise EadError(f"--fixed-depth must be in [1, {self.n_layer}], got {options.fixed_depth}", 2)
            return (options.fixed_depth,)
        layers = probe_layers(self.n_layer, options.probe_every)
        if options.rule == "emad":
            if self.profile is None:
                raise EadError("EMAD needs a depth profile: run ead depth calibrate first")
            if not set(layers) <= set(self.profile.probes):
                raise EadError(
                    f"the profile covers layers {list(self.profile.probes)}, not {list(layers)}: "
                    f"calibrate with --probe-every {options.probe_every}",
                    2,
                )
        return layers

    def generate(
        self,
        prompt: Sequence[int],
        options: DepthOptions,
        sampling: SamplingParams,
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
    ) -> Iterator[DepthEvent | DepthSummary]:
        """Yield a DepthEvent per token, then the DepthSummary. Real early exit unless ``simulate`` or the
        free schedule (which only a simulation can run)."""
        return _Generation(self, options, sampling).run(prompt, max_tokens=max_tokens, stop=stop)


class _Generation:
    """One answer's state: the depth limit D_{t-1}, the current token's probes and its decision."""

    def __init__(self, model: DepthModel, options: DepthOptions, sampling: SamplingParams) -> None:
        self.model = model
        self.options = options
        self.sampling = sampling
        self.layers = model.probes(options)
        # Fixed truncation reads out in full at its one layer, whatever the estimator.
        self.estimator = model.estimator(options if options.rule != "fixed" else DepthOptions())
        self.n_layer = model.n_layer
        self.real = not options.simulate and options.schedule == "monotone"
        self.limit = options.fixed_depth or self.n_layer
        self.position = 1
        self._reset_token()

    def _reset_token(self) -> None:
        self.readings: list[tuple[int, float]] = []
        self.exit: int | None = None
        self.logits: np.ndarray | None = None
        self.thresholds: dict[int, float] | None = None
        self.stopping = False
        self.estimator.start_token()

    def _thresholds(self, top1: float) -> dict[int, float]:
        options = self.options
        if options.rule == "confidence":
            return dict.fromkeys(self.layers, options.confidence)
        if options.rule == "fixed":
            return dict.fromkeys(self.layers, -math.inf)
        return self.model.profile.thresholds(options.condition, options.margin, self.position, top1)

    def see(self, layer: int, tensor: int) -> bool:
        """A probe layer's output is ready: read it out, apply the exit rule; False stops the graph."""
        if self.exit is not None or layer > self.limit:
            return True
        hidden = read_rows(tensor)[-1:]
        reading = self.estimator.read(hidden)
        if self.thresholds is None:
            self.thresholds = self._thresholds(reading.top1)
        self.readings.append((layer, reading.entropy))
        if reading.entropy <= self.thresholds[layer] or layer == self.limit:
            self.exit = layer
            self.logits = reading.logits if reading.logits is not None else self.model.head.logits(hidden)[0]
            return not self.stopping
        return True

    def _wanted(self) -> list[int]:
        return [layer for layer in self.layers if layer <= self.limit and layer < self.n_layer]

    def run(
        self, prompt: Sequence[int], *, max_tokens: int, stop: Sequence[str]
    ) -> Iterator[DepthEvent | DepthSummary]:
        model, runner, tap = self.model, self.model.runner, self.model.tap
        began = perf_counter()
        runner.truncate(0)
        runner.stats = type(runner.stats).empty()
        tap.seconds = 0.0
        tap.see = self.see
        tokens = list(prompt)
        sampler = Sampler(self.sampling)
        text = TextStream(stop)
        depths: list[int] = []
        computed = [self.n_layer] * len(tokens)  # blocks run per position (backfill under the free schedule)
        backfill = 0
        flops = 0.0
        finish = "length"
        try:
            tap.want(self._wanted())
            self.stopping = False  # the prompt is read at full depth
            runner.feed(tokens, 0, len(tokens), "prefill")
            tap.check()
            for index in range(max_tokens):
                depth = self.exit or self.n_layer
                flops += self.estimator.flops(len(self.readings)) + depth * model.block_flops
                if self.logits is None:  # full depth: llama.cpp's own head computed this row
                    logits = runner.logits().copy()
                    self.readings.append((self.n_layer, _distribution_figures(logits)[0]))
                    flops += model.head_flops
                else:
                    logits = self.logits
                    if extra_readout(self.estimator.name, len(self.readings)):
                        flops += model.head_flops  # the exit layer's own full readout
                if self.options.schedule == "free":
                    backfill += sum(max(0, depth - done) for done in computed)
                    computed = [max(done, depth) for done in computed]
                    computed.append(depth)
                token = sampler.sample(None, logits)
                depths.append(depth)
                piece = text.push(runner.token_bytes(token))
                end = runner.is_end_of_generation(token) or text.stopped
                last = end or index + 1 >= max_tokens or len(tokens) + 1 >= runner.n_ctx
                if last:
                    piece += text.flush()
                yield DepthEvent(index, token, piece, depth, tuple(self.readings))
                if last:
                    finish = "stop" if end else "length"
                    break
                tokens.append(token)
                if self.options.schedule == "monotone":
                    self.limit = depth
                self.position += 1
                self._reset_token()
                self.stopping = self.real
                tap.want(self._wanted())
                runner.feed(tokens, len(tokens) - 1, len(tokens), "decode")
                tap.check()
        finally:
            tap.see = None
            sampler.close()
        full = len(depths) * (self.n_layer * model.block_flops + model.head_flops)
        yield summarize(
            depths,
            self.n_layer,
            self.layers,
            rule=self.options.label,
            finish=finish,
            flops=flops + backfill * model.block_flops,
            full_flops=full,
            backfill=backfill,
            prompt_tokens=len(prompt),
            prefill_s=runner.stats.prefill.seconds,
            decode_s=runner.stats.decode.seconds,
            probe_s=tap.seconds,
            wall_s=perf_counter() - began,
        )


def summarize(
    depths: Sequence[int],
    n_layer: int,
    layers: Sequence[int],
    *,
    rule: str,
    finish: str,
    flops: float,
    full_flops: float,
    backfill: int,
    prompt_tokens: int,
    prefill_s: float,
    decode_s: float,
    probe_s: float,
    wall_s: float,
) -> DepthSummary:
    values = np.array(depths or [n_layer], dtype=float)
    histogram = {str(layer): int(np.count_nonzero(values == layer)) for layer in sorted({*layers, n_layer})}
    return DepthSummary(
        generated=len(depths),
        finish_reason=finish,
        rule=rule,
        n_layer=n_layer,
        probes=tuple(layers),
        depths=tuple(depths),
        mean_depth=float(values.mean()),
        p50=float(np.percentile(values, 50)),
        p90=float(np.percentile(values, 90)),
        histogram=histogram,
        flops=flops,
        full_flops=full_flops,
        backfill_blocks=backfill,
        prompt_tokens=prompt_tokens,
        prefill_s=prefill_s,
        decode_s=decode_s,
        probe_s=probe_s,
        wall_s=wall_s,
    )


# ------------------------------------------------------------------------------------ teacher forcing


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
    head = Head(model.weights, model.n_threads)  # batched readouts are compute-bound: every thread
    lowrank = (
        model.estimator(DepthOptions(estimator="lowrank", rank=rank)) if "lowrank" in estimators else None
    )
    columns: dict[str, list] = {key: [] for key in ("entropy", "logprob", "top1", "positions", "window")}
    estimates: dict[str, list] = {name: [] for name in estimators}
    hidden: dict[int, np.ndarray] = {}

    def keep(layer: int, tensor: int) -> bool:
        hidden[layer] = read_rows(tensor)
        return True

    tap.see = keep
    tap.want(layers)  # the last block too: every row's output is asked for, so it has them all
    try:
        for number, window in enumerate(windows):
            n = len(window)
            runner.truncate(0)
            runner.feed(list(window), 0, n, "prefill", rows=n)
            tap.check()
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


CALIBRATION_TOKENS = 1024


def calibrate(
    model: DepthModel,
    corpus: Sequence[str],
    *,
    probe_every: int = 4,
    tokens: int = CALIBRATION_TOKENS,
    progress: Callable[[int, int], None] | None = None,
) -> Profile:
    """The profile of a model from teacher forcing over the corpus's calibration half (every other text
    from the first; ``ead depth eval`` holds out the other half)."""
    if tokens < WINDOW:
        raise EadError(f"--tokens must be at least {WINDOW}, got {tokens}", 2)
    layers = probe_layers(model.n_layer, probe_every)
    share = max(WINDOW, tokens // max(len(corpus), 1))  # each corpus its share, its own halves
    groups = [read_corpus([item])[0] for item in corpus]
    windows = [w for texts in groups for w in corpus_windows(model.runner, texts, tokens=share, part=0)]
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


def open_model(
    ref: str,
    *,
    catalog: Path | None = None,
    threads: int | None = None,
    n_ctx: int | None = 4096,
    profile: bool = False,
    progress: Callable[[str], None] | None = None,
    repack: bool | None = None,
) -> DepthModel:
    """A model reference as ead generate takes it (alias, path, ollama:…) loaded for ead depth; with
    ``profile`` its saved profile too (a one-line error where there is none)."""
    from . import registry
    from .hardware import repack_choice
    from .smoke import check_model

    path = registry.resolve(ref, registry.load_catalog(catalog), progress=progress)
    saved = load_profile(path) if profile else None
    check_model(path, repack=repack_choice(repack), n_gpu_layers=0, threads=threads)
    return DepthModel(path, n_threads=threads, n_ctx=n_ctx, profile=saved, repack=repack)


# ---------------------------------------------------------------------------------------------- eval

EVAL_MARGINS = (0.0, 0.5, 1.0, 2.0, 4.0, 6.0)
EVAL_CONFIDENCE = (0.5, 1.0, 2.0)
FLOP_FLOOR = 0.15  # the falsification rule: operating points with at least this FLOP reduction
PPL_RISE = 0.01  # ... where perplexity may rise by at most 1% relative
WALL_GAIN = 0.10  # not practically relevant if wall-clock improves by less than 10%


def operating_points(model: DepthModel, layers: Sequence[int]) -> list[DepthOptions]:
    """Full depth, EMAD at several margins (and its conditioned, estimated and free variants at 1 bit),
    fixed truncation at every probe layer, a confidence exit at a few thresholds."""
    every = layers[0] if len(layers) > 1 else model.n_layer
    emad = [DepthOptions(margin=m, probe_every=every) for m in EVAL_MARGINS]
    variants = [
        DepthOptions(margin=1.0, probe_every=every, condition=c) for c in ("position", "confidence", "both")
    ] + [DepthOptions(margin=1.0, probe_every=every, estimator=e) for e in ("topk", "lowrank")]
    free = [DepthOptions(margin=m, probe_every=every, schedule="free") for m in (0.0, 1.0)]
    fixed = [DepthOptions(fixed_depth=k) for k in layers]
    confident = [DepthOptions(confidence=h, probe_every=every) for h in EVAL_CONFIDENCE]
    return [*emad, *variants, *free, *fixed, *confident]


def estimator_report(model: DepthModel, capture: Capture, options: DepthOptions, profile: Profile) -> dict:
    """Per estimator (not full): mean absolute error of its entropy against the full one per probe
    layer, and the share of tokens whose exit depth it changes."""
    full = replay(capture, replace_options(options, estimator="full"), profile, model)["depths"]
    report = {}
    for name in ESTIMATORS[1:]:
        error = np.abs(capture.estimates[name] - capture.entropy).mean(axis=1)
        depths = replay(capture, replace_options(options, estimator=name), profile, model)["depths"]
        report[name] = {
            "mae_bits": {str(layer): float(e) for layer, e in zip(capture.layers, error, strict=True)},
            "decisions_changed": float(np.mean(np.asarray(depths) != np.asarray(full))),
        }
    return report


def estimator_costs(model: DepthModel, options: DepthOptions) -> dict[str, float]:
    """Milliseconds of one probe per estimator (median of 7; top-K's first probe is a full readout, so
    a later one is timed), the entropy computation included."""
    hidden = np.random.default_rng(0).standard_normal((1, model.weights.n_embd)).astype(np.float32) * 3
    costs = {}
    for name in ESTIMATORS:
        estimator = model.estimator(replace_options(options, estimator=name))
        times = []
        for _ in range(7):
            estimator.start_token()
            estimator.read(hidden)
            began = perf_counter()
            estimator.read(hidden)
            times.append(perf_counter() - began)
        costs[name] = 1000 * float(np.median(times))
    return costs


def replace_options(options: DepthOptions, **changes: object) -> DepthOptions:
    return DepthOptions(**{**asdict(options), **changes})


def held_out(
    model: DepthModel, corpus: str, layers: Sequence[int], tokens: int, *, part: int, **kw
) -> Capture:
    windows = corpus_windows(model.runner, read_corpus([corpus])[0], tokens=tokens, part=part)
    return teacher_force(model, windows, layers, **kw)


def _public(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "depths"}


def plain_greedy_ms(runner: Runner, prompt: Sequence[int], max_tokens: int) -> tuple[list[int], float]:
    """Full-depth greedy decoding on a runner without any callback: the wall-clock reference."""
    runner.truncate(0)
    runner.stats = type(runner.stats).empty()
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        token = int(np.argmax(runner.sync(tokens, prompt_len=len(prompt), own_tail=bool(out))))
        out.append(token)
        if runner.is_end_of_generation(token):
            break
        tokens.append(token)
    decode = runner.stats.decode
    return out, 1000 * decode.seconds / max(decode.tokens, 1)


def humaneval_points(
    model: DepthModel,
    plain: Runner,
    strategies: Sequence[DepthOptions],
    *,
    ids: str,
    max_tokens: int,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """HumanEval pass@1 (``ead bench``'s tasks, prompt and sandbox) and decode ms/token per strategy, the
    plain full-depth runner (no callback) first on each task: every figure from the same run."""
    from . import bench
    from .text import TextStream as Stream

    tasks = bench.select_tasks(bench.load_humaneval(), ids=ids, split="all", limit=None)
    rows: dict[str, dict] = {
        "full depth (no callback)": {"passed": [], "ms": [], "tokens": 0, "flop_ratio": []}
    }
    rows |= {
        s.label: {"passed": [], "ms": [], "tokens": 0, "flop_ratio": [], "depth": []} for s in strategies
    }
    for task in tasks:
        prompt = bench.humaneval_prompt(model.runner, task)
        out, ms = plain_greedy_ms(plain, prompt, max_tokens)
        text = _detok(model.runner, out, Stream([bench.STOP]))
        entry = rows["full depth (no callback)"]
        entry["passed"].append(bench.check_solution(task, bench.completion_code(task, text)).passed)
        entry["ms"].append(ms)
        entry["flop_ratio"].append(1.0)
        entry["tokens"] += len(out)
        for options in strategies:
            *events, summary = model.generate(
                prompt, options, SamplingParams(), max_tokens=max_tokens, stop=(bench.STOP,)
            )
            text = "".join(event.text for event in events)
            entry = rows[options.label]
            entry["passed"].append(bench.check_solution(task, bench.completion_code(task, text)).passed)
            entry["ms"].append(summary.ms_per_token)
            entry["flop_ratio"].append(summary.flop_ratio)
            entry["depth"].append(summary.mean_depth / model.n_layer)
            entry["tokens"] += summary.generated
        if progress is not None:
            progress(f"{task.task_id} done")
    return {
        label: {
            "tasks": [t.task_id for t in tasks],
            "pass_at_1": float(np.mean(entry["passed"])),
            "passed": entry["passed"],
            "ms_per_token": float(np.mean(entry["ms"])),
            "flop_ratio": float(np.mean(entry["flop_ratio"])),
            "tokens": entry["tokens"],
            **({"mean_depth_frac": float(np.mean(entry["depth"]))} if "depth" in entry else {}),
        }
        for label, entry in rows.items()
    }


def _detok(runner: Runner, tokens: Sequence[int], stream: TextStream) -> str:
    return "".join(stream.push(runner.token_bytes(t)) for t in tokens) + stream.flush()


def evaluate(
    model: DepthModel,
    *,
    tokens: int = 512,
    humaneval_ids: str = "1,3,5,7,9",
    max_tokens: int = 160,
    tune_ids: str | None = None,
    timing: bool = True,
    previous: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The falsification plan on one model: held-out perplexity (code and prose) at every operating point,
    calibration stability and the estimators' errors (the quality part, reused from ``previous`` when
    that was made with the same profile and token count); then, with ``timing``, the estimators' cost,
    the margin tuned on HumanEval ``tune_ids`` (if given), HumanEval pass@1 on ``humaneval_ids`` and
    decode ms/token, a stop after each probe layer; the verdict."""
    profile = model.profile
    layers = profile.probes
    say = progress or (lambda _message: None)
    points = operating_points(model, layers)
    result = {
        "model": model.path.name,
        "n_layer": model.n_layer,
        "probes": list(layers),
        "tokens_per_corpus": tokens,
        "profile": {"corpus": profile.corpus, "tokens": profile.tokens, "smooth": profile.smooth},
    }
    quality = ("profiles", "perplexity", "stability", "estimators")
    if (
        previous
        and all(previous.get(k) == v for k, v in result.items())
        and all(k in previous for k in quality)
    ):
        say("quality part: reused from the previous results")
        result |= {key: previous[key] for key in quality}
    else:
        result |= quality_part(model, points, tokens, say)
    if timing:
        options = DepthOptions(margin=1.0, probe_every=layers[0])
        say("estimators: cost per probe")
        for name, cost in estimator_costs(model, options).items():
            result["estimators"].setdefault(name, {})["probe_ms"] = cost
        chosen = _humaneval_strategies(result["perplexity"]["code"], points, model)
        plain = plain_runner(model)
        try:
            if tune_ids:
                margins = [DepthOptions(margin=m, probe_every=layers[0]) for m in EVAL_MARGINS]
                say(f"tuning the margin on HumanEval {tune_ids}")
                result["tuning"] = humaneval_points(
                    model, plain, margins, ids=tune_ids, max_tokens=max_tokens, progress=say
                )
                chosen[0] = tuned_margin(result["tuning"], margins)
            say(f"HumanEval {humaneval_ids}: " + ", ".join(o.label for o in chosen))
            result["humaneval"] = humaneval_points(
                model, plain, chosen, ids=humaneval_ids, max_tokens=max_tokens, progress=say
            )
            say("wall-clock of a stop at each probe layer (fixed truncation, one prompt)")
            result["stop_timing"] = stop_timing(model, plain, prompt_of(model), max_tokens=48)
        finally:
            plain.close()
    result["verdict"] = verdict(result)
    return result


def quality_part(
    model: DepthModel, points: list[DepthOptions], tokens: int, say: Callable[[str], None]
) -> dict:
    """Teacher-forced captures of held-out code and prose (and of each corpus's calibration half, for
    the stability check), every operating point replayed on them, the estimators' errors."""
    profile = model.profile
    layers = profile.probes
    say("teacher forcing: held-out code and prose, calibration halves of each")
    estimators = ESTIMATORS[1:]
    held = {c: held_out(model, c, layers, tokens, part=1, estimators=estimators) for c in ("code", "prose")}
    calib = {c: held_out(model, c, layers, tokens, part=0) for c in ("code", "prose")}
    own = {
        c: build_profile(
            calib[c].entropy, calib[c].positions, calib[c].top1, probes=layers, meta=_meta(profile)
        )
        for c in ("code", "prose")
    }
    perplexity: dict[str, list[dict]] = {}
    for corpus, capture in held.items():
        base = replay(capture, DepthOptions(fixed_depth=model.n_layer), None, model)["perplexity"]
        rows = []
        for options in points:
            row = _public(replay(capture, options, profile, model))
            row["ppl_rise"] = row["perplexity"] / base - 1.0
            rows.append(row)
        perplexity[corpus] = rows
    stability = []
    for source, target in (("code", "prose"), ("prose", "code")):
        base = replay(held[target], DepthOptions(fixed_depth=model.n_layer), None, model)["perplexity"]
        for margin in EVAL_MARGINS:
            options = DepthOptions(margin=margin, probe_every=layers[0])
            cross = replay(held[target], options, own[source], model)
            same = replay(held[target], options, own[target], model)
            stability.append(
                {
                    "profile_from": source,
                    "tested_on": target,
                    "margin": margin,
                    "ppl_rise_cross": cross["perplexity"] / base - 1,
                    "ppl_rise_same": same["perplexity"] / base - 1,
                    "flop_reduction_cross": cross["flop_reduction"],
                    "flop_reduction_same": same["flop_reduction"],
                }
            )
    return {
        "profiles": {"saved": profile.smooth, "code": own["code"].smooth, "prose": own["prose"].smooth},
        "perplexity": perplexity,
        "stability": stability,
        "estimators": estimator_report(
            model, held["code"], DepthOptions(margin=1.0, probe_every=layers[0]), profile
        ),
    }


def tuned_margin(tuning: dict, margins: list[DepthOptions]) -> DepthOptions:
    """The margin with the best pass@1 among those saving >= 15% FLOPs (ties: fewer FLOPs), else the
    best pass@1 of all."""
    rows = [(tuning[o.label], o) for o in margins]
    saving = [(row, o) for row, o in rows if 1 - row["flop_ratio"] >= FLOP_FLOOR] or rows
    return max(saving, key=lambda pair: (pair[0]["pass_at_1"], -pair[0]["flop_ratio"]))[1]


def _meta(profile: Profile) -> dict:
    return {
        "model": profile.model,
        "digest": profile.digest,
        "n_layer": profile.n_layer,
        "corpus": "-",
        "tokens": 0,
    }


def _humaneval_strategies(
    rows: list[dict], points: list[DepthOptions], model: DepthModel
) -> list[DepthOptions]:
    """EMAD at the margin with the least perplexity rise among those that save >= 15% FLOPs (else the
    largest margin), the fixed truncation one probe below full depth, the confidence exit at 1 bit."""
    emad = [
        (row, o) for row, o in zip(rows, points, strict=True) if o.rule == "emad" and o.label.count("=") == 1
    ]
    saving = [(row, o) for row, o in emad if row["flop_reduction"] >= FLOP_FLOOR]
    best = min(saving, key=lambda pair: pair[0]["ppl_rise"])[1] if saving else emad[-1][1]
    below = [o for o in points if o.rule == "fixed" and (o.fixed_depth or 0) < model.n_layer]
    confident = [o for o in points if o.rule == "confidence" and o.confidence == 1.0]
    return [best, *below[-1:], *confident, DepthOptions(fixed_depth=model.n_layer)]


def verdict(result: dict) -> str:
    """The seed's rule: falsified if any operating point with >= 15% FLOP reduction raises held-out
    perplexity by > 1% relative (code or prose) or loses pass@1 on two or more tasks full depth passed;
    not practically relevant if the best real wall-clock gain is under 10%."""
    name = result["model"]
    failing = [
        (corpus, row)
        for corpus, rows in result["perplexity"].items()
        for row in rows
        if row["flop_reduction"] >= FLOP_FLOOR and row["ppl_rise"] > PPL_RISE
    ]
    humaneval = result.get("humaneval", {})
    reference = humaneval.get("full depth (no callback)", {"passed": [], "ms_per_token": 0.0})
    lost = {
        label: sum(a and not b for a, b in zip(reference["passed"], row["passed"], strict=True))
        for label, row in humaneval.items()
    }
    failing_he = [
        label for label, row in humaneval.items() if lost[label] >= 2 and 1 - row["flop_ratio"] >= FLOP_FLOOR
    ]
    good = [
        row
        for rows in result["perplexity"].values()
        for row in rows
        if row["flop_reduction"] >= FLOP_FLOOR and row["ppl_rise"] <= PPL_RISE
    ]
    gains = [
        1 - row["ms_per_token"] / reference["ms_per_token"]
        for label, row in humaneval.items()
        if label != "full depth (no callback)"
    ]
    best_gain = max(gains) if gains else 0.0
    parts = []
    if failing or failing_he:
        corpus, row = max(failing, key=lambda pair: pair[1]["flop_reduction"]) if failing else (None, None)
        example = (
            f"{row['rule']} on {corpus}: {row['flop_reduction']:.0%} fewer FLOPs, perplexity "
            f"x{1 + row['ppl_rise']:.3g}"
            if row
            else f"{failing_he[0]} lost >= 2 HumanEval tasks"
        )
        parts.append(
            f"falsified ({len(failing) + len(failing_he)} operating points break the rule, e.g. {example}; "
            f"{len(good)} points save >= 15% within 1% perplexity)"
        )
    else:
        parts.append("not falsified")
    if not humaneval:
        parts.append("wall-clock and HumanEval not measured (--no-timing)")
    elif best_gain < WALL_GAIN:
        parts.append(f"not practically relevant (best real wall-clock gain {best_gain:+.1%})")
    else:
        parts.append(f"wall-clock gain up to {best_gain:+.1%}")
    return f"{name}: " + "; ".join(parts)


def plot(result: dict, path: Path) -> str | None:
    """Perplexity (relative to full depth) against FLOPs (relative), per held-out corpus, one point per
    operating point coloured by family; returns why there is no plot, or None."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed (pip install 'ead-cli[plot]'): no plot"
    figure = Figure(figsize=(12, 5), layout="constrained")
    axes = figure.subplots(1, len(result["perplexity"]), squeeze=False)[0]
    colours = {"emad": "tab:blue", "fixed": "tab:orange", "confidence": "tab:green", "free": "tab:red"}
    for ax, (corpus, rows) in zip(axes, result["perplexity"].items(), strict=True):
        for row in rows:
            family = "free" if "schedule=free" in row["rule"] else row["rule"].split()[0]
            x, y = row["flop_ratio"], 1 + row["ppl_rise"]
            ax.scatter(x, y, color=colours.get(family, "black"))
            ax.annotate(row["rule"], (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
        ax.axhline(1 + PPL_RISE, color="grey", linestyle="--", linewidth=0.8)
        ax.axvline(1 - FLOP_FLOOR, color="grey", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("FLOPs relative to full depth")
        ax.set_ylabel("perplexity relative to full depth")
        ax.set_title(f"{result['model']}: held-out {corpus}")
        ax.grid(alpha=0.3)
    figure.savefig(path, dpi=130)
    return None


def plain_runner(model: DepthModel) -> Runner:
    """The same model file with no callback: the full-depth wall-clock reference. Both runners read one
    prefill first, so neither is timed while its mapping of the weights pages in."""
    from .bench import warm_up

    plain = Runner(
        model.path,
        name="plain",
        n_ctx=model.runner.n_ctx,
        n_threads=model.n_threads,
        n_gpu_layers=0,
        repack=model.runner.repack.enabled,
    )
    warm_up([plain, model.runner], prompt_of(model))
    return plain


def prompt_of(model: DepthModel) -> list[int]:
    from .prompt import encode_prompt

    return encode_prompt(model.runner, "Write a Python function that merges two sorted lists.")


def stop_timing(model: DepthModel, plain: Runner, prompt: Sequence[int], *, max_tokens: int) -> list[dict]:
    """Decode ms/token when every token stops at probe layer k (the callback's readout at k included),
    and with no callback at all (``plain``: the same file, no callback), in one run: what the early
    exit itself saves."""
    _, reference = plain_greedy_ms(plain, prompt, max_tokens)
    rows = [{"stop": "full depth (no callback)", "ms_per_token": reference, "relative": 1.0}]
    for layer in model.profile.probes if model.profile else (model.n_layer,):
        *_, summary = model.generate(
            prompt, DepthOptions(fixed_depth=layer), SamplingParams(), max_tokens=max_tokens
        )
        rows.append(
            {
                "stop": f"l_out-{layer - 1} (block {layer})",
                "ms_per_token": summary.ms_per_token,
                "relative": summary.ms_per_token / reference,
                "callback_ms_per_token": 1000 * summary.probe_s / max(summary.generated, 1),
            }
        )
    return rows

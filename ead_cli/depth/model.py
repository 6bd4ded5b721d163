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

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import numpy as np

from ..errors import EadError
from ..options import (
    DEFAULT_CACHE_TYPE,
    batch_threads,
    check_batch,
    check_bits,
    check_context_settings,
    check_ctx,
    resolve_threads,
)
from ..paths import ead_cache_dir
from ..response import Response
from ..runner import Runner
from ..sampling import Sampler, SamplingParams
from ..text import TextStream
from .probes import Estimator, LayerTap, LowRank, TopK, distribution_figures, extra_readout
from .profile import (
    CONDITIONS,
    ESTIMATORS,
    SCHEDULES,
    Profile,
    calibrate_command,
    check_counts,
    load_profile,
    probe_layers,
)
from .readout import (
    Head,
    file_digest,
    load_head,
    read_rows,
)

DEFAULT_PROBE_EVERY = 4  # probes every 4 blocks: 6 on the 0.5B's 24 (the last block always one)


@dataclass(frozen=True)
class DepthOptions:
    """The exit rule and how it runs. Exactly one rule: EMAD (the profile and ``margin``), fixed
    truncation (``fixed_depth``, L is plain full depth) or a confidence exit (``confidence`` bits)."""

    margin: float = 0.0
    probe_every: int = DEFAULT_PROBE_EVERY
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
        check_bits(self.margin, "--margin")
        if self.fixed_depth is not None and self.confidence is not None:
            raise EadError("--fixed-depth and --confidence are two baselines: give one", 2)
        if self.confidence is not None:
            check_bits(self.confidence, "--confidence")
        counts = ((self.probe_every, "--probe-every"), (self.top_k, "--estimator-k"), (self.rank, "--rank"))
        if self.fixed_depth is not None:
            counts += ((self.fixed_depth, "--fixed-depth"),)
        check_counts(*counts)

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
        n_threads_batch: int | None = None,
        n_ctx: int | None = 4096,
        n_batch: int | None = None,
        n_ubatch: int | None = None,
        profile: Profile | None = None,
        repack: bool | None = None,
        reference: str | None = None,
        cache_types: tuple[str, str] = (DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE),
        flash_attn: str = "auto",
        load_mode: str = "auto",
    ) -> None:
        self.path = Path(path)
        self.reference = str(self.path) if reference is None else reference  # as typed, for advice
        self.weights = load_head(self.path)
        self.tap = LayerTap()
        self.runner = Runner(
            self.path,
            name="model",
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads_batch,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_gpu_layers=0,
            eval_callback=self.tap.callback,
            repack=repack,
            cache_types=cache_types,
            flash_attn=flash_attn,
            load_mode=load_mode,
        )
        self.n_threads = self.runner.n_threads
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
                raise EadError(f"EMAD needs a depth profile: run {calibrate_command(self.reference)} first")
            if not set(layers) <= set(self.profile.probes):
                raise EadError(
                    f"the profile covers layers {list(self.profile.probes)}, not {list(layers)}: "
                    f"run {calibrate_command(self.reference, options.probe_every)}",
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
    ) -> Response[DepthEvent, DepthSummary]:
        """The answer as a Response: a DepthEvent per token, then its DepthSummary. Real early exit unless
        ``simulate`` or the free schedule (which only a simulation can run)."""
        generation = _Generation(self, options, sampling)
        events = generation.run(prompt, max_tokens=max_tokens, stop=stop)
        return Response(events, generation.summary, lambda: generation.last_event)


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
        self.depths: list[int] = []  # the exit depth of each token generated
        self.last_event: DepthEvent | None = None  # the newest token counted
        self.flops = 0.0
        self.backfill = 0  # blocks run again for a deeper token (free schedule)
        self.finish = "interrupted"  # until the last token is out
        self.prompt_tokens = 0
        self.began = perf_counter()
        self.wall_s: float | None = None  # set when the loop ends
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

    def _prefill(self, tokens: Sequence[int]) -> None:
        """Read the prompt at full depth, probing only its last micro-batch: the first token's probes read
        the prompt's last row, which the earlier (micro-)batches of a longer prompt do not hold (each is a
        graph of its own, its probe layers seen by the callback first). llama.cpp keeps n_ubatch at most
        n_batch, so the probed part is one batch of one graph."""
        runner, tap = self.model.runner, self.model.tap
        last_part = (len(tokens) - 1) // runner.n_ubatch * runner.n_ubatch
        self.stopping = False
        tap.want(())
        runner.feed(tokens, 0, last_part, "prefill", rows=0)
        tap.want(self._wanted())
        runner.feed(tokens, last_part, len(tokens), "prefill")
        tap.check()

    def run(self, prompt: Sequence[int], *, max_tokens: int, stop: Sequence[str]) -> Iterator[DepthEvent]:
        model, runner, tap = self.model, self.model.runner, self.model.tap
        self.began = perf_counter()
        self.prompt_tokens = len(prompt)
        runner.truncate(0)
        runner.stats = type(runner.stats).empty()
        tap.seconds = 0.0
        tap.see = self.see
        tokens = list(prompt)
        sampler = Sampler(self.sampling)
        text = TextStream(stop)
        depths = self.depths
        computed = [self.n_layer] * len(tokens)  # blocks run per position (backfill under the free schedule)
        try:
            self._prefill(tokens)
            for index in range(max_tokens):
                depth = self.exit or self.n_layer
                self.flops += self.estimator.flops(len(self.readings)) + depth * model.block_flops
                if self.logits is None:  # full depth: llama.cpp's own head computed this row
                    logits = runner.logits().copy()
                    self.readings.append((self.n_layer, distribution_figures(logits)[0]))
                    self.flops += model.head_flops
                else:
                    logits = self.logits
                    if extra_readout(self.estimator.name, len(self.readings)):
                        self.flops += model.head_flops  # the exit layer's own full readout
                if self.options.schedule == "free":
                    self.backfill += sum(max(0, depth - done) for done in computed)
                    computed = [max(done, depth) for done in computed]
                    computed.append(depth)
                token = sampler.sample(None, logits)
                piece = text.push(runner.token_bytes(token))
                end = runner.is_end_of_generation(token) or text.stopped
                last = end or index + 1 >= max_tokens or len(tokens) + 1 >= runner.n_ctx
                if last:
                    piece += text.flush()
                event = DepthEvent(index, token, piece, depth, tuple(self.readings))
                # counted with last_event and no call between (where Python would raise a Ctrl-C): the
                # summary never counts a token the caller cannot show
                depths += (depth,)
                self.last_event = event
                yield event
                if last:
                    self.finish = "stop" if end else "length"
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
            self.wall_s = perf_counter() - self.began

    def summary(self) -> DepthSummary:
        """The answer's figures: once the last event is out, or after an interrupt (then up to it)."""
        model, runner = self.model, self.model.runner
        full = len(self.depths) * (self.n_layer * model.block_flops + model.head_flops)
        return summarize(
            self.depths,
            self.n_layer,
            self.layers,
            rule=self.options.label,
            finish=self.finish,
            flops=self.flops + self.backfill * model.block_flops,
            full_flops=full,
            backfill=self.backfill,
            prompt_tokens=self.prompt_tokens,
            prefill_s=runner.stats.prefill.seconds,
            decode_s=runner.stats.decode.seconds,
            probe_s=model.tap.seconds,
            wall_s=self.wall_s if self.wall_s is not None else perf_counter() - self.began,
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


def open_model(
    ref: str,
    *,
    catalog: Path | None = None,
    threads: int | None = None,
    threads_batch: int | None = None,
    n_ctx: int | None = 4096,
    n_batch: int | None = None,
    n_ubatch: int | None = None,
    profile: bool = False,
    probe_every: int | None = None,
    progress: Callable[[str], None] | None = None,
    repack: bool | None = None,
    cache_type_k: str = DEFAULT_CACHE_TYPE,
    cache_type_v: str = DEFAULT_CACHE_TYPE,
    flash_attn: str = "auto",
    load_mode: str = "auto",
) -> DepthModel:
    """A model reference as ead generate takes it (alias, path, ollama:…) loaded for ead depth, with
    llama-cli's KV cache types, flash attention and load mode as ead generate takes them; with
    ``profile`` its saved profile too (a one-line error where there is none, advising the command that
    makes it, with the ``probe_every`` given)."""
    from .. import registry
    from ..hardware import repack_choice
    from ..smoke import check_model

    # refused before a model is looked up, as in ead generate
    batch_threads(threads_batch, resolve_threads(threads))
    check_ctx(n_ctx)
    check_batch(n_batch, "--batch-size")
    check_batch(n_ubatch, "--ubatch-size")
    cache_flags = {"--cache-type-k": cache_type_k, "--cache-type-v": cache_type_v}
    flash_attn = check_context_settings(cache_flags, flash_attn, load_mode)
    path = registry.resolve(ref, registry.load_catalog(catalog), progress=progress)
    saved = load_profile(path, reference=ref, probe_every=probe_every) if profile else None
    check_model(path, repack=repack_choice(repack), n_gpu_layers=0, threads=threads)
    return DepthModel(
        path,
        n_threads=threads,
        n_threads_batch=threads_batch,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        profile=saved,
        repack=repack,
        reference=ref,
        cache_types=(cache_type_k, cache_type_v),
        flash_attn=flash_attn,
        load_mode=load_mode,
    )

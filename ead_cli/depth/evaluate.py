"""``ead depth eval``: operating points, held-out perplexity, HumanEval pass@1 and wall-clock per
strategy, and the verdict and plot that the results pages show.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from time import perf_counter

import numpy as np

from ..errors import EadError, counted, shown_path
from ..figures import is_figure
from ..paths import same_file, save_text
from ..runner import Runner, warm_up
from ..sampling import SamplingParams
from ..text import TextStream
from .corpus import corpus_windows, read_corpus
from .model import DepthModel, DepthOptions
from .profile import ESTIMATORS, Profile, build_profile, profile_file
from .teacher import Capture, replay, teacher_force

EVAL_MARGINS = (0.0, 0.5, 1.0, 2.0, 4.0, 6.0)
EVAL_CONFIDENCE = (0.5, 1.0, 2.0)
FLOP_FLOOR = 0.15  # the falsification rule: operating points with at least this FLOP reduction
PPL_RISE = 0.01  # ... where perplexity may rise by at most 1% relative
WALL_GAIN = 0.10  # not practically relevant if wall-clock improves by less than 10%


def check_out(out: Path, model: Path) -> None:
    """--out naming the model's depth profile (through a link) had been read as previous figures and
    replaced with the evaluation, the profile lost: refused, as bench speed refuses a --json it reads."""
    if same_file(out, profile_file(model)):
        raise EadError(
            f"--out {shown_path(out)} is the depth profile ead depth eval reads: write the figures to "
            "another file",
            2,
        )


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
        if runner.is_end_of_generation(token) or len(tokens) + 1 >= runner.n_ctx:  # where DepthModel stops
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
    from ..bench import sandbox
    from ..bench import tasks as bench_tasks
    from ..text import TextStream as Stream

    tasks = bench_tasks.select_tasks(bench_tasks.load_humaneval(), ids=ids, split="all", limit=None)
    rows: dict[str, dict] = {
        "full depth (no callback)": {"passed": [], "ms": [], "tokens": 0, "flop_ratio": []}
    }
    rows |= {
        s.label: {"passed": [], "ms": [], "tokens": 0, "flop_ratio": [], "depth": []} for s in strategies
    }
    for task in tasks:
        prompt = bench_tasks.humaneval_prompt(model.runner, task)
        out, ms = plain_greedy_ms(plain, prompt, max_tokens)
        text = _detok(model.runner, out, Stream([bench_tasks.STOP]))
        entry = rows["full depth (no callback)"]
        entry["passed"].append(sandbox.check_solution(task, bench_tasks.completion_code(task, text)).passed)
        entry["ms"].append(ms)
        entry["flop_ratio"].append(1.0)
        entry["tokens"] += len(out)
        for options in strategies:
            response = model.generate(
                prompt, options, SamplingParams(), max_tokens=max_tokens, stop=(bench_tasks.STOP,)
            )
            text, summary = response.text(), response.summary()
            entry = rows[options.label]
            code = bench_tasks.completion_code(task, text)
            entry["passed"].append(sandbox.check_solution(task, code).passed)
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
        and _reusable(previous, points)
    ):
        say("quality part: reused from the previous results")
        result |= {key: previous[key] for key in quality}
    else:
        result |= quality_part(model, points, tokens, say)
    if timing:
        from ..bench.sandbox import sandbox_note

        if (note := sandbox_note()) is not None:  # once, before HumanEval: its programs run as root
            say(note)
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


ROW_FIGURES = ("perplexity", "ppl_rise", "flop_ratio", "flop_reduction", "mean_depth_frac")
STABILITY_FIGURES = (
    "margin",
    "ppl_rise_cross",
    "ppl_rise_same",
    "flop_reduction_cross",
    "flop_reduction_same",
)


def _reusable(previous: dict, points: list[DepthOptions]) -> bool:
    """Whether ``previous``'s quality part is what ``quality_part`` writes for these operating points:
    one edited, damaged or made for other points (an older ead) is measured again, not read into a
    traceback by the verdict, the tables, the plot or the HumanEval choice (zipped with the points), nor
    carried into the new file as it was (the stability rows and profiles, which nothing else reads)."""
    labels = [options.label for options in points]
    perplexity, estimators = previous["perplexity"], previous["estimators"]
    if not isinstance(perplexity, dict) or set(perplexity) != {"code", "prose"}:
        return False
    for rows in perplexity.values():
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            return False
        if [row.get("rule") for row in rows] != labels or not all(
            is_figure(row.get(key)) for row in rows for key in ROW_FIGURES
        ):
            return False
    stability, profiles = previous["stability"], previous["profiles"]
    if (
        not isinstance(stability, list)
        or len(stability) != 2 * len(EVAL_MARGINS)
        or not all(
            isinstance(row, dict) and all(is_figure(row.get(key)) for key in STABILITY_FIGURES)
            for row in stability
        )
    ):
        return False
    if not isinstance(profiles, dict) or set(profiles) != {"saved", "code", "prose"}:
        return False
    if not all(
        isinstance(values, list) and len(values) == len(previous["probes"]) and all(map(is_figure, values))
        for values in profiles.values()
    ):
        return False
    return isinstance(estimators, dict) and all(isinstance(entry, dict) for entry in estimators.values())


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
        broken = len(failing) + len(failing_he)
        parts.append(
            f"falsified ({counted(broken, 'operating point')} {'breaks' if broken == 1 else 'break'} the "
            f"rule, e.g. {example}; {counted(len(good), 'point')} {'saves' if len(good) == 1 else 'save'} "
            ">= 15% within 1% perplexity)"
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
    image = io.BytesIO()  # rendered first, then written whole: a Ctrl-C midway had left half a PNG
    figure.savefig(image, format="png", dpi=130)
    save_text(path, image.getvalue(), "the plot")
    return None


def plain_runner(model: DepthModel) -> Runner:
    """The same model file, threads, batches and KV cache with no callback: the full-depth wall-clock
    reference. Both runners read one prefill first, so neither is timed while its mapping of the weights
    pages in."""
    plain = Runner(
        model.path,
        name="plain",
        n_ctx=model.runner.n_ctx,
        n_threads=model.n_threads,
        n_threads_batch=model.runner.n_threads_batch,
        n_batch=model.runner.n_batch,
        n_ubatch=model.runner.n_ubatch,
        n_gpu_layers=0,
        repack=model.runner.repack.enabled,
        cache_types=model.runner.cache_types,
        flash_attn=model.runner.flash_attn,
    )
    warm_up([plain, model.runner], prompt_of(model))
    return plain


def prompt_of(model: DepthModel) -> list[int]:
    from ..prompt import encode_prompt

    return encode_prompt(model.runner, "Write a Python function that merges two sorted lists.")


def stop_timing(model: DepthModel, plain: Runner, prompt: Sequence[int], *, max_tokens: int) -> list[dict]:
    """Decode ms/token when every token stops at probe layer k (the callback's readout at k included),
    and with no callback at all (``plain``: the same file, no callback), in one run: what the early
    exit itself saves."""
    _, reference = plain_greedy_ms(plain, prompt, max_tokens)
    rows = [{"stop": "full depth (no callback)", "ms_per_token": reference, "relative": 1.0}]
    for layer in model.profile.probes if model.profile else (model.n_layer,):
        fixed = DepthOptions(fixed_depth=layer)
        response = model.generate(prompt, fixed, SamplingParams(), max_tokens=max_tokens)
        response.text()
        summary = response.summary()
        rows.append(
            {
                "stop": f"l_out-{layer - 1} (block {layer})",
                "ms_per_token": summary.ms_per_token,
                "relative": summary.ms_per_token / reference,
                "callback_ms_per_token": 1000 * summary.probe_s / max(summary.generated, 1),
            }
        )
    return rows

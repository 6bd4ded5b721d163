"""Every decoding option, declared once: its spelling, Python type, default, bounds, help, the surfaces it
appears on, and whether giving it asks for the pair. Pure Python (no typer, no pydantic): the command
line's decoding group (``cli/groups.py``), serve's ``ead`` request object (``serve/schemas.py``), the
bench's swept lists (``cli/bench.py``), chat's slash commands (``cli/repl.py``) and docs/switching.md's
table (a test) are made from ``DECODING``. A new option is one entry here and its use in the policy or
decoder.

The mode when none is given is ``resolve_mode``'s, the one place it is decided: a switching option given
(on the command line, in a request's ``ead`` object, by a chat command) or a cascade asks for ``ead``;
otherwise ``DEFAULT_MODE``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EadError, quoted
from .policies import (
    BURST_KINDS,
    MAX_WINDOW,
    MODES,
    POLICY_KINDS,
    SWITCH_POINTS,
    defaults_by_policy,
    parse_tau,
)
from .text import process_escapes
from .thinking import REASONING_FORMATS

# The mode of a run that names none and gives no switching option (docs/switching.md, "The default mode").
DEFAULT_MODE = "large"
# Prompt lookup's minimum match and guess length for generate, chat and serve: tuned on the 1.5B's greedy
# answers to HumanEval's 82 even ids, priced with this CPU's batch rates at one and two threads
# (scripts/lookup_sim.py; docs/switching.md, "Prompt lookup"); 31, so that the read token and a whole
# guess fill 32 rows, a cheap batch on CPUs whose kernels work in tiles of 16 ("Guesses that fill a batch").
DEFAULT_LOOKUP = 12
DEFAULT_LOOKUP_DRAFT = 31

# How help shows a value of a type, in the words of llama.cpp's own help: never a Python type's name
PLACEHOLDERS: dict[type, str] = {int: "N", float: "X", Path: "PATH"}

CLI = "cli"  # ead generate, chat and serve's command line
SERVE = "serve"  # a field of a request's ``ead`` object
BENCH = "bench"  # ead bench sweeps it: a comma-separated list
CHAT = "chat"  # a slash command of ead chat


def placeholder(kind: type, choices: Iterable[str] = ()) -> str:
    """A value in help: its choices (``gate|ead|lookahead``), else its type's word (N, X, PATH, TEXT)."""
    return "|".join(choices) or PLACEHOLDERS.get(kind, "TEXT")


def listed(word: str) -> str:
    """A comma-separated list of ``word`` in help: ``N,N,...``; ``VALUE,VALUE,...`` where ``word`` is
    alternatives (``before|after``), which the option's help names."""
    item = "VALUE" if "|" in word else word
    return f"{item},{item},..."


@dataclass(frozen=True)
class DecodingOption:
    """One option. ``name``: the parameter (``--min-run`` is ``min_run``); ``target``: where its value
    goes (``policy``: a PolicyOptions field, ``sampling``: SamplingParams, ``generation``:
    GenerationOptions), under ``field`` if not its name; ``default``: the value when not given (None: the
    policy's own, or off); ``minimum``/``maximum``: bounds every surface holds it to (a request's
    integers also to serve's MAX_COUNT); ``switching``: giving it asks for the pair (``resolve_mode``);
    ``parse``: its value from text (the command line's strings, chat, the bench's lists), raising
    ValueError, said as ``what``; ``older``: spellings that still parse; ``llama_spellings``: llama.cpp's
    spellings of the same option (common/arg.cpp: ``-n``, ``--n-predict``), which its users type from
    habit, on the command line only; ``clear``: a repeatable option's value that drops those given
    before it (llama-cli's ``none``); ``whole``: its text parsed with its blanks (a DRY breaker may be
    one), not stripped; ``ollama_parameter``: ollama's name of the same parameter (a
    Modelfile's PARAMETER), so chat takes ``/set parameter NAME VALUE`` as its command; ``metavar``: its
    value in help where its type's word (``placeholder``) says too little; ``sweep``: the bench's help for
    its list, ``bench_default`` the list when not given if not ``default``."""

    name: str
    kind: type
    default: Any
    help: str
    short: str = ""  # chat's /help line (default: help)
    target: str = "policy"
    field: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    surfaces: frozenset[str] = frozenset({CLI})
    switching: bool = False
    parse: Callable[[str], Any] | None = None
    what: str = ""
    older: tuple[str, ...] = ()
    llama_spellings: tuple[str, ...] = ()
    ollama_parameter: str = ""
    repeatable: bool = False
    clear: str = ""
    whole: bool = False
    metavar: str | None = None
    sweep: str = ""
    bench_default: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def command(self) -> str:
        """Its chat command: ``/min-run``."""
        return "/" + self.name.replace("_", "-")

    @property
    def attribute(self) -> str:
        return self.field or self.name

    @property
    def placeholder(self) -> str:
        """Its value in help: its metavar, else its choices or its type's word."""
        return self.metavar or placeholder(self.kind, self.choices)

    @property
    def shown_default(self) -> str | None:
        """The default as help and docs say it; None where there is none to say, or where its help says
        it in words (a repeatable option's list: DRY's breakers)."""
        if self.default is None or self.kind is bool or isinstance(self.default, tuple):
            return None
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    @property
    def bench_list(self) -> str | None:
        """The bench's list when the option is not given."""
        return self.bench_default if self.bench_default is not None else self.shown_default

    def read(self, text: str, where: str | None = None) -> Any:
        """The value of ``text`` (``where``: the spelling it came by, ``--tau`` or ``/tau``), or a
        one-line usage error that names it."""
        where = where or self.flag
        try:
            return self._parse(text if self.whole else text.strip())
        except ValueError:
            verb = "takes" if where.startswith("/") else "must be"
            message = f"{where} {verb} {self.what or self._what()}, got {quoted(text)}"
            raise EadError(message, exit_code=2) from None

    def _parse(self, text: str) -> Any:
        if self.parse is not None:
            return self.parse(text)
        if self.choices:
            if text not in self.choices:
                raise ValueError(text)
            return text
        if self.kind is bool:
            if text.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("on", "true", "1")
        value = self.kind(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(text)
        return value

    def _what(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is bool:
            return "on or off"
        return {int: "a whole number", float: "a finite number"}.get(self.kind, "a value")


def parse_burst(text: str) -> int | str:
    return text if text in BURST_KINDS else int(text)


def parse_tau_range(text: str) -> tuple[float, float]:
    low, high = (float(part) for part in text.split(":"))
    return low, high


LOGIT_BIAS = re.compile(r"(\d+)([+-])(.+)")


def parse_logit_bias(text: str) -> tuple[int, float]:
    """llama-cli's -l: ``TOKEN_ID+BIAS`` or ``TOKEN_ID-BIAS``."""
    found = LOGIT_BIAS.fullmatch(text)
    if found is None:
        raise ValueError(text)
    bias = float(found.group(3))
    if math.isnan(bias):  # an infinite one is out of bounds, said as such (llama.cpp's docs ban with -inf)
        raise ValueError(text)
    return int(found.group(1)), -bias if found.group(2) == "-" else bias


def parse_fallback(text: str) -> bool:
    if text != "small":
        raise ValueError(text)
    return True


DECODING: tuple[DecodingOption, ...] = (
    DecodingOption(
        "mode",
        str,
        None,
        "ead switches by entropy; small/large use one alone; spec is speculative decoding (default: "
        f"{DEFAULT_MODE}; ead whenever a switching option is given).",
        short="ead, small, large or spec",
        choices=MODES,
        surfaces=frozenset({CLI, SERVE, CHAT}),
    ),
    DecodingOption(
        "policy",
        str,
        "gate",
        "; ".join(f"{kind.name}: {kind.summary}" for kind in POLICY_KINDS.values()) + ".",
        short="the switching policy: " + ", ".join(POLICY_KINDS),
        choices=tuple(POLICY_KINDS),
        surfaces=frozenset({CLI, SERVE, CHAT}),
        switching=True,
    ),
    DecodingOption(
        "tau",
        str,
        None,
        f"Entropy threshold in bits (default: {defaults_by_policy('tau')}); a cascade takes one per level "
        "below the top, comma-separated (or one for all).",
        short="entropy threshold (bits; a fraction of log2|V| with --normalize)",
        surfaces=frozenset({CLI, SERVE, CHAT}),  # the bench's thresholds are per policy: --NAME-tau
        switching=True,
        parse=parse_tau,
        what="a finite number of bits, or one per cascade level",
        metavar="X",
    ),
    DecodingOption(
        "window",
        int,
        None,
        f"Steps in the rolling entropy mean (default: {defaults_by_policy('window')}).",
        short="steps in the rolling entropy mean",
        minimum=1,
        maximum=MAX_WINDOW,
        surfaces=frozenset({CLI, SERVE, CHAT, BENCH}),
        switching=True,
        sweep="ead windows, comma-separated (default: 5).",
    ),
    DecodingOption(
        "min_run",
        int,
        10,
        "ead: steps a model keeps the pen after a switch (d_min).",
        short="ead: steps a model keeps the pen after a switch",
        minimum=0,
        surfaces=frozenset({CLI, SERVE, CHAT, BENCH}),
        switching=True,
        sweep="ead minimum runs, comma-separated.",
    ),
    DecodingOption(
        "burst",
        str,
        1,
        "gate: tokens the large model writes per trigger; 'line': to the end of the line; 'adaptive': "
        "while its own entropy stays at or above tau.",
        surfaces=frozenset({CLI, SERVE, BENCH}),
        switching=True,
        parse=parse_burst,
        what="a count, 'line' or 'adaptive'",
        metavar="N|line|adaptive",
        sweep="gate: bursts, comma-separated: counts, 'line', 'adaptive'.",
    ),
    DecodingOption(
        "switch_point",
        str,
        "before",
        "before: the new model writes the token that triggered the switch.",
        choices=SWITCH_POINTS,
        surfaces=frozenset({CLI, SERVE, BENCH}),
        switching=True,
        sweep="ead and gate switch points: before, after or both.",
    ),
    DecodingOption(
        "normalize",
        bool,
        False,
        "Entropy as a fraction of log2|V| (tau in [0, 1]).",
        surfaces=frozenset({CLI, SERVE}),
        switching=True,
    ),
    DecodingOption(
        "draft",
        int,
        4,
        "spec: tokens the small model drafts per round; lookahead: the span it drafts.",
        minimum=1,
        surfaces=frozenset({CLI, SERVE, BENCH}),
        sweep="spec and lookahead: draft lengths, comma-separated.",
    ),
    DecodingOption(
        "draft_entropy_stop",
        float,
        None,
        "spec: end a draft early at this small-model entropy (bits).",
        minimum=0,
        surfaces=frozenset({CLI, SERVE, BENCH}),
        older=("--draft-stop",),
        sweep="spec: draft entropy stops in bits, comma-separated (default: none); the name ead generate "
        "uses (--draft-stop is the older spelling).",
    ),
    DecodingOption(
        "lookup",
        int,
        DEFAULT_LOOKUP,
        "Prompt lookup: where the last N tokens occurred before, read the tokens that followed them as a "
        "guess in the same batch (free steps while the text follows it; spec: a free draft). 0: off; on "
        "by default, as it keeps the text up to batched rounding (sampled spec: its distribution, not its "
        "draws) and saves time in every mode.",
        short="prompt lookup's match length (0: off)",
        minimum=0,
        maximum=64,
        surfaces=frozenset({CLI, SERVE, CHAT, BENCH}),
        sweep="Prompt-lookup match lengths, comma-separated (0: off).",
        bench_default="0",  # the bench's strategy names stay comparable with earlier runs
    ),
    DecodingOption(
        "lookup_draft",
        int,
        DEFAULT_LOOKUP_DRAFT,
        "Prompt lookup: the most tokens a guess holds (a longer one costs a wider batch where the text "
        "leaves it).",
        short="prompt lookup's guess length",
        minimum=1,
        maximum=64,
        surfaces=frozenset({CLI, SERVE, CHAT, BENCH}),
        sweep="Prompt-lookup guess lengths, comma-separated (with each --lookup above 0).",
        bench_default="16",  # the length of every earlier run's guesses: their names stay comparable
    ),
    DecodingOption(
        "verify",
        float,
        None,
        "The large model checks the small one's tokens on catch-up and rewrites from the first whose "
        "probability is below RATIO x its top one (0 < RATIO <= 1).",
        surfaces=frozenset({CLI, SERVE, BENCH}),
        switching=True,
        metavar="RATIO",
        sweep="gate, ead and lookahead: catch-up check ratios, comma-separated; 'none' for no check.",
    ),
    DecodingOption(
        "pattern",
        str,
        None,
        "gate: a regular expression; where the text so far ends in a match, the large model writes the "
        "rest of the line (repeatable; '@code' adds built-in ones for code).",
        field="patterns",
        surfaces=frozenset({CLI, SERVE}),
        switching=True,
        repeatable=True,
        metavar="REGEX",
    ),
    DecodingOption(
        "tau_range",
        str,
        None,
        "LOW:HIGH makes tau adaptive: it falls after runs of uncertain steps and rises after confident "
        "ones, within the range.",
        surfaces=frozenset({CLI, SERVE}),
        switching=True,
        parse=parse_tau_range,
        what="LOW:HIGH in bits",
        metavar="LOW:HIGH",
    ),
    DecodingOption(
        "temp",
        float,
        0.0,
        "Temperature; 0 is greedy.",
        target="sampling",
        short="sampling temperature (0: greedy)",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="temperature",
    ),
    DecodingOption(
        "top_k",
        int,
        40,
        "Top-k (0 disables).",
        short="top-k (0: off)",
        target="sampling",
        minimum=0,
        surfaces=frozenset({CLI, SERVE, CHAT}),
        ollama_parameter="top_k",
    ),
    DecodingOption(
        "top_p",
        float,
        0.95,
        "Top-p nucleus.",
        short="top-p nucleus (1: off)",
        target="sampling",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="top_p",
    ),
    DecodingOption(
        "min_p",
        float,
        0.05,
        "Min-p.",
        short="min-p (0: off)",
        target="sampling",
        minimum=0,
        maximum=1,
        surfaces=frozenset({CLI, SERVE, CHAT}),
        ollama_parameter="min_p",
    ),
    DecodingOption(
        "top_n_sigma",
        float,
        -1.0,
        "llama.cpp's top-n-sigma: keep the tokens whose logit is within N standard deviations of the "
        "top one (-1, or 0 or less: off), first in the chain.",
        target="sampling",
    ),
    DecodingOption(
        "typical",
        float,
        1.0,
        "llama.cpp's locally typical sampling, after top-k (1: off).",
        target="sampling",
        field="typical_p",
    ),
    DecodingOption(
        "xtc_probability",
        float,
        0.0,
        "llama.cpp's XTC, after min-p: with this probability, drop every token above --xtc-threshold but "
        "the least likely of them (0: off).",
        target="sampling",
    ),
    DecodingOption(
        "xtc_threshold",
        float,
        0.1,
        "XTC's threshold: the probability above which a token may be dropped (above 0.5: off).",
        target="sampling",
    ),
    DecodingOption(
        "mirostat",
        int,
        0,
        "llama.cpp's Mirostat sampling: 1 Mirostat, 2 Mirostat 2.0 (0: off). After the temperature, in "
        "place of top-k, top-p, min-p, typical, top-n-sigma, XTC and the penalties, as in llama.cpp.",
        short="llama.cpp's Mirostat: 1, 2 (Mirostat 2.0) or 0 (off)",
        target="sampling",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="mirostat",
    ),
    DecodingOption(
        "mirostat_ent",
        float,
        5.0,
        "Mirostat's target entropy, its tau: the surprise per token, in bits, that it keeps the text near.",
        short="the target entropy of Mirostat (its tau), in bits a token",
        target="sampling",
        field="mirostat_tau",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="mirostat_tau",
    ),
    DecodingOption(
        "mirostat_lr",
        float,
        0.1,
        "Mirostat's learning rate, its eta.",
        short="the learning rate of Mirostat (its eta)",
        target="sampling",
        field="mirostat_eta",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="mirostat_eta",
    ),
    DecodingOption(
        "dry_multiplier",
        float,
        0.0,
        "llama.cpp's DRY (don't repeat yourself), after the penalties, greedy or not: a token that would "
        "extend text repeated from the last --dry-penalty-last-n tokens (prompt included) past "
        "--dry-allowed-length tokens loses X times --dry-base to the power of the excess (0: off).",
        target="sampling",
    ),
    DecodingOption(
        "dry_base", float, 1.75, "DRY's base: its penalty's growth per token (1 or more).", target="sampling"
    ),
    DecodingOption(
        "dry_allowed_length",
        int,
        2,
        "DRY: the length of repeated text that goes unpenalised.",
        target="sampling",
        minimum=0,
    ),
    DecodingOption(
        "dry_penalty_last_n",
        int,
        64,
        "DRY: how many of the last tokens it looks for repeats in (0: off).",
        target="sampling",
        minimum=0,
    ),
    DecodingOption(
        "dry_sequence_breaker",
        str,
        ("\n", ":", '"', "*"),
        "DRY: a string that ends repeated text (repeatable; given, in place of the defaults: newline, "
        "colon, quote, asterisk; 'none': no breakers). llama-cli's escapes processed (\\n, \\t, \\xHH...).",
        target="sampling",
        field="dry_sequence_breakers",
        parse=process_escapes,
        what="a string",
        repeatable=True,
        clear="none",
        whole=True,
        metavar="STRING",
    ),
    DecodingOption(
        "seed",
        int,
        0,
        "Sampling seed (same seed, same text).",
        short="sampling seed (same seed, same text)",
        target="sampling",
        surfaces=frozenset({CLI, CHAT}),
        llama_spellings=("-s",),
        ollama_parameter="seed",
    ),
    DecodingOption(
        "repeat_penalty",
        float,
        1.0,
        "llama.cpp's repetition penalty: a token among the last --repeat-last-n (prompt included) has a "
        "positive logit divided by X, a negative one multiplied (1: off).",
        short="repetition penalty (1: off)",
        target="sampling",
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="repeat_penalty",
    ),
    DecodingOption(
        "repeat_last_n",
        int,
        64,
        "How many of the last tokens (prompt included) the penalties count (0: none; -1: the whole context).",
        short="tokens the penalties count",
        target="sampling",
        minimum=-1,
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="repeat_last_n",
    ),
    DecodingOption(
        "presence_penalty",
        float,
        0.0,
        "X is subtracted from the logit of each token among the last --repeat-last-n (-2 to 2; 0: off).",
        short="presence penalty (0: off)",
        target="sampling",
        minimum=-2,
        maximum=2,
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="presence_penalty",
    ),
    DecodingOption(
        "frequency_penalty",
        float,
        0.0,
        "X is subtracted from a token's logit once for each time it occurs among the last --repeat-last-n "
        "(-2 to 2; 0: off).",
        short="frequency penalty (0: off)",
        target="sampling",
        minimum=-2,
        maximum=2,
        surfaces=frozenset({CLI, CHAT}),
        ollama_parameter="frequency_penalty",
    ),
    DecodingOption(
        "logit_bias",
        str,
        None,
        "llama-cli's -l: add BIAS to the logit of token TOKEN_ID, before the penalties (repeatable; BIAS in "
        "[-100, 100]: -100 all but bans the token).",
        target="sampling",
        parse=parse_logit_bias,
        what="TOKEN_ID+BIAS or TOKEN_ID-BIAS",
        llama_spellings=("-l",),
        repeatable=True,
        metavar="TOKEN_ID(+|-)BIAS",
    ),
    DecodingOption(
        "ignore_eos",
        bool,
        False,
        "llama-cli's: ban every end-of-generation token (both models', a logit bias of -inf), so the "
        "answer runs to --max-tokens (fixed-length benchmarks).",
        target="generation",
    ),
    DecodingOption(
        "max_tokens",
        int,
        512,
        "Stop after this many generated tokens; -1: no limit, until the answer ends or the context is "
        "full (llama.cpp's -n -1).",
        short="stop each answer after N tokens (-1: no limit, to the context's end)",
        target="generation",
        surfaces=frozenset({CLI, CHAT}),
        llama_spellings=("-n", "--n-predict"),
        ollama_parameter="num_predict",
    ),
    DecodingOption(
        "reasoning_budget",
        int,
        -1,
        "llama.cpp's: a thinking model's thinking, -1 unrestricted, 0 off (through its chat template's "
        "enable_thinking, where it reads it, as Qwen3's does), N at most N tokens, then the "
        "--reasoning-budget-message and </think> are written and the answer follows.",
        short="a thinking model's thinking: -1 on, 0 off (through its template), N at most N tokens",
        target="generation",
        minimum=-1,
        surfaces=frozenset({CLI, CHAT}),
    ),
    DecodingOption(
        "reasoning_budget_message",
        str,
        "",
        "llama.cpp's: the text written before </think> when a --reasoning-budget N is spent.",
        short="the text written before </think> when the budget is spent (nothing: none)",
        target="generation",
        surfaces=frozenset({CLI, CHAT}),
    ),
    DecodingOption(
        "reasoning_format",
        str,
        "auto",
        "llama.cpp's: a thinking model's thinking block apart from the answer (auto, deepseek), or left in "
        "it as written (none).",
        short="a thinking model's thinking apart (auto, deepseek) or in the answer as written (none)",
        target="generation",
        choices=REASONING_FORMATS,
        surfaces=frozenset({CLI, CHAT}),
    ),
    DecodingOption(
        "fallback",
        str,
        None,
        "'small': if a llama-server is lost mid-answer, the small model writes the rest.",
        target="generation",
        parse=parse_fallback,
        what="'small'",
        metavar="small",
    ),
)

OPTIONS: dict[str, DecodingOption] = {option.name: option for option in DECODING}
SWITCHING = frozenset(option.name for option in DECODING if option.switching)
# The options that shape some policy's rule (``PolicyKind.rule_options``), in the table's order: ead
# calibrate takes them and records the values a τ was measured under
RULE_OPTIONS = tuple(
    option.name
    for option in DECODING
    if any(option.attribute in kind.rule_options for kind in POLICY_KINDS.values())
)


def on(surface: str) -> tuple[DecodingOption, ...]:
    """The options a surface offers, in the table's order."""
    return tuple(option for option in DECODING if surface in option.surfaces)


_FLAG = re.compile(r"--([a-z][a-z-]*[a-z])")


def respell(message: str, surface: str, spelling: Callable[[DecodingOption], str]) -> str:
    """``message`` with each option's flag (``--min-run``: every check names an option as the command
    line does) spelled as ``surface`` names it (``/min-run`` in chat, ``ead.min_run`` in a request); an
    option the surface lacks keeps its flag (the command line gave it)."""

    def spelled(match: re.Match[str]) -> str:
        option = OPTIONS.get(match.group(1).replace("-", "_"))
        return spelling(option) if option is not None and surface in option.surfaces else match.group()

    return _FLAG.sub(spelled, message)


def resolve_mode(mode: str | None, given: Iterable[str], levels: int = 2) -> str:
    """The mode of a run: ``mode`` if given; ``ead`` if any switching option was given (by name:
    ``tau``, ``patterns``...) or three or more models take turns; else ``DEFAULT_MODE``."""
    if mode is not None:
        return mode
    names = {OPTIONS[name].name if name in OPTIONS else _by_field(name) for name in given}
    return "ead" if names & SWITCHING or levels > 2 else DEFAULT_MODE


def _by_field(field: str) -> str:
    return next((option.name for option in DECODING if option.attribute == field), field)

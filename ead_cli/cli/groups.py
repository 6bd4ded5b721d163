"""The options several commands share, declared once (models, decoding), and the option-group
decorator that splices a group into a command's signature and hands the command what it builds.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from ..errors import EadError, shown_path
from ..option_table import CLI, DECODING, OPTIONS, RULE_OPTIONS, DecodingOption, listed, on
from ..options import (
    DEFAULT_CACHE_TYPE,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TOP_K,
    KV_CACHE_TYPES,
    LOAD_MODES,
    GenerationOptions,
    ModelOptions,
    PolicyOptions,
    check_model_name,
    load_mode_of,
)
from ..paths import BOM, dash_named, folder_ending, read_bounded, read_file, unreadable
from .output import turn_colour_off

# The options with choices (mode, policy, switch point) as the enums typer offers them.
CHOICES: dict[str, Any] = {
    option.name: Enum(option.name, {choice: choice for choice in option.choices}, type=str)  # type: ignore[misc]
    for option in DECODING
    if option.choices
}
PolicyName = CHOICES["policy"]


class OutputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


def given_path(text: str) -> Path:
    """A path option or argument as given, refused when empty: ``Path("")`` is the current folder, where
    results would be written or read unasked. The message tells no file option to give '.'."""
    if not text:
        raise typer.BadParameter("an empty path names no file or folder ('.' is the current folder)")
    return Path(text)


def given_file(text: str) -> Path:
    """A file a command writes, as given: ``given_path``'s check, then a name that ends as a folder's
    (``folder_ending``) and '-' (``dash_named``), refused before the work whose figures it would hold."""
    path = given_path(text)
    if why := folder_ending(text):
        raise typer.BadParameter(f"{text}: {why}")
    if why := dash_named(text):
        raise typer.BadParameter(why)
    return path


def given_model(text: str) -> str:
    """A model argument as given, refused when blank, as --small and --large are ('' had been looked up as
    an alias, exit 1)."""
    check_model_name(text, "MODEL", "an alias or a .gguf path")
    return text


def show_help(context: typer.Context) -> None:
    """What ``--help`` does, for a group given no command (``ead bench``): its help on stdout, exit 0, where
    click's default had put it on stderr with exit 2, as for a mistake."""
    option = context.command.get_help_option(context)
    assert option is not None and option.callback is not None  # every command has -h/--help
    option.callback(context, option, True)


def given_alias(text: str) -> str:
    """An alias argument as given (``ead models pull``, ``rm``), refused when blank as a model is."""
    check_model_name(text, "ALIAS", "an alias from models.toml")
    return text


# After ead's spelling, llama-server's for a model and its speculative draft (-m BIG -md SMALL)
Small = Annotated[
    str | None,
    typer.Option(
        "--small",
        "-md",
        "--model-draft",
        metavar="MODEL",
        help="Small model: an alias from models.toml or a .gguf path.",
    ),
]
SERVER_ADDRESS = "a llama-server's http://HOST:PORT"


def _large(served: bool) -> Any:
    """--large, a server's address offered only where the command can use one (``served``)."""
    kinds = (
        f"an alias from models.toml, a .gguf path, or {SERVER_ADDRESS}"
        if served
        else "an alias from models.toml or a .gguf path"
    )
    return Annotated[
        str | None, typer.Option("--large", "-m", "--model", metavar="MODEL", help=f"Large model: {kinds}.")
    ]


RemoteTopK = Annotated[
    int, typer.Option(help="A model on a llama-server: top-k probabilities per token (entropy estimate).")
]
RemoteTimeout = Annotated[float, typer.Option(help="A model on a llama-server: seconds to wait for a reply.")]
RemoteApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="EAD_REMOTE_API_KEY",
        metavar="KEY",
        help="A model on a llama-server started with --api-key: that key, sent as Authorization: Bearer "
        "KEY (the env var keeps it out of ps).",
    ),
]


def _cascade(served: bool) -> Any:
    """--models, a server's address offered only where the command can use one (``served``)."""
    kinds = f"aliases, paths, or {SERVER_ADDRESS} above the first" if served else "aliases or paths"
    return Annotated[
        str | None,
        typer.Option(
            "--models",
            metavar=listed("MODEL"),
            help=f"Two or more models, smallest first, comma-separated ({kinds}): a cascade, instead of "
            "--small and --large.",
        ),
    ]


# $EAD_MODELS is read by the registry, as every variable that names a file or folder is: declared here too,
# click had named it in --catalog's errors ("Invalid value for '--catalog' (env var: 'EAD_MODELS')")
ModelsFile = Annotated[
    Path | None,
    typer.Option(
        "--catalog", help="A TOML file of extra or overriding aliases (env EAD_MODELS).", parser=given_path
    ),
]
# llama-cli's -r/--reverse-prompt too, which halts its answer at the string
Stop = Annotated[
    list[str] | None,
    typer.Option(
        "--stop", "-r", "--reverse-prompt", help="Stop at this string (repeatable); it is not printed."
    ),
]
System = Annotated[
    str | None,
    typer.Option("--system", "-sys", "--system-prompt", help="System message for the chat template."),
]
Raw = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")]
# llama-cli's -e/--escape, on by default there too: what its users type (-p 'a\nb', -r '\n') means the same.
# One wording for every command that takes it (generate, chat, depth generate): each has some of these.
Escape = Annotated[
    bool,
    typer.Option(
        "--escape/--no-escape",
        "-e",
        help="Process llama-cli's escapes (\\n, \\r, \\t, \\', \\\", \\\\, \\xHH) in what is typed on the "
        "command line: the prompt, --suffix, --stop; a --file's or stdin's text, --system and chat's "
        "messages are sent as they are.",
    ),
]
Suffix = Annotated[
    str | None,
    typer.Option(
        "--suffix",
        help="Fill in the middle: the code after the cursor, the prompt being the code before it (the "
        "model's FIM tokens, no chat template); the answer is the middle.",
    ),
]
# After ead's spelling, llama.cpp's for the same option (common/arg.cpp), which its users type from habit
Ctx = Annotated[
    int | None,
    typer.Option("--ctx", "-c", "--ctx-size", help="Context size in tokens (default: 4096 or the model's)."),
]
BatchSize = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        help="Tokens read per batch: a prompt's parts, and the most a draft or a lookup guess checks at "
        "once (default: 512; llama.cpp's tools: 2048).",
    ),
]


def with_help(option: Any, words: str) -> Any:
    """A shared option (an ``Annotated`` declaration) with other help, for commands where the shared
    words do not hold (depth's --batch-size: no drafts there); its spellings and type stay declared
    once."""
    kind, info = typing.get_args(option)
    changed = copy.copy(info)
    changed.help = words
    return Annotated[kind, changed]


UBatchSize = Annotated[
    int | None,
    typer.Option(
        "--ubatch-size",
        "-ub",
        help="Tokens computed at once within a batch, at most --batch-size (default: 512).",
    ),
]
Threads = Annotated[int | None, typer.Option("--threads", "-t", help="CPU threads (default: all cores).")]
ThreadsBatch = Annotated[
    int | None,
    typer.Option(
        "--threads-batch",
        "-tb",
        help="CPU threads for batches of several tokens: a prompt, a catch-up, a draft's or a guess's check "
        "(default: --threads).",
    ),
]
GpuLayers = Annotated[
    int | None,
    typer.Option(
        "--n-gpu-layers",
        "-ngl",
        "--gpu-layers",
        help="Layers to offload; -1 all (default: all if a GPU backend).",
    ),
]
RepackOpt = Annotated[
    bool | None,
    typer.Option(
        "--repack/--no-repack",
        help="Let llama.cpp repack weights for this CPU (default: on, off where its AMX path would crash; "
        "env EAD_REPACK=on|off|auto).",
        show_default=False,
    ),
]
_CACHE_TYPES = ", ".join(KV_CACHE_TYPES)
CacheTypeK = Annotated[
    str,
    typer.Option(
        "--cache-type-k",
        "-ctk",
        metavar="TYPE",
        help=f"KV cache type for K of the large model (and a cascade's middle ones): {_CACHE_TYPES}.",
    ),
]
CacheTypeV = Annotated[
    str,
    typer.Option(
        "--cache-type-v",
        "-ctv",
        metavar="TYPE",
        help="KV cache type for V of the large model (and a cascade's middle ones); a quantized one needs "
        "flash attention.",
    ),
]
CacheTypeKDraft = Annotated[
    str,
    typer.Option(
        "--cache-type-k-draft",
        "-ctkd",
        metavar="TYPE",
        help="KV cache type for K of the small model (llama-cli's draft model's: f16 whatever -ctk says).",
    ),
]
CacheTypeVDraft = Annotated[
    str,
    typer.Option(
        "--cache-type-v-draft",
        "-ctvd",
        metavar="TYPE",
        help="KV cache type for V of the small model (llama-cli's draft model's: f16 whatever -ctv says).",
    ),
]
FlashAttn = Annotated[
    str,
    typer.Option(
        "--flash-attn",
        "-fa",
        metavar="on|off|auto",
        help="Flash attention for every model loaded (auto: where llama.cpp's device has it).",
    ),
]
LoadMode = Annotated[
    str | None,
    typer.Option(
        "--load-mode",
        "-lm",
        metavar="MODE",
        help=f"How llama.cpp loads the weights: {', '.join(LOAD_MODES)} (default: auto, mapped from the "
        "file).",
        show_default=False,
    ),
]
NoMmap = Annotated[
    bool,
    typer.Option("--no-mmap", help="Older llama.cpp's: read the weights into memory (--load-mode none)."),
]
Mlock = Annotated[
    bool,
    typer.Option(
        "--mlock",
        help="Older llama.cpp's: keep the weights in RAM (--load-mode mmap+mlock; mlock with --no-mmap).",
    ),
]
# How llama.cpp loads the weights and runs attention, llama-cli's flags: every command that loads models
LOAD_SETTINGS = (
    ("flash_attn", FlashAttn, "auto"),
    ("load_mode", LoadMode, None),
    ("no_mmap", NoMmap, False),
    ("mlock", Mlock, False),
)
ChatTemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="A chat template in place of the models' own: one of llama.cpp's builtins by name (chatml, "
        "llama3, ...: a bad name lists them), or a Jinja template's text.",
    ),
]
ChatTemplateFile = Annotated[
    Path | None,
    typer.Option(
        "--chat-template-file",
        help="A Jinja chat template's file, in place of the models' own.",
        parser=given_path,
    ),
]
JinjaOpt = Annotated[
    bool,
    typer.Option(
        "--jinja/--no-jinja",
        help="Render chat templates with Jinja (the default, as llama-server's); --no-jinja: llama.cpp's "
        "own formatter writes the chats, as the builtin it recognises the template as.",
    ),
]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", help="text, or one JSON object per token.")]
Stats = Annotated[bool, typer.Option("--stats", help="Print tokens, shares, FLOPs and seconds to stderr.")]
HideThinking = Annotated[
    bool,
    typer.Option(
        "--hide-thinking",
        "--hidethinking",  # ollama run's spelling
        help="A thinking model's thinking not shown, the answer alone (shown, dimmed at a terminal, by "
        "default).",
    ),
]


def _no_color(value: bool) -> bool:
    """--no-color given: colour is off from the start (a model's load notes come before the command's
    body runs), so the option's callback does all its work."""
    if value:
        turn_colour_off()
    return value


# Taken before the command too (ead --no-color models list), as git takes its global options
NoColor = Annotated[
    bool,
    typer.Option(
        "--no-color",
        callback=_no_color,
        is_eager=True,  # before a --help after it
        help="No colours (NO_COLOR does the same).",
    ),
]


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


def _model_options(served: bool) -> OptionGroup:
    """The models and how llama.cpp runs them; with ``served`` (the commands that write chats), a model on
    a llama-server too and a chat template in place of the models' own."""
    remote = (
        ("remote_top_k", RemoteTopK, DEFAULT_TOP_K),
        ("remote_timeout", RemoteTimeout, DEFAULT_TIMEOUT_S),
        ("remote_api_key", RemoteApiKey, None),
    )
    templates = (
        ("chat_template", ChatTemplateOpt, None),
        ("chat_template_file", ChatTemplateFile, None),
        ("jinja", JinjaOpt, True),
    )
    return OptionGroup(
        "model_options",
        (
            ("small", Small, None),
            ("large", _large(served), None),
            ("models", _cascade(served), None),
            ("catalog", ModelsFile, None),
            ("n_ctx", Ctx, None),
            ("n_batch", BatchSize, None),
            ("n_ubatch", UBatchSize, None),
            ("threads", Threads, None),
            ("threads_batch", ThreadsBatch, None),
            ("n_gpu_layers", GpuLayers, None),
            ("repack", RepackOpt, None),
            ("cache_type_k", CacheTypeK, DEFAULT_CACHE_TYPE),
            ("cache_type_v", CacheTypeV, DEFAULT_CACHE_TYPE),
            ("cache_type_k_draft", CacheTypeKDraft, DEFAULT_CACHE_TYPE),
            ("cache_type_v_draft", CacheTypeVDraft, DEFAULT_CACHE_TYPE),
            *LOAD_SETTINGS,
            *(remote + templates if served else ()),
        ),
        lambda models, catalog, load_mode, no_mmap, mlock, **options: ModelOptions(
            models=parse_list(models),
            models_file=catalog,
            load_mode=load_mode_of(load_mode, no_mmap=no_mmap, mlock=mlock),
            **options,
        ),
    )


# generate, chat, serve, calibrate and the benches of HumanEval and prompts files write chats: they take
# a chat template in place of the models' own
CHAT_MODEL_OPTIONS = _model_options(served=True)
# bench replay and speed time llama.cpp's own calls, which a model on a server has none of (their
# models are loaded local_only), on tokens recorded or made up: they offer neither a server's address and
# options nor a chat template
LOCAL_MODEL_OPTIONS = _model_options(served=False)


def decoding_option(option: DecodingOption, *, given_only: bool = True) -> tuple[str, Any, Any]:
    """An option of the table as a command's parameter: (name, Annotated type, default). With
    ``given_only`` a switching option (and the mode) defaults to None, "not given", its default said in
    the help, so the decision of ``option_table.resolve_mode`` sees what was given."""
    base: Any = CHOICES.get(option.name) or (str if option.parse else option.kind)
    if option.repeatable:
        base = list[base]
    if option.kind is bool:
        default: Any = option.default
    elif given_only or option.default is None:
        default = None
    else:
        default = CHOICES[option.name](option.default) if option.name in CHOICES else option.default
    shown = option.shown_default if default is None and option.shown_default is not None else None
    declared = typer.Option(
        option.flag,
        *option.llama_spellings,
        *option.older,
        help=option.help,
        metavar=option.placeholder,
        show_default=shown if shown is not None else default is not None,
    )
    annotation = base | None if default is None else base
    return option.name, Annotated[annotation, declared], default


def _value(option: DecodingOption, value: Any) -> Any:
    """A parsed command-line value as the options take it; None (not given) is the table's default."""
    if value is None or value == []:
        return tuple(option.default or ()) if option.repeatable else option.default
    if isinstance(value, Enum):
        return value.value
    if option.repeatable:
        if option.clear and option.clear in value:  # llama-cli's 'none': those before it dropped
            value = value[len(value) - value[::-1].index(option.clear) :]
        return tuple(option.read(item) if option.parse else item for item in value)
    return option.read(value) if option.parse and isinstance(value, str) else value


def _decoding_options(**values: Any) -> Decoding:
    """The policy and generation options that `generate`, `chat` and `serve` share, from their parsed
    values (checked for as many models as there are thresholds; ``_for_models`` checks the real count);
    the options given are named, for the mode's resolution."""
    from ..sampling import SamplingParams

    given = tuple(
        name for name, value in values.items() if value is not None and value is not False and value != []
    )
    targets: dict[str, dict[str, Any]] = {"policy": {}, "sampling": {}, "generation": {}}
    for name, value in values.items():
        option = OPTIONS[name]
        targets[option.target][option.attribute] = _value(option, value)
    policy = targets["policy"]
    levels = len(policy["tau"]) + 1 if isinstance(policy["tau"], tuple) else 2
    policy_options = PolicyOptions(**policy, levels=levels, given=given)
    generation = targets["generation"]
    fallback = bool(generation.pop("fallback"))
    return policy_options, GenerationOptions(
        SamplingParams(**targets["sampling"]), **generation, fallback=fallback
    )


DECODING_OPTIONS = OptionGroup(
    "decoding", tuple(decoding_option(option) for option in on(CLI)), _decoding_options
)


def _given_rule_settings(**values: Any) -> dict[str, Any]:
    """The rule options given, by PolicyOptions field, as the options take them: each one not given is
    each policy's own."""
    return {
        OPTIONS[name].attribute: _value(OPTIONS[name], value)
        for name, value in values.items()
        if value is not None and value != []
    }


# ead calibrate's: the options that shape a policy's rule, declared as generate's
RULE_SETTINGS = OptionGroup(
    "rule_settings", tuple(decoding_option(OPTIONS[name]) for name in RULE_OPTIONS), _given_rule_settings
)
Temp, Seed, Pattern, TauRange = (
    decoding_option(OPTIONS[name], given_only=False)[1] for name in ("temp", "seed", "pattern", "tau_range")
)
# the bench's, calibrate's and depth's: answers they measure or colour, so no -1 (no limit) there
MaxTokens = decoding_option(
    replace(OPTIONS["max_tokens"], help="Stop after this many generated tokens (at least 1)."),
    given_only=False,
)[1]


def parse_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",")) if text is not None else ()


# llama-cli's structured output: a GBNF grammar or a JSON schema, given or in a file
Grammar = Annotated[
    str | None,
    typer.Option(
        "--grammar",
        metavar="GBNF",
        help="A llama.cpp grammar (GBNF, root rule 'root') that every token keeps the answer within, "
        "whichever model writes it.",
    ),
]
GrammarFile = Annotated[
    Path | None,
    typer.Option("--grammar-file", help="The grammar, from this file ('-': stdin).", parser=given_path),
]
JsonSchema = Annotated[
    str | None,
    typer.Option(
        "--json-schema",
        "-j",
        metavar="SCHEMA",
        help="A JSON schema the answer meets, as ead serve's JSON mode holds one ('{}': any JSON value, "
        'where llama-cli\'s is any object: \'{"type": "object"}\').',
    ),
]
JsonSchemaFile = Annotated[
    Path | None,
    typer.Option(
        "--json-schema-file", "-jf", help="The JSON schema, from this file ('-': stdin).", parser=given_path
    ),
]
# What each file option's file holds, as a refusal to read it names it
_FILE_HOLDS = {"--grammar-file": "the grammar", "--json-schema-file": "the JSON schema"}


def read_grammar(
    grammar: str | None,
    grammar_file: Path | None,
    schema: str | None,
    schema_file: Path | None,
    *,
    prompt_on_stdin: bool,
) -> tuple[str, str] | None:
    """The grammar the answer keeps within and the option that gave it, or None: a GBNF text, or a JSON
    schema's grammar written as ead serve's JSON mode writes it. Given two ways it is refused: which one
    was meant is unknown. A file named '-' is stdin, as --file's is, unless the prompt reads it
    (``prompt_on_stdin``): one input cannot hold both."""
    ways = {
        "--grammar": grammar,
        "--grammar-file": grammar_file,
        "--json-schema": schema,
        "--json-schema-file": schema_file,
    }
    given = [way for way, value in ways.items() if value is not None]
    if len(given) > 1:
        raise EadError(f"the grammar is given twice ({' and '.join(given)}): give it once", exit_code=2)
    if not given:
        return None
    option, value = given[0], ways[given[0]]
    if isinstance(value, Path) and str(value) == "-":
        if prompt_on_stdin:
            message = "the prompt and the grammar both read stdin: give one of them another way"
            raise EadError(message, exit_code=2)
        if sys.stdin is None:  # the shell closed it (<&-)
            raise EadError(f"{option} -: stdin is closed", exit_code=2)
        value = _read_text(sys.stdin.buffer, f"{_FILE_HOLDS[option]} on stdin")
    elif isinstance(value, Path):
        value = _read_text(value, f"{_FILE_HOLDS[option]} file {shown_path(value)}")
    if not str(value).strip():
        raise EadError(f"{option} is empty", exit_code=2)
    if option.startswith("--grammar"):
        return str(value), option
    try:
        schema_value = json.loads(str(value))
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}" if error.lineno > 1 else f"column {error.colno}"
        raise EadError(f"{option} is not JSON: {error.msg} ({where})", exit_code=2) from None
    try:
        from ..serve.converter import json_schema_grammar  # the serve extra: only for a schema
    except ImportError as error:
        message = f"{option} needs the serve extra ({error.name} is missing): pip install 'ead-cli[serve]'"
        raise EadError(message) from None
    return json_schema_grammar(schema_value, option), option


PromptArg = Annotated[
    str | None, typer.Argument(help="The prompt (or --prompt, --file); '-' or nothing reads stdin.")
]
# llama-cli's spellings of the prompt: -p TEXT, the argument's twin, and -f FILE, read as stdin is
PromptOpt = Annotated[
    str | None, typer.Option("--prompt", "-p", help="The prompt, as the argument gives it.")
]
PromptFile = Annotated[
    Path | None,
    typer.Option("--file", "-f", help="Read the prompt from this file ('-': stdin).", parser=given_path),
]


def read_stops(stop: list[str] | None, escape: bool) -> tuple[str, ...]:
    """The stop strings, their escapes processed where ``escape`` (--escape), each checked: an argument's
    bytes that are not UTF-8 would never match the text; an empty one, which llama.cpp finds at once and
    ead's text stream drops, is a typo ($UNSET)."""
    from ..prompt import check_text  # loads llama.cpp: only when a command runs
    from ..text import process_escapes

    stops = tuple(process_escapes(string) if escape else string for string in stop or ())
    for string in stops:
        if not string:
            raise EadError("--stop is empty: a stop string needs a character at least", exit_code=2)
        check_text(string, "the stop string")
    return stops


def prompt_on_stdin(prompt: str | None, option: str | None, file: Path | None) -> bool:
    """Whether ``read_prompt`` reads stdin: '-', or no prompt given."""
    return _prompt_input(prompt, option, file) is None


def read_prompt(prompt: str | None, option: str | None, file: Path | None, escape: bool) -> str:
    """The prompt, checked (``check_prompt_text``), a file's or stdin's named in a refusal of it; with
    ``escape`` (--escape), the escapes of one given on the command line processed, as llama-cli's -e does
    (a file's or stdin's text is read as it is: code's own escapes reach the model as written)."""
    from ..prompt import check_prompt_text  # loads llama.cpp: only when a command runs
    from ..text import process_escapes

    text, what = _given_prompt(prompt, option, file)
    typed = isinstance(_prompt_input(prompt, option, file), str)
    return check_prompt_text(process_escapes(text) if escape and typed else text, what)


def _prompt_input(prompt: str | None, option: str | None, file: Path | None) -> str | Path | None:
    """Where the prompt is: its text typed on the command line (the argument or --prompt), a file
    (--file), or stdin (None) where the one given is '-' or none is. The one rule of which input the
    prompt reads, for ``read_prompt`` and for ``prompt_on_stdin``, which keeps a grammar off that stdin."""
    given = next((value for value in (prompt, option, file) if value is not None), None)
    return None if given is None or str(given) == "-" else given


def _given_prompt(prompt: str | None, option: str | None, file: Path | None) -> tuple[str, str]:
    """The prompt and where it came from ('the prompt file NAME'): the argument or --prompt, else
    --file's text, else stdin (``_prompt_input``) when stdin is not a terminal or '-' names it. Given
    two ways it is refused: which one was meant is unknown."""
    ways = {"the argument": prompt, "--prompt": option, "--file": file}
    given = [way for way, value in ways.items() if value is not None]
    if len(given) > 1:
        raise EadError(f"the prompt is given twice ({' and '.join(given)}): give it once", exit_code=2)
    source = _prompt_input(prompt, option, file)
    if isinstance(source, Path):
        named = f"the prompt file {shown_path(source)}"
        return _read_text(source, named), named
    if source is not None:
        return source, "the prompt"
    if sys.stdin is None:  # the shell closed it (<&-)
        raise EadError("no prompt: stdin is closed; pass the prompt as an argument", exit_code=2)
    if not given and sys.stdin.isatty():
        raise EadError("no prompt: pass it as an argument, or '-' to read it from stdin", exit_code=2)
    return _read_text(sys.stdin.buffer, "the prompt on stdin"), "the prompt on stdin"


def _read_text(source: BinaryIO | Path, what: str) -> str:
    """The text of an input read whole from stdin or a file (``what`` in a message: 'the prompt on stdin',
    'the grammar file NAME'). A byte-order mark at its start (a file saved as "UTF-8 with BOM") marks the
    encoding: it is not the text."""
    try:
        data = read_file(source) if isinstance(source, Path) else read_bounded(source)
    except OSError as error:
        raise EadError(f"cannot read {what}: {unreadable(error)}", exit_code=2) from None
    text = data.removeprefix(BOM)
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as error:
        byte = len(data) - len(text) + error.start  # counted in the input, the mark included
        raise EadError(f"{what} is not valid UTF-8 (byte {byte})", exit_code=2) from None

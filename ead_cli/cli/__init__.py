"""The ``ead`` command line: parse options, hand them to the engine, render its events. Nothing else.

Each command group lives in its own module (``generate``: generate, chat, serve, calibrate; ``models``;
``bench``; ``depth``), which imports what a command runs only when it runs, so ``ead --help`` and
``ead --version`` load typer and the option declarations, nothing heavy.
"""

from __future__ import annotations

import errno
import inspect
import re
import signal
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.exceptions import TyperException

from .. import __version__
from ..errors import EadError, quoted
from ..option_table import placeholder
from ..signals import Terminated, main_thread_signals, terminate_on_sigterm
from . import generate
from .bench import bench_app
from .depth import depth_app
from .groups import NoColor
from .models import models_app
from .output import (
    check_stdout,
    color_system,
    misopened,
    open_closed_stderr,
    silence_stdout,
    spelled,
    stderr,
    turn_colour_off,
)

app = typer.Typer(
    help="Entropy-adaptive decoding: a small and a large GGUF model write one answer together.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # llama.cpp's -h too; every command inherits it
)
for command in (generate.generate, generate.chat, generate.serve, generate.calibrate):
    app.command()(command)


def _show_version(value: bool) -> None:
    if value:
        check_stdout("the version")
        print(f"ead {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
    no_color: NoColor = False,
) -> None:
    """Entropy-adaptive decoding: a small and a large GGUF model write one answer together."""
    # A command runs (--help and --version have exited): numpy's OpenBLAS starts its thread pool at
    # import, and it must not take a Ctrl-C, so it starts here with the signals held back.
    with main_thread_signals():
        import numpy  # noqa: F401


app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")
app.add_typer(depth_app, name="depth")


# Columns below which typer's tables of options cut names with an ellipsis (up to 114,
# '--draft-entropy-stop,--dra…' hid --draft-stop): click's plain help wraps them instead
TABLES_MIN_WIDTH = 120
HELP_MAX_WIDTH = 200  # columns: typer pads its tables to the width, and COLUMNS=99999999 took minutes


def readable_help(group: TyperGroup, plain: bool) -> None:
    """Give each command under ``group`` its summary (its help's first paragraph) as one line of text:
    typer's rich help lists a command by that paragraph with the docstring's own line breaks kept, each
    cutting the summary mid-sentence in ``ead --help``. With ``plain``, click's plain help, which wraps
    what does not fit where typer's tables cut it (at 40 columns '--mode…' was --models, beside --mode)."""
    if plain:
        group.rich_markup_mode = None
    for command in group.commands.values():
        if command.short_help is None and command.help:
            command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n", 1)[0].split())
        if plain:
            command.rich_markup_mode = None  # type: ignore[attr-defined]
        if isinstance(command, TyperGroup):
            readable_help(command, plain)


def every_command(
    command: TyperCommand | TyperGroup, parent: typer.Context | None = None
) -> Iterator[tuple[TyperCommand | TyperGroup, typer.Context]]:
    """``command`` and every command under it, each with a context made as click makes it to run the
    command (its class and settings, under its parent's): click keeps the help option first made for a
    command, and the names it answers to come from that context (``-h`` set on the app)."""
    context = command.context_class(command, parent=parent, **command.context_settings)
    yield command, context
    for subcommand in command.commands.values() if isinstance(command, TyperGroup) else ():
        yield from every_command(subcommand, context)


class WordedOption(TyperOption):
    """An option whose default the command settles itself (None on the command line: "not given", the
    default declared as ``show_default``) says it as any default is said, ``[default: gate]``: click puts
    such a default in parentheses, as it does a description, ``(gate)``."""

    def _get_default_string(self, *, show_default_is_str: bool, **given: Any) -> str:
        if show_default_is_str:
            return str(self.show_default)
        return super()._get_default_string(show_default_is_str=show_default_is_str, **given)

    def get_error_hint(self, ctx: typer.Context | None = None) -> str:
        """The option by its first name, as its help lists it: click named every spelling of it, "Invalid
        value for '--n-gpu-layers' / '-ngl' / '--gpu-layers'"."""
        return f"'{self.opts[0]}'"

    def process_value(self, ctx: typer.Context, value: Any) -> Any:
        """A number that does not parse is refused with the value echoed: pydantic, which typer parses
        with, had said 'Input should be a valid integer, unable to parse string as an integer'."""
        try:
            return super().process_value(ctx, value)
        except typer.BadParameter as error:
            unread = _unread_number(error.__cause__)
            if unread is None:
                raise
            raise typer.BadParameter(unread, ctx=ctx, param=self) from None


_NOT_READ = {
    "int_parsing": "is not a whole number",
    "int_parsing_size": "is too long a number",
    "float_parsing": "is not a number",
}


def _unread_number(cause: BaseException | None) -> str | None:
    """Why the value in pydantic's complaint ``cause`` is no number, the value cut as ``quoted`` cuts
    it; None for any other complaint (typer's own wording stands)."""
    from pydantic import ValidationError  # loaded already: typer parsed the value with it

    if not isinstance(cause, ValidationError):
        return None
    first = cause.errors()[0]
    why = _NOT_READ.get(first["type"])
    return f"{quoted(first['input'])} {why}" if why else None


class WordedArgument(TyperArgument):
    """An argument as click's help shows one, by its metavar alone (``PROMPT``): required, bare in the
    usage line, else in brackets; typer had added its type (``<str>``) and put a required one in braces."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return None

    def get_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return [self.metavar if self.required else f"[{self.metavar}]"]


def say_values_in_words(root: TyperGroup) -> None:
    """Every parameter's value in the help as a word, in llama.cpp's manner (N, X, PATH, TEXT, the choices,
    or the word its declaration gives, MODEL), where typer shows the Python type it is parsed as
    (``<int>``, ``<list[str]>``); an argument by its name in capitals; a flag by its name alone. typer
    makes its parameters' classes itself, with no hook for others: each is given its Worded subclass here."""
    for command, context in every_command(root):
        for parameter in command.get_params(context):  # --help's option too
            if isinstance(parameter, TyperArgument):
                parameter.__class__ = WordedArgument
                many = "..." if parameter.nargs != 1 else ""
                parameter.metavar = parameter.metavar or f"{(parameter.name or '').upper()}{many}"
            elif isinstance(parameter, TyperOption):
                parameter.__class__ = WordedOption
                if parameter.is_flag:  # takes no value: typer had shown <bool>
                    parameter.metavar = ""
                elif parameter.metavar is None:
                    parameter.metavar = _value_word(parameter)


def _value_word(option: TyperOption) -> str:
    """The word for an option's value, from the type typer parses it as (one item's, for a list)."""
    described = option.type_descriptor
    kind = typing.get_args(described.annotation)[0] if described.is_list else described.annotation
    choices = (getattr(choice, "value", choice) for choice in described.choices or ())
    return placeholder(Path if described.is_path else kind, choices)


def refuse_help_without_stdout(root: TyperGroup) -> None:
    """With stdout closed (``>&-``), ``--help`` of ``root`` and of every command under it says so in one
    line, as each command says it: click's help had gone nowhere, exit 0."""
    for command, context in every_command(root):
        option = command.get_help_option(context)
        if option is not None and option.callback is not None:
            option.callback = _refused_without_stdout(option.callback)


def _refused_without_stdout(show: Callable[..., object]) -> Callable[..., object]:
    def show_if_it_can(context: typer.Context, parameter: typer.CallbackParam, value: bool) -> object:
        if value and not context.resilient_parsing:
            check_stdout("the help")
        return show(context, parameter, value)

    return show_if_it_can


def main(argv: list[str] | None = None) -> None:
    """Entry point: every failure a user can cause ends in one line on stderr and a non-zero exit."""
    open_closed_stderr()
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)  # the app has commands and groups
    readable_help(command, plain=stderr.width < TABLES_MIN_WIDTH)
    say_values_in_words(command)
    if sys.stdout is None:
        refuse_help_without_stdout(command)
    if stderr.width > HELP_MAX_WIDTH:
        from typer import rich_utils  # loaded by typer only to show help or an error

        rich_utils.MAX_WIDTH = HELP_MAX_WIDTH
    if color_system() is None:  # NO_COLOR, for what does not read it (typer's help)
        turn_colour_off()
    arguments = sys.argv[1:] if argv is None else argv
    misspelt = (
        _dashed_option(command, arguments)
        or _unlike_llama_cpp(command, arguments)
        or _misread_option(command, arguments)
        or _ollama_command(command, arguments)
    )
    if misspelt is not None:
        _fail(misspelt, 2)
    terminate_on_sigterm()
    try:
        code = command.main(args=arguments, prog_name="ead", standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()  # what is still buffered fails here, where it can be said in one line
    except TyperException as error:
        # typer checks a choice through pydantic where it is installed, whose words lead the reason
        message = error.format_message().replace(": Value error, ", ": ", 1)
        if not message.strip() or "\n" in message:  # no arguments: typer has shown (or this is) the help
            sys.stderr.write(message.rstrip() + "\n" if message.strip() else "")
            sys.exit(2)
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context else ""
        message = f"{_cut_echoes(message, arguments)}{hint}"
        misplaced = _where_it_goes(command, getattr(error, "option_name", None), context)
        _fail(misplaced or message, error.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except Terminated:
        _fail("terminated", 143)
    except EadError as error:
        _fail(str(error), error.exit_code)
    except BrokenPipeError:
        silence_stdout()
        sys.exit(141)
    except SystemExit as stop:  # typer answers a closed pipe inside a command with a bare exit 1
        if not isinstance(stop.__context__, BrokenPipeError):
            raise
        silence_stdout()
        sys.exit(141)
    except OSError as error:  # an output that refuses the text (a full disk): any command's, in one line
        misopened = _misopened() if error.errno == errno.EBADF else None
        if error.errno not in _REFUSED_OUTPUT and misopened is None:
            raise
        silence_stdout()
        _fail(misopened or f"cannot write the output: {error.strerror}", 1)
    if code in _STOPPED:  # typer turns a Ctrl-C inside a command into a bare exit code: say what happened
        _fail(_STOPPED[code], code)
    sys.exit(code or 0)


_STOPPED = {130: "interrupted", 143: "terminated"}
_REFUSED_OUTPUT = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # a write's errors: no read raises them


def _cut_echoes(message: str, argv: list[str]) -> str:
    """typer's ``message`` with each argument it echoes (``'xxx' is not one of...``, ``No such option:
    --xxx``, a value given as ``--mode=xxx``) cut as ``quoted`` cuts a bad value, by the length it prints
    (thirty escapes print as 120 characters). One pass, the longest first: a long argument that is part of
    the echoed one (``--system X --mode Xb``) is not cut inside it."""
    values = (value for given in argv for value in (given.partition("=")[2], given))
    cut = (value for value in values if quoted(value) != repr(value))
    echoes = {echo: value for value in cut for echo in (value, repr(value))}
    if not echoes:
        return message
    pattern = "|".join(re.escape(echo) for echo in sorted(echoes, key=len, reverse=True))
    return re.sub(pattern, lambda echo: quoted(echoes[echo.group()]), message)


TYPOGRAPHIC_DASHES = ("\u2013", "\u2014")  # en and em dash: what a word processor or a web page makes of "--"


def _option_names(command: TyperCommand | TyperGroup) -> set[str]:
    """Every option's spellings, of ``command`` and of every command under it."""
    every = (parameter for each, _ in every_command(command) for parameter in each.params)
    return {name for parameter in every for name in (*parameter.opts, *parameter.secondary_opts)}


def _dashed_option(root: TyperGroup, argv: list[str]) -> str | None:
    """For an option pasted with a typographic dash (``\u2014small``, ``\u2013-max-tokens``), which click
    took for the prompt or an extra argument, the option meant. Only where click reads an option's name
    (``_option_words``). The commands' options are gathered only when an argument starts with such a
    dash, not at every start."""
    if not any(given.startswith(TYPOGRAPHIC_DASHES) for given in argv):
        return None
    names = _option_names(root)
    for _, _, given in _option_words(root, argv):
        if given.startswith(TYPOGRAPHIC_DASHES):
            meant = "--" + given.partition("=")[0].lstrip("-" + "".join(TYPOGRAPHIC_DASHES))
            if meant in names:
                return f"{quoted(given)} starts with a typographic dash, not '--': did you mean {meant}?"
    return None


# A one-dash word of letters (and inner dashes): an option's name as llama.cpp spells its own (-mg, -cnv,
# -no-cnv), never a short option with a value glued on (-c8, -s-1)
LLAMA_WORD = re.compile(r"-[a-z][a-z-]*[a-z]")


def _misread_option(root: TyperGroup, argv: list[str]) -> str | None:
    """For an option spelt with one dash and more than one letter, an option of ead (llama.cpp's ``-sys``,
    ``-ngl``) or a word of letters (llama.cpp's ``-mg``, ``-cnv``), given to a command that lacks it,
    typer's 'No such option' naming it: click reads such a word as its first letter's option with the rest
    as that option's value (``ead serve -sys x`` had been 'Invalid value for --seed', -s given 'ys';
    ``-mg 0`` the large model 'g')."""
    if not any(_is_one_dash_word(given) for given in argv):
        return None
    names = _option_names(root)
    for path, command, given in _option_words(root, argv):
        name = given.partition("=")[0]
        named = name in names or LLAMA_WORD.fullmatch(name)
        if _is_one_dash_word(name) and named and not any(name in p.opts for p in command.params):
            return f"No such option: {name} (see '{path} --help')"
    return None


# llama.cpp's spellings that mean something ead's command does not do, by the command they are typed to:
# refused with the difference, where click had said only 'No such option'
UNLIKE_LLAMA_CPP: dict[str, dict[str, str]] = {
    "ead serve": dict.fromkeys(
        ("-a", "--alias"),
        "is llama-server's --alias, the name of the model it serves: ead serve's is always 'ead' "
        "(--any-model answers a request that names another)",
    ),
}


def _unlike_llama_cpp(root: TyperGroup, argv: list[str]) -> str | None:
    """For a llama.cpp spelling whose meaning a command lacks (``UNLIKE_LLAMA_CPP``), how ead differs."""
    for path, _, given in _option_words(root, argv):
        name = given.partition("=")[0]
        why = UNLIKE_LLAMA_CPP.get(path, {}).get(name)
        if why is not None:
            return f"{name} {why}"
    return None


# ollama's commands that ead names otherwise, typed from habit: where click had said 'No such command'
OLLAMA_COMMANDS = {
    "run": "ollama's run is ead chat here (ead generate PROMPT: one answer)",
    **{name: f"ollama's {name} is ead models list here" for name in ("list", "ls")},
    "show": "ollama's show is ead models show here",
    "pull": "ollama's pull is ead models pull here",
    "rm": "ollama's rm is ead models rm here",
    "ps": "ollama's ps lists the loaded models: ead loads them per command (ead serve: while it runs)",
}


def _ollama_command(root: TyperGroup, argv: list[str]) -> str | None:
    """For ollama's name of a command (``ead run``), ead's, in click's 'No such command' line; not after
    an option that acts alone (``ead --help run`` is the help)."""
    words = iter(argv)
    for given in words:
        if given in ("--", "-h", "--help", *RUN_ALONE):
            return None
        if not given.startswith("-"):  # the command's name
            said = None if given in root.commands else OLLAMA_COMMANDS.get(given)
            return None if said is None else f"No such command {given!r}: {said} (see 'ead --help')"
        for _ in range(_values_taken(root, given)):
            next(words, None)
    return None


def _is_one_dash_word(given: str) -> bool:
    return len(given) > 2 and given.startswith("-") and not given.startswith("--")


def _option_words(root: TyperGroup, argv: list[str]) -> Iterator[tuple[str, TyperCommand | TyperGroup, str]]:
    """Each argument where click reads an option's name, with the command that reads it and its path
    (``ead bench humaneval``), as click parses them: an option's value skipped (``--stop \u2014small`` is
    text), a subcommand followed, nothing after ``--``."""
    command: TyperCommand | TyperGroup = root
    path = "ead"
    words = iter(argv)
    for given in words:
        if given == "--":
            return
        if given.startswith(("-", *TYPOGRAPHIC_DASHES)):
            yield path, command, given
            for _ in range(_values_taken(command, given)):
                next(words, None)
        elif isinstance(command, TyperGroup) and given in command.commands:
            command = command.commands[given]
            path = f"{path} {given}"


def _values_taken(command: TyperCommand | TyperGroup, given: str) -> int:
    """How many of the arguments after the option ``given`` click reads as its value, as they are ('--'
    too): one after ``--stop``, none after a flag, ``--stop=X`` or an option ``command`` does not have."""
    name, equals, _ = given.partition("=")
    for parameter in command.params:
        if isinstance(parameter, TyperOption) and name in parameter.opts and not equals:
            return 0 if parameter.is_flag else parameter.nargs
    return 0


def _where_it_goes(root: TyperGroup, option: str | None, context: typer.Context | None) -> str | None:
    """For an option of ead itself given after a command that does not take it (``ead models list
    --no-color``), where it goes, or that it runs alone (``--version``): typer had said only 'No such
    option'."""
    if context is None or context.parent is None or option not in {o for p in root.params for o in p.opts}:
        return None
    program, _, command = context.command_path.partition(" ")
    if option in RUN_ALONE:
        return f"{option} is an option of {program} itself, which runs no command: '{program} {option}' alone"
    where = f"'{program} {option} {command} ...'"
    return f"{option} is an option of {program} itself: it goes before the command, {where}"


# ead's own options that act and exit, running no command after them (--no-color goes before one)
RUN_ALONE = frozenset({"--version", "--install-completion", "--show-completion"})


def _misopened() -> str | None:
    """Why a read or write of stdin or stdout failed with EBADF: the shell opened it the wrong way round
    (``1</dev/null``, ``0>file``), which had been a traceback in any command but generate."""
    return misopened(1) or misopened(0)


def _fail(message: str, code: int) -> None:
    """``error: MESSAGE`` on one line: a control character a name brought in (a file name's newline, an
    escape typed in a model name, a line separator, a bidi override that would reorder the line) spelled
    as Python would (``\\n``, ``\\x1b``), never acted on; other text as it is (an ideographic or no-break
    space, a zero-width joiner had been spelled out too, as ``isprintable`` judges them).

    Ctrl-C and SIGTERM take their default action from here on: a second Ctrl-C (an impatient user) while
    the first is reported, or in the interpreter's shutdown after it, was a KeyboardInterrupt's traceback;
    now it ends the process as a signal does. Not ignored: the last flush of an answer whose reader has
    stopped reading blocks, and a signal must still end it."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    sys.stderr.write(f"error: {spelled(message)}\n")
    sys.exit(code)

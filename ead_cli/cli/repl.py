"""``ead chat`` at a terminal: line editing, slash commands, answers streamed in each model's colour.

With stdin not a terminal it reads the same input (lines, continued lines, blocks) and prints plain
answers, so it works in a pipeline. Answers go to stdout; everything else (summaries, command replies,
errors) to stderr.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import BinaryIO, NamedTuple, TextIO

from rich.console import Console
from rich.text import Text

from ..chat import ContextFull, Conversation, Turn
from ..errors import EadError, counted, quoted, shown_path
from ..option_table import CHAT, OPTIONS, DecodingOption, on, respell
from ..options import GenerationOptions, PolicyOptions
from ..paths import BOM, MAX_READ_BYTES, dash_named, expand_home, folder_ending
from ..policies import POLICY_KINDS, format_tau
from ..remote import RemoteError
from ..runner import Runner
from ..signals import CtrlCGate, Terminated, main_thread_signals
from .output import at_its_width, silence_stdout, spelled
from .render import TextRenderer, mode_line, print_stats, wants_color

PROMPT = ">>> "
MORE = "... "
FENCE = '"""'
ESCAPE = "//"  # a line's start that sends the rest, from its /, as a message
RESET_HINT = "/reset starts a new conversation"
# what habit (/quit, /q) and ollama's commands that mean none of ead's (/show info, /set verbose) are
# nearest to here: a hint; None where none is (difflib's guess for /set was /reset)
OTHER_CHATS = {"quit": "exit", "q": "exit", "show": "stats", "set": None}
# ollama's /set think LEVEL (gpt-oss's): llama.cpp's reasoning budget is on or off, no level
THINK_LEVELS = ("high", "medium", "low")
ReadLine = Callable[[str], str]


class Command(NamedTuple):
    """A slash command: what runs it (None for /exit, which ends the loop), returning the line that says
    what it changed, if any; its argument and what it does, in /help; and other chats' spellings of it
    (ollama's, words parted by any whitespace), which run it too; ``off_aliases``: those that run it
    with the argument off (ollama's /set nothink is /think off)."""

    handler: Callable[[str], str | None] | None
    usage: str
    description: str
    aliases: tuple[str, ...] = ()
    off_aliases: tuple[str, ...] = ()


def read_message(read_line: ReadLine) -> tuple[str, bool]:
    """One user message and whether it is a command: a line; a line ending in a backslash goes on on the
    next; a block between lines that start and end with \"\"\" is one message as pasted (its indentation
    kept), never a command (pasted code may start with /). A line starting with / is a command, with //
    a message starting with /. ``read_line`` raises EOFError at the end; an end inside a message is an
    EadError (it is not sent)."""
    line = read_line(PROMPT)
    if line.lstrip().startswith(FENCE):
        line = line.lstrip()[len(FENCE) :].lstrip()
        lines = []
        while not line.rstrip().endswith(FENCE):
            lines.append(line)
            line = _more(read_line, f"a {FENCE} block")
        lines.append(line.rstrip()[: -len(FENCE)])
        while lines and not lines[0].strip():  # blank lines go, not the indentation of pasted code
            del lines[0]
        return "\n".join(lines).rstrip(), False
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = _more(read_line, "a line ending in \\")
    text = "\n".join([*lines, line]).strip()
    if text.startswith(ESCAPE):
        return text[1:], False
    return text, text.startswith("/")


def _more(read_line: ReadLine, inside: str) -> str:
    """The next line of a message begun; the input's end there is one line of error, not a silent drop."""
    try:
        return read_line(MORE)
    except EOFError:
        raise EadError(f"the input ended inside {inside}: that message is not sent") from None


def _usage(option: DecodingOption) -> str:
    """A command's argument in /help: NAME for one of choices (its line names them), else its value's word."""
    return "NAME" if option.choices else option.placeholder


def _as_command(message: str, option: DecodingOption) -> str:
    """A value's check, declared once, names options as the command line spells them (``--temp``); in
    chat the message names the commands instead (``/temp``). A check that names no option first (a
    threshold count for the models loaded, a policy a cascade cannot run) is led by the command, so
    every refusal says which command it refuses."""
    message = respell(message, CHAT, lambda other: other.command)
    return message if message.startswith(option.command + " ") else f"{option.command}: {message}"


def summary_line(turn: Turn) -> str:
    """The one line after each answer: tokens, large-model share, speed, and why it was cut."""
    summary = turn.summary
    cut = f" · cut ({summary.finish_reason})" if turn.cut else ""
    return (
        f"{counted(summary.generated, 'token')} · large share {summary.large_share:.1%} · "
        f"{summary.tokens_per_s:.1f} tok/s{cut}"
    )


def settings_line(policy: PolicyOptions, generation: GenerationOptions) -> str:
    """What the next answer runs with, defaults spelled out: shown on each change and in /stats."""
    kind = POLICY_KINDS[policy.policy]
    tau = kind.tau if policy.tau is None else policy.tau
    window = kind.window if policy.window is None else policy.window
    sampling = generation.sampling
    penalties = (  # all four once one is on, none while they are off (the defaults)
        f"repeat-penalty {sampling.repeat_penalty:g} · repeat-last-n {sampling.repeat_last_n} · "
        f"presence-penalty {sampling.presence_penalty:g} · "
        f"frequency-penalty {sampling.frequency_penalty:g} · "
        if sampling.penalises
        else ""
    )
    # drawn: the samplers that shape the draw (Mirostat's, where it runs in place of the others), and the seed
    if sampling.temp == 0:
        samplers = ""
    elif sampling.mirostat:
        samplers = (
            f"mirostat {sampling.mirostat} · mirostat-ent {sampling.mirostat_tau:g} · "
            f"mirostat-lr {sampling.mirostat_eta:g} · seed {sampling.seed} · "
        )
    else:
        samplers = (
            f"top-k {sampling.top_k} · top-p {sampling.top_p:g} · min-p {sampling.min_p:g} · "
            f"seed {sampling.seed} · "
        )
    # said once changed: thinking off or budgeted, the budget's message, its block left in the answer
    budget = generation.reasoning_budget
    thinking = f" · reasoning-budget {budget}" if budget >= 0 else ""
    if generation.reasoning_budget_message:
        thinking += f" · reasoning-budget-message {quoted(generation.reasoning_budget_message)}"
    if generation.reasoning_format != OPTIONS["reasoning_format"].default:
        thinking += f" · reasoning-format {generation.reasoning_format}"
    return (
        f"settings: mode {policy.mode} · policy {policy.policy} · tau {format_tau(tau)} · window {window} · "
        f"min-run {policy.min_run} · lookup {policy.lookup} · lookup-draft {policy.lookup_draft} · "
        f"temp {sampling.temp:g} · {samplers}{penalties}max-tokens {generation.max_tokens}{thinking}"
    )


def context_use(conversation: Conversation) -> str:
    """'200 of 256 tokens'; past the context (a cut answer's closing tokens), by how much, not '259 of
    256'."""
    used, holds = len(conversation.tokens), conversation.n_ctx
    if used <= holds:
        return f"{used} of {holds} tokens"
    return f"{counted(used - holds, 'token')} over the {holds} it holds"


class Repl:
    """Reads messages and commands, streams answers. ``interactive``: a person at a terminal, so
    Ctrl-C stops only the answer (or clears the line) and errors never end the session."""

    def __init__(
        self,
        conversation: Conversation,
        read_line: ReadLine,
        *,
        out: TextIO,
        err: TextIO,
        color: bool,
        interactive: bool,
        hide_thinking: bool = False,
    ) -> None:
        self.conversation = conversation
        self.read_line = read_line
        self.err = err
        self.renderer = TextRenderer(out, color=color, hide_thinking=hide_thinking)
        # Its lines hold what the user typed (a /save file name, an argument an error echoes) as typed:
        # rich's markup would read '[bold]' as a style, its emoji codes ':smile:' as an emoji.
        colors = "auto" if color else None
        self.console = at_its_width(
            Console(file=err, markup=False, emoji=False, highlight=False, color_system=colors)
        )
        self.console.soft_wrap = not self.console.is_terminal  # a terminal's lines wrap at spaces
        self.interactive = interactive
        self.ctrl_c = CtrlCGate()
        self.failed = False
        self.commands = {
            "help": Command(self._help, "", "this list", ("?",)),
            **{
                option.command[1:]: Command(
                    self._setter(option),
                    _usage(option),
                    option.short or option.help,
                    (f"set parameter {option.ollama_parameter}",) if option.ollama_parameter else (),
                )
                for option in on(CHAT)
            },
            "think": Command(
                self._think,
                "on|off",
                "a thinking model's thinking (off: through its template)",
                ("set think",),
                ("set nothink",),
            ),
            "hide-thinking": Command(
                self._hide_thinking,
                "on|off",
                "a thinking model's answers without their thinking",
                ("set hidethinking",),
                ("set nohidethinking",),
            ),
            "system": Command(
                self._system,
                "TEXT",
                "system message (nothing: none); the next answer re-reads all",
                ("set system",),
            ),
            "stats": Command(self._stats, "", "the last answer's and the session's figures"),
            "reset": Command(self._reset, "", "start a new conversation", ("clear",)),
            "save": Command(
                self._save, "FILE", "the transcript as JSON, each token with its model and entropy"
            ),
            "exit": Command(None, "", "leave (Ctrl-D too)", ("bye",)),
        }
        # each alias as its words parted by any whitespace, then the argument's; the longest first
        aliases = sorted(
            (
                (alias, name, preset)
                for name, command in self.commands.items()
                for spellings, preset in ((command.aliases, ""), (command.off_aliases, "off"))
                for alias in spellings
            ),
            key=lambda alias: -len(alias[0]),
        )
        self.aliases = [
            (re.compile(r"\s+".join(map(re.escape, alias.split())) + r"(?:\s+|$)"), name, preset)
            for alias, name, preset in aliases
        ]

    def loop(self) -> int:
        """Run until Ctrl-D, /exit or the end of input; the exit status is 1 if anything failed on a pipe."""
        if self.interactive:
            names = {runner.name: runner.label for runner in self.conversation.runners}
            legend = f"{self.renderer.legend(names)}  · {mode_line(self.conversation.policy)}"
            self.console.print(Text.from_ansi(legend))  # wrapped at spaces, its colours kept
            self.note("/help lists the commands; Ctrl-D leaves")
        with self.ctrl_c if self.interactive else contextlib.nullcontext():
            while True:
                try:
                    if not self._turn():
                        break
                except KeyboardInterrupt:  # a Ctrl-C as a turn ended in Ctrl-D or an error said: the session
                    if not self.interactive:  # goes on
                        raise
        return 1 if self.failed else 0

    def _turn(self) -> bool:
        """One step, and what ended it early: Ctrl-C drops the line, Ctrl-D leaves; False to leave. At a
        terminal a Ctrl-C raises only within a turn (``CtrlCGate``): one that came between turns, or
        while the last was handled, is a fresh line before this turn's prompt."""
        try:
            if self.ctrl_c.open():
                self.err.write("\n")
            return self._step()
        except KeyboardInterrupt:
            self.ctrl_c.is_open = False  # first: until the next turn a Ctrl-C only leaves its mark
            if not self.interactive:
                raise
            self.err.write("\n")  # the line typed so far is dropped; a fresh prompt follows
        except EOFError:
            if self.interactive:
                self.err.write("\n")
            return False
        except EadError as error:  # the input ended inside a message
            if self.interactive:
                self.err.write("\n")  # Ctrl-D left the cursor after the ... prompt
            self.error(str(error))
        finally:
            self.ctrl_c.is_open = False
        return True

    def whole(self) -> contextlib.AbstractContextManager[None]:
        """At a terminal, the REPL's own lines are written whole: a Ctrl-C meanwhile acts once they are out.
        On a pipe Ctrl-C ends the chat, and a reader that stops reading must not hold it back."""
        return main_thread_signals() if self.interactive else contextlib.nullcontext()

    def note(self, message: str) -> None:
        with self.whole():
            self.console.print(spelled(message), style="dim")  # what the user typed, never acted on

    def error(self, message: str) -> None:
        if not self.interactive:
            self.failed = True
        with self.whole():
            self.console.print(f"error: {spelled(message)}", style="red")

    def _step(self) -> bool:
        """Read and handle one message or command; False to leave."""
        try:
            text, command = read_message(self.read_line)
        except Terminated:
            if self.interactive:
                self.err.write("\n")  # the cursor is on the prompt's line, after what was typed
            raise
        if not text:
            return True
        if command:
            return self._command(text)
        self._answer(text)
        return True

    def _named(self, line: str) -> tuple[str, str]:
        """The command a line names and its argument: an alias's command (its words parted by any
        whitespace), else the name that follows the / at once ('/ reset' is no /reset), parted from the
        argument by any whitespace."""
        for alias, name, preset in self.aliases:
            if match := alias.match(line, 1):
                return name, " ".join(filter(None, (preset, line[match.end() :])))
        name, argument = (*re.split(r"\s+", line[1:], maxsplit=1), "")[:2]
        return name, argument

    def _command(self, line: str) -> bool:
        name, argument = self._named(line)
        if name not in self.commands:
            words = argument.split()
            if name == "set" and words[:1] == ["parameter"]:  # a name ollama has and ead chat not
                self._refuse_parameter(words[1] if len(words) > 1 else "")
                return True
            meant = self._meant(name)
            hint = f"did you mean /{meant}?" if meant else "/help lists the commands"
            self.error(f"unknown command {quoted('/' + name)} ({hint})")
            return True
        handler, usage, *_ = self.commands[name]
        if argument and not usage:  # refused, not dropped: /reset now must not pass for /reset
            self.error(f"/{name} takes no argument, got {quoted(argument)}")
            return True
        if handler is None:
            return False
        try:
            done = handler(argument.strip())
        except EadError as error:
            self.error(str(error))
            return True
        except KeyboardInterrupt:  # the small model's load, a /save to a FIFO no one reads: each command
            if not self.interactive:  # changes what it changes last, in one step
                raise
            self.err.write("\n")  # after the ^C the terminal echoed
            self.note(f"/{name} stopped (Ctrl-C): nothing changed")
            return True
        if done:  # said here: a Ctrl-C while it is written stops no command, which is over
            self.note(done)
        return True

    def _answer(self, text: str) -> None:
        conversation = self.conversation
        try:
            stream = conversation.ask(text)
        except ContextFull as error:
            self.error(f"{error}; {RESET_HINT}")
            return
        except EadError as error:
            self.error(str(error))
            return
        self.renderer.shown = -1  # this answer's tokens count from 0: none of them shown yet
        self.renderer.start(conversation.thinking)
        stop: BaseException | None = None  # ends the session once the cut answer's line is closed
        lost: RemoteError | None = None  # said once the cut answer's line is closed
        try:
            for event in stream:
                self.renderer.event(event)
        except KeyboardInterrupt as interrupt:
            stop = None if self.interactive else interrupt
            if self.interactive and not self.renderer.terminal and self.err.isatty():
                self.err.write("\n")  # after the ^C the terminal echoed: the answer's line ends in its file
        except Terminated as terminated:
            stop = terminated
        except RemoteError as error:  # the server went away mid-answer
            lost = error
        finally:
            try:
                stream.close()
            except KeyboardInterrupt as again:  # a second Ctrl-C, held back while the turn was recorded
                stop = stop or again  # the answer is stopped already: it acts once the notes are out
        turn = conversation.turns[-1]
        if turn.events and turn.events[-1].index > self.renderer.shown:  # counted before Ctrl-C came
            self.renderer.event(turn.events[-1])
        self.renderer.finish(turn.summary)
        with self.whole():  # the summary and the error that follows it, together
            self.note(summary_line(turn))
            if lost is not None:
                self.error(str(lost))
        if stop is not None:
            raise stop
        if conversation.full:
            self.note(f"the context is full ({context_use(conversation)}): {RESET_HINT}")

    def _refuse_parameter(self, name: str) -> None:
        """ollama's /set parameter NAME where NAME is none of the option table's ollama parameters: the
        ones it takes named ('/set' itself is known: /set parameter temperature runs)."""
        names = [option.ollama_parameter for option in on(CHAT) if option.ollama_parameter]
        takes = f"{', '.join(names[:-1])} or {names[-1]}"
        self.error(f"/set parameter takes {takes}, got {quoted(name)}")

    def _meant(self, name: str) -> str | None:
        """The command an unknown name likely meant: a near miss (/hlep, /EXIT, /tau=2), or the nearest to a
        habit (/quit) or to an ollama command that means none of ead's (/show info); None where none is."""
        name = name.lower()
        if name in OTHER_CHATS:
            return OTHER_CHATS[name]
        return next(iter(difflib.get_close_matches(name, self.commands, n=1)), None)

    def _configure(
        self, policy: PolicyOptions | None = None, generation: GenerationOptions | None = None
    ) -> str:
        conversation = self.conversation
        conversation.configure(policy or conversation.policy, generation or conversation.generation)
        saved = conversation.saved_tau
        if saved.mismatch is not None:  # the settings line after it shows the τ it leaves
            self.note(f"note: {saved.mismatch}")
        return settings_line(saved.options, conversation.generation) + " (from the next answer)"

    def _setter(self, option: DecodingOption) -> Callable[[str], str]:
        """The command of a decoding option (the option table's CHAT surface): its value, read by the
        table, for the next answers; a policy option set so counts as given (``PolicyOptions.changed``)."""

        def set_option(argument: str) -> str:
            value = option.read(argument, option.command)
            policy, generation = self.conversation.policy, self.conversation.generation
            try:
                if option.target == "policy":
                    return self._configure(policy.changed(**{option.attribute: value}))
                if option.target == "sampling":
                    sampling = replace(generation.sampling, **{option.attribute: value})
                    return self._configure(generation=replace(generation, sampling=sampling))
                return self._configure(generation=replace(generation, **{option.attribute: value}))
            except EadError as error:
                raise EadError(_as_command(str(error), option), error.exit_code) from None

        return set_option

    def _think(self, argument: str) -> str:
        """ollama's /set think and /set nothink: the reasoning budget (-1 or 0) of a thinking model; one
        that does not think is told so, as ollama warns, and nothing changes."""
        if argument in THINK_LEVELS:
            levels = ", ".join(THINK_LEVELS)
            raise EadError(f"/think {argument}: ead turns thinking on or off, it has no levels ({levels})")
        on = _on_or_off(argument, "/think")
        conversation = self.conversation
        if not conversation.thinks:
            return "this model does not think: /think changes nothing"
        generation = replace(conversation.generation, reasoning_budget=-1 if on else 0)
        conversation.configure(conversation.policy, generation)
        return f"thinking {'on' if on else 'off'} (from the next answer)"

    def _hide_thinking(self, argument: str) -> str:
        """ollama's /set hidethinking and /set nohidethinking: --hide-thinking for the next answers."""
        self.renderer.hide_thinking = _on_or_off(argument, "/hide-thinking")
        return f"thinking {'hidden' if self.renderer.hide_thinking else 'shown'} (from the next answer)"

    def _system(self, argument: str) -> str:
        if not argument and self.conversation.system is None:
            return "there was no system message to remove"
        self.conversation.system = argument or None
        return f"system message {'set' if argument else 'removed'} (from the next answer)"

    def _stats(self, argument: str) -> None:
        conversation = self.conversation
        if conversation.turns:
            self.console.print("last answer:", style="bold")
            print_stats(self.console, conversation.turns[-1].summary)
        else:
            self.note("no answer yet in this conversation")
        totals = conversation.totals
        self.console.print(
            f"session: {counted(totals.answers, 'answer')} · {counted(totals.generated, 'token')} · "
            f"large share {totals.large_share:.1%} · {counted(totals.switches, 'switch', 'switches')} · "
            f"{totals.flops / 1e9:,.1f} GFLOP · {totals.wall_s:.2f}s"
        )
        self.console.print(
            f"context: {context_use(conversation)} · "
            + settings_line(conversation.effective_policy, conversation.generation)
        )

    def _reset(self, argument: str) -> str:
        self.conversation.reset()
        return "new conversation"

    def _save(self, argument: str) -> str:
        """One file name, split as a shell splits it: '/save chat.json now' must not write 'chat.json now';
        a name ending as a folder's ('notes/') is refused, not written as the file 'notes', and '-' as
        every file option refuses it."""
        try:
            names = shlex.split(argument)
        except ValueError as error:  # a quote left open, a backslash at the end
            message = str(error)[:1].lower() + str(error)[1:]
            quoting = f"quoted as in a shell: {message} in {quoted(argument)}"
            raise EadError(f"/save takes one file name, {quoting}") from None
        if len(names) > 1:
            raise EadError(f"/save takes one file name (quote one with spaces), got {quoted(argument)}")
        name = "".join(names)
        if not name:  # nothing, or "" (which would name the current folder)
            raise EadError("/save takes a file name")
        if why := folder_ending(name):
            raise EadError(f"cannot write {shown_path(name)}: {why}")
        if why := dash_named(name):
            raise EadError(f"/save: {why}")
        path = expand_home(name, f"cannot write {name}")
        self.conversation.save(path)
        return f"saved {counted(len(self.conversation.turns), 'turn')} to {shown_path(path)}"

    def _help(self, argument: str) -> None:
        usages = {name: f"/{name} {command.usage}" for name, command in self.commands.items()}
        width = max(map(len, usages.values())) + 2  # the descriptions in one column after the longest
        for name, command in self.commands.items():
            self.console.print(usages[name].ljust(width) + command.description)
        self.console.print(
            'Enter sends; a line ending in \\ goes on on the next; a block between """ lines is one '
            "message, never a command; // at a line's start sends the rest, from its /, as a message."
        )
        aliases = [
            f"/{alias}"
            for command in self.commands.values()
            for alias in (*command.aliases, *command.off_aliases)
        ]
        self.console.print(f"ollama's {', '.join(aliases[:-1])} and {aliases[-1]} run those commands too.")
        self.console.print(
            "Ctrl-C stops an answer (it stays in the conversation, marked as cut) or a command (which then "
            "changes nothing), or clears the line."
        )


def _on_or_off(argument: str, command: str) -> bool:
    """A switch command's argument: on (or none, as ollama's /set think) or off."""
    if argument not in ("", "on", "off"):
        raise EadError(f"{command} takes on or off, got {quoted(argument)}")
    return argument != "off"


def _pipe_reader(stream: BinaryIO) -> ReadLine:
    """Lines of a pipe, without their line ending; EOFError at the end. A line longer than ead reads of
    any input ends the input there (an endless one, /dev/zero, had filled the memory). A UTF-8
    byte-order mark at the input's start (a file saved as "UTF-8 with BOM") is not part of its first
    line, so a command there is still one."""
    ended, first = False, True

    def read_line(prompt: str) -> str:
        nonlocal ended, first
        data = b"" if ended else stream.readline(MAX_READ_BYTES + 1)
        if len(data) > MAX_READ_BYTES and not data.endswith(b"\n"):  # judged with the mark still on
            ended = True
            limit = f"{MAX_READ_BYTES >> 20} MiB, more than ead reads"
            raise EadError(f"a line of the input is more than {limit}: the input ends there")
        if first:
            first, data = False, data.removeprefix(BOM)
        if not data:
            raise EOFError
        # bytes that are not UTF-8 are kept as a terminal's are, so the line is refused as a bad one
        return data.decode("utf-8", "surrogateescape").rstrip("\r\n")

    return read_line


def _line_editor() -> ReadLine:
    """input() with GNU readline loaded: line editing and up-arrow history. Bytes typed that are not
    UTF-8 are kept as a pipe's are (lone surrogates the conversation refuses in one line): a locale's
    strict decoding would raise in input() and end the session."""
    with contextlib.suppress(ImportError):  # a Python built without it: input() still reads lines
        import readline  # noqa: F401  (importing it is what gives input() editing and history)
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(errors="surrogateescape")
    read = input if sys.stdout.isatty() else _input_beside_stdout

    def read_line(prompt: str) -> str:
        """readline writes its prompt a character at a time and drops one whose write a Ctrl-C interrupts
        (a prompt drawn '>> '): while it reads, an interrupted write is restarted. Its wait for a key is a
        select(), which a signal interrupts whatever SA_RESTART says, so Ctrl-C still clears the line."""
        signal.siginterrupt(signal.SIGINT, False)
        try:
            return read(prompt)
        finally:
            signal.siginterrupt(signal.SIGINT, True)

    return read_line


def _input_beside_stdout(prompt: str) -> str:
    """input() with stdout redirected (``ead chat > answers.txt``): readline edits lines only while file
    descriptor 1 is a terminal, and writes its prompt and echo there; so while a line is read, fd 1 is
    stderr's (the terminal, or where stderr goes) and the answers alone reach stdout's file."""
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        return input(prompt)
    finally:
        os.dup2(stdout, 1)
        os.close(stdout)


def run_chat(
    runners: Sequence[Runner],
    policy: PolicyOptions,
    generation: GenerationOptions,
    *,
    system: str | None = None,
    load_pair: Callable[[], Sequence[Runner]] | None = None,
    hide_thinking: bool = False,
) -> int:
    """Hold a conversation on this process's terminal, or over its pipes; returns the exit status, 141
    where the answers' reader went away (``| head``), as generate ends then.
    ``load_pair``: only the large model is loaded; this loads the pair when a command turns it on."""
    conversation = Conversation(runners, policy, generation, system=system, load_pair=load_pair)
    interactive = sys.stdin.isatty()
    read_line = _line_editor() if interactive else _pipe_reader(sys.stdin.buffer)
    color = interactive and wants_color(sys.stdout)
    repl = Repl(
        conversation,
        read_line,
        out=sys.stdout,
        err=sys.stderr,
        color=color,
        interactive=interactive,
        hide_thinking=hide_thinking,
    )
    try:
        return repl.loop()
    except BrokenPipeError:
        silence_stdout()
        return 141

"""Showing a generation: coloured text on a terminal, plain text in a pipe, JSON lines for machines."""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from rich.console import Console
from rich.table import Table

from ..errors import EadError, counted
from ..option_table import DEFAULT_MODE
from ..signals import Terminated
from ..thinking import ReasoningSplitter
from .output import color_system, silence_stdout

if TYPE_CHECKING:
    from ..decoder import ModelReport, Summary, TokenEvent
    from ..options import PolicyOptions
    from ..response import Response

_STYLE = {"small": ("\x1b[36m", "cyan"), "large": ("\x1b[1;33m", "bold yellow")}
_MIDDLE = ("\x1b[32m", "green")  # the middle levels of a cascade: mid, mid1, mid2...
RESET = "\x1b[0m"
# What a terminal would act on rather than show: C0 controls but tab and newline, DEL, and C1 controls
# (some terminals read U+009B as ESC [, a CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What JSON leaves raw of those (it escapes C0 controls itself): DEL and the C1 controls.
_RAW_IN_JSON = re.compile("[\x7f-\x9f]")


def spell_controls(text: str) -> str:
    """A model's text made harmless to a terminal, as less shows it: ESC as ^[, a carriage return as ^M,
    DEL as ^?, a C1 control as <U+009B>. Written raw, an answer could move the cursor, clear the screen,
    retitle the window or set the clipboard (OSC 52)."""
    return _CONTROL.sub(_spelled, text)


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)
    return "^?" if code == 0x7F else f"<U+{code:04X}>"


def model_style(role: str) -> str:
    return _STYLE.get(role, _MIDDLE if role.startswith("mid") else ("", ""))[0]


def wants_color(stream: TextIO) -> bool:
    """Colour on a terminal unless --no-color or NO_COLOR (https://no-color.org); FORCE_COLOR forces it.
    A terminal that says it is dumb (TERM=dumb) may show escape codes as text: no colour there, as rich
    gives the figures of --stats none (it reads TERM=unknown, in any case, as dumb too)."""
    if color_system() is None:
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty() and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


class Renderer:
    """``shown``: the index of the last event handed to the output. It is set as soon as the output's
    buffer holds the event's bytes (a copy that waits on nothing, so a signal lands there only in that
    instant), so after a Ctrl-C the caller can tell a token the output never got from one it did, and
    show it: the output then holds every token the summary counts, none twice.

    The bytes go through a buffered binary stream, which takes a write whole or (a signal interrupting
    it) not at all, and keeps what a signal stopped it writing out for its next flush: a reader that
    stops reading (a full pipe, a held pager) blocks a flush, where Ctrl-C lands. Python's text layer
    forgets the text of an interrupted write, and unbuffered (PYTHONUNBUFFERED=1) writes to the file
    itself, which cannot say what an interrupted write wrote: a token was lost, yet counted."""

    utf8 = False  # JSON lines' renderers: the bytes are UTF-8 whatever the output's encoding

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown = -1
        self.terminal = out.isatty()
        self.binary = _buffered(out)

    def visible(self, text: str) -> str:
        """A token's text as the output may get it: at a terminal its control characters spelled out; in
        a pipe or a file, as written."""
        return spell_controls(text) if self.terminal else text

    def json_line(self, record: dict[str, Any]) -> str:
        """``record`` as a line of JSON lines' output. At a terminal the controls JSON leaves raw go as
        \\u escapes (the same JSON), so a token's U+009B, which some terminals read as ESC [, cannot
        drive it."""
        line = json.dumps(record, ensure_ascii=False)
        if self.terminal:
            line = _RAW_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", line)
        return line + "\n"

    def event(self, event: TokenEvent) -> None:
        data = self._encode(self._text(event))
        self.binary.write(data)
        self.shown = event.index
        self.binary.flush()

    def write(self, text: str) -> None:
        """``text`` after what the buffer still holds of the tokens, flushed."""
        self.binary.write(self._encode(text))
        self.binary.flush()

    def _encode(self, text: str) -> bytes:
        """JSON lines in UTF-8 whatever the locale (RFC 8259); text in the output's encoding, a character
        it lacks (PYTHONIOENCODING=ascii, a Latin-1 terminal) as '?' rather than a traceback mid-answer."""
        self.out.flush()  # what went through the text layer (chat's prompt) comes first
        return text.encode("utf-8") if self.utf8 else text.encode(self.out.encoding, "replace")

    def _text(self, event: TokenEvent) -> str:
        raise NotImplementedError

    def finish(self, summary: Any) -> None:
        """The answer is over (or cut short): end its line, or write the summary record."""
        raise NotImplementedError


def _buffered(out: TextIO) -> BinaryIO:
    """The binary stream under ``out``, buffered: unbuffered (PYTHONUNBUFFERED=1, python -u) it is the
    file itself, and a buffer of ours goes on top (on the same descriptor, which it never closes)."""
    binary = out.buffer
    if isinstance(binary, io.RawIOBase):
        return io.BufferedWriter(io.FileIO(binary.fileno(), "w", closefd=False))
    return binary


def stream_answer(response: Response, renderer: Renderer) -> int:
    """Run the generation into the renderer. Ctrl-C (130) and SIGTERM (143) keep what was printed; a closed
    pipe ends quietly (141); an output that refuses the text (a full disk) is one line."""
    from ..remote import RemoteError

    try:
        for event in response:
            renderer.event(event)
        renderer.finish(response.summary())
    except (KeyboardInterrupt, Terminated) as interrupt:
        last = response.last_event
        try:
            if last is not None and last.index > renderer.shown:  # counted, but the signal came first
                renderer.event(last)
            renderer.finish(response.summary())
        except (KeyboardInterrupt, Terminated):
            # A second signal while a reader that stopped reading holds the output back: what it never
            # took goes to /dev/null, or the exit's own flush would block on it again.
            silence_stdout()
            raise
        return 143 if isinstance(interrupt, Terminated) else 130
    except BrokenPipeError:
        silence_stdout()
        return 141
    except OSError as error:  # the text still buffered would fail again at exit: it goes to /dev/null
        silence_stdout()
        raise EadError(f"cannot write the answer: {error.strerror}") from None
    except RemoteError:  # the server went away: end the partial answer's line, then say why
        renderer.finish(response.summary())
        raise
    return 0


DIM = "\x1b[2m"
# ollama run's lines around a thinking model's thinking
THINKING, DONE_THINKING = "Thinking...\n", "\n...done thinking.\n\n"


class TextRenderer(Renderer):
    """Streams token text as it comes, each token in its model's colour when ``color``. A thinking
    model's answer (``thinking``: ``thinking.answer_start``) shows its thinking first, between ollama
    run's lines and dimmed when ``color``, or not at all (``hide_thinking``), then the answer."""

    def __init__(
        self, out: TextIO, *, color: bool, thinking: bool | None = None, hide_thinking: bool = False
    ) -> None:
        super().__init__(out)
        self.color = color
        self.hide_thinking = hide_thinking
        self.start(thinking)

    def start(self, thinking: bool | None) -> None:
        """A new answer (chat's next), split as ``thinking`` says."""
        self._splitter = None if thinking is None else ReasoningSplitter(thinking)
        self._thought = False  # some thinking shown
        self._answering = False  # some of the answer shown
        self._model = ""  # the last token's, for what the splitter held at the end

    def legend(self, names: dict[str, str]) -> str:
        """One line naming the colours, e.g. ``■ small: qwen-0.5b.gguf  ■ large: qwen-1.5b.gguf``."""
        parts = []
        for role, name in names.items():
            code = model_style(role) if self.color else ""
            parts.append(f"{code}■ {role}{RESET if code else ''}: {name}")
        return "  ".join(parts)

    def _text(self, event: TokenEvent) -> str:
        if self._splitter is None:
            return self._styled(event.text, event.model)
        self._model = event.model
        return self._split_text(*self._splitter.push(event.text))

    def _styled(self, text: str, model: str, dim: bool = False) -> str:
        text = self.visible(text)
        if self.color and text:
            return f"{DIM if dim else ''}{model_style(model)}{text}{RESET}"
        return text

    def _split_text(self, reasoning: str, content: str) -> str:
        shown = []
        if reasoning and not self.hide_thinking:
            if not self._thought:
                shown.append(self._styled(THINKING, "", dim=True))
            shown.append(self._styled(reasoning, self._model, dim=True))
            self._thought = True
        if content:
            if self._thought and not self._answering:
                shown.append(self._styled(DONE_THINKING, "", dim=True))
            shown.append(self._styled(content, self._model))
            self._answering = True
        return "".join(shown)

    def finish(self, summary: Summary) -> None:
        held = "" if self._splitter is None else self._split_text(*self._splitter.flush())
        self.write(held + "\n")


class JsonlRenderer(Renderer):
    """One JSON object per token, then one summary object; every object has a ``type``."""

    utf8 = True

    def _text(self, event: TokenEvent) -> str:
        return self.json_line({"type": "token", **asdict(event)})

    def finish(self, summary: Summary) -> None:
        self.write(json.dumps({"type": "summary", **asdict(summary)}) + "\n")


def _seconds(value: float) -> str:
    return f"{value:.2f}s"


def stats_headline(summary: Summary) -> str:
    """Two lines: what was produced, and what it cost."""
    return (
        f"{counted(summary.generated, 'token')} ({summary.finish_reason}), prompt {summary.prompt_tokens} · "
        f"large share {summary.large_share:.1%} · switches {summary.switches}\n"
        f"param cost {summary.param_cost:.3f} · {summary.flops / 1e9:,.1f} GFLOP · "
        f"{_seconds(summary.wall_s)} wall · {summary.tokens_per_s:.1f} tok/s"
        + (f"\nchecked {counted(summary.checked, 'small token')}" if summary.checked else "")
        + (
            f"{' · ' if summary.checked else chr(10)}rollbacks {summary.rollbacks} "
            f"({counted(summary.rolled_back, 'token')} discarded)"
            if summary.checked or summary.rollbacks
            else ""
        )
        + "".join(f"\n{part}" for part in _draft_parts(summary))
    )


def _draft_parts(summary: Summary) -> list[str]:
    """Speculative decoding's figures: what the small model drafted and the large one kept, and the
    same for lookup drafts (one line, or none)."""
    parts = []
    if summary.drafted:
        parts.append(f"drafted {summary.drafted} · kept {summary.acceptance_rate:.1%}")
    if summary.looked_up:
        parts.append(f"looked up {summary.looked_up} · kept {summary.lookup_acceptance:.1%}")
    for report in summary.models:
        if report.guessed:
            parts.append(f"{report.role} guessed {report.guessed} · followed {report.guessed_kept}")
    return [" · ".join(parts)] if parts else []


def network_line(summary: Summary) -> str | None:
    """What the remote models cost on the wire, or None when every model is local."""
    remote = [report for report in summary.models if report.requests]
    if not remote:
        return None
    return " · ".join(
        f"{report.role} over the network: {counted(report.requests, 'request')} in "
        f"{_seconds(report.network_s)} (server compute {_seconds(report.server_s)}), "
        f"{report.bytes_sent / 1e3:,.1f} kB sent, "
        f"{report.bytes_received / 1e3:,.1f} kB received"
        for report in remote
    )


_MODEL_COLUMNS = ("written", "prefill", "decode", "catch-up", "GFLOP")


def _model_figures(report: ModelReport) -> tuple[str, ...]:
    """One model's figures, in the order of ``_MODEL_COLUMNS``."""
    return (
        str(report.written),
        f"{report.prefill_tokens} in {_seconds(report.prefill_s)}",
        f"{report.decode_tokens} in {_seconds(report.decode_s)}",
        f"{report.catchup_tokens} in {_seconds(report.catchup_s)}",
        f"{report.flops / 1e9:,.1f}",
    )


def stats_table(summary: Summary) -> Table:
    """Per model: tokens written, and tokens read (and seconds) in each phase, FLOPs."""
    table = Table(box=None, pad_edge=False)
    table.add_column("model")
    for column in _MODEL_COLUMNS:
        table.add_column(column, justify="right")
    for report in summary.models:
        table.add_row(report.role, *_model_figures(report))
    return table


def stats_lines(summary: Summary) -> list[str]:
    """The table's rows as lines, each figure named: for a terminal too narrow for the whole table, where
    rich would wrap figures and cut headers and figures short (``catch-…``, ``0.1…``)."""
    lines = []
    for report in summary.models:
        named = zip(_MODEL_COLUMNS, _model_figures(report), strict=True)
        lines.append(f"{report.role}: " + " · ".join(f"{column} {figure}" for column, figure in named))
    return lines


def mode_line(policy: PolicyOptions) -> str:
    """Which mode runs, and why: given, asked for by a switching option, or the default."""
    if policy.mode_given:
        return f"mode {policy.mode}"
    if policy.mode != DEFAULT_MODE:  # not given, not the default: resolve_mode's switching rule chose it
        return f"mode {policy.mode} (a switching option or a cascade turns the pair on)"
    return f"mode {policy.mode} (the default; --mode ead or any switching option turns the pair on)"


def print_lines(console: Console, text: str, style: str | None = None) -> None:
    """Lines of figures or words: on a terminal wrapped at spaces to its width (it would break them
    mid-word), in a pipe or a file each line whole."""
    console.print(text, style=style, soft_wrap=not console.is_terminal)


def print_stats(console: Console, summary: Summary) -> None:
    print_lines(console, stats_headline(summary))
    network = network_line(summary)
    if network:
        print_lines(console, network)
    table = stats_table(summary)
    unbounded = console.options.update_width(10_000)  # measured whole, not clamped to the console
    if console.measure(table, options=unbounded).maximum <= console.width:  # squeezed, rich cuts and wraps
        console.print(table)
    else:
        for line in stats_lines(summary):
            print_lines(console, line)

"""What every command prints besides its answer: progress lines and tables of figures."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from .. import shared_stderr
from ..errors import EadError, acted_on
from ..signals import main_thread_signals


def at_its_width(console: Console) -> Console:
    """``console`` at its terminal's own size: rich takes a terminal that says it is dumb (TERM=dumb) for
    80 columns whatever its width. Read when the console is made, as rich reads COLUMNS, which (with
    LINES) still says another size, as at any terminal."""
    if console.is_dumb_terminal:
        with contextlib.suppress(OSError):  # a stream that says it is a terminal but has no descriptor
            columns, lines = os.get_terminal_size(console.file.fileno())
            if columns:  # a pseudo-terminal no one gave a size says 0
                console.size = (console._width or columns, console._height or lines)  # rich's COLUMNS, LINES
    return console


_colour_off = False  # --no-color, given before the command or after it


def color_system() -> Literal["auto"] | None:
    """A console's colour system: --no-color or NO_COLOR (https://no-color.org) takes every style off,
    dim and bold too: rich's own reading of NO_COLOR drops colours alone, and a terminal that shows no
    colours may show the other escape codes as text."""
    return None if _colour_off or os.environ.get("NO_COLOR") else "auto"


def _drop_variables_that_say_nothing() -> None:
    """An empty FORCE_COLOR is none at all: it forces colour when present and not empty
    (https://force-color.org), and rich (and typer's help) had read it as "not a terminal", taking a
    terminal's styles and width off the notes and tables while the answer beside them, which ead
    colours itself, kept its colours. A COLUMNS of 0 gives no width, as a pseudo-terminal's 0 does
    (rich takes 80 columns for that one): rich had drawn every line at width 0, so --help and
    --stats printed nothing. Dropped before the first console is made; an empty NO_COLOR every reader
    already ignores."""
    if os.environ.get("FORCE_COLOR") == "":
        del os.environ["FORCE_COLOR"]
    if os.environ.get("COLUMNS", "").isdigit() and int(os.environ["COLUMNS"]) == 0:
        del os.environ["COLUMNS"]


_drop_variables_that_say_nothing()
# Lines and tables hold names and paths as they are: rich's markup would read '[backup]' in a folder's
# name as a style and drop it ('[/]' was a traceback), its emoji codes ':tiger:' in a file's as an emoji.
stderr = at_its_width(
    Console(stderr=True, highlight=False, markup=False, emoji=False, color_system=color_system())
)


def turn_colour_off() -> None:
    """--no-color, wherever given, or NO_COLOR: not one escape code in the answer, stderr's notes,
    figures and bars, or typer's help, which makes its own console (it had kept bold, dim and colours)."""
    from typer import rich_utils  # loaded by typer only to show help or an error

    global _colour_off
    _colour_off = True
    stderr._color_system = None  # rich takes a colour system only when a console is made
    rich_utils.COLOR_SYSTEM = None  # typer's own switch for its consoles


def say_progress(message: str) -> None:
    """A progress line (``loading NAME``, ``measuring NAME…``), spelled for the terminal: it names files."""
    stderr.print(spelled(message), style="dim", soft_wrap=True)


def say(line: str) -> None:
    """A server's line on stderr, at once (its log is read as it is written)."""
    shared_stderr.write_line(line)


def print_rows(columns: tuple[tuple[str, str, str], ...], rows: list[dict[str, Any]]) -> None:
    """Rows of figures as a table: (header, key, format spec) per column; None shows as '-'."""

    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else value if isinstance(value, str) else format(value, spec)

    print_figures(
        [header for header, _, _ in columns],
        [[cell(row[key], spec) for _, key, spec in columns] for row in rows],
    )


@contextlib.contextmanager
def live_progress(*columns: Any, disable: bool) -> Iterator[Any]:
    """rich's Progress on stderr, its refresh thread started with SIGINT and SIGTERM held back (signals.py).
    A Ctrl-C the kernel gave that thread would be run by Python at the main thread's next bytecode,
    wherever that is: in llama.cpp's abort callback during a batch, ctypes drops the KeyboardInterrupt
    ("Exception ignored") and the run goes on."""
    from rich.progress import Progress

    progress = Progress(*columns, console=stderr, disable=disable)
    with main_thread_signals():
        progress.start()
    try:
        yield progress
    finally:
        progress.stop()


@contextlib.contextmanager
def progress_bar() -> Iterator[tuple[Any, Any]]:
    """A spinner line on stderr that a long job updates with what it is doing."""
    from rich.progress import SpinnerColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), "{task.description}", TimeElapsedColumn())
    with live_progress(*columns, disable=not stderr.is_terminal) as progress:
        yield progress, progress.add_task("loading", total=None)


def print_figures(headers: list[str], rows: list[list[str]]) -> None:
    """A table of figures on stdout: first column left, figures right."""
    table = Table(box=None, pad_edge=False)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    print_table(table)


def print_table(table: Table) -> None:
    """On a terminal, fitted to its width; in a pipe or a file, whole, not squeezed into 80 columns."""
    console = at_its_width(Console(markup=False, emoji=False, color_system=color_system()))
    if not console.is_terminal:
        width = console.measure(table, options=console.options.update_width(1000)).maximum
        console = Console(width=width, markup=False, emoji=False)
    console.print(table)


def check_stdout(what: str) -> None:
    """Before any model loads: a stdout the shell closed (``>&-``, and Python's sys.stdout is None) has
    nowhere to put ``what``."""
    if sys.stdout is None:
        raise EadError(f"cannot write {what}: stdout is closed")


# A standard stream the shell opened the wrong way round (``1</dev/null``, ``0>file``): what its use says.
_WRONG_WAY = {
    1: (os.O_WRONLY, "cannot write the output: stdout is not open for writing"),
    0: (os.O_RDONLY, "cannot read the input: stdin is not open for reading"),
}


def misopened(fd: int) -> str | None:
    """Why stdin (0) or stdout (1) cannot serve, opened the wrong way round; None where it can, or is
    closed (Python's own stream is then None, which the commands say themselves)."""
    wanted, problem = _WRONG_WAY[fd]
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return None
    return None if mode in (wanted, os.O_RDWR) else problem


def silence_stdout() -> None:
    """After the reader went away: point stdout at /dev/null so Python's final flush cannot fail."""
    _to_devnull(sys.stdout.fileno())


def open_closed_stderr() -> None:
    """With stderr closed (``2>&-``), descriptor 2 becomes /dev/null and sys.stderr a stream on it: the
    notes are lost, the answers still come on stdout, and a failure says itself by the exit code. Python
    leaves sys.stderr None there, which generate failed on unseen (exit 1, no answer) and chat's notes
    took for stdout, among the answers; and the first file ead opened would take descriptor 2, where
    llama.cpp prints its logs."""
    if sys.stderr is None:
        _to_devnull(2)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (the process's stderr: never closed)


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def spelled(text: str) -> str:
    """``text`` for one line of a terminal: a character it would act on (``acted_on``: an escape typed
    or in a file's name, a newline, a bidi override) spelled as Python spells it (``\\x1b``), the rest
    as it is."""
    return "".join(repr(char)[1:-1] if acted_on(char) else char for char in text)

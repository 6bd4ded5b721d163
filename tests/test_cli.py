"""The ead command line on tiny models: output formats, pipes, and one clear line for every bad input."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from ead_cli.cli import app, refuse_help_without_stdout
from ead_cli.cli.output import say_progress
from ead_cli.cli.render import spell_controls
from ead_cli.errors import EadError

EAD = str(Path(sys.executable).with_name("ead"))
ANSI = "\x1b["
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")  # the colours ead writes


# ead in a child whose flock fails as on a filesystem without locks (NFS without its lock daemon, some FUSE
# ones: ENOLCK): none is at hand, so flock alone is made to raise as theirs does. ``python -c NO_LOCKS ARGS``
NO_LOCKS = """
import errno
import fcntl
import sys
from ead_cli.cli import main


def no_locks(*args):
    raise OSError(errno.ENOLCK, "No locks available")


fcntl.flock = no_locks
main(sys.argv[1:])
"""


def ead(
    *args: str, stdin: str | bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the installed `ead` script for real."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FORCE_COLOR", None) if env is None or "FORCE_COLOR" not in env else None
    return subprocess.run([EAD, *args], input=data, capture_output=True, env=full_env, timeout=120)


def pair_args(pair: tuple[Path, Path]) -> list[str]:
    """Tiny models gain nothing from threads, and a 2-thread llama.cpp barrier on a busy 2-core machine
    waits ~0.2 s per token for a descheduled thread: one thread keeps these tests fast anywhere."""
    return ["--small", str(pair[0]), "--large", str(pair[1]), "--threads", "1"]


# what generate says of --small in the default mode, where the large model alone writes
SMALL_UNUSED = (
    b"note: the default mode (--mode large) leaves --small unused (--mode ead switches between the pair)\n"
)


def large_args(pair: tuple[Path, Path]) -> list[str]:
    """The pair's large model alone, as the default mode runs it, one thread: a test of something else
    reads no note that a small model named goes unused."""
    return ["--large", str(pair[1]), "--threads", "1"]


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.stdout == b""
    return lines[0]


def interruptible() -> None:
    """For children these tests send Ctrl-C: a shell's background job (nohup, CI runners) starts them
    with SIGINT ignored, and Python then installs no handler; restore the default a terminal gives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_to_the_end(process: subprocess.Popen) -> tuple[bytes, bytes]:
    """The rest of stdout and all of stderr. Not communicate(): it reads the raw pipes and so skips what
    an earlier readline() already pulled into the stdout buffer."""
    assert process.stdout is not None and process.stderr is not None
    rest = process.stdout.read()
    err = process.stderr.read()  # a few lines of stats: it cannot fill the pipe while stdout drains
    process.wait(timeout=60)
    return rest, err


def test_jsonl_has_one_object_per_token_and_a_summary(tiny_pair: tuple[Path, Path]) -> None:
    result = ead(
        "generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "20", "--format", "jsonl", "hi"
    )
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.decode().splitlines()]
    tokens, summary = objects[:-1], objects[-1]
    assert len(tokens) == 20
    assert all(t["type"] == "token" for t in tokens)
    assert set(tokens[0]) == {"type", "index", "token", "text", "model", "entropy", "rolling", "tau"}
    assert {t["tau"] for t in tokens} == {3.0}
    assert [t["index"] for t in tokens] == list(range(20))
    assert summary["type"] == "summary"
    assert summary["generated"] == 20 and summary["finish_reason"] == "length"
    large = sum(t["model"] == "large" for t in tokens)
    assert summary["large_share"] == pytest.approx(large / 20)
    assert [m["role"] for m in summary["models"]] == ["small", "large"]


def test_plain_text_skips_unneeded_entropies_with_the_same_answer(tiny_pair: tuple[Path, Path]) -> None:
    """Plain text measures only the entropies a decision needs (Decoder(entropy="needed")), JSON lines
    every one: the same tokens and the same switches, and every entropy JSON lines shows is a number."""
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "40", "--stats", "hi"]
    jsonl = ead(*args, "--format", "jsonl")
    plain = ead(*args, "--format", "text")
    assert jsonl.returncode == 0 and plain.returncode == 0, (jsonl.stderr, plain.stderr)
    objects = [json.loads(line) for line in jsonl.stdout.decode().splitlines()]
    tokens, summary = objects[:-1], objects[-1]
    assert all(isinstance(t["entropy"], float) and math.isfinite(t["entropy"]) for t in tokens)
    large = sum(t["model"] == "large" for t in tokens)
    assert 0 < large < len(tokens)  # the threshold decided something on both sides
    assert plain.stdout.decode() == "".join(t["text"] for t in tokens) + "\n"  # the line ended
    share = re.search(r"large\s.*?(\d+\.\d)%", plain.stderr.decode())
    assert share is not None, plain.stderr.decode()
    assert float(share.group(1)) == pytest.approx(100 * summary["large_share"], abs=0.06)


def test_piped_output_is_plain_text_and_colour_is_opt_in(tiny_pair: tuple[Path, Path]) -> None:
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "30", "--format", "text", "hi"]
    plain = ead(*args)
    assert plain.returncode == 0
    assert ANSI not in plain.stdout.decode() and plain.stderr == b""
    coloured = ead(*args, env={"FORCE_COLOR": "1"})
    assert ANSI in coloured.stdout.decode()
    assert "■ small" in coloured.stderr.decode() and "■ large" in coloured.stderr.decode()  # the legend
    stripped = (
        coloured.stdout.decode().replace("\x1b[36m", "").replace("\x1b[1;33m", "").replace("\x1b[0m", "")
    )
    assert stripped == plain.stdout.decode()
    no_color = ead(*args, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert no_color.stdout == plain.stdout
    flag = ead(*args, "--no-color", env={"FORCE_COLOR": "1"})
    assert flag.stdout == plain.stdout
    before = ead("--no-color", *args, env={"FORCE_COLOR": "1"})  # git-style, before the command
    assert before.stdout == plain.stdout and before.stderr == plain.stderr


def at_a_terminal(*args: str, env: dict[str, str] | None = None, columns: int = 80, stream: int = 1) -> bytes:
    """What ``ead`` writes to a real terminal (a pty ``columns`` wide) on ``stream``, stdout (1) or
    stderr (2), the other going to /dev/null; the terminal's own CR LF for each newline read back as LF."""
    unset = ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    script = f'exec "$@" {3 - stream}>/dev/null'
    child = pexpect.spawn("/bin/sh", ["-c", script, "sh", EAD, *args], env=env, dimensions=(24, columns))
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0, child.before
    return child.before.replace(b"\r\n", b"\n")


def test_no_colour_means_no_escape_code_on_stderr_either(tiny_pair: tuple[Path, Path]) -> None:
    """--no-color and NO_COLOR had left stderr styled (the stats table's header bold, the notes dim): with
    colour off, not one escape code there, the same text."""
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "4", "--stats", "hi"]
    styled = at_a_terminal(*args, env={"TERM": "xterm"}, stream=2).decode()
    assert ANSI in styled  # what the test would see
    no_flag: tuple[str, ...] = ()
    for before, after, env in [
        (no_flag, ("--no-color",), {}),
        (("--no-color",), no_flag, {}),  # git-style, before the command
        (no_flag, no_flag, {"NO_COLOR": "1"}),
    ]:
        shown = at_a_terminal(*before, *args, *after, env={"TERM": "xterm", **env}, stream=2).decode()
        assert "\x1b" not in shown
        assert shown.splitlines()[:2] == re.sub(r"\x1b\[[0-9;]*m", "", styled).splitlines()[:2]


def test_no_colour_means_no_escape_code_in_a_table_on_stdout() -> None:
    """NO_COLOR had left a table's header on stdout bold (ead models list, bench report, depth eval):
    rich's own reading of it drops colours alone. ead --no-color, before any command, does the same."""
    styled = at_a_terminal("models", "list", env={"TERM": "xterm"}).decode()
    assert ANSI in styled
    shown = at_a_terminal("models", "list", env={"TERM": "xterm", "NO_COLOR": "1"}).decode()
    assert "\x1b" not in shown
    assert shown == ANSI_CODES.sub("", styled)
    assert at_a_terminal("--no-color", "models", "list", env={"TERM": "xterm"}).decode() == shown


def test_with_colour_off_help_has_no_escape_code() -> None:
    """typer's help makes its own console: NO_COLOR and --no-color had left it bold, dim and coloured."""
    styled = at_a_terminal("generate", "--help", env={"TERM": "xterm"}, columns=120).decode()
    assert ANSI in styled
    for args, env in [
        (("generate", "--help"), {"NO_COLOR": "1"}),
        (("--no-color", "generate", "--help"), {}),
        (("generate", "--no-color", "--help"), {}),
    ]:
        shown = at_a_terminal(*args, env={"TERM": "xterm", **env}, columns=120).decode()
        assert shown == ANSI_CODES.sub("", styled), args


def test_an_empty_colour_variable_is_no_variable(tiny_pair: tuple[Path, Path]) -> None:
    """FORCE_COLOR and NO_COLOR count when present and not empty (force-color.org, no-color.org): rich had
    read an empty FORCE_COLOR as "not a terminal", so a table and the stats lost their styles and the
    terminal's width (a 40-column table unfitted), while the answer beside them stayed coloured."""
    for columns in (40, 80):
        styled = at_a_terminal("models", "list", env={"TERM": "xterm"}, columns=columns)
        assert ANSI.encode() in styled
        for env in ({"FORCE_COLOR": ""}, {"NO_COLOR": ""}):
            assert at_a_terminal("models", "list", env={"TERM": "xterm", **env}, columns=columns) == styled
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "4", "--stats", "hi"]
    notes = at_a_terminal(*args, env={"TERM": "xterm", "FORCE_COLOR": ""}, stream=2).decode()
    assert ANSI_CODES.search(notes), notes
    plain = spell_controls(ead(*args).stdout.decode())
    assert at_a_terminal(*args, env={"TERM": "dumb", "FORCE_COLOR": ""}).decode() == plain


@pytest.mark.parametrize("command", [("models", "list"), ("bench", "report", "x")])
def test_an_option_of_ead_itself_after_a_command_that_lacks_it_says_where(command: tuple[str, ...]) -> None:
    """--no-color is ead's own, and generate's, chat's and depth generate's: after another command it had
    been only 'No such option', not where it is taken."""
    path = " ".join(command[:2])
    assert_one_line_error(
        ead(*command, "--no-color"),
        2,
        f"--no-color is an option of ead itself: it goes before the command, 'ead --no-color {path} ...'",
    )


@pytest.mark.parametrize("option", ["--version", "--install-completion", "--show-completion"])
def test_an_option_of_ead_itself_that_runs_alone_is_not_put_before_a_command(option: str) -> None:
    """Each acts and exits, running no command: after one it had been told to go before it, 'ead
    --version generate ...', where the command would never run."""
    assert_one_line_error(
        ead("generate", option),
        2,
        f"{option} is an option of ead itself, which runs no command: 'ead {option}' alone",
    )


def test_control_characters_in_an_answer_are_spelled_out_at_a_terminal(tiny_pair: tuple[Path, Path]) -> None:
    """A model's text cannot drive the terminal: its control characters (here a backspace, which would
    rub out the character before it, and ^A ^D ^E) show as less shows them; a pipe gets them as written."""
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "200", "tell me"]
    piped = ead(*args).stdout.decode()
    assert {"\x08", "\x01", "\x04", "\x05"} <= set(piped)
    spelled = piped.replace("\x08", "^H").replace("\x01", "^A").replace("\x04", "^D").replace("\x05", "^E")
    assert at_a_terminal(*args, "--no-color").decode() == spelled
    coloured = ANSI_CODES.sub("", at_a_terminal(*args, env={"TERM": "xterm"}).decode())
    assert coloured == spelled
    assert spell_controls("\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J\r\x7f\x9b\tok\n") == (
        "^[]52;c;ZWNobyBoaQ==^G^[[2J^M^?<U+009B>\tok\n"
    )


def test_json_lines_at_a_terminal_escape_the_controls_json_leaves_raw() -> None:
    """JSON escapes C0 controls, not DEL or C1 ones (U+0080-U+009F; some terminals read U+009B as ESC [):
    at a terminal a token's line carries them as \\u escapes, the same JSON; a pipe gets them raw. So
    for ead depth generate's lines."""
    from ead_cli.cli.depth import DepthJsonlRenderer
    from ead_cli.cli.render import JsonlRenderer
    from ead_cli.decoder import TokenEvent
    from ead_cli.depth.model import DepthEvent

    text = "a\x9b2J\x7f\x85é"
    renderers = [
        (JsonlRenderer, TokenEvent(0, 1, text, "small", 1.0, 1.0, None)),
        (DepthJsonlRenderer, DepthEvent(0, 1, text, 4, ((4, 0.5),))),
    ]
    for (renderer, event), opener in itertools.product(renderers, (os.openpty, os.pipe)):
        reader, writer = opener()
        with open(writer, "w", encoding="utf-8") as out:
            renderer(out).event(event)
        line = os.read(reader, 4096).replace(b"\r\n", b"\n")  # a terminal's own CR LF
        os.close(reader)
        assert json.loads(line)["text"] == text
        raw = any(control.encode() in line for control in "\x9b\x7f\x85")
        assert raw == (opener is os.pipe), line


def test_a_dumb_terminal_gets_no_colour_unless_forced(tiny_pair: tuple[Path, Path]) -> None:
    """A dumb terminal as rich reads TERM (dumb or unknown, in any case): TERM=unknown had coloured the
    answer, while --stats' figures beside it were plain."""
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "30", "hi"]
    plain = spell_controls(ead(*args).stdout.decode())
    for term in ("dumb", "unknown", "DUMB"):
        assert at_a_terminal(*args, env={"TERM": term}).decode() == plain
    forced = at_a_terminal(*args, env={"TERM": "dumb", "FORCE_COLOR": "1"}).decode()
    assert ANSI in forced and ANSI_CODES.sub("", forced) == plain


def test_a_terminal_size_of_zero_is_no_size(tiny_pair: tuple[Path, Path]) -> None:
    """COLUMNS=0 says no width, as a pseudo-terminal's 0 does (rich takes 80 for that one): rich had
    drawn every line at width 0, so ead --help printed one empty line and --stats nothing at all."""
    at_80 = ead("--help", stdin=b"", env={"COLUMNS": "80"}).stdout
    assert b"generate" in at_80
    for zero in ("0", "00"):
        assert ead("--help", stdin=b"", env={"COLUMNS": zero}).stdout == at_80
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "4", "--stats", "hi"]
    figures = ead(*args, stdin=b"", env={"COLUMNS": "0"}).stderr.decode()
    assert "large share" in figures and "written" in figures, figures


@pytest.mark.parametrize("columns", [40, 50])
def test_stats_fit_a_narrow_terminal_without_cutting_a_figure(
    tiny_pair: tuple[Path, Path], columns: int
) -> None:
    """At 40 columns the table's columns cannot fit (rich had cut them to 'writ…' and '0.1…'), nor whole at
    50 (rich had wrapped its figures and cut 'catch-up' to 'catch-…'): each model's figures are a line of
    named figures instead, and every line is wrapped at spaces, not mid-word."""
    args = ["generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "30", "--stats", "hi"]
    narrow = ANSI_CODES.sub("", at_a_terminal(*args, columns=columns, stream=2).decode())
    lines = narrow.splitlines()
    assert "…" not in narrow and max(map(len, lines)) <= columns, narrow
    joined = " ".join(line.rstrip() for line in lines)  # a word broken across two lines: two words here
    assert "mode ead (a switching option or a cascade turns the pair on) 30 tokens (length)" in joined
    figures = r"[\d.]+% · switches \d+ param cost [\d.]+ · [\d.]+ GFLOP · [\d.]+s wall · [\d.]+ tok/s"
    assert re.search(rf"30 tokens \(length\), prompt \d+ · large share {figures} ", joined), narrow
    for role in ("small", "large"):
        phases = " · ".join(rf"{phase} \d+ in [\d.]+s" for phase in ("prefill", "decode", "catch-up"))
        assert re.search(rf"{role}: written \d+ · {phases} · GFLOP [\d.]+", joined), narrow
    wide = ANSI_CODES.sub("", at_a_terminal(*args, columns=200, stream=2).decode())
    assert re.search(r"^model +written +prefill +decode +catch-up +GFLOP$", wide, re.MULTILINE), wide
    assert "small: written" not in wide


def test_prompt_from_stdin_equals_the_argument(tiny_pair: tuple[Path, Path]) -> None:
    base = ["generate", *pair_args(tiny_pair), "--max-tokens", "10"]
    argument = ead(*base, "tell me")
    assert ead(*base, "-", stdin="tell me").stdout == argument.stdout
    assert ead(*base, stdin="tell me").stdout == argument.stdout
    # a file saved as "UTF-8 with BOM": the mark had gone to the model as three more prompt tokens
    assert ead(*base, "-", stdin="\ufefftell me").stdout == argument.stdout


def test_an_output_encoding_without_the_answers_characters(tiny_pair: tuple[Path, Path]) -> None:
    """PYTHONIOENCODING=ascii (or a Latin-1 locale): a character the output's encoding lacks was a
    UnicodeEncodeError traceback mid-answer. Text shows it as '?'; JSON lines are UTF-8 whatever the
    locale (RFC 8259), so they lose nothing."""
    args = ["generate", *large_args(tiny_pair), "--max-tokens", "20", "hi"]

    def token_lines(result: subprocess.CompletedProcess) -> list[str]:
        assert (result.returncode, result.stderr) == (0, b"")
        return result.stdout.decode("utf-8").splitlines()[:-1]  # the summary has timings

    utf8 = token_lines(ead(*args, "--format", "jsonl", env={"PYTHONIOENCODING": "utf-8"}))
    answer = "".join(json.loads(line)["text"] for line in utf8)
    assert not answer.isascii()
    assert token_lines(ead(*args, "--format", "jsonl", env={"PYTHONIOENCODING": "ascii"})) == utf8
    text = ead(*args, "--format", "text", env={"PYTHONIOENCODING": "ascii"})
    assert (text.returncode, text.stderr) == (0, b"")
    assert text.stdout == answer.encode("ascii", "replace") + b"\n"


def test_stats_go_to_stderr(tiny_pair: tuple[Path, Path]) -> None:
    result = ead("generate", *pair_args(tiny_pair), "--tau", "3", "--max-tokens", "25", "--stats", "hi")
    err = result.stderr.decode()
    assert result.returncode == 0
    assert "25 tokens (length)" in err and "large share" in err and "GFLOP" in err and "catch-up" in err


def test_max_tokens_zero_prints_nothing(tiny_pair: tuple[Path, Path]) -> None:
    result = ead("generate", *pair_args(tiny_pair), "--max-tokens", "0", "hi")
    assert result.returncode == 0
    assert result.stdout == b"\n"


def test_a_closed_pipe_ends_quietly(tiny_pair: tuple[Path, Path]) -> None:
    args = " ".join([EAD, "generate", *large_args(tiny_pair), "--max-tokens", "1500", "--ctx", "2048", "hi"])
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {args} | head -c 10 > /dev/null"], capture_output=True, timeout=120
    )
    assert result.returncode == 141
    assert result.stderr == b""


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["generate", "--help"], ["models", "list"], ["models", "list", "--json"]],
)
def test_any_commands_output_to_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    """The reader is gone before the first write (`ead models list | true`): 141 and nothing said, as
    generate does; typer's own handling of the pipe made it a bare exit 1."""
    result = ead_to_a_closed_pipe(*args)
    assert (result.returncode, result.stderr) == (141, b"")


def ead_to_a_closed_pipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ead with stdout a pipe whose reader is gone before the first write (``ead ... | true``)."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "wb") as closed:
        environment = {**os.environ, **(env or {})}
        return subprocess.run(
            [EAD, *args], stdout=closed, stderr=subprocess.PIPE, env=environment, timeout=300
        )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("output_format", ["text", "jsonl"])
def test_a_full_disk_is_one_line(tiny_pair: tuple[Path, Path], output_format: str) -> None:
    """Every write to /dev/full fails with ENOSPC, as on a full disk: one line, not a traceback, and not
    Python's own complaint when the text still buffered fails again at exit."""
    args = [EAD, "generate", *large_args(tiny_pair), "--max-tokens", "8", "--format", output_format, "hi"]
    with open("/dev/full", "wb") as full:
        result = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, timeout=120)
    assert result.stderr.decode() == "error: cannot write the answer: No space left on device\n"
    assert result.returncode == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("args", [["--version"], ["models", "list", "--json"], ["generate", "--help"]])
def test_any_commands_output_to_a_full_disk_is_one_line(args: list[str]) -> None:
    """Commands that print without a model (rich tables, typer's help, the version) fail alike."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run([EAD, *args], stdout=full, stderr=subprocess.PIPE, timeout=120)
    assert result.stderr.decode() == "error: cannot write the output: No space left on device\n"
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("args", "redirect", "message"),
    [
        (["models", "list"], "1</dev/null", "cannot write the output: stdout is not open for writing"),
        (["--version"], "1</dev/null", "cannot write the output: stdout is not open for writing"),
        (["chat", "--threads", "1"], "0>/dev/null", "cannot read the input: stdin is not open for reading"),
    ],
)
def test_a_standard_stream_opened_the_wrong_way_is_one_line(
    tiny_pair: tuple[Path, Path], args: list[str], redirect: str, message: str
) -> None:
    """stdout opened for reading (``1</dev/null``) or stdin for writing (``0>file``): each read or write
    fails with EBADF, which had been a traceback in any command but generate."""
    models = pair_args(tiny_pair) if args[0] == "chat" else []
    line = f"{shlex.join([EAD, *args, *models])} {redirect}"
    result = subprocess.run(["bash", "-c", line], capture_output=True, timeout=120)
    assert (result.returncode, result.stderr.decode()) == (1, f"error: {message}\n")


def test_closed_standard_streams(tiny_pair: tuple[Path, Path]) -> None:
    """A stream the shell closed is None in Python: a prompt given as an argument needs no stdin; where a
    command needs the stream, one line before any model loads."""

    def closed(command: str, *args: str, redirect: str) -> subprocess.CompletedProcess:
        line = shlex.join([EAD, command, *pair_args(tiny_pair), "--max-tokens", "4", *args])
        return subprocess.run(["bash", "-c", f"{line} {redirect}"], capture_output=True, timeout=120)

    answer = ead("generate", *pair_args(tiny_pair), "--max-tokens", "4", "hi")
    without_stdin = closed("generate", "hi", redirect="<&-")
    assert (without_stdin.returncode, without_stdin.stdout) == (0, answer.stdout)
    for command, args, redirect, code, fragment in [
        ("generate", (), "<&-", 2, "no prompt: stdin is closed"),
        ("generate", ("-",), "<&-", 2, "no prompt: stdin is closed"),
        ("generate", ("hi",), ">&-", 1, "cannot write the answer: stdout is closed"),
        ("generate", ("--format", "jsonl", "hi"), ">&-", 1, "cannot write the answer: stdout is closed"),
        ("chat", (), "<&-", 2, "ead chat reads its turns from stdin, which is closed"),
        ("chat", (), ">&- < /dev/null", 1, "cannot write the conversation: stdout is closed"),
        # a calibration that saves nothing leaves only its table: it ran and printed nothing, exit 0
        ("calibrate", (), ">&-", 1, "cannot write the calibrated taus: stdout is closed"),
    ]:
        assert_one_line_error(closed(command, *args, redirect=redirect), code, fragment)
    listed = subprocess.run(["bash", "-c", f"{EAD} models list >&-"], capture_output=True, timeout=120)
    assert_one_line_error(listed, 1, "cannot write the models: stdout is closed")


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--version"], "the version"),
        (["--no-color", "depth", "eval", "--help"], "the help"),
    ],
)
def test_help_and_version_with_stdout_closed_say_so(args: list[str], what: str) -> None:
    """``ead --help >&-`` had printed nothing, exit 0: with nowhere to show it, one line, as every command
    says it. Every command's help: ``test_every_commands_help_with_stdout_closed_says_so``."""
    line = f"{shlex.join([EAD, *args])} >&-"
    closed = subprocess.run(["bash", "-c", line], capture_output=True, timeout=120)
    assert_one_line_error(closed, 1, f"cannot write {what}: stdout is closed")


def test_the_help_refused_is_the_help_option_click_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The help option wrapped is the one click makes when it runs a command: each command's context made
    as click makes it (the command's context class and settings, its parent's), and click keeps the first
    help option it makes. A bare click.Context had made a '--help' alone, so '-h', which an app's settings
    give every command, was 'No such option: -h' with stdout closed."""
    two = typer.Typer(context_settings={"help_option_names": ["-h", "--help"]})
    two.command("first")(lambda: None)
    two.command("second")(lambda: None)
    command = typer.main.get_command(two)
    refuse_help_without_stdout(command)
    monkeypatch.setattr(sys, "stdout", None)  # what Python makes of a stdout the shell closed
    for args in (["-h"], ["second", "-h"], ["second", "--help"]):
        with pytest.raises(EadError, match=r"^cannot write the help: stdout is closed$"):
            command.main(args=args, prog_name="two", standalone_mode=False)


RUN_WITHOUT_CLICK = (
    "import sys, typer.main; sys.modules.setdefault('click', None); import ead_cli.cli; ead_cli.cli.main()"
)


def test_the_command_line_needs_no_click_beside_typer() -> None:
    """typer 0.2x carries its own click and installs none: ead had imported click, there only because
    uvicorn (the serve extra) brings it, so without that extra every command, --version too, was a
    ModuleNotFoundError traceback. click is hidden unless typer itself imports it (an older typer)."""
    version = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_CLICK, "--version"], capture_output=True, timeout=120
    )
    assert (version.returncode, version.stderr) == (0, b"")
    assert version.stdout.startswith(b"ead ")
    line = f"{shlex.join([sys.executable, '-c', RUN_WITHOUT_CLICK, 'models', 'pull', '--help'])} >&-"
    closed = subprocess.run(["bash", "-c", line], capture_output=True, timeout=120)
    assert_one_line_error(closed, 1, "cannot write the help: stdout is closed")


def test_a_closed_stderr_loses_the_notes_not_the_answers(tiny_pair: tuple[Path, Path]) -> None:
    """With stderr closed (``2>&-``) Python's sys.stderr is None: generate failed on it with a traceback
    no one saw (exit 1, no answer), and chat wrote its notes and summaries among the answers on stdout.
    The notes are lost; the answers come on stdout as ever, and a failure says itself by the exit code."""

    def closed_stderr(command: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        line = shlex.join([EAD, command, *pair_args(tiny_pair), "--max-tokens", "4", *args])
        return subprocess.run(["bash", "-c", f"{line} 2>&-"], input=stdin, capture_output=True, timeout=120)

    for args in [("hi",), ("--tau", "3", "--stats", "hi")]:
        answer = ead("generate", *pair_args(tiny_pair), "--max-tokens", "4", *args)
        result = closed_stderr("generate", *args)
        assert (result.returncode, result.stdout, result.stderr) == (0, answer.stdout, b"")
    refused = closed_stderr("generate", "--tau", "-1", "hi")
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, b"", b"")
    chatted = ead("chat", *pair_args(tiny_pair), "--max-tokens", "4", stdin="hi\n/stats\nho\n")
    result = closed_stderr("chat", stdin=b"hi\n/stats\nho\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, chatted.stdout, b"")
    assert len(result.stdout.splitlines()) == 2  # the two answers, nothing else


@pytest.mark.parametrize(
    ("option", "choices"),
    [
        ("--mode", "'ead', 'small', 'large', 'spec'"),
        ("--policy", "'gate', 'ead', 'lookahead'"),
        ("--format", "'text', 'jsonl'"),
    ],
)
def test_a_value_not_among_the_choices_is_said_without_pydantic_words(option: str, choices: str) -> None:
    """typer checks a choice through pydantic where it is installed (ead serve's extra), whose 'Value
    error, ' had led the line ("Invalid value for '--mode': Value error, 'bogus' is not one of..."):
    the words of a library, not the user's mistake."""
    line = assert_one_line_error(ead("generate", option, "bogus", "hi"), 2)
    assert line == (
        f"error: Invalid value for '{option}': 'bogus' is not one of {choices}. (see 'ead generate --help')"
    )


def test_a_long_bad_value_is_echoed_cut_to_a_readable_length(tiny_pair: tuple[Path, Path]) -> None:
    """A 100 kB argument had been echoed whole in its error line (ours and typer's alike): cut to 80
    printed characters, its full length said."""
    junk = "x" * 100_000
    cut = f"{junk[:80]!r}... (100000 characters)"
    cut_longer = f"{junk[:80]!r}... (100001 characters)"
    escapes = "\x1b" * 200
    escapes_cut = f"{escapes[:20]!r}... (200 characters)"
    pair = pair_args(tiny_pair)
    for args, code, fragment in [
        ([*pair, "--tau", junk], 2, f"one per cascade level, got {cut}"),
        ([*pair, "--policy", junk], 2, f"Invalid value for '--policy': {cut} is not one of"),
        ([*pair, f"--mode={junk}"], 2, f"Invalid value for '--mode': {cut} is not one of"),
        ([*pair, f"--{junk}"], 2, f"No such option: {'--' + junk[:78]!r}... (100002 characters)"),
        (["--large", str(tiny_pair[1]), "--small", junk], 1, f"unknown model alias {cut}"),
        (["--models", f"{junk},"], 2, f"got {cut_longer}"),
        # a long argument inside the echoed one is not cut there: the echo is cut once, its length its own
        ([*pair, "--system", junk, "--mode", f"{junk}b"], 2, f"{cut_longer} is not one of"),
        # cut where it prints: an escape prints as four characters, and 200 had been an 800-character echo
        ([*pair, "--tau", escapes], 2, f"got {escapes_cut}"),
        ([*pair, "--policy", escapes], 2, f"'--policy': {escapes_cut} is not one of"),
        ([*pair, "--policy", escapes[:30]], 2, f"'--policy': {escapes[:20]!r}... (30 characters) is not"),
    ]:
        line = assert_one_line_error(ead("generate", *args, "hi"), code, fragment)
        assert len(line) < 300, line


def test_typer_runner_generates(tiny_pair: tuple[Path, Path]) -> None:
    result = CliRunner().invoke(
        app, ["generate", *pair_args(tiny_pair), "--max-tokens", "5", "--format", "jsonl", "x"]
    )
    assert result.exit_code == 0
    assert len(result.stdout.splitlines()) == 6


def test_unknown_alias_suggests_close_matches() -> None:
    line = assert_one_line_error(ead("generate", "--small", "qc05b", "hi"), 1, "unknown model alias 'qc05b'")
    assert "qc0.5b" in line


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing.gguf", None, "model file not found"),
        ("", None, "directory"),
        ("empty.gguf", b"", "empty"),
        ("text.gguf", b"hello, not a model", "not a GGUF file"),
        ("spaced ünïcode/model file.gguf", b"GGUF-but-cut", "could not load"),
    ],
)
def test_bad_model_files(
    tmp_path: Path, tiny_large: Path, name: str, content: bytes | None, fragment: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    small = ("--small", str(path), "--large", str(tiny_large))
    assert_one_line_error(ead("generate", *small, "--mode", "ead", "hi"), 1, fragment)
    large = ("--small", str(tiny_large), "--large", str(path))
    assert_one_line_error(ead("generate", *large, "hi"), 1, fragment)  # the default mode loads it alone


def test_a_truncated_model_is_refused(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    data = tiny_pair[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(
        ead("generate", "--small", str(cut), "--large", str(tiny_pair[1]), "--mode", "ead", "hi"),
        1,
        "could not load",
        "cut.gguf",
    )


def test_the_default_mode_loads_the_large_model_alone(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    """The large model writes every token of the default mode, so the small one is never loaded: a small
    file that would fail to load does not matter there (a name that cannot resolve still does)."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_pair[0].read_bytes()[:4096])
    stats = ("--stats", "--max-tokens", "6", "hi")

    def model_rows(result: subprocess.CompletedProcess) -> list[list[str]]:
        assert result.returncode == 0, result.stderr
        table = result.stderr.decode().split("model  written", 1)[1].splitlines()[1:]
        return [row.split()[:2] for row in table if row.strip()]

    assert model_rows(ead("generate", *pair_args((cut, tiny_pair[1])), *stats)) == [["large", "6"]]
    missing = ead("generate", *pair_args((tmp_path / "gone.gguf", tiny_pair[1])), "hi")
    assert_one_line_error(missing, 1, "model file not found")
    both = model_rows(ead("generate", *pair_args(tiny_pair), "--mode", "ead", *stats))
    assert [row[0] for row in both] == ["small", "large"]


def test_mismatched_tokenizers_are_refused(tiny_small: Path, tiny_other_vocab: Path) -> None:
    result = ead("generate", *pair_args((tiny_small, tiny_other_vocab)), "--mode", "ead", "hi")
    assert_one_line_error(result, 1, "do not share a tokenizer", "token 258", "'er'", "'re'")


def test_offline_with_nothing_cached(tmp_path: Path, tiny_small: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "EAD_CACHE": str(tmp_path / "ead")}
    result = ead("generate", "--small", str(tiny_small), "--large", "q14b", "hi", env=env)
    line = assert_one_line_error(result, 1, "'q14b' is not cached and HF_HUB_OFFLINE=1 keeps ead off the")
    assert line.endswith("pass the file's path in place of 'q14b'")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--temp", "-1"], "--temp must be at least 0"),
        (["--temp", "inf"], "--temp must be at least 0 and finite, got inf"),  # had sampled uniformly
        (["--temp", "warm"], "Invalid value for '--temp'"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--min-p", "-0.1"], "--min-p must be in [0, 1]"),
        (["--top-k", "-1"], "--top-k must be at least 0"),
        (["--seed", "-1"], "--seed must be in"),
        (["--max-tokens", "-2"], "--max-tokens must be -1 (no limit) or at least 0, got -2"),
        (["--ctx", "8"], "--ctx must be at least 16"),
        (["--threads", "0"], "--threads must be at least 1"),
        # past the threads a process may start (ulimit -u), llama.cpp segfaulted; past 2**31, it wrapped
        (["--threads", "100000"], "--threads must be at most 512 (llama.cpp's most), got 100000"),
        (["--threads", "3000000000"], "--threads must be at most 512 (llama.cpp's most), got 3000000000"),
        (["--tau", "-0.5"], "--tau must be at least 0"),
        (["--window", "0"], "--window must be at least 1"),
        (["--window", "99999999999999999999999"], "--window must be at most 1048576 steps"),
        (["--policy", "ead", "--min-run", "-1"], "--min-run must be at least 0"),
        (["--burst", "0"], "--burst must be a count of at least 1"),
        (["--burst", "often"], "--burst must be a count, 'line' or 'adaptive'"),
        (["--pattern", "(x"], "is not a valid regular expression"),
        (["--pattern", ""], "pattern '' matches the empty text"),
        (["--tau-range", "1"], "--tau-range must be LOW:HIGH"),
        (["--tau-range", "2:1"], "--tau-range must satisfy 0 <= low < high"),
        (["--tau-range", "0:inf"], "both finite, got 0.0:inf"),  # --tau inf is refused too
        (["--mode", "spec", "--draft", "0"], "--draft must be in [1, 64]"),
        (["--mode", "fast"], "Invalid value for '--mode'"),
        (["--switch-point", "during"], "Invalid value for '--switch-point'"),
        (["--format", "xml"], "Invalid value for '--format'"),
        # a value out of its range is refused in a mode that would leave it unused, too
        (["--mode", "large", "--tau", "-1"], "--tau must be at least 0, got -1"),
        (["--mode", "large", "--tau", "1,2,3"], "2 models take one threshold, got 3"),
        (["--mode", "large", "--window", "0"], "--window must be at least 1, got 0"),
        (["--mode", "large", "--burst", "0"], "--burst must be a count of at least 1"),
        (["--mode", "small", "--min-run", "-5"], "--min-run must be at least 0, got -5"),
        (["--mode", "small", "--tau-range", "2:1"], "--tau-range must satisfy 0 <= low < high"),
        (["--mode", "small", "--pattern", "(x"], "is not a valid regular expression"),
        (["--mode", "ead", "--policy", "gate", "--min-run", "-7"], "--min-run must be at least 0, got -7"),
        (["--mode", "spec", "--tau", "-1"], "--tau must be at least 0, got -1"),
        (["--draft", "-3"], "--draft must be in [1, 64], got -3"),
        (["--lookup-draft", "0"], "--lookup-draft must be in [1, 64], got 0"),
        (["--lookup", "65"], "--lookup must be in [0, 64] tokens (0: off), got 65"),
        (["--verify", "2"], "--verify must be in (0, 1], got 2.0"),
        (["--n-gpu-layers", "-5"], "--n-gpu-layers must be -1 (every layer) or at least 0, got -5"),
        # past llama.cpp's 32-bit fields a value wrapped: 2**32 + 16 was a context of 16 (an abort in
        # llama.cpp), 2**32 layers none offloaded, top-k 2**32 + 2 top-k 2
        (["--ctx", "4294967312"], "--ctx must be at most 2147483647 (llama.cpp's 32 bits), got 4294967312"),
        (["--n-gpu-layers", "4294967296"], "--n-gpu-layers must be at most 2147483647 (llama.cpp's 32 bits)"),
        (["--top-k", "4294967298"], "--top-k must be at most 2147483647 (llama.cpp's 32 bits), got 42949"),
        # a socket's timeout takes no more: inf was an OverflowError traceback at the first request
        (["--remote-timeout", "inf"], "--remote-timeout must be above 0 and at most 86400 seconds, got inf"),
        (["--remote-timeout", "1e300"], "--remote-timeout must be above 0 and at most 86400 seconds"),
        (["--raw", "--system", "be brief"], "--system needs the chat template, which --raw leaves out"),
        (["--large", ""], "--large must name a model"),
        (["--small", " "], "--small must name a model"),
    ],
)
def test_invalid_option_values(tmp_path: Path, args: list[str], fragment: str) -> None:
    """Refused before any model is looked for: the models named do not exist."""
    absent = (tmp_path / "small.gguf", tmp_path / "large.gguf")
    assert_one_line_error(ead("generate", *pair_args(absent), *args, "hi"), 2, fragment)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["-ngl", "all"], "Invalid value for '--n-gpu-layers': 'all' is not a whole number"),
        (["--ctx", "1.5"], "Invalid value for '--ctx': '1.5' is not a whole number"),
        (["--temp", "warm"], "Invalid value for '--temp': 'warm' is not a number"),
        (["--top-k", "9" * 5000], f"Invalid value for '--top-k': {'9' * 80!r}... (5000 characters) is too"),
        (["--top-p", "x" * 1000], f"Invalid value for '--top-p': {'x' * 80!r}... (1000 characters) is not a"),
    ],
)
def test_a_value_that_is_not_a_number_is_echoed(tmp_path: Path, args: list[str], line: str) -> None:
    """typer had said 'Invalid value for '--n-gpu-layers' / '-ngl' / '--gpu-layers': Input should be a
    valid integer, unable to parse string as an integer': every spelling of the option, never the value."""
    absent = (tmp_path / "small.gguf", tmp_path / "large.gguf")
    said = assert_one_line_error(ead("generate", *pair_args(absent), *args, "hi"), 2, f"error: {line}")
    assert said.endswith(" (see 'ead generate --help')")


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["generate", "\u2014small", "qc0.5b", "hi"], "--small"),  # an em dash: a word processor's "--"
        (["generate", "\u2013-max-tokens", "5", "hi"], "--max-tokens"),  # an en dash then a hyphen
        (["generate", "\u2014mode=spec", "hi"], "--mode"),
        (["depth", "generate", "missing.gguf", "\u2013\u2013stats", "hi"], "--stats"),
        (["\u2014no-color", "models", "list"], "--no-color"),
        (["generate", "--stop=.", "--stats", "\u2014small", "qc0.5b", "hi"], "--small"),  # no value taken
        (["generate", "--stop", "--", "\u2014small", "qc0.5b", "hi"], "--small"),  # '--' is --stop's value
    ],
)
def test_an_option_pasted_with_a_typographic_dash_suggests_the_real_one(args: list[str], meant: str) -> None:
    """A pasted '\u2014small' had been taken as the prompt: 'Got unexpected extra argument(s) (qc0.5b hi)'."""
    pasted = next(arg for arg in args if arg[0] in "\u2013\u2014")
    assert_one_line_error(ead(*args), 2, repr(pasted), f"did you mean {meant}?")


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--small", "a.gguf", "--large", "b.gguf", "--", "\u2014small"],  # the prompt
        # an option's value: a stop string or a system message that starts with a dash
        ["generate", "--small", "a.gguf", "--large", "b.gguf", "--stop", "\u2014small", "hi"],
        ["generate", "--system", "\u2013-max-tokens", "--small", "a.gguf", "--large", "b.gguf", "hi"],
        ["depth", "generate", "--stop", "\u2013\u2013stats", "a.gguf", "hi"],
    ],
)
def test_a_typographic_dash_in_a_value_or_after_double_dash_is_text(tmp_path: Path, args: list[str]) -> None:
    """Only an option's name is checked for a pasted dash: '--stop \u2014small' had been refused as a
    misspelt --small, a value click reads as it is. The models do not exist: the run got that far."""
    result = subprocess.run([EAD, *args], capture_output=True, timeout=120, cwd=tmp_path)
    assert_one_line_error(result, 1, "model file not found: a.gguf")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["calibrate", "--small", "a.gguf", "--large", "b.gguf", "--prompts", ""], "'--prompts'"),
        (["generate", "--small", "a.gguf", "--large", "b.gguf", "--catalog", "", "hi"], "'--catalog'"),
        (["models", "list", "--catalog", ""], "'--catalog'"),
        (["depth", "generate", "missing.gguf", "--catalog", "", "hi"], "'--catalog'"),
    ],
)
def test_an_empty_file_name_is_refused_naming_the_option(tmp_path: Path, args: list[str], named: str) -> None:
    """'' is Path('.'), the current folder: these had said "cannot read .: Is a directory", naming
    neither the option nor the empty name. The option alone: --catalog's had named $EAD_MODELS beside it,
    which was not given."""
    result = subprocess.run([EAD, *args], capture_output=True, timeout=120, cwd=tmp_path)
    assert_one_line_error(result, 2, f"Invalid value for {named}: an empty path names no file or folder")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bench", "speed", "--small", "a.gguf", "--large", "b.gguf", "--json"], "'--json'"),
        (["depth", "eval", "missing.gguf", "--no-timing", "--out"], "'--out'"),
    ],
)
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("figures/", "figures/: Is a directory"),
        ("figures/.", "figures/.: Is a directory"),
        ("kept.json/", "kept.json/: Not a directory"),
        ("-", "'-' is no file here, not stdout: name a file"),
    ],
)
def test_a_file_output_named_as_a_folder_or_stdout_is_refused(
    tmp_path: Path, args: list[str], named: str, name: str, reason: str
) -> None:
    """A Path drops a trailing / (or /.): 'figures/' had been written as the file 'figures' once the run
    was done, and 'kept.json/' over kept.json; '-' had been a file named '-'. Refused before any model
    loads (a missing one would be the error otherwise), in a shell's words, nothing written."""
    kept = tmp_path / "kept.json"
    kept.write_text("kept", encoding="utf-8")
    result = subprocess.run([EAD, *args, name], capture_output=True, timeout=120, cwd=tmp_path)
    assert_one_line_error(result, 2, f"Invalid value for {named}: {reason}")
    assert [path.name for path in tmp_path.iterdir()] == ["kept.json"]
    assert kept.read_text(encoding="utf-8") == "kept"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["bench", "speed", "--small", "a.gguf", "--large", "b.gguf", "--json"], 2),
        (["depth", "eval", "missing.gguf", "--no-timing", "--out"], 2),  # an option the user gave: 2
    ],
)
@pytest.mark.parametrize("name", ["kept.json/figures.json", "link.json"])
def test_a_file_output_below_a_file_is_refused_naming_the_file(
    tmp_path: Path, args: list[str], code: int, name: str
) -> None:
    """A file where the output's folder goes, named or reached through a link, is said before any model
    loads (a missing one would be the error otherwise) and named: bench speed had said 'File exists', and
    depth eval had checked the link's own folder, its figures then lost after the whole evaluation."""
    kept = tmp_path / "kept.json"
    kept.write_text("kept", encoding="utf-8")
    (tmp_path / "link.json").symlink_to(kept / "figures.json")
    result = subprocess.run([EAD, *args, name], capture_output=True, timeout=120, cwd=tmp_path)
    assert_one_line_error(result, code, "kept.json is not a folder")
    assert kept.read_text(encoding="utf-8") == "kept"


@pytest.mark.parametrize(
    "command",
    [
        ("generate", "--small", "missing.gguf", "--large", "missing.gguf", "hi"),
        ("chat", "--small", "missing.gguf", "--large", "missing.gguf"),
        ("bench", "humaneval", "--small", "missing.gguf", "--large", "missing.gguf"),
        ("bench", "speed", "--small", "missing.gguf", "--large", "missing.gguf"),
        ("depth", "calibrate", "missing.gguf"),
        ("depth", "generate", "missing.gguf", "hi"),
        ("depth", "eval", "missing.gguf"),
    ],
)
def test_every_command_refuses_zero_threads_before_looking_for_a_model(command: tuple[str, ...]) -> None:
    """One resolution of --threads and --threads-batch: the same refusal everywhere, before the model is
    even looked up."""
    assert_one_line_error(ead(*command, "--threads", "0"), 2, "--threads must be at least 1, got 0")
    assert_one_line_error(ead(*command, "-tb", "0"), 2, "--threads-batch must be at least 1, got 0")


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        (b"", "the prompt on stdin is empty"),
        (b"  \n\t ", "the prompt on stdin is empty"),
        (b"\xef\xbb\xbf", "the prompt on stdin is empty"),  # a byte-order mark alone had been a prompt
        (b"\xef\xbb\xbf \r\n", "the prompt on stdin is empty"),
        (b"a\x00b", "NUL byte"),
        (b"caf\xe9", "not valid UTF-8"),
        (b"\xef\xbb\xbfcaf\xe9", "the prompt on stdin is not valid UTF-8 (byte 6)"),  # the input's byte
    ],
)
def test_bad_prompts_on_stdin(tiny_pair: tuple[Path, Path], prompt: bytes, fragment: str) -> None:
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), "-", stdin=prompt), 2, fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["caf\udce9"],
            "the prompt is not valid UTF-8 (byte 3)",
        ),  # an argument's byte 0xe9, as Python keeps it
        (["--system", "be \udcffrief", "hi"], "the system message is not valid UTF-8 (byte 3)"),
        (["--stop", "x", "--stop", "\udcff", "hi"], "the stop string is not valid UTF-8 (byte 0)"),
    ],
)
def test_arguments_that_are_not_utf8(tiny_pair: tuple[Path, Path], args: list[str], fragment: str) -> None:
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), *args), 2, fragment)


@pytest.mark.parametrize("command", ["generate", "chat", "depth generate"])
def test_an_empty_stop_string_is_refused(tiny_pair: tuple[Path, Path], command: str) -> None:
    """llama-cli's -r '' and llama-server's stop "" halt at once (it is found everywhere); ead had dropped
    it unsaid (--stop "$UNSET_VARIABLE" stopped nothing). A typo, refused before any model loads. ead
    depth generate, which had not checked its stop strings at all, checks them as generate does."""
    models = [str(tiny_pair[1]), "--threads", "1"] if command == "depth generate" else pair_args(tiny_pair)
    prompt = [] if command == "chat" else ["hi"]
    stops = ["--stop", "x", "-r"]
    assert_one_line_error(
        ead(*command.split(), *models, *stops, "", *prompt),
        2,
        "error: --stop is empty: a stop string needs a character at least",
    )
    if command == "depth generate":
        bad = ead(*command.split(), *models, *stops, "\udcff", *prompt)
        assert_one_line_error(bad, 2, "error: the stop string is not valid UTF-8 (byte 0)")


@pytest.mark.parametrize("size", [10_000, 1_000_000])  # 10 KB, and the 1 MB a pasted log can be
def test_a_prompt_longer_than_the_context(tiny_pair: tuple[Path, Path], size: int) -> None:
    result = ead("generate", *pair_args(tiny_pair), "--ctx", "256", "-", stdin="word " * (size // 5))
    line = assert_one_line_error(result, 2, "too many for the context of 256 tokens: it takes at most 255")
    count = re.search(r"the prompt is (?:at least )?(\d+) tokens", line)  # at least: told by its length
    assert count and int(count[1]) > 256


# The child's peak resident memory (KiB), written to argv[1]: a process with one child reads that child's.
PEAK_OF_CHILD = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
    "open(sys.argv[1], 'w').write(str(peak)); sys.exit(code)"
)


def ead_peak_memory(args: list[str], stdin: Path, peak_file: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run `ead ARGS < stdin` as ``ead`` does, and the bytes of memory it held at its peak."""
    with stdin.open("rb") as data:
        result = subprocess.run(
            [sys.executable, "-c", PEAK_OF_CHILD, str(peak_file), EAD, *args],
            stdin=data,
            capture_output=True,
            timeout=120,
        )
    return result, int(peak_file.read_text()) * 1024


def test_a_huge_prompt_is_refused_in_a_few_copies_of_its_size(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """llama.cpp's tokenizer holds every token of a text, ~75 bytes each, whatever buffer it fills: a 16
    MiB prompt on stdin took ~1.3 GB before it was called too long. Its length alone now refuses it while
    ead holds its text and the rendered prompt (a few copies): the peak stays within 8 over a run of 'hi'."""
    size = 16 * 2**20
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"the quick brown fox " * (size // 20))
    small = tmp_path / "small.txt"
    small.write_bytes(b"hi")
    args = ["generate", *pair_args(tiny_pair), "--max-tokens", "1", "-"]
    fits, baseline = ead_peak_memory(args, small, tmp_path / "small.peak")
    assert fits.returncode == 0, fits.stderr
    refused, peak = ead_peak_memory(args, huge, tmp_path / "huge.peak")
    assert_one_line_error(refused, 2, "too many for the context of 2048 tokens: it takes at most 2047")
    assert peak < baseline + 8 * size, (peak, baseline)


def test_a_prompt_that_fills_the_context_is_refused(tiny_pair: tuple[Path, Path]) -> None:
    """Each 'z' is one token of the tiny vocabulary: 256 fill a 256-token context and leave no room for the
    answer (the message does not call them longer than it); 255 leave one slot, and two tokens come out
    (the last one never needs a slot)."""
    args = ["generate", *pair_args(tiny_pair), "--ctx", "256", "--raw", "--max-tokens", "5"]
    assert_one_line_error(
        ead(*args, "z" * 256),
        2,
        "the prompt is 256 tokens, too many for the context of 256 tokens: it takes at most 255, to leave "
        "room for the answer (raise --ctx or shorten the prompt)",
    )
    fits = ead(*args, "--format", "jsonl", "z" * 255)
    summary = json.loads(fits.stdout.decode().splitlines()[-1])
    assert (fits.returncode, summary["prompt_tokens"], summary["generated"]) == (0, 255, 2)


def test_a_system_message_longer_than_the_context_is_named(tiny_pair: tuple[Path, Path]) -> None:
    """--system of 300 tokens in a 256-token context had been called 'the prompt' (shorten the prompt):
    it is the system message, 328 tokens with the template's text around it, that does not fit."""
    result = ead("generate", *pair_args(tiny_pair), "--ctx", "256", "--system", "z" * 300, "hi")
    assert assert_one_line_error(result, 2) == (
        "error: the system message is 328 tokens, too many for the context of 256 tokens: it takes at most "
        "255, to leave room for the answer (raise --ctx or shorten the system message)"
    )


def test_a_full_context_finishes_with_length_and_says_so(tiny_pair: tuple[Path, Path]) -> None:
    """A length stop (OpenAI's reason) short of --max-tokens: one line says the context ran out, where a
    stop at --max-tokens says nothing."""
    args = ["generate", *large_args(tiny_pair), "--ctx", "256", "--format", "jsonl", "hi"]
    result = ead(*args, "--max-tokens", "5000")
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    assert result.returncode == 0
    assert summary["finish_reason"] == "length"
    assert summary["prompt_tokens"] + summary["generated"] == 257
    note = f"the context (256 tokens) is full: the answer stops at {summary['generated']} tokens"
    assert result.stderr.decode().splitlines() == [note + " of the 5000 asked (raise --ctx)"]
    whole = ead(*args, "--max-tokens", "5")
    assert whole.returncode == 0 and whole.stderr == b"", whole.stderr


def test_max_tokens_minus_one_runs_until_the_context_is_full(tiny_pair: tuple[Path, Path]) -> None:
    """llama.cpp's -n -1, no limit, had been refused ('must be at least 0'): the answer runs until it
    ends or the context is full, and the note says so without a limit asked; --help says what -1 means."""
    args = ["generate", *large_args(tiny_pair), "--ctx", "256", "--format", "jsonl", "hi"]
    for spelling in (["-n", "-1"], ["--max-tokens", "-1"]):
        result = ead(*args, *spelling)
        summary = json.loads(result.stdout.decode().splitlines()[-1])
        assert result.returncode == 0, result.stderr
        assert summary["finish_reason"] == "length"
        assert summary["prompt_tokens"] + summary["generated"] == 257
        note = f"the context (256 tokens) is full: the answer stops at {summary['generated']} tokens"
        assert result.stderr.decode().splitlines() == [note + " (raise --ctx)"]
    shown = " ".join(ead("generate", "--help", env={"COLUMNS": "100"}).stdout.decode().split())
    assert "Stop after this many generated tokens; -1: no limit" in shown


@pytest.mark.real
def test_ctrl_c_keeps_the_partial_answer_and_prints_stats() -> None:
    process = subprocess.Popen(
        [EAD, "generate", "--max-tokens", "400", "--stats", "Write a long essay about the history of Rome"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    assert process.stdout is not None
    first = process.stdout.read(20)  # the answer has started streaming
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    rest, err = read_to_the_end(process)
    assert process.returncode == 130
    assert len(first + rest) > 20
    text = err.decode()
    assert "(interrupted)" in text and "Traceback" not in text


SECOND_CTRL_C = """
import _thread, io, os, signal, sys
import ead_cli.cli as cli
from ead_cli.cli.render import Renderer


class ImpatientStderr(io.TextIOWrapper):
    def write(self, text):
        written = super().write(text)
        if text.startswith("error: "):  # the second Ctrl-C, as the first is reported
            self.flush()
            os.kill(os.getpid(), signal.SIGINT)
        return written


shown = []


def trip(frame, event, arg):
    if event == "return" and frame.f_code is Renderer.event.__code__:
        shown.append(1)
        if len(shown) == 3:  # the first Ctrl-C, mid-answer
            _thread.interrupt_main()


sys.stderr = ImpatientStderr(open(2, "wb", closefd=False), line_buffering=True)
sys.setprofile(trip)
cli.main(sys.argv[1:])
"""


def test_a_second_ctrl_c_while_the_first_is_reported_is_no_traceback(tiny_pair: tuple[Path, Path]) -> None:
    """An impatient user presses Ctrl-C twice: the second lands while ead reports the first and exits
    (or in the interpreter's shutdown after it), where a KeyboardInterrupt was a traceback. It ends the
    process as a signal does (a shell says 130 either way), after the one line."""
    args = ["generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "50", "hi"]
    command = [sys.executable, "-c", SECOND_CTRL_C, *args]
    result = subprocess.run(command, capture_output=True, timeout=120, preexec_fn=interruptible)
    err = result.stderr.decode()
    assert result.returncode in (130, -signal.SIGINT), err
    assert err == "error: interrupted\n"
    assert result.stdout.endswith(b"\n") and len(result.stdout) > 1


@pytest.mark.real
def test_ctrl_c_during_a_long_prefill_stops_it_cleanly() -> None:
    """A 2,000-token prompt takes the large model (one thread) many seconds to read; Ctrl-C lands inside
    that batch, where llama.cpp's abort callback stops it: exit 130, the stats of an empty answer, one
    'interrupted' line, no traceback."""
    prompt = "Summarise: " + "The quick brown fox jumps over the lazy dog. " * 200
    process = subprocess.Popen(
        [EAD, "generate", "--mode", "large", "--threads", "1", "--stats", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    assert process.stdin is not None
    process.stdin.write(prompt.encode())
    process.stdin.close()
    # Loading is mostly waiting on the disk; once the process has used 4 s of CPU it is inside the
    # prefill (which needs far more), whatever the page cache held.
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + 120
    while int(Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[11]) < 4 * ticks:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    out, err = read_to_the_end(process)
    text = err.decode()
    assert process.returncode == 130, text
    assert "0 tokens (interrupted)" in text and "Traceback" not in text
    assert text.splitlines()[-1] == "error: interrupted"
    assert out.strip() == b""


def test_help_lists_the_commands() -> None:
    result = ead("--help")
    assert result.returncode == 0
    assert b"generate" in result.stdout and b"models" in result.stdout


def every_command(group: TyperGroup, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(its words on the command line, the command) for every command and group under ``group``."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, TyperGroup):
            yield from every_command(command, (*path, name))


@pytest.mark.parametrize("columns", [40, 80, 100, 119, 120])
def test_help_at_any_width_names_every_option_whole(columns: int) -> None:
    """typer's tables cut what did not fit with an ellipsis, option names too (at 40, '--mode…' was
    --models, beside --mode; up to 114, '--draft-entropy-stop,--dra…' hid --draft-stop): below 120 columns
    the help is click's plain one, which wraps instead; from 120 on, the tables, which hold every name."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    for path, command in [((), root), *every_command(root)]:
        result = ead(*path, "--help", stdin=b"", env={"COLUMNS": str(columns)})
        assert result.returncode == 0, result.stderr
        shown = result.stdout.decode()
        assert "…" not in shown, (path, shown)
        assert ("╭" in shown) == (columns >= 120), (path, shown)
        for parameter in command.params:
            for name in (*parameter.opts, *parameter.secondary_opts):
                assert name in shown, (path, name)


def test_every_commands_help_with_stdout_closed_says_so() -> None:
    """``ead --help >&-`` had printed nothing, exit 0; every group's and command's help, the nested ones
    (``ead models pull``, ``ead bench humaneval``) too, says in one line that it has nowhere to go."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    for path in [(), *(path for path, _ in every_command(root))]:
        line = f"{shlex.join([EAD, *path, '--help'])} >&-"
        closed = subprocess.run(["bash", "-c", line], capture_output=True, timeout=120)
        assert_one_line_error(closed, 1, "cannot write the help: stdout is closed")


LLAMA_SPELLINGS = r"(,\s*-[\w-]+)*(\s+-\w+)?"  # after ead's: '--ctx,--ctx-size  -c  N', '--ctx, --ctx-size N'
TYPE_NAME = re.compile(r"<[\w|\[\], ]+>")  # typer's <str>, <Path>, <list[str]>, <gate|ead|lookahead>
IN_WORDS = {
    ("generate",): (
        ("--small", "MODEL"),
        ("--models", "MODEL,MODEL,..."),
        ("--catalog", "PATH"),
        ("--ctx", "N"),
        ("--temp", "X"),
        ("--policy", "gate|ead|lookahead"),
        ("--stop", "TEXT"),
        ("--tau-range", "LOW:HIGH"),
        ("--remote-api-key", "KEY"),
        ("Usage: ead generate [OPTIONS]", "[PROMPT]"),
    ),
    ("bench", "humaneval"): (
        ("--window", "N,N,..."),
        ("--tau", "X,X,..."),
        ("--switch-point", "VALUE,VALUE,..."),
        ("--strategies", "NAME,NAME,..."),
    ),
    ("bench", "report"): (("Usage: ead bench report [OPTIONS]", "FOLDERS..."),),
    ("models", "pull"): (("Usage: ead models pull [OPTIONS]", "ALIAS"),),
    ("serve",): (("--host", "HOST"), ("--port", "PORT"), ("--api-key", "KEY")),
}


@pytest.mark.parametrize("columns", [100, 200])
def test_help_says_each_value_in_words(columns: int) -> None:
    """typer's help showed a value as a Python type (<str>, <list[str]>, <int>), a required argument as
    {alias}, and a default the command settles itself in parentheses ('[default: (gate)]'), in click's
    plain help below 120 columns and in the tables from 120 on: each value is a word, as in llama.cpp's
    help (MODEL, N, X, PATH, TEXT, the choices, A,B,... for a list), and a default is said as given."""
    root = typer.main.get_command(app)
    for path, _ in [((), root), *every_command(root)]:
        result = ead(*path, "--help", stdin=b"", env={"COLUMNS": str(columns)})
        assert result.returncode == 0, result.stderr
        shown = result.stdout.decode()
        usage = shown.split("Usage:", 1)[1].splitlines()[0]
        assert not TYPE_NAME.search(shown) and "default: (" not in shown and "{" not in usage, (path, shown)
        for option, word in IN_WORDS.get(path, ()):
            said = rf"{re.escape(option)}{LLAMA_SPELLINGS}\s+{re.escape(word)}(\s|$)"
            assert re.search(said, shown, re.M), (path, option)
    generate = ead("generate", "--help", stdin=b"", env={"COLUMNS": str(columns)}).stdout.decode()
    assert "[default: gate]" in generate and "[default: 512]" in generate


def test_help_in_a_huge_terminal_is_as_wide_as_at_most_200_columns() -> None:
    """A width past any screen (COLUMNS=99999999) had typer's tables padded to it: minutes and gigabytes
    for one --help. The help is drawn at most 200 columns wide."""
    for path in [(), ("generate",)]:
        at_most = ead(*path, "--help", stdin=b"", env={"COLUMNS": "200"})
        assert at_most.returncode == 0, at_most.stderr
        assert ead(*path, "--help", stdin=b"", env={"COLUMNS": "20000"}).stdout == at_most.stdout, path


def summary_lines(help_text: str) -> list[tuple[str, str, int]]:
    """The Commands panel of a rendered --help as (command, text, room) per line: the command the line
    belongs to, the line's text, and the columns its text could fill."""
    panel = help_text.split("─ Commands ─", 1)[1].split("╰", 1)[0].splitlines()[1:]
    inners = [line.strip()[1:-1] for line in panel]  # between the panel's two borders
    first = inners[0]
    text_column = first.index(first.split()[1], len(first.split()[0]) + 1)
    rows, command = [], ""
    for inner in inners:
        command = inner[:text_column].strip() or command
        rows.append((command, inner[text_column:].rstrip(), len(inner) - text_column - 1))
    return rows


@pytest.mark.parametrize("group", [[], ["models"], ["bench"], ["depth"]])
def test_help_summaries_flow_as_text(group: list[str]) -> None:
    """A command's summary in the list wraps only where its next word does not fit: the docstring's own
    line breaks (typer's rich help keeps those of a first paragraph) cut it mid-sentence."""
    result = ead(*group, "--help", env={"COLUMNS": "120"})
    assert result.returncode == 0, result.stderr
    rows = summary_lines(result.stdout.decode())
    assert len({command for command, _, _ in rows}) >= 3
    for (command, text, room), (next_command, next_text, _) in itertools.pairwise(rows):
        if next_command == command:  # the summary goes on: this line had to be full
            assert len(text) + 1 + len(next_text.split()[0]) > room, f"{command}: {text!r}"


def test_models_list_shows_the_default_pair() -> None:
    result = ead("models", "list")
    assert result.returncode == 0
    out = result.stdout.decode()
    for alias in ("q0.5b", "q14b", "qc0.5b", "qc1.5b", "l8b"):
        assert alias in out


def test_entry_point_is_on_path_for_the_venv() -> None:
    assert shutil.which("ead", path=str(Path(sys.executable).parent))


def pending(pid: int) -> set[int]:
    """The signals sent to a process that it has not taken yet, from Linux's /proc (the main thread's
    SigPnd and the process's ShdPnd: hex masks, bit n - 1 for signal n)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    mask = 0
    for line in lines:
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_reader_lags_keeps_every_counted_token(
    tiny_pair: tuple[Path, Path], unbuffered: str, stop: signal.Signals
) -> None:
    """A reader that stops reading (a held pager) fills the pipe and blocks the write of a token; the
    signal interrupts that write. Unbuffered (PYTHONUNBUFFERED=1, as many container images set), Python's
    text layer had already dropped the token's text: the summary counted one token the output lacked."""
    args = [*pair_args(tiny_pair), "--ctx", "4096", "--max-tokens", "4000", "--format", "jsonl", "hi"]
    process = subprocess.Popen(
        [EAD, "generate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": unbuffered},
        preexec_fn=interruptible,
    )
    wchan = Path(f"/proc/{process.pid}/wchan")  # where the main thread sleeps: in a pipe's write, once full
    deadline = time.monotonic() + 60
    while "pipe_write" not in wchan.read_text():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(stop)
    while stop in pending(process.pid):  # read only once the write has taken it: the reader never won
        assert time.monotonic() < deadline
        time.sleep(0.01)
    out, err = read_to_the_end(process)
    assert process.returncode == 128 + stop, err.decode()
    lines = out.decode().splitlines()
    summary = json.loads(lines[-1])
    assert summary["finish_reason"] == "interrupted"
    assert [json.loads(line)["index"] for line in lines[:-1]] == list(range(summary["generated"]))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_gives_up_the_output_of_a_reader_that_never_reads(
    tiny_pair: tuple[Path, Path], stop: signal.Signals
) -> None:
    """The first signal keeps the output, so ead waits on a reader that lags; one that never reads (a
    stuck consumer, ``timeout 60 ead ... | stuck``) held ead there, and a second signal then blocked at
    the exit's flush: it took a third. The second gives up what the reader never took and ends ead."""
    args = [*large_args(tiny_pair), "--ctx", "4096", "--max-tokens", "4000", "--format", "jsonl", "hi"]
    process = subprocess.Popen(
        [EAD, "generate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible
    )
    wchan = Path(f"/proc/{process.pid}/wchan")  # where the main thread sleeps: in a pipe's write, once full
    deadline = time.monotonic() + 60
    for _ in range(2):
        while "pipe_write" not in wchan.read_text():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(stop)
        while stop in pending(process.pid):  # taken by the blocked write
            assert time.monotonic() < deadline
            time.sleep(0.01)
    try:
        process.wait(timeout=60)  # not read: the reader never reads
    finally:
        process.kill()
    assert process.stderr is not None
    err = process.stderr.read().decode()
    assert process.returncode == 128 + stop, err
    assert err == f"error: {'terminated' if stop == signal.SIGTERM else 'interrupted'}\n"


def test_sigterm_stops_like_ctrl_c_and_keeps_the_output(tiny_pair: tuple[Path, Path]) -> None:
    args = [*pair_args(tiny_pair), "--ctx", "2048", "--max-tokens", "2000", "--format", "jsonl", "--stats"]
    process = subprocess.Popen([EAD, "generate", *args, "hi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    first = process.stdout.readline()  # streaming has begun
    process.send_signal(signal.SIGTERM)
    rest, err = read_to_the_end(process)
    assert process.returncode == 143
    lines = (first + rest).decode().splitlines()
    summary = json.loads(lines[-1])
    assert summary["type"] == "summary" and summary["finish_reason"] == "interrupted"
    assert 1 <= summary["generated"] < 2000
    assert len(lines) - 1 == summary["generated"]  # every token written was printed before the end
    assert "(interrupted)" in err.decode() and "Traceback" not in err.decode()
    assert err.decode().splitlines()[-1] == "error: terminated"


def test_a_progress_line_spells_what_a_terminal_would_act_on(capsys: pytest.CaptureFixture[str]) -> None:
    """A progress line names files (``measuring NAME…``): an escape in a model file's name had gone to
    the terminal as it was, colouring what followed, as error lines and tables no longer do."""
    say_progress("measuring sm\x1b[31mall.gguf\u2026")
    assert capsys.readouterr().err == "measuring sm\\x1b[31mall.gguf\u2026\n"


def test_a_file_that_cannot_be_saved_is_refused_in_one_wording_by_every_command(tmp_path: Path) -> None:
    """One check (``check_can_save``) for every file a command writes, before any model loads: a file in
    its folder's way and a folder in its place read alike, exit 2 where the path is an option given (1
    for ead's own places: test_calibrate). They had been two checks that said one problem apart: bench
    speed 'cannot write to FOLDER' and 'X is a folder: the figures go to a file', a bench's and a
    replay's --out 'X is a file: results go to a folder', depth eval's --out exit 1, not its other 2."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    (tmp_path / "folder").mkdir()
    missing = str(tmp_path / "none.gguf")
    pair = ["--small", missing, "--large", missing]
    for args, given, what, saved in (
        (["bench", "speed", *pair, "--json"], blocker / "speed.json", "the speed figures", "speed.json"),
        (["depth", "eval", missing, "--out"], blocker / "eval.json", "the evaluation", "eval.json"),
        (["bench", "prompts", *pair, __file__, "--out"], blocker, "the results", "results.jsonl"),
        (["bench", "replay", str(tmp_path), *pair, "--out"], blocker, "the replay report", "replay.json"),
    ):
        line = assert_one_line_error(ead(*args, str(given)), 2)
        assert line == f"error: cannot save {what} to {blocker / saved}: {blocker} is not a folder"
    folder = tmp_path / "folder"
    line = assert_one_line_error(ead("bench", "speed", *pair, "--json", str(folder)), 2)
    assert line == f"error: cannot save the speed figures to {folder}: it is a folder"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["blocker", "folder"]

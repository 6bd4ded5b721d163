"""``ead chat`` as a person and a pipeline use it: the real command in a real pseudo-terminal
(pexpect), and with piped stdin; tiny models, one thread, a few seconds in all."""

from __future__ import annotations

import _thread
import io
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import CodeType, FrameType

import pexpect
import pytest
from test_cli import at_a_terminal, interruptible, pair_args
from test_habits import MEANT, TYPED
from test_thinking import CLOSE_ID
from tiny_models import byte_tokens, open_pair

from ead_cli.chat import Conversation
from ead_cli.cli.output import spelled
from ead_cli.cli.render import DONE_THINKING, THINKING, TextRenderer
from ead_cli.cli.repl import MORE, PROMPT, Repl, read_message
from ead_cli.decoder import Decoder
from ead_cli.engine import close_all, load_runners
from ead_cli.errors import EadError, quoted
from ead_cli.option_table import CHAT, on
from ead_cli.options import GenerationOptions, ModelOptions, PolicyOptions
from ead_cli.runner import Runner

EAD = Path(sys.executable).with_name("ead")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SUMMARY = re.compile(r"(\d+) tokens? · large share [\d.]+% · [\d.]+ tok/s")
UP = "\x1b[A"


def chat_args(pair: tuple[Path, Path], *extra: str) -> list[str]:
    small, large = pair
    return ["chat", "--small", str(small), "--large", str(large), "--threads", "1", "--tau", "3", *extra]


@pytest.fixture
def spawn(tiny_pair: tuple[Path, Path]) -> Iterator:
    children: list[pexpect.spawn] = []

    def start(
        *extra: str,
        env: dict[str, str] | None = None,
        stdout: Path | None = None,
        columns: int = 250,
        preexec_fn: Callable[[], None] = interruptible,
        pair: bool = True,
        wrap: tuple[str, ...] = (),
        models: tuple[Path, Path] | None = None,
    ) -> pexpect.spawn:
        """The chat at a terminal ``columns`` wide; with ``stdout``, its stdout redirected to that file;
        ``preexec_fn`` run in the child before it starts; ``pair`` False: the default mode (no --tau),
        the large model alone until a command turns the pair on; ``wrap``: a command line that runs it;
        ``models``: another pair than the tiny one."""
        unset = ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")
        terminal = {"TERM": "xterm", "LANG": "C.UTF-8"}  # ``env`` may name another TERM
        env = {k: v for k, v in os.environ.items() if k not in unset} | terminal | (env or {})
        command, args = str(EAD), chat_args(models or tiny_pair, *extra)
        if not pair:
            args.remove("--tau"), args.remove("3")
        if wrap:
            command, args = wrap[0], [*wrap[1:], command, *args]
        if stdout is not None:
            command, args = "/bin/sh", ["-c", 'exec "$@" > "$0"', str(stdout), command, *args]
        child = pexpect.spawn(
            command,
            args,
            env=env,
            encoding="utf-8",
            codec_errors="replace",
            timeout=30,
            dimensions=(40, columns),
            preexec_fn=preexec_fn,
        )
        children.append(child)
        child.expect_exact(PROMPT)
        return child

    yield start
    for child in children:
        child.close(force=True)


def plain(text: str) -> str:
    return ANSI.sub("", text).replace("\r", "")


def wait_ready(child: pexpect.spawn) -> None:
    """readline can drop keys typed in the instant it takes the terminal over after printing its prompt
    (a person is never that fast; a test is): type a probe until readline echoes it, then kill the line
    (Ctrl-U, which readline answers with backspaces and an erase-to-end-of-line)."""
    for _ in range(200):
        child.send("#")
        if child.expect_exact(["#", pexpect.TIMEOUT], timeout=0.1) == 0:
            break
    child.send("\x15")
    child.expect_exact("\x1b[K")


def interrupt_prompt(child: pexpect.spawn) -> None:
    """Ctrl-C at the prompt gives a fresh prompt. CPython's readline only notices a signal that interrupts
    its select(); one that lands just before select() is entered waits for the next key. A person cannot
    press Ctrl-C within microseconds of a redraw, a test can: a second Ctrl-C then does what the first
    would have (one KeyboardInterrupt either way)."""
    child.sendcontrol("c")
    if child.expect_exact([PROMPT, pexpect.TIMEOUT], timeout=3) == 1:
        child.sendcontrol("c")
        child.expect_exact(PROMPT)


def type_line(child: pexpect.spawn, keys: str) -> None:
    wait_ready(child)
    child.send(keys + "\r")


def send(child: pexpect.spawn, keys: str) -> str:
    """Type keys and Enter; return what the terminal showed until the next prompt, colours kept."""
    type_line(child, keys)
    child.expect_exact(PROMPT)
    return child.before


def reply(child: pexpect.spawn, line: str) -> list[str]:
    """A command's output lines after its echo, without colours."""
    echo, *lines = plain(send(child, line)).splitlines()
    assert echo == line
    return lines


def leave(child: pexpect.spawn) -> int:
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def end_of_turn(tiny_small: Path) -> list[int]:
    with Runner(tiny_small, name="small", n_ctx=64) as runner:
        return runner.tokenize("<|im_end|>\n", add_special=False)


def test_read_message_joins_continued_lines_and_quoted_blocks() -> None:
    def reader(*lines: str):
        pending, prompts = list(lines), []

        def read_line(prompt: str) -> str:
            prompts.append(prompt)
            if not pending:
                raise EOFError
            return pending.pop(0)

        return read_line, prompts

    read_line, prompts = reader("hello there")
    assert read_message(read_line) == ("hello there", False) and prompts == [PROMPT]
    read_line, prompts = reader("one \\", "two\\", "three", "next")
    assert read_message(read_line) == ("one \ntwo\nthree", False) and prompts == [PROMPT, MORE, MORE]
    read_line, prompts = reader('"""', "a \\", "", "  b", '"""', "next")
    assert read_message(read_line) == ("a \\\n\n  b", False) and prompts == [PROMPT, MORE, MORE, MORE, MORE]
    assert read_message(reader('"""first', 'last"""')[0]) == ("first\nlast", False)
    assert read_message(reader('"""inline"""')[0]) == ("inline", False)
    # a block is kept as pasted: its first line's indentation too (blank lines and spaces at its ends go)
    indented = reader('""" ', " ", "    def f():", "        return 1", "", '"""')[0]
    assert read_message(indented) == ("    def f():\n        return 1", False)
    # a line starting with / is a command; a block never is; // sends a message starting with /
    assert read_message(reader(" /tau 2 ")[0]) == ("/tau 2", True)
    assert read_message(reader("/system be \\", "brief")[0]) == ("/system be \nbrief", True)
    assert read_message(reader('"""', "/reset", '"""')[0]) == ("/reset", False)
    assert read_message(reader("//* add */")[0]) == ("/* add */", False)
    with pytest.raises(EOFError):
        read_message(reader()[0])
    # the input's end inside a message is an error: the message is not sent
    with pytest.raises(EadError, match='the input ended inside a """ block: that message is not sent'):
        read_message(reader('"""', "never closed")[0])
    with pytest.raises(EadError, match=r"the input ended inside a line ending in \\: that message is not"):
        read_message(reader("never \\")[0])


def test_two_turns_history_commands_stats_and_save(spawn, tmp_path: Path) -> None:
    child = spawn("--max-tokens", "8")
    first = send(child, "hello")
    assert re.search(r"\x1b\[(36|1;33)m", first), "answers are coloured by model on a terminal"
    assert re.search(r"8 tokens · large share [\d.]+% · [\d.]+ tok/s · cut \(length\)", plain(first))

    [changed] = reply(child, "/tau 2.5")
    assert "tau 2.5" in changed and changed.endswith("(from the next answer)")
    # Up-arrow twice recalls "hello" from readline's history.
    second = plain(send(child, UP + UP))
    assert "hello" in second.splitlines()[0] and SUMMARY.search(second)

    assert reply(child, "/frobnicate") == ["error: unknown command '/frobnicate' (/help lists the commands)"]
    assert reply(child, "/tau abc") == [
        "error: /tau takes a finite number of bits, or one per cascade level, got 'abc'"
    ]
    # each bad value's message names the command typed
    assert reply(child, "/window 0") == ["error: /window must be at least 1, got 0"]
    assert reply(child, "/temp -1") == ["error: /temp must be at least 0 and finite, got -1.0"]
    assert reply(child, "/lookup-draft 0") == ["error: /lookup-draft must be in [1, 64], got 0"]
    assert reply(child, "/max-tokens -3") == [
        "error: /max-tokens must be -1 (no limit) or at least 0, got -3"
    ]

    stats = "\n".join(reply(child, "/stats"))
    assert "tau 2.5 · window 1" in stats and "temp 0 ·" in stats  # the bad values changed nothing
    assert "session: 2 answers · 16 tokens" in stats
    prefill = [int(n) for n in re.findall(r"^(?:small|large)\s+\d+\s+(\d+) in", stats, re.MULTILINE)]

    path = tmp_path / "chat.json"
    assert reply(child, f"/save {path}") == [f"saved 2 turns to {path}"]
    assert leave(child) == 0

    saved = json.loads(path.read_text(encoding="utf-8"))
    turns = saved["turns"]
    assert [turn["user"] for turn in turns] == ["hello", "hello"]
    assert [turn["policy"]["tau"] for turn in turns] == [3.0, 2.5]
    for turn in turns:
        assert len(turn["tokens"]) == 8 and turn["cut"]
        assert {token["model"] for token in turn["tokens"]} <= {"small", "large"}
        assert all(isinstance(token["entropy"], float) and token["entropy"] >= 0 for token in turn["tokens"])
    # The second prompt holds the first answer's tokens: it extends the first conversation.
    conversation = saved["conversation_tokens"]
    start = turns[0]["summary"]["prompt_tokens"]
    assert conversation[start : start + 8] == [token["token"] for token in turns[0]["tokens"]]
    assert turns[1]["summary"]["prompt_tokens"] > start + 8
    # /stats showed the second answer's prefill: only what each model had not read, not the whole prompt.
    models = turns[1]["summary"]["models"]
    assert prefill == [model["prefill_tokens"] for model in models]
    assert all(0 < n < turns[1]["summary"]["prompt_tokens"] - start for n in prefill)


def test_stats_at_a_narrow_terminal_wrap_at_spaces_and_cut_no_figure(spawn) -> None:
    """/stats at 40 columns: the session and settings lines wrapped between words (the terminal had broken
    them mid-word, 'window d' / 'efault'), each model's figures a line of named ones, nothing cut short."""
    child = spawn("--max-tokens", "8", columns=40)
    send(child, "hello")
    lines = [line.rstrip() for line in reply(child, "/stats")]
    assert max(map(len, lines)) <= 40 and "…" not in "".join(lines), lines
    joined = " ".join(lines)
    assert "session: 1 answer · 8 tokens · large share" in joined
    settings = "mode ead · policy gate · tau 3 · window 1 · min-run 10 · lookup 12 · lookup-draft 31 · "
    assert settings + "temp 0 · max-tokens 8" in joined
    assert re.search(r"small: written \d+ · prefill \d+ in [\d.]+s · decode", joined), lines
    reply(child, "/max-tokens 1")
    assert re.search(r"^1 token · large share [\d.]+%", plain(send(child, "again")), re.M)
    joined = " ".join(line.rstrip() for line in reply(child, "/stats"))
    assert "1 token (length)" in joined and "session: 2 answers · 9 tokens · large share" in joined
    assert leave(child) == 0


def test_ctrl_c_stops_the_answer_only_and_clears_a_line_at_the_prompt(
    spawn, tmp_path: Path, tiny_small: Path
) -> None:
    child = spawn("--ctx", "32768", "--max-tokens", "100000")  # an answer that runs for a minute
    wait_ready(child)
    child.send("never sent")
    child.expect_exact("never sent")
    interrupt_prompt(child)

    type_line(child, "hello")
    child.expect(r"\x1b\[(36|1;33)m")  # the answer is streaming
    child.sendcontrol("c")
    child.expect(r"(\d+) tokens? · large share [\d.]+% · [\d.]+ tok/s · cut \(interrupted\)")
    child.expect_exact(PROMPT)

    assert reply(child, "/max-tokens 5")[0].endswith("max-tokens 5 (from the next answer)")
    assert " · lookup 0 · lookup-draft 31 · " in reply(child, "/lookup 0")[0]  # each command's value shown
    assert " · lookup 0 · lookup-draft 8 · " in reply(child, "/lookup-draft 8")[0]
    type_line(child, "first line \\")
    child.expect_exact(MORE)
    continued = plain(send(child, "second line"))
    assert "5 tokens" in continued
    for line in ('"""', "a", ""):
        type_line(child, line)
        child.expect_exact(MORE)
    assert "5 tokens" in plain(send(child, '"""'))

    path = tmp_path / "chat.json"
    reply(child, f"/save {path}")
    assert leave(child) == 0
    saved = json.loads(path.read_text(encoding="utf-8"))
    cut, continued_turn, block = saved["turns"]
    assert [turn["user"] for turn in saved["turns"]] == ["hello", "first line \nsecond line", "a"]
    assert cut["cut"] and cut["summary"]["finish_reason"] == "interrupted"
    written = [token["token"] for token in cut["tokens"]]
    assert written, "Ctrl-C came after the answer had begun"
    # The cut answer stays in the conversation, closed as the template closes a turn.
    start = cut["summary"]["prompt_tokens"]
    closed = written + end_of_turn(tiny_small)
    assert saved["conversation_tokens"][start : start + len(closed)] == closed
    assert continued_turn["summary"]["prompt_tokens"] > start + len(closed)
    assert continued_turn["summary"]["generated"] == block["summary"]["generated"] == 5


def test_a_full_context_is_reported_and_reset_recovers(spawn) -> None:
    child = spawn("--ctx", "64", "--max-tokens", "1000")  # llama.cpp rounds the context up to 256
    first = plain(send(child, "hello"))
    assert "cut (length)" in first
    # the cut answer's closing tokens go past the context: said as such, not as '259 of 256 tokens'
    assert "the context is full (3 tokens over the 256 it holds): /reset starts a new conversation" in first
    [refused] = reply(child, "more")
    assert re.fullmatch(
        r"error: the context is full: the conversation with this message is \d+ tokens, the context "
        r"holds 256; /reset starts a new conversation",
        refused,
    )
    assert reply(child, "/reset") == ["new conversation"]
    assert SUMMARY.search(plain(send(child, "hello again")))
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_piped_stdin_gives_one_plain_answer_per_line(tiny_pair: tuple[Path, Path]) -> None:
    result = subprocess.run(
        [str(EAD), *chat_args(tiny_pair, "--max-tokens", "12")],
        input=b"hello\nagain\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    stderr = result.stderr.decode()
    assert [int(n) for n in SUMMARY.findall(stderr)] == [12, 12]
    assert "\x1b" not in stderr

    # The same conversation in this process: the pipe printed exactly its answers, nothing else.
    runners = load_runners(ModelOptions(str(tiny_pair[0]), str(tiny_pair[1]), threads=1))
    try:
        conversation = Conversation(runners, PolicyOptions(tau=3.0), GenerationOptions(max_tokens=12))
        expected = ""
        for text in ("hello", "again"):
            expected += "".join(event.text for event in conversation.ask(text)) + "\n"
    finally:
        close_all(runners)
    assert result.stdout.decode() == expected

    failed = subprocess.run(
        [str(EAD), *chat_args(tiny_pair)], input=b"/tau x\n", capture_output=True, timeout=60, check=False
    )
    assert failed.returncode == 1
    assert failed.stdout == b""
    assert (
        failed.stderr.decode()
        == "error: /tau takes a finite number of bits, or one per cascade level, got 'x'\n"
    )


def pipe(pair: tuple[Path, Path], text: bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    """ead chat with ``text`` on its stdin."""
    args = [str(EAD), *chat_args(pair, "--max-tokens", "4", *extra)]
    return subprocess.run(args, input=text, capture_output=True, timeout=60, check=False)


NEWLINE = byte_tokens().index(chr(256 + ord("\n")))  # the tiny vocabulary's token for "\n"


def test_a_stop_typed_with_escapes_ends_an_answer_where_llama_cli_would(tiny_pair: tuple[Path, Path]) -> None:
    """chat's --stop '\\n' had been a backslash and an n, which never matched: llama-cli escapes its reverse
    prompts in conversation mode too, so chat takes generate's -e rule (on by default; --no-escape)."""
    lines = ("--logit-bias", f"{NEWLINE}+100")  # every token a newline
    for typed_stop in (["-r", "\\n"], ["-e", "--stop", "\\x0a"]):
        stopped = pipe(tiny_pair, b"hi\n", *lines, *typed_stop)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout == b"\n"  # the answer ends before its first token
    literal = pipe(tiny_pair, b"hi\n", *lines, "--no-escape", "-r", "\\n")
    assert literal.returncode == 0, literal.stderr
    assert literal.stdout == b"\n" * 5  # four newlines, and the line's end


def test_a_typed_message_is_sent_as_typed_as_llama_clis_conversation_sends_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """llama-cli's conversation (llama.cpp's tools/cli) sends a typed line as typed, escapes and all, -e
    or not (only the old main, now llama-completion, processed them): chat does the same, so pasted
    code's \\n reaches the model as written."""
    saved = tmp_path / "typed.json"
    result = pipe(tiny_pair, f"{TYPED}\n/save {saved}\n".encode())
    assert result.returncode == 0, result.stderr
    assert MEANT != TYPED
    assert [turn["user"] for turn in json.loads(saved.read_text())["turns"]] == [TYPED]


def test_ollamas_set_parameter_sets_each_penalty_and_names_the_ones_it_takes(
    tiny_pair: tuple[Path, Path],
) -> None:
    """ollama's /set parameter NAME for the penalties ead chat has (/repeat-penalty...), under ollama's
    names, as serve's ollama API takes them in `options`: they had been "unknown command '/set'", though
    /set parameter temperature ran; one ead chat lacks (num_ctx: its context is the one loaded) is named
    with those it takes."""
    result = pipe(
        tiny_pair,
        b"/set parameter repeat_penalty 1.3\n/set parameter repeat_last_n 8\n"
        b"/set parameter presence_penalty 0.5\n/set parameter frequency_penalty 0.25\n"
        b"/set parameter num_ctx 4096\n/set parameter\n",
    )
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert (
        "repeat-penalty 1.3 · repeat-last-n 8 · presence-penalty 0.5 · frequency-penalty 0.25 · " in lines[3]
    )
    takes = (
        "error: /set parameter takes temperature, top_k, top_p, min_p, mirostat, mirostat_tau, mirostat_eta, "
        "seed, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty or num_predict"
    )
    assert lines[4:] == [f"{takes}, got 'num_ctx'", f"{takes}, got ''"]


def test_ollamas_set_parameter_sets_the_samplers_and_the_seed(tiny_pair: tuple[Path, Path]) -> None:
    """ollama's /set parameter top_k, top_p, min_p, seed and mirostat* (they had been refused): the
    settings line says those of the draw once the temperature draws; top_k 1 writes the greedy answer;
    Mirostat is refused beside a step that takes tokens back, as on the command line."""
    greedy = pipe(tiny_pair, b"hello\n")
    typed = b"/set parameter temperature 1.5\n/set parameter top_k 1\n/set parameter top_p 0.5\n"
    typed += b"/set parameter min_p 0.1\n/set parameter seed 7\nhello\n"
    result = pipe(tiny_pair, typed)
    assert result.returncode == 0, result.stderr
    assert result.stdout == greedy.stdout
    lines = result.stderr.decode().splitlines()
    assert " · temp 1.5 · top-k 1 · top-p 0.5 · min-p 0.1 · seed 7 · max-tokens 4 (from" in lines[4]
    typed = b"/set parameter temperature 1\n/set parameter mirostat 2\n/set parameter mirostat_tau 3\n"
    typed += b"/set parameter mirostat_eta 0.5\n/set parameter mirostat 3\n"
    lines = pipe(tiny_pair, typed).stderr.decode().splitlines()
    assert (
        " · temp 1 · mirostat 2 · mirostat-ent 3 · mirostat-lr 0.5 · seed 0 · max-tokens 4 (from" in lines[3]
    )
    assert lines[4] == "error: /mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got 3"
    verified = pipe(tiny_pair, b"/temp 1\n/set parameter mirostat 2\n", "--mode", "ead", "--verify", "0.5")
    assert verified.stderr.decode().splitlines()[-1] == (
        "error: /mirostat cannot go with --verify: Mirostat's running target cannot take a token back"
    )


def test_the_settings_line_spells_the_policys_own_window(tiny_pair: tuple[Path, Path]) -> None:
    """The settings line spells each default out, as it spells tau: the window had been 'window default'
    whichever policy ran, where the paper's rule averages 5 steps and the gate 1."""
    result = pipe(tiny_pair, b"/policy ead\n/policy gate\n/window 3\n")
    assert result.returncode == 0, result.stderr.decode()
    windows = re.findall(r"· window (\w+) ·", result.stderr.decode())
    assert windows == ["5", "1", "3"]


def test_a_huge_window_is_one_line_and_the_chat_goes_on(tiny_pair: tuple[Path, Path]) -> None:
    result = pipe(tiny_pair, b"/policy ead\n/window 9223372036854775808\n/stats\n")
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert "Traceback" not in result.stderr.decode()
    assert lines[1] == (
        "error: /window must be at most 1048576 steps (more than any context holds), got 9223372036854775808"
    )
    assert any(line.startswith("context: ") and "window 5" in line for line in lines)  # /stats ran


def test_every_option_commands_refusal_names_the_command(tiny_pair: tuple[Path, Path]) -> None:
    """A check that names no option had been said bare ('error: 2 models take one threshold, got 2' for
    /tau 1,2): each option command's refusal, one per command of the option table's chat surface, names
    the command typed, in a cascade (where /mode spec and /policy lookahead are refused) and a pair."""
    refusals = {
        "/mode spec": "/mode: speculative decoding takes two models: a drafter and a verifier",
        "/policy lookahead": "/policy lookahead takes two models",
        "/tau 1,2,3": "/tau: 3 models take 2 thresholds (or one for all), got 3",
        "/window 0": "/window must be at least 1, got 0",
        "/min-run -1": "/min-run must be at least 0, got -1",
        "/lookup 65": "/lookup must be in [0, 64] tokens (0: off), got 65",
        "/lookup-draft 0": "/lookup-draft must be in [1, 64], got 0",
        "/temp -1": "/temp must be at least 0 and finite, got -1.0",
        "/top-k -1": "/top-k must be at least 0 (0 disables it), got -1",
        "/top-p 0": "/top-p must be in (0, 1], got 0.0",
        "/min-p 2": "/min-p must be in [0, 1], got 2.0",
        "/mirostat 3": "/mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got 3",
        "/mirostat-ent -1": "/mirostat-ent must be at least 0 and finite, got -1.0",
        "/mirostat-lr nan": "/mirostat-lr takes a finite number, got 'nan'",
        "/seed -1": "/seed must be in [0, 4294967294], got -1",
        "/repeat-penalty 0": "/repeat-penalty must be above 0 and finite (1: off), got 0.0",
        "/repeat-last-n -2": "/repeat-last-n must be at least -1 (-1: the whole context, 0: none), got -2",
        "/presence-penalty 3": "/presence-penalty must be in [-2, 2], got 3.0",
        "/frequency-penalty -3": "/frequency-penalty must be in [-2, 2], got -3.0",
        "/max-tokens -2": "/max-tokens must be -1 (no limit) or at least 0, got -2",
        "/reasoning-budget -2": (
            "/reasoning-budget must be at least -1 (-1: unrestricted, 0: thinking off), got -2"
        ),
        "/reasoning-format raw": "/reasoning-format takes one of auto, deepseek, none, got 'raw'",
    }
    takes_any_text = {"/reasoning-budget-message"}  # no value of it is refused: it has no line here
    assert {line.split()[0] for line in refusals} == {option.command for option in on(CHAT)} - takes_any_text
    small, large = map(str, tiny_pair)
    cascade = [str(EAD), "chat", "--models", f"{small},{small},{large}", "--threads", "1"]
    typed = "".join(line + "\n" for line in refusals).encode()
    result = subprocess.run(cascade, input=typed, capture_output=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [f"error: {refusal}" for refusal in refusals.values()]
    pair = pipe(tiny_pair, b"/tau 1,2\n")
    assert pair.stderr.decode() == "error: /tau: 2 models take one threshold, got 2\n"


def test_a_system_message_longer_than_the_context_is_refused_by_name_at_once(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A system message that leaves no room for a message had been taken, and the first message refused as
    'the prompt is 328 tokens (... shorten the prompt)': --system is refused at start-up, /system at
    once, and the system message before it stays."""
    too_long = (
        "error: the system message is 328 tokens, too many for the context of 256 tokens: it takes at most "
        "255, to leave room for the answer (raise --ctx or shorten the system message)\n"
    )
    started = pipe(tiny_pair, b"hi\n", "--ctx", "256", "--system", "z" * 300)
    assert (started.returncode, started.stdout, started.stderr.decode()) == (2, b"", too_long)
    path = tmp_path / "chat.json"
    typed = f"/system be brief\n/system {'z' * 300}\nhi\n/save {path}\n".encode()
    result = pipe(tiny_pair, typed, "--ctx", "256")
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines(keepends=True)
    assert lines[:2] == ["system message set (from the next answer)\n", too_long]
    assert SUMMARY.match(lines[2]) and lines[3:] == [f"saved 1 turn to {path}\n"]
    assert json.loads(path.read_text(encoding="utf-8"))["system"] == "be brief"


def test_a_system_message_removed_says_whether_there_was_one(tiny_pair: tuple[Path, Path]) -> None:
    """``/system`` with no text had said 'removed' with no system message set."""
    result = pipe(tiny_pair, b"/system\n/system be brief\n/system\n")
    assert result.stderr.decode().splitlines()[:3] == [
        "there was no system message to remove",
        "system message set (from the next answer)",
        "system message removed (from the next answer)",
    ]


def test_text_the_user_typed_comes_back_literally(spawn, tmp_path: Path) -> None:
    """rich read an emoji code in a /save file name or in input an error echoes (':smile:' came back as a
    smiling face, another file's name than the one written): every line shows such text as typed, rich's
    markup too."""
    typed = ":smile:[red]x[/red]"
    child = spawn()
    path = tmp_path / ":smile:[bold]x.json"  # a name holds no '/', so no closing tag
    assert reply(child, f"/save {path}") == [f"saved 0 turns to '{path}'"]
    assert path.exists()
    assert reply(child, f"/{typed}") == [f"error: unknown command '/{typed}' (/help lists the commands)"]
    assert reply(child, f"/temp {typed}") == [f"error: /temp takes a finite number, got '{typed}'"]
    assert reply(child, f"/stats {typed}") == [f"error: /stats takes no argument, got '{typed}'"]
    assert leave(child) == 0


def type_bytes(child: pexpect.spawn, keys: bytes) -> str:
    """Type raw bytes (not UTF-8 text) and Enter; return the last line shown before the next prompt."""
    wait_ready(child)
    os.write(child.child_fd, keys + b"\r")
    child.expect_exact(PROMPT)
    return plain(child.before).splitlines()[-1]


# C.UTF-8 keeps undecodable bytes as surrogates; a locale such as en_US.UTF-8 decodes strictly
@pytest.mark.parametrize("env", [{}, {"PYTHONIOENCODING": "utf-8:strict"}])
def test_bytes_that_are_not_utf8_are_one_line_and_the_chat_goes_on(spawn, env: dict[str, str]) -> None:
    child = spawn("--max-tokens", "4", env=env)
    assert type_bytes(child, b"hi \xff\xfe there") == "error: the prompt is not valid UTF-8 (byte 3)"
    assert (
        type_bytes(child, b"/system be \xffrief") == "error: the system message is not valid UTF-8 (byte 3)"
    )
    assert SUMMARY.search(plain(send(child, "hello")))  # the system message is still none: it answers
    assert leave(child) == 0


def test_a_pipes_line_that_is_not_utf8_is_skipped_as_a_bad_one(tiny_pair: tuple[Path, Path]) -> None:
    result = pipe(tiny_pair, b"hi\n\xff\nhi again\n/stats\n")
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert "error: the prompt is not valid UTF-8 (byte 0)\n" in stderr and "Traceback" not in stderr
    assert "session: 2 answers · 8 tokens" in stderr  # the lines after it ran


def test_a_closed_pipe_ends_the_chat_quietly(tiny_pair: tuple[Path, Path]) -> None:
    """``ead chat | head``: once the answers' reader is gone the chat ends as generate does, 141, no word."""
    chat = shlex.join([str(EAD), *chat_args(tiny_pair, "--max-tokens", "200")])
    turns = "".join(f"hello {n}\n" for n in range(40)).encode()
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {chat} | head -c 10 > /dev/null"],
        input=turns,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 141
    stderr = result.stderr.decode()
    assert "error" not in stderr and "Traceback" not in stderr


def test_a_file_name_that_cannot_be_is_one_line_and_a_save_counts_its_turns(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    saves = b"/save ~nouser-ead/x.json\n/save a\x00b.json\n/save /\n/save " + bytes(tmp_path) + b"/t.json\n"
    result = pipe(tiny_pair, saves + b"hi\n/save " + bytes(tmp_path) + b"/one.json\n")
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert lines[:4] == [
        "error: cannot write ~nouser-ead/x.json: ~nouser-ead is no user's home",
        "error: cannot write $'a\\x00b.json': embedded null byte",
        "error: cannot write /: Is a directory",  # had been "PosixPath('/') has an empty name"
        f"saved 0 turns to {tmp_path}/t.json",  # the chat went on
    ]
    assert SUMMARY.match(lines[4]) and lines[5:] == [f"saved 1 turn to {tmp_path}/one.json"]


def test_a_save_cut_short_by_a_full_disk_leaves_the_earlier_file_whole(spawn, tmp_path: Path) -> None:
    """/save writes the transcript whole or not at all: where the disk fills midway (here the file size
    limit of ulimit -f), an earlier transcript of that name stays as it was and nothing is left beside it.
    It had been truncated, then half-written."""
    earlier = tmp_path / "talk.json"
    earlier.write_text('{"turns": []}\n')

    def small_files_only() -> None:  # a transcript of one answer is some 2.5 KB
        interruptible()
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    child = spawn("--max-tokens", "3", preexec_fn=small_files_only)
    assert SUMMARY.search(plain(send(child, "hello")))
    for path in (earlier, tmp_path / "new.json"):
        assert reply(child, f"/save {path}") == [f"error: cannot write {path}: File too large"]
    assert leave(child) == 0
    assert earlier.read_text() == '{"turns": []}\n'
    assert list(tmp_path.iterdir()) == [earlier]


def test_a_block_is_a_message_and_the_input_never_ends_a_message_silently(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    path = tmp_path / "chat.json"
    lines = ['"""', "/* add */", "int add(int a, int b);", '"""', '"""', "/reset", '"""', "//tau 2"]
    lines += ["/tau\t2", f"/save {path}", '"""', "never closed"]
    result = pipe(tiny_pair, "\n".join(lines).encode() + b"\n")
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert [int(n) for n in SUMMARY.findall(stderr)] == [4, 4, 4]  # three answers, no unknown command
    assert "settings: mode ead · policy gate · tau 2 ·" in stderr  # /tau<TAB>2 set it
    assert stderr.endswith('error: the input ended inside a """ block: that message is not sent\n')
    users = [turn["user"] for turn in json.loads(path.read_text(encoding="utf-8"))["turns"]]
    assert users == ["/* add */\nint add(int a, int b);", "/reset", "/tau 2"]

    continued = pipe(tiny_pair, b"hi \\\n")
    assert continued.returncode == 1 and continued.stdout == b""
    assert (
        continued.stderr.decode()
        == "error: the input ended inside a line ending in \\: that message is not sent\n"
    )


def test_ctrl_d_inside_a_message_at_a_terminal_is_one_line_of_its_own(spawn) -> None:
    child = spawn("--max-tokens", "4")
    for first_line, inside in (('"""', 'a """ block'), ("hi \\", "a line ending in \\")):
        type_line(child, first_line)
        child.expect_exact(MORE)
        child.sendeof()
        child.expect_exact(PROMPT)
        # after the ... prompt that Ctrl-D left, a line end: the error is not glued to the prompt
        assert plain(child.before) == f"\nerror: the input ended inside {inside}: that message is not sent\n"
    assert SUMMARY.search(plain(send(child, "hello")))  # the chat goes on
    assert leave(child) == 0


def test_with_stdout_redirected_the_prompt_and_line_editing_stay_on_the_terminal(
    spawn, tmp_path: Path
) -> None:
    out = tmp_path / "answers.txt"
    child = spawn("--max-tokens", "4", stdout=out)  # the prompt reached the terminal
    first = plain(send(child, "hello"))
    second = plain(send(child, UP + UP))  # readline's history recalls "hello"
    assert "hello" in second.splitlines()[0] and SUMMARY.search(first) and SUMMARY.search(second)
    assert leave(child) == 0
    answers = out.read_text(encoding="utf-8", errors="replace")
    assert PROMPT.strip() not in answers and "hello" not in answers and "tokens · large share" not in answers
    assert len(answers.splitlines()) == 2  # the two answers, each closed by a line end


def test_sigterm_mid_answer_ends_the_answers_line_before_saying_so(spawn) -> None:
    child = spawn("--ctx", "32768", "--max-tokens", "100000")  # an answer that runs for a minute
    type_line(child, "hello")
    child.expect(r"\x1b\[(36|1;33)m")  # the answer is streaming
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 143
    *_, summary, last = plain(child.before).splitlines()
    assert SUMMARY.match(summary) and summary.endswith("cut (interrupted)")
    assert last == "error: terminated"  # on its own line, not glued to the answer's last token


def test_a_command_that_takes_no_argument_refuses_words_and_does_nothing(
    tiny_pair: tuple[Path, Path],
) -> None:
    """/stats x, /help me, /reset now, /exit please had run as if the words were not there (/reset
    dropped the conversation, /exit left): each is one line naming the command, and the chat goes on."""
    result = pipe(tiny_pair, b"hi\n/stats x\n/help me\n/reset now\n/exit please\n/stats\n")
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert SUMMARY.match(lines[0])
    assert lines[1:5] == [
        "error: /stats takes no argument, got 'x'",
        "error: /help takes no argument, got 'me'",
        "error: /reset takes no argument, got 'now'",
        "error: /exit takes no argument, got 'please'",
    ]
    assert lines[5] == "last answer:"  # the last /stats ran: the chat went on, the conversation kept
    assert any(line.startswith("session: 1 answer · 4 tokens · ") for line in lines)


def test_an_unknown_command_names_the_one_a_near_miss_or_another_chats_spelling_meant(
    tiny_pair: tuple[Path, Path],
) -> None:
    """A typo (/hlep), another case (/EXIT), an = for a space (/tau=2), habit (/quit) and ollama's
    commands that mean none of ead's (/show info; /set verbose names none) had each been only 'unknown
    command': the line names the command meant. A space after the / had run the command after it
    (/ reset reset the conversation) and echoed a name no one typed (/ hello: '/hello'): the name is
    what follows the / at once."""
    meant = {
        "/hlep": "/help",
        "/EXIT": "/exit",
        "/tau=2": "/tau",
        "/max_tokens 3": "/max-tokens",
        "/quit": "/exit",
        "/show info": "/stats",
    }
    unknown = ["/frobnicate", "/ reset", "/ hello", "/", "/set verbose"]
    typed = "".join(f"{line}\n" for line in [*meant, *unknown])
    result = pipe(tiny_pair, f"hi\n{typed}/stats\n".encode())
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    said = [f"(did you mean {name}?)" for name in meant.values()] + ["(/help lists the commands)"] * 5
    assert lines[1:12] == [
        f"error: unknown command {quoted(line.split()[0])} {hint}"
        for line, hint in zip([*meant, *unknown], said, strict=True)
    ]
    assert lines[12] == "last answer:"  # nothing ran: the conversation was not reset, the chat went on


def test_save_takes_one_file_name_quoted_as_in_a_shell(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """/save chat.json now had written a file named 'chat.json now': two words are refused, a name with
    spaces is quoted (or its spaces escaped), and a quote left open or an empty name is one line."""
    lines = [
        "hi",
        f"/save {tmp_path}/chat.json now",
        f"/save {tmp_path}/it's.json",
        f'/save "{tmp_path}/my chat.json"',
        f"/save {tmp_path}/our\\ chat.json",
        '/save ""',
    ]
    result = pipe(tiny_pair, "\n".join(lines).encode() + b"\n")
    assert result.returncode == 1
    assert result.stderr.decode().splitlines()[1:] == [
        "error: /save takes one file name (quote one with spaces), got "
        + quoted(f"{tmp_path}/chat.json now"),
        "error: /save takes one file name, quoted as in a shell: no closing quotation in "
        + quoted(f"{tmp_path}/it's.json"),
        f"saved 1 turn to '{tmp_path}/my chat.json'",
        f"saved 1 turn to '{tmp_path}/our chat.json'",
        "error: /save takes a file name",
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["my chat.json", "our chat.json"]


def test_save_to_dev_stdout_writes_the_transcript_to_a_piped_stdout(tiny_pair: tuple[Path, Path]) -> None:
    """/dev/stdout into a pipe is written in place: its file had been taken for a name to replace
    (/proc/PID/fd/pipe:[N]), and the save failed ('No such file or directory')."""
    result = pipe(tiny_pair, b"hi\n/save /dev/stdout\n")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().splitlines()[-1] == "saved 1 turn to /dev/stdout"
    transcript = json.loads(result.stdout.decode()[result.stdout.decode().index("{") :])
    assert len(transcript["turns"]) == 1


def test_save_to_dev_stdout_into_a_file_writes_where_stdout_is(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """/dev/stdout with stdout a file (``ead chat > answers.txt``): the transcript had replaced the file,
    the answers before it lost and those after it written to the old file, unlinked. Written to stdout's
    own descriptor, it lands in the file between the answers."""
    out = tmp_path / "answers.txt"
    with open(out, "wb") as handle:
        inode = os.fstat(handle.fileno()).st_ino
        args = [str(EAD), *chat_args(tiny_pair, "--max-tokens", "4")]
        talk = b"hi\n/save /dev/stdout\nhello\n"
        result = subprocess.run(args, input=talk, stdout=handle, stderr=subprocess.PIPE, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert os.stat(out).st_ino == inode and [path.name for path in tmp_path.iterdir()] == ["answers.txt"]
    text = out.read_text(encoding="utf-8")
    start = text.index('{\n "')
    transcript, end = json.JSONDecoder().raw_decode(text, start)
    assert len(transcript["turns"]) == 1 and start > 0 and len(text) > end  # an answer either side


def test_a_save_name_that_names_a_folder_writes_no_file_in_its_place(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """/save notes/ (a folder not made yet) had written a file named 'notes', and /save chat.json/ had
    overwritten chat.json: the name lost its trailing / (or /.) on its way to a path. A name that ends
    as a folder's is refused in a shell's words ('> notes/'; '> chat.json/' after a file), writing nothing."""
    existing = tmp_path / "chat.json"
    existing.write_text("kept", encoding="utf-8")
    names = [f"{tmp_path}/notes/", f"{tmp_path}/notes/.", f"{existing}/"]
    result = pipe(tiny_pair, "".join(f"/save {name}\n" for name in names).encode())
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"error: cannot write {names[0]}: Is a directory",
        f"error: cannot write {names[1]}: Is a directory",
        f"error: cannot write {names[2]}: Not a directory",
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chat.json"]
    assert existing.read_text(encoding="utf-8") == "kept"


def test_a_save_to_a_dash_is_refused_as_every_file_option_refuses_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """/save - had written a file named '-' in the current folder, where every option that names a file
    ead writes (--json, --out) refuses '-': stdout only in other tools. /dev/stdout writes there."""
    args = [str(EAD), *chat_args(tiny_pair, "--max-tokens", "4")]
    result = subprocess.run(args, input=b"hi\n/save -\n", capture_output=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    refusal = "error: /save: '-' is no file here, not stdout: name a file"
    assert result.stderr.decode().splitlines()[-1] == refusal
    assert list(tmp_path.iterdir()) == []


def test_sigterm_at_the_prompt_says_so_on_a_line_of_its_own(spawn) -> None:
    """SIGTERM while a line is read (at >>> with words typed, at ... inside a block): the error had been
    glued to the prompt's line (">>> typederror: terminated")."""
    for keys, shown in (("typed", "typed"), ('"""\r', MORE)):
        child = spawn("--max-tokens", "4")
        wait_ready(child)
        child.send(keys)
        child.expect_exact(shown)
        child.kill(signal.SIGTERM)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 143
        assert plain(child.before) == "\nerror: terminated\n"


def test_help_lists_every_command_on_one_line_in_the_same_style(tiny_pair: tuple[Path, Path]) -> None:
    """One line per command, its usage and a lowercase phrase without a full stop (/temp's had been the
    command line's sentence, 'Temperature; 0 is greedy.')."""
    result = pipe(tiny_pair, b"/help\n")
    lines = (result.stdout + result.stderr).decode().splitlines()
    commands = [line for line in lines if line.startswith("/")]
    assert [line.split()[0] for line in commands][:3] == ["/help", "/mode", "/policy"]
    assert "/temp X" in " ".join(commands) and len(commands) == len(set(commands)) >= 15
    column = max(len(line.split("  ")[0]) for line in commands) + 2
    for line in commands:
        usage, description = line[:column], line[column:]
        assert usage.endswith("  ") and len(usage.split("  ")[0].split()) <= 2, line  # one column for all
        assert description[:1].islower() and not description.endswith("."), line
    # the other chats' spellings that run a command, and what Ctrl-C does, said as they are
    assert lines[-2] == (
        "ollama's /?, /set parameter temperature, /set parameter top_k, /set parameter top_p, /set parameter"
        " min_p, /set parameter mirostat, /set parameter mirostat_tau, /set parameter mirostat_eta, /set"
        " parameter seed, /set parameter repeat_penalty, /set parameter repeat_last_n, /set parameter"
        " presence_penalty, /set parameter frequency_penalty, /set parameter num_predict, /set think, /set"
        " nothink, /set hidethinking, /set nohidethinking, /set system, /clear and /bye run those commands"
        " too."
    )
    assert lines[-1] == (
        "Ctrl-C stops an answer (it stays in the conversation, marked as cut) or a command (which then"
        " changes nothing), or clears the line."
    )


def test_ctrl_c_while_a_command_loads_the_small_model_changes_nothing(spawn, tmp_path: Path) -> None:
    """Ctrl-C while /tau loads the small model (the default mode starts with the large one alone) had left
    "the pair switches from the next answer" on the screen, then a bare ^C: the settings had not changed,
    and nothing said so. It is one line naming the command; the large model answers on, and the next
    command loads the pair. A /save that waits for a FIFO's reader is stopped alike."""
    for attempt in range(5):  # a fresh cache: the small model's first load runs its check in a child
        child = spawn("--max-tokens", "4", pair=False, env={"EAD_CACHE": str(tmp_path / str(attempt))})
        type_line(child, "/tau 2")
        child.expect_exact("loading the small model")
        child.sendcontrol("c")
        child.expect_exact(PROMPT)
        shown = plain(child.before)
        if "settings:" not in shown:  # the Ctrl-C came while it loaded (not after: then it cleared a line)
            break
        child.close(force=True)
    else:
        pytest.fail("the small model had always loaded before Ctrl-C came")
    assert shown.splitlines()[-1] == "/tau stopped (Ctrl-C): nothing changed"
    assert "Traceback" not in shown
    stats = " ".join(reply(child, "/stats"))
    assert "settings: mode large · policy gate · tau 1 ·" in stats
    assert "large share 100.0%" in plain(send(child, "hello"))
    changed = reply(child, "/tau 2")
    assert changed[-1].startswith("settings: mode ead · policy gate · tau 2 ·")
    assert SUMMARY.search(plain(send(child, "hello")))

    # a /save to a FIFO that no one reads waits for a reader: Ctrl-C stops it the same way
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    type_line(child, f"/save {fifo}")
    child.expect_exact(f"/save {fifo}\r\n")
    child.sendcontrol("c")
    child.expect_exact(PROMPT)
    assert plain(child.before).splitlines()[-1] == "/save stopped (Ctrl-C): nothing changed"
    assert reply(child, "/reset") == ["new conversation"]  # the chat goes on
    assert leave(child) == 0


def test_a_saved_transcript_says_which_system_message_each_answer_ran_with(spawn, tmp_path: Path) -> None:
    """The transcript had one "system", the one set when it was saved: answers given before /system (or
    under one removed since) read as answered under it. Each turn names its own; the top one is for the
    next answer."""
    child = spawn("--max-tokens", "3")
    send(child, "hello")
    reply(child, "/system be brief")
    send(child, "hello")
    reply(child, "/system")
    path = tmp_path / "chat.json"
    assert reply(child, f"/save {path}") == [f"saved 2 turns to {path}"]
    assert leave(child) == 0
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert [turn["system"] for turn in saved["turns"]] == [None, "be brief"]
    assert saved["system"] is None


@pytest.mark.parametrize("pair", [True, False])
def test_the_first_line_wraps_at_spaces_at_a_terminal_of_80_columns(spawn, pair: bool) -> None:
    """The legend and the mode had been written as one raw line of some 100 characters (the default mode's
    "mode large (the default; --mode ead or any switching option turns the pair on)"), which an 80-column
    terminal broke mid-word: it is wrapped at spaces as the lines after it are, nothing dropped."""
    child = spawn(columns=80, pair=pair)
    header = plain(child.before).splitlines()
    assert max(map(len, header)) <= 80, header
    joined = " ".join(line.rstrip() for line in header)
    assert "■ large: large.gguf" in joined and ("■ small: small.gguf" in joined) == pair
    mode = "ead (a switching option or a cascade turns the pair on)" if pair else "large (the default; "
    assert f" · mode {mode}" in joined
    assert joined.endswith("/help lists the commands; Ctrl-D leaves")
    assert "\x1b[1;33m■ large" in child.before  # still in the large model's colour
    assert leave(child) == 0


def test_a_byte_order_mark_at_the_start_of_piped_input_is_not_part_of_the_first_line(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A file saved with a UTF-8 byte-order mark (Notepad's "UTF-8 with BOM") had its first line's command
    sent to the model as a message ('\\ufeff/max-tokens 3', answered in 4 tokens): the mark is skipped,
    there only."""
    path = tmp_path / "chat.json"
    result = pipe(tiny_pair, f"\ufeff/max-tokens 3\nhi\n\ufeffthere\n/save {path}\n".encode())
    assert result.returncode == 0, result.stderr
    lines = result.stderr.decode().splitlines()
    assert lines[0].startswith("settings: ") and lines[0].endswith("max-tokens 3 (from the next answer)")
    assert [turn["user"] for turn in json.loads(path.read_text(encoding="utf-8"))["turns"]] == [
        "hi",
        "\ufeffthere",  # a mark inside the input is text, kept
    ]


def test_a_model_whose_file_name_is_not_utf8_does_not_stop_a_save(
    spawn, tiny_large: Path, tmp_path: Path
) -> None:
    """A model file named with a byte that is not UTF-8 (a name Linux allows) had made every /save fail,
    blaming the transcript's own name ("cannot write '…/chat.json': 'utf-8' codec can't encode character
    '\\udcff' …: surrogates not allowed"): the transcript escapes such a byte as JSON does, and reads back
    to the model's very name."""
    large = tmp_path / os.fsdecode(b"l\xffrge.gguf")
    large.write_bytes(tiny_large.read_bytes())
    # pexpect encodes arguments strictly; the environment goes as the name's bytes, and a shell passes it on
    wrapped = ("/bin/sh", "-c", 'exec "$@" --large "$EAD_TEST_LARGE"', "sh")
    child = spawn("--max-tokens", "3", env={"EAD_TEST_LARGE": str(large)}, wrap=wrapped)
    send(child, "hello")
    path = tmp_path / "chat.json"
    assert reply(child, f"/save {path}") == [f"saved 1 turn to {path}"]
    assert leave(child) == 0
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["models"]["large"] == str(large)
    assert os.fsencode(saved["turns"][0]["summary"]["models"][1]["path"]) == os.fsencode(large)


def test_control_characters_the_user_brought_in_are_shown_spelled_not_acted_on(spawn, tmp_path: Path) -> None:
    """An escape sequence typed (Ctrl-V Esc) or piped in a command's name or a /save file name had reached
    the terminal raw in the line that echoes it: 'ESC[2K ESC[1G' erased that line's start, a bidi override
    reordered it. Such characters are spelled as Python spells them (as ead's other errors do), the rest of
    the line as typed."""
    child = spawn()
    erase = "\x1b[2K\x1b[1G"
    quoted = "".join(f"\x16{char}" for char in erase)  # readline's quoted-insert: each key taken as is

    def lines_after_echo(keys: str) -> list[str]:  # readline echoes a quoted Esc as ^[
        return plain(send(child, keys)).splitlines()[1:]

    assert lines_after_echo(f"/frob{quoted}\u202eob") == [
        "error: unknown command '/frob\\x1b[2K\\x1b[1G\\u202eob' (/help lists the commands)"
    ]
    name = f"a{erase}b.json"
    saved = lines_after_echo(f"/save {tmp_path}/a{quoted}b.json")
    assert saved == [f"saved 0 turns to $'{tmp_path}/a\\x1b[2K\\x1b[1Gb.json'"]
    assert (tmp_path / name).exists()  # the file has the name typed
    assert leave(child) == 0


def test_ctrl_c_with_stdout_redirected_leaves_the_summary_on_a_line_of_its_own(spawn, tmp_path: Path) -> None:
    """With the answers going to a file, Ctrl-C mid-answer had glued the summary to the ^C the terminal
    echoed ("^C1722 tokens · large share …"): the answer's line end went to the file, not the terminal."""
    out = tmp_path / "answers.txt"
    child = spawn("--ctx", "32768", "--max-tokens", "100000", stdout=out)  # an answer that runs for a minute
    type_line(child, "hello")
    child.expect_exact("hello\r\n")
    while not out.stat().st_size:  # the answer is streaming into the file
        child.expect([pexpect.TIMEOUT], timeout=0.05)
    child.sendcontrol("c")
    child.expect_exact(PROMPT)
    lines = plain(child.before).splitlines()
    assert lines[0] == "^C" and SUMMARY.match(lines[1]) and lines[1].endswith("cut (interrupted)"), lines
    assert leave(child) == 0
    assert out.read_text(encoding="utf-8", errors="replace").endswith("\n")  # the answer's line closed there


def test_a_byte_order_mark_does_not_hide_an_over_long_first_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark was dropped before the line's length was judged: a first line cut at the limit, three bytes
    shorter without its mark, passed for a whole line, and the rest of it was read as the next message."""
    import io

    from ead_cli.cli import repl

    monkeypatch.setattr(repl, "MAX_READ_BYTES", 8)
    read_line = repl._pipe_reader(io.BytesIO(b"\xef\xbb\xbf" + b"a" * 20 + b"\n"))
    with pytest.raises(EadError, match="more than"):
        read_line("")
    with pytest.raises(EOFError):
        read_line("")
    within = repl._pipe_reader(io.BytesIO(b"\xef\xbb\xbf" + b"a" * 5 + b"\n"))  # the mark, then a short line
    assert within("") == "aaaaa"


def test_with_stderr_closed_the_chat_goes_on_and_only_its_answers_show(spawn) -> None:
    """``ead chat 2>&-`` at a terminal had written the legend to stdout and ended at the prompt, exit 1,
    silently (Python's sys.stderr is None there): the notes are lost, the answers come."""
    child = spawn("--max-tokens", "4", wrap=("/bin/sh", "-c", 'exec "$@" 2>&-', "sh"))
    assert plain(child.before) == ""  # the legend and the notes went where stderr went
    shown = plain(send(child, "hi")).splitlines()
    assert shown[0] == "hi" and len(shown) == 2 and not SUMMARY.search(shown[1])
    assert leave(child) == 0


@pytest.mark.parametrize(("flag", "env"), [(("--no-color",), {}), ((), {"NO_COLOR": "1"})])
def test_with_colour_off_no_escape_code_reaches_the_terminal(
    spawn, flag: tuple[str, ...], env: dict[str, str]
) -> None:
    """--no-color and NO_COLOR had left the load notes dim ('loading the small model...' in ESC [2m):
    with colour off, not one escape code of ead's reaches the terminal (readline's own, editing the line
    the test types, come before each echo), the notes as they were."""
    child = spawn("--max-tokens", "4", *flag, pair=False, env=env)
    shown = child.before + send(child, "/mode ead") + send(child, "hi")
    assert "\x1b" not in shown, shown
    assert "loading the small model: the pair switches from the next answer" in shown
    assert leave(child) == 0


def test_a_dumb_terminal_wraps_at_its_own_width(spawn) -> None:
    """rich takes a terminal that says it is dumb (TERM=dumb) for 80 columns whatever its size: the first
    line, some 100 characters, had been wrapped at 80 in a terminal of 120. Its real width now; COLUMNS,
    as in any terminal, says another (it had been ignored there)."""

    def first_line(child: pexpect.spawn) -> str:  # after the note that --small goes unused
        return next(line for line in plain(child.before).splitlines() if line.startswith("■ large"))

    child = spawn(columns=120, pair=False, env={"TERM": "dumb"})
    first = first_line(child)
    assert first.startswith("■ large: large.gguf  · mode large (the default;")
    assert first.endswith("turns the pair on)") and len(first) > 80, first
    assert leave(child) == 0
    child = spawn(columns=120, pair=False, env={"TERM": "dumb", "COLUMNS": "60"})
    first = first_line(child)
    assert first.startswith("■ large: large.gguf  · mode large") and len(first) <= 60, first
    assert leave(child) == 0


def test_a_long_bad_value_is_echoed_cut_to_a_readable_length(tiny_pair: tuple[Path, Path]) -> None:
    """A 100 kB argument had been echoed whole in its error line: cut, its full length said."""
    junk = "x" * 100_000
    commands = [f"/tau {junk}", f"/policy {junk}", f"/reset {junk}", f"/save a {junk}", f"/save '{junk}"]
    commands.append(f"/{junk}")
    result = pipe(tiny_pair, "".join(f"{command}\n" for command in commands).encode())
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1 and len(lines) == len(commands), lines
    cut = f"{'x' * 80!r}... (100000 characters)"
    assert lines[0] == f"error: /tau takes a finite number of bits, or one per cascade level, got {cut}"
    assert lines[1].startswith("error: /policy takes one of ") and lines[1].endswith(f", got {cut}")
    assert lines[2] == f"error: /reset takes no argument, got {cut}"
    assert lines[3].endswith(f"got {'a ' + 'x' * 78!r}... (100002 characters)")
    command_cut = f"{'/' + 'x' * 79!r}... (100001 characters)"
    assert lines[5] == f"error: unknown command {command_cut} (/help lists the commands)"
    assert all(len(line) < 300 for line in lines), lines


def repl_on(runners: list[Runner], messages: list[str], *, max_tokens: int = 100) -> tuple[Repl, io.BytesIO]:
    """The REPL of a person at a terminal, in this process, on the tiny pair: it reads ``messages`` then
    ends; its answers go to a file (the bytes returned), its notes to a string (``repl.err``)."""
    conversation = Conversation(runners, PolicyOptions(tau=3.0), GenerationOptions(max_tokens=max_tokens))
    pending = list(messages)

    def read_line(prompt: str) -> str:
        if not pending:
            raise EOFError
        return pending.pop(0)

    answers = io.BytesIO()
    out = io.TextIOWrapper(answers, encoding="utf-8", write_through=True)
    repl = Repl(conversation, read_line, out=out, err=io.StringIO(), color=False, interactive=True)
    return repl, answers


def test_the_reasoning_budget_message_is_set_and_cleared_mid_conversation(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    """--reasoning-budget-message could be given only at the start: /reasoning-budget-message TEXT is
    written before </think> once the next answers' budget is spent, the settings line and /stats say it,
    and the command alone clears it (the budget then closes the block with </think> alone, as at first)."""
    runners = open_pair(tiny_think_pair)
    message = "Enough, answering."
    typed = ["/reasoning-budget 3", "hi", "/clear", f"/reasoning-budget-message {message}", "hi", "/stats"]
    typed += ["/reasoning-budget-message", "/clear", "hi"]
    try:
        repl, answers = repl_on(runners, typed, max_tokens=32)
        assert repl.loop() == 0
    finally:
        close_all(runners)
    bare, told, cleared = answers.getvalue().decode("utf-8", "replace").split(THINKING)[1:]
    thinking = [answer.partition(DONE_THINKING)[0] for answer in (bare, told, cleared)]
    assert thinking[1] == thinking[0] + message  # the model's own tokens, then the message as typed
    assert cleared == bare and told != bare
    settings = [
        line.removesuffix(" (from the next answer)").partition(" · max-tokens 32")[2]
        for line in repl.err.getvalue().splitlines()
        if line.startswith(("settings: ", "context: "))
    ]
    said = f" · reasoning-budget 3 · reasoning-budget-message {quoted(message)}"
    assert settings == [" · reasoning-budget 3", said, said, " · reasoning-budget 3"]  # the last: cleared


def raised() -> None:
    """A Ctrl-C that Python raises at its next check, wherever the code then is (``tests/ctrl_c.py``)."""
    _thread.interrupt_main()


def sent() -> None:
    """A real SIGINT to the main thread, which code that holds Ctrl-C back (``main_thread_signals``) holds."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


CtrlC = tuple[CodeType, str, int, Callable[[], None]]


def ctrl_c_at(code: CodeType, event: str, nth: int, ctrl_c: Callable[[], None]) -> Callable[..., None]:
    """For ``sys.setprofile`` (or ``sys.settrace``, which shows calls only): a Ctrl-C as the function of
    ``code`` sees the nth ``event`` ("call" or "return"), ``raised`` or ``sent``. Python may raise it in
    this function, which then ends the profiling (or tracing): a test that gives two uses one of each."""
    seen = []

    def trip(frame: FrameType, happening: str, _: object) -> None:
        if frame.f_code is code and happening == event and len(seen) < nth:
            seen.append(1)
            if len(seen) == nth:
                ctrl_c()

    return trip


def test_a_token_counted_before_a_ctrl_c_is_shown_in_every_answer_not_only_the_first(
    runners: list[Runner],
) -> None:
    """A Ctrl-C after the decoder counted a token but before the REPL showed it: the REPL shows it itself.
    It had compared the token's index with the last one shown in the whole session, so a second answer's
    first token, cut so, was in the turn (and in what the models read) but never on screen."""
    repl, answers = repl_on(runners, ["hello", "again"], max_tokens=8)
    sys.setprofile(ctrl_c_at(Decoder._announce.__code__, "return", 8 + 1, raised))  # the second answer's
    try:
        assert repl.loop() == 0
    finally:
        sys.setprofile(None)
    first, second = repl.conversation.turns
    assert first.summary.generated == 8 and [event.index for event in second.events] == [0]
    assert second.events[0].text, "the token cut has text to show"
    shown = "".join(event.text for event in first.events) + "\n" + second.events[0].text + "\n"
    assert answers.getvalue().decode() == shown


@pytest.mark.parametrize(
    "second",
    [(Conversation._close_turn.__code__, "call", 1, sent), (Repl.note.__code__, "call", 2, sent)],
    ids=["while the turn is recorded", "while its summary is written"],
)
def test_a_second_ctrl_c_as_a_cut_answer_ends_keeps_its_summary(runners: list[Runner], second: CtrlC) -> None:
    """An impatient second Ctrl-C that lands while the first one's answer is being recorded (the library
    holds it back until the turn is whole, then raises it) or while its summary is written had left the
    summary out or cut it short: the answer is stopped already, so the summary is written whole, then the
    second Ctrl-C does what one at the prompt does (a fresh line)."""
    repl, answers = repl_on(runners, ["hello", "/stats"])
    sys.setprofile(ctrl_c_at(TextRenderer.event.__code__, "call", 3, raised))  # in the REPL, not the models
    sys.settrace(ctrl_c_at(*second))
    try:
        assert repl.loop() == 0
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    [turn] = repl.conversation.turns
    summary, *notes = repl.err.getvalue().splitlines()[2:]  # after the legend and the hint
    assert SUMMARY.fullmatch(summary.removesuffix(" · cut (interrupted)"))
    assert summary.endswith(" · cut (interrupted)")
    assert notes[:2] == ["", "last answer:"]  # a fresh line, then the /stats after it: the session went on
    assert [event.index for event in turn.events] == [0, 1, 2]
    assert answers.getvalue().decode() == "".join(event.text for event in turn.events) + "\n"


def test_ctrl_c_twice_quickly_during_answers_keeps_each_summary_and_the_session(spawn) -> None:
    """At a real terminal: Ctrl-C, then another as soon as the terminal echoes the first, over ten answers.
    The second had often landed while the first one's answer was being closed, and its summary line was
    never written (the in-process tests above trip each such point exactly)."""
    child = spawn("--ctx", "32768", "--max-tokens", "100000")  # answers that run for a minute
    for _ in range(10):
        type_line(child, "hello")
        child.expect(r"\x1b\[(36|1;33)m")  # the answer is streaming
        child.sendcontrol("c")
        child.expect_exact("^C")
        child.sendcontrol("c")
        assert child.expect([SUMMARY, PROMPT]) == 0, plain(child.before)
        child.expect_exact(" · cut (interrupted)")
        child.expect_exact(PROMPT)
    assert "Traceback" not in plain(child.before)
    assert "session: " in plain(send(child, "/stats"))  # the session went on
    assert leave(child) == 0


def test_a_ctrl_c_as_a_command_says_what_it_did_is_no_claim_that_nothing_changed(
    runners: list[Runner],
) -> None:
    """A Ctrl-C while /tau wrote the settings it had just made had been reported as '/tau stopped
    (Ctrl-C): nothing changed', and /stats then showed the new tau: a command's line is written whole,
    then the Ctrl-C does what one at the prompt does."""
    repl, _ = repl_on(runners, ["/tau 2.5", "/stats"])
    sys.settrace(ctrl_c_at(spelled.__code__, "call", 2, sent))  # the first is the hint at the start
    try:
        assert repl.loop() == 0
    finally:
        sys.settrace(None)
    changed, fresh, *stats = repl.err.getvalue().splitlines()[2:]
    assert changed.startswith("settings: mode ead · policy gate · tau 2.5 · ")
    assert changed.endswith(" (from the next answer)")
    assert fresh == ""
    assert stats[0] == "no answer yet in this conversation"
    assert stats[2].startswith("context: 0 of 512 tokens · settings: mode ead · policy gate · tau 2.5 · ")


def interruptible_keeping_output() -> None:
    """``interruptible``, and the terminal's NOFLSH: by default a Ctrl-C makes the terminal drop what the
    program wrote that the other side has not read yet, and pexpect, on a loaded machine, reads late (a
    prompt it never sees whole). A terminal window reads at once; what is tested is what the chat wrote."""
    interruptible()
    attributes = termios.tcgetattr(0)
    attributes[3] |= termios.NOFLSH
    termios.tcsetattr(0, termios.TCSANOW, attributes)


def test_ctrl_c_twice_at_the_prompt_never_ends_the_session(spawn) -> None:
    """Two Ctrl-Cs at the prompt, 50 to 54 ms apart (pexpect pauses 50 ms before each send), a hundred
    times. The second could come while the REPL handled the first, and Python raised it wherever the REPL
    then was, outside any handler: 'error: interrupted', the session over (2 sessions of 15 on a loaded
    2-core AMD EPYC); one that interrupted readline's write of a prompt character dropped it (a prompt
    drawn '>> ', about 1 pair in 300). Each now only clears the line, and every prompt is whole. The first
    of each pair comes once readline waits for a key (``wait_ready``): one that lands in the instant
    before, CPython notices only at the next key (docs/chat.md), and a loaded machine can stretch it."""
    child = spawn("--max-tokens", "4", preexec_fn=interruptible_keeping_output)
    for pair in range(100):
        wait_ready(child)
        child.sendcontrol("c")
        time.sleep(pair % 8 / 2000)
        child.sendcontrol("c")
        assert child.expect_exact([PROMPT, pexpect.EOF]) == 0, plain(child.before)
    assert "error:" not in plain(child.before)
    assert SUMMARY.search(plain(send(child, "hello")))  # the session went on
    assert leave(child) == 0


def test_a_ctrl_c_as_the_fresh_line_after_one_is_written_never_ends_the_session(
    runners: list[Runner],
) -> None:
    """The exact point of the test above: read_line raises KeyboardInterrupt as input() does on Ctrl-C, and
    another Ctrl-C is raised as the REPL writes the fresh line for it."""
    conversation = Conversation(runners, PolicyOptions(tau=3.0), GenerationOptions(max_tokens=4))
    lines, armed = ["ctrl-c", "/stats"], []

    def read_line(prompt: str) -> str:
        if not lines:
            raise EOFError
        if lines.pop(0) == "ctrl-c":
            armed.append(1)
            raise KeyboardInterrupt
        return "/stats"

    err = io.StringIO()
    repl = Repl(conversation, read_line, out=sys.stdout, err=err, color=False, interactive=True)

    def trip(frame: FrameType, event: str, function: object) -> None:
        if armed and event == "c_call" and getattr(function, "__self__", None) is err:
            armed.clear()
            _thread.interrupt_main()

    sys.setprofile(trip)
    try:
        assert repl.loop() == 0
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C ended the session")
    finally:
        sys.setprofile(None)
    assert "no answer yet in this conversation" in err.getvalue()  # the /stats after it ran


def test_a_terminal_opened_as_stdin_for_writing_only_is_one_line(tiny_pair: tuple[Path, Path]) -> None:
    """``ead chat 0>/dev/tty``: isatty() holds, but readline's reads fail, which it takes for the input's
    end: the prompt showed and the first key ended the chat, silently, exit 0. One line, before the
    models load (a pipe opened so, ``0>file``, said the same only after the load)."""
    command = shlex.join([str(EAD), *chat_args(tiny_pair)]) + " 0>/dev/tty"
    child = pexpect.spawn("/bin/sh", ["-c", command], encoding="utf-8", timeout=30, dimensions=(40, 250))
    child.expect(pexpect.EOF)
    child.close()
    assert plain(child.before) == "error: cannot read the input: stdin is not open for reading\n"
    assert child.exitstatus == 1


def test_ollamas_spellings_of_eads_commands_run_them(spawn) -> None:
    """What a user of ``ollama run`` types first: where ollama's command means one of ead's, it runs it (an
    alias declared beside ead's command); where none matches, the line names the nearest, never a wrong
    one ('/set' had been 'did you mean /reset?')."""
    child = spawn("--max-tokens", "3")
    [changed] = reply(child, "/set parameter temperature 0.7")
    drawn = " · temp 0.7 · top-k 40 · top-p 0.95 · min-p 0.05 · seed 0 · "
    assert changed.endswith(f"{drawn}max-tokens 3 (from the next answer)")
    [changed] = reply(child, "/set  parameter  num_predict 5")
    assert changed.endswith(f"{drawn}max-tokens 5 (from the next answer)")
    refused = "error: /max-tokens takes a whole number, got 'x'"
    assert reply(child, "/set parameter num_predict x") == [refused]
    assert reply(child, "/set system be brief") == ["system message set (from the next answer)"]
    assert SUMMARY.search(plain(send(child, "hello")))
    assert reply(child, "/clear") == ["new conversation"]
    assert reply(child, "/?")[0].startswith("/help ")
    assert reply(child, "/set verbose") == ["error: unknown command '/set' (/help lists the commands)"]
    assert reply(child, "/show info") == ["error: unknown command '/show' (did you mean /stats?)"]
    assert reply(child, "/quit") == ["error: unknown command '/quit' (did you mean /exit?)"]
    stats = " ".join(reply(child, "/stats"))
    assert (
        "no answer yet in this conversation" in stats
        and " · temp 0.7 · top-k 40 · top-p 0.95 · min-p 0.05 · seed 0 · max-tokens 5" in stats
    )
    type_line(child, "/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_set_think_on_a_model_that_does_not_think_says_so_and_changes_nothing(spawn) -> None:
    """ollama warns where a model cannot think: /set think and /set nothink say so in one line, and the
    settings stay as they were (no thinking turned off that a later thinking model would inherit)."""
    child = spawn()
    said = "this model does not think: /think changes nothing"
    assert reply(child, "/set think") == reply(child, "/set nothink") == reply(child, "/think off") == [said]
    assert "reasoning-budget" not in " ".join(reply(child, "/stats"))
    assert leave(child) == 0


THINK_CLOSING = ("-n", "32", "--logit-bias", f"{CLOSE_ID}+5")  # the think block closes and text follows it


def generated_thinking(pair: tuple[Path, Path], *options: str) -> str:
    """What ``ead generate`` shows at a terminal for "hi" on the tiny thinking pair, with ``options``."""
    args = ("generate", *pair_args(pair), "--tau", "3", *THINK_CLOSING, *options, "hi")
    return plain(at_a_terminal(*args, env={"TERM": "xterm"}).decode("utf-8", "replace"))


def fresh_answer(child: pexpect.spawn) -> str:
    """The chat's answer to "hi" in a new conversation."""
    assert reply(child, "/clear") == ["new conversation"]
    return plain(send(child, "hi"))


def test_ollamas_think_commands_turn_the_next_answers_thinking_off_on_hidden_or_shown(
    spawn, tiny_think_pair: tuple[Path, Path]
) -> None:
    """Mid-conversation, as ollama's REPL: each answer (to "hi", in a new conversation) is generate's with
    the matching option: hidden (--hide-thinking), off through the template (--reasoning-budget 0: another
    prompt, another text), on and shown again, cut short by a budget (/reasoning-budget 3); a level
    (gpt-oss's high/medium/low) is refused in one line."""
    child = spawn(*THINK_CLOSING, models=tiny_think_pair)
    generated = partial(generated_thinking, tiny_think_pair)
    answer = partial(fresh_answer, child)

    shown, hidden, off = (
        generated(*options) for options in ([], ["--hide-thinking"], ["--reasoning-budget", "0"])
    )
    assert shown.startswith(THINKING) and DONE_THINKING in shown and THINKING not in hidden + off
    assert shown in answer()
    assert reply(child, "/set hidethinking") == ["thinking hidden (from the next answer)"]
    without = answer()
    assert hidden in without and THINKING not in without
    assert reply(child, "/set nohidethinking") == ["thinking shown (from the next answer)"]
    assert reply(child, "/set nothink") == ["thinking off (from the next answer)"]
    assert off != hidden and off in answer()
    assert reply(child, "/set think") == ["thinking on (from the next answer)"]
    assert shown in answer()
    refused = "error: /think high: ead turns thinking on or off, it has no levels (high, medium, low)"
    assert reply(child, "/set think high") == [refused]
    assert reply(child, "/think maybe") == ["error: /think takes on or off, got 'maybe'"]
    assert reply(child, "/hide-thinking on") == ["thinking hidden (from the next answer)"]
    assert reply(child, "/reasoning-budget 0")[0].endswith(" · reasoning-budget 0 (from the next answer)")
    assert off in answer()
    budgeted = generated("--hide-thinking", "--reasoning-budget", "3")  # thinking cut short: another answer
    assert reply(child, "/reasoning-budget 3")[0].endswith(" · reasoning-budget 3 (from the next answer)")
    assert budgeted not in (off, hidden) and budgeted in answer()
    help_lines = reply(child, "/help")
    assert any(line.startswith("/think on|off ") for line in help_lines)
    assert any(line.startswith("/hide-thinking on|off ") for line in help_lines)
    assert leave(child) == 0


def test_reasoning_format_sets_how_the_next_answers_thinking_is_shown(
    spawn, tiny_think_pair: tuple[Path, Path]
) -> None:
    """llama.cpp's --reasoning-format mid-conversation: none shows the answer as the model wrote it, its
    block in the text (generate's --reasoning-format none), deepseek and auto apart again; a value that is
    none of them is refused in one line and changes nothing."""
    child = spawn(*THINK_CLOSING, models=tiny_think_pair)
    generated = partial(generated_thinking, tiny_think_pair)
    answer = partial(fresh_answer, child)

    def settings(typed: str) -> str:
        """The settings line a command says (wrapped at the terminal's width), from the next answer."""
        return " ".join(" ".join(reply(child, typed)).split()).removesuffix(" (from the next answer)")

    apart, whole = generated(), generated("--reasoning-format", "none")
    assert apart.startswith(THINKING) and THINKING not in whole and "</think>" in whole
    assert settings("/reasoning-format none").endswith(" · max-tokens 32 · reasoning-format none")
    assert whole in answer()
    refused = "error: /reasoning-format takes one of auto, deepseek, none, got 'deepseek-legacy'"
    assert reply(child, "/reasoning-format deepseek-legacy") == [refused]
    assert settings("/stats").endswith(" · reasoning-format none")  # as it was
    assert whole in answer()
    assert settings("/reasoning-format deepseek").endswith(" · reasoning-format deepseek")
    assert apart in answer()
    assert settings("/reasoning-format none").endswith(" · reasoning-format none")
    assert settings("/reasoning-format auto").endswith(" · max-tokens 32")  # the default, unsaid
    assert apart in answer()
    assert any(line.startswith("/reasoning-format NAME ") for line in reply(child, "/help"))
    assert leave(child) == 0

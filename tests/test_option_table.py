"""The option table (``option_table.DECODING``): every decoding option declared once, and each surface made
from it (the command line, serve's ``ead`` object, the bench's lists, chat's commands, the docs' table);
the mode decided in one place when none is given."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import typer

import ead_cli
from ead_cli.bench.grid import SWEPT
from ead_cli.cli import app
from ead_cli.errors import EadError
from ead_cli.option_table import (
    BENCH,
    CHAT,
    CLI,
    DECODING,
    DEFAULT_MODE,
    OPTIONS,
    SERVE,
    SWITCHING,
    on,
    resolve_mode,
)
from ead_cli.options import PolicyOptions
from ead_cli.policies import POLICY_KINDS

SWITCHING_DOC = (Path(ead_cli.__file__).resolve().parent.parent / "docs" / "switching.md").read_text()


def command_options(*path: str) -> dict[str, list[str]]:
    """A command's options: parameter name -> its spellings."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {param.name: list(param.opts) for param in command.params}


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_the_decoding_group_is_the_tables_cli_options(command: str) -> None:
    options = command_options(command)
    for option in on(CLI):
        assert options[option.name][0] == option.flag
        assert {*option.older, *option.llama_spellings} <= set(options[option.name])


def test_the_bench_sweeps_every_option_a_policy_multiplies_under_its_one_spelling() -> None:
    swept = {name for kind in POLICY_KINDS.values() for name in kind.sweeps}
    lookup = {"lookup", "lookup_draft"}
    assert swept <= {option.name for option in on(BENCH)} <= set(SWEPT) | {"draft_entropy_stop", *lookup}
    options = command_options("bench", "humaneval")
    for option in on(BENCH):
        assert options[option.name] == [option.flag, *option.older]


def test_serves_ead_object_is_the_tables_serve_options() -> None:
    from pydantic import ValidationError

    from ead_cli.serve.schemas import MAX_COUNT, EadOptions

    assert list(EadOptions.model_fields) == [option.name for option in on(SERVE)]
    for name, low, high in [("window", 1, MAX_COUNT), ("min_run", 0, MAX_COUNT), ("lookup", 0, 64)]:
        assert OPTIONS[name].minimum == low  # the table's bounds, and serve's MAX_COUNT under any other
        EadOptions(**{name: low})
        EadOptions(**{name: high})
        for past in (low - 1, high + 1):
            with pytest.raises(ValidationError, match=name):
                EadOptions(**{name: past})


def test_chats_commands_are_the_tables_chat_options() -> None:
    from ead_cli.cli.repl import Repl

    repl = Repl.__new__(Repl)
    with open(os.devnull, "w") as out:  # a file: the renderer writes bytes under the text layer
        Repl.__init__(
            repl, conversation=None, read_line=input, out=out, err=None, color=False, interactive=False
        )  # type: ignore[arg-type]
    commands = [name for name in repl.commands if f"/{name}" in {o.command for o in DECODING}]
    assert commands == [option.command[1:] for option in on(CHAT)]


def test_an_option_reads_its_text_or_names_itself_in_one_line() -> None:
    assert OPTIONS["tau"].read("1,2") == (1.0, 2.0)
    assert OPTIONS["burst"].read("line") == "line" and OPTIONS["burst"].read("3") == 3
    assert OPTIONS["window"].read("4", "/window") == 4
    with pytest.raises(EadError, match=r"^/window takes a whole number, got 'x'$"):
        OPTIONS["window"].read("x", "/window")
    with pytest.raises(EadError, match=r"^--temp must be a finite number, got 'inf'$"):
        OPTIONS["temp"].read("inf")
    with pytest.raises(EadError, match=r"^/mode takes one of ead, small, large, spec, got 'fast'$"):
        OPTIONS["mode"].read("fast", "/mode")


def doc_row(flag: str) -> str:
    """The row of docs/switching.md's options table that names ``flag``."""
    rows = [line for line in SWITCHING_DOC.splitlines() if line.startswith("| ")]
    named = [row for row in rows if re.search(rf"`{re.escape(flag)}(?![\w-])", row)]
    return next(
        (row for row in named if re.search(rf"`{re.escape(flag)}(?![\w-])", row.split(" | ")[0])), named[0]
    )


def test_the_docs_table_names_every_option_with_its_default() -> None:
    for option in on(CLI):
        row = doc_row(option.flag)
        if option.choices:
            assert "\\|".join(option.choices) in row or all(f"`{c}`" in row for c in option.choices), row
        if option.target == "policy" and option.shown_default is not None:
            assert f"default {option.shown_default}" in row or f"`{option.shown_default}` (default)" in row, (
                row
            )
    assert f"else `{DEFAULT_MODE}`" in doc_row("--mode")


def test_the_docs_list_every_switching_option_in_the_default_modes_rule() -> None:
    section = SWITCHING_DOC.split("## The default mode", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{OPTIONS[name].flag}`" in section for name in SWITCHING)
    assert f"the default mode, `{DEFAULT_MODE}`" in section


# --- the mode when none is given ------------------------------------------------------------------------


def test_the_mode_is_resolved_in_one_place() -> None:
    assert resolve_mode("small", {"tau"}) == "small"  # given: it decides
    assert resolve_mode(None, ()) == DEFAULT_MODE
    assert resolve_mode(None, {"lookup", "temp", "draft"}) == DEFAULT_MODE  # not switching options
    assert all(resolve_mode(None, {name}) == "ead" for name in SWITCHING)
    assert resolve_mode(None, {"patterns"}) == "ead"  # a PolicyOptions field name counts too
    assert resolve_mode(None, (), levels=3) == "ead"  # a cascade


def test_policy_options_resolve_the_mode_and_keep_a_given_one() -> None:
    assert PolicyOptions().mode == DEFAULT_MODE and not PolicyOptions().mode_given
    assert PolicyOptions(tau=2.0).mode == "ead"
    assert PolicyOptions(given=("policy",)).mode == "ead"  # --policy gate: at its default, but given
    assert PolicyOptions(levels=3).mode == "ead"
    assert PolicyOptions(mode="large", tau=2.0).mode == "large"
    unset = PolicyOptions(lookup=3)
    assert unset.changed(min_run=10).mode == "ead"  # a chat command or a request's field, at its default
    assert unset.changed(mode="small").changed(tau=1.0).mode == "small"  # a given mode stays
    assert PolicyOptions(mode="spec").changed(draft=3).mode == "spec"


# --- the rule on each surface, for real on the tiny pair ---------------------------------------------------


def writers(*args: str) -> tuple[set[str], str]:
    """The models that wrote a short `ead generate --stats` answer on the tiny pair, and its stats."""
    from test_cli import ead

    result = ead("generate", *args, "--max-tokens", "12", "--format", "jsonl", "--stats", "hello wörld")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return {line["model"] for line in lines if line["type"] == "token"}, result.stderr.decode()


def test_generate_resolves_the_mode_from_the_options_given(tiny_pair: tuple[Path, Path]) -> None:
    from test_cli import pair_args

    pair = pair_args(tiny_pair)
    bare, stats = writers(*pair)
    assert bare == ({"large"} if DEFAULT_MODE == "large" else {"small", "large"})
    assert f"mode {DEFAULT_MODE} (the default" in stats
    assert "mode ead (a switching option" in writers(*pair, "--tau", "1")[1]
    switching, stats = writers(*pair, "--tau", "3")
    assert switching == {"small", "large"} and "mode ead (a switching option" in stats
    assert writers(*pair, "--min-run", "10")[0] == writers(*pair, "--mode", "ead")[0]  # at its default
    given, stats = writers(*pair, "--mode", "small", "--tau", "3")
    assert given == {"small"} and "mode small\n" in stats
    # a given mode leaves every switching option unused (each still checked)
    assert writers(*pair, "--mode", "large", "--policy", "lookahead", "--verify", "1")[0] == {"large"}


def test_generate_says_in_one_line_which_given_options_go_unused(tiny_pair: tuple[Path, Path]) -> None:
    """Not refused (one command line serves every mode) but not silent: a mode's switching options, the
    options only another policy reads, spec's draft stop, greedy decoding's samplers, lookup's guess
    length with lookup off."""
    from test_cli import ead, pair_args

    def notes(*args: str) -> list[str]:
        result = ead("generate", *pair_args(tiny_pair), "--max-tokens", "2", *args, "hi")
        assert result.returncode == 0, result.stderr
        return [line for line in result.stderr.decode().splitlines() if line.startswith("note:")]

    switch = "(--mode ead switches between the pair)"
    assert notes("--mode", "large", "--tau", "1", "--min-run", "4", "--seed", "3") == [
        f"note: --mode large leaves --small, --tau, --min-run unused {switch}; --temp 0 leaves --seed unused"
    ]
    assert notes("--policy", "gate", "--min-run", "4", "--draft", "8", "--draft-entropy-stop", "1") == [
        "note: --policy gate leaves --min-run, --draft unused; --mode ead leaves --draft-entropy-stop unused"
    ]
    assert notes("--policy", "lookahead", "--window", "3", "--switch-point", "after") == [
        "note: --policy lookahead leaves --window, --switch-point unused"
    ]
    default = f"note: the default mode (--mode large) leaves --small unused {switch}"
    assert notes() == [default]
    assert notes("--lookup", "0", "--lookup-draft", "8") == [
        f"{default}; --lookup 0 leaves --lookup-draft unused"
    ]
    spec = ["note: --mode spec leaves --policy unused"]
    assert notes("--mode", "spec", "--policy", "ead", "--draft", "2") == spec
    for read in (
        ["--policy", "ead", "--min-run", "4", "--window", "3", "--switch-point", "after"],
        ["--policy", "lookahead", "--draft", "8", "--verify", "0.5"],
        ["--mode", "spec", "--draft", "2", "--draft-entropy-stop", "1", "--temp", "0.7", "--top-p", "0.9"],
        ["--mode", "small", "--lookup", "0", "--temp", "0", "--max-tokens", "2"],
    ):
        assert notes(*read) == [], read


def test_the_default_mode_names_the_small_model_it_leaves_unused(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The large model alone writes a bare run's answer: a small model named for it (--small, or the
    first of two --models) is said to go unused, once, with how the pair is turned on, by generate, chat
    (until a command turns the pair on) and serve (at start, in its log: a request may turn it on)."""
    from serve_process import Server
    from test_cli import ead

    small, large = (str(path) for path in tiny_pair)
    by_generate = "(--mode ead switches between the pair)"

    def notes(command: str, *args: str) -> list[str]:
        stdin = "hi\n" if command == "chat" else None
        prompt = ["hi"] if command == "generate" else []
        result = ead(command, "--threads", "1", "--max-tokens", "2", *args, *prompt, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stderr.decode().splitlines() if line.startswith("note:")]

    for models in (["--small", small, "--large", large], ["--models", f"{small},{large}"]):
        named = models[0] if models[0] == "--small" else "the smaller --models"
        default = f"note: the default mode (--mode large) leaves {named} unused"
        assert notes("generate", *models) == [f"{default} {by_generate}"]
        assert notes("chat", *models) == [f"{default} (/mode ead switches between the pair)"]
    assert notes("generate", "--large", large) == []  # the catalog's small model is no choice of the user's
    for switching in (["--mode", "ead"], ["--tau", "3"], ["--mode", "small"], ["--mode", "spec"]):
        assert notes("generate", "--small", small, "--large", large, *switching) == [], switching

    with Server(["--small", small, "--large", large, "--threads", "1"], tmp_path / "server.log") as server:
        said = [line for line in server.log().splitlines() if line.startswith("note:")]
        assert server.stop() == 0
    switch = "(--mode ead, or a request's ead.mode, switches between the pair)"
    assert said == [f"note: the default mode (--mode large) leaves --small unused {switch}"]


def test_chat_commands_resolve_the_mode(tiny_pair: tuple[Path, Path]) -> None:
    from test_cli import ead, pair_args

    def settings(*args: str, commands: str) -> list[str]:
        result = ead("chat", *pair_args(tiny_pair), *args, stdin=commands)
        assert result.returncode == 0, result.stderr
        return re.findall(r"settings: mode (\w+)", result.stderr.decode())

    assert settings(commands="/stats\n/temp 0.5\n/min-run 10\n") == [DEFAULT_MODE, DEFAULT_MODE, "ead"]
    assert settings("--mode", "small", commands="/tau 3\n") == ["small"]
    assert settings("--tau", "3", commands="/mode large\n/tau 2\n") == ["large", "large"]

"""Habits users bring, through real subprocesses: ``ead --version``, shell completion as Typer offers it,
``python -m ead_cli`` behaving like ``ead``, and llama.cpp's spellings of the options they share."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from test_cli import EAD, assert_one_line_error, ead, every_command, pair_args
from typer.core import TyperGroup

from ead_cli.cli import app

PYTHON_M = [sys.executable, "-m", "ead_cli"]


def python_m(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON_M, *args], capture_output=True, timeout=120)


def test_version_comes_from_the_package_metadata() -> None:
    expected = f"ead {importlib.metadata.version('ead-cli')}\n".encode()
    for result in (ead("--version"), python_m("--version")):
        assert (result.returncode, result.stdout, result.stderr) == (0, expected, b"")


def test_python_m_is_the_same_command() -> None:
    for args in (["--help"], ["models", "--help"], ["generate", "--help"]):
        assert python_m(*args).stdout == ead(*args).stdout
    for args in (["generate", "--tau", "nan", "x"], ["no-such-command"]):
        via_module, via_script = python_m(*args), ead(*args)
        assert via_module.returncode == via_script.returncode == 2
        assert assert_one_line_error(via_module, 2) == assert_one_line_error(via_script, 2)


def in_bash(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``ead ARGS`` started by a real bash, as a user's terminal would: Typer detects the shell from the
    parent process. HOME is tmp_path, so the install writes there. (Not the last command of the -c
    string, so bash does not exec it in its own place.)"""
    command = " ".join(shlex.quote(word) for word in (EAD, *args))
    return subprocess.run(
        ["bash", "-c", f"{command}; exit $?"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=120,
    )


def test_show_completion_prints_the_bash_script(tmp_path: Path) -> None:
    result = in_bash(tmp_path, "--show-completion")
    assert result.returncode == 0, result.stderr
    assert "_EAD_COMPLETE=complete_bash" in result.stdout and "complete -o default -F" in result.stdout
    assert not (tmp_path / ".bashrc").exists()


def test_install_completion_writes_the_script_and_it_completes(tmp_path: Path) -> None:
    result = in_bash(tmp_path, "--install-completion")
    assert result.returncode == 0, result.stderr
    script = tmp_path / ".bash_completions" / "ead.sh"
    assert f"bash completion installed in {script}" in result.stdout
    assert "_EAD_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    # What bash runs on <TAB>: the program with the completion variables set.
    for words, expected in (
        ("ead gen", "generate"),
        ("ead models r", "rm"),
        ("ead generate --pol", "--policy"),
    ):
        completed = subprocess.run(
            [EAD],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "_EAD_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - 1),
            },
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr
        assert expected in completed.stdout.split(), (words, completed.stdout)


# --- llama.cpp's spellings (common/arg.cpp), typed from llama-cli and llama-server habits ---------------

# ead's spelling -> llama.cpp's spellings of the same option, on every command that takes it
LLAMA_SPELLINGS = {
    "--ctx": ("-c", "--ctx-size"),
    "--threads": ("-t",),
    "--n-gpu-layers": ("-ngl", "--gpu-layers"),
    "--max-tokens": ("-n", "--n-predict"),
    "--seed": ("-s",),
    "--system": ("-sys", "--system-prompt"),
    "--large": ("-m", "--model"),  # llama-server -m BIG -md SMALL: the model and its speculative draft
    "--small": ("-md", "--model-draft"),
}


def test_every_command_takes_llama_cpps_spellings_beside_its_own() -> None:
    """Declared once, where ead's option is: every command with ``--ctx`` takes ``-c`` too (calibrate's
    --max-tokens had a declaration of its own), and no spelling names two options of one command."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    commands = [command for _, command in every_command(root)]
    for command in commands:
        names = [name for p in command.params for name in (*p.opts, *p.secondary_opts)]
        assert len(names) == len(set(names)), (command.name, names)
        for parameter in command.params:
            for ours, theirs in LLAMA_SPELLINGS.items():
                if ours in parameter.opts:
                    assert set(theirs) <= set(parameter.opts), (command.name, parameter.opts)
    taking = {ours: sum(ours in p.opts for c in commands for p in c.params) for ours in LLAMA_SPELLINGS}
    assert taking.pop("--system") >= 2, taking  # generate and chat
    assert min(taking.values()) >= 3, taking  # generate, chat and serve at least


def test_h_is_the_help_as_in_llama_cpp() -> None:
    """llama.cpp's -h is its --help, at every command, a group's too: it had been 'No such option: -h'."""
    for command in ([], ["generate"], ["bench"], ["bench", "humaneval"], ["depth", "eval"]):
        long, short = ead(*command, "--help"), ead(*command, "-h")
        assert long.returncode == short.returncode == 0, short.stderr
        assert short.stdout == long.stdout and b"-h, --help" in long.stdout


def test_the_help_of_json_schema_says_what_an_empty_schema_allows(tiny_pair: tuple[Path, Path]) -> None:
    """'{}' is any JSON value to ead's converter (serve's JSON mode, docs/serve.md), where llama-cli's
    writes an object: the help had said "'{}': any JSON object", and an answer of '{}' was a bare number.
    It says both now, and the object's schema it names gives an object."""
    shown = " ".join(ead("generate", "--help").stdout.decode().split())
    assert "('{}': any JSON value, where llama-cli's is any object: '{\"type\": \"object\"}')" in shown
    base = ["generate", *pair_args(tiny_pair), "--max-tokens", "20", "--raw", "1"]
    assert not ead(*base, "-j", "{}").stdout.startswith(b"{")
    assert ead(*base, "-j", '{"type": "object"}').stdout.startswith(b"{")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-c", "8"], "--ctx must be at least 16, got 8"),
        (["--ctx-size", "8"], "--ctx must be at least 16, got 8"),
        (["-t", "0"], "--threads must be at least 1, got 0"),
        (["-tb", "0"], "--threads-batch must be at least 1, got 0"),
        (["-ngl", "-5"], "--n-gpu-layers must be -1 (every layer) or at least 0, got -5"),
        (["--gpu-layers", "-5"], "--n-gpu-layers must be -1 (every layer) or at least 0, got -5"),
        (["-n", "-2"], "--max-tokens must be -1 (no limit) or at least 0, got -2"),  # -1: llama.cpp's
        (["--n-predict", "-2"], "--max-tokens must be -1 (no limit) or at least 0, got -2"),
        (["-s", "-1"], "--seed must be in"),  # llama.cpp's -1 is a random seed: ead refuses it
        (["-m", " "], "--large must name a model"),
        (["--model-draft", ""], "--small must name a model"),
    ],
)
def test_llama_cpps_spellings_are_checked_as_eads(tmp_path: Path, args: list[str], fragment: str) -> None:
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    assert_one_line_error(ead("generate", *absent, *args, "hi"), 2, fragment)


@pytest.mark.parametrize(
    ("command", "spelling"),
    [
        (["serve"], "-sys"),
        (["calibrate"], "-sys"),
        (["bench", "humaneval"], "-sys"),
        (["models", "list"], "-ngl"),
    ],
)
def test_a_llama_cpp_spelling_a_command_lacks_is_named_as_typed(command: list[str], spelling: str) -> None:
    """click reads a word of one dash it does not know as a shorter option with the rest glued on as its
    value: serve's '-sys x' had been 'Invalid value for '--seed' / '-s'' (-s with 'ys'), calibrate's 'No
    such option: -s'."""
    expected = f"error: No such option: {spelling} (see 'ead {' '.join(command)} --help')"
    assert assert_one_line_error(ead(*command, spelling, "1"), 2) == expected


def test_each_llama_cpp_spelling_shows_beside_eads_in_the_help() -> None:
    """One declaration per option: its help line lists llama.cpp's spellings with ead's, not a copy."""
    plain = {"COLUMNS": "100"}  # click's plain help: each option's spellings on one line
    generate = ead("generate", "--help", env=plain).stdout.decode()
    for spelled in ("-m, --large, --model", "-md, --small, --model-draft", "-r, --stop, --reverse-prompt"):
        assert spelled in generate, spelled
    assert "-j, --json-schema SCHEMA" in generate and "-jf, --json-schema-file PATH" in generate
    assert "-r, --stop, --reverse-prompt" in ead("chat", "--help", env=plain).stdout.decode()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["-a", "coder"],
            "error: -a is llama-server's --alias, the name of the model it serves: ead serve's is always "
            "'ead' (--any-model answers a request that names another)",
        ),
        (
            ["--alias=coder"],
            "error: --alias is llama-server's --alias, the name of the model it serves: ead serve's is "
            "always 'ead' (--any-model answers a request that names another)",
        ),
        (
            ["--api-key", "key-one,key-two"],
            "error: --api-key holds a comma: llama-server reads a comma-separated list of keys there, ead "
            "serve takes one key",
        ),
    ],
)
def test_a_llama_cpp_spelling_that_means_something_else_is_refused_with_the_difference(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    """Not taken another way: refused in one line that says how ead differs, before any model loads."""
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    assert assert_one_line_error(ead("serve", *absent, *args), 2) == expected


@pytest.mark.parametrize(
    "spelled", [["-mg", "0"], ["-mu", "http://host/m.gguf"], ["-cnv"], ["-sm", "row"], ["-no-cnv"]]
)
def test_a_llama_cpp_word_that_starts_as_a_short_option_is_named_as_typed(
    tmp_path: Path, spelled: list[str]
) -> None:
    """llama.cpp's -mg (main GPU) had been read as -m with 'g' for its value, the large model, and -cnv as
    -c 'nv': a one-dash word of letters is an option's name, as llama.cpp reads it, never a glued value."""
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    expected = f"error: No such option: {spelled[0]} (see 'ead generate --help')"
    assert assert_one_line_error(ead("generate", *absent, *spelled, "hi"), 2) == expected


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "qc1.5b"], "ollama's run is ead chat here (ead generate PROMPT: one answer)"),
        (["--no-color", "run"], "ollama's run is ead chat here (ead generate PROMPT: one answer)"),
        (["list"], "ollama's list is ead models list here"),
        (["ls"], "ollama's ls is ead models list here"),
        (["show", "qc0.5b"], "ollama's show is ead models show here"),
        (["pull", "qc0.5b"], "ollama's pull is ead models pull here"),
        (["rm", "qc0.5b"], "ollama's rm is ead models rm here"),
        (
            ["ps"],
            "ollama's ps lists the loaded models: ead loads them per command (ead serve: while it runs)",
        ),
    ],
)
def test_an_ollama_command_says_eads(args: list[str], said: str) -> None:
    """ollama's commands, typed from habit, had been 'No such command' alone: the one line says ead's."""
    name = next(arg for arg in args if not arg.startswith("-"))
    expected = f"error: No such command '{name}': {said} (see 'ead --help')"
    assert assert_one_line_error(ead(*args), 2) == expected
    helped = ead("--help", *args)  # the help acts first, as click's does
    assert helped.returncode == 0 and helped.stdout.startswith(b"Usage: ead ") and helped.stderr == b""


def test_a_value_glued_to_a_short_option_is_still_its_value(tmp_path: Path) -> None:
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    assert_one_line_error(ead("generate", *absent, "-c8", "hi"), 2, "--ctx must be at least 16, got 8")
    assert_one_line_error(ead("serve", *absent, "-s-1"), 2, "--seed must be in")


def answer_tokens(*args: str) -> list[dict]:
    """The token objects of ``ead generate ARGS --format jsonl`` (the summary left out: it has timings)."""
    result = ead("generate", *args, "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.decode().splitlines()[:-1]]


def test_llama_cpps_spellings_run_as_eads(tiny_pair: tuple[Path, Path]) -> None:
    sampled = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--temp", "1"]
    ours = ["--threads", "1", "--n-gpu-layers", "0", "--ctx", "512", "--max-tokens", "3"]
    answer = answer_tokens(*sampled, *ours, "--seed", "7", "hi")
    assert len(answer) == 3
    assert answer_tokens(*sampled, "-t", "1", "-ngl", "0", "-c", "512", "-n", "3", "-s", "7", "hi") == answer
    longer = ["--gpu-layers", "0", "--ctx-size", "512", "--n-predict", "3", "-s", "7"]
    assert answer_tokens(*sampled, "-t", "1", *longer, "hi") == answer
    assert answer_tokens(*sampled, *ours, "hi") != answer  # the seed decided it


def test_llama_servers_model_and_draft_are_the_large_and_the_small(tiny_pair: tuple[Path, Path]) -> None:
    """llama-server -m BIG -md SMALL: the pair switching writes the same tokens, each by the same model."""
    small, large = (str(path) for path in tiny_pair)
    switching = ["--tau", "4", "--max-tokens", "8", "-t", "1", "hi"]
    answer = answer_tokens("--small", small, "--large", large, *switching)
    assert {token["model"] for token in answer} == {"small", "large"}  # both wrote: the roles are seen
    assert answer_tokens("-md", small, "-m", large, *switching) == answer
    assert answer_tokens("--model-draft", small, "--model", large, *switching) == answer
    assert answer_tokens("-md", large, "-m", small, *switching) != answer  # the roles, not the order


def test_llama_cpps_reverse_prompt_is_a_stop_string(tiny_pair: tuple[Path, Path]) -> None:
    """llama-cli's -r PROMPT halts the answer there: ead's --stop, repeatable, in generate and in each answer
    of chat; the stop string itself is not printed."""
    generate = ["generate", *pair_args(tiny_pair), "--max-tokens", "12", "tell me"]
    answer = ead(*generate).stdout.decode()
    stop = answer[2:4]
    assert len(answer.strip()) > 4 and stop.strip(), answer  # the stop string stands inside the answer
    expected = answer[: answer.index(stop)] + "\n"
    assert ead(*generate, "--stop", stop).stdout.decode() == expected
    for spelled in (["-r", stop], ["--reverse-prompt", stop], ["-r", "never written", "-r", stop]):
        assert ead(*generate, *spelled).stdout.decode() == expected, spelled
    chat = ["chat", *pair_args(tiny_pair), "--max-tokens", "12"]
    assert ead(*chat, stdin="tell me\n").stdout.decode() == answer
    for spelled in (["--stop", stop], ["-r", stop], ["--reverse-prompt", stop]):
        assert ead(*chat, *spelled, stdin="tell me\n").stdout.decode() == expected, spelled


def test_a_stop_string_that_is_not_utf8_is_refused_by_chat_as_by_generate(tmp_path: Path) -> None:
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    for command in (["generate", *absent, "hi"], ["chat", *absent]):
        refused = ead(*command, "-r", "\udcff")
        assert_one_line_error(refused, 2, "the stop string is not valid UTF-8 (byte 0)")


@pytest.mark.parametrize("spelling", ["-sys", "--system-prompt"])
def test_llama_cpps_system_prompt_is_the_system_message(tiny_pair: tuple[Path, Path], spelling: str) -> None:
    greedy = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--max-tokens", "8"]
    answer = answer_tokens(*greedy, "--system", "be brief", "hi")
    assert answer_tokens(*greedy, spelling, "be brief", "hi") == answer
    assert answer_tokens(*greedy, "hi") != answer  # the system message reached the prompt


@pytest.mark.parametrize("spelling", ["-c", "--ctx-size"])
def test_llama_cpps_context_size_reaches_the_context_check(
    tiny_pair: tuple[Path, Path], spelling: str
) -> None:
    """Each 'z' is one token; llama.cpp rounds a context up to 256 tokens: 256 of them fill it."""
    args = ["generate", *pair_args(tiny_pair), "--raw", "--max-tokens", "1"]
    assert ead(*args, "z" * 256).returncode == 0  # the default context holds them
    refused = ead(*args, spelling, "64", "z" * 256)
    assert_one_line_error(refused, 2, "too many for the context of 256 tokens")


def test_the_prompt_by_option_or_file_is_the_arguments(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """llama-cli's -p TEXT and -f FILE: the same answer as the argument; a file is read as stdin is
    (whole, a byte-order mark dropped), '-' is stdin."""
    base = ["generate", *pair_args(tiny_pair), "--max-tokens", "10"]
    argument = ead(*base, "tell me")
    assert argument.returncode == 0 and argument.stdout.strip(), argument.stderr
    prompt = tmp_path / "my prompt.txt"
    prompt.write_text("\ufefftell me")
    for spelled in (["-p", "tell me"], ["--prompt", "tell me"], ["-f", str(prompt)], ["--file", str(prompt)]):
        assert ead(*base, *spelled).stdout == argument.stdout, spelled
    assert ead(*base, "-f", "-", stdin="tell me").stdout == argument.stdout
    assert ead(*base, "-p", "-", stdin="tell me").stdout == argument.stdout  # as the argument '-' is


@pytest.mark.parametrize(
    "given",
    [["-p", "a", "b"], ["--prompt", "a", "-"], ["-f", "x.txt", "b"], ["-p", "a", "-f", "x.txt"]],
)
def test_the_prompt_given_two_ways_is_refused(tmp_path: Path, given: list[str]) -> None:
    """Which was meant is unknown: refused before any model is looked for (the models named are absent),
    by depth generate as by generate."""
    absent = str(tmp_path / "absent.gguf")
    for command in (["generate", "--small", absent, "--large", absent], ["depth", "generate", absent]):
        result = subprocess.run([EAD, *command, *given], capture_output=True, timeout=120, cwd=tmp_path)
        assert_one_line_error(result, 2, "the prompt is given twice", "give it once")


def test_an_unreadable_prompt_file_is_named(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.gguf")
    generate = ["generate", "--small", absent, "--large", absent]
    not_utf8 = tmp_path / "latin 1.txt"
    not_utf8.write_bytes(b"caf\xe9")
    for path, fragment in [
        (tmp_path / "missing.txt", f"cannot read the prompt file {tmp_path}/missing.txt: No such file"),
        (tmp_path, f"cannot read the prompt file {tmp_path}: Is a directory"),
        (not_utf8, f"the prompt file '{not_utf8}' is not valid UTF-8 (byte 3)"),
    ]:
        assert_one_line_error(ead(*generate, "-f", str(path)), 2, fragment)
    assert_one_line_error(ead(*generate, "-f", ""), 2, "'--file'", "an empty path names no file")


def test_an_empty_prompt_file_is_named(tmp_path: Path) -> None:
    """'-f /dev/null' had said 'the prompt is empty', naming neither the file nor that one was read; by
    depth generate as by generate, before any model is looked for (the models named are absent)."""
    absent = str(tmp_path / "absent.gguf")
    empty, spaces, nul = tmp_path / "empty.txt", tmp_path / "my spaces.txt", tmp_path / "nul.txt"
    empty.write_bytes(b"")
    spaces.write_bytes(b"\xef\xbb\xbf \r\n\t")
    nul.write_bytes(b"hi\x00")
    for command in (["generate", "--small", absent, "--large", absent], ["depth", "generate", absent]):
        for path, line in [
            ("/dev/null", "the prompt file /dev/null is empty"),
            (str(empty), f"the prompt file {empty} is empty"),
            (str(spaces), f"the prompt file '{spaces}' is empty"),
            (str(nul), f"the prompt file {nul} contains a NUL byte"),
        ]:
            assert assert_one_line_error(ead(*command, "-f", path), 2) == f"error: {line}"
        assert assert_one_line_error(ead(*command, "-"), 2) == "error: the prompt on stdin is empty"


# --- llama-cli's structured output: --grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file ---

LETTERS = 'root ::= [a-c]+ "."'  # GBNF: one or more of a, b, c, then a full stop


def test_a_grammar_binds_every_token_whichever_model_writes(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    switching = [*pair_args(tiny_pair), "--tau", "4", "--max-tokens", "12", "hi"]
    grammar_file = tmp_path / "letters.gbnf"
    grammar_file.write_text(LETTERS)
    tokens = answer_tokens(*switching, "--grammar", LETTERS)
    assert answer_tokens(*switching, "--grammar-file", str(grammar_file)) == tokens
    text = "".join(token["text"] for token in tokens)
    assert re.fullmatch(r"[a-c]+\.?", text), text
    assert {token["model"] for token in tokens} == {"small", "large"}  # the grammar held both
    free = "".join(token["text"] for token in answer_tokens(*switching))
    assert not re.fullmatch(r"[a-c]+\.?", free), free  # the grammar, not the models, kept the answer so


def test_a_json_schema_is_met_by_the_answer(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    schema = '{"enum": ["yes", "no"]}'
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(schema)
    base = ["generate", *pair_args(tiny_pair), "--max-tokens", "20", "hi"]
    answers = {
        ead(*base, *spelled).stdout
        for spelled in (
            ["-j", schema],
            ["--json-schema", schema],
            ["-jf", str(schema_file)],
            ["--json-schema-file", str(schema_file)],
        )
    }
    assert len(answers) == 1
    assert json.loads(answers.pop()) in ("yes", "no")


def test_a_grammar_or_schema_file_named_dash_is_read_from_stdin(tiny_pair: tuple[Path, Path]) -> None:
    """'-' reads stdin for --grammar-file and -jf as for -f (it had been looked for as a file named '-':
    'No such file or directory'), the prompt then given as an argument; stdin read for both the prompt and
    the grammar is one line, before any model loads."""
    base = ["generate", *pair_args(tiny_pair), "--tau", "4", "--max-tokens", "12"]
    piped = ead(*base, "--format", "jsonl", "--grammar-file", "-", "hi", stdin=LETTERS)
    assert piped.returncode == 0, piped.stderr
    tokens = [json.loads(line) for line in piped.stdout.decode().splitlines()[:-1]]
    assert tokens == answer_tokens(*base[1:], "--grammar", LETTERS, "hi")
    schema = ead(*base, "-jf", "-", "hi", stdin='{"enum": ["yes", "no"]}')
    assert schema.returncode == 0, schema.stderr
    assert json.loads(schema.stdout) in ("yes", "no")
    for prompt in ([], ["-"], ["-f", "-"]):
        for option in ("--grammar-file", "-jf"):
            result = ead(*base, option, "-", *prompt, stdin=LETTERS)
            both = "the prompt and the grammar both read stdin: give one of them another way"
            assert_one_line_error(result, 2, both)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["-j", "{"],
            "--json-schema is not JSON: Expecting property name enclosed in double quotes (column 2)",
        ),
        (["-j", '{"type": "object", "properties": 5}'], "--json-schema cannot be a grammar:"),
        (["-j", '{"type": "string", "maxLength": 5000}'], "--json-schema repeats an item 5000 times"),
        (["--grammar-file", "missing.gbnf"], "cannot read the grammar file missing.gbnf: No such file"),
        (["-jf", "missing.json"], "cannot read the JSON schema file missing.json: No such file"),
        (["-jf", "latin1.json"], "the JSON schema file latin1.json is not valid UTF-8 (byte 14)"),
        (["--grammar", " "], "--grammar is empty"),
        (["--grammar", LETTERS, "-j", "{}"], "the grammar is given twice (--grammar and --json-schema)"),
        (["-jf", "schema.json", "--json-schema", "{}"], "given twice (--json-schema and --json-schema-file)"),
    ],
)
def test_a_bad_grammar_or_schema_is_one_line_before_any_model_loads(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    (tmp_path / "latin1.json").write_bytes(b'{"enum": ["caf\xe9"]}')
    (tmp_path / "schema.json").write_text("{}")
    absent = ["--small", str(tmp_path / "small.gguf"), "--large", str(tmp_path / "large.gguf")]
    result = subprocess.run(
        [EAD, "generate", *absent, *args, "hi"], capture_output=True, timeout=120, cwd=tmp_path
    )
    assert_one_line_error(result, 2, fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--grammar", "root ::= ("], "--grammar: llama.cpp could not parse the grammar: "),
        (
            ["--grammar", 'start ::= "a"'],
            "--grammar: llama.cpp could not parse the grammar: it has no rule 'root'",
        ),
        (
            ["-j", "{}", "--mode", "spec"],
            "--json-schema cannot go with --mode spec: a grammar cannot take a token",
        ),
        (
            ["--grammar", LETTERS, "--verify", "0.5"],
            "--grammar cannot go with --verify: a grammar cannot take",
        ),
        (["--grammar", LETTERS, "--policy", "lookahead"], "--grammar cannot go with --policy lookahead"),
    ],
)
def test_a_grammar_the_models_cannot_follow_is_one_line(
    tiny_pair: tuple[Path, Path], args: list[str], fragment: str
) -> None:
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), *args, "hi"), 2, fragment)


# --- llama-cli's -e/--escape (on by default): \n, \t, \xHH... in a prompt and a reverse prompt typed -------

TYPED = "one\\ttwo\\nthree \\x41\\\\ \\q"  # as a llama-cli user types it in single quotes
MEANT = "one\ttwo\nthree A\\ \\q"  # what llama-cli's string_process_escapes makes of it (\q it does not know)


def prompt_and_answer(*args: str, stdin: str | None = None) -> tuple[int, list[dict]]:
    """``ead generate ARGS --format jsonl``: the prompt's token count and the answer's tokens."""
    result = ead("generate", *args, "--format", "jsonl", stdin=stdin)
    assert result.returncode == 0, result.stderr
    *tokens, summary = (json.loads(line) for line in result.stdout.decode().splitlines())
    return summary["prompt_tokens"], tokens


def test_a_prompt_typed_with_escapes_reaches_the_model_as_llama_cli_sends_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The argument and -p had reached the model as typed, a backslash and an n. Escapes are processed as
    llama-cli's -e does, by default; --no-escape, a file and stdin keep the text as it is."""
    base = [*pair_args(tiny_pair), "--raw", "--max-tokens", "4", "--seed", "7"]
    meant = prompt_and_answer(*base, MEANT)
    for spelled in ([TYPED], ["-p", TYPED], ["-e", "-p", TYPED], ["--escape", TYPED]):
        assert prompt_and_answer(*base, *spelled) == meant
    literal = prompt_and_answer(*base, "--no-escape", TYPED)
    assert literal[0] > meant[0]
    assert prompt_and_answer(*base, TYPED.replace("\\", "\\\\")) == literal  # \\ is one backslash
    typed_file = tmp_path / "typed.txt"
    typed_file.write_text(TYPED)
    assert prompt_and_answer(*base, "-f", str(typed_file)) == literal
    assert prompt_and_answer(*base, "-", stdin=TYPED) == literal


WRITTEN = 'root ::= "one\\ntwo\\tthree"'  # GBNF: the answer, whichever tokens write it


@pytest.mark.parametrize(
    ("stop", "answer"),
    [
        ([], "one\ntwo\tthree"),
        (["-r", "\\n"], "one"),  # had never matched: a backslash and an n are not in the answer
        (["--stop", "\\t"], "one\ntwo"),
        (["-r", "\\x74\\x77"], "one\n"),  # "tw"
        (["-r", "\\\\n"], "one\ntwo\tthree"),  # an escaped backslash: the answer holds no backslash
        (["--no-escape", "-r", "\\n"], "one\ntwo\tthree"),
    ],
)
def test_a_reverse_prompt_typed_with_escapes_stops_where_llama_cli_would(
    tiny_pair: tuple[Path, Path], stop: list[str], answer: str
) -> None:
    tokens = prompt_and_answer(*pair_args(tiny_pair), "--grammar", WRITTEN, "-n", "20", *stop, "hi")[1]
    assert "".join(token["text"] for token in tokens) == answer


def test_the_system_message_is_not_escaped_as_llama_cli_leaves_its_own(tiny_pair: tuple[Path, Path]) -> None:
    """llama-cli processes no escapes in -sys: a system message typed with \\n means a backslash and an n."""
    base = [*pair_args(tiny_pair), "--max-tokens", "4", "--seed", "7", "hi"]
    typed = prompt_and_answer(*base, "--system", TYPED)
    assert prompt_and_answer(*base, "--no-escape", "--system", TYPED) == typed
    assert prompt_and_answer(*base, "--system", MEANT) != typed


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-p", "caf\\xe9"], "the prompt is not valid UTF-8 (byte 3)"),  # a byte alone, not é's two
        (["-p", "a\\x00b"], "the prompt contains a NUL byte"),
        (["-r", "\\xff", "hi"], "the stop string is not valid UTF-8 (byte 0)"),
        (["-p", "\\n \\t"], "the prompt is empty"),
    ],
)
def test_an_escape_that_makes_a_bad_prompt_is_one_line(
    tiny_pair: tuple[Path, Path], args: list[str], fragment: str
) -> None:
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), *args), 2, fragment)

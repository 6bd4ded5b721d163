"""The README's commands stay honest: each ``ead ...`` line in the code blocks of the README and the docs/
pages names a real subcommand and only options that subcommand's ``--help`` lists (read from the real
CLI); the README's docs/ links are files."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import ead_cli

ROOT = Path(ead_cli.__file__).resolve().parent.parent
README = ROOT / "README.md"
EAD = str(Path(sys.executable).with_name("ead"))
CODE_BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHELL_BREAK = {"|", "||", "&&", ";", ">", "<", "2>"}


def shown_commands(text: str) -> list[list[str]]:
    """Each ``ead`` (or ``python -m ead_cli``) command in the text's code blocks, as argv after the program
    name, up to a pipe or redirection; comments dropped, ``\\`` continuations joined."""
    commands = []
    for block in CODE_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").strip()
            words = shlex.split(line, comments=True) if line else []
            for start, word in enumerate(words):
                if word == "ead" or words[start : start + 3] == ["python", "-m", "ead_cli"]:
                    rest = words[start + (1 if word == "ead" else 3) :]
                    end = next((i for i, w in enumerate(rest) if w in SHELL_BREAK), len(rest))
                    commands.append(rest[:end])
                    break
    return commands


@functools.cache
def help_text(path: tuple[str, ...]) -> str:
    result = subprocess.run(
        [EAD, *path, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"},
        timeout=120,
    )
    assert result.returncode == 0, f"ead {' '.join(path)} --help: {result.stderr}"
    return result.stdout


def subcommands(help_output: str) -> set[str]:
    """The names in a group's Commands panel."""
    section = help_output.partition("Commands")[2]
    return {m[1] for m in re.finditer(r"^[│|]?\s+([a-z][a-z-]*)\s", section, re.M)}


def problems(argv: list[str]) -> list[str]:
    """What in one command the real CLI would not accept: an unknown subcommand or option."""
    path: list[str] = []
    words = list(argv)
    while words and not words[0].startswith("-"):
        names = subcommands(help_text(tuple(path)))
        if not names:
            break  # a command, not a group: the rest are its arguments
        if words[0] not in names:
            return [f"'ead {' '.join([*path, words[0]])}': no such subcommand"]
        path.append(words.pop(0))
    known = set(OPTION.findall(help_text(tuple(path))))
    return [
        f"'ead {' '.join(path)}' has no option {option}"
        for word in words
        if word.startswith("--")
        for option in [word.partition("=")[0]]
        if option not in known
    ]


PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_has_commands_to_check() -> None:
    commands = shown_commands(README.read_text())
    assert len(commands) >= 10
    assert ["--version"] in commands and any(c[:1] == ["generate"] for c in commands)


@pytest.mark.parametrize(
    ("page", "argv"),
    [(page, argv) for page in PAGES for argv in shown_commands(page.read_text())],
    ids=lambda value: value.name if isinstance(value, Path) else " ".join(value),
)
def test_shown_command_parses(page: Path, argv: list[str]) -> None:
    assert problems(argv) == []


def test_the_check_catches_what_does_not_exist() -> None:
    """The check must be able to fail: an invented option, subcommand or option of another subcommand."""
    assert problems(["generate", "--no-such-option", "x"]) == [
        "'ead generate' has no option --no-such-option"
    ]
    assert problems(["models", "frobnicate"]) == ["'ead models frobnicate': no such subcommand"]
    assert problems(["models", "list", "--strategies", "x"]) == [
        "'ead models list' has no option --strategies"
    ]
    assert problems(["bench", "humaneval", "--split=odd", "--tau", "0.5"]) == []
    assert shown_commands("```bash\n$ ead generate --x 1 | jq . # note\nead chat \\\n  --tau 1\n```\n") == [
        ["generate", "--x", "1"],
        ["chat", "--tau", "1"],
    ]


def test_readme_docs_links_resolve() -> None:
    text = HTML_COMMENT.sub("", README.read_text())  # pages other branches add are listed in a comment
    links = re.findall(r"\]\(((?:docs/)[^)#\s]+)", text)
    assert len(links) >= 8
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert missing == []

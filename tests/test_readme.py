"""The README's commands stay honest: each ``ead ...`` line in the code blocks of the README and the docs/
pages, and each ``ead ...`` command in their prose's inline code, names a real subcommand and only options
that subcommand's ``--help`` lists (read from the real CLI), each with a value among those its help names
(``--mode ead|small|large|spec``); every relative link of the README and the docs/ pages names a file that
exists, and its anchor a heading there; every repository file they name in code (a script, a test, a
result) exists."""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ead_cli

ROOT = Path(ead_cli.__file__).resolve().parent.parent
README = ROOT / "README.md"
EAD = str(Path(sys.executable).with_name("ead"))
CODE_BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
FENCED = re.compile(r"^```.*?^```", re.S | re.M)
INDENTED_BLOCK = re.compile(r"^[ \t]*\n((?:^ {4}.*\n|^[ \t]*\n(?= {4}))+)", re.M)  # after a blank line
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
LINK = re.compile(r"\]\(([^()\s]+)\)")
OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][a-zA-Z0-9-]*")  # --ctx, and llama.cpp's -c, -ngl, -sys
SHELL_BREAK = {"|", "||", "&&", ";", ">", "<", "2>"}


def code_blocks(text: str) -> list[str]:
    """The text's fenced code blocks, then its indented ones (four spaces, after a blank line), dedented."""
    indented = INDENTED_BLOCK.findall(FENCED.sub("", text))
    return [*CODE_BLOCK.findall(text), *(textwrap.dedent(block) for block in indented)]


def shown_commands(text: str) -> list[list[str]]:
    """Each ``ead`` (or ``python -m ead_cli``) command in the text's code blocks, as argv after the program
    name, up to a pipe or redirection; comments dropped, ``\\`` continuations joined."""
    commands = []
    for block in code_blocks(text):
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
    """The names in a group's Commands panel: the words at its first column, not those that start a
    wrapped line of a description (deeper in), which had passed ``ead large`` for a subcommand."""
    section = help_output.partition("Commands")[2]
    rows = re.findall(r"^([│|]?\s+)([a-z][a-z-]*)\s", section, re.M)
    first_column = min((len(indent) for indent, _ in rows), default=0)
    return {name for indent, name in rows if len(indent) == first_column}


CHOICE = re.compile(r"[a-z][\w-]*(?:\|[a-z][\w-]*)+")  # a help's values of an option: ead|small|large|spec


@functools.cache
def choices(path: tuple[str, ...]) -> dict[str, list[str]]:
    """Each option of a command whose help names its values in place of a metavar (``--mode
    ead|small|large|spec``), with those values: a row's options, then that column."""
    found = {}
    for row in help_text(path).splitlines():
        words = re.split(r"[\s,]+", row.strip("│| "))
        names = list(itertools.takewhile(OPTION.fullmatch, words))
        if names and len(words) > len(names) and CHOICE.fullmatch(words[len(names)]):
            found |= dict.fromkeys(names, words[len(names)].split("|"))
    return found


def refused_values(path: tuple[str, ...], words: list[str]) -> list[str]:
    """Each value given to an option with named values that is none of them (a placeholder in capitals,
    ``F``, or a shell variable, is left alone)."""
    problems = []
    for at, word in enumerate(words):
        option, given, value = word.partition("=")
        named = choices(path).get(option)
        value = value if given else (words[at + 1] if at + 1 < len(words) else "")
        if named and value not in named and not value.isupper() and not value.startswith("$"):
            listed = f"{', '.join(named[:-1])} or {named[-1]}"
            problems.append(f"'ead {' '.join(path)} {option}' takes {listed}, not {value!r}")
    return problems


def problems(argv: list[str]) -> list[str]:
    """What in one command the real CLI would not accept: an unknown subcommand or option, or a value
    that an option's help does not list among its values."""
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
    unknown = [
        f"'ead {' '.join(path)}' has no option {option}"
        for word in words
        if OPTION.fullmatch(word.partition("=")[0])
        for option in [word.partition("=")[0]]
        if option not in known
    ]
    return unknown + refused_values(tuple(path), words)


PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_stays_short() -> None:
    """The README is read whole: at most 250 lines, the details on the docs/ pages it links to."""
    assert len(README.read_text().splitlines()) <= 250


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
    # a word that starts a wrapped line of a command's help ("large model by entropy") is no subcommand
    assert problems(["large", "--tau", "1"]) == ["'ead large': no such subcommand"]
    assert problems(["models", "list", "--strategies", "x"]) == [
        "'ead models list' has no option --strategies"
    ]
    assert problems(["bench", "humaneval", "--split=odd", "--tau", "0.5"]) == []
    # llama.cpp's short spellings are checked too; a value that starts with a dash is none
    assert problems(["generate", "-c", "8192", "-ngl", "1", "-x", "1", "-sys", "s"]) == [
        "'ead generate' has no option -x"
    ]
    assert problems(["models", "list", "-c", "1"]) == ["'ead models list' has no option -c"]
    assert problems(["generate", "--seed", "-1", "-"]) == []
    # a value an option's help lists as a choice (ead|small|large|spec): one it does not list is refused
    assert problems(["generate", "--mode", "both", "--policy=gate", "--format", "jsonl", "hi"]) == [
        "'ead generate --mode' takes ead, small, large or spec, not 'both'"
    ]
    assert problems(["chat", "--policy=paper"]) == [
        "'ead chat --policy' takes gate, ead or lookahead, not 'paper'"
    ]
    assert problems(["serve", "--reasoning-format", "F"]) == []  # a placeholder, in capitals
    assert shown_commands("```bash\n$ ead generate --x 1 | jq . # note\nead chat \\\n  --tau 1\n```\n") == [
        ["generate", "--x", "1"],
        ["chat", "--tau", "1"],
    ]
    indented = "Prose.\n\n    ead bench speed --small a \\\n      --json x.json\n\n    ead --version\n\nOn.\n"
    assert shown_commands(indented) == [["bench", "speed", "--small", "a", "--json", "x.json"], ["--version"]]


INLINE_COMMAND = re.compile(r"`((?:ead|python -m ead_cli) [^`]*)`")


def inline_commands(text: str) -> list[list[str]]:
    """Each command the text's prose shows in inline code (outside blocks and comments), as argv after
    the program name: a span that starts with ``ead`` and goes on with a subcommand or an option. Other
    spans that start so are names, not commands (a strategy's ``ead tau=0.5``, a source's ``ead cache``,
    ollama's ``ead run`` told apart); one wrapped over lines is joined."""
    top = subcommands(help_text(()))
    prose = FENCED.sub("", HTML_COMMENT.sub("", text))
    commands = []
    for span in INLINE_COMMAND.findall(prose):
        for argv in shown_commands(f"```\n{' '.join(span.split())}\n```\n"):
            if argv and (argv[0] in top or argv[0].startswith("-")):
                commands.append(argv)
    return commands


def test_inline_command_parses() -> None:
    """The commands the README and the docs show in their prose name real subcommands and options, as
    those in their code blocks do: most of a page's commands are inline."""
    shown = [(page, argv) for page in PAGES for argv in inline_commands(page.read_text())]
    assert len(shown) >= 200
    assert [f"{page.name}: {problem}" for page, argv in shown for problem in problems(argv)] == []


def test_the_inline_check_catches_what_does_not_exist() -> None:
    """The check must be able to fail: an option gone, in a span of one line or wrapped over two."""
    text = (
        "Run `ead generate --gone 1 hi`, or `ead bench\nspeed --small a --also-gone`; `ead tau=0.5` and\n"
        "`ead cache` are names, `--policy ead --window 3` no command.\n```bash\nead chat --in-block\n```\n"
    )
    commands = inline_commands(text)
    assert commands == [["generate", "--gone", "1", "hi"], ["bench", "speed", "--small", "a", "--also-gone"]]
    assert [problem for argv in commands for problem in problems(argv)] == [
        "'ead generate' has no option --gone",
        "'ead bench speed' has no option --also-gone",
    ]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated one numbered (``step``, ``step-1``)."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCED.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Each relative link of a markdown page (outside code and comments) whose file or folder is missing,
    or whose anchor no heading of its target gives."""
    text = INLINE_CODE.sub("", FENCED.sub("", HTML_COMMENT.sub("", page.read_text())))
    problems = []
    for link in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):
            continue  # https:, mailto:: not a file here
        path, _, anchor = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            problems.append(f"{page}: {link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            problems.append(f"{page}: {link}: no such heading")
    return problems


def test_every_relative_link_and_anchor_resolves() -> None:
    """Each relative link of the README and of every page under docs/ names a file or folder that exists,
    and its ``#anchor`` a heading of the page it points to."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    assert sum(len(LINK.findall(page.read_text())) for page in pages) >= 80
    assert [problem for page in pages for problem in broken_links(page)] == []


def test_the_link_check_catches_what_does_not_resolve(tmp_path: Path) -> None:
    """The check must be able to fail: a missing file, a missing anchor in another page or the same one."""
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## The `ead` object, step by step\n\n## Step\n\n## Step\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#the-ead-object-step-by-step), [twice](other.md#step-1), [self](#page), "
        "[web](https://example.com/x.md), `[code](nowhere.md)`\n"
        "[gone](gone.md) [no anchor](other.md#nowhere) [own](#missing)\n"
        "```text\n# not a heading\n[in a block](nowhere.md)\n```\n<!-- [commented](nowhere.md) -->\n"
    )
    assert broken_links(page) == [
        f"{page}: gone.md: no such file",
        f"{page}: other.md#nowhere: no such heading",
        f"{page}: #missing: no such heading",
    ]


REPO_PATH = re.compile(r"`((?:ead_cli|tests|scripts|docs)/[\w./*-]+)(?:::(\w+))?`")


def missing_paths(page: Path) -> list[str]:
    """Each repository file a page names in code (``scripts/soak.py``, ``docs/results/x/*.json``, a test
    as ``tests/test_x.py::test_y``), outside fenced blocks, that is not there: a glob must match one."""
    problems = []
    shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for path, test in REPO_PATH.findall(FENCED.sub("", page.read_text())):
        found = sorted(ROOT.glob(path.rstrip("/")))
        if not found:
            problems.append(f"{shown}: {path}: no such file")
        elif test and not re.search(rf"^(async )?def {test}\(", found[0].read_text(), re.M):
            problems.append(f"{shown}: {path}::{test}: no such test")
    return problems


def test_every_file_a_page_names_exists() -> None:
    """The scripts, tests and results the README and the docs name in code exist, each test named by
    ``::`` too: a page had cited a test under a name and file it never had."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    assert sum(len(REPO_PATH.findall(page.read_text())) for page in pages) >= 50
    assert [problem for page in pages for problem in missing_paths(page)] == []


def test_the_path_check_catches_what_is_not_there(tmp_path: Path) -> None:
    """The check must be able to fail: a missing script, a glob matching nothing, a test renamed."""
    page = tmp_path / "page.md"
    page.write_text(
        "`scripts/soak.py`, `docs/results/lookup/*.json`, "
        "`tests/test_readme.py::test_readme_has_commands_to_check`\n"
        "`scripts/gone.py`, `docs/results/lookup/*.nothing`, `tests/test_readme.py::test_gone`\n"
        "```text\n`scripts/in_a_block.py`\n```\n"
    )
    assert missing_paths(page) == [
        "page.md: scripts/gone.py: no such file",
        "page.md: docs/results/lookup/*.nothing: no such file",
        "page.md: tests/test_readme.py::test_gone: no such test",
    ]

"""Paths in messages shown as a shell would need them typed: bare when safe, else quoted, one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, ead, pair_args

from ead_cli.errors import shown_path


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/tmp/figures.json", "/tmp/figures.json"),  # the common case, unchanged
        ("/tmp/my figures.json", "'/tmp/my figures.json'"),
        ("/tmp/it's", "'/tmp/it'\"'\"'s'"),
        ("/tmp/a;b", "'/tmp/a;b'"),
        ("/tmp/a\nb", "$'/tmp/a\\nb'"),  # a newline had split the one-line error in two
        ("/tmp/it's\tx", "$'/tmp/it\\'s\\tx'"),
        ("/tmp/\x1b[31m", "$'/tmp/\\x1b[31m'"),
        ("/tmp/\udcff", "$'/tmp/\\xff'"),  # a byte that is not UTF-8, as Python keeps it
        ("/tmp/\u2028", "$'/tmp/\\u2028'"),  # a line separator, to some terminals
        ("/tmp/\x85", "$'/tmp/\\u0085'"),  # a C1 control: a character, not the byte \\x85
        ("/tmp/モデル\u3000x", "'/tmp/モデル\u3000x'"),  # an ideographic space is text: quoted as it is
        ("", "''"),
    ],
)
def test_a_path_is_shown_as_a_shell_would_need_it_typed(path: str, shown: str) -> None:
    assert shown_path(path) == shown


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "path", ["/tmp/a b", "/tmp/it's", "/tmp/a\nb", "/tmp/it's\t\x1b\\", "/tmp/\udcff\x85\u2028"]
)
def test_a_shown_path_typed_into_bash_is_the_path(path: str) -> None:
    """bash's \\u writes a character in the locale's encoding: UTF-8, as Linux names files."""
    command = ["bash", "-c", f"printf %s {shown_path(path)}"]
    typed = subprocess.run(command, capture_output=True, check=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert typed.stdout == os.fsencode(path)


def test_a_long_path_is_never_cut() -> None:
    """A Hugging Face cache path runs to 150 characters: quoted's cut at 80 would lose its file name."""
    path = "/root/.cache/huggingface/hub/" + "x" * 200 + "/model q4.gguf"
    assert shown_path(path) == f"'{path}'"


def _missing_with_a_space_and_a_newline(tmp_path: Path, name: str) -> list[tuple[Path, str]]:
    return [
        (tmp_path / f"my {name}", f"'{tmp_path}/my {name}'"),
        (tmp_path / f"a\n{name}", f"$'{tmp_path}/a\\n{name}'"),
    ]


def test_a_missing_prompts_file_is_named_quoted(tmp_path: Path) -> None:
    for path, shown in _missing_with_a_space_and_a_newline(tmp_path, "prompts.txt"):
        result = ead("bench", "prompts", str(path))
        assert_one_line_error(result, 2, f"cannot read {shown}: No such file or directory")


def test_a_missing_catalog_is_named_quoted(tmp_path: Path) -> None:
    for path, shown in _missing_with_a_space_and_a_newline(tmp_path, "models.toml"):
        assert_one_line_error(
            ead("models", "list", "--catalog", str(path)), 1, f"models file not found: {shown}"
        )


def test_a_missing_model_is_named_quoted(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    for path, shown in _missing_with_a_space_and_a_newline(tmp_path, "model.gguf"):
        args = ["generate", *pair_args(tiny_pair), "--small", str(path), "hi"]
        assert_one_line_error(ead(*args), 1, f"model file not found: {shown}")

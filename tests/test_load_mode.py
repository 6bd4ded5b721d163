"""llama-cli's -lm/--load-mode, and older llama.cpp's --no-mmap and --mlock that its users type from habit:
checked before any model is looked for, and the weights loaded as asked (mapped from the file or read
into memory, locked or not, as the process's own maps and status say)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, ead, pair_args

from ead_cli.options import load_mode_of
from ead_cli.runner import Runner

MODES = "auto, none, mmap, mlock, mmap+mlock, dio"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-lm", "lock"], f"--load-mode must be one of {MODES}, got 'lock'"),
        (["--load-mode", ""], f"--load-mode must be one of {MODES}, got ''"),
        (
            ["-lm", "mmap", "--mlock"],
            "--load-mode says how the weights load: leave out --no-mmap and --mlock",
        ),
        (["--no-mmap", "--load-mode", "none"], "--load-mode says how the weights load"),
    ],
)
@pytest.mark.parametrize(
    "command", [("generate", "hi"), ("chat",), ("serve", "--port", "0"), ("bench", "speed")]
)
def test_a_bad_load_mode_is_refused_before_any_model_is_looked_for(
    tmp_path: Path, command: tuple[str, ...], args: list[str], fragment: str
) -> None:
    absent = (tmp_path / "small.gguf", tmp_path / "large.gguf")
    assert_one_line_error(ead(*command, *pair_args(absent), *args), 2, fragment)


def test_no_mmap_and_mlock_are_the_load_modes_they_were() -> None:
    """Older llama.cpp mapped the weights by default: --mlock locked the mapping, --no-mmap read them."""
    assert load_mode_of(None, no_mmap=False, mlock=False) == "auto"
    assert load_mode_of(None, no_mmap=True, mlock=False) == "none"
    assert load_mode_of(None, no_mmap=False, mlock=True) == "mmap+mlock"
    assert load_mode_of(None, no_mmap=True, mlock=True) == "mlock"
    assert load_mode_of("dio", no_mmap=False, mlock=False) == "dio"


def mapped(path: Path) -> bool:
    """Whether this process maps the file."""
    return str(path.resolve()) in Path(f"/proc/{os.getpid()}/maps").read_text()


def locked_kib() -> int:
    """The memory this process has locked (VmLck)."""
    status = Path(f"/proc/{os.getpid()}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmLck:")).split()[1])


@pytest.mark.parametrize(
    ("load_mode", "maps", "locks"),
    [("auto", True, False), ("mmap", True, False), ("none", False, False), ("mlock", False, True)],
)
def test_the_weights_load_as_the_mode_says(tiny_large: Path, load_mode: str, maps: bool, locks: bool) -> None:
    before = locked_kib()
    with Runner(tiny_large, name="large", n_ctx=64, n_threads=1, load_mode=load_mode):
        assert mapped(tiny_large) is maps
        assert (locked_kib() > before) is locks
    assert not mapped(tiny_large)


def test_generate_takes_the_spellings_to_llama_cpp(tiny_pair: tuple[Path, Path]) -> None:
    """llama.cpp's log says which mode it loaded each model in."""
    args = ["generate", *pair_args(tiny_pair), "--mode", "ead", "-n", "2", "hi"]
    for given, made in (
        (["--no-mmap"], "none"),
        (["--mlock"], "mmap+mlock"),
        (["-lm", "mmap"], "mmap"),
        ([], "auto"),
    ):
        result = ead(*args, *given, env={"EAD_VERBOSE": "1"})
        assert result.returncode == 0, result.stderr[-2000:]
        loads = [line for line in result.stderr.decode().splitlines() if "this can take a while" in line]
        said = "mmap" if made == "auto" else made  # llama.cpp says what auto came to: a CPU maps
        assert [line.endswith(f"(load_mode = {said})") for line in loads] == [True, True], loads

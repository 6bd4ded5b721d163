"""Text for teacher forcing: the built-in corpora or the user's files, cut into windows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import EadError, shown_path
from ..paths import read_file_text, unreadable
from ..runner import Runner
from . import WINDOW
from .profile import PROMPT_ROWS


def builtin_corpus(name: str) -> list[str]:
    """Texts every Python install has offline: ``code`` (the standard library's .py sources, sorted) or
    ``prose`` (the language reference's topics in pydoc_data/topics.py)."""
    import sysconfig

    if name == "prose":
        from pydoc_data.topics import topics

        return [topics[key] for key in sorted(topics)]
    if name == "code":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        return [path.read_text(encoding="utf-8", errors="replace") for path in sorted(stdlib.glob("*.py"))]
    raise EadError(f"unknown built-in corpus {name!r}: use 'code', 'prose' or file paths", 2)


def read_corpus(spec: Sequence[str]) -> tuple[list[str], str]:
    """Texts from built-in corpus names and files; a one-line error for a missing or empty one."""
    texts: list[str] = []
    for item in spec:
        if item in ("code", "prose"):
            texts += builtin_corpus(item)
            continue
        path = Path(item)
        try:
            texts.append(read_file_text(path))
        except (OSError, UnicodeDecodeError) as error:
            raise EadError(f"cannot read corpus file {shown_path(item)}: {unreadable(error)}", 2) from None
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise EadError(f"the corpus {','.join(spec)} is empty", 2)
    return texts, ",".join(spec)


def check_windows(tokens: int, corpora: int) -> None:
    """``--tokens`` refused, before a model loads, where it holds less than a window for each corpus:
    ``corpus_windows`` reads whole windows, rounded down, never past the tokens asked."""
    if tokens < WINDOW * corpora:
        each = f"a window of {WINDOW} tokens for each of {corpora} corpora" if corpora > 1 else "a window"
        raise EadError(f"--tokens must be at least {WINDOW * corpora} ({each}), got {tokens}", 2)


def corpus_windows(runner: Runner, texts: Sequence[str], *, tokens: int, part: int) -> list[list[int]]:
    """Windows of WINDOW tokens from every other text, starting at text ``part`` (so part 0 and
    part 1 are disjoint: calibration and held-out), as many whole ones as ``tokens`` holds."""
    windows: list[list[int]] = []
    budget = tokens
    for text in texts[part::2]:
        ids = runner.tokenize(text, add_special=False, parse_special=False)
        for start in range(0, len(ids) - WINDOW + 1, WINDOW):
            if budget < WINDOW:
                return windows
            windows.append(ids[start : start + WINDOW])
            budget -= WINDOW
        if budget < WINDOW:
            break
    if not windows:  # short texts: one window of whatever there is
        ids = [
            i
            for text in texts[part::2]
            for i in runner.tokenize(text, add_special=False, parse_special=False)
        ]
        windows = [ids[:WINDOW]] if len(ids) > PROMPT_ROWS + 1 else []
    if not windows:
        raise EadError("the corpus is too short: it needs at least a few dozen tokens", 2)
    return windows

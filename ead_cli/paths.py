"""Where ead keeps things: its config (calibrated taus, depth profiles) and its cache (models, a built
llama-server, depth's low-rank factors), and whether it can save there. One place, so no module imports
another just for a path."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO, overload

from .errors import EadError, shown_path


def expand_home(path: str, where: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` made that home folder. Where there is none (``~name`` of
    no user here; ``~`` with HOME unset and no passwd entry) pathlib raises RuntimeError: one line
    instead, after ``where`` (what the path is)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = path.split("/", 1)[0]
        reason = "HOME is not set and this user has no home" if head == "~" else f"{head} is no user's home"
        raise EadError(f"{where}: {reason}") from None


def folder_ending(name: str) -> str | None:
    """Why ``name``, given for a file ead writes, names none, as a shell says it ("Is a directory", or
    "Not a directory" after a file's name), or None: a name that ends as a folder's ('notes/',
    'notes/.') loses its '/' on its way to a Path, which would write the file 'notes' (or over
    'chat.json' for 'chat.json/')."""
    if os.path.basename(name) not in ("", "."):
        return None
    found = lookup(Path(os.path.expanduser(name)))
    after_a_file = found is not None and not stat.S_ISDIR(found.st_mode)
    return os.strerror(errno.ENOTDIR if after_a_file else errno.EISDIR)


def dash_named(name: str) -> str | None:
    """Why '-', given for a file ead writes, names none, or None for any other name: '-' is stdout only
    in other tools, and here the tables and answers go there (/dev/stdout writes there)."""
    return "'-' is no file here, not stdout: name a file" if name == "-" else None


@overload
def env_path(name: str) -> Path | None: ...
@overload
def env_path(name: str, default: str) -> Path: ...
def env_path(name: str, default: str | None = None) -> Path | None:
    """The folder or file $``name`` names, else ``default``, with ``~`` expanded; None if neither."""
    value = os.environ.get(name) or default
    if value is None:
        return None
    return expand_home(value, f"{name}={value}" if os.environ.get(name) else f"{value} (the default {name})")


def lookup(path: Path, *, follow_links: bool = True) -> os.stat_result | None:
    """``path``'s stat through links (of the link itself with ``follow_links=False``), or None where nothing
    is there (Path.exists's False). A folder on its way that this user may not enter is a PermissionError
    pathlib's exists, is_file and is_dir raise: one line naming the path instead (models kept by another
    user: ollama's service install, a shared cache)."""
    try:
        return path.stat(follow_symlinks=follow_links)
    except PermissionError as error:
        raise EadError(
            f"cannot reach {shown_path(path)}: {error.strerror} (a folder on its way is closed to this user)"
        ) from None
    except (OSError, ValueError):  # not there, a dangling or looping link, a NUL in the name
        return None


def same_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file (through links); False where either names nothing."""
    one, other = lookup(first), lookup(second)
    return one is not None and other is not None and (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def is_file(path: Path) -> bool:
    """Path.is_file, with ``lookup``'s line where a folder on the way is closed."""
    found = lookup(path)
    return found is not None and stat.S_ISREG(found.st_mode)


def is_dir(path: Path) -> bool:
    """Path.is_dir, with ``lookup``'s line where a folder on the way is closed."""
    found = lookup(path)
    return found is not None and stat.S_ISDIR(found.st_mode)


def check_kept_file(path: Path, keeper: str, exit_code: int = 1) -> None:
    """Refuse, unread, a folder, a pipe or a device where ``keeper`` ('a bench keeps its results') keeps a
    file that it reads and writes again: a pipe (mkfifo) had been read until a writer came, for ever, or
    written, after all the work, until a reader came. Nothing there is a file not yet made."""
    if lookup(path) is not None and not is_file(path):
        raise EadError(f"{shown_path(path)} is not a file: {keeper} in one; move it away", exit_code)


# The most ead reads of a prompt or of a file it is given (settings, prompts, results): more than any
# context or file of its own holds. An endless input (/dev/zero, `yes`) had filled the memory until the
# kernel killed ead, or ended in a MemoryError traceback.
MAX_READ_BYTES = 256 << 20
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: a file saved as "UTF-8 with BOM" starts with it


def read_bounded(stream: BinaryIO) -> bytes:
    """All of ``stream`` up to ``MAX_READ_BYTES``; more is an OSError (EFBIG) that ``unreadable`` says as
    the reason, so each reader's own line names the file as for any other read error. Read a MiB at a
    time: one read of the bound would allocate all of it for a file of a few bytes."""
    chunks, size = [], 0
    while chunk := stream.read(1 << 20):
        size += len(chunk)
        if size > MAX_READ_BYTES:
            raise OSError(errno.EFBIG, f"it is more than {MAX_READ_BYTES >> 20} MiB, more than ead reads")
        chunks.append(chunk)
    return b"".join(chunks)


def read_file(path: Path) -> bytes:
    """A file's bytes, at most ``MAX_READ_BYTES`` (a device or a pipe as well as a file)."""
    with open(path, "rb") as handle:
        return read_bounded(handle)


def read_file_text(path: Path) -> str:
    """A file's UTF-8 text, at most ``MAX_READ_BYTES`` (UnicodeDecodeError where it is not UTF-8)."""
    return read_file(path).decode("utf-8")


def unreadable(error: OSError | ValueError | RecursionError) -> str:
    """Why a file's text could not be read, for one line: the system's reason (an OSError's own text
    repeats the path, "[Errno 2] No such file or directory: 'x'"), not UTF-8 (not the codec's message),
    or not JSON and where (or nested past Python's recursion limit, which the JSON parser raises)."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    if isinstance(error, RecursionError):
        return "not JSON that ead reads (nested too deep)"
    return f"not JSON ({error})"


def config_file() -> Path:
    """$EAD_CONFIG, else $XDG_CONFIG_HOME/ead-cli/calibration.json (~/.config by default); an EAD_CONFIG
    that ends as a folder's name (``folder_ending``) is refused, not read and saved without its /, and so
    is '-' (``dash_named``), as the file options refuse it, not a file of that name written."""
    given = env_path("EAD_CONFIG")
    value = os.environ.get("EAD_CONFIG", "")
    if given is not None and (why := folder_ending(value) or dash_named(value)):
        raise EadError(f"EAD_CONFIG={value}: {why}")
    return given or env_path("XDG_CONFIG_HOME", "~/.config") / "ead-cli" / "calibration.json"


def xdg_cache_home() -> Path:
    return env_path("XDG_CACHE_HOME", "~/.cache")


def ead_cache_dir() -> Path:
    """$EAD_CACHE, else ead-cli in the XDG cache: models, and a llama-server built for the tests."""
    return env_path("EAD_CACHE") or xdg_cache_home() / "ead-cli"


def check_can_save(path: Path, what: str, exit_code: int = 1) -> None:
    """Whether ``what`` can be saved to ``path``, tried before the work it would throw away (a calibration,
    a bench, a measurement): a folder in its place, a file in its folder's way, a folder that cannot be made
    or written to. A device, a pipe or ``/dev/stdout`` (``written_in_place``) has no folder beside it to
    try. The one check of every file ead writes, so each problem reads alike whichever command meets it;
    ``exit_code`` 2 where ``path`` is an option the user gave, 1 where it is ead's own place."""
    try:
        if is_dir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not written_in_place(path):
            try_writing(Path(os.path.realpath(path)).parent)  # a link's file is saved beside its target
    except OSError as error:
        raise cannot_save(path, what, error, exit_code) from None


def try_writing(folder: Path) -> None:
    """Make ``folder`` and write a scratch file in it, then remove the folders it made (the save makes
    them again): a run refused or stopped after the check leaves none. Raises the OSError that says why
    not, the scratch file's named by the folder (its random name means nothing to the user)."""
    made = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as error:
            error.filename = str(folder)
            raise
    finally:
        remove_folders(made)


def missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path (itself included) that are not there, which making it makes: the
    deepest first, the order to remove them in where what they were made for is given up."""
    missing = []
    part = folder
    while lookup(part, follow_links=False) is None and part != part.parent:
        missing.append(part)
        part = part.parent
    return missing


def remove_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (``missing_folders``'s, the deepest first) where they are empty: another's file
    there now makes its folder not ours to remove."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def cannot_save(path: Path, what: str, error: OSError, exit_code: int = 1) -> EadError:
    """One line saying why ``what`` could not be saved to ``path`` (``why_not_saved``)."""
    return EadError(f"cannot save {what} to {shown_path(path)}: {why_not_saved(path, error)}", exit_code)


def why_not_saved(path: Path, error: OSError) -> str:
    """Why ``path`` could not be made or written, naming what is in the way: a folder where a file should be
    ("it is a folder"), a file where a folder should be (mkdir's "File exists" for the folder itself, "Not
    a directory" for one above it), else the system's reason, with the path it names where that is another."""
    if isinstance(error, IsADirectoryError):
        in_the_way = error.filename or str(path)
        return "it is a folder" if in_the_way == str(path) else f"{shown_path(in_the_way)} is a folder"
    if isinstance(error, FileExistsError):
        return f"{shown_path(error.filename or path)} is not a folder"
    if isinstance(error, NotADirectoryError) and error.filename:
        named = Path(error.filename)
        for place in (*reversed(named.parents), named):
            found = lookup(place)
            if found is not None and not stat.S_ISDIR(found.st_mode):
                return f"{shown_path(place)} is not a folder"
    if error.filename and error.filename != str(path):
        return f"{error.strerror} ({shown_path(error.filename)})"
    return str(error.strerror)


def lock_or_why_not(handle: IO[Any], path: Path, on_held: Callable[[], None]) -> str | None:
    """Lock the open ``handle`` (of ``path``) for this process alone, until it is unlocked or closes;
    ``on_held``, called where another process holds it, raises to refuse or returns to wait for it.

    On a filesystem that takes no locks (NFS without its lock daemon, some FUSE ones: ENOLCK, EOPNOTSUPP)
    it returns the start of a warning, 'cannot lock PATH (why)', for the caller to say what goes unguarded
    and go on unlocked: refusing would bar every use of such a filesystem."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        on_held()
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as error:
        return f"cannot lock {shown_path(path)} ({error.strerror})"
    return None


def save_json(path: Path, data: Any, what: str, *, indent: int) -> Path:
    """``data`` as JSON, saved as ``save_text`` saves."""
    return save_text(path, json.dumps(data, indent=indent) + "\n", what)


def save_text(path: Path, text: str | bytes, what: str) -> Path:
    """``text`` written whole (``write_whole``), its folder made first (a link's: its target's, where the
    file is written); a failed write is one line naming ``what`` could not be saved. Bytes for a plot."""
    try:
        Path(os.path.realpath(path)).parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, text)
    except OSError as error:
        raise cannot_save(path, what, error) from None
    return path


def own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names through links (``/dev/stdout``, ``/dev/fd/3``,
    ``/proc/self/fd/1``), or None. Such a file is written there, after what the descriptor holds: its
    name resolved to a file would replace the file that stdout, redirected to it, goes on writing."""
    name = os.path.abspath(path)
    for _ in range(40):  # Linux's most links in one lookup
        folder, base = os.path.split(name)
        folder = os.path.realpath(folder)
        if folder == f"/proc/{os.getpid()}/fd" and base.isdecimal():
            return int(base)
        name = os.path.join(folder, base)
        if not os.path.islink(name):
            return None
        name = os.path.join(folder, os.readlink(name))
    return None


def write_to_descriptor(descriptor: int, data: bytes) -> None:
    """``data`` written whole to one of this process's descriptors, after what Python's own streams hold."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def written_in_place(path: Path) -> bool:
    """Whether ``path`` names a device, a pipe (through links: ``/dev/null``, ``/dev/stdout`` into a pipe)
    or a descriptor of this process (``own_descriptor``), which ``write_whole`` writes as it is: there is
    no folder beside it to write a file in."""
    found = lookup(path)
    in_place = found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISDIR(found.st_mode)
    return in_place or own_descriptor(path) is not None


def write_whole(path: Path, text: str | bytes) -> None:
    """``text`` (or bytes: a plot) written whole or not at all: to a new file beside ``path`` (beside a
    link's target, so the link stays), with an existing file's permissions, renamed over it, so a failed
    write (a full disk, a Ctrl-C) leaves the old file as it was and no temporary. A device or a pipe
    (``/dev/null``) is written in place, never replaced, and a descriptor of this process (``/dev/stdout``,
    ``/dev/fd/3``) where it stands. Raises what the writes raise (OSError; ValueError for a name with a
    NUL byte)."""
    target = Path(os.path.realpath(path))  # a link loop stays itself, and fails as a file would
    if target.is_dir():  # said before a temporary is written beside it ("/" has no side to write on)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    data = text.encode("utf-8") if isinstance(text, str) else text
    descriptor = own_descriptor(path)
    if descriptor is not None:
        write_to_descriptor(descriptor, data)
        return
    if written_in_place(path):
        with open(path, "wb") as handle:  # the name as given: realpath's may name nothing (another's pipe)
            handle.write(data)
        return
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        if target.is_file():  # the file keeps its permissions (a private transcript stays private)
            os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
        os.replace(temporary, target)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename == str(temporary):  # gone: name the file asked for
            error.filename, error.filename2 = str(path), None
        raise

"""GGUF files on disk: the shards of a split model, the check that a path is a readable GGUF, and its
header (metadata, parameter count, training context) read without loading the weights."""

from __future__ import annotations

import mmap
import re
import stat
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ead_cli.errors import EadError, shown_path
from ead_cli.paths import lookup, unreadable

GGUF_MAGIC = b"GGUF"
# A split model's shard, its suffix in any case: ``checked_gguf`` refuses those llama.cpp does not find
SHARD = re.compile(r"-(\d{5})-of-(\d{5})(\.gguf)$", re.IGNORECASE)
SHA256 = re.compile(r"[0-9a-f]{64}")  # a hex SHA-256 digest (ollama's blob names, models.toml's pins)


def is_gguf_name(name: str) -> bool:
    """A model file's name: ``.gguf`` in any case (LM Studio keeps files saved as ``.GGUF``; llama.cpp
    reads a file whatever its name)."""
    return name.lower().endswith(".gguf")


def shard_paths(path: Path) -> list[Path]:
    """The files of a model: the path itself, or every shard of a split GGUF (name-0000k-of-0000n.gguf),
    in order, with the suffix spelled as in ``path``, whether or not they exist: llama.cpp loads a split
    model from its first shard and finds the others beside it by these names."""
    match = SHARD.search(path.name)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        return [path]
    total, suffix = match[2], match[3]
    return [
        path.with_name(SHARD.sub(f"-{i:05d}-of-{total}{suffix}", path.name)) for i in range(1, int(total) + 1)
    ]


def model_bytes(path: Path) -> int:
    """A model's bytes on disk, every shard of a split one: what its weights take once llama.cpp maps it."""
    return sum(shard.stat().st_size for shard in shard_paths(path))


def checked_gguf(path: Path, named: str | None = None) -> Path:
    """The model's first file, made absolute, after checking that every file of it (each shard of a split
    GGUF) is a readable, non-empty file with the GGUF magic: llama.cpp names none of these problems.
    ``named``: how a refusal of ``path`` missing names it (the path as the user gave it: pathlib drops
    a leading './'), else as ``shown_path`` shows it.

    A file cut short after the header is left to llama.cpp, which fails to load it.
    """
    _check_gguf_file(path, named)
    shards = shard_paths(path)
    if len(shards) > 1 and not path.name.endswith(".gguf"):
        raise EadError(
            f"split model {shown_path(path.name)}: llama.cpp finds a split model's shards only by names that "
            f"end in '.gguf', in lower case; rename its {len(shards)} shards to end in '.gguf'"
        )
    missing = [str(shard.absolute()) for shard in shards if lookup(shard) is None]
    if missing:
        raise EadError(
            f"split model {shown_path(path.name)} is missing {len(missing)} of its {len(shards)} shards: "
            f"{', '.join(missing)}"
        )
    for shard in shards:
        if shard != path:
            _check_gguf_file(shard)
    return shards[0].absolute()


def _check_gguf_file(path: Path, named: str | None = None) -> None:
    """Refuse anything but a readable, non-empty regular file that starts with the GGUF magic."""
    found = lookup(path)
    if found is None:
        raise EadError(f"model file not found: {named or shown_path(path)}")
    if stat.S_ISDIR(found.st_mode):
        raise EadError(f"model path is a directory, not a GGUF file: {shown_path(path)}")
    if not stat.S_ISREG(found.st_mode):
        raise EadError(f"model path is not a regular file: {shown_path(path)}")
    try:
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as err:
        raise EadError(f"cannot read model file ({unreadable(err)}): {shown_path(path)}") from None
    if not magic:
        raise EadError(f"model file is empty (0 bytes): {shown_path(path)}")
    if magic != GGUF_MAGIC:
        raise EadError(f"not a GGUF file (bad magic): {shown_path(path)}")


def training_context(path: Path) -> int | None:
    """The model's training context (``{arch}.context_length``, llama.cpp's n_ctx_train) read from its
    header without loading it, or None where the file does not say (unreadable, not a model llama.cpp
    loads): the context a run without --ctx gets is known before the model loads."""
    header = header_if_readable(path)
    return header.context_length if header else None


def header_if_readable(path: Path) -> GgufHeader | None:
    """``read_header``'s header, or None where it cannot be read: for what is only shown or guessed from
    it (a run's default context, ``ead models list``'s parameter counts), which a broken file leaves out."""
    try:
        return read_header(path)
    except EadError:
        return None


# GGUF's value types: a scalar's struct format by type id; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's length


@dataclass(frozen=True)
class GgufHeader:
    """What a model's header says, read without its weights: the metadata's scalars and strings (arrays,
    the vocabulary's, left out) and the parameter count, every tensor's elements in every shard, as
    llama.cpp's ``llama_model_n_params`` counts them."""

    metadata: dict[str, Any]
    n_params: int

    def architecture_value(self, key: str) -> Any:
        """``{architecture}.key``'s value, or None where the header does not say."""
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}")

    @property
    def context_length(self) -> int | None:
        value = self.architecture_value("context_length")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_header(path: Path) -> GgufHeader:
    """The header of the model whose first file is ``path`` (a split model's metadata is its first shard's,
    its tensors every shard's): a walk over the bytes, not gguf's reader, which builds an object for each
    of a 150,000-token vocabulary's strings (seconds); a header cut short or garbled is one line."""
    metadata: dict[str, Any] = {}
    n_params = 0
    for index, shard in enumerate(shard_paths(path)):
        try:
            with shard.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
                shard_metadata, shard_params = _walk_header(view)
        except (OSError, ValueError, struct.error, RecursionError) as err:  # UnicodeDecodeError: a ValueError
            why = unreadable(err) if isinstance(err, OSError) else "its header is cut short or garbled"
            raise EadError(f"cannot read the GGUF header of {shown_path(shard)}: {why}") from None
        if index == 0:
            metadata = shard_metadata
        n_params += shard_params
    return GgufHeader(metadata, n_params)


def _walk_header(view: mmap.mmap) -> tuple[dict[str, Any], int]:
    """The metadata's scalars and strings, and the sum of the tensors' elements, of one GGUF file (v2, v3)."""
    if view[:4] != GGUF_MAGIC:
        raise ValueError("bad magic")
    version, n_tensors, n_values = struct.unpack_from("<IQQ", view, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}")
    offset = 24

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, view, offset)
        offset += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal offset
        size = take("<Q")
        if offset + size > len(view):
            raise ValueError("a string past the end")
        offset += size
        return view[offset - size : offset].decode()

    def skip_array() -> None:
        nonlocal offset
        kind, count = take("<I"), take("<Q")
        if kind in _SCALARS:
            offset += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:  # a vocabulary's 150,000 strings: the walk's time, so the loop is bare
            length = _LENGTH.unpack_from  # a length past the end raises struct.error: the view's bound
            for _ in range(count):
                offset += 8 + length(view, offset)[0]
            if offset > len(view):
                raise ValueError("an array past the end")
        elif kind == _ARRAY:
            for _ in range(count):
                skip_array()
        else:
            raise ValueError(f"value type {kind}")

    metadata: dict[str, Any] = {}
    for _ in range(n_values):
        key, kind = text(), take("<I")
        if kind in _SCALARS:
            metadata[key] = take("<" + _SCALARS[kind])
        elif kind == _STRING:
            metadata[key] = text()
        elif kind == _ARRAY:
            skip_array()
        else:
            raise ValueError(f"value type {kind}")
    n_params = 0
    for _ in range(n_tensors):
        text()
        dims = take("<I")
        elements = 1
        for _ in range(dims):
            elements *= take("<Q")
        offset += 4 + 8  # the tensor's type and its data's offset
        n_params += elements
    return metadata, n_params


@cache
def file_type_names() -> dict[int, str]:
    """A GGUF's file types (general.file_type) by name, from llama.cpp's own (LLAMA_FTYPE_MOSTLY_Q4_K_M:
    Q4_K_M), which are ollama's names of a model's quantization too."""
    import llama_cpp

    return {
        getattr(llama_cpp, name): name.removeprefix("LLAMA_FTYPE_ALL_").removeprefix("LLAMA_FTYPE_MOSTLY_")
        for name in dir(llama_cpp)
        if name.startswith(("LLAMA_FTYPE_ALL_", "LLAMA_FTYPE_MOSTLY_"))
    }

"""GGUF files on disk: the shards of a split model, the check that a path is a readable GGUF, and its
training context read without loading it."""

from __future__ import annotations

import re
import stat
from pathlib import Path

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
    import gguf

    try:
        fields = gguf.GGUFReader(path).fields
        arch = str(fields["general.architecture"].contents())
        return int(fields[f"{arch}.context_length"].contents())
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None

"""Models other tools keep, used in place: ollama's blobs (``ollama:NAME[:TAG]``) and LM Studio's
files (``lmstudio:PUBLISHER/MODEL``), found, listed and resolved to a GGUF path."""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ead_cli.errors import EadError, quoted, shown_path
from ead_cli.gguf_files import SHA256, checked_gguf, is_gguf_name, model_bytes, shard_paths
from ead_cli.paths import env_path, expand_home, is_dir, is_file, lookup, read_file, unreadable

OLLAMA_PREFIX = "ollama:"
LMSTUDIO_PREFIX = "lmstudio:"
_OLLAMA_REGISTRY = "registry.ollama.ai"
_OLLAMA_NAMESPACE = "library"
_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_LISTED = 10  # models named in a "not found" message before "and N more"
_LMSTUDIO_DEFAULTS = ("~/.lmstudio/models", "~/.cache/lm-studio/models")  # today's, and before LM Studio 0.3


@dataclass(frozen=True)
class UserModel:
    """A GGUF file another tool keeps, usable as ``--small``/``--large`` where it lies.

    ``path`` is None and ``problem`` says why when the file cannot be used (a broken ollama manifest).
    """

    ref: str  # what to pass to ead: ollama:NAME:TAG or lmstudio:PATH
    source: str  # "ollama" or "lmstudio"
    path: Path | None
    size: int = 0
    problem: str = ""


def is_user_model(ref: str) -> bool:
    """Whether ``ref`` names a model another tool keeps (``ollama:`` or ``lmstudio:``)."""
    return ref.startswith((OLLAMA_PREFIX, LMSTUDIO_PREFIX))


def ollama_models_dir() -> Path:
    """$OLLAMA_MODELS (ollama's own override), else ~/.ollama/models."""
    return env_path("OLLAMA_MODELS", "~/.ollama/models")


def lmstudio_models_dirs() -> list[Path]:
    """$LMSTUDIO_MODELS (ead's: LM Studio has no variable of its own), else the existing ones of
    ~/.lmstudio/models and, from LM Studio before 0.3, ~/.cache/lm-studio/models."""
    override = env_path("LMSTUDIO_MODELS")
    if override:
        return [override]
    found = (expand_home(path, f"LM Studio's {path}") for path in _LMSTUDIO_DEFAULTS)
    return [root for root in found if is_dir(root)]


def user_models() -> list[UserModel]:
    """Every model ollama and LM Studio keep here, for ``ead models list``; reads manifests, not blobs."""
    return _ollama_models(ollama_models_dir()) + _lmstudio_models(lmstudio_models_dirs())


def _ollama_name(name: str) -> tuple[tuple[str, str, str], str]:
    """(registry, namespace, model) and tag of ``NAME[:TAG]``, as ollama fills them in; a registry may
    come with the scheme ollama reaches it by (``https://registry.ollama.ai/library/qwen2.5``), which
    no manifest's path holds."""
    head, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # the colon, if any, belongs to a registry's port
        head, tag = name, "latest"
    _, scheme, address = head.partition("://")
    parts = (address if scheme else head).split("/")
    too_many_or_few = len(parts) != 3 if scheme else len(parts) > 3  # a scheme comes with a registry
    if too_many_or_few or any(part in ("", ".", "..") for part in (*parts, tag)):
        raise EadError(
            f"not an ollama model name: {quoted(name)} "
            "(expected [REGISTRY/][NAMESPACE/]MODEL[:TAG], or https://REGISTRY/NAMESPACE/MODEL[:TAG])"
        )
    defaults = (_OLLAMA_REGISTRY, _OLLAMA_NAMESPACE)[: 3 - len(parts)]
    registry_, namespace, model = (*defaults, *parts)
    return (registry_, namespace, model), tag


def _ollama_ref(registry_: str, namespace: str, model: str, tag: str) -> str:
    """The short name ``ollama list`` shows: the default registry and namespace left out."""
    name = model if namespace == _OLLAMA_NAMESPACE else f"{namespace}/{model}"
    name = name if registry_ == _OLLAMA_REGISTRY else f"{registry_}/{namespace}/{model}"
    return f"{OLLAMA_PREFIX}{name}:{tag}"


def resolve_ollama(name: str) -> Path:
    root = ollama_models_dir()
    (registry_, namespace, model), tag = _ollama_name(name)
    if not is_dir(root):
        raise _no_folder("ollama", name, str(root), "OLLAMA_MODELS")
    manifest = root / "manifests" / registry_ / namespace / model / tag
    if not is_file(manifest):
        manifest = _ollama_manifest_in_any_case(root, (registry_, namespace, model, tag), name)
    return _ollama_blob(manifest, root, name)


def _ollama_manifest_in_any_case(root: Path, parts: tuple[str, str, str, str], name: str) -> Path:
    """The one manifest whose name is ``parts`` in another case: ollama matches a name to the models it
    has case-insensitively (its server's ``getExistingName``: ``ollama run Qwen2.5:0.5B`` runs
    ``qwen2.5:0.5b``)."""
    wanted = [part.lower() for part in parts]
    manifests = root / "manifests"
    found = [
        manifest
        for manifest in _ollama_manifests(manifests)
        if [part.lower() for part in manifest.relative_to(manifests).parts] == wanted
    ]
    if len(found) == 1:
        return found[0]
    if found:  # spellings ollama keeps as one file (put there by hand): which is meant is not guessed
        refs = [_ollama_ref(*manifest.relative_to(manifests).parts) for manifest in found]
        raise EadError(
            f"{quoted(OLLAMA_PREFIX + name)} matches {len(found)} ollama models{_listing(refs)}; "
            "name one as 'ollama list' spells it"
        )
    have = [model.ref for model in _ollama_models(root)]
    raise EadError(f"no ollama model {quoted(name)} in {root}{_listing(have)}; see 'ollama list'")


def _ollama_blob(manifest: Path, root: Path, name: str) -> Path:
    """The GGUF blob the manifest's model layer names, checked to be there, whole, and GGUF."""
    where = f"ollama model {quoted(name)}"
    try:
        data = json.loads(read_file(manifest))
    except OSError as err:
        raise EadError(
            f"{where}: cannot read its manifest {shown_path(manifest)} ({unreadable(err)})"
        ) from None
    except (ValueError, RecursionError):  # not JSON, bytes no JSON encoding reads, or nested past the parser
        raise EadError(f"{where}: its manifest {shown_path(manifest)} is not JSON") from None
    try:
        layer = next(item for item in data["layers"] if item.get("mediaType") == _OLLAMA_MODEL_LAYER)
        digest, size = layer["digest"], layer.get("size")
    except (TypeError, KeyError, AttributeError, StopIteration):
        raise EadError(
            f"{where}: its manifest {shown_path(manifest)} has no model layer with a digest"
        ) from None
    algorithm, _, hex_digest = str(digest).partition(":")
    if algorithm != "sha256" or not SHA256.fullmatch(hex_digest):
        raise EadError(f"{where}: its manifest {shown_path(manifest)} names a malformed digest {digest!r}")
    blob = root / "blobs" / f"sha256-{hex_digest}"
    if lookup(blob) is None:
        raise EadError(
            f"{where}: its blob {shown_path(blob.name)} is missing from {shown_path(blob.parent)}; "
            "'ollama pull' it again"
        )
    try:
        path = checked_gguf(blob)
    except EadError as err:
        raise EadError(f"{where}: {err}") from None
    if isinstance(size, int) and path.stat().st_size != size:
        raise EadError(
            f"{where}: its blob {shown_path(blob)} has {path.stat().st_size} bytes, the manifest says "
            f"{size}; "
            "'ollama pull' it again"
        )
    return path


def _ollama_manifests(manifests: Path) -> list[Path]:
    """The manifest files under ollama's ``manifests`` folder, one per model name, sorted."""
    if not is_dir(manifests):  # pathlib's glob raised where the folder was closed to this user
        return []
    return [manifest for manifest in sorted(manifests.glob("*/*/*/*")) if manifest.is_file()]


def _ollama_models(root: Path) -> list[UserModel]:
    manifests = root / "manifests"
    found: list[UserModel] = []
    for manifest in _ollama_manifests(manifests):
        ref = _ollama_ref(*manifest.relative_to(manifests).parts)
        try:
            blob = _ollama_blob(manifest, root, ref.removeprefix(OLLAMA_PREFIX))
        except EadError as err:
            found.append(UserModel(ref, "ollama", None, problem=str(err)))
        else:
            found.append(UserModel(ref, "ollama", blob, blob.stat().st_size))
    return found


def _lmstudio_models(roots: list[Path]) -> list[UserModel]:
    """The .gguf files under LM Studio's folders: a split model by its first shard that is there (the
    first, unless it is missing), no vision projectors (mmproj files, which are not language models);
    each checked as a model file, as ollama's blobs are."""
    found: list[UserModel] = []
    for root in roots:
        for path in _gguf_files(root):
            if not path.is_file() or "mmproj" in path.name.lower():
                continue
            if next(shard for shard in shard_paths(path) if shard.is_file()) != path:
                continue  # a later shard of a model listed by an earlier one
            ref = f"{LMSTUDIO_PREFIX}{path.relative_to(root).as_posix()}"
            try:
                checked = checked_gguf(path)
            except EadError as err:
                found.append(UserModel(ref, "lmstudio", None, problem=str(err)))
            else:
                found.append(UserModel(ref, "lmstudio", checked, model_bytes(checked)))
    return found


def _gguf_files(root: Path) -> list[Path]:
    """The .gguf files under ``root``, sorted, through linked folders too (models moved to another disk
    and linked back, which rglob does not enter), each real folder once, so a link loop ends."""
    seen: set[tuple[int, int]] = set()
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root, followlinks=True):
        stat = os.stat(folder)
        if (stat.st_dev, stat.st_ino) in seen:
            subfolders.clear()
            continue
        seen.add((stat.st_dev, stat.st_ino))
        found += [Path(folder, name) for name in files if is_gguf_name(name)]
    return sorted(found)


def resolve_lmstudio(name: str) -> Path:
    """A path under an LM Studio models folder (a file, or a folder holding one model), else a file name
    with or without ``.gguf``, each matched case-insensitively."""
    name = _under_the_folder(name)
    roots = lmstudio_models_dirs()
    for root in roots:
        if not is_dir(root):  # LMSTUDIO_MODELS's: the default folders are only those that are there
            raise _no_folder("LM Studio", name, str(root), "LMSTUDIO_MODELS")
    for root in roots:
        if is_file(root / name):
            return checked_gguf(root / name)
    models = _lmstudio_models(roots)
    wanted = name.lower().rstrip("/")
    matches = [
        model
        for model in models
        if wanted in (_file_name(model), _file_name(model).removesuffix(".gguf"))
        or model.ref.lower() == f"{LMSTUDIO_PREFIX}{wanted}"
        or model.ref.lower().startswith(f"{LMSTUDIO_PREFIX}{wanted}/")
    ]
    if len(matches) == 1:
        if matches[0].path is None:
            raise EadError(matches[0].problem)
        return matches[0].path
    if matches:
        raise EadError(
            f"{quoted(LMSTUDIO_PREFIX + name)} matches {len(matches)} models"
            f"{_listing([m.ref for m in matches])}"
        )
    if not roots:
        raise _no_folder("LM Studio", name, f"here ({', '.join(_LMSTUDIO_DEFAULTS)})", "LMSTUDIO_MODELS")
    where = ", ".join(shown_path(root) for root in roots)
    raise EadError(f"no LM Studio model {quoted(name)} in {where}{_listing([m.ref for m in models])}")


def _no_folder(source: str, name: str, where: str, variable: str) -> EadError:
    """A model asked of a tool whose models folder is not there: said so, not as a folder that has none."""
    return EadError(
        f"no {source} model {quoted(name)}: there is no {source} models folder {where}; "
        f"set {variable} to yours"
    )


def _under_the_folder(name: str) -> str:
    """``name`` spelled as the path under LM Studio's folder it names ('./a//b/' is 'a/b'); one that is
    absolute or climbs out with '..' is refused, as it would name a file LM Studio does not keep."""
    if not name:
        return name
    normal = posixpath.normpath(name)
    if normal.startswith("/") or normal == ".." or normal.startswith("../"):
        raise EadError(
            f"{quoted(LMSTUDIO_PREFIX + name)} leaves LM Studio's models folder: name a model under it, "
            "or pass the file's own path"
        )
    return normal


def _file_name(model: UserModel) -> str:
    """The lower-cased name of an LM Studio model's file, read from its ref (a broken file has no path)."""
    return PurePosixPath(model.ref.removeprefix(LMSTUDIO_PREFIX)).name.lower()


def _listing(refs: list[str]) -> str:
    """`` (has: a, b, ...)`` for a one-line message; empty-handed says so."""
    if not refs:
        return " (it has none)"
    more = f", and {len(refs) - _LISTED} more" if len(refs) > _LISTED else ""
    return f" (has: {', '.join(refs[:_LISTED])}{more})"

"""The depth profile: probe layers, the condition buckets, and the mean entropy per probe layer that a
token's exit is measured against (made non-increasing by isotonic regression), and where it is stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import EadError, shown_path
from ..paths import check_kept_file, config_file, read_file_text, save_json, unreadable
from .readout import (
    file_digest,
)

SCHEDULES = ("monotone", "free")
TABLE_ROWS = {"none": 1, "position": 3, "confidence": 3, "both": 9}  # buckets of each condition's table
CONDITIONS = tuple(TABLE_ROWS)
ESTIMATORS = ("full", "topk", "lowrank")
POSITION_EDGES = (32, 128)  # answer positions [1-32], [33-128], 129+
CONFIDENCE_EDGES = (0.4, 0.7)  # top-1 probability at the first probe: [0-0.4], [0.4-0.7], [0.7-1]
PROMPT_ROWS = 32  # in teacher forcing, the first tokens of a window are its prompt (read at full depth)


def check_counts(*counts: tuple[int, str]) -> None:
    """Counts of at least one (value, option), refused before a model loads: their upper bounds, where
    they have one (--probe-every's, --fixed-depth's), are the model's block count."""
    for value, option in counts:
        if value < 1:
            raise EadError(f"{option} must be at least 1, got {value}", 2)


def probe_layers(n_layer: int, every: int) -> tuple[int, ...]:
    """Every ``every`` blocks, and always the last (layers count blocks from 1)."""
    if not 1 <= every <= n_layer:
        raise EadError(
            f"--probe-every must be in [1, {n_layer}] for a model of {n_layer} blocks, got {every}", 2
        )
    return tuple(sorted({*range(every, n_layer + 1, every), n_layer}))


def isotonic_nonincreasing(values: Sequence[float]) -> list[float]:
    """The least-squares non-increasing fit (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (mean, count)
    for value in values:
        blocks.append((value, 1))
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean2, count2 = blocks.pop()
            mean1, count1 = blocks.pop()
            total = count1 + count2
            blocks.append(((mean1 * count1 + mean2 * count2) / total, total))
    return [mean for mean, count in blocks for _ in range(count)]


def position_bucket(position: int) -> int:
    return sum(position > edge for edge in POSITION_EDGES)


def confidence_bucket(top1: float) -> int:
    return sum(top1 >= edge for edge in CONFIDENCE_EDGES)


def bucket(condition: str, position: int, top1: float) -> int:
    """The row of a conditioning table a token falls in (0 without conditioning)."""
    if condition == "position":
        return position_bucket(position)
    if condition == "confidence":
        return confidence_bucket(top1)
    if condition == "both":
        return 3 * position_bucket(position) + confidence_bucket(top1)
    return 0


# ---------------------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class Profile:
    """Mean entropy per probe layer from teacher forcing, smoothed non-increasing; per condition a table
    (bucket x probe) of the same, where a bucket had no tokens its row is the unconditioned profile."""

    model: str
    digest: str
    n_layer: int
    probes: tuple[int, ...]
    raw: tuple[float, ...]
    tables: dict[str, list[list[float]]]
    counts: dict[str, list[int]]
    corpus: str
    tokens: int

    @property
    def smooth(self) -> list[float]:
        return self.tables["none"][0]

    def thresholds(self, condition: str, margin: float, position: int, top1: float) -> dict[int, float]:
        row = self.tables[condition][bucket(condition, position, top1)]
        return {layer: value - margin for layer, value in zip(self.probes, row, strict=True)}

    def to_json(self) -> dict:
        return asdict(self) | {"smooth": self.smooth, "version": 1}

    @classmethod
    def from_json(cls, data: dict, where: str, command: str) -> Profile:
        """The profile a JSON object holds, or a one-line error naming ``where`` it was read and the
        ``command`` that makes it again."""
        try:
            profile = cls(
                model=str(data["model"]),
                digest=str(data["digest"]),
                n_layer=int(data["n_layer"]),
                probes=tuple(int(p) for p in data["probes"]),
                raw=tuple(float(v) for v in data["raw"]),
                tables={k: [[float(v) for v in row] for row in rows] for k, rows in data["tables"].items()},
                counts={k: [int(v) for v in rows] for k, rows in data["counts"].items()},
                corpus=str(data["corpus"]),
                tokens=int(data["tokens"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:  # an edit: a list for an object
            raise EadError(f"the depth profile {where} is corrupt ({error!r}): run {command} again") from None
        rows = [row for table in profile.tables.values() for row in table]
        if (
            set(profile.tables) != set(CONDITIONS)
            or any(len(profile.tables[condition]) != size for condition, size in TABLE_ROWS.items())
            or any(len(row) != len(profile.probes) for row in rows)
            or not all(math.isfinite(value) for row in [*rows, profile.raw] for value in row)  # NaN: edited
        ):
            raise EadError(f"the depth profile {where} is corrupt (bad tables): run {command} again")
        first = profile.probes[0] if profile.probes else 0
        if not 1 <= first <= profile.n_layer or profile.probes != probe_layers(profile.n_layer, first):
            raise EadError(  # the layers calibrate probes: every probes[0] blocks and the last
                f"the depth profile {where} is corrupt (bad probe layers): run {command} again"
            )
        return profile


def build_profile(
    entropies: np.ndarray, positions: np.ndarray, top1: np.ndarray, *, probes: Sequence[int], meta: dict
) -> Profile:
    """A profile from teacher-forced entropies (probe x token), answer positions and first-probe top-1."""
    if entropies.shape[1] == 0:
        raise EadError("the corpus gave no tokens to calibrate on")
    raw = entropies.mean(axis=1)
    tables: dict[str, list[list[float]]] = {}
    counts: dict[str, list[int]] = {}
    overall = isotonic_nonincreasing(raw.tolist())
    for condition, size in TABLE_ROWS.items():
        rows, sizes = [], []
        keys = np.array([bucket(condition, int(p), float(c)) for p, c in zip(positions, top1, strict=True)])
        for index in range(size):
            chosen = entropies[:, keys == index]
            sizes.append(int(chosen.shape[1]))
            rows.append(
                overall if chosen.shape[1] == 0 else isotonic_nonincreasing(chosen.mean(axis=1).tolist())
            )
        tables[condition], counts[condition] = rows, sizes
    return Profile(
        probes=tuple(probes), raw=tuple(float(v) for v in raw), tables=tables, counts=counts, **meta
    )


def profile_dir() -> Path:
    """Next to ead's calibration file: $EAD_CONFIG's folder, else $XDG_CONFIG_HOME/ead-cli, + depth/."""
    return config_file().parent / "depth"


def profile_path(model: Path) -> Path:
    """Keyed by the file's name and digest: two models of one file name (in other folders) each keep
    their own profile, and a copy of a file shares its original's."""
    return profile_dir() / f"{model.name}-{file_digest(model)}.json"


def _profile_by_name(model: Path) -> Path:
    """Where a profile was saved before they were keyed by digest (the digest is inside, checked)."""
    return profile_dir() / f"{model.name}.json"


PROFILE_KEEPER = "ead keeps a depth profile"  # check_kept_file: depth generate reads it, calibrate writes


def save_profile(profile: Profile, path: Path) -> Path:
    """Written whole to a temporary name, then renamed: never half a profile, nor a temporary left."""
    return save_json(path, profile.to_json(), "the depth profile", indent=1)


def profile_file(model: Path) -> Path:
    """The file ``load_profile`` reads for this model: keyed by digest, else one saved by name alone."""
    path = profile_path(model)
    if not path.exists() and _profile_by_name(model).exists():
        return _profile_by_name(model)
    return path


def calibrate_command(reference: str, probe_every: int | None = None) -> str:
    """``ead depth calibrate`` as the user can paste it: the model as typed (an alias, ``~/...``, not the
    file it resolves to), with the ``--probe-every`` the run asked for."""
    probes = "" if probe_every is None else f" --probe-every {probe_every}"
    return f"ead depth calibrate {shown_path(reference)}{probes}"


def load_profile(
    model: Path, path: Path | None = None, *, reference: str | None = None, probe_every: int | None = None
) -> Profile:
    """The profile of this model file, or a one-line error (missing, corrupt, made for another file)
    whose advice is the command that makes it (``calibrate_command``: ``reference``, the model as typed,
    else its path)."""
    if path is None:
        path = profile_file(model)
    check_kept_file(path, PROFILE_KEEPER)
    command = calibrate_command(str(model) if reference is None else reference, probe_every)
    if not path.exists():
        raise EadError(
            f"no depth profile for {shown_path(model.name)} (looked for {shown_path(path)}): run {command}"
        )
    try:
        data = json.loads(read_file_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise EadError(f"cannot read the depth profile {shown_path(path)}: {unreadable(error)}") from None
    if not isinstance(data, dict):
        raise EadError(
            f"the depth profile {shown_path(path)} is corrupt (not a JSON object): run {command} again"
        )
    profile = Profile.from_json(data, shown_path(path), command)
    if profile.digest != file_digest(model):
        raise EadError(
            f"the depth profile {shown_path(path)} was made for another model file ({profile.model}): "
            f"run {command} again"
        )
    return profile

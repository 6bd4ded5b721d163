"""``ead models`` as an ollama or llm user expects it: ``list --json``'s fields, and the bare group; the
real CLI on tiny GGUF models in a real hub-cache layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import ead

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Every model folder and cache under tmp_path, a models file with an alias downloaded ('tiny', in a
    real hub-cache layout) and one not ('away')."""
    models = tmp_path / "models.toml"
    models.write_text(
        """
[models.tiny]
description = "a tiny test model"
params = 1.5e6
repo = "ead-test/tiny-GGUF"
pattern = "tiny*.gguf"

[models.away]
description = "never downloaded"
params = 7.61e9
repo = "ead-test/away-GGUF"
pattern = "away*.gguf"
"""
    )
    return {
        "OLLAMA_MODELS": str(tmp_path / "ollama"),
        "LMSTUDIO_MODELS": str(tmp_path / "lmstudio"),
        "EAD_CACHE": str(tmp_path / "ead-cache"),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "EAD_MODELS": str(models),
        "HOME": str(tmp_path / "home"),
    }


def in_hub_cache(env: dict[str, str], model: Path) -> Path:
    """``model`` as the hub cache keeps the 'tiny' alias's file: refs/main -> snapshots/<commit>/<name>,
    a link to ../../blobs/<etag>. Returns the snapshot's path, which ead loads."""
    repo = Path(env["HF_HOME"]) / "hub" / "models--ead-test--tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "etag1").write_bytes(model.read_bytes())
    snapshot = repo / "snapshots" / COMMIT / "tiny-q4.gguf"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to("../../blobs/etag1")
    return snapshot


def test_models_list_json_gives_a_downloaded_aliass_file_and_whole_counts(
    env: dict[str, str], tiny_small: Path
) -> None:
    """The path had been null for every alias, downloaded or not, and params a float (1540000000.0)."""
    snapshot = in_hub_cache(env, tiny_small)
    result = ead("models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = {row["ref"]: row for row in json.loads(result.stdout)}
    assert rows["tiny"] == {
        "ref": "tiny",
        "source": "catalog",
        "description": "a tiny test model",
        "params": 1_500_000,
        "local": "hub cache",
        "path": str(snapshot),
    }
    assert (rows["away"]["path"], rows["away"]["local"], rows["away"]["params"]) == (
        None,
        None,
        7_610_000_000,
    )
    assert all(isinstance(row["params"], int) for row in rows.values() if row["params"] is not None)


def test_bare_models_lists_them(env: dict[str, str]) -> None:
    """As `llm models` does; it had been the help on stderr, exit 2."""
    bare, listed = ead("models", env=env), ead("models", "list", env=env)
    assert (bare.returncode, bare.stderr) == (0, b"")
    assert bare.stdout == listed.stdout and b"away" in bare.stdout


def test_bare_bench_is_its_help(env: dict[str, str]) -> None:
    """Which bench to run is the user's choice: the help that lists them, on stdout, exit 0 (it had been
    on stderr, exit 2, as for a mistake)."""
    for columns in ("80", "160"):  # click's plain help and typer's tables
        bare = ead("bench", env={**env, "COLUMNS": columns})
        helped = ead("bench", "--help", env={**env, "COLUMNS": columns})
        assert (bare.returncode, bare.stderr) == (0, b"")
        assert bare.stdout == helped.stdout and b"humaneval" in bare.stdout

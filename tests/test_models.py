"""``ead models`` as an ollama or llm user expects it: ``show`` (what a model is, from its file's header,
checked against llama.cpp loading the same file), ``list --json``'s fields, and the bare group; the real
CLI on tiny GGUF models in real hub-cache and ollama layouts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from test_cli import assert_one_line_error, ead
from test_user_models import add_ollama_model
from tiny_models import write_tiny_model

from ead_cli.errors import EadError
from ead_cli.gguf_files import read_header, training_context
from ead_cli.model_info import template_family
from ead_cli.runner import Runner

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


def shown(env: dict[str, str], model: str) -> dict:
    result = ead("models", "show", model, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def loaded(path: Path) -> dict:
    """What llama.cpp says of the model once it has loaded it."""
    with Runner(path, name="model", n_threads=1) as runner:
        return {
            "params": runner.n_params,
            "context_length": runner.n_ctx_train,
            "embedding_length": runner.n_embd,
            "quantization": runner.file_type,
            "architecture": runner.metadata("general.architecture"),
        }


def test_show_reads_from_the_header_what_llama_cpp_loads(env: dict[str, str], tiny_small: Path) -> None:
    info = shown(env, str(tiny_small))
    expected = loaded(tiny_small)
    assert {key: info[key] for key in expected} == expected
    assert expected["quantization"] == "F32" and expected["context_length"] == 2048
    assert info == {
        **expected,
        "ref": str(tiny_small),
        "source": "file",
        "description": None,
        "chat_template": "chatml",
        "thinking": False,
        "downloaded": True,
        "paths": [str(tiny_small)],
        "size": tiny_small.stat().st_size,
    }
    assert isinstance(info["params"], int) and info["params"] > 0


def test_show_says_a_thinking_models_template_has_the_block(
    env: dict[str, str], tiny_think_pair: tuple[Path, Path]
) -> None:
    info = shown(env, str(tiny_think_pair[0]))
    assert (info["chat_template"], info["thinking"]) == ("chatml", True)


def test_a_template_is_named_by_llama_cpps_family() -> None:
    """The names llama.cpp's own formatter gives the families it recognises; 'other' for one it does not
    (ead renders it with jinja2 all the same), None for a file without one."""
    llama3 = (
        "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{{ message['content'] }}<|eot_id|>{% endfor %}"
    )
    gemma = (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>{% endfor %}"
    )
    assert template_family(llama3) == "llama3"
    assert template_family(gemma) == "gemma"
    # Granite: llama.cpp's three builtins write these probes alike, and Granite 3's template had named
    # Granite 4's too; a tool call's turn tells 3 from 4, and 4.0 and 4.1 write every turn alike
    granite = (
        "{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}"
        "<|end_of_text|>\n{% endfor %}"
    )
    assert template_family(granite) == "granite"
    assert template_family(granite + "{# <tools> #}") == "granite-4.0 or granite-4.1"
    assert template_family("{{ messages[0]['content'] }}") == "other"
    assert template_family(None) is None


def test_show_of_a_file_without_a_template_says_none(env: dict[str, str], tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "bare.gguf", chat_template=None)
    info = shown(env, str(path))
    assert (info["chat_template"], info["thinking"]) == (None, None)
    text = ead("models", "show", str(path), env=env).stdout.decode()
    assert "chat template" not in text and "architecture      llama" in text


def test_show_of_a_split_model_lists_every_shard_and_counts_them_all(
    env: dict[str, str], tmp_path: Path
) -> None:
    whole = write_tiny_model(tmp_path / "whole.gguf", seed=4)
    first = write_tiny_model(tmp_path / "split.gguf", seed=4, split_max_tensors=11)
    shards = sorted(tmp_path.glob("split-0000*-of-00002.gguf"))
    assert len(shards) == 2 and first == shards[0]
    info = shown(env, str(first))
    assert info["paths"] == [str(shard) for shard in shards]
    assert info["size"] == sum(shard.stat().st_size for shard in shards)
    assert info["params"] == loaded(whole)["params"] == loaded(first)["params"]


def test_show_of_an_alias_downloaded_and_not(env: dict[str, str], tiny_small: Path) -> None:
    snapshot = in_hub_cache(env, tiny_small)
    info = shown(env, "tiny")
    assert (info["source"], info["description"], info["downloaded"]) == ("catalog", "a tiny test model", True)
    assert info["paths"] == [str(snapshot)] and info["params"] == loaded(tiny_small)["params"]
    away = shown(env, "away")
    assert away == {
        "ref": "away",
        "source": "catalog",
        "description": "never downloaded",
        "architecture": None,
        "params": 7_610_000_000,  # the catalog's figure, as a count
        "context_length": None,
        "embedding_length": None,
        "quantization": None,
        "chat_template": None,
        "thinking": None,
        "downloaded": False,
        "paths": [],
        "size": None,
    }
    text = ead("models", "show", "away", env=env)
    assert text.returncode == 0 and b"no (ead models pull away)" in text.stdout
    assert not (Path(env["HF_HOME"]) / "hub" / "models--ead-test--away-GGUF").exists()  # nothing fetched


def test_show_of_a_model_ollama_or_lm_studio_keeps_is_its_file(env: dict[str, str], tiny_small: Path) -> None:
    blob = add_ollama_model(Path(env["OLLAMA_MODELS"]), "tiny", "latest", tiny_small.read_bytes())
    info = shown(env, "ollama:tiny")
    assert (info["source"], info["paths"], info["quantization"]) == ("ollama", [str(blob)], "F32")
    kept = Path(env["LMSTUDIO_MODELS"]) / "someone" / "Tiny-GGUF" / "tiny-q4.gguf"
    kept.parent.mkdir(parents=True)
    shutil.copyfile(tiny_small, kept)
    info = shown(env, "lmstudio:tiny-q4")
    assert (info["source"], info["paths"], info["size"]) == ("lmstudio", [str(kept)], kept.stat().st_size)


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        ("nope", "unknown model alias 'nope'"),
        ("./missing.gguf", "model file not found: ./missing.gguf"),
        ("ollama:nothing", "'nothing'"),
        ("lmstudio:nothing", "'nothing'"),
    ],
)
def test_show_of_a_model_not_found_is_one_line_naming_it(
    env: dict[str, str], model: str, fragment: str
) -> None:
    assert_one_line_error(ead("models", "show", model, env=env), 1, fragment)


def test_show_of_a_garbled_header_is_one_line(env: dict[str, str], tiny_small: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_small.read_bytes()[:200])  # the magic, then a header cut short
    assert_one_line_error(
        ead("models", "show", str(cut), env=env), 1, f"cannot read the GGUF header of {cut}: ", "cut short"
    )
    assert training_context(cut) is None
    assert training_context(tiny_small) == loaded(tiny_small)["context_length"]


def test_a_header_cut_anywhere_is_unreadable_not_a_traceback(tiny_small: Path, tmp_path: Path) -> None:
    """Cut at every few bytes up to the tensors' data (inside the vocabulary's strings too, which the walk
    skips by their lengths alone): each is 'cut short', never struct's or an index's error."""
    whole = tiny_small.read_bytes()
    cut = tmp_path / "cut.gguf"
    for end in range(4, gguf.GGUFReader(tiny_small).data_offset, 97):
        cut.write_bytes(whole[:end])
        with pytest.raises(EadError, match="cut short or garbled"):
            read_header(cut)
    assert read_header(tiny_small).n_params > 0


def test_models_list_json_gives_a_downloaded_aliass_file_and_whole_counts(
    env: dict[str, str], tiny_small: Path
) -> None:
    """The path had been null for every alias, downloaded or not, and params a float (1540000000.0). A
    downloaded alias's count is its file's, as ``models show`` gives it (the list had given the catalog's
    1.5e6 where show gave the file's: 0.49B and 0.63B for qc0.5b); one not downloaded, the catalog's."""
    snapshot = in_hub_cache(env, tiny_small)
    result = ead("models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = {row["ref"]: row for row in json.loads(result.stdout)}
    assert rows["tiny"] == {
        "ref": "tiny",
        "source": "catalog",
        "description": "a tiny test model",
        "params": loaded(tiny_small)["params"],
        "local": "hub cache",
        "path": str(snapshot),
    }
    assert rows["tiny"]["params"] == shown(env, "tiny")["params"] != 1_500_000
    assert (rows["away"]["path"], rows["away"]["local"], rows["away"]["params"]) == (
        None,
        None,
        7_610_000_000,
    )
    assert rows["away"]["params"] == shown(env, "away")["params"]
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


def test_show_cuts_no_name_at_a_terminals_width(env: dict[str, str], tiny_small: Path) -> None:
    """In a pipe the table is whole, whatever COLUMNS says: a path cut short names nothing."""
    result = ead("models", "show", str(tiny_small), env={**env, "COLUMNS": "40"})
    assert f"path              {tiny_small}\n" in result.stdout.decode()

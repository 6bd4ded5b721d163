"""Models a user already has: real ollama and LM Studio folder layouts around tiny GGUF models, used by
the real CLI; ``ead models list --json`` and ``ead models rm``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import pytest
from test_cli import assert_one_line_error, ead

from ead_cli import registry, user_models
from ead_cli.errors import EadError, quoted

PROMPT = "hello"


def add_ollama_model(
    root: Path, name: str, tag: str, blob_bytes: bytes, *, namespace: str = "library"
) -> Path:
    """Lay a model out as ollama does: the blob named by its SHA-256, a manifest whose model layer names it
    (beside a template layer, as real manifests have). Returns the blob."""
    digest = hashlib.sha256(blob_bytes).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(blob_bytes)
    template = b"{{ .Prompt }}"
    (root / "blobs" / f"sha256-{hashlib.sha256(template).hexdigest()}").write_bytes(template)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": "sha256:" + "0" * 64,
        },
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": len(blob_bytes),
            },
            {
                "mediaType": "application/vnd.ollama.image.template",
                "digest": f"sha256:{hashlib.sha256(template).hexdigest()}",
                "size": len(template),
            },
        ],
    }
    path = root / "manifests" / user_models._OLLAMA_REGISTRY / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Every model folder and cache under tmp_path: never the real ones."""
    return {
        "OLLAMA_MODELS": str(tmp_path / "ollama"),
        "LMSTUDIO_MODELS": str(tmp_path / "lmstudio"),
        "EAD_CACHE": str(tmp_path / "ead-cache"),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HOME": str(tmp_path / "home"),
    }


@pytest.fixture
def ollama_root(env: dict[str, str], tiny_small: Path) -> Path:
    root = Path(env["OLLAMA_MODELS"])
    add_ollama_model(root, "tiny", "latest", tiny_small.read_bytes())
    add_ollama_model(root, "tiny", "v2", tiny_small.read_bytes(), namespace="someone")
    return root


def generate(env: dict[str, str], small: str, large: str) -> bytes:
    options = ["--small", small, "--large", large, "--mode", "ead", "--threads", "1", "--max-tokens", "12"]
    result = ead("generate", *options, PROMPT, env=env)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def refused(env: dict[str, str], small: str, large: Path) -> str:
    """The one error line of ``ead generate --small SMALL --large LARGE`` with the pair switching (so
    both load), which must fail with exit 1."""
    options = ["--small", small, "--large", str(large), "--mode", "ead", "--threads", "1"]
    result = ead("generate", *options, PROMPT, env=env)
    return assert_one_line_error(result, 1)


def test_ollama_model_generates_what_its_file_does(
    env: dict[str, str], ollama_root: Path, tiny_pair: tuple[Path, Path]
) -> None:
    small, large = tiny_pair
    expected = generate(env, str(small), str(large))
    assert expected.strip()
    assert generate(env, "ollama:tiny", str(large)) == expected
    assert generate(env, "ollama:tiny:latest", str(large)) == expected
    assert generate(env, "ollama:someone/tiny:v2", str(large)) == expected
    assert not list(Path(env["EAD_CACHE"]).rglob("*.gguf"))  # used where it lies: nothing copied
    coloured = ead(
        "generate",
        "--small",
        "ollama:tiny",
        "--large",
        str(large),
        "--mode",
        "ead",
        "--threads",
        "1",
        "--max-tokens",
        "2",
        PROMPT,
        env={**env, "FORCE_COLOR": "1"},
    )
    assert "■ small\x1b[0m: ollama:tiny  " in coloured.stderr.decode()  # the legend names it, not its digest


def test_ollama_model_is_tokenizer_checked(
    env: dict[str, str], ollama_root: Path, tiny_other_vocab: Path, tiny_large: Path
) -> None:
    add_ollama_model(ollama_root, "other", "latest", tiny_other_vocab.read_bytes())
    assert "tokenizer" in refused(env, "ollama:other", tiny_large)


def test_unknown_ollama_model_lists_what_exists(
    env: dict[str, str], ollama_root: Path, tiny_large: Path
) -> None:
    for ref in ("ollama:nothere", "ollama:tiny:v9"):
        line = refused(env, ref, tiny_large)
        assert f"no ollama model '{ref.removeprefix('ollama:')}' in {ollama_root}" in line
        assert "(has: ollama:tiny:latest, ollama:someone/tiny:v2)" in line


def test_broken_ollama_blobs_are_one_line(
    env: dict[str, str], ollama_root: Path, tiny_small: Path, tiny_large: Path
) -> None:
    missing = add_ollama_model(ollama_root, "gone", "latest", tiny_small.read_bytes() + b"x")
    missing.unlink()
    line = refused(env, "ollama:gone", tiny_large)
    assert f"ollama model 'gone': its blob {missing.name} is missing from {missing.parent}" in line

    add_ollama_model(ollama_root, "notgguf", "latest", b"PK\x03\x04 a zip, not a model")
    line = refused(env, "ollama:notgguf", tiny_large)
    assert "ollama model 'notgguf': not a GGUF file (bad magic)" in line

    cut = add_ollama_model(ollama_root, "cut", "latest", tiny_small.read_bytes())
    cut.write_bytes(cut.read_bytes()[:1000])
    line = refused(env, "ollama:cut", tiny_large)
    assert f"has 1000 bytes, the manifest says {tiny_small.stat().st_size}" in line

    manifest = ollama_root / "manifests" / user_models._OLLAMA_REGISTRY / "library" / "garbled" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{not json")
    line = refused(env, "ollama:garbled", tiny_large)
    assert line.endswith(f"ollama model 'garbled': its manifest {manifest} is not JSON")
    manifest.write_bytes(b"\xff\xfe\xff")  # no JSON encoding reads these bytes
    assert refused(env, "ollama:garbled", tiny_large) == line
    manifest.write_text("[" * 100_000)  # nested past the parser's recursion limit: it had been a traceback
    assert refused(env, "ollama:garbled", tiny_large) == line
    listed = ead("models", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr.decode()
    garbled = next(row for row in json.loads(listed.stdout) if row["ref"] == "ollama:garbled:latest")
    assert garbled["description"].endswith("is not JSON")
    manifest.write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.template"}]}')
    line = refused(env, "ollama:garbled", tiny_large)
    assert line.endswith(f"ollama model 'garbled': its manifest {manifest} has no model layer with a digest")


@pytest.mark.parametrize(
    "name",
    [
        "qwen2.5:0.5b",
        "Qwen2.5:0.5B",
        "library/qwen2.5:0.5b",
        "Library/QWEN2.5:0.5b",
        "Registry.Ollama.AI/library/Qwen2.5:0.5B",
        "https://registry.ollama.ai/library/qwen2.5:0.5b",
        "someone/MyModel",
        "SOMEONE/mymodel:Latest",
    ],
)
def test_an_ollama_name_is_found_in_any_case_as_ollama_finds_it(
    env: dict[str, str], tiny_small: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """ollama matches a name to the models it has case-insensitively (its server's getExistingName), so
    'ollama run Qwen2.5:0.5B' runs qwen2.5:0.5b; ead had looked for the manifest as spelled and found none.
    A registry given with its scheme, as ollama reads one (ParseNameBare), is the same model."""
    root = Path(env["OLLAMA_MODELS"])
    blob = add_ollama_model(root, "qwen2.5", "0.5b", tiny_small.read_bytes())
    assert add_ollama_model(root, "MyModel", "latest", tiny_small.read_bytes(), namespace="someone") == blob
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    assert user_models.resolve_ollama(name) == blob


def test_ollama_names_that_differ_only_in_case_are_each_found_by_their_own_spelling(
    env: dict[str, str], tiny_small: Path, tiny_large: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two manifests whose names differ only in case (ollama keeps one file per name, so put there by
    hand): each is found as spelled, and another spelling names both rather than one by chance."""
    root = Path(env["OLLAMA_MODELS"])
    lower = add_ollama_model(root, "tiny", "latest", tiny_small.read_bytes())
    upper = add_ollama_model(root, "Tiny", "latest", tiny_large.read_bytes())
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    assert (user_models.resolve_ollama("tiny"), user_models.resolve_ollama("Tiny")) == (lower, upper)
    with pytest.raises(EadError) as caught:
        user_models.resolve_ollama("TINY")
    assert str(caught.value) == (
        "'ollama:TINY' matches 2 ollama models (has: ollama:Tiny:latest, ollama:tiny:latest); "
        "name one as 'ollama list' spells it"
    )


EXPECTED_OLLAMA_NAME = (
    "expected [REGISTRY/][NAMESPACE/]MODEL[:TAG], or https://REGISTRY/NAMESPACE/MODEL[:TAG]"
)


def test_bad_ollama_names_are_one_line(env: dict[str, str], tiny_large: Path) -> None:
    for name in ("a/b/c/d", "../x", "x:", "x//y", "https://library/x", "https://x"):
        line = refused(env, f"ollama:{name}", tiny_large)
        assert f"not an ollama model name: '{name}'" in line
        assert line.endswith(f"({EXPECTED_OLLAMA_NAME})")  # the form with a scheme said too
    (Path(env["OLLAMA_MODELS"]) / "manifests").mkdir(parents=True)
    empty = ead("generate", "--small", "ollama:x", "--large", str(tiny_large), PROMPT, env=env)
    assert "(it has none)" in assert_one_line_error(empty, 1)


def test_a_long_name_is_echoed_cut(
    env: dict[str, str], ollama_root: Path, lmstudio_root: Path, tiny_large: Path
) -> None:
    """A name that finds no model is echoed as every refused value is (errors.quoted): a 100,000-character
    one had been echoed whole, a line no one could read."""
    long = "x" * 100_000
    echoed = f"'{'x' * 80}'... (100000 characters)"
    assert refused(env, f"ollama:{long}", tiny_large).startswith(f"error: no ollama model {echoed} in ")
    assert refused(env, f"ollama:{long}/a/b/c", tiny_large) == (
        f"error: not an ollama model name: '{'x' * 80}'... (100006 characters) ({EXPECTED_OLLAMA_NAME})"
    )
    assert refused(env, f"lmstudio:{long}", tiny_large).startswith(f"error: no LM Studio model {echoed} in ")
    assert refused(env, f"lmstudio:/{long}", tiny_large).startswith(
        f"error: 'lmstudio:/{'x' * 70}'... (100010 characters) leaves LM Studio's models folder"
    )


@pytest.mark.parametrize("what", ["nothing", "a file"])
def test_a_models_folder_that_is_not_there_is_said_so(
    env: dict[str, str], tmp_path: Path, tiny_large: Path, what: str
) -> None:
    """A mistyped OLLAMA_MODELS or LMSTUDIO_MODELS had read 'no ollama model 'x' in /typo (it has none)',
    as if the folder were there and empty."""
    typo = tmp_path / "typo"
    if what == "a file":
        typo.write_text("not a folder")
    for variable, source in (("OLLAMA_MODELS", "ollama"), ("LMSTUDIO_MODELS", "LM Studio")):
        ref = f"{source.replace(' ', '').lower()}:x"
        result = ead("generate", "--large", ref, PROMPT, env={**env, variable: str(typo)})
        assert assert_one_line_error(result, 1) == (
            f"error: no {source} model 'x': there is no {source} models folder {typo}; "
            f"set {variable} to yours"
        )


@pytest.fixture
def lmstudio_root(env: dict[str, str], tiny_small: Path) -> Path:
    root = Path(env["LMSTUDIO_MODELS"])
    folder = root / "someone" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    shutil.copyfile(tiny_small, folder / "tiny-q4.gguf")
    (folder / "mmproj-tiny.gguf").write_bytes(b"GGUF vision projector, not listed")
    (root / "other" / "Twin-GGUF").mkdir(parents=True)
    shutil.copyfile(tiny_small, root / "other" / "Twin-GGUF" / "twin.gguf")
    shutil.copyfile(tiny_small, root / "other" / "Twin-GGUF" / "TWIN-copy.gguf")
    return root


def test_lmstudio_model_by_path_folder_and_name(
    env: dict[str, str], lmstudio_root: Path, tiny_pair: tuple[Path, Path]
) -> None:
    small, large = tiny_pair
    expected = generate(env, str(small), str(large))
    for ref in ("someone/Tiny-GGUF/tiny-q4.gguf", "someone/Tiny-GGUF", "tiny-q4", "TINY-Q4.gguf"):
        assert generate(env, f"lmstudio:{ref}", str(large)) == expected, ref


def test_lmstudio_misses_are_one_line(env: dict[str, str], lmstudio_root: Path, tiny_large: Path) -> None:
    line = refused(env, "lmstudio:nothere", tiny_large)
    assert f"no LM Studio model 'nothere' in {lmstudio_root}" in line
    assert "lmstudio:someone/Tiny-GGUF/tiny-q4.gguf" in line
    assert "mmproj" not in line
    line = refused(env, "lmstudio:other/Twin-GGUF", tiny_large)
    assert "'lmstudio:other/Twin-GGUF' matches 2 models" in line


def test_an_lmstudio_name_that_leaves_its_folder_is_refused(
    env: dict[str, str], lmstudio_root: Path, tiny_small: Path, tiny_large: Path
) -> None:
    """``lmstudio:`` names a model LM Studio keeps: an absolute path or one climbing out with '..' had
    loaded whatever file it reached (shown as an LM Studio model); a name spelled with './' or '//'
    finds the folder it names."""
    outside = lmstudio_root.parent / "outside.gguf"
    shutil.copyfile(tiny_small, outside)
    for name in (str(outside), "../outside.gguf", "someone/../../outside.gguf", ".."):
        line = refused(env, f"lmstudio:{name}", tiny_large)
        assert line == (
            f"error: {quoted('lmstudio:' + name)} leaves LM Studio's models folder: name a model under it, "
            "or pass the file's own path"
        )
    expected = generate(env, str(tiny_small), str(tiny_large))
    for name in ("./someone/Tiny-GGUF", "someone//Tiny-GGUF/", "someone/../someone/Tiny-GGUF/tiny-q4.gguf"):
        assert generate(env, f"lmstudio:{name}", str(tiny_large)) == expected, name


def test_models_list_says_what_is_wrong_with_a_broken_lmstudio_file(
    env: dict[str, str], lmstudio_root: Path, tiny_small: Path, tiny_large: Path
) -> None:
    """An empty file and a split model missing a shard are listed with their problem, as a broken ollama
    blob is (they had been listed as usable, 0.00 GiB), and naming one says the same; a model at the
    folder's top is found by its name."""
    folder = lmstudio_root / "someone" / "Broken-GGUF"
    folder.mkdir()
    (folder / "empty.gguf").touch()
    shutil.copyfile(tiny_small, folder / "split-00001-of-00002.gguf")
    shutil.copyfile(tiny_small, lmstudio_root / "top.gguf")
    result = ead("models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr.decode()
    rows = {row["ref"]: row for row in json.loads(result.stdout) if row["source"] == "lmstudio"}
    empty = rows["lmstudio:someone/Broken-GGUF/empty.gguf"]
    assert (empty["local"], empty["path"]) == (None, None)
    assert empty["description"] == f"model file is empty (0 bytes): {folder / 'empty.gguf'}"
    split = rows["lmstudio:someone/Broken-GGUF/split-00001-of-00002.gguf"]
    assert (split["local"], split["path"]) == (None, None)
    assert split["description"].startswith("split model split-00001-of-00002.gguf is missing 1 of its 2")
    assert rows["lmstudio:someone/Tiny-GGUF/tiny-q4.gguf"]["local"] == "lmstudio"
    assert refused(env, "lmstudio:EMPTY", tiny_large) == f"error: {empty['description']}"
    assert refused(env, "lmstudio:split-00001-of-00002", tiny_large) == f"error: {split['description']}"
    assert generate(env, "lmstudio:top", str(tiny_large)) == generate(env, str(tiny_small), str(tiny_large))


def test_a_split_lmstudio_model_is_listed_once_with_the_size_of_all_its_shards(tmp_path: Path) -> None:
    folder = tmp_path / "someone" / "Big-GGUF"
    folder.mkdir(parents=True)
    for index, size in ((1, 1000), (2, 3000), (3, 500)):
        (folder / f"big-0000{index}-of-00003.gguf").write_bytes(b"GGUF" + bytes(size - 4))
    (listed,) = user_models._lmstudio_models([tmp_path])
    assert listed.ref == "lmstudio:someone/Big-GGUF/big-00001-of-00003.gguf"
    assert (listed.path, listed.size) == (folder / "big-00001-of-00003.gguf", 4500)


def test_a_split_lmstudio_model_saved_as_upper_case_gguf_is_listed_once_with_why_it_cannot_load(
    tmp_path: Path,
) -> None:
    """Its shards had been listed as two models, each usable: llama.cpp loads neither by these names."""
    folder = tmp_path / "someone" / "Big-GGUF"
    folder.mkdir(parents=True)
    for index in (1, 2):
        (folder / f"big-0000{index}-of-00002.GGUF").write_bytes(b"GGUF")
    (listed,) = user_models._lmstudio_models([tmp_path])
    assert (listed.ref, listed.path) == ("lmstudio:someone/Big-GGUF/big-00001-of-00002.GGUF", None)
    assert listed.problem.startswith("split model big-00001-of-00002.GGUF: llama.cpp finds a split model's ")


def test_a_split_lmstudio_model_without_its_first_shard_is_listed_with_that_problem(
    env: dict[str, str], tiny_small: Path, tiny_large: Path
) -> None:
    """A split model is listed by its first shard: without that shard it had been left out of the list, and
    naming its folder said there was no such model."""
    folder = Path(env["LMSTUDIO_MODELS"]) / "someone" / "Big-GGUF"
    folder.mkdir(parents=True)
    for index in (2, 3):
        shutil.copyfile(tiny_small, folder / f"big-0000{index}-of-00003.gguf")
    first = folder / "big-00001-of-00003.gguf"
    expected = f"split model big-00002-of-00003.gguf is missing 1 of its 3 shards: {first}"
    (listed,) = user_models._lmstudio_models([Path(env["LMSTUDIO_MODELS"])])
    assert (listed.ref, listed.path, listed.problem) == (
        "lmstudio:someone/Big-GGUF/big-00002-of-00003.gguf",
        None,
        expected,
    )
    assert refused(env, "lmstudio:someone/Big-GGUF", tiny_large) == f"error: {expected}"


def test_lmstudio_models_in_a_linked_folder_are_found_and_a_link_loop_ends(
    tmp_path: Path, tiny_small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher's folder moved to another disk and linked back is listed and found by name (rglob had
    not entered it); a link to a folder above is walked once."""
    root, elsewhere = tmp_path / "lmstudio", tmp_path / "other-disk" / "Tiny-GGUF"
    elsewhere.mkdir(parents=True)
    shutil.copyfile(tiny_small, elsewhere / "tiny-q4.gguf")
    (root / "someone").mkdir(parents=True)
    (root / "someone" / "Tiny-GGUF").symlink_to(elsewhere, target_is_directory=True)
    (root / "someone" / "loop").symlink_to(root, target_is_directory=True)
    monkeypatch.setenv("LMSTUDIO_MODELS", str(root))
    (listed,) = user_models._lmstudio_models([root])
    assert listed.ref == "lmstudio:someone/Tiny-GGUF/tiny-q4.gguf"
    assert listed.path == root / "someone" / "Tiny-GGUF" / "tiny-q4.gguf"
    for name in ("tiny-q4", "someone/Tiny-GGUF"):
        assert user_models.resolve_lmstudio(name) == listed.path


def test_an_lmstudio_model_file_ending_in_upper_case_gguf_is_listed_and_found_in_any_case(
    tmp_path: Path, tiny_small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suffix is taken in any case, as a model named is (``lmstudio:TINY-Q4.gguf``): a file saved as
    ``tiny-q4.GGUF`` loaded when its path was given but was left out of ``ead models list``. Its path in
    another case is found as its name and its folder are (it had been 'no LM Studio model')."""
    folder = tmp_path / "someone" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    shutil.copyfile(tiny_small, folder / "tiny-q4.GGUF")
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path))
    (listed,) = user_models._lmstudio_models([tmp_path])
    assert (listed.ref, listed.path) == ("lmstudio:someone/Tiny-GGUF/tiny-q4.GGUF", folder / "tiny-q4.GGUF")
    for name in (
        "tiny-q4",
        "tiny-q4.gguf",
        "someone/Tiny-GGUF",
        "someone/tiny-gguf",
        "SOMEONE/Tiny-GGUF/TINY-Q4.gguf",
    ):
        assert user_models.resolve_lmstudio(name) == listed.path


def test_an_lmstudio_model_with_no_lmstudio_folder_says_where_it_looked(
    env: dict[str, str], tmp_path: Path
) -> None:
    """It read 'no LM Studio model 'x' in no LM Studio models folder (set LMSTUDIO_MODELS) (it has none)'."""
    no_folder = {**env, "LMSTUDIO_MODELS": ""}  # unset: the defaults under HOME, which has neither
    result = ead("generate", "--large", "lmstudio:x", PROMPT, env=no_folder)
    assert assert_one_line_error(result, 1) == (
        "error: no LM Studio model 'x': there is no LM Studio models folder here "
        "(~/.lmstudio/models, ~/.cache/lm-studio/models); set LMSTUDIO_MODELS to yours"
    )


def test_names_with_brackets_and_colons_are_listed_as_they_are(
    env: dict[str, str], tmp_path: Path, tiny_small: Path
) -> None:
    """rich read '[bold]' in a name as a style and ':tiger:' as an emoji: `models list` showed
    'qwen [Q4_K_M] 🐯 .gguf', a name no model has, and a description with '[/]' was a traceback."""
    folder = Path(env["LMSTUDIO_MODELS"]) / "pub"
    folder.mkdir(parents=True)
    name = "qwen [Q4_K_M] :tiger: [bold].gguf"
    shutil.copyfile(tiny_small, folder / name)
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        '[models.x]\nrepo = "a/b"\npattern = "x.gguf"\ndescription = "closing [/] tag :smile:"\n'
    )
    result = ead("models", "list", "--catalog", str(catalog), env=env)
    assert (result.returncode, result.stderr) == (0, b"")
    rows = [line.split("  ")[0] for line in result.stdout.decode().splitlines()]
    assert f"lmstudio:pub/{name}" in rows
    assert "closing [/] tag :smile:" in result.stdout.decode()


def test_names_a_terminal_acts_on_are_listed_spelled_out(
    env: dict[str, str], tiny_small: Path, ollama_root: Path
) -> None:
    """A file name with an escape or a newline (LM Studio's, ollama's manifest) went to the terminal as it
    was: the escape coloured the rest of the table, the newline broke the row in two."""
    folder = Path(env["LMSTUDIO_MODELS"]) / "pub"
    folder.mkdir(parents=True)
    shutil.copyfile(tiny_small, folder / "evil\x1b[31m\n.gguf")
    add_ollama_model(ollama_root, "ev\x1bil", "latest", tiny_small.read_bytes())
    result = ead("models", "list", env=env)
    assert (result.returncode, result.stderr) == (0, b"")
    listing = result.stdout.decode()
    assert "\x1b" not in listing
    rows = [line.split("  ")[0] for line in listing.splitlines()]
    assert "lmstudio:pub/evil\\x1b[31m\\n.gguf" in rows
    assert "ollama:ev\\x1bil:latest" in rows


def test_models_list_json_shows_them_beside_the_catalog(
    env: dict[str, str], ollama_root: Path, lmstudio_root: Path
) -> None:
    result = ead("models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr.decode()
    rows = {row["ref"]: row for row in json.loads(result.stdout)}
    catalog = registry.load_catalog()
    assert set(catalog.models) <= set(rows)
    assert rows[catalog.small]["source"] == "catalog"
    tiny = rows["ollama:tiny:latest"]
    assert tiny["source"] == "ollama"
    blob = Path(tiny["path"])
    assert blob.parent == ollama_root / "blobs" and blob.name.startswith("sha256-")
    assert "ollama:someone/tiny:v2" in rows
    lm = rows["lmstudio:someone/Tiny-GGUF/tiny-q4.gguf"]
    assert (lm["source"], lm["path"]) == ("lmstudio", str(lmstudio_root / "someone/Tiny-GGUF/tiny-q4.gguf"))
    assert not any("mmproj" in ref for ref in rows)
    table = ead("models", "list", env=env)
    assert table.returncode == 0
    assert b"ollama:tiny:latest" in table.stdout and b"lmstudio:other/Twin-GGUF/twin.gguf" in table.stdout


def test_models_list_counts_the_parameters_of_ollama_and_lmstudio_models(
    env: dict[str, str], ollama_root: Path, lmstudio_root: Path, tiny_small: Path
) -> None:
    """Their params had been null (only the catalog's figure was listed): each is its file's header's
    count, as ``ead models show`` gives it; a file whose header cannot be read stays listed, params null."""
    cut = lmstudio_root / "someone" / "Cut-GGUF" / "cut.gguf"
    cut.parent.mkdir()
    cut.write_bytes(tiny_small.read_bytes()[:200])  # the magic, then the metadata broken off
    result = ead("models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr.decode()
    params = {row["ref"]: row["params"] for row in json.loads(result.stdout) if row["source"] != "catalog"}
    elements = sum(int(tensor.n_elements) for tensor in gguf.GGUFReader(tiny_small).tensors)
    assert params.pop("lmstudio:someone/Cut-GGUF/cut.gguf") is None
    assert params == dict.fromkeys(params, elements) and len(params) == 5  # 2 ollama, 3 LM Studio


def test_models_rm_removes_the_cache_copy_only(
    env: dict[str, str], tmp_path: Path, tiny_small: Path, ollama_root: Path, lmstudio_root: Path
) -> None:
    """An alias assembled from (tiny) offline chunk packages into the ead cache, then removed; user files
    and ollama blobs are refused and left alone."""
    data = tiny_small.read_bytes()
    site = tmp_path / "site"
    for i, part in enumerate((data[: len(data) // 2], data[len(data) // 2 :]), 1):
        (site / f"tinychunk_part{i}" / "data").mkdir(parents=True)
        (site / f"tinychunk_part{i}" / "data" / "part.bin").write_bytes(part)
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        '[defaults]\nsmall = "tiny"\nlarge = "tiny"\n[models.tiny]\nrepo = "nobody/tiny"\n'
        'pattern = "tiny.gguf"\n[models.tiny.offline]\npackages = ["tinychunk_part1", "tinychunk_part2"]\n'
        f'version = "1.0"\nfile = "tiny.gguf"\nsha256 = "{hashlib.sha256(data).hexdigest()}"\n'
    )
    python_path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env |= {"PYTHONPATH": os.pathsep.join(python_path), "EAD_MODELS": str(catalog), "HF_HUB_OFFLINE": "1"}
    pulled = ead("models", "pull", "tiny", env=env)
    assert pulled.returncode == 0, pulled.stderr.decode()
    copy = Path(pulled.stdout.decode().strip())
    assert copy.parent == Path(env["EAD_CACHE"]) / "models" and copy.read_bytes() == data

    removed = ead("models", "rm", "tiny", env=env)
    assert removed.returncode == 0, removed.stderr.decode()
    assert removed.stdout.decode().strip() == f"removed {copy}"
    assert not copy.exists() and not copy.with_name(copy.name + ".sha256").exists()
    line = assert_one_line_error(ead("models", "rm", "tiny", env=env), 1)
    assert "model 'tiny' has no copy in the ead cache" in line

    blobs = sorted((ollama_root / "blobs").iterdir())
    user_files = [tiny_small, *lmstudio_root.rglob("*.gguf"), *blobs]
    for ref, fragment in (
        ("ollama:tiny", "is ollama's model, not ead's"),
        ("lmstudio:tiny-q4", "is a file of yours, not ead's"),
        (str(tiny_small), "is a file of yours, not ead's"),
    ):
        assert fragment in assert_one_line_error(ead("models", "rm", ref, env=env), 1)
    assert all(path.exists() for path in user_files)
    assert "unknown model alias 'tinyy'" in assert_one_line_error(ead("models", "rm", "tinyy", env=env), 1)


def test_models_rm_that_the_cache_refuses_is_one_line(tmp_path: Path) -> None:
    """A cache that takes no change (read-only, another user's) refused the lock file or the unlink with
    an OSError traceback; a folder where the lock should be is refused alike."""
    models = tmp_path / "ead" / "models"
    model = models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # qc0.5b's file in the ead cache
    lock = models / f".{model.name}.lock"
    lock.mkdir(parents=True)
    model.write_bytes(b"GGUF")
    result = ead("models", "rm", "qc0.5b", env={"EAD_CACHE": str(tmp_path / "ead")})
    line = assert_one_line_error(result, 1, f"error: cannot remove {model} from the ead cache: ")
    assert line.endswith(f"({lock})")
    assert model.exists()


def test_models_pull_of_a_model_that_is_no_alias_says_what_it_is(
    env: dict[str, str], tiny_small: Path
) -> None:
    """ollama's models and files are used where they lie: pull names them so, where it had called each an
    unknown alias (and pointed at 'ead models list')."""
    for ref, fragment in (
        ("ollama:qwen2.5-coder:0.5b", "is ollama's model, not ead's: ead pulls only the aliases"),
        ("lmstudio:tiny-q4", "is a file of yours, not ead's: ead pulls only the aliases of models.toml"),
        (str(tiny_small), "is a file of yours, not ead's"),
        ("./missing.gguf", "is a file of yours, not ead's"),
    ):
        line = assert_one_line_error(ead("models", "pull", ref, env=env), 1, f"'{ref}' {fragment}")
        assert "unknown model alias" not in line
    line = assert_one_line_error(ead("models", "pull", "ollama:qwen2.5-coder:0.5b", env=env), 1)
    assert line.endswith("(ollama pull qwen2.5-coder:0.5b fetches it)")


def test_models_pull_and_rm_echo_a_long_reference_cut(env: dict[str, str]) -> None:
    """A 100 kB ollama name, LM Studio name or path given to pull or rm had been echoed whole (twice for
    ollama's, in the pull it suggested), where every other refusal cuts a bad value (errors.quoted)."""
    junk = "x" * 100_000
    for command in ("pull", "rm"):
        for ref in (f"ollama:{junk}", f"lmstudio:{junk}", f"./{junk}.gguf"):
            line = assert_one_line_error(ead("models", command, ref, env=env), 1)
            assert line.startswith(f"error: {quoted(ref)} is ")
            assert len(line) < 300

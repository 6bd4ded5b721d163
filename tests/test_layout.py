"""The layout stays as docs/design.md draws it: no import runs up its picture of layers, every module has
its line there; docs/results/README.md names every result; models.toml's header names real commands."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer

import ead_cli
from ead_cli.cli import app

PACKAGE = Path(ead_cli.__file__).resolve().parent
ROOT = PACKAGE.parent
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
LAYER = re.compile(r"^layer (\d+) +((?:[\w/]+ {1,2})*[\w/]+)((?:\n {9}(?:[\w/]+ {1,2})*[\w/]+)*)", re.M)
ROOT_MODULES = {"__init__", "__main__"}  # the package's own entry points: above and below everything


def drawn_layers(text: str) -> dict[str, int]:
    """Each unit (a top-level module, or a subpackage as ``name/``) of the picture, with its layer."""
    rows = LAYER.findall(text)
    return {name.rstrip("/"): int(level) for level, first, more in rows for name in (first + more).split()}


def unit_of(module: str) -> str:
    """``bench.run`` belongs to ``bench``; ``engine`` to itself."""
    return module.split(".")[0]


MODULES = {".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")}


def resolved(parts: list[str], name: str) -> str:
    """``from PARTS import NAME``: the submodule NAME if there is one, else the module PARTS."""
    submodule = ".".join([*parts, name])
    if submodule in MODULES or f"{submodule}.__init__" in MODULES:
        return submodule
    return ".".join(parts) or "__init__"


def imports(path: Path) -> set[str]:
    """Every ead_cli module a file imports, at the top, in a function or for type checking alike."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ead_cli")):
            module = (node.module or "").split(".") if node.module else []
            parts = [*package[: len(package) - node.level + 1], *module] if node.level else module[1:]
            found |= {resolved(parts, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("ead_cli.") for a in node.names if a.name.startswith("ead_cli.")}
    return found


def arrows(layers: dict[str, int]) -> list[tuple[str, str]]:
    """Every import from one unit to another, as (importer, imported) units."""
    result = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for target in imports(path):
            pair = (source, unit_of(target))
            if pair[0] != pair[1] and not {*pair} & ROOT_MODULES:
                result.append(pair)
    return result


def test_the_picture_names_every_unit_once() -> None:
    drawn = [name.rstrip("/") for _, first, more in LAYER.findall(DESIGN) for name in (first + more).split()]
    units = {unit_of(".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert sorted(drawn) == sorted(set(drawn)) == sorted(units - ROOT_MODULES)


def test_no_import_runs_up_the_picture() -> None:
    layers = drawn_layers(DESIGN)
    upward = [(a, b) for a, b in arrows(layers) if layers[a] < layers[b]]
    assert upward == []


def test_the_check_catches_an_upward_import() -> None:
    """The picture with the engine put below the decoder: the engine's import of it now runs up."""
    moved = DESIGN.replace("layer 5  engine  calibrate", "layer 5  calibrate").replace(
        "layer 1  errors", "layer 1  engine  errors"
    )
    layers = drawn_layers(moved)
    assert ("engine", "decoder") in [(a, b) for a, b in arrows(layers) if layers[a] < layers[b]]


def test_every_module_has_its_line() -> None:
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if f"`{path.relative_to(PACKAGE).as_posix()}`" not in DESIGN
    ]
    assert missing == []


def gone_modules(design: str) -> list[str]:
    """Each module the map names (``serve/app.py``, ``__init__.py``) that ``ead_cli/`` does not hold (a
    test's file, ``tests/test_layout.py``, named from the repository's root)."""
    named = re.findall(r"`([\w/]+\.py)`", design)
    return [name for name in named if not (PACKAGE / name).is_file() and not (ROOT / name).is_file()]


def test_no_module_the_map_names_is_gone() -> None:
    """The other way round: a module removed or renamed leaves no line behind it."""
    assert len(re.findall(r"`([\w/]+\.py)`", DESIGN)) >= len(MODULES)
    assert gone_modules(DESIGN) == []


def test_the_check_catches_a_module_that_is_gone() -> None:
    assert gone_modules(DESIGN + "\n- `serve/gone.py`: a module since removed.\n") == ["serve/gone.py"]


def test_the_design_cites_no_file_outside_the_repository() -> None:
    assert "../" not in DESIGN


def test_every_result_is_listed_with_its_command_and_page() -> None:
    results = ROOT / "docs" / "results"
    listing = (results / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1] for line in listing.splitlines() if line.startswith("| [")}
    entries = sorted(path.name for path in results.iterdir() if path.name != "README.md")
    assert entries == sorted(re.search(r"\[([^\]]+?)/?\]", row).group(1) for row in rows)
    for row in (line for line in listing.splitlines() if line.startswith("| [")):
        made_by, page = row.split(" | ")[1:3]
        assert made_by.strip() and re.search(r"\]\([^)]*\.md", page), row


def test_models_toml_header_names_real_commands() -> None:
    header = (ROOT / "models.toml").read_text(encoding="utf-8").split("\n[", 1)[0]
    shown = re.findall(r"`ead ([a-z-]+)", header)
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert shown and [name for name in shown if name not in commands] == []

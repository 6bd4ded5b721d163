"""What ``ead models show`` says of a model, as ``ollama show`` does: read from its file's header, the
weights never loaded, for an alias, a path, or a model ollama or LM Studio keeps."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

from ead_cli.gguf_files import GgufHeader, file_type_names, model_bytes, read_header, shard_paths
from ead_cli.registry import Catalog, ModelSpec, local_file
from ead_cli.thinking import thinks
from ead_cli.user_models import LMSTUDIO_PREFIX, OLLAMA_PREFIX

# The conversations each builtin template of llama.cpp's is rendered with, to tell them apart: with a
# system message and without, a tool's answer, whitespace that some strip (llama2-sys-strip), and a tool
# call's turn (Granite 3 names its role, Granite 4 writes it as the assistant's)
_PROBES = (
    (("system", " S "), ("user", " U1 "), ("assistant", "A1"), ("tool", "T"), ("user", "U2")),
    (("user", "U1"),),
    (("user", "U1"), ("assistant_tool_call", "C")),
)
_TOOLS = {"ollama": OLLAMA_PREFIX, "lmstudio": LMSTUDIO_PREFIX}  # the sources of the models others keep


@dataclass(frozen=True)
class ModelInfo:
    """A model as ``ead models show`` lists it; None where the file does not say, or is not here."""

    ref: str  # as asked
    source: str  # catalog, file, ollama or lmstudio
    description: str | None  # the catalog's
    architecture: str | None  # general.architecture: qwen2, llama
    params: int | None  # the file's tensors' elements (llama.cpp's count); an alias not here: the catalog's
    context_length: int | None  # trained for
    embedding_length: int | None
    quantization: str | None  # the file type, as llama.cpp and ollama name it: Q4_K_M, F16
    chat_template: str | None  # llama.cpp's name of its family (chatml; 'a or b' alike), 'other', None: none
    thinking: bool | None  # whether the template writes a thinking block (<think>...</think>)
    downloaded: bool
    paths: list[str] = field(default_factory=list)  # every shard of a split model
    size: int | None = None  # bytes, all shards


def model_info(ref: str, catalog: Catalog) -> ModelInfo:
    """``ref``'s model, without fetching it: an alias not downloaded is said from the catalog alone."""
    spec, path = local_file(ref, catalog)
    if spec is not None:
        source = "catalog"
    else:
        source = next((tool for tool, prefix in _TOOLS.items() if ref.startswith(prefix)), "file")
    description = (spec.description or None) if spec else None
    if path is None:
        params = parameter_count(spec, None)
        return ModelInfo(ref, source, description, None, params, None, None, None, None, None, False)
    header = read_header(path)
    template = header.metadata.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else None
    file_type = header.metadata.get("general.file_type")
    architecture = header.metadata.get("general.architecture")
    embedding = header.architecture_value("embedding_length")
    return ModelInfo(
        ref=ref,
        source=source,
        description=description,
        architecture=architecture if isinstance(architecture, str) else None,
        params=parameter_count(spec, header),
        context_length=header.context_length,
        embedding_length=embedding if isinstance(embedding, int) else None,
        quantization=file_type_names().get(file_type) if isinstance(file_type, int) else None,
        chat_template=template_family(template),
        thinking=thinks(template) if template else None,
        downloaded=True,
        paths=[str(shard) for shard in shard_paths(path)],
        size=model_bytes(path),
    )


def parameter_count(spec: ModelSpec | None, header: GgufHeader | None) -> int | None:
    """A model's parameters as ``models list`` and ``show`` both give them: its file's tensors' elements
    where its header is here (llama.cpp's count, an untied output matrix included: 0.63B for qc0.5b, the
    count ead's FLOPs use), else an alias's catalog figure (the model card's, 0.49B: approximate)."""
    if header is not None:
        return header.n_params
    return round(spec.params) if spec and spec.params else None


def template_family(template: str | None) -> str | None:
    """The name llama.cpp gives the family of a chat template (chatml, llama3, gemma, ...): its builtin
    template whose renderings of the probes are the template's as llama.cpp detects it, or each of those
    that write every turn alike ('granite-4.0 or granite-4.1': llama.cpp tells them apart by a marker in
    the template's text, not by what they write); 'other' for one it does not know (ead renders the
    template itself, with jinja2), None for none."""
    if not template:
        return None
    rendered = _renderings(template)
    if rendered is None:
        return "other"
    return " or ".join(name for name in builtin_templates() if _renderings(name) == rendered) or "other"


@cache
def builtin_templates() -> tuple[str, ...]:
    """The names of llama.cpp's builtin chat templates (chatml, llama3, ...), its own formatters."""
    import llama_cpp

    count = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * count)()
    llama_cpp.llama_chat_builtin_templates(names, count)
    return tuple(name.decode() for name in names if name is not None)


def builtin_rendering(
    template: str, turns: Sequence[tuple[str, str]], add_generation_prompt: bool = True
) -> bytes | None:
    """The turns (role, text) as llama.cpp's own formatter writes them with ``template`` (a builtin's
    name, or a template it recognises by its markers), or None where it recognises none."""
    import llama_cpp

    messages = (llama_cpp.llama_chat_message * len(turns))(
        *(llama_cpp.llama_chat_message(role.encode(), text.encode()) for role, text in turns)
    )
    size = 1024
    while True:
        buffer = ctypes.create_string_buffer(size)
        needed = llama_cpp.llama_chat_apply_template(
            template.encode(), messages, len(turns), add_generation_prompt, buffer, size
        )
        if needed < 0:
            return None
        if needed <= size:
            return buffer.raw[:needed]
        size = needed


def _renderings(template: str) -> tuple[bytes, ...] | None:
    """The probes as llama.cpp's own formatter writes them with ``template``, or None where it recognises
    none."""
    rendered = [builtin_rendering(template, probe) for probe in _PROBES]
    return None if None in rendered else tuple(rendered)  # type: ignore[arg-type]

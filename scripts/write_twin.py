#!/usr/bin/env python3
"""Write a random-weight twin of a model: the real architecture, tensor shapes and quantisation types,
a real model's tokenizer, random weights. For timing only: decode and prefill time depend on shapes,
types and context, not on the weights' values, so a twin of Qwen2.5-14B times like Qwen2.5-14B while
nobody here can download it. Its text is noise; the metadata key ``ead.twin`` marks it, and ead says
so when it loads one.

    python scripts/write_twin.py --shape qwen2.5-14b --tokenizer-from qwen2.5-coder-0.5b.gguf --out t.gguf
    python scripts/write_twin.py --like real.gguf --out twin.gguf           # every tensor as in real.gguf
    python scripts/write_twin.py --tokenizer-only --tokenizer-from real.gguf --out tokenizer.gguf

Shapes come from the published Qwen2.5 configurations; tensor types follow llama.cpp's Q4_K_M rules
(src/llama-quant.cpp) as Qwen's own files show them: Q4_K everywhere, Q6_K for the output matrix and
for attn_v and ffn_down in the "more bits" layers (see more_bits_layers), and the legacy fallbacks
(Q5_0 for Q4_K, Q8_0 for Q6_K) where a row is not a multiple of 256 (the 0.5B's 896). Quantised blocks
are random bytes except their f16 scales, set so weights spread like a trained model's (std ~0.02);
norms are 1, biases small. Needs only numpy and the ``gguf`` package (llama.cpp's gguf-py works too).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

try:
    import gguf
except ImportError:  # a bare machine: llama.cpp's own gguf-py, e.g. GGUF_PY=vendor/llama.cpp/gguf-py
    sys.path.insert(0, os.environ.get("GGUF_PY", "gguf-py"))
    import gguf

Q = gguf.GGMLQuantizationType
TWIN_KEY = "ead.twin"  # the same key as ead_cli.runner.TWIN_KEY (this script needs no ead_cli)
UNUSED_TOKEN = 5  # llama.cpp's token type for unused ids (Qwen's [PAD...] padding)


@dataclass(frozen=True)
class Shape:
    """A Qwen2 model's hyper-parameters, as its config.json gives them."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    context: int = 32768


SHAPES = {
    shape.name: shape
    for shape in (
        Shape("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 151936),
        Shape("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 151936),
        Shape("qwen2.5-3b", 36, 2048, 11008, 16, 2, 151936),
        Shape("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064),
        Shape("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064),
        Shape("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064),
        Shape("qwen2-tiny", 2, 256, 512, 4, 2, 268, 2048),  # tests: the tiny vocabulary + 1 padding id
        Shape("qwen2.5-tiny", 2, 256, 512, 4, 2, 151936, 4096),  # Qwen's vocabulary, a tiny body: CPU tests
        Shape("qwen2.5-micro", 2, 64, 128, 4, 2, 151936, 4096),  # Qwen's vocabulary at >1,000 tok/s on a CPU
    )
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne0 (a row's length) first
    kind: Q


def more_bits_layers(layers: int) -> set[int]:
    """The layers Q4_K_M gives Q6_K for attn_v and ffn_down: llama.cpp's use_more_bits(k, n) (the first
    and last eighth, every third between) of the k-th layer quantised, which in Qwen's own files is
    the k-th in lexical order (blk.0, blk.1, blk.10, ...): checked against their 0.5B and 1.5B files."""
    order = sorted(range(layers), key=str)
    return {
        order[k]
        for k in range(layers)
        if k < layers // 8 or k >= 7 * layers // 8 or (k - layers // 8) % 3 == 2
    }


def quant(kind: Q, row: int) -> Q:
    """k-quants need rows of 256; llama.cpp falls back to legacy types elsewhere."""
    if row % 256 == 0:
        return kind
    return {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}.get(kind, kind)


def q4_k_m_tensors(shape: Shape) -> list[TensorSpec]:
    """Every tensor of a Qwen2 Q4_K_M file, in the order llama.cpp's converter writes them."""
    e, kv = shape.n_embd, shape.n_embd // shape.n_head * shape.n_head_kv
    specs = [TensorSpec("token_embd.weight", (e, shape.n_vocab), quant(Q.Q4_K, e))]
    more_bits = more_bits_layers(shape.n_layer)
    for i in range(shape.n_layer):
        high = Q.Q6_K if i in more_bits else Q.Q4_K
        b = f"blk.{i}."
        specs += [
            TensorSpec(b + "attn_norm.weight", (e,), Q.F32),
            TensorSpec(b + "attn_q.weight", (e, e), quant(Q.Q4_K, e)),
            TensorSpec(b + "attn_q.bias", (e,), Q.F32),
            TensorSpec(b + "attn_k.weight", (e, kv), quant(Q.Q4_K, e)),
            TensorSpec(b + "attn_k.bias", (kv,), Q.F32),
            TensorSpec(b + "attn_v.weight", (e, kv), quant(high, e)),
            TensorSpec(b + "attn_v.bias", (kv,), Q.F32),
            TensorSpec(b + "attn_output.weight", (e, e), quant(Q.Q4_K, e)),
            TensorSpec(b + "ffn_norm.weight", (e,), Q.F32),
            TensorSpec(b + "ffn_gate.weight", (e, shape.n_ff), quant(Q.Q4_K, e)),
            TensorSpec(b + "ffn_up.weight", (e, shape.n_ff), quant(Q.Q4_K, e)),
            TensorSpec(b + "ffn_down.weight", (shape.n_ff, e), quant(high, shape.n_ff)),
        ]
    specs += [
        TensorSpec("output_norm.weight", (e,), Q.F32),
        TensorSpec("output.weight", (e, shape.n_vocab), quant(Q.Q6_K, e)),
    ]
    return specs


def shape_metadata(shape: Shape) -> dict[str, tuple[object, gguf.GGUFValueType]]:
    v = gguf.GGUFValueType
    return {
        "general.architecture": ("qwen2", v.STRING),
        "general.name": (f"{shape.name} twin (random weights)", v.STRING),
        "general.file_type": (int(gguf.LlamaFileType.MOSTLY_Q4_K_M), v.UINT32),
        "qwen2.block_count": (shape.n_layer, v.UINT32),
        "qwen2.context_length": (shape.context, v.UINT32),
        "qwen2.embedding_length": (shape.n_embd, v.UINT32),
        "qwen2.feed_forward_length": (shape.n_ff, v.UINT32),
        "qwen2.attention.head_count": (shape.n_head, v.UINT32),
        "qwen2.attention.head_count_kv": (shape.n_head_kv, v.UINT32),
        "qwen2.rope.freq_base": (1000000.0, v.FLOAT32),
        "qwen2.attention.layer_norm_rms_epsilon": (1e-6, v.FLOAT32),
    }


# Per type: (block bytes, weights per block, [(byte offset of an f16 scale, its value)]). The values
# give weights of std ~0.02 with random quants and sub-scales (checked with gguf.quants.dequantize).
BLOCKS: dict[Q, tuple[int, int, list[tuple[int, float]]]] = {
    Q.Q4_K: (144, 256, [(0, 1.2e-4), (2, 9.0e-4)]),  # d, dmin (dmin ~ 7.5 d centres the weights)
    Q.Q6_K: (210, 256, [(208, 1.5e-5)]),  # d (the 16 int8 sub-scales stay random)
    Q.Q5_0: (22, 32, [(0, 2.2e-3)]),
    Q.Q8_0: (34, 32, [(0, 2.7e-4)]),
}


def random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes (quantised) or values (F32): random, with sane scales."""
    count = int(np.prod(spec.shape))
    if spec.kind == Q.F32:
        if spec.name.endswith("norm.weight"):
            return np.ones(spec.shape[::-1], dtype=np.float32)
        return (rng.standard_normal(spec.shape[::-1], dtype=np.float32) * 0.02).astype(np.float32)
    if spec.kind not in BLOCKS:
        raise SystemExit(f"error: {spec.name}: tensor type {spec.kind.name} is not supported")
    size, per_block, scales = BLOCKS[spec.kind]
    if spec.shape[0] % per_block:
        raise SystemExit(f"error: {spec.name}: rows of {spec.shape[0]} do not fit {spec.kind.name} blocks")
    blocks = np.frombuffer(rng.bytes(count // per_block * size), dtype=np.uint8).reshape(-1, size).copy()
    for offset, value in scales:
        blocks[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return blocks.reshape(*spec.shape[1:][::-1], spec.shape[0] // per_block * size)


def read_fields(path: Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {path} is not a readable GGUF file ({error})") from None


def field_value(field: gguf.ReaderField) -> tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]:
    """A metadata field as (value, type, array element type), for GGUFWriter.add_key_value."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data], kind, sub
        return [field.parts[i].tolist()[0] for i in field.data], kind, sub
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), kind, None
    return field.parts[field.data[0]].tolist()[0], kind, None


def tokenizer_fields(reader: gguf.GGUFReader, n_vocab: int | None) -> dict[str, tuple]:
    """Every ``tokenizer.*`` key of a GGUF; the token lists padded with unused ids to ``n_vocab``."""
    fields = {name: field_value(f) for name, f in reader.fields.items() if name.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in fields:
        raise SystemExit("error: the tokenizer source has no tokenizer.ggml.tokens: not a model's GGUF")
    tokens, kind, sub = fields["tokenizer.ggml.tokens"]
    if n_vocab is not None:
        if len(tokens) > n_vocab:
            raise SystemExit(
                f"error: the tokenizer has {len(tokens)} tokens, more than the shape's {n_vocab}"
            )
        extra = range(len(tokens), n_vocab)
        fields["tokenizer.ggml.tokens"] = ([*tokens, *(f"[PAD{i}]".encode() for i in extra)], kind, sub)
        if "tokenizer.ggml.token_type" in fields:
            types, kind, sub = fields["tokenizer.ggml.token_type"]
            fields["tokenizer.ggml.token_type"] = ([*types, *([UNUSED_TOKEN] * len(extra))], kind, sub)
        if "tokenizer.ggml.scores" in fields:
            scores, kind, sub = fields["tokenizer.ggml.scores"]
            fields["tokenizer.ggml.scores"] = ([*scores, *([0.0] * len(extra))], kind, sub)
    return fields


def like_file(reader: gguf.GGUFReader) -> tuple[list[TensorSpec], dict[str, tuple], int]:
    """The tensors and non-tokenizer metadata of an existing model, to twin it exactly."""
    specs = [TensorSpec(t.name, tuple(int(n) for n in t.shape), Q(t.tensor_type)) for t in reader.tensors]
    skip = ("tokenizer.", "GGUF.", "general.name", "split.")
    meta = {name: field_value(f) for name, f in reader.fields.items() if not name.startswith(skip)}
    n_vocab = next(spec.shape[1] for spec in specs if spec.name == "token_embd.weight")
    return specs, meta, n_vocab


def write(path: Path, metadata: dict[str, tuple], specs: list[TensorSpec], seed: int) -> None:
    """Header, metadata and tensor infos first, then each tensor's data as it is drawn (a 14B twin is
    ~9 GB: it never sits in memory whole). Written to a temporary name, renamed when complete."""
    architecture = metadata["general.architecture"][0]
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(
        partial, architecture.decode() if isinstance(architecture, bytes) else architecture
    )
    for key, (value, kind, sub) in metadata.items():
        if key == "general.architecture":
            continue
        writer.add_key_value(key, value, kind, sub)
    rng = np.random.default_rng(seed)
    for spec in specs:
        if spec.kind == Q.F32:
            nbytes = int(np.prod(spec.shape)) * 4
            writer.add_tensor_info(spec.name, spec.shape[::-1], np.dtype(np.float32), nbytes)
            continue
        size, per_block, _ = BLOCKS[spec.kind]
        byte_shape = (*spec.shape[1:][::-1], spec.shape[0] // per_block * size)  # rows of blocks
        nbytes = int(np.prod(byte_shape))
        writer.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=spec.kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for spec in specs:
        writer.write_tensor_data(random_tensor(spec, rng))
    writer.close()
    os.replace(partial, path)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line, like ead's own."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--shape", choices=sorted(SHAPES), help="a named model's shapes and Q4_K_M types")
    what.add_argument("--like", type=Path, help="every tensor's name, shape and type as in this GGUF")
    what.add_argument("--tokenizer-only", action="store_true", help="only the tokenizer metadata (a few MB)")
    parser.add_argument("--tokenizer-from", type=Path, help="the GGUF whose tokenizer the twin carries")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    source = args.tokenizer_from or args.like
    if source is None:
        parser.error("--tokenizer-from is needed with --shape and --tokenizer-only")
    tokenizer = read_fields(source)
    if args.tokenizer_only:
        meta = {"general.architecture": (b"qwen2", gguf.GGUFValueType.STRING, None)}
        meta |= tokenizer_fields(tokenizer, None)
        write(args.out, meta, [], args.seed)
        return
    if args.like:
        specs, base, n_vocab = like_file(read_fields(args.like))
        name = Path(args.like).name
    else:
        shape = SHAPES[args.shape]
        specs, n_vocab, name = q4_k_m_tensors(shape), shape.n_vocab, shape.name
        base = {key: (value, kind, None) for key, (value, kind) in shape_metadata(shape).items()}
    meta = base | tokenizer_fields(tokenizer, n_vocab)
    meta[TWIN_KEY] = (name, gguf.GGUFValueType.STRING, None)
    write(args.out, meta, specs, args.seed)


if __name__ == "__main__":
    main()

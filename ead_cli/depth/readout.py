"""Reading a hidden state out as next-token logits, outside llama.cpp's graph: ``ead depth``'s probes.

The readout of block l's output h is the model's own head: RMSNorm(h) x output_norm.weight, then the
output matrix (``output.weight``, or the tied ``token_embd.weight``). The matrix stays in its GGUF
quantisation and the product runs in ggml's own CPU kernels (``ggml_mul_mat`` on the memory-mapped rows,
called through ctypes), so a full readout costs what llama.cpp's head costs and, on the last block's
output, gives llama.cpp's own logits. Two cheaper estimators of the entropy (``Estimator``) serve the
probes: top-K (the rows a first full readout ranked highest, in float32) and low-rank (rank r of the
output matrix, computed once and cached).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

from ..errors import EadError, shown_path
from ..gguf_files import shard_paths
from ..paths import cannot_save, check_can_save, is_file

_LIB = Path(llama_cpp.__file__).parent / "lib"


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of the vendored ggml (ggml/include/ggml.h): the eval callback is given one."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


NAME_OFFSET = GgmlTensor.name.offset
GGML_TYPE_F32 = 0


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    base = ctypes.CDLL(str(_LIB / "libggml-base.so"))
    cpu = ctypes.CDLL(str(_LIB / "libggml-cpu.so"))
    p = ctypes.c_void_p
    for name, restype, argtypes in (
        ("ggml_init", p, [_InitParams]),
        ("ggml_free", None, [p]),
        ("ggml_new_tensor_2d", p, [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
        ("ggml_mul_mat", p, [p, p, p]),
        ("ggml_new_graph", p, [p]),
        ("ggml_build_forward_expand", None, [p, p]),
        ("ggml_get_name", ctypes.c_char_p, [p]),
        ("ggml_backend_tensor_get", None, [p, p, ctypes.c_size_t, ctypes.c_size_t]),
    ):
        function = getattr(base, name)
        function.restype, function.argtypes = restype, argtypes
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    return base, cpu


GGML, GGML_CPU = _ggml()


def read_rows(tensor: int) -> np.ndarray:
    """A float32 copy of a 2-D F32 graph tensor (n_tokens x n_embd), through the backend (CPU or GPU)."""
    view = GgmlTensor.from_address(tensor)
    if view.type != GGML_TYPE_F32:
        raise EadError(f"{view.name.decode()} is not float32 (ggml type {view.type})")
    n_embd, n_rows = view.ne[0], view.ne[1]
    out = np.empty((n_rows, n_embd), np.float32)
    GGML.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
    return out


@dataclass(frozen=True)
class HeadWeights:
    """What the readout needs from a GGUF: the final norm, the output matrix's raw rows and its type."""

    norm: np.ndarray  # (n_embd,) float32
    matrix: np.ndarray  # raw bytes of the quantised (n_vocab, n_embd) matrix, one row per vocab entry
    ggml_type: int
    n_vocab: int
    n_embd: int
    n_layer: int
    eps: float


def load_head(path: Path) -> HeadWeights:
    """The output norm and matrix of a GGUF (memory-mapped), or a one-line error if it has none. A split
    GGUF's tensors are spread over its shards (the head is usually in the last one), its metadata is in
    the first."""
    readers = []
    for shard in shard_paths(path):
        try:
            readers.append(gguf.GGUFReader(shard))
        except (OSError, ValueError) as error:
            raise EadError(f"{shard}: not a readable GGUF ({error})") from None
    tensors = {tensor.name: tensor for reader in readers for tensor in reader.tensors}
    fields = readers[0].fields
    arch = str(fields["general.architecture"].contents())
    norm = tensors.get("output_norm.weight")
    matrix = tensors.get("output.weight") or tensors.get("token_embd.weight")
    eps_field = fields.get(f"{arch}.attention.layer_norm_rms_epsilon")
    blocks = fields.get(f"{arch}.block_count")
    if norm is None or matrix is None or eps_field is None or blocks is None:
        raise EadError(
            f"{shown_path(path.name)} has no usable readout (needs output_norm.weight, an output or token "
            "embedding matrix and an RMSNorm epsilon): ead depth reads hidden states out through them"
        )
    n_embd, n_vocab = (int(n) for n in matrix.shape[:2])
    return HeadWeights(
        norm=np.asarray(norm.data, dtype=np.float32).reshape(n_embd),
        matrix=np.asarray(matrix.data),
        ggml_type=int(matrix.tensor_type),
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=int(blocks.contents()),
        eps=float(eps_field.contents()),
    )


class Head:
    """The full readout: ``logits(h)`` for rows of hidden states, by ggml's kernels on the quantised
    matrix."""

    def __init__(self, weights: HeadWeights, n_threads: int) -> None:
        self.weights = weights
        self.n_threads = n_threads

    def normed(self, hidden: np.ndarray) -> np.ndarray:
        """RMSNorm x output_norm.weight, as ggml computes it (mean of squares in double, then float)."""
        h = np.atleast_2d(hidden).astype(np.float32)
        scale = 1.0 / np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=1, keepdims=True) + self.weights.eps)
        return (h * scale.astype(np.float32)) * self.weights.norm

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(rows, n_vocab) float32 logits of hidden states (rows, n_embd)."""
        x = np.ascontiguousarray(self.normed(hidden))
        rows, n_embd = x.shape
        n_vocab = self.weights.n_vocab
        size = x.nbytes + rows * n_vocab * 4 + (n_embd + 1024) * rows * 4 + (4 << 20)
        ctx = GGML.ggml_init(_InitParams(size, None, False))
        meta = GGML.ggml_init(_InitParams(1 << 16, None, True))
        try:
            a = GGML.ggml_new_tensor_2d(meta, self.weights.ggml_type, n_embd, n_vocab)
            GgmlTensor.from_address(a).data = self.weights.matrix.ctypes.data
            b = GGML.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, rows)
            ctypes.memmove(GgmlTensor.from_address(b).data, x.ctypes.data, x.nbytes)
            product = GGML.ggml_mul_mat(ctx, a, b)
            graph = GGML.ggml_new_graph(ctx)
            GGML.ggml_build_forward_expand(graph, product)
            status = GGML_CPU.ggml_graph_compute_with_ctx(ctx, graph, self.n_threads)
            if status != 0:
                raise EadError(f"ggml failed to compute the readout (status {status})")
            out = np.empty((rows, n_vocab), np.float32)
            ctypes.memmove(out.ctypes.data, GgmlTensor.from_address(product).data, out.nbytes)
            return out
        finally:
            GGML.ggml_free(ctx)
            GGML.ggml_free(meta)

    def dense_rows(self, rows: np.ndarray) -> np.ndarray:
        """Float32 copies of some rows of the matrix (the top-K estimator's candidates)."""
        return gguf.quants.dequantize(
            self.weights.matrix[rows], gguf.GGMLQuantizationType(self.weights.ggml_type)
        )


def entropy_bits(logits: np.ndarray) -> np.ndarray:
    """Shannon entropy in bits of softmax(logits), row by row."""
    z = np.atleast_2d(logits).astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    total = p.sum(axis=1, keepdims=True)
    p /= total
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * (z - np.log(total)), 0.0)
    return -plogp.sum(axis=1) / np.log(2.0)


def low_rank_factors(head: Head, rank: int, cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """W ~ A @ B with A (n_vocab, r) and B (r, n_embd): the top r singular directions of the output
    matrix, from the eigenvectors of W^T W (n_embd x n_embd), computed once per model file and cached."""
    weights = head.weights
    if is_file(cache):  # a pipe there is not read (it waits for a writer): replaced as a damaged cache is
        try:
            with np.load(cache) as saved:
                if saved["a"].shape == (weights.n_vocab, rank):
                    return saved["a"], saved["b"]
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):  # damaged: computed again
            pass
    check_can_save(cache, "the low-rank factors")  # a file in the cache's way: one line, not a traceback
    gram = np.zeros((weights.n_embd, weights.n_embd), np.float64)
    qtype = gguf.GGMLQuantizationType(weights.ggml_type)
    for start in range(0, weights.n_vocab, 8192):
        block = gguf.quants.dequantize(weights.matrix[start : start + 8192], qtype).astype(np.float32)
        gram += (block.T @ block).astype(np.float64)
    _, vectors = np.linalg.eigh(gram)
    b = np.ascontiguousarray(vectors[:, ::-1][:, :rank].T.astype(np.float32))  # (r, n_embd)
    a = np.empty((weights.n_vocab, rank), np.float32)
    for start in range(0, weights.n_vocab, 8192):
        block = gguf.quants.dequantize(weights.matrix[start : start + 8192], qtype).astype(np.float32)
        a[start : start + 8192] = block @ b.T
    partial = cache.with_suffix(f".{os.getpid()}.tmp.npz")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)  # check_can_save leaves no folder behind
        np.savez(partial, a=a, b=b)
        os.replace(partial, cache)
    except BaseException as error:  # a full disk or a Ctrl-C: no temporary left behind
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise cannot_save(cache, "the low-rank factors", error) from None
        raise
    return a, b


def file_digest(path: Path) -> str:
    """A cheap identity of a model file: size, and a hash of its first and last MiB."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]

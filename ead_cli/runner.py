"""One llama.cpp context per model, fed lazily from the token list the models share.

A runner knows how many tokens of the shared sequence it has read (``n_past``). ``sync`` feeds only
the unseen tail and returns a zero-copy view of the logits at the last position. Feeding is split by
phase so the figures are honest: the prompt (prefill), the model's own previous token (decode, one
token), and tokens another model wrote while this one was idle (catch-up, one batch).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Literal, Protocol

import llama_cpp
import numpy as np

from .entropy import EntropyMeter
from .errors import EadError, shown_path
from .gguf_files import file_type_names, model_bytes, shard_paths
from .hardware import Repack, repack_choice
from .options import (
    DEFAULT_BATCH,
    DEFAULT_CACHE_TYPE,
    DEFAULT_UBATCH,
    UNQUANTIZED_CACHE_TYPES,
    batch_threads,
    resolve_threads,
)
from .sampling import ParsedGrammars
from .signals import Terminated, block_signals, main_thread_signals, restore_signals, stop_requested

if TYPE_CHECKING:
    from .prompt import ChatTemplate

Phase = Literal["prefill", "decode", "catchup"]
TWIN_KEY = "ead.twin"  # metadata of a random-weight twin (scripts/write_twin.py): what it twins
DEFAULT_CTX = 4096  # tokens, capped at the model's training context
CONTEXT_PADDING = 256  # llama.cpp rounds a context up to a multiple of this (llama_context's n_ctx)
SCORED_ROWS = 128  # rows of logits per batch where each position is scored (x 151,936 floats: 78 MB)
_QUIET_LEVEL = logging.CRITICAL + 1
# Tokenizers that keep every byte of a text in some token (no normalizer rewrites it), so a text's
# length bounds its token count; strip attributes are the exception, which TokenReach records.
_LENGTH_BOUNDED_VOCABS = (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE)
_STRIP_ATTRIBUTES = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
_PIECE_ATTRIBUTES = llama_cpp.LLAMA_TOKEN_ATTR_NORMAL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
# llama.cpp's pre-tokenizers (tokenizer.ggml.pre, as llama-cpp-python 0.3.36 names them) that split a text
# at every line's start (a newline, then a printable ASCII character) and at every line's end (an ASCII
# letter or digit, then a newline), whatever comes before and after: GPT-2's rule (digits apart first or
# not), Llama 3's, Qwen2's and llama.cpp's default.
_LINE_SPLITTING_PRES = frozenset(
    {
        *("default", "gpt-2", "phi-2", "mpt", "olmo"),
        *("starcoder", "refact", "smollm", "codeshell", "command-r", "exaone"),
        *("llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe", "chatglm-bpe"),
        *("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"),
    }
)


def _init_backend() -> None:
    """Initialise llama.cpp once; its log goes to llama-cpp-python's logger, silent unless EAD_VERBOSE."""
    import llama_cpp._logger  # installs the log callback that honours the logger's level

    level = logging.DEBUG if os.environ.get("EAD_VERBOSE") else _QUIET_LEVEL
    logging.getLogger("llama-cpp-python").setLevel(level)
    with main_thread_signals():
        llama_cpp.llama_backend_init()


_init_backend()


def gpu_offload_available() -> bool:
    """True for CUDA, Metal, Vulkan… builds of llama.cpp."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def gpu_layers(n_gpu_layers: int | None) -> int:
    """--gpu-layers, resolved: None is every layer (-1) on a GPU build of llama.cpp, else none."""
    if n_gpu_layers is None:
        return -1 if gpu_offload_available() else 0
    return n_gpu_layers


_OUTPUT_TENSOR = len(b"output.weight").to_bytes(8, "little") + b"output.weight"


def memory_available() -> int | None:
    """Bytes the kernel says can be had without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(paths: Sequence[Path], available: int | None) -> None:
    """Refuse models whose weights cannot fit in memory, rather than being killed while loading them."""
    need = sum(model_bytes(path) for path in paths)
    if available is not None and need > available:
        raise EadError(
            f"the models need about {need / 2**30:.1f} GiB of memory but {available / 2**30:.1f} GiB is "
            "available: close other programs, or pick smaller models or quantisations"
        )


def padded_context(n_ctx: int) -> int:
    """The context llama.cpp makes when ``n_ctx`` tokens are asked for (``Runner.n_ctx``), known before a
    model loads: ``ead bench`` compares a resume's --ctx by it then."""
    return -(-n_ctx // CONTEXT_PADDING) * CONTEXT_PADDING


def asked_context(n_ctx: int | None, n_ctx_train: int) -> int:
    """The context a Runner asks llama.cpp for: --ctx, else ``DEFAULT_CTX`` or the model's training
    context if smaller (0: the file does not say)."""
    if n_ctx is not None:
        return n_ctx
    return min(DEFAULT_CTX, n_ctx_train) if n_ctx_train > 0 else DEFAULT_CTX


def made_batches(n_batch: int | None, n_ubatch: int | None, n_ctx: int) -> dict[str, int]:
    """The batch and micro-batch llama.cpp makes of --batch-size and --ubatch-size in a context of
    ``n_ctx`` tokens (``Runner.n_batch``, ``n_ubatch``): a batch no larger than the context, a micro-batch
    no larger than the batch. Known before a model loads: ``ead bench`` compares a resume's by them then."""
    batch = min(n_batch or DEFAULT_BATCH, n_ctx)
    return {"n_batch": batch, "n_ubatch": min(n_ubatch or DEFAULT_UBATCH, batch)}


def has_untied_output(path: Path) -> bool:
    """Whether the GGUF stores an output matrix of its own (else the head reuses the embeddings).

    Looks for the tensor name, length-prefixed as GGUF writes it, in each shard's header region.
    """
    for shard in shard_paths(path):
        with open(shard, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            if view.find(_OUTPUT_TENSOR, 0, min(len(view), 64 << 20)) >= 0:
                return True
    return False


class ParamSplit(Protocol):
    """A model's parameters split as the FLOP count needs them (a local or a remote runner)."""

    body_params: int  # every parameter a token read goes through
    head_params: int  # the output head, run only for a row of logits


# llama.cpp's load mode of each --load-mode (options.LOAD_MODES)
LOAD_MODE_TYPES = {
    "auto": llama_cpp.LLAMA_LOAD_MODE_AUTO,
    "none": llama_cpp.LLAMA_LOAD_MODE_NONE,
    "mmap": llama_cpp.LLAMA_LOAD_MODE_MMAP,
    "mlock": llama_cpp.LLAMA_LOAD_MODE_MLOCK,
    "mmap+mlock": llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,
    "dio": llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO,
}


def common_prefix(first: Sequence[int], second: Sequence[int], limit: int | None = None) -> int:
    """How many leading tokens ``first`` and ``second`` share (at most ``limit``): what a cache holding one
    keeps for the other (``Runner.align``, a guess confirmed, serve's kept scores)."""
    end = min(len(first), len(second)) if limit is None else min(len(first), len(second), limit)
    common = 0
    while common < end and first[common] == second[common]:
        common += 1
    return common


def model_params(
    n_gpu_layers: int | None, repack: Repack, load_mode: str = "auto"
) -> llama_cpp.llama_model_params:
    """llama.cpp's load parameters: layers to offload (None: all on a GPU build, else none; -1: all),
    whether weights may go to its extra CPU buffers (repacking; off where AMX would crash, see hardware)
    and how they are read (mapped, read, locked: ``LOAD_MODE_TYPES``)."""
    params = llama_cpp.llama_model_default_params()
    n_gpu_layers = gpu_layers(n_gpu_layers)
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
    params.use_extra_bufts = repack.enabled
    params.load_mode = LOAD_MODE_TYPES[load_mode]
    return params


# ggml's type of each KV cache type llama-cli takes (options.KV_CACHE_TYPES); llama-cpp-python 0.3.36
# names no GGML_TYPE_BF16, ggml.h's 30
CACHE_GGML_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": 30,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}
QUANT_BLOCK = 32  # values per block of each quantized KV cache type
FLASH_ATTN_TYPES = {
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
}


def forward_flops(model: ParamSplit, tokens_read: int, logits_rows: int) -> float:
    """Forward FLOPs: 2 x body params per token read, 2 x head params per logits row."""
    return 2.0 * (model.body_params * tokens_read + model.head_params * logits_rows)


@dataclass(frozen=True)
class TokenReach:
    """The most text one token stands for: a text's length then bounds its token count from below."""

    longest: int  # bytes of the longest token's text (special tokens as their text)
    strips_whitespace: bool  # some special token swallows the whitespace beside it (lstrip/rstrip: Phi-3)
    # The bytes of the longest token's text that starts with each pair of bytes (index first << 8 |
    # second; 1 where none does), for a tokenizer whose tokens' texts are the text's bytes as they stand;
    # None where it rewrites them (SPM and Gemma 4 read a "▁" as a space, SPM puts a space first).
    by_pair: np.ndarray | None = field(default=None, compare=False)


@dataclass
class PhaseCounter:
    tokens: int = 0
    seconds: float = 0.0


class Abandoned(Exception):
    """A batch stopped because ``Runner.abandoned`` said nobody wants its result any more."""


def never_abandoned() -> bool:
    return False


@dataclass(frozen=True)
class PromptProgress:
    """How far a model has read a prompt, told after each of its batches (ead serve keeps a long
    prompt's stream alive with it, as llama-server's ``prompt_progress``): ``read`` of ``total`` tokens,
    the first ``cached`` of them kept in the cache from the run before; ``seconds`` since this reading
    began."""

    model: str
    read: int
    total: int
    cached: int
    seconds: float


@dataclass
class RunnerStats:
    """What a runner did. FLOPs are 2 x body parameters per token read + 2 x head size per logits row."""

    prefill: PhaseCounter
    decode: PhaseCounter
    catchup: PhaseCounter
    logits_rows: int = 0
    guessed: int = 0  # lookup guesses read past the text (in catch-up), and how many the text confirmed
    guessed_kept: int = 0

    @classmethod
    def empty(cls) -> RunnerStats:
        return cls(PhaseCounter(), PhaseCounter(), PhaseCounter())

    @property
    def tokens_read(self) -> int:
        return self.prefill.tokens + self.decode.tokens + self.catchup.tokens


class ContextOwner:
    """A llama.cpp context and the batch it reads, freed together: a ``Runner``'s, and an ``Embedder``'s
    second context over the same weights."""

    _ctx: llama_cpp.llama_context_p | None
    _batch: llama_cpp.llama_batch | None

    def _free_context(self) -> None:
        """Free the batch, then the context (safe to call twice; the model is its owner's to free)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None


class Runner(ContextOwner):
    """A llama.cpp model and context with a cursor into the shared token list.

    ``n_ctx`` None: 4096 tokens or the model's training context if smaller. ``n_gpu_layers`` None: every
    layer when llama.cpp was built with a GPU backend (CUDA, Metal, Vulkan), else none; -1 means all.
    ``repack`` None: ``EAD_REPACK``, else on unless llama.cpp's AMX buffer is active (``hardware``).
    ``n_batch``/``n_ubatch`` None: ``DEFAULT_BATCH``/``DEFAULT_UBATCH``; kept as llama.cpp clamps them.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_gpu_layers: int | None = None,
        n_batch: int | None = None,
        n_ubatch: int | None = None,
        eval_callback: llama_cpp.ggml_backend_sched_eval_callback | None = None,
        repack: bool | None = None,
        cache_types: tuple[str, str] = (DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE),
        flash_attn: str = "auto",
        load_mode: str = "auto",
    ) -> None:
        self.path = Path(path)
        self.name = name
        self._model = None
        self._ctx = None
        self._batch = None
        self.repack = repack_choice(repack)
        params = model_params(n_gpu_layers, self.repack, load_mode)
        with main_thread_signals():  # the name's bytes as the file system has them (not UTF-8 on every disk)
            self._model = llama_cpp.llama_model_load_from_file(os.fsencode(self.path), params)
        if not self._model:
            raise EadError(
                f"llama.cpp could not load {shown_path(self.path)} (truncated, corrupt or unsupported GGUF)"
            )
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        # Read once: every chat prompt is rendered with it and every answer split by it (thinking.py).
        self.chat_template = self.metadata("tokenizer.chat_template")
        self.template_override: ChatTemplate | None = None  # one given in its place (prompt.py)
        self.grammars = ParsedGrammars(self.vocab)  # ead serve's JSON mode: each schema parsed once
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self._model)
        self.n_params = llama_cpp.llama_model_n_params(self._model)
        self.n_embd = llama_cpp.llama_model_n_embd(self._model)
        # Embedding lookups are free; the output head runs only for rows whose logits we ask for.
        self.head_params = self.n_vocab * self.n_embd
        stored_matrices = 2 if has_untied_output(self.path) else 1
        self.body_params = max(self.n_params - stored_matrices * self.head_params, 0)

        self.cache_types = cache_types
        self.flash_attn = flash_attn
        self._check_cache_blocks()
        n_ctx = asked_context(n_ctx, self.n_ctx_train)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.type_k, ctx_params.type_v = (CACHE_GGML_TYPES[name] for name in cache_types)
        ctx_params.flash_attn_type = FLASH_ATTN_TYPES[flash_attn]
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = n_batch or DEFAULT_BATCH
        ctx_params.n_ubatch = n_ubatch or DEFAULT_UBATCH
        self.n_threads = resolve_threads(n_threads)
        self.n_threads_batch = batch_threads(n_threads_batch, self.n_threads)
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads_batch
        if eval_callback is not None:  # shown each graph node (ead depth's probes); kept alive by the caller
            ctx_params.cb_eval = eval_callback
        with main_thread_signals():
            self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            self.close()
            raise EadError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {shown_path(self.path)}"
            )
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        # as llama.cpp made them: a batch no larger than the context, a micro-batch no larger than the batch
        self.n_batch = llama_cpp.llama_n_batch(self._ctx)
        self.n_ubatch = llama_cpp.llama_n_ubatch(self._ctx)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        batch = self._batch  # its arrays, fetched once (each attribute read makes a new ctypes pointer)
        self._batch_arrays = (batch.token, batch.pos, batch.logits)
        for i in range(self.n_batch):  # every token of every batch is in sequence 0 alone
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
        # Asked between graph nodes of a batch, so a Ctrl-C stops a long prefill or catch-up at once
        # rather than after it; set only for batches (a Python call per node would slow decode).
        self._abort_callback = llama_cpp.ggml_abort_callback(self._abort_requested)
        self._no_abort_callback = llama_cpp.ggml_abort_callback()
        self._interrupt: BaseException | None = None
        # Asked with the signals: whether whoever runs this batch no longer wants it (ead serve: its
        # client left), which stops a long prefill between graph nodes instead of at its end.
        self.abandoned: Callable[[], bool] = never_abandoned
        # A GPU build's llama_decode returns before the device is done (the wait comes with the next read
        # of the logits): feed waits there, so each phase's seconds hold its own batches' compute.
        self._waits_for_device = gpu_offload_available()
        self._launched: PhaseCounter | None = None  # the phase of a batch launched without that wait
        # Whether the decoder launches the next step's read before it hands out a token's event, so the
        # event's consumers and the loop's own work overlap the device's decode (Decoder._read_ahead).
        # A CPU decode returns when it is done: there reading ahead would only delay each event.
        self.reads_ahead = self._waits_for_device
        self.n_past = 0
        self._seen: list[int] = []  # the tokens in the KV cache, to keep the common prefix on a new run
        self._logits_at = -1  # n_past when the logits buffer was last filled
        self._row = -1  # which output row of the last batch ``logits`` reads (-1: the last)
        # A lookup guess read past n_past in the last batch: its tokens, and how many a sync confirmed.
        self._guess: list[int] = []
        self._guess_used = 0
        self.stats = RunnerStats.empty()
        self.on_step: Callable[[list], None] | None = None  # told each feed and rollback (schedules)
        self.on_progress: Callable[[PromptProgress], None] | None = None  # told each batch of a prompt
        self.entropy = EntropyMeter(self.n_vocab)  # bits of a row of logits (a remote runner estimates)
        self._logits_view: np.ndarray | None = None  # the last row's numpy view, while llama.cpp keeps it
        self._logits_address = 0  # where that view points
        self._pieces: dict[int, bytes] = {}  # token_bytes' answers: the vocabulary never changes
        self._pieces_with_control: dict[int, bytes] = {}  # token_piece's
        self._ends: dict[int, bool] = {}  # is_end_of_generation's answers
        self.label = self.path.name
        self.location = str(self.path)

    def _check_cache_blocks(self) -> None:
        """Refuse a quantized KV cache whose blocks do not divide this model's attention heads, as
        llama.cpp would (a line in its log, no context; without flash attention, an abort)."""
        arch = self.metadata("general.architecture")
        for part, cache_type in zip("KV", self.cache_types, strict=True):
            head = self.metadata(f"{arch}.attention.{'key' if part == 'K' else 'value'}_length")
            size = int(head) if head else self.n_embd // llama_cpp.llama_model_n_head(self._model)
            if cache_type not in UNQUANTIZED_CACHE_TYPES and size % QUANT_BLOCK:
                self.close()
                raise EadError(
                    f"a {cache_type} {part} cache stores blocks of {QUANT_BLOCK} values, which do not divide "
                    f"the attention heads of {self.path.name} ({size} values): give it f16, bf16 or f32",
                    exit_code=2,
                )

    @property
    def file_bytes(self) -> int:
        return self.path.stat().st_size

    @property
    def model(self) -> llama_cpp.llama_model_p:
        return self._model

    @property
    def ctx(self) -> llama_cpp.llama_context_p:
        return self._ctx

    def sync(
        self,
        tokens: Sequence[int],
        *,
        prompt_len: int,
        own_tail: bool,
        guess: Callable[[], Sequence[int]] | None = None,
    ) -> np.ndarray:
        """Read every token this model has not seen (``read``); return the logits predicting the next one.
        The returned array is a view into llama.cpp's buffer, valid until the next feed."""
        self.read(tokens, prompt_len=prompt_len, own_tail=own_tail, guess=guess)
        return self.logits()

    def read(
        self,
        tokens: Sequence[int],
        *,
        prompt_len: int,
        own_tail: bool,
        guess: Callable[[], Sequence[int]] | None = None,
        wait: bool = True,
    ) -> None:
        """Read every token this model has not seen, so that ``logits`` predicts the next one.

        ``prompt_len``: tokens[:prompt_len] are the prompt (counted as prefill). ``own_tail``: the last
        token was written by this model, so a one-token feed is an ordinary decode step.
        ``guess``: asked for tokens that may come next (a lookup draft) only when this call reads new
        tokens after the prompt, since finding one costs a pass over the sequence; they are read in the
        same batch, with logits at each, and a later sync whose new tokens confirm them returns those
        rows without a decode: the same rows a step would have computed (up to batched kernels'
        rounding). A batch that carries a guess is counted as catch-up, and tokens guessed wrong are
        dropped from the cache. ``wait=False``: on a GPU, return once the batches are launched; the
        wait for the device comes with the next ``logits`` (``reads_ahead``).
        """
        n = len(tokens)
        if n > self.n_ctx:
            raise EadError(f"{n} tokens do not fit the context of {self.n_ctx} tokens")
        if self._guess and self._confirm(tokens):
            return
        if self.n_past == n and self._logits_at != n:
            self.truncate(n - 1)  # the logits buffer belongs to another position: recompute the last row
        start = self.n_past
        if start < prompt_len:
            self.feed(tokens, start, min(prompt_len, n), "prefill")
            start = self.n_past
        guessed: list[int] = []
        if guess is not None and start < n:  # as many as the batch and the context have room for
            guessed = list(guess()[: max(0, min(self.n_batch - 1, self.n_ctx - n))])
        if guessed:
            if n + len(guessed) - start > self.n_batch:  # keep the guessed rows in one batch
                self.feed(tokens, start, n - 1, "catchup")
                start = n - 1
            self.feed(
                [*tokens, *guessed], start, n + len(guessed), "catchup", rows=len(guessed) + 1, wait=wait
            )
            self.n_past, self._logits_at = n, n  # the guessed tokens are in the cache, not yet confirmed
            del self._seen[n:]
            self._guess, self._guess_used, self._row = guessed, 0, -len(guessed) - 1
            self.stats.guessed += len(guessed)
        elif start < n:
            phase: Phase = "decode" if own_tail and n - start == 1 else "catchup"
            self.feed(tokens, start, n, phase, wait=wait)

    def drop_guess(self) -> None:
        """Forget an unconfirmed guess (the cache then holds exactly what ``n_past`` counts)."""
        if self._guess:
            self.truncate(self.n_past)

    def _confirm(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` only add guessed tokens to what was read (then the row is at hand); else
        the guess is dropped from where it parts from ``tokens`` on."""
        base = self.n_past
        if len(tokens) == base:  # the same position again: its row is at hand
            return self._logits_at == base
        remaining = self._guess[self._guess_used :]
        new = tokens[base : base + len(remaining)]
        agreed = common_prefix(new, remaining)
        self.n_past = base + agreed
        self._seen.extend(new[:agreed])
        self._guess_used += agreed
        self.stats.guessed_kept += agreed
        if agreed == len(tokens) - base and agreed > 0:
            self._logits_at = len(tokens)
            self._row += agreed
            return True
        self.truncate(self.n_past)  # the rest of the guess is not what came
        return False

    def verify(self, tokens: Sequence[int], *, prompt_len: int, rows: int) -> np.ndarray:
        """Read every unseen token, with logits at each of the last ``rows`` positions (a draft to check).

        Returns a (rows, n_vocab) view: row i predicts position len(tokens) - rows + i + 1. The rows come
        from one llama.cpp batch (each batch overwrites the last one's logits), so at most ``n_batch``.
        """
        if rows > self.n_batch:
            raise ValueError(f"{rows} rows of logits do not fit one batch of {self.n_batch} tokens")
        n = len(tokens)
        if n > self.n_ctx:
            raise EadError(f"{n} tokens do not fit the context of {self.n_ctx} tokens")
        first_row = n - rows
        self.truncate(min(self.n_past, first_row))
        if self.n_past < min(prompt_len, first_row):
            self.feed(tokens, self.n_past, min(prompt_len, first_row), "prefill")
        if self.n_past < first_row:
            self.feed(tokens, self.n_past, first_row, "catchup")
        self.feed(tokens, first_row, n, "catchup", rows=rows, prompt_len=prompt_len)
        return self.rows(rows)

    def score(self, tokens: Sequence[int], scored: Callable[[np.ndarray, int], None], start: int = 0) -> None:
        """Read ``tokens`` from ``start`` (the cache's positions before it kept) with logits at every
        position, telling ``scored(rows, batch_start)`` each batch's: row i predicts ``tokens[batch_start
        + i + 1]`` (a prompt's log-probabilities, for a text completion's echo). Batches of
        ``SCORED_ROWS`` at most, so the logits buffer stays small; the reading is counted as prefill, and
        the cache then holds ``tokens`` with the last row at hand."""
        self.truncate(start)  # cached positions have no logits kept
        step = min(self.n_batch, SCORED_ROWS)
        for batch_start in range(start, len(tokens), step):
            end = min(len(tokens), batch_start + step)
            self.feed(tokens, batch_start, end, "prefill", rows=end - batch_start)
            scored(self.rows(end - batch_start), batch_start)

    def rows(self, count: int) -> np.ndarray:
        """Zero-copy (count, n_vocab) view of the rows of logits the last batch computed."""
        self._wait_for_device()
        pointer = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(count, self.n_vocab))

    def logits(self) -> np.ndarray:
        """Zero-copy view of the row of logits for the position read last (the last computed row, or a
        confirmed guess's). The view is made again only when llama.cpp moved the row (a batch with more
        rows of logits): np.ctypeslib.as_array takes ~1.4 us warm and more on the cache a decode just
        flushed, every token."""
        self._wait_for_device()
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, self._row)
        address = ctypes.addressof(pointer.contents)
        if address != self._logits_address or self._logits_view is None:
            self._logits_view = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
            self._logits_address = address
        return self._logits_view

    @property
    def logits_row(self) -> int:
        """Which output row of the last batch ``logits`` reads (-1: the last), as llama.cpp indexes them."""
        return self._row

    def truncate(self, n: int) -> None:
        """Forget every position from n on (rollback, chat edits).

        Always clears the cache from n, also past ``n_past``: a Ctrl-C that lands inside llama_decode
        can leave cells there that ``n_past`` never counted.
        """
        self._wait_for_device()
        if self._guess:  # guessed cells past n_past are never kept by a truncation
            n = min(n, self.n_past)
        llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1)
        if self.on_step is not None and (n < self.n_past or self._guess):
            self.on_step(["t", n])
        self._guess, self._guess_used = [], 0
        self.n_past = min(self.n_past, n)
        del self._seen[n:]

    def align(self, tokens: Sequence[int]) -> int:
        """Keep the cached prefix shared with ``tokens``, drop the rest; return how many tokens are kept.

        A new run (the next chat turn, another prompt) then reads only what differs.
        """
        common = common_prefix(self._seen, tokens)
        self.truncate(common)
        return common

    def feed(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        phase: Phase,
        rows: int = 1,
        *,
        wait: bool = True,
        prompt_len: int = 0,
    ) -> None:
        """Decode tokens[start:end] in batches, with logits for the last ``rows`` positions.

        Counted under ``phase``, but tokens before ``prompt_len`` as prefill, with their share of the
        seconds (a draft checked from the prompt's end reads its last tokens in the draft's batch, for
        their rows). ``on_step`` (a schedule recorder) is told what was fed. ``wait=False``: the wait for
        the last batch (a GPU's) is left to the next read of the logits, which counts it here."""
        self._wait_for_device()
        batch = self._batch
        counter: PhaseCounter = getattr(self.stats, phase)
        began = perf_counter()
        for chunk_start in range(start, end, self.n_batch):
            chunk_end = min(end, chunk_start + self.n_batch)
            count = chunk_end - chunk_start
            batch.n_tokens = count
            ids, positions, wants = self._batch_arrays
            for i in range(count):
                ids[i] = tokens[chunk_start + i]
                positions[i] = chunk_start + i
                wants[i] = chunk_start + i >= end - rows
            status = self._decode(batch, abortable=count > 1)
            if status != 0:
                self.truncate(chunk_start)
                raise EadError(f"llama.cpp failed to decode with {self.name} (status {status})")
            self.n_past = chunk_end
            self._seen.extend(tokens[chunk_start:chunk_end])
            if phase == "prefill" and self.on_progress is not None:
                self.on_progress(PromptProgress(self.name, chunk_end, end, start, perf_counter() - began))
        self._row = -1
        if not wait:
            self._launched = counter
        elif self._waits_for_device:
            llama_cpp.llama_synchronize(self._ctx)
        seconds = perf_counter() - began
        in_prompt = 0 if phase == "prefill" else max(0, min(end, prompt_len) - start)
        if in_prompt:
            share = seconds * in_prompt / (end - start)
            self.stats.prefill.seconds += share
            self.stats.prefill.tokens += in_prompt
            seconds -= share
        counter.seconds += seconds
        counter.tokens += end - start - in_prompt
        self.stats.logits_rows += min(rows, end - start)
        self._logits_at = end
        if self.on_step is not None:
            self.on_step([phase[0], start, list(tokens[start:end]), rows])

    def _wait_for_device(self) -> None:
        """Wait for a batch ``feed`` launched without waiting, and count the wait in its phase."""
        counter = self._launched
        if counter is not None:
            self._launched = None
            began = perf_counter()
            llama_cpp.llama_synchronize(self._ctx)
            counter.seconds += perf_counter() - began

    def _decode(self, batch: llama_cpp.llama_batch, *, abortable: bool) -> int:
        """llama_decode with signals held for the main thread; a batch stops early on Ctrl-C/SIGTERM,
        which is then raised here (cells it wrote are cleared by the next ``truncate``/``align``).
        The abort callback is set with signals held too: that call logs a line through llama-cpp-python's
        Python callback, where a Ctrl-C taken would be dropped by ctypes."""
        previous = block_signals()  # main_thread_signals, without its ~0.5 us more a token
        try:
            if abortable:
                llama_cpp.llama_set_abort_callback(self._ctx, self._abort_callback, None)
            try:
                status = llama_cpp.llama_decode(self._ctx, batch)
            finally:
                if abortable:
                    llama_cpp.llama_set_abort_callback(self._ctx, self._no_abort_callback, None)
        finally:
            # taken before the signals are let through: one raised then must not leave it for the next batch
            interrupt, self._interrupt = self._interrupt, None
            restore_signals(previous)
        if interrupt is not None:
            raise interrupt
        return status

    def _abort_requested(self, _data: int | None) -> bool:
        if self.abandoned():
            self._interrupt = Abandoned()
            return True
        try:
            return stop_requested()
        except (KeyboardInterrupt, Terminated) as interrupt:  # its handler ran in here: raise it later
            self._interrupt = interrupt
            return True

    def flops(self) -> float:
        """Forward FLOPs so far."""
        return forward_flops(self, self.stats.tokens_read, self.stats.logits_rows)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (control tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._token_to_piece(token)
        return piece

    def token_piece(self, token: int) -> bytes:
        """The bytes a token stands for, a control token's its text (``<|im_end|>``): as llama-server's
        /tokenize and /detokenize show tokens, so a text tokenized with its special tokens comes back."""
        piece = self._pieces_with_control.get(token)
        if piece is None:
            piece = self._pieces_with_control[token] = self._token_to_piece(token, special=True)
        return piece

    def _token_to_piece(self, token: int, special: bool = False) -> bytes:
        """A token's bytes; ``special``: a control token's as its text, not as nothing."""
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, -size, 0, special)
        return buffer.raw[:size]

    @cached_property
    def token_reach(self) -> TokenReach | None:
        """How much text one token stands for; None for tokenizers that normalize the text first (WPM,
        UGM) or that are not checked here. A pass over the vocabulary (~0.3 s for Qwen2's 151,936
        tokens, ~0.5 s for Gemma's 262,144 on a busy 2-core machine), made when a long prompt first asks."""
        if llama_cpp.llama_vocab_type(self.vocab) not in _LENGTH_BOUNDED_VOCABS:
            return None
        buffer = ctypes.create_string_buffer(8)  # a longer piece's size comes back negated
        longest, strips_whitespace = 1, False
        by_pair = np.ones(1 << 16, dtype=np.int32)
        for token in range(self.n_vocab):
            size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, True)
            longest = max(longest, abs(size))
            if abs(size) >= 2:  # a longer piece than the buffer holds is not written: read it whole
                piece = buffer.raw if size > 0 else self._token_to_piece(token, special=True)
                pair = piece[0] << 8 | piece[1]
                by_pair[pair] = max(by_pair[pair], abs(size))
            attributes = llama_cpp.llama_vocab_get_attr(self.vocab, token)
            strips_whitespace = strips_whitespace or bool(attributes & _STRIP_ATTRIBUTES)
        return TokenReach(longest, strips_whitespace, by_pair if self._keeps_bytes() else None)

    @cached_property
    def cuts_at_lines(self) -> bool:
        """Whether a text cut at a line's start or end (``_LINE_SPLITTING_PRES``) tokenizes on each side
        as the whole text does there: a byte-level BPE reads each piece its pre-tokenizer splits apart
        alone, and no user-defined token, which llama.cpp finds in a text before it splits it, holds a
        newline. So the tokens kept of a long text's end are read from its end alone (``prompt.tail_tokens``).
        A pass over the vocabulary's attributes, made when a long text first asks."""
        if llama_cpp.llama_vocab_type(self.vocab) != llama_cpp.LLAMA_VOCAB_TYPE_BPE:
            return False
        if (self.metadata("tokenizer.ggml.pre") or "default") not in _LINE_SPLITTING_PRES:
            return False
        return not any(
            llama_cpp.llama_vocab_get_attr(self.vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
            and b"\n" in self.token_piece(token)
            for token in range(self.n_vocab)
        )

    def _keeps_bytes(self) -> bool:
        """Whether the tokens of a text spell its bytes as they stand: not where the tokenizer reads a
        "▁" as a space (SPM, Gemma 4's BPE) or puts a space before the text (SPM)."""
        probe = "a ▁b"
        pieces = b"".join(self._token_to_piece(token) for token in self.tokenize(probe, add_special=False))
        return pieces == probe.encode()

    def spelling(self, text: str) -> list[int] | None:
        """Tokens whose bytes are the text's exactly, for a grammar to follow (it reads their bytes); None
        where the vocabulary has none. The tokenizer's own where they spell it; else, where it rewrites
        the text (SPM puts a space first and reads a "▁" as one), the longest piece at each point."""
        tokens = self.tokenize(text, add_special=False, parse_special=False)
        data = text.encode()
        if b"".join(map(self.token_bytes, tokens)) == data:
            return tokens
        pieces, longest = self._piece_tokens
        spelled, at = [], 0
        while at < len(data):
            end = next(
                (end for end in range(min(len(data), at + longest), at, -1) if data[at:end] in pieces), None
            )
            if end is None:
                return None
            spelled.append(pieces[data[at:end]])
            at = end
        return spelled

    @cached_property
    def _piece_tokens(self) -> tuple[dict[bytes, int], int]:
        """A token for each text a token stands for, and the longest such text's bytes: a pass over the
        vocabulary, made when ``spelling`` first needs it. A piece's token comes before a byte token of
        the same bytes (SentencePiece writes a <0xNN> only where no piece spells the character, and its
        byte tokens' ids come first); control, unused and unknown tokens (SPM's "▅") stand for none."""
        pieces: dict[bytes, int] = {}
        byte_tokens: dict[bytes, int] = {}
        for token in range(self.n_vocab):
            attributes = llama_cpp.llama_vocab_get_attr(self.vocab, token)
            if attributes & _PIECE_ATTRIBUTES:
                pieces.setdefault(self.token_bytes(token), token)
            elif attributes & llama_cpp.LLAMA_TOKEN_ATTR_BYTE:
                byte_tokens.setdefault(self.token_bytes(token), token)
        pieces = byte_tokens | pieces
        pieces.pop(b"", None)
        return pieces, max(map(len, pieces), default=1)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if count < 0:
            capacity = -count
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buffer, capacity, add_special, parse_special
            )
        return list(buffer[:count])

    def is_end_of_generation(self, token: int) -> bool:
        ends = self._ends.get(token)  # asked every token: a dict beats a ctypes call (~1 us)
        if ends is None:
            ends = self._ends[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return ends

    def metadata(self, key: str) -> str | None:
        """A string value from the GGUF metadata (e.g. tokenizer.chat_template), or None."""
        size = 256
        while True:
            buffer = ctypes.create_string_buffer(size)
            needed = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buffer, size)
            if needed < 0:
                return None
            if needed < size:
                return buffer.value.decode("utf-8", errors="replace")
            size = needed + 1

    @property
    def file_type(self) -> str:
        """The type its file says most of its weights have (Q4_K_M, F16), as ollama names a model's
        quantization; '' where the file does not say."""
        value = self.metadata("general.file_type")
        return file_type_names().get(int(value), "") if value is not None and value.isdigit() else ""

    @property
    def twin_of(self) -> str | None:
        """The model a random-weight twin stands in for (for timing only), or None for a real model."""
        return self.metadata(TWIN_KEY)

    def close(self) -> None:
        """Free the batch, context, parsed grammars and model (safe to call twice)."""
        if self._ctx:
            self._wait_for_device()
        self._free_context()
        if self._model:
            self.grammars.close()
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def warm_up(runners: Sequence[Runner], prompt: Sequence[int]) -> None:
    """One prefill per model, so the first timed sample is not charged for paging the weights in."""
    for runner in runners:
        runner.truncate(0)
        runner.sync(prompt, prompt_len=len(prompt), own_tail=False)
        runner.truncate(0)

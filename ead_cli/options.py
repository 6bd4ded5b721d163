"""The options a command is given, checked when made: which models and how llama.cpp runs them, and how
the models take turns. Pure Python (no numpy, no llama.cpp), so the command line can declare and check
them before anything heavy loads."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import EadError, check_int32, quoted
from .option_table import DEFAULT_MODE, OPTIONS, SWITCHING, resolve_mode
from .policies import POLICY_KINDS, SHAPING, Burst, Policy, SwitchPoint, Tau, as_taus, make_policy

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .sampling import SamplingParams

DEFAULT_TOP_K = 20
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 86400  # a day, as ead serve's --shutdown-timeout
SAMPLE_TIMEOUT_S = 10.0  # ead bench humaneval's --timeout: the wall-clock limit of one solution's tests


def check_remote_settings(top_k: int, timeout_s: float, api_key: str | None = None) -> None:
    """The one check of --remote-top-k, --remote-timeout and --remote-api-key: the options (before any
    model loads) and a runner made directly both use it."""
    if not 1 <= top_k <= 1000:
        raise EadError(f"--remote-top-k must be in [1, 1000], got {top_k}", exit_code=2)
    check_timeout(timeout_s, "--remote-timeout")  # past it (inf), socket.settimeout raised OverflowError
    check_api_key(api_key, "--remote-api-key")


def check_api_key(key: str | None, option: str) -> None:
    """An API key an HTTP header carries (``Authorization: Bearer KEY``), ead serve's or a server's it
    asks: not empty, printable ASCII (http.client had raised a traceback for a line break), no space
    around it (clients strip it). The key itself is never echoed."""
    if key is None:
        return
    if not key.strip():
        raise EadError(f"{option} is empty", exit_code=2)
    if not (key.isascii() and key.isprintable()):
        raise EadError(f"{option} must be printable ASCII: an HTTP header carries it", exit_code=2)
    if key != key.strip():
        raise EadError(f"{option} starts or ends with a space, which clients do not send", exit_code=2)


def check_timeout(seconds: float, option: str) -> None:
    """A time limit in seconds: above 0 and at most a day (past it, inf: a socket's timeout raised
    OverflowError, the sandbox's CPU limit overflowed)."""
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise EadError(f"{option} must be above 0 and at most {MAX_TIMEOUT_S} seconds, got {seconds}", 2)


def check_verify_ratio(ratio: float) -> None:
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"--verify must be in (0, 1], got {ratio}")


def check_draft(draft: int, name: str = "--draft") -> None:
    """A guess's length, ``name`` the option's (--draft, or --lookup-draft for a prompt lookup's)."""
    if not 1 <= draft <= 64:
        raise ValueError(f"{name} must be in [1, 64], got {draft}")


def check_bits(value: float, option: str) -> None:
    """An entropy in bits given as a threshold: at least 0 and finite, as chat's commands and serve's
    fields read every number ('inf' made a threshold always or never met)."""
    if not 0 <= value < math.inf:
        raise EadError(f"{option} must be at least 0 bits and finite, got {value}", exit_code=2)


def check_lookup(lookup: int) -> None:
    if not 0 <= lookup <= 64:
        raise ValueError(f"--lookup must be in [0, 64] tokens (0: off), got {lookup}")


def default_threads() -> int:
    """All the cores this process may use: llama.cpp's decode is bound by them on a CPU."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# llama.cpp's GGML_MAX_N_THREADS: past the threads a process may start, its thread pool segfaults, and
# past 2**31 the count wraps in its 32-bit field
MAX_THREADS = 512


def resolve_threads(threads: int | None, flag: str = "--threads") -> int:
    """--threads (or --threads-batch, by ``flag``), the same for every command: None is all cores; below 1
    or above MAX_THREADS is refused (a usage error)."""
    if threads is None:
        return default_threads()
    if threads < 1:
        raise EadError(f"{flag} must be at least 1, got {threads}", exit_code=2)
    if threads > MAX_THREADS:
        raise EadError(f"{flag} must be at most {MAX_THREADS} (llama.cpp's most), got {threads}", 2)
    return threads


def batch_threads(threads_batch: int | None, threads: int) -> int:
    """--threads-batch, llama.cpp's -tb: the threads that read batches of several tokens (a prompt, a
    catch-up, a draft's or a guess's check), ``threads`` where it is not given, as llama.cpp's."""
    return threads if threads_batch is None else resolve_threads(threads_batch, "--threads-batch")


NO_LIMIT = -1  # --max-tokens -1, llama.cpp's -n -1: an answer runs until it ends or the context is full


def answer_limit(max_tokens: int, n_ctx: int) -> int:
    """The most tokens an answer may have in a context of ``n_ctx`` tokens: ``max_tokens`` within it, all
    of it for NO_LIMIT (the context's end stops the answer)."""
    return n_ctx if max_tokens == NO_LIMIT else min(max_tokens, n_ctx)


def check_max_tokens(max_tokens: int) -> None:
    """--max-tokens of a command whose answers are measured: at least one token each."""
    if max_tokens < 1:
        raise EadError(f"--max-tokens must be at least 1, got {max_tokens}", exit_code=2)


def check_ctx(n_ctx: int | None) -> None:
    """--ctx, the same for every command that takes it: None is the default; below 16 is refused."""
    if n_ctx is not None and n_ctx < 16:
        raise EadError(f"--ctx must be at least 16, got {n_ctx}", exit_code=2)
    check_int32(n_ctx, "--ctx")


# ead's batch sizes when none is given: 512 tokens each (llama.cpp's tools: a batch of 2048, read in
# micro-batches of 512); --batch-size larger alone keeps llama.cpp's micro-batch, as its tools do
DEFAULT_BATCH = 512
DEFAULT_UBATCH = 512


def check_batch(value: int | None, flag: str) -> None:
    """--batch-size or --ubatch-size: None is the default; below 1 or past llama.cpp's 32 bits is refused.
    A micro-batch larger than the batch is not: llama.cpp makes it the batch, as its tools do."""
    if value is not None and value < 1:
        raise EadError(f"{flag} must be at least 1, got {value}", exit_code=2)
    check_int32(value, flag)


def check_model_name(name: str, flag: str, kinds: str) -> None:
    """A usage error for a blank model name: it names no alias or file (looked up as an alias, the default
    model would answer in its place)."""
    if not name.strip():
        raise EadError(f"{flag} must name a model ({kinds}), got {quoted(name)}", exit_code=2)


# llama-cli's KV cache types (common/arg.cpp's kv_cache_types, llama.cpp as llama-cpp-python 0.3.36
# vendors it), f16 its default; the quantized ones store blocks of 32 values
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED_CACHE_TYPES = ("f32", "f16", "bf16")
DEFAULT_CACHE_TYPE = "f16"
# llama-cli's -fa values (its is_truthy, is_falsey and is_autoy words), auto its default
FLASH_ATTN_WORDS = {
    **dict.fromkeys(("on", "enabled", "true", "1"), "on"),
    **dict.fromkeys(("off", "disabled", "false", "0"), "off"),
    **dict.fromkeys(("auto", "-1"), "auto"),
}


# llama-cli's -lm/--load-mode values, auto its default (mapped from the file, where the device can)
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")


def load_mode_of(load_mode: str | None, *, no_mmap: bool, mlock: bool) -> str:
    """--load-mode, or the mode older llama.cpp's --no-mmap and --mlock mean (it mapped the weights by
    default: --mlock alone locked the mapping), which llama-cli 0.3.36 no longer takes."""
    if load_mode is not None:
        if no_mmap or mlock:
            raise EadError("--load-mode says how the weights load: leave out --no-mmap and --mlock", 2)
        return load_mode
    if mlock:
        return "mlock" if no_mmap else "mmap+mlock"
    return "none" if no_mmap else "auto"


def check_cache_type(cache_type: str, flag: str) -> None:
    """A KV cache type as llama-cli takes it, refused naming the choices."""
    if cache_type not in KV_CACHE_TYPES:
        choices = ", ".join(KV_CACHE_TYPES)
        raise EadError(f"{flag} must be one of {choices}, got {quoted(cache_type)}", exit_code=2)


def flash_attn_setting(word: str) -> str:
    """--flash-attn's value as llama-cli reads it (on, off or auto, or a word it takes for one)."""
    if word not in FLASH_ATTN_WORDS:
        raise EadError(f"--flash-attn must be on, off or auto, got {quoted(word)}", exit_code=2)
    return FLASH_ATTN_WORDS[word]


def check_context_settings(cache_types: Mapping[str, str], flash_attn: str, load_mode: str) -> str:
    """How llama.cpp loads the weights and keeps the KV cache, as llama-cli's flags say it: the load mode,
    flash attention, and each KV cache type by its option, checked together (a quantized V cache needs
    flash attention). Returns flash attention's setting (on, off or auto)."""
    if load_mode not in LOAD_MODES:
        choices = ", ".join(LOAD_MODES)
        raise EadError(f"--load-mode must be one of {choices}, got {quoted(load_mode)}", exit_code=2)
    setting = flash_attn_setting(flash_attn)
    for flag, cache_type in cache_types.items():
        check_cache_type(cache_type, flag)
        # llama.cpp makes no context of a quantized V cache without flash attention (a line in its log)
        quantized_v = flag.startswith("--cache-type-v") and cache_type not in UNQUANTIZED_CACHE_TYPES
        if quantized_v and setting == "off":
            message = f"{flag} {cache_type} needs flash attention: leave --flash-attn auto or on"
            raise EadError(message, exit_code=2)
    return setting


# The small model named for a run that leaves it unused (engine.unused_options), as a note names it:
# --small, or every model of --models but the largest
SMALL_MODEL_FLAGS = ("--small", "the smaller --models")


@dataclass(frozen=True)
class ModelOptions:
    """Which models, and how llama.cpp runs them. ``None`` means the default. ``models``: a cascade of
    three or more (or two), smallest first, instead of ``small`` and ``large``."""

    small: str | None = None
    large: str | None = None
    models_file: Path | None = None
    n_ctx: int | None = None
    n_batch: int | None = None  # --batch-size: tokens per llama_decode (a prompt's, a draft's rows)
    n_ubatch: int | None = None  # --ubatch-size: tokens per compute graph within a batch
    threads: int | None = None
    threads_batch: int | None = None  # -tb: threads for batches of several tokens (default: threads)
    n_gpu_layers: int | None = None
    allow_download: bool = True
    models: tuple[str, ...] = ()
    remote_top_k: int = DEFAULT_TOP_K  # a model on a llama-server: top-k probabilities per token
    remote_timeout: float = DEFAULT_TIMEOUT_S
    remote_api_key: str | None = field(default=None, repr=False)  # sent to a llama-server, never shown
    repack: bool | None = None  # weight repacking: None decides by EAD_REPACK, then the CPU (hardware.py)
    # KV cache types, llama-cli's -ctk/-ctv for every model but the smallest and -ctkd/-ctvd (its draft
    # model's) for the smallest; flash attention (-fa) for all of them
    cache_type_k: str = DEFAULT_CACHE_TYPE
    cache_type_v: str = DEFAULT_CACHE_TYPE
    cache_type_k_draft: str = DEFAULT_CACHE_TYPE
    cache_type_v_draft: str = DEFAULT_CACHE_TYPE
    flash_attn: str = "auto"
    load_mode: str = "auto"  # llama-cli's --load-mode (load_mode_of: --no-mmap, --mlock)
    chat_template: str | None = None  # --chat-template: a builtin's name or a Jinja template (prompt.py)
    chat_template_file: Path | None = None  # --chat-template-file: a Jinja template's file
    # llama-server's --jinja (its default and llama-cli's); --no-jinja: llama.cpp's own formatter writes
    # the chats, as the builtin it recognises the template as (prompt.without_jinja)
    jinja: bool = True

    def __post_init__(self) -> None:
        if self.chat_template is not None and self.chat_template_file is not None:
            raise EadError("give --chat-template or --chat-template-file, not both", exit_code=2)
        setting = check_context_settings(self.cache_flags(), self.flash_attn, self.load_mode)
        object.__setattr__(self, "flash_attn", setting)
        check_ctx(self.n_ctx)
        check_batch(self.n_batch, "--batch-size")
        check_batch(self.n_ubatch, "--ubatch-size")
        # refused here, before any model loads
        batch_threads(self.threads_batch, resolve_threads(self.threads))
        layers = self.n_gpu_layers
        if layers is not None and layers < -1:  # any negative would offload every layer: only -1 says so
            raise EadError(f"--n-gpu-layers must be -1 (every layer) or at least 0, got {layers}", 2)
        check_int32(layers, "--n-gpu-layers")
        for flag, name in (("--small", self.small), ("--large", self.large)):
            if name is not None:
                check_model_name(name, flag, "an alias, a .gguf path or a server")
        if self.models and (self.small or self.large):
            raise EadError("--models names every model: leave out --small and --large", exit_code=2)
        if self.models and (len(self.models) < 2 or not all(self.models)):
            given = ",".join(self.models)
            message = f"--models takes two or more models, comma-separated, none empty, got {quoted(given)}"
            raise EadError(message, exit_code=2)
        check_remote_settings(self.remote_top_k, self.remote_timeout, self.remote_api_key)

    @property
    def count(self) -> int:
        return len(self.models) or 2

    def cache_flags(self) -> dict[str, str]:
        """Each KV cache type by its option."""
        return {
            "--cache-type-k": self.cache_type_k,
            "--cache-type-v": self.cache_type_v,
            "--cache-type-k-draft": self.cache_type_k_draft,
            "--cache-type-v-draft": self.cache_type_v_draft,
        }

    def cache_types(self, role: str) -> tuple[str, str]:
        """The K and V cache types of a model by its role: the small one's are the draft model's."""
        if role == "small":
            return self.cache_type_k_draft, self.cache_type_v_draft
        return self.cache_type_k, self.cache_type_v

    @property
    def template_given(self) -> str | None:
        """The option that gives a chat template in place of the models' own, or the writer of their own
        (--no-jinja), if one does."""
        if self.chat_template_file is not None:
            return "--chat-template-file"
        if self.chat_template is not None:
            return "--chat-template"
        return None if self.jinja else "--no-jinja"


def tokens_taken_back_by(mode: str | None, verify: float | None, policy: str | None) -> str | None:
    """The step of a run with these options that takes tokens back, by its option (spec's rejected
    drafts, --verify's rewrites, lookahead's dropped drafts); None where no step does (a mode other than
    ead leaves --verify and --policy unused). Also read from a bench sample's stored options."""
    if mode == "spec":
        return "--mode spec"
    if mode == "ead" and verify is not None:
        return "--verify"
    if mode == "ead" and policy == "lookahead":
        return "--policy lookahead"
    return None


@dataclass(frozen=True)
class PolicyOptions:
    """How models take turns; checked when made (a usage error, before any model loads).

    ``mode`` None: not given, resolved here by ``option_table.resolve_mode`` from the switching options
    given (``given``: their names, as the command line, a request or a chat command gave them, besides any
    that differ from their defaults) and the number of models; it stays resolved, not given
    (``mode_given``), so a copy with other options (``changed``, ``replace``) resolves it again. Every
    value is checked whatever the mode, and a given mode other than ead leaves the switching ones unused:
    one command line serves every mode, and a chat's ``/mode large`` keeps ``/tau`` for ``/mode ead``."""

    mode: str | None = None  # type: ignore[assignment]  # a str once made
    policy: str = "gate"
    tau: Tau | None = None
    window: int | None = None
    min_run: int = 10
    burst: Burst = 1
    switch_point: SwitchPoint = "before"
    normalize: bool = False
    draft: int = 4
    draft_entropy_stop: float | None = None
    verify: float | None = None  # ead mode: the large model checks small tokens on catch-up
    patterns: tuple[str, ...] = ()
    tau_range: tuple[float, float] | None = None
    levels: int = 2  # how many models take turns
    lookup: int = 0  # guesses copied from earlier in the sequence after an N-token match (0: off)
    lookup_draft: int = 16  # the most tokens such a guess holds (the bench's names keep 16 unnamed)
    given: tuple[str, ...] = ()  # the options given by name (option_table names), even at their defaults
    mode_given: bool | None = None  # None: whether ``mode`` is not None

    def __post_init__(self) -> None:
        object.__setattr__(self, "given", tuple(sorted(set(self.given))))
        if self.mode_given is None:
            object.__setattr__(self, "mode_given", self.mode is not None)
        if not self.mode_given:
            object.__setattr__(self, "mode", resolve_mode(None, self.switching_given(), self.levels))
        if self.mode == "spec" and self.levels != 2:
            raise EadError("speculative decoding takes two models: a drafter and a verifier", exit_code=2)
        try:
            if self.verify is not None:
                check_verify_ratio(self.verify)
            check_draft(self.draft)
            check_lookup(self.lookup)
            check_draft(self.lookup_draft, "--lookup-draft")
        except ValueError as error:
            raise EadError(str(error), exit_code=2) from None
        if self.draft_entropy_stop is not None:
            check_bits(self.draft_entropy_stop, "--draft-entropy-stop")
        if self.normalize and self.tau is not None and any(tau > 1 for tau in as_taus(self.tau)):
            raise EadError(f"with --normalize, --tau is a fraction of log2|V| in [0, 1], got {self.tau}", 2)
        self.make_policy()  # every switching value checked, in any mode

    def switching_given(self) -> set[str]:
        """The switching options given: named in ``given``, or away from their defaults."""
        moved = {
            f.name for f in fields(self) if f.name in _SWITCHING_FIELDS and getattr(self, f.name) != f.default
        }
        return {_FIELD_NAMES.get(name, name) for name in moved} | (set(self.given) & SWITCHING)

    def unused(self, sampling: SamplingParams) -> dict[str, str]:
        """The options given by name that this run leaves unused (flag: what leaves it so), to be said,
        not refused (one command line serves every mode): a mode other than ead the switching ones, a
        policy the options only others read (the gate --min-run), any mode but spec
        --draft-entropy-stop, greedy decoding the sampling ones (--top-p, --seed...), Mirostat those its
        chain runs in place of (--top-k, --repeat-penalty, --dry-multiplier...), --dry-multiplier 0
        DRY's others, --lookup 0 --lookup-draft."""
        mode = self.named_mode()
        if self.mode == "ead":
            policy = f"--policy {self.policy}"
            unused = dict.fromkeys(SHAPING - POLICY_KINDS[self.policy].reads, policy)
            unused["draft_entropy_stop"] = mode
        else:
            unused = dict.fromkeys(SWITCHING, mode)
            if self.mode != "spec":
                unused |= dict.fromkeys(("draft", "draft_entropy_stop"), mode)
        if sampling.mirostat:
            unused |= dict.fromkeys(_NOT_WITH_MIROSTAT, f"--mirostat {sampling.mirostat}")
        else:
            unused |= dict.fromkeys(("mirostat_ent", "mirostat_lr"), "--mirostat 0")
            if sampling.dry_multiplier == 0:
                unused |= dict.fromkeys(_DRY[1:], "--dry-multiplier 0")
        if sampling.temp == 0:
            unused |= dict.fromkeys(_SAMPLERS, "--temp 0")
        if not self.lookup:
            unused["lookup_draft"] = "--lookup 0"
        named = unused.keys() & set(self.given)
        return {option.flag: unused[name] for name, option in OPTIONS.items() if name in named}

    def named_mode(self) -> str:
        """The mode as a note names it: ``--mode ead`` as given or as a switching option implies it, the
        default's said to be one, as the user gave no mode."""
        mode = f"--mode {self.mode}"
        return mode if self.mode_given or self.mode != DEFAULT_MODE else f"the default mode ({mode})"

    def takes_tokens_back(self) -> str | None:
        """The step of this run that takes tokens back (``tokens_taken_back_by``): what a grammar, which
        cannot step back, refuses."""
        return tokens_taken_back_by(self.mode, self.verify, self.policy)

    def changed(self, **changes: object) -> PolicyOptions:
        """These options given (a chat command, a request's ``ead`` object) over this run's: a mode among
        them is given; otherwise the mode is resolved again with them."""
        names = tuple(_FIELD_NAMES.get(name, name) for name in changes if name != "levels")
        mode_given = True if changes.get("mode") is not None else self.mode_given
        return replace(self, **changes, given=self.given + names, mode_given=mode_given)  # type: ignore[arg-type]

    def make_policy(self) -> Policy:
        """A fresh policy state machine (one per generation)."""
        try:
            return make_policy(
                self.mode,
                self.policy,
                tau=self.tau,
                levels=self.levels,
                window=self.window,
                min_run=self.min_run,
                burst=self.burst,
                switch_point=self.switch_point,
                patterns=self.patterns,
                tau_range=self.tau_range,
                span=self.draft,
            )
        except ValueError as error:
            raise EadError(str(error), exit_code=2) from None


_FIELD_NAMES = {option.attribute: option.name for option in OPTIONS.values()}  # patterns -> pattern
_SWITCHING_FIELDS = {OPTIONS[name].attribute for name in SWITCHING}
# the samplers that shape a draw, which greedy decoding makes none (the penalties and the logit bias act
# on the row before it, greedy or not)
_SAMPLERS = (
    *("top_k", "top_p", "min_p", "seed", "typical", "top_n_sigma", "xtc_probability", "xtc_threshold"),
    *("mirostat", "mirostat_ent", "mirostat_lr"),
)
# DRY's options, its multiplier (0: off) first
_DRY = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breaker")
# what Mirostat's chain (llama.cpp's) runs in place of: every sampler of the default chain but the draw,
# the penalties and DRY
_NOT_WITH_MIROSTAT = (
    *("top_k", "top_p", "min_p", "typical", "top_n_sigma", "xtc_probability", "xtc_threshold"),
    *("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty"),
    *_DRY,
)


def _default_sampling() -> SamplingParams:
    """Greedy by default; imported here because sampling.py loads llama.cpp, which these options must not."""
    from .sampling import SamplingParams

    return SamplingParams()


@dataclass(frozen=True)
class GenerationOptions:
    sampling: SamplingParams = field(default_factory=_default_sampling)
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    # llama-cli's --ignore-eos: every end-of-generation token banned (``SamplingParams.banned``, filled in
    # by ``engine.build_decoder`` from the models), so an answer ends at its limit or the context's end
    ignore_eos: bool = False
    fallback: bool = False  # a remote model lost mid-answer: the smallest model writes the rest
    # a thinking model's (llama.cpp's): -1 unrestricted, 0 off, N a budget of N tokens of thinking, then
    # the message and the end tag written (thinking.ReasoningBudget)
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    reasoning_format: str = "auto"  # a thinking model's block: apart from the answer, or "none"
    # llama-server's code-completion stop rules (its n_indent and t_max_predict_ms; 0: off): a line after
    # the first less indented than this ends the answer (text.TextStream); once this many milliseconds
    # have passed since the first token, a token that writes a newline ends it (decoder).
    min_indent: int = 0
    newline_time_limit_ms: int = 0

    def __post_init__(self) -> None:
        if self.reasoning_budget < -1:
            budget = self.reasoning_budget
            message = (
                f"--reasoning-budget must be at least -1 (-1: unrestricted, 0: thinking off), got {budget}"
            )
            raise EadError(message, exit_code=2)
        if self.max_tokens < NO_LIMIT:
            message = f"--max-tokens must be -1 (no limit) or at least 0, got {self.max_tokens}"
            raise EadError(message, exit_code=2)

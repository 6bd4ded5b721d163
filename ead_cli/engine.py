"""Everything between parsed options and a ready Decoder: models found, loaded, checked, a policy built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import registry
from .compat import check_tokenizers
from .decoder import Decoder, SpeculativeDecoder, check_draft, check_lookup, check_verify_ratio
from .errors import EadError
from .hardware import repack_choice
from .policies import Burst, Policy, SwitchPoint, Tau, as_taus, make_policy
from .remote import DEFAULT_TIMEOUT_S, DEFAULT_TOP_K, RemoteRunner, check_remote_settings, connect, is_remote
from .runner import Runner, check_memory, gpu_offload_available, memory_available
from .sampling import SamplingParams
from .smoke import check_models


def role_names(count: int) -> tuple[str, ...]:
    """What events and stats call the models: small, large; a cascade puts mid (mid1, mid2, ...) between."""
    middle = ("mid",) if count == 3 else tuple(f"mid{i}" for i in range(1, count - 1))
    return ("small", *middle, "large")


@dataclass(frozen=True)
class ModelOptions:
    """Which models, and how llama.cpp runs them. ``None`` means the default. ``models``: a cascade of
    three or more (or two), smallest first, instead of ``small`` and ``large``."""

    small: str | None = None
    large: str | None = None
    models_file: Path | None = None
    n_ctx: int | None = None
    threads: int | None = None
    n_gpu_layers: int | None = None
    allow_download: bool = True
    models: tuple[str, ...] = ()
    remote_top_k: int = DEFAULT_TOP_K  # a model on a llama-server: top-k probabilities per token
    remote_timeout: float = DEFAULT_TIMEOUT_S
    repack: bool | None = None  # weight repacking: None decides by EAD_REPACK, then the CPU (hardware.py)

    def __post_init__(self) -> None:
        if self.n_ctx is not None and self.n_ctx < 16:
            raise EadError(f"--ctx must be at least 16, got {self.n_ctx}", exit_code=2)
        if self.threads is not None and self.threads < 1:
            raise EadError(f"--threads must be at least 1, got {self.threads}", exit_code=2)
        if self.models and (self.small or self.large):
            raise EadError("--models names every model: leave out --small and --large", exit_code=2)
        if self.models and (len(self.models) < 2 or not all(self.models)):
            raise EadError(f"--models takes two or more models, comma-separated, got {self.models}", 2)
        check_remote_settings(self.remote_top_k, self.remote_timeout)

    @property
    def count(self) -> int:
        return len(self.models) or 2


@dataclass(frozen=True)
class PolicyOptions:
    """How models take turns; checked when made (a usage error, before any model loads)."""

    mode: str = "ead"
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

    def __post_init__(self) -> None:
        if self.verify is not None and self.mode != "ead":
            raise EadError("--verify applies to --mode ead (two models switching)", exit_code=2)
        if self.mode == "spec" and self.levels != 2:
            raise EadError("speculative decoding takes two models: a drafter and a verifier", exit_code=2)
        try:
            if self.verify is not None:
                check_verify_ratio(self.verify)
            if self.mode == "spec" or self.policy == "lookahead":
                check_draft(self.draft)
            check_lookup(self.lookup)
        except ValueError as error:
            raise EadError(str(error), exit_code=2) from None
        stop = self.draft_entropy_stop
        if stop is not None and not stop >= 0:
            raise EadError(f"--draft-entropy-stop must be at least 0 bits, got {stop}", exit_code=2)
        if self.normalize and self.tau is not None and any(tau > 1 for tau in as_taus(self.tau)):
            raise EadError(f"with --normalize, tau is a fraction of log2|V| in [0, 1], got {self.tau}", 2)
        if self.mode != "spec":
            self.make_policy()

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


@dataclass(frozen=True)
class GenerationOptions:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    fallback: bool = False  # a remote model lost mid-answer: the smallest model writes the rest

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise EadError(f"--max-tokens must be at least 0, got {self.max_tokens}", exit_code=2)


def load_runners(
    options: ModelOptions, progress: Callable[[str], None] | None = None
) -> list[Runner | RemoteRunner]:
    """Resolve and load the models (small and large, or a cascade), smallest first, and refuse them
    unless they all share a tokenizer. A model given as http://HOST:PORT is a llama-server; the
    smallest must be local (it tokenizes the prompt and renders the chat template)."""
    catalog = registry.load_catalog(options.models_file)
    refs = options.models or (options.small or catalog.small, options.large or catalog.large)
    if is_remote(refs[0]):
        raise EadError(
            "the smallest model must be local: it tokenizes the prompt and renders the chat template", 2
        )
    paths = {
        level: registry.resolve(ref, catalog, allow_download=options.allow_download, progress=progress)
        for level, ref in enumerate(refs)
        if not is_remote(ref)
    }
    if options.n_gpu_layers == 0 or not gpu_offload_available():
        check_memory(list(paths.values()), memory_available())  # on a GPU the weights live in its memory
    repack = repack_choice(options.repack)  # a child decodes each new model file once: a crash is explained
    if progress is not None and not repack.enabled and repack.automatic:
        progress(f"note: weight repacking off ({repack.reason}); --repack forces it")
    check_models(
        list(paths.values()), repack=repack, n_gpu_layers=options.n_gpu_layers, threads=options.threads
    )
    runners: list = []
    try:
        for level, role in enumerate(role_names(len(refs))):
            if level in paths:
                runners.append(_load(paths[level], role, options, refs[level]))
                if progress is not None and runners[-1].twin_of:
                    progress(
                        f"note: {runners[-1].label} is a random-weight twin of {runners[-1].twin_of}: "
                        "for timing only, its text is noise"
                    )
                continue
            runners.append(
                connect(
                    refs[level],
                    name=role,
                    tokenizer=runners[0],
                    top_k=options.remote_top_k,
                    timeout_s=options.remote_timeout,
                )
            )
            runners[-1].check_tokenizer(runners[0].label)
        check_tokenizers([(runner.label, runner.model) for runner in runners if runner.model is not None])
    except BaseException:
        close_all(runners)
        raise
    return runners


def _load(path: Path, role: str, options: ModelOptions, ref: str) -> Runner:
    runner = Runner(
        path,
        name=role,
        n_ctx=options.n_ctx,
        n_threads=options.threads,
        n_gpu_layers=options.n_gpu_layers,
        repack=options.repack,
    )
    if registry.is_user_model(ref):  # an ollama blob's name is a digest: the reference says what it is
        runner.label = ref
    return runner


def build_decoder(
    runners: Sequence[Runner], policy_options: PolicyOptions, generation: GenerationOptions
) -> Decoder | SpeculativeDecoder:
    """A decoder over loaded runners; invalid policy values become a one-line usage error."""
    roles = role_names(len(runners))
    policy_options = replace(policy_options, levels=len(runners))
    checker_remote = isinstance(runners[-1], RemoteRunner)
    if checker_remote and (policy_options.verify is not None or policy_options.mode == "spec"):
        raise EadError(
            f"{runners[-1].label}: --verify and speculative decoding need logits at every position of a "
            "batch, which llama-server does not return; use a local model as the largest",
            exit_code=2,
        )
    try:
        if policy_options.mode == "spec":
            return SpeculativeDecoder(
                runners,
                roles,
                generation.sampling,
                draft=policy_options.draft,
                entropy_stop=policy_options.draft_entropy_stop,
                max_tokens=generation.max_tokens,
                stop=generation.stop,
                lookup=policy_options.lookup,
            )
        return Decoder(
            runners,
            roles,
            policy_options.make_policy(),
            generation.sampling,
            max_tokens=generation.max_tokens,
            stop=generation.stop,
            normalize=policy_options.normalize,
            verify=policy_options.verify,
            fallback=generation.fallback,
            lookup=policy_options.lookup,
        )
    except ValueError as error:
        raise EadError(str(error), exit_code=2) from None


def close_all(runners: Sequence[Runner]) -> None:
    for runner in runners:
        runner.close()

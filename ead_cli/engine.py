"""Everything between parsed options and a ready Decoder: models found, loaded, checked, a policy built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from . import registry
from .compat import check_tokenizers
from .decoder import Decoder, SpeculativeDecoder
from .errors import EadError, cut
from .hardware import repack_choice
from .option_table import OPTIONS
from .options import (
    DEFAULT_CACHE_TYPE,
    SMALL_MODEL_FLAGS,
    GenerationOptions,
    ModelOptions,
    PolicyOptions,
    answer_limit,
)
from .prompt import chat_template, context_size, given_template, override_template, without_jinja
from .registry import is_remote
from .remote import RemoteRunner, any_remote, connect, end_of_generation, remote_label, server_address
from .runner import Runner, check_memory, gpu_layers, gpu_offload_available, memory_available
from .sampling import MIROSTAT_NO_ROLLBACK, REMOTE_ROW, unknown_token
from .smoke import check_models
from .thinking import CLOSE, OPEN, BlockTags, ReasoningBudget, thinks
from .user_models import is_user_model


def role_names(count: int) -> tuple[str, ...]:
    """What events and stats call the models: small, large; a cascade puts mid (mid1, mid2, ...) between."""
    middle = ("mid",) if count == 3 else tuple(f"mid{i}" for i in range(1, count - 1))
    return ("small", *middle, "large")


def load_runners(
    options: ModelOptions,
    progress: Callable[[str], None] | None = None,
    *,
    large_only: bool = False,
    small_only: bool = False,
    reuse: Runner | None = None,
    local_only: bool = False,
    before_load: Callable[[dict[str, ModelFile | None]], None] | None = None,
) -> list[Runner | RemoteRunner]:
    """Resolve and load the models (small and large, or a cascade), smallest first, and refuse them
    unless they all share a tokenizer. A model given as http://HOST:PORT is a llama-server; the
    smallest must be local (it tokenizes the prompt and renders the chat template).

    ``large_only`` (the large model alone for a whole run, as ``ead generate``'s default mode): only the
    largest loads, the others' memory and load time spared; a remote largest still needs the smallest (it
    tokenizes), so there all load. ``--mode small`` loads both: its costs are stated against the large.
    ``small_only`` (the small model's answers alone, as ``ead calibrate --no-check``'s): only the smallest
    loads, the others named and checked as ``large_only`` checks them (``model_labels`` names them).
    ``reuse``: the largest, loaded before (by a ``large_only`` call), taken as is: the others join it.
    ``local_only``: the command runs every model itself (bench replay and speed): a server's address is
    refused before any model loads. ``before_load``: told each role's file (None: a llama-server's) once
    they are found, before any loads or is checked by a child (the bench's results compare them)."""
    # refused before any loads
    template = given_template(options.chat_template, options.chat_template_file, options.jinja)
    catalog = registry.load_catalog(options.models_file)
    refs = model_refs(options, catalog)
    if local_only:
        for ref in refs:
            registry.check_not_address(ref)
    for ref in filter(is_remote, refs):
        server_address(ref)  # a malformed one is a usage error before any model loads
    if is_remote(refs[0]):
        raise EadError(
            "the smallest model must be local: it tokenizes the prompt and renders the chat template", 2
        )
    roles = role_names(len(refs))
    if large_only and not is_remote(refs[-1]):
        for ref in refs[:-1]:
            registry.check(ref, catalog)  # a typo in a model not loaded is still an error
        refs, roles = refs[-1:], roles[-1:]
    if small_only:
        for ref in refs[1:]:
            if not is_remote(ref):  # a server's address was checked above
                registry.check(ref, catalog)
        refs, roles = refs[:1], roles[:1]
    reused = len(refs) - 1 if reuse is not None else -1  # the level ``reuse`` fills
    paths = {
        level: registry.resolve(ref, catalog, allow_download=options.allow_download, progress=progress)
        for level, ref in enumerate(refs)
        if not is_remote(ref) and level != reused
    }
    if before_load is not None:
        before_load(
            {
                role: ModelFile(
                    model_label(paths[level], refs[level]), paths[level].stat().st_size, paths[level]
                )
                if level in paths
                else None
                for level, role in enumerate(roles)
                if level != reused
            }
        )
    if gpu_layers(options.n_gpu_layers) == 0 or not gpu_offload_available():
        check_memory(list(paths.values()), memory_available())  # on a GPU the weights live in its memory
    repack = repack_choice(options.repack)  # a child decodes each new model file once: a crash is explained
    # no note where the machine turned repacking off: it had stood beside every one-line error of a bad
    # input on an AMX CPU; the set-up's smoke check, bench speed and every results file say it instead
    check_models(
        list(paths.values()), repack=repack, n_gpu_layers=options.n_gpu_layers, threads=options.threads
    )
    runners: list = []
    try:
        for level, role in enumerate(roles):
            if level == reused:
                runners.append(reuse)
                continue
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
                    api_key=options.remote_api_key,
                    progress=progress,
                )
            )
            runners[-1].check_tokenizer(runners[0].label)
        check_tokenizers([(runner.label, runner.model) for runner in runners if runner.model is not None])
        if template is not None:
            override_template(runners, template)
        elif not options.jinja:  # each local model's own, as llama.cpp's formatter recognises it
            for runner in runners:
                own = chat_template(runner) if isinstance(runner, Runner) else None
                if own is not None:
                    override_template([runner], without_jinja(own))
    except BaseException:
        close_all([runner for runner in runners if runner is not reuse])
        raise
    return runners


def model_refs(options: ModelOptions, catalog: registry.Catalog | None = None) -> tuple[str, ...]:
    """The models a run names, smallest first, as given (an alias, a path, a server's address): --models,
    or --small and --large, the catalog's pair where one is not given (``catalog``: read if None)."""
    if options.models:
        return options.models
    catalog = catalog or registry.load_catalog(options.models_file)
    return (options.small or catalog.small, options.large or catalog.large)


def model_labels(options: ModelOptions, progress: Callable[[str], None] | None = None) -> tuple[str, ...]:
    """What each model of a run is called (``Runner.label``), smallest first, none of them loaded: a local
    file's name (an alias's file fetched where it is not yet), a server's address."""
    catalog = registry.load_catalog(options.models_file)
    return tuple(
        remote_label(ref)
        if is_remote(ref)
        else model_label(
            registry.resolve(ref, catalog, allow_download=options.allow_download, progress=progress), ref
        )
        for ref in model_refs(options, catalog)
    )


class ModelFile(NamedTuple):
    """A local model as the bench's results record it, known before it loads: its label and size, and
    where it is (its header read for the context it will get)."""

    label: str
    bytes: int
    path: Path


def model_label(path: Path, ref: str) -> str:
    """What a local model is called (``Runner.label``): its file's name, or for another tool's model the
    reference (an ollama blob's name is a digest)."""
    return ref if is_user_model(ref) else path.name


def _load(path: Path, role: str, options: ModelOptions, ref: str) -> Runner:
    runner = Runner(
        path,
        name=role,
        n_ctx=options.n_ctx,
        n_batch=options.n_batch,
        n_ubatch=options.n_ubatch,
        n_threads=options.threads,
        n_threads_batch=options.threads_batch,
        n_gpu_layers=options.n_gpu_layers,
        repack=options.repack,
        cache_types=options.cache_types(role),
        flash_attn=options.flash_attn,
        load_mode=options.load_mode,
    )
    runner.label = model_label(path, ref)
    return runner


def check_grammar(
    runners: Sequence[Runner], policy_options: PolicyOptions, grammar: str, option: str
) -> None:
    """A usage error, naming ``option`` (--grammar, --json-schema), for a grammar this run cannot follow:
    one llama.cpp cannot parse, a model on a llama-server (no grammar reaches it), a step that takes
    tokens back (a grammar cannot). Checked before the answer, which it binds whichever model writes."""
    remote = next((runner for runner in runners if isinstance(runner, RemoteRunner)), None)
    if remote is not None:
        message = (
            f"{option} needs every model local: a grammar cannot reach the llama-server {cut(remote.label)}"
        )
        raise EadError(message, exit_code=2)
    step = policy_options.takes_tokens_back()
    if step is not None:
        raise EadError(f"{option} cannot go with {step}: a grammar cannot take a token back", exit_code=2)
    try:
        runners[0].grammars.check(grammar)
    except EadError as error:
        raise EadError(f"{option}: {error}", exit_code=2) from None


def build_decoder(
    runners: Sequence[Runner],
    policy_options: PolicyOptions,
    generation: GenerationOptions,
    *,
    entropy: str = "exact",
) -> Decoder | SpeculativeDecoder:
    """A decoder over loaded runners; invalid policy values become a one-line usage error. ``entropy``
    "needed": where nothing shows each token's entropy (plain text, the bench), only the steps whose
    decision needs its value measure it (``Decoder``); the tokens and decisions are the same.
    ``generation``'s logit bias is taken as checked: the command line's once its models load
    (``check_biased_tokens``), a request's when it arrives."""
    roles = [runner.name for runner in runners]
    served = runners[-1].label if isinstance(runners[-1], RemoteRunner) else None
    policy_options = runnable_policy(policy_options, len(runners), served)
    verify = policy_options.verify if policy_options.mode == "ead" else None  # a switching option
    # before the branch: a budget with spec is refused too
    budget = reasoning_budget_for(runners[0], policy_options, generation)
    max_tokens = answer_limit(generation.max_tokens, context_size(runners))  # -1: to the context's end
    sampling = generation.sampling
    chain_only = sampling.chain_only
    if chain_only is not None and policy_options.mode == "spec":
        message = f"{chain_only} cannot go with --mode spec: its acceptance test needs a distribution"
        raise EadError(message, exit_code=2)
    if chain_only is not None and any_remote(runners):
        raise EadError(f"{chain_only} runs in a local model's chain: {REMOTE_ROW}", exit_code=2)
    step = policy_options.takes_tokens_back()
    if chain_only == "--mirostat" and step is not None:
        raise EadError(f"--mirostat cannot go with {step}: {MIROSTAT_NO_ROLLBACK}", exit_code=2)
    if generation.ignore_eos:  # the models' end-of-generation ids are one set: the tokenizer check's
        sampling = replace(sampling, banned=tuple(sorted(end_of_generation(runners[0]))))
    try:
        if policy_options.mode == "spec":
            return SpeculativeDecoder(
                runners,
                roles,
                sampling,
                draft=policy_options.draft,
                entropy_stop=policy_options.draft_entropy_stop,
                max_tokens=max_tokens,
                stop=generation.stop,
                min_indent=generation.min_indent,
                newline_time_limit_ms=generation.newline_time_limit_ms,
                lookup=policy_options.lookup,
                lookup_draft=policy_options.lookup_draft,
            )
        return Decoder(
            runners,
            roles,
            policy_options.make_policy(),
            sampling,
            max_tokens=max_tokens,
            stop=generation.stop,
            min_indent=generation.min_indent,
            newline_time_limit_ms=generation.newline_time_limit_ms,
            normalize=policy_options.normalize,
            verify=verify,
            fallback=generation.fallback,
            lookup=policy_options.lookup,
            lookup_draft=policy_options.lookup_draft,
            entropy=entropy,
            reasoning_budget=budget,
            thinking_tags=block_tags(runners[0]) if generation.sampling.grammar is not None else None,
        )
    except ValueError as error:
        raise EadError(str(error), exit_code=2) from None


def reasoning_budget_for(
    runner: Runner,
    policy_options: PolicyOptions,
    generation: GenerationOptions,
    asked_as: str = "--reasoning-budget",
) -> ReasoningBudget | None:
    """llama.cpp's ``--reasoning-budget N`` (N > 0) for a thinking model's answer (a template that names
    ``</think>``: the smallest model's, which is local), its tags and message as ``runner`` spells them;
    None for -1 and 0 (the template's), or a model that does not think. A usage error, naming the budget
    as it was asked for (``asked_as``: ead serve's request field), where a step takes tokens back, which
    could not take a forced token back. A grammar goes with it: it binds what follows the block
    (``block_tags``), so the forced tokens are written before it binds."""
    budget = generation.reasoning_budget
    tags = block_tags(runner)
    if budget <= 0 or tags is None:
        return None
    step = policy_options.takes_tokens_back()
    if step is not None:
        message = f"{asked_as} {budget} cannot go with {step}: a forced </think> cannot be taken back"
        raise EadError(message, exit_code=2)
    text = generation.reasoning_budget_message
    message_tokens = runner.tokenize(text, add_special=False) if text else []
    forced = message_tokens + list(tags.end)
    return ReasoningBudget(tags.start, [tags.end], forced, budget, runner.token_bytes)


def block_tags(runner: Runner) -> BlockTags | None:
    """A thinking model's block tags as ``runner`` spells them (a template that names ``</think>``);
    None for a model that does not think. A grammar binds such a model's answer after its block."""
    if not thinks(runner.chat_template):
        return None
    start, end = (tuple(runner.tokenize(tag, add_special=False)) for tag in (OPEN, CLOSE))
    return BlockTags(start, end)


def runnable_policy(policy_options: PolicyOptions, levels: int, served: str | None) -> PolicyOptions:
    """``policy_options`` for ``levels`` models, a usage error where they cannot run on them: speculative
    decoding over more than two, --verify or speculative decoding with the largest on a llama-server
    (``served``: its address; None: a local file). Needs no model loaded: ``ead bench`` checks each of its
    strategies so before its models load, ``build_decoder`` each decoder."""
    policy_options = replace(policy_options, levels=levels)
    verify = policy_options.verify if policy_options.mode == "ead" else None  # a switching option
    if served is not None and (verify is not None or policy_options.mode == "spec"):
        raise EadError(
            f"{cut(served)}: --verify and speculative decoding need logits at every position of a "
            "batch, which llama-server does not return; use a local model as the largest",
            exit_code=2,
        )
    return policy_options


def unused_options(
    model_options: ModelOptions,
    policy_options: PolicyOptions,
    generation: GenerationOptions,
    runners: Sequence[Runner | RemoteRunner],
    *,
    settled: bool,
    hide_thinking: bool = False,
) -> dict[str, str]:
    """The options given that this run leaves unused (flag: what leaves it so), to be said in one note,
    not refused (one command line serves every mode): the small model the large one's mode never lets
    write (--small, or --models but the last, and its KV cache types; one that reads the prompt for a
    llama-server is used), a thinking model's options (``hide_thinking``: --hide-thinking given) where
    the template has no block, and --fallback small where no model on a llama-server writes.
    ``settled``: the options hold for the whole run (generate), so its mode's, policy's and greedy
    decoding's unused ones too; chat's commands and serve's requests may change those, and use them then."""
    unused: dict[str, str] = {}
    mode = policy_options.named_mode()
    if policy_options.mode == "large" and not isinstance(runners[-1], RemoteRunner):
        small, smaller_models = SMALL_MODEL_FLAGS
        if model_options.small is not None:
            unused[small] = mode
        elif model_options.models:
            unused[smaller_models] = mode
        for flag in ("--cache-type-k-draft", "--cache-type-v-draft"):
            if model_options.cache_flags()[flag] != DEFAULT_CACHE_TYPE:
                unused[flag] = mode
    if settled:
        unused |= policy_options.unused(generation.sampling)
    given = set(policy_options.given)
    if not thinks(runners[0].chat_template):  # the smallest renders every prompt
        no_block = "a chat template without a thinking block"
        unused |= {OPTIONS[name].flag: no_block for name in THINKING_OPTIONS if name in given}
        if hide_thinking:
            unused["--hide-thinking"] = no_block
    if "fallback" in given:
        writers = {"small": runners[:1], "large": runners[-1:]}.get(policy_options.mode, runners)
        if not any_remote(runners):
            unused[OPTIONS["fallback"].flag] = "no model on a llama-server"
        elif settled and not any_remote(writers):
            unused[OPTIONS["fallback"].flag] = mode
    return unused


# A thinking model's options (option_table's names): a template without a thinking block leaves them unused
THINKING_OPTIONS = ("reasoning_budget", "reasoning_budget_message", "reasoning_format")


def check_biased_tokens(generation: GenerationOptions, runners: Sequence[Runner]) -> None:
    """A usage error for a --logit-bias token past the vocabulary the models share (llama-cli's -l
    drops such a bias without a word): once, when a command's models have loaded, not per decoder (ead
    serve builds one a request)."""
    biased = (token for token, _ in generation.sampling.logit_bias)
    message = unknown_token(biased, runners[0].n_vocab, "--logit-bias")
    if message is not None:
        raise EadError(message, exit_code=2)


def close_all(runners: Sequence[Runner]) -> None:
    for runner in runners:
        runner.close()

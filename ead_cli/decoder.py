"""The decoding loops: models take turns on one token list, as a policy decides; events stream out.

``Decoder`` is entropy-adaptive decoding: a policy picks the model for each token. ``SpeculativeDecoder``
is the lossless baseline over the same runners: the small model drafts, the large one verifies the
draft in one batch and keeps the longest prefix it agrees with. Both yield the same events and
summaries, so every comparison shares every line of model code.

Over 600 lines on purpose: both loops, their shared base (token list, stops, counters, the summary) and
the events and summary they yield belong together; apart, each piece would be read only beside the others.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from .entropy import EntropyMeter, max_entropy_bits
from .lookup import propose
from .options import check_draft, check_lookup, check_verify_ratio
from .policies import Fixed, Policy
from .prompt import context_size
from .remote import RemoteError
from .response import Response
from .runner import Runner, RunnerStats
from .sampling import DryPenalty, GrammarRefusal, Sampler, SamplingParams, probabilities
from .text import TextStream
from .thinking import BlockTags, Matcher, ReasoningBudget

if TYPE_CHECKING:
    import llama_cpp


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. ``entropy`` is what the policy observed at this step (bits, or a fraction
    of log2|V| with normalisation); ``rolling`` is the policy's rolling mean after it; ``tau`` the
    policy's threshold after it (it moves with an adaptive range; None without a policy); ``text`` is
    the text this token releases (whole characters; stop-string candidates are held back). With
    ``Decoder(entropy="needed")`` a step whose decision did not need the entropy shows NaN for both."""

    index: int
    token: int
    text: str
    model: str
    entropy: float
    rolling: float
    tau: float | None = None


@dataclass(frozen=True)
class ModelReport:
    """What one model did in a generation."""

    role: str
    path: str
    params: int
    written: int
    prefill_tokens: int
    prefill_s: float
    decode_tokens: int
    decode_s: float
    catchup_tokens: int
    catchup_s: float
    flops: float
    requests: int = 0  # a remote model: HTTP requests, seconds waiting for them, bytes, server compute
    network_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    server_s: float = 0.0
    guessed: int = 0  # --lookup: tokens read as a guess, and how many the text then followed
    guessed_kept: int = 0


@dataclass(frozen=True)
class Summary:
    """Figures for a whole generation. ``switches``: how often the writing model changed. ``param_cost``
    is the paper's metric: sum over models of tokens written x parameters, over (all tokens x the
    largest model's parameters). ``drafted`` and ``acceptance_rate`` are for speculative decoding
    (0 and None otherwise). With ``--verify``: ``checked`` small-model tokens the large one checked
    on catch-up, ``rollbacks`` the times it rejected one, ``rolled_back`` the tokens thrown away
    then (their compute stays in ``flops`` and the seconds)."""

    finish_reason: str
    prompt_tokens: int
    generated: int
    switches: int
    large_share: float
    param_cost: float
    flops: float
    wall_s: float
    tokens_per_s: float
    models: tuple[ModelReport, ...]
    drafted: int = 0
    acceptance_rate: float | None = None
    checked: int = 0
    rollbacks: int = 0
    rolled_back: int = 0
    fallback: str | None = None  # why a remote model was dropped mid-answer (--fallback)
    looked_up: int = 0  # lookup drafts (--lookup): tokens proposed, and the share the large model kept
    lookup_acceptance: float | None = None

    @classmethod
    def of(
        cls,
        models: Sequence[ModelReport],
        *,
        finish_reason: str,
        prompt_tokens: int,
        generated: int,
        wall_s: float,
        switches: int = 0,
        drafted: int = 0,
        accepted: int = 0,
        checked: int = 0,
        rollbacks: int = 0,
        rolled_back: int = 0,
        fallback: str | None = None,
        looked_up: int = 0,
        looked_up_accepted: int = 0,
    ) -> Summary:
        """A generation's figures, the derived ones (shares, cost, FLOPs, rates) from the per-model
        reports, the last of which is the largest model's; ``accepted`` of ``drafted`` the acceptance."""
        weighted = sum(report.written * report.params for report in models)
        largest = max(report.params for report in models)
        return cls(
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            generated=generated,
            switches=switches,
            large_share=models[-1].written / generated if generated else 0.0,
            param_cost=weighted / (generated * largest) if generated else 0.0,
            flops=sum(report.flops for report in models),
            wall_s=wall_s,
            tokens_per_s=generated / wall_s if wall_s else 0.0,
            models=tuple(models),
            drafted=drafted,
            acceptance_rate=accepted / drafted if drafted else None,
            checked=checked,
            rollbacks=rollbacks,
            rolled_back=rolled_back,
            fallback=fallback,
            looked_up=looked_up,
            lookup_acceptance=looked_up_accepted / looked_up if looked_up else None,
        )


def _network(runner: Runner) -> dict[str, float]:
    """A remote runner's network figures for its report (a local one has none)."""
    network = getattr(runner, "network", None)
    if network is None:
        return {}
    return {
        "requests": network.requests,
        "network_s": network.seconds,
        "bytes_sent": network.bytes_sent,
        "bytes_received": network.bytes_received,
        "server_s": network.server_s,
    }


class _Generation:
    """What both loops share: the token list, stop conditions, counters and the summary."""

    def __init__(
        self,
        runners: Sequence[Runner],
        roles: Sequence[str],
        sampling: SamplingParams,
        *,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        min_indent: int = 0,
        newline_time_limit_ms: int = 0,
    ) -> None:
        self.runners = tuple(runners)
        self.roles = tuple(roles)
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.min_indent = min_indent
        self.newline_time_limit_ms = newline_time_limit_ms
        self._first_token_at = 0.0
        self.tokens: list[int] = []
        self._n_ctx = context_size(self.runners)  # asked every token
        self._written = [0] * len(self.runners)
        self._prompt_len = 0
        self._generated = 0
        self._switches = 0
        self._drafted = 0
        self._accepted = 0
        self._looked_up = 0  # lookup drafts' tokens, and how many the large model accepted
        self._looked_up_accepted = 0
        self._checked = 0
        self._rollbacks = 0
        self._rolled_back = 0
        self._last_writer = -1
        self._finish = "interrupted"
        self._started = 0.0
        self._ended: float | None = None
        self._text = TextStream(self.stop, self.min_indent)
        self.last_event: TokenEvent | None = None
        self.fallback_reason: str | None = None

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def _begin(self, prompt: Sequence[int]) -> list[int]:
        self.tokens = list(prompt)
        self._prompt_len = len(self.tokens)
        self._text = TextStream(self.stop, self.min_indent)
        self._started, self._ended, self._finish = perf_counter(), None, "interrupted"
        self._generated, self._switches, self._drafted, self._accepted = 0, 0, 0, 0
        self._looked_up, self._looked_up_accepted = 0, 0
        self._checked, self._rollbacks, self._rolled_back = 0, 0, 0
        self._last_writer = -1
        self._written = [0] * len(self.runners)
        self.last_event = None
        for runner in self.runners:
            runner.align(self.tokens)
            runner.stats = RunnerStats.empty()
        return self.tokens

    def _emit(
        self, token: int, writer: int, entropy: float, rolling: float, tau: float | None = None
    ) -> TokenEvent:
        """Append a token and announce it."""
        self.tokens.append(token)
        return self._announce(token, writer, entropy, rolling, tau)

    def _announce(
        self, token: int, writer: int, entropy: float, rolling: float, tau: float | None = None
    ) -> TokenEvent:
        """The event for the next generated token (already in ``tokens``); set the finish reason if it
        ends the generation (check ``self.finished``).

        The counts change together with ``last_event``, after every call, so a Ctrl-C (raised between
        calls) never leaves a token counted that the caller cannot show: it shows ``last_event`` if
        it had not got to it.
        """
        index = self._generated
        runner = self.runners[writer]
        if not index:
            self._first_token_at = perf_counter()
        piece = self._text.push(runner.token_bytes(token))
        finish = self._finish
        if runner.is_end_of_generation(token) or (self._text.stopped and not self._text.cut_short):
            finish = "stop"
        elif (
            self._text.cut_short
            or index + 1 >= self.max_tokens
            or self._prompt_len + index + 1 > self.n_ctx
            or self._out_of_time(piece)
        ):
            finish = "length"
        if finish != "interrupted":
            piece += self._text.flush()
        event = TokenEvent(index, token, piece, self.roles[writer], entropy, rolling, tau)
        self._written[writer] += 1
        if index and writer != self._last_writer:
            self._switches += 1
        self._last_writer = writer
        self._finish = finish
        self._generated = index + 1
        self.last_event = event
        return event

    def _out_of_time(self, piece: str) -> bool:
        """Whether a token that released ``piece`` ends the answer by ``newline_time_limit_ms``: it
        writes a newline and the limit has passed since the first token (llama-server's
        t_max_predict_ms, which ends a completion at a line's end once its time is up)."""
        if not self.newline_time_limit_ms or "\n" not in piece:
            return False
        return (perf_counter() - self._first_token_at) * 1000 > self.newline_time_limit_ms

    def _may_end(self, token: int, writer: int) -> bool:
        """Whether the next generated token ``token`` may end the answer: ``_announce`` decides."""
        count = self._generated + 1
        return (
            bool(self.stop)
            or bool(self.min_indent)
            or bool(self.newline_time_limit_ms)
            or count >= self.max_tokens
            or self._prompt_len + count > self.n_ctx
            or self.runners[writer].is_end_of_generation(token)
        )

    @property
    def finished(self) -> bool:
        return self._finish != "interrupted"

    def _end(self) -> None:
        self._ended = perf_counter()

    def generate(self, prompt: Sequence[int]) -> Response[TokenEvent, Summary]:
        """``run`` as a Response: the events, the text, the summary (also after an interrupt)."""
        return Response(self.run(prompt), self.summary, lambda: self.last_event)

    def summary(self) -> Summary:
        """Figures so far; valid after an interrupted run too (finish reason 'interrupted')."""
        end = self._ended if self._ended is not None else perf_counter()
        wall = max(end - self._started, 1e-9) if self._started else 0.0
        reports = tuple(
            ModelReport(
                role=role,
                path=runner.location,
                params=runner.n_params,
                written=written,
                prefill_tokens=runner.stats.prefill.tokens,
                prefill_s=runner.stats.prefill.seconds,
                decode_tokens=runner.stats.decode.tokens,
                decode_s=runner.stats.decode.seconds,
                catchup_tokens=runner.stats.catchup.tokens,
                catchup_s=runner.stats.catchup.seconds,
                guessed=runner.stats.guessed,
                guessed_kept=runner.stats.guessed_kept,
                flops=runner.flops(),
                **_network(runner),
            )
            for role, runner, written in zip(self.roles, self.runners, self._written, strict=True)
        )
        return Summary.of(
            reports,
            generated=self._generated,
            wall_s=wall,
            accepted=self._accepted,
            finish_reason=self._finish,
            prompt_tokens=self._prompt_len,
            switches=self._switches,
            drafted=self._drafted,
            looked_up=self._looked_up,
            looked_up_accepted=self._looked_up_accepted,
            checked=self._checked,
            rollbacks=self._rollbacks,
            rolled_back=self._rolled_back,
            fallback=self.fallback_reason,
        )


ENTROPY_MODES = ("exact", "needed")


class _BudgetedSampler:
    """A sampler under a reasoning budget: the budget's forced tokens are written in place of a draw, and
    every token written is told to it. Never greedy, so that the loop asks it at every step; the loop
    takes no token back where it is used (``engine.build_decoder`` refuses the steps that do)."""

    greedy = False

    def __init__(self, sampler: Sampler, budget: ReasoningBudget) -> None:
        self._sampler, self._budget = sampler, budget

    def sample(
        self,
        ctx: llama_cpp.llama_context_p | None,
        logits: np.ndarray,
        index: int = -1,
        tokens: Sequence[int] = (),
    ) -> int:
        """The forced token, if the budget forces one, else the sampler's draw."""
        token = self._budget.forced_token
        if token is None:
            token = self._sampler.sample(ctx, logits, index, tokens)
        self._budget.accept(token)
        return token

    def close(self) -> None:
        self._sampler.close()


class _GrammarAfterThinking:
    """A grammar that binds a thinking model's answer after its block, as llama-server's binds what
    follows ``</think>`` (its grammar also holds the block to whole UTF-8 characters and lets whitespace
    come before the answer; this leaves the block free: docs/serve.md): the block, opened by the prompt
    or by the answer's first token, is written by ``free`` (a reasoning budget's forcing included), and
    from its end tag on, drawn or forced, a fresh grammar-bound sampler writes the rest (bound as an answer
    without a block is: from its opening, where ``_GrammarOnOpening`` binds it). An answer whose first
    token opens no block is bound from that token, as without a block. A block opens only at the
    answer's start: after a prefill (the start of the value the grammar binds) the bound sampler draws
    the first token, once; at the start ``free`` draws it to know whether it opens one (as it would
    without a grammar), and where it does not, the bound sampler, whose chain and random stream are its
    own, draws it again from the same row, as without a block (one draw would change the token)."""

    greedy = False

    def __init__(
        self,
        free: Sampler | _BudgetedSampler,
        bound: Callable[[tuple[int, ...]], Sampler | _GrammarOnOpening],
        tags: BlockTags,
        prompt: Sequence[int],
        prefill: tuple[int, ...],
    ) -> None:
        self._free, self._tags, self._end = free, tags, Matcher([tags.end])
        self._new_bound = bound
        try:  # None while the answer is inside the block; else the prefill is the answer's start
            self._bound = None if tags.left_open(prompt) else bound(prefill)
        except BaseException:
            free.close()
            raise
        # the answer's start is to come, where the first token may open the block: not after a prefill
        self._first = self._bound is not None and not prefill

    def sample(
        self,
        ctx: llama_cpp.llama_context_p | None,
        logits: np.ndarray,
        index: int = -1,
        tokens: Sequence[int] = (),
    ) -> int:
        """A draw inside the block is free, its end tag binds the rest; the first token may open one."""
        if self._bound is None:
            token = self._free.sample(ctx, logits, index, tokens)
            if self._end.advance(token) is not None:
                self._bound = self._new_bound(())  # nothing of the answer yet: a prefill was thinking
            return token
        if self._first:
            self._first = False
            token = self._free.sample(ctx, logits, index, tokens)
            if (token,) == self._tags.start:
                self._bound.close()
                self._bound = None
                return token
        return self._bound.sample(ctx, logits, index, tokens)

    def close(self) -> None:
        self._free.close()
        if self._bound is not None:
            self._bound.close()


class _GrammarOnOpening:
    """A grammar that binds the answer once its text opens what it binds (``SamplingParams.grammar_opening``,
    ead serve's bare tool calls: text no token opens, so llama.cpp's token trigger cannot see it). Until
    then ``free`` draws, as it would without this (its own lazy grammar binding from its token), so an
    answer that never opens it is the same token for token; from the token that completes the opening, a
    fresh sampler that follows the answer from its start (the prefill's tokens, then those drawn; a
    thinking model's, from its block's end: ``_GrammarAfterThinking``) draws the rest. Where the text
    cannot open it, or the grammar rules out a token already written (one that went on past the opening
    with text it rules out: llama.cpp's pattern trigger would abort there), the answer stays free."""

    greedy = False

    def __init__(
        self,
        free: Sampler | _BudgetedSampler,
        bound: Callable[[tuple[int, ...]], Sampler],
        opening: Callable[[str], bool | None],
        prefill: tuple[int, ...],
        token_bytes: Callable[[int], bytes],
    ) -> None:
        self._free, self._new_bound, self._opening, self._token_bytes = free, bound, opening, token_bytes
        self._bound: Sampler | None = None
        self._written: list[int] | None = list(prefill)  # the answer's tokens; None once decided
        try:
            self._decide()  # the prefill may open it already
        except BaseException:
            free.close()
            raise

    def sample(
        self,
        ctx: llama_cpp.llama_context_p | None,
        logits: np.ndarray,
        index: int = -1,
        tokens: Sequence[int] = (),
    ) -> int:
        """The bound sampler's draw once the text opened the grammar, else the free one's."""
        if self._bound is not None:
            return self._bound.sample(ctx, logits, index, tokens)
        token = self._free.sample(ctx, logits, index, tokens)
        if self._written is not None:
            self._written.append(token)
            self._decide()
        return token

    def _decide(self) -> None:
        """Bind the answer if its text so far opens the grammar; stop asking once that is settled."""
        assert self._written is not None
        written = tuple(self._written)
        opens = self._opening(b"".join(map(self._token_bytes, written)).decode("utf-8", "ignore"))
        if opens is None:
            return
        self._written = None
        if opens:
            # a token already written may go past the opening with text the grammar rules out: free
            with contextlib.suppress(GrammarRefusal):
                self._bound = self._new_bound(written)

    def close(self) -> None:
        self._free.close()
        if self._bound is not None:
            self._bound.close()


class Decoder(_Generation):
    """Entropy-adaptive decoding: at each step the policy's active model is evaluated, its entropy
    observed, and the policy names the model that writes the token. Runners are ordered from the
    smallest to the largest; ``roles`` names them ("small", "large").

    ``verify`` (a ratio in (0, 1]): the largest model checks the other models' tokens when it catches
    up on them, from logits at each caught-up position that the catch-up batch computes anyway. A
    token whose probability there is below ``verify`` x the top probability is rejected: both caches
    roll back to it and the largest model writes that position itself. Tokens wait, unshown, until
    they are checked: when the largest model next takes over, when the answer ends, or once
    ``check_every`` of them wait, which bounds both the delay before text appears and the work one
    rejection throws away. Every token shown has been checked. The policy's window is not rewound.

    ``lookup`` (a minimum match length, 0: off): the model evaluated at a step also reads a guess of up to
    ``lookup_draft`` next tokens copied from earlier in the sequence (``lookup.py``), in the same batch;
    while the text follows the guess, its next steps take their rows from that batch instead of a decode
    (``Runner.sync``). Entropy, policy and sampler see every row as in a one-token step, so the text is
    the same policy's text without lookup, up to batched kernels' rounding at near-ties.

    ``entropy``: ``"exact"`` measures every step's entropy (each event shows it); ``"needed"`` measures
    it only where the policy's decision needs the value (``Policy.settled``): a single model's loop
    never, a gate (window 1) not where cheap bounds already put it on one side of every tau
    (``EntropyMeter.settle``: the exact sums over the logits within 20 nats of the top, as a real
    model's rows have a few thousand of, or the row's minimum for a near-uniform row). The tokens and
    every decision are the same (the bounds are widened by the exact pass's own float32 tolerance);
    events show NaN for the entropy and the rolling mean of a step not measured.

    ``thinking_tags`` (a thinking model's block tags, given with a grammar): the grammar binds only what
    follows the block, which is written free (``_GrammarAfterThinking``). The sampling's
    ``grammar_opening`` binds the answer (after the block, with them) once its text opens the grammar
    (``_GrammarOnOpening``).
    """

    def __init__(
        self,
        runners: Sequence[Runner],
        roles: Sequence[str],
        policy: Policy,
        sampling: SamplingParams,
        *,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        min_indent: int = 0,
        newline_time_limit_ms: int = 0,
        normalize: bool = False,
        verify: float | None = None,
        check_every: int = 32,
        fallback: bool = False,
        lookup: int = 0,
        lookup_draft: int = 16,
        entropy: str = "exact",
        reasoning_budget: ReasoningBudget | None = None,
        thinking_tags: BlockTags | None = None,
    ) -> None:
        check_lookup(lookup)
        check_draft(lookup_draft, "--lookup-draft")
        if entropy not in ENTROPY_MODES:
            raise ValueError(f"entropy must be one of {', '.join(ENTROPY_MODES)}, got {entropy!r}")
        if verify is not None:
            check_verify_ratio(verify)
        if check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {check_every}")
        limits = {"min_indent": min_indent, "newline_time_limit_ms": newline_time_limit_ms}
        super().__init__(runners, roles, sampling, max_tokens=max_tokens, stop=stop, **limits)
        self.policy = policy
        self.check_every = check_every
        self._needed_only = entropy == "needed"
        self._entropy_scale = 1.0 / max_entropy_bits(self.runners[0].n_vocab) if normalize else 1.0
        self._checker = len(self.runners) - 1 if verify is not None and len(self.runners) > 1 else -1
        self._log_ratio = math.log(verify) if verify is not None else 0.0
        self._held: list[tuple[int, int, float, float, float | None]] = []  # unchecked _announce arguments
        self._preview: TextStream | None = None  # the text with the held tokens: finds stop strings early
        self._sampler: Sampler | _BudgetedSampler | _GrammarAfterThinking | _GrammarOnOpening | None = None
        self._dry: DryPenalty | None = None  # an answer's, where DRY is on
        self._reads_ahead = False  # a runner launches reads ahead (a GPU): see _observe
        self._unmeasured: tuple[EntropyMeter, float] | None = None  # an exact pass left for after a launch
        self.fallback = fallback
        self.lookup = lookup
        self.lookup_draft = lookup_draft
        self.reasoning_budget = reasoning_budget  # None: the plain loop, no per-token work
        self.thinking_tags = thinking_tags  # a thinking model's: a grammar binds what follows its block
        # Told every token the loop samples, with the logits it was drawn from (ead serve's logprobs;
        # without rollbacks, the order of the tokens shown).
        self.on_sample: Callable[[int, np.ndarray], None] | None = None

    def run(self, prompt: Sequence[int]) -> Iterator[TokenEvent]:
        """Generate from the prompt's token ids, yielding one event per token.

        A remote model that fails mid-answer ends the run with a RemoteError (finish reason "error"),
        or, with ``fallback``, leaves the rest of the answer to the smallest model (``fallback_reason``
        says why; the summary reports it)."""
        tokens = self._begin(prompt)
        prompt_len = len(tokens)
        self._held, self._preview = [], None
        grammars = self.runners[0].grammars if self.sampling.grammar is not None else None  # it is local
        needs_vocab = self.sampling.infill or self.sampling.mirostat == 1
        vocab = self.runners[0].vocab if needs_vocab else None  # local, as for the grammars
        dry = DryPenalty(self.sampling, self.runners[0].vocab, self.n_ctx) if self.sampling.dry_on else None
        self._dry = dry
        tags = self.thinking_tags if self.sampling.grammar is not None else None
        opening = None if self.sampling.grammar is None else self.sampling.grammar_opening
        # A block is drawn free, and an answer before its text opens the grammar as without the opening
        # (bound from its trigger on, where one is given): a fresh sampler binds what a wrapper says to.
        free = replace(self.sampling, grammar=None, grammar_start=())

        def until_opened(start: tuple[int, ...]) -> SamplingParams:
            return (
                free if self.sampling.grammar_trigger is None else replace(self.sampling, grammar_start=start)
            )

        def on_opening(unopened: Sampler | _BudgetedSampler, start: tuple[int, ...]) -> _GrammarOnOpening:
            assert opening is not None
            return _GrammarOnOpening(
                unopened,
                lambda written: Sampler(
                    replace(self.sampling, grammar_start=written, grammar_trigger=None), grammars, vocab, dry
                ),
                opening,
                start,
                self.runners[0].token_bytes,
            )

        def after_block(start: tuple[int, ...]) -> Sampler | _GrammarOnOpening:
            """What draws a thinking model's answer from its block's end on, ``start`` its first tokens
            (a prefill's): the grammar, or, where an opening binds it, a sampler that stacks it."""
            if opening is None:
                return Sampler(replace(self.sampling, grammar_start=start), grammars, vocab, dry)
            return on_opening(Sampler(until_opened(start), grammars, vocab, dry), start)

        if tags is not None:
            first = free  # the block's
        elif opening is not None:
            first = until_opened(self.sampling.grammar_start)
        else:
            first = self.sampling
        sampler: Sampler | _BudgetedSampler | _GrammarAfterThinking | _GrammarOnOpening
        try:
            sampler = Sampler(first, grammars, vocab, dry)
        except BaseException:
            self._close_dry()  # a grammar's refusal of the answer's start
            raise
        if self.reasoning_budget is not None:
            self.reasoning_budget.begin(tokens)
            sampler = _BudgetedSampler(sampler, self.reasoning_budget)
        if tags is not None:
            sampler = _GrammarAfterThinking(sampler, after_block, tags, tokens, self.sampling.grammar_start)
        elif opening is not None:
            sampler = on_opening(sampler, self.sampling.grammar_start)
        self._sampler = sampler
        self._reads_ahead = any(map(self._reads_ahead_at, range(len(self.runners))))
        self.fallback_reason = None
        try:
            while True:
                try:
                    yield from self._loop(prompt_len)
                    return
                except RemoteError as error:
                    if not self.fallback or self.fallback_reason is not None:
                        self._finish = "error"
                        raise
                    self.fallback_reason = str(error)
                    self.policy = Fixed(0)
        finally:
            del tokens[prompt_len + self._generated :]  # held tokens never shown are not the answer
            self._held, self._preview = [], None
            self._measured(math.nan, math.nan)  # the policy's window holds no stand-in after a run
            for runner in self.runners:
                if isinstance(runner, Runner):
                    runner.drop_guess()
            self._end()
            sampler.close()
            self._close_dry()

    def _close_dry(self) -> None:
        if self._dry is not None:
            self._dry.close()
            self._dry = None

    def _loop(self, prompt_len: int) -> Iterator[TokenEvent]:
        """The steps: evaluate, observe, choose the writer, sample, show or hold."""
        policy, runners, sampler = self.policy, self.runners, self._sampler
        greedy = sampler.greedy
        tokens = self.tokens
        last_writer = -1
        while len(tokens) - prompt_len < self.max_tokens:
            evaluated = policy.active
            # A generator only where a check is due: the common step syncs with a plain call.
            logits = (
                (yield from self._logits(evaluated, last_writer))
                if self._check_due(evaluated)
                else self._sync(evaluated, last_writer)
            )
            if logits is not None:
                best = int(logits.argmax()) if greedy else -1  # the greedy token; the max for the entropy
                writer, entropy, rolling = self._observe(evaluated, logits, best)
                while policy.escalating:  # a cascade asks the next model up at this same step
                    evaluated = writer
                    logits = yield from self._logits(evaluated, last_writer)
                    best = int(logits.argmax()) if greedy else -1
                    writer, entropy, rolling = self._observe(evaluated, logits, best)
                if writer != evaluated:
                    logits = (
                        (yield from self._logits(writer, last_writer))
                        if self._check_due(writer)
                        else self._sync(writer, last_writer)
                    )
                    best = int(logits.argmax()) if greedy and logits is not None else -1
            if logits is None:  # a rollback: the checker has written the rejected position itself
                last_writer = self._checker
                if self.finished:
                    return
                continue
            last_writer = writer
            if best < 0:  # llama.cpp's sampler reads the row it is told: a confirmed guess's, not the last
                token = sampler.sample(runners[writer].ctx, logits, runners[writer].logits_row, tokens)
            else:
                token = best
            if self.on_sample is not None:
                self.on_sample(token, logits)
            self._tell_policy(token, writer)
            tau = policy.tau
            if not policy.holding and (self._checker < 0 or writer == self._checker):
                if self._held:  # a decided lookahead draft goes first
                    yield from self._release(len(self._held))
                if not self.finished:
                    tokens.append(token)
                    # The next read goes first where the token cannot end the answer; else the text
                    # says whether it does (an end token, a stop string, the length) before it goes.
                    ahead = not self._may_end(token, writer)
                    if ahead:
                        self._read_ahead(writer)
                    shown = self._announce(token, writer, *self._measured(entropy, rolling), tau)
                    if not ahead:
                        self._read_ahead(writer)
                    yield shown
            else:
                must_check = self._hold(token, writer, *self._measured(entropy, rolling), tau)
                taken_back = policy.take_back(must_check)
                if taken_back:
                    self._truncate(len(self.tokens) - taken_back)
                    last_writer = -1
                elif self._checker < 0:
                    if not policy.holding:
                        yield from self._release(len(self._held))
                elif must_check and (yield from self._check()):
                    last_writer = self._checker
            if self.finished:
                return
        self._finish = "length"

    def _observe(self, index: int, logits: np.ndarray, best: int) -> tuple[int, float, float]:
        """Model ``index``'s entropy at this row, told to the policy: (the writer, the entropy and the
        rolling mean the event shows). ``best``: the row's argmax, or -1 (then the meter finds the max).
        In ``"needed"`` mode a step the policy settles without the value is not measured (NaN)."""
        policy, runner, scale = self.policy, self.runners[index], self._entropy_scale
        meter = runner.entropy
        if not isinstance(meter, EntropyMeter):  # a remote model's estimate (or a test's stand-in)
            entropy = meter(logits) * scale
            return policy.observe(entropy), entropy, policy.rolling
        top = logits[best] if best >= 0 else None
        if self._needed_only and policy.may_settle:
            if policy.settled(0.0, max_entropy_bits(logits.shape[0]) * scale):  # never read: no bound needed
                return policy.observe(0.0), math.nan, math.nan
            if top is None:
                top = logits.max()
            low = meter.settle(logits, top, policy.settled, scale)
            if low is not None:
                return policy.observe(low), math.nan, math.nan
        elif (
            self._reads_ahead
            and policy.may_settle
            and policy.settled(0.0, max_entropy_bits(logits.shape[0]) * scale)
            and meter.shift(logits, top)
        ):
            # Shown, never read (a single model's loop): the pass's first step copied the row, which the
            # next decode overwrites; the rest runs once that decode is launched (``_measured``).
            writer = policy.observe(0.0)  # a stand-in, amended then
            self._unmeasured = meter, scale
            if writer == index and not policy.escalating and self._reads_ahead_at(policy.active):
                return writer, math.nan, math.nan
            return (writer, *self._measured(math.nan, math.nan))
        entropy = meter(logits, top) * scale
        return policy.observe(entropy), entropy, policy.rolling

    def _measured(self, entropy: float, rolling: float) -> tuple[float, float]:
        """The step's entropy and rolling mean: as given, or from the exact pass ``_observe`` left until
        the next read was launched (the policy's stand-in amended)."""
        if self._unmeasured is None:
            return entropy, rolling
        meter, scale = self._unmeasured
        self._unmeasured = None
        entropy = meter.shifted_entropy() * scale
        self.policy.amend(entropy)
        return entropy, self.policy.rolling

    def _logits(self, index: int, last_writer: int) -> Generator[TokenEvent, None, np.ndarray | None]:
        """Logits of model ``index`` for the next position; None after a rollback (see ``_check``)."""
        if self._check_due(index):
            rolled_back = yield from self._check()
            if rolled_back:
                return None
        return self._sync(index, last_writer)

    def _check_due(self, index: int) -> bool:
        """Whether model ``index`` must check held tokens before it reads on (then ``_logits``)."""
        return index == self._checker and bool(self._held)

    def _sync(self, index: int, last_writer: int) -> np.ndarray:
        """Logits of model ``index`` for the next position, when no check is due."""
        guess = self._guess if self.lookup else None
        return self.runners[index].sync(
            self.tokens, prompt_len=self._prompt_len, own_tail=last_writer == index, guess=guess
        )

    def _read_ahead(self, writer: int) -> None:
        """Launch the next step's read before this token's event is handed out, where the runner
        ``reads_ahead`` (a GPU, whose decode returns before the device is done): the event's consumers
        and the loop's own work then run while the device decodes. The next step's sync finds the
        tokens read and waits for the device there."""
        index = self.policy.active
        if self.finished or not self._reads_ahead_at(index) or self._check_due(index):
            return
        guess = self._guess if self.lookup else None
        own_tail = index == writer
        runner = self.runners[index]
        runner.read(self.tokens, prompt_len=self._prompt_len, own_tail=own_tail, guess=guess, wait=False)

    def _reads_ahead_at(self, index: int) -> bool:
        runner = self.runners[index]
        return isinstance(runner, Runner) and runner.reads_ahead

    def _guess(self) -> list[int]:
        """A lookup guess for what follows the tokens so far."""
        return propose(self.tokens, min_match=self.lookup, limit=self.lookup_draft)

    def _tell_policy(self, token: int, writer: int) -> None:
        """Policies that read text (line bursts, patterns) see each written token's text."""
        if self.policy.wants_text:
            self.policy.see(self.runners[writer].token_bytes(token).decode("utf-8", "replace"))

    def _hold(self, token: int, writer: int, entropy: float, rolling: float, tau: float | None) -> bool:
        """Keep an unchecked token back; True when it must be checked now (it ends the answer, or
        ``check_every`` tokens wait)."""
        self.tokens.append(token)
        self._held.append((token, writer, entropy, rolling, tau))
        if self._preview is None:
            self._preview = self._text.copy()
        runner = self.runners[writer]
        self._preview.push(runner.token_bytes(token))
        generated = len(self.tokens) - self._prompt_len
        return (
            (self._checker >= 0 and len(self._held) >= self.check_every)
            or runner.is_end_of_generation(token)
            or self._preview.stopped
            or generated >= self.max_tokens
            or len(self.tokens) > self.n_ctx
        )

    def _check(self) -> Generator[TokenEvent, None, bool]:
        """The checker reads the held tokens with logits at each, in batches; releases those it accepts;
        at the first it rejects, rolls every cache back and writes that position. True on a rollback."""
        tokens, checker = self.tokens, self.runners[self._checker]
        end_of_text = len(tokens)
        first = end_of_text - len(self._held)
        start = first - 1  # the row read at position start predicts position first
        limit = min(end_of_text, checker.n_ctx)  # a last token past the context is checked, never read
        while start < limit:
            end = min(limit, start + checker.n_batch)
            rows = checker.verify(tokens[:end], prompt_len=self._prompt_len, rows=end - start)
            for i in range(min(end - start, end_of_text - 1 - start)):  # the last row predicts a new token
                position = start + i + 1
                row = self.sampling.penalised(rows[i], tokens, position, self._dry)  # as a step would see it
                self._checked += 1
                if row[tokens[position]] - row.max() >= self._log_ratio:
                    continue
                yield from self._release(position - first)
                self._truncate(position)
                token = self._sampler.sample(checker.ctx, rows[i], index=i, tokens=tokens)
                entropy = checker.entropy(rows[i]) * self._entropy_scale
                self._tell_policy(token, self._checker)
                yield self._emit(token, self._checker, entropy, self.policy.rolling, self.policy.tau)
                return True
            start = end
        yield from self._release(len(self._held))
        return False

    def _truncate(self, position: int) -> None:
        """Roll back: drop every token from ``position`` on (all of them held) from the list, the
        held tokens and every cache."""
        dropped = len(self.tokens) - position
        self._rollbacks += 1
        self._rolled_back += dropped
        del self.tokens[position:]
        del self._held[len(self._held) - dropped :]
        for runner in self.runners:
            runner.truncate(position)
        self._preview = None
        if self._held:
            self._preview = self._text.copy()
            for token, writer, *_ in self._held:
                self._preview.push(self.runners[writer].token_bytes(token))

    def _release(self, count: int) -> Iterator[TokenEvent]:
        """Announce the first ``count`` held tokens: they passed the check."""
        released, self._held = self._held[:count], self._held[count:]
        if not self._held:
            self._preview = None
        for held in released:
            yield self._announce(*held)
            if self.finished:
                self._held = []
                return


class SpeculativeDecoder(_Generation):
    """Speculative decoding with runners (small, large): lossless with respect to the large model.

    Each round the small model drafts up to ``draft`` tokens (fewer if its entropy reaches
    ``entropy_stop`` bits: the entropy gate chooses the draft length, as AdaEDL does); the large model
    reads them in one batch with logits at every draft position, keeps the longest prefix it accepts and
    writes the next token itself; both caches drop the rest. Greedy (temp 0): a draft token stands if it
    is the large model's argmax, so the text equals the large model's own greedy text (up to the batched
    kernels' rounding at near-ties). Temperature > 0: the standard rejection rule (accept with probability
    min(1, p/q), else draw from max(0, p - q)), so tokens follow the large model's distribution.

    ``lookup`` (a minimum match length, 0: off): before asking the small model, a round tries a free
    draft of up to ``lookup_draft`` tokens copied from earlier in the prompt and answer (``lookup.py``);
    the large model checks it the same way (a proposal with q = 1 on its token), and its accepted tokens
    count as the large model's, since they are its own choice. The small model then catches up on them
    in one batch when it next drafts.
    """

    def __init__(
        self,
        runners: Sequence[Runner],
        roles: Sequence[str],
        sampling: SamplingParams,
        *,
        draft: int = 4,
        entropy_stop: float | None = None,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        min_indent: int = 0,
        newline_time_limit_ms: int = 0,
        lookup: int = 0,
        lookup_draft: int = 16,
    ) -> None:
        if len(runners) != 2:
            raise ValueError("speculative decoding takes exactly two models: a drafter and a verifier")
        check_draft(draft)
        check_lookup(lookup)
        check_draft(lookup_draft, "--lookup-draft")
        limits = {"min_indent": min_indent, "newline_time_limit_ms": newline_time_limit_ms}
        super().__init__(runners, roles, sampling, max_tokens=max_tokens, stop=stop, **limits)
        self.draft = draft
        self.entropy_stop = entropy_stop
        self.lookup = lookup
        self.lookup_draft = lookup_draft
        self._rng = np.random.default_rng(sampling.seed)

    def run(self, prompt: Sequence[int]) -> Iterator[TokenEvent]:
        small, large = self.runners
        tokens = self._begin(prompt)
        prompt_len = len(tokens)
        try:
            while not self.finished and self._generated < self.max_tokens:
                # Drafted tokens and the next token's row: one batch of the large model checks them all.
                room = max(
                    min(self.max_tokens - self._generated, self.n_ctx - len(tokens), large.n_batch) - 1, 0
                )
                drafts = propose(tokens, min_match=self.lookup, limit=min(self.lookup_draft, room))
                looked_up = bool(drafts)
                if looked_up:
                    draft_probs: list[np.ndarray | None] = [None] * len(drafts)
                else:
                    drafts, draft_probs, draft_entropies = self._draft(
                        small, tokens, prompt_len, min(self.draft, room)
                    )
                n = len(tokens)
                read = tokens + drafts
                rows = large.verify(read, prompt_len=prompt_len, rows=len(drafts) + 1)
                accepted, correction, entropy = self._judge(read, drafts, draft_probs, rows)
                large.truncate(n + accepted)
                small.truncate(n + accepted)
                if looked_up:
                    self._looked_up += len(drafts)
                    self._looked_up_accepted += accepted
                    draft_entropies = [large.entropy(row) for row in rows[:accepted]]
                else:
                    self._drafted += len(drafts)
                    self._accepted += accepted
                writer = 1 if looked_up else 0
                for token, token_entropy in zip(drafts[:accepted], draft_entropies, strict=False):
                    yield self._emit(token, writer, token_entropy, token_entropy)
                    if self.finished:
                        return
                yield self._emit(correction, 1, entropy, entropy)
            if not self.finished:
                self._finish = "length"
        finally:
            self._end()

    def _draft(
        self, small: Runner, tokens: list[int], prompt_len: int, count: int
    ) -> tuple[list[int], list[np.ndarray | None], list[float]]:
        """The small model's draft: tokens, the distributions they were drawn from (None when greedy),
        their entropies."""
        drafts: list[int] = []
        dists: list[np.ndarray | None] = []
        entropies: list[float] = []
        for _ in range(count):
            read = tokens + drafts
            logits = small.sync(read, prompt_len=prompt_len, own_tail=bool(drafts))
            entropy = small.entropy(logits)  # of the raw row, as every entropy ead reads
            if self.entropy_stop is not None and entropy >= self.entropy_stop and drafts:
                break
            row = self.sampling.penalised(logits, read)
            if self.sampling.temp == 0:  # greedy: no distribution needed (see _judge)
                dist, token = None, int(np.argmax(row))
            else:
                dist = probabilities(row, self.sampling)
                token = self._draw(dist)
            drafts.append(token)
            dists.append(dist)
            entropies.append(entropy)
            if small.is_end_of_generation(token):
                break
        return drafts, dists, entropies

    def _judge(
        self, read: list[int], drafts: list[int], draft_probs: Sequence[np.ndarray | None], rows: np.ndarray
    ) -> tuple[int, int, float]:
        """How many draft tokens the large model accepts, the token it writes next, and its entropy there.
        ``read``: the tokens the rows were read for, the drafts last (row i is penalised for what comes
        before draft i). A draft probability of None is a proposal certain of its token (a lookup draft:
        q = 1 there)."""
        before = len(read) - len(drafts)
        for i, (token, q) in enumerate(zip(drafts, draft_probs, strict=True)):
            row = self.sampling.penalised(rows[i], read, before + i)
            if self.sampling.temp == 0:  # p and q are one-hot: the token stands if it is the argmax
                best = int(np.argmax(row))
                if token == best:
                    continue
                return i, best, self.runners[1].entropy(rows[i])
            p = probabilities(row, self.sampling)
            q_token = 1.0 if q is None else q[token]
            if p[token] >= q_token or self._rng.random() < p[token] / q_token:
                continue
            if q is None:
                residual = p.copy()
                residual[token] = 0.0
            else:
                residual = np.maximum(p - q, 0.0)
            return i, self._draw(residual / residual.sum()), self.runners[1].entropy(rows[i])
        last = rows[len(drafts)]
        chosen = self._draw(probabilities(self.sampling.penalised(last, read), self.sampling))
        return len(drafts), chosen, self.runners[1].entropy(last)

    def _draw(self, dist: np.ndarray) -> int:
        if self.sampling.temp == 0:
            return int(np.argmax(dist))
        return int(self._rng.choice(dist.shape[0], p=dist))

"""The engine of ``ead serve``: one generation at a time on one thread, requests in FIFO order, each
token event handed back to the waiting request's asyncio queue.

llama.cpp contexts cannot be shared, so one decoder runs at a time over the runners loaded once; the
others wait in a queue with a bound, past which a request is refused at once (503).
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ..decoder import Decoder, SpeculativeDecoder, Summary, TokenEvent
from ..embedding import Embedder
from ..engine import build_decoder
from ..errors import EadError, counted
from ..options import GenerationOptions, PolicyOptions
from ..prompt import context_size
from ..remote import RemoteRunner
from ..runner import Abandoned, PromptProgress, Runner, common_prefix, never_abandoned
from ..sampling import GrammarDeadEnd
from .metrics import Metrics

PREPARE_THREADS = 2  # requests parsed, checked and tokenized at once, while one generates
Log = Callable[[str], None]  # one line per request, and one per error: never a traceback


@dataclass(frozen=True)
class Job:
    """One generation to run: the prompt's tokens, and the options it was asked with (already checked)."""

    prompt: list[int]
    policy: PolicyOptions
    generation: GenerationOptions
    logprobs: int | None = None  # None: none; else the log-probability of each token and its top N
    prefill: str = ""  # the answer's start, which the prompt ends with (an assistant prefill): read with
    # the answer for tool calls
    thinking: bool | None = None  # a thinking model's answer: split into reasoning and content (True: it
    # starts inside the block its prompt opened); None: left whole
    end_banned_by: str = "the server's --ignore-eos"  # what bans the end of generation, where it is
    # banned, as the caller gave it: a grammar's dead end names it
    echo: bool = False  # a text completion's echo: with ``logprobs``, the prompt's go first
    # (``PromptScores``), under the model that writes the answer alone (``scoring_runner``); with
    # ``max_tokens`` 0 that model reads the prompt and no answer is written


@dataclass(frozen=True)
class Logprobs:
    """A token's log-probability under the model that wrote it, and the likeliest tokens' (best first)."""

    logprob: float
    top: tuple[tuple[int, float], ...]


def logprobs_of(token: int, logits: np.ndarray, top: int) -> Logprobs:
    """From the logits the token was drawn from (the model's own distribution, before temperature). One
    row at a time: over a batch of rows at once (an echoed prompt's) numpy's temporaries of 78 MB made
    it 2-3 times slower on a 2-core EPYC."""
    values = logits.astype(np.float64)
    peak = values.max()
    normalizer = peak + math.log(np.exp(values - peak).sum())
    best = np.argpartition(-values, top)[:top] if 0 < top < len(values) else np.arange(min(top, len(values)))
    best = best[np.argsort(-values[best], kind="stable")]
    return Logprobs(
        float(values[token] - normalizer), tuple((int(i), float(values[i] - normalizer)) for i in best)
    )


@dataclass(frozen=True)
class Token:
    """One generated token: its event, and its log-probabilities if the request asked for them."""

    event: TokenEvent
    logprobs: Logprobs | None = None


@dataclass(frozen=True)
class PromptScores:
    """An echoed prompt's log-probabilities, each token's after the first (which nothing predicts), sent
    before the answer's tokens."""

    scores: tuple[Logprobs, ...]


@dataclass(frozen=True)
class PromptReading:
    """What reading an echoed prompt for its log-probabilities took (``runners[model]``'s prefill)."""

    model: int
    tokens: int
    seconds: float
    flops: float

    def counted_in(self, summary: Summary) -> Summary:
        """The answer's figures with this reading in them: its model's prefill (the answer then found the
        prompt cached: not cached from a request before), the FLOPs and the wall-clock."""
        models = list(summary.models)
        report = models[self.model]
        models[self.model] = replace(
            report,
            prefill_tokens=report.prefill_tokens + self.tokens,
            prefill_s=report.prefill_s + self.seconds,
            flops=report.flops + self.flops,
        )
        wall = summary.wall_s + self.seconds
        return replace(
            summary,
            models=tuple(models),
            flops=summary.flops + self.flops,
            wall_s=wall,
            tokens_per_s=summary.generated / wall if wall else 0.0,
        )


@dataclass(frozen=True)
class ScoredPrompt:
    """A prompt's scores (``PromptScores``) by ``runners[model]`` at ``top`` alternatives, kept for the
    next prompt that begins as it does."""

    model: int
    tokens: tuple[int, ...]
    top: int
    scores: PromptScores

    def shared(self, model: int, tokens: Sequence[int], top: int, cached: int) -> int:
        """How many of ``tokens``' first tokens this prompt's scores and ``cached`` positions of that
        model's cache both hold (0 for another model or top)."""
        if (model, top) != (self.model, self.top):
            return 0
        return common_prefix(self.tokens, tokens, cached)


def scoring_runner(runners: Sequence[Runner | RemoteRunner], policy: PolicyOptions) -> Runner | RemoteRunner:
    """The model whose log-probabilities an echoed prompt gets: the one the mode lets write alone (the
    small model's ``small``), else the largest, whose answer the pair stands for."""
    return runners[0] if policy.mode == "small" else runners[-1]


@dataclass(frozen=True)
class Finished:
    """The generation ended (by itself, at its limit, or because its client went away)."""

    summary: Summary


@dataclass(frozen=True)
class Failed:
    """The generation could not go on (a remote model lost, a llama.cpp failure): one line why.
    ``param``: the request's field at fault (a schema no answer can meet), where the request is."""

    message: str
    param: str | None = None


Message = Token | PromptProgress | PromptScores | Finished | Failed  # ending with one of the last two


class QueueFull(Exception):
    """Every place in the queue is taken; ``retry_after``: seconds after which one may be free."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full: try again in {retry_after} s")
        self.retry_after = retry_after


class Ticket:
    """A request's end of its job: the messages the engine thread sends (token events, a prompt's
    progress after each batch a model reads of it, then one ``Finished`` or ``Failed``), and ``cancel``
    for when its client goes away: a waiting job gives its place in the queue back at once, a running
    one stops within a token or a prefill's graph node."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = loop
        self._withdraw: Callable[[], None] | None = None

    def send(self, message: Message) -> None:
        """From the engine thread. Once the server's event loop is gone, nobody reads: stop."""
        try:
            self._loop.call_soon_threadsafe(self.messages.put_nowait, message)
        except RuntimeError:  # the loop is closed (a forced stop)
            self.cancel()

    async def next(self, wait: float | None = None) -> Message | None:
        """The engine's next message, or None where ``wait`` seconds pass first (None: wait for it); one
        already at hand is taken without a timer task, which ``asyncio.wait_for`` makes on every call."""
        if wait is None or not self.messages.empty():
            return await self.messages.get()
        try:
            return await asyncio.wait_for(self.messages.get(), wait)
        except asyncio.TimeoutError:
            return None

    def cancel(self) -> None:
        self.cancelled.set()
        if self._withdraw is not None:
            self._withdraw()


def _hold_signals() -> None:
    """The engine thread leaves SIGINT and SIGTERM to the main thread, where uvicorn handles them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class Engine:
    """The runners, one thread that generates with them, one job after another, in order, and the threads
    that prepare requests (``preparing``: they read the models too, so ``close`` waits for both).

    ``queue``: jobs that may wait while one runs; ``submit`` refuses more. Each prompt is tokenized
    alone; ``Runner.align`` keeps the prefix it shares with what the caches hold (the previous prompt and
    answer), which a chat client's next turn shares up to its new message. Logits are not bit-for-bit the
    same for another batch split (llama-server's ``cache_prompt`` warns of it too): a prompt the caches
    hold whole has its last token read again alone, and where two tokens nearly tie, its answer may
    differ from a fresh run's; ``reuse=False`` reads every prompt whole, as ``ead generate`` does.
    """

    def __init__(
        self,
        runners: Sequence[Runner],
        *,
        queue: int,
        log: Log,
        reuse: bool = True,
        embedder: Embedder | None = None,
    ) -> None:
        self.runners = tuple(runners)
        self.queue = queue
        self.log = log
        self.reuse = reuse
        self._executor = ThreadPoolExecutor(1, "ead-engine", initializer=_hold_signals)
        # ead serve --embeddings: a context of its own over a model's weights, on a thread of its own, so
        # an embedding neither waits for a generation nor touches its cache (one embedding at a time).
        self.embedder = embedder
        self._embedding = ThreadPoolExecutor(1, "ead-embed", initializer=_hold_signals)
        self._embeddings_pending = 0
        # The app's threads that prepare requests (tokenize, parse a grammar): they read the models too.
        self.preparing = ThreadPoolExecutor(PREPARE_THREADS, "ead-prepare")
        self._lock = threading.Lock()
        self._pending = 0  # accepted, not yet finished (the running job included)
        self._mean_s = 1.0  # recent seconds per job: the Retry-After estimate
        self._stopped = threading.Event()
        # Set when a stop begins (the first signal): a job cut off from then on was cut off by the stop.
        self.stopping = threading.Event()
        self.metrics = Metrics([runner.name for runner in self.runners])  # every answer's figures, added up
        # The prompt scored last: a prompt scored next by the same model, at the same top, that begins as
        # it did (another choice of n; the next choice of a multiple-choice question, lm-eval's) takes the
        # scores of the part they share, and reads past it alone, while that model's cache holds it.
        self._scored: ScoredPrompt | None = None

    @property
    def n_ctx(self) -> int:
        return context_size(self.runners)

    @property
    def pending(self) -> int:
        return self._pending

    def requests(self) -> tuple[int, int]:
        """The requests at work now and those waiting, as llama-server's /metrics counts them (its slots
        processing, the tasks deferred until one is free): a generation's and an embedding's alike, each
        on a thread of its own here, one request at a time."""
        with self._lock:
            queues = (self._pending, self._embeddings_pending)
        processing = sum(min(count, 1) for count in queues)
        return processing, sum(queues) - processing

    def submit(self, job: Job, ticket: Ticket) -> None:
        with self._lock:
            if self._pending > self.queue:
                raise QueueFull(max(1, math.ceil(self._mean_s * (self._pending - self.queue))))
            self._pending += 1
        future = self._executor.submit(self._run, job, ticket)
        ticket._withdraw = lambda: self._withdraw(future)

    def _withdraw(self, future: Future[None]) -> None:
        """A job whose client left before its turn: out of the queue now, its place free for another."""
        with self._lock:
            if future.cancelled() or not future.cancel():  # already withdrawn, running or done
                return
            self._pending -= 1
        self.log(f"skipped a waiting request: {self._why_cut_off('its client')}")

    def _run(self, job: Job, ticket: Ticket) -> None:
        began = time.perf_counter()
        answer: Finished | Failed | None = None
        try:
            if self._stopped.is_set():
                self.log("skipped a waiting request: the server is stopping")
                return
            answer = self._generate(job, ticket)
        except Exception as error:  # the thread must live on: whatever failed is this job's answer
            answer = Failed(str(error) or type(error).__name__)
        finally:
            with self._lock:
                self._pending -= 1
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - began)
            if answer is not None:  # once the job is out of the queue: a client that has its answer finds
                ticket.send(answer)  # it no longer pending (/health, /metrics)

    def _generate(self, job: Job, ticket: Ticket) -> Finished | Failed:
        if not self.reuse:  # read every prompt whole, as ead generate does: the same logits to the bit
            for runner in self.runners:
                runner.truncate(0)
        decoder = build_decoder(self.runners, job.policy, job.generation)

        def abandoned() -> bool:
            return ticket.cancelled.is_set() or self._stopped.is_set()

        scores: deque[Logprobs] = deque()  # sampled, not yet sent: one at a time without rollbacks
        if job.logprobs is not None and isinstance(decoder, Decoder):
            top = job.logprobs
            decoder.on_sample = lambda token, logits: scores.append(logprobs_of(token, logits, top))
        local = [runner for runner in self.runners if isinstance(runner, Runner)]
        for runner in local:
            runner.abandoned = abandoned  # a long prefill stops between graph nodes, not at its end
            runner.on_progress = ticket.send  # a long prompt's stream kept alive while it is read
        try:
            reading = None
            if job.echo and (job.logprobs is not None or job.generation.max_tokens == 0):
                try:  # before the answer's run, which then finds the prompt cached
                    prompt_scores, reading = self._read_prompt(job)
                except Abandoned:
                    return Failed(f"stopped while reading the prompt: {self._why_cut_off()}")
                except EadError as error:
                    return Failed(str(error))
                if prompt_scores is not None:
                    ticket.send(prompt_scores)
            return self._answered(job, ticket, decoder, scores, abandoned, reading)
        finally:
            for runner in local:
                runner.abandoned, runner.on_progress = never_abandoned, None

    def _answered(
        self,
        job: Job,
        ticket: Ticket,
        decoder: Decoder | SpeculativeDecoder,
        scores: deque[Logprobs],
        abandoned: Callable[[], bool],
        reading: PromptReading | None = None,
    ) -> Finished | Failed:
        """The answer's run, each token sent as it comes, then its figures (recorded in the metrics),
        an echoed prompt's ``reading`` counted in them."""
        failure = None
        response = decoder.generate(job.prompt)  # align keeps what the caches share with it
        try:
            for event in response:
                ticket.send(Token(event, scores.popleft() if scores else None))
                if abandoned():
                    break
        except Abandoned:
            pass
        except GrammarDeadEnd as error:
            named = GrammarDeadEnd(error.end_banned, job.end_banned_by)  # the ban as the caller gave it
            failure = Failed(f"response_format: {named}", param="response_format")
        except EadError as error:
            failure = Failed(str(error))
        summary = response.summary() if reading is None else reading.counted_in(response.summary())
        self.metrics.record(summary)  # before the answer goes out: a client that has it finds it counted
        if self._stopped.is_set() or ticket.cancelled.is_set():
            self.log(f"stopped after {counted(summary.generated, 'token')}: {self._why_cut_off()}")
        return failure or Finished(summary)

    def _read_prompt(self, job: Job) -> tuple[PromptScores | None, PromptReading]:
        """An echoed prompt read by the model that scores it, and what the reading took: with ``logprobs``
        with the log-probabilities of each token after the first, its top ``logprobs`` (those of the part
        it shares with the prompt scored last, that the cache still holds, kept); without, as an answer
        reads it (``max_tokens`` 0: no answer will). What the cache holds is not read again."""
        runner = scoring_runner(self.runners, job.policy)
        model, prompt = self.runners.index(runner), job.prompt
        began, flops, read = time.perf_counter(), runner.flops(), runner.stats.prefill.tokens
        cached = runner.align(prompt)
        prompt_scores = None
        if job.logprobs is None:
            runner.sync(prompt, prompt_len=len(prompt), own_tail=False)
        else:
            assert isinstance(runner, Runner), "a request that echoes a served model's prompt is refused"
            top = job.logprobs
            last = self._scored
            kept = last.shared(model, prompt, top, cached) if last is not None else 0
            # the kept scores are those the kept tokens' rows gave, but for the last one's: its row,
            # which scores the first token past them, is read again
            start = max(kept - 1, 0)
            scores = [] if last is None else list(last.scores.scores[:start])

            def scored(rows: np.ndarray, batch_start: int) -> None:
                for row, token in zip(rows, prompt[batch_start + 1 :], strict=False):
                    scores.append(logprobs_of(token, row, top))

            runner.score(prompt, scored, start)
            prompt_scores = PromptScores(tuple(scores))
            self._scored = ScoredPrompt(model, tuple(prompt), top, prompt_scores)
        seconds = time.perf_counter() - began
        read = runner.stats.prefill.tokens - read
        reading = PromptReading(model, read, seconds, runner.flops() - flops)
        if not self.reuse:  # the answer reads its prompt whole, as without echo
            runner.truncate(0)
        return prompt_scores, reading

    async def embedded(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's embedding (unnormalised), one request after another on the embedding thread;
        past ``queue`` requests waiting, ``QueueFull``. Only where there is an embedder."""
        assert self.embedder is not None
        embed = self.embedder.embed
        with self._lock:
            if self._embeddings_pending > self.queue:
                raise QueueFull(1)
            self._embeddings_pending += 1
        try:
            loop = asyncio.get_running_loop()
            vectors = await loop.run_in_executor(self._embedding, lambda: list(map(embed, inputs)))
            self.metrics.record_embedding(sum(map(len, inputs)))  # counted before the answer goes out
            return vectors
        finally:
            with self._lock:
                self._embeddings_pending -= 1

    def _why_cut_off(self, client: str = "the client") -> str:
        stopping = self.stopping.is_set() or self._stopped.is_set()
        return "the server is stopping" if stopping else f"{client} went away"

    def close(self) -> None:
        """Stop the threads: after a clean shutdown every job accepted is done; after a forced one (a second
        Ctrl-C) the running job stops after its token and those waiting are dropped. A request still being
        prepared (a forced stop cancels its task, not its thread) is prepared to its end, so the models
        are freed after the last thread that reads them (a grammar parsed with a freed vocabulary)."""
        self._stopped.set()
        self.preparing.shutdown(wait=True, cancel_futures=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._embedding.shutdown(wait=True, cancel_futures=True)
        if self.embedder is not None:
            self.embedder.close()

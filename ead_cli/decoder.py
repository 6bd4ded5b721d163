"""The decoding loop: models take turns on one token list, as a policy decides; events stream out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter

from .entropy import entropy_bits, max_entropy_bits
from .policies import Policy
from .runner import Runner, RunnerStats
from .sampling import Sampler, SamplingParams
from .text import TextStream


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. ``entropy`` is what the policy observed at this step (bits, or a fraction
    of log2|V| with normalisation); ``rolling`` is the policy's rolling mean after it; ``text`` is the
    text this token releases (whole characters; stop-string candidates are held back)."""

    index: int
    token: int
    text: str
    model: str
    entropy: float
    rolling: float


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


@dataclass(frozen=True)
class Summary:
    """Figures for a whole generation. ``param_cost`` is the paper's metric: sum over models of tokens
    written x parameters, over (all tokens x the largest model's parameters)."""

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


class Decoder:
    """Owns the token list, the runners, the policy and the sampler. Knows nothing about terminals.

    Runners are ordered from the smallest to the largest; ``roles`` names them ("small", "large").
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
        normalize: bool = False,
    ) -> None:
        self.runners = tuple(runners)
        self.roles = tuple(roles)
        self.policy = policy
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self._entropy_scale = 1.0 / max_entropy_bits(self.runners[0].n_vocab) if normalize else 1.0
        self._written = [0] * len(self.runners)
        self._prompt_len = 0
        self._generated = 0
        self._finish = "interrupted"
        self._started = 0.0
        self._ended: float | None = None

    @property
    def n_ctx(self) -> int:
        return min(runner.n_ctx for runner in self.runners)

    def run(self, prompt: Sequence[int]) -> Iterator[TokenEvent]:
        """Generate from the prompt's token ids, yielding one event per token."""
        runners, roles, policy, scale = self.runners, self.roles, self.policy, self._entropy_scale
        tokens = list(prompt)
        prompt_len = self._prompt_len = len(tokens)
        n_ctx = self.n_ctx
        text = TextStream(self.stop)
        sampler = Sampler(self.sampling)
        self._started, self._ended, self._finish = perf_counter(), None, "interrupted"
        self._generated, self._written = 0, [0] * len(runners)
        for runner in runners:
            runner.align(tokens)
            runner.stats = RunnerStats.empty()
        last_writer = -1
        try:
            while self._generated < self.max_tokens:
                evaluated = policy.active
                runner = runners[evaluated]
                logits = runner.sync(tokens, prompt_len=prompt_len, own_tail=last_writer == evaluated)
                entropy = entropy_bits(logits) * scale
                writer = policy.observe(entropy)
                if writer != evaluated:
                    runner = runners[writer]
                    runner.sync(tokens, prompt_len=prompt_len, own_tail=last_writer == writer)
                token = sampler.sample(runner.ctx)
                tokens.append(token)
                self._written[writer] += 1
                self._generated += 1
                last_writer = writer
                piece = text.push(runner.token_bytes(token))
                if runner.is_end_of_generation(token) or text.stopped:
                    self._finish = "stop"
                elif self._generated >= self.max_tokens or len(tokens) > n_ctx:
                    self._finish = "length"
                else:
                    yield TokenEvent(
                        self._generated - 1, token, piece, roles[writer], entropy, policy.rolling
                    )
                    continue
                yield TokenEvent(
                    self._generated - 1, token, piece + text.flush(), roles[writer], entropy, policy.rolling
                )
                return
            self._finish = "length"
        finally:
            self._ended = perf_counter()
            sampler.close()

    def summary(self) -> Summary:
        """Figures so far; valid after an interrupted run too (finish reason 'interrupted')."""
        end = self._ended if self._ended is not None else perf_counter()
        wall = max(end - self._started, 1e-9) if self._started else 0.0
        total = self._generated
        largest = max(runner.n_params for runner in self.runners)
        reports = tuple(
            ModelReport(
                role=role,
                path=str(runner.path),
                params=runner.n_params,
                written=written,
                prefill_tokens=runner.stats.prefill.tokens,
                prefill_s=runner.stats.prefill.seconds,
                decode_tokens=runner.stats.decode.tokens,
                decode_s=runner.stats.decode.seconds,
                catchup_tokens=runner.stats.catchup.tokens,
                catchup_s=runner.stats.catchup.seconds,
                flops=runner.flops(),
            )
            for role, runner, written in zip(self.roles, self.runners, self._written, strict=True)
        )
        weighted = sum(report.written * report.params for report in reports)
        return Summary(
            finish_reason=self._finish,
            prompt_tokens=self._prompt_len,
            generated=total,
            switches=self.policy.switches,
            large_share=self._written[-1] / total if total else 0.0,
            param_cost=weighted / (total * largest) if total else 0.0,
            flops=sum(report.flops for report in reports),
            wall_s=wall,
            tokens_per_s=total / wall if wall else 0.0,
            models=reports,
        )

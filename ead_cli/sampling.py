"""Token choice through llama.cpp's own sampler chain, shared by every model of a run.

One chain serves all models, so the random stream (and ``--seed``) carries across switches: the same
seed gives the same text run to run.
"""

from __future__ import annotations

import ctypes
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from . import shared_stderr
from .errors import EadError, check_int32, cut, quoted


@dataclass(frozen=True)
class SamplingParams:
    """temp 0 is greedy; otherwise llama.cpp's default order: top-n-sigma, top-k, typical, top-p, min-p,
    XTC, then temperature, then a seeded draw (XTC's own draws seeded alike, as llama.cpp's); top-n-sigma
    (``top_n_sigma`` -1, or any value up to 0), typical (``typical_p`` 1) and XTC (``xtc_probability`` 0)
    off by default, as llama.cpp's, and run by its chain alone (``chain_only``). ``mirostat`` 1 or 2
    (llama.cpp's Mirostat, or Mirostat 2.0; 0 off): the temperature, then a draw that keeps the text's
    surprise near ``mirostat_tau`` bits, learning at ``mirostat_eta``, in place of the rest of the chain
    and of the penalties, as llama.cpp's chain has it (the logit bias stays); its chain's alone too.
    ``dry_multiplier`` (0: off): llama.cpp's DRY ("don't repeat yourself"), after the penalties: a token
    that would extend a run of text repeated from the last ``dry_penalty_last_n`` tokens (the prompt's
    included) by more than ``dry_allowed_length`` tokens loses ``dry_multiplier x dry_base ^ (run -
    allowed)`` from its logit; a run stops at any of ``dry_sequence_breakers`` (llama.cpp's defaults:
    newline, colon, quote, asterisk). Greedy or not, as llama.cpp's chain has it before the temperature;
    its sampler alone computes it (``chain_only``), not with Mirostat (whose chain has none).
    ``grammar``: a GBNF grammar (root rule ``root``) every token must keep the text within, whichever
    model writes it (ead serve's JSON mode); it cannot take a token back, so no rollbacks with it.
    ``grammar_start``: tokens of the text that the prompt already holds (an assistant prefill), which the
    grammar follows before the first token is drawn. ``grammar_trigger``: a token that makes the grammar
    lazy (llama.cpp's, which llama-server's tool calls use): tokens are free until it is written, and the
    grammar binds the text from it on, its own text first (ead serve's tool calls). ``grammar_opening``:
    a trigger of ead's own, for text that no token opens (ead serve's bare tool calls): told the answer's
    text so far (the prefill's first), True once it opens what the grammar binds, False once it cannot,
    None while it may; the grammar then binds the answer from its start, else the tokens stay free (bound
    from ``grammar_trigger`` on, where one is given). The decoder applies it (``Sampler`` does not).

    Before all of these, as in llama.cpp's chain: ``logit_bias`` ((token, bias) pairs, added to the
    logits), ``banned`` (tokens whose logit is -inf: llama.cpp's logit bias for ``--ignore-eos``'s
    end-of-generation tokens, which no user's bias reaches) and the penalties of llama.cpp's penalties
    sampler over the last ``repeat_last_n`` tokens (0: none; -1, ``WHOLE_CONTEXT``: all of them), see
    ``penalised``. Their defaults are off, as llama.cpp's.

    ``infill``: llama.cpp's infill sampler after the temperature, before the draw (llama-server's
    ``samplers: [..., "infill"]``, which editors' code completion asks for): it merges candidates whose
    text begins another's, keeps only end-of-generation tokens where their mass is high, and drops
    unlikely text tokens. It runs in a local model's chain only (not in ``probabilities``)."""

    temp: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0
    grammar: str | None = None
    grammar_start: tuple[int, ...] = ()
    grammar_trigger: int | None = None
    grammar_opening: Callable[[str], bool | None] | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    typical_p: float = 1.0
    top_n_sigma: float = -1.0  # llama.cpp's off value: any up to 0 is off
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    banned: tuple[int, ...] = ()
    infill: bool = False
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")

    def __post_init__(self) -> None:
        if not 0 <= self.temp < math.inf:  # written so, NaN fails it too
            raise EadError(f"--temp must be at least 0 and finite, got {self.temp}", exit_code=2)
        if self.top_k < 0:
            raise EadError(f"--top-k must be at least 0 (0 disables it), got {self.top_k}", exit_code=2)
        check_int32(self.top_k, "--top-k")
        if not 0.0 < self.top_p <= 1.0:
            raise EadError(f"--top-p must be in (0, 1], got {self.top_p}", exit_code=2)
        if not 0.0 <= self.min_p <= 1.0:
            raise EadError(f"--min-p must be in [0, 1], got {self.min_p}", exit_code=2)
        if not 0.0 < self.typical_p <= 1.0:
            raise EadError(f"--typical must be in (0, 1] (1: off), got {self.typical_p}", exit_code=2)
        if not math.isfinite(self.top_n_sigma):
            raise EadError(
                f"--top-n-sigma must be finite (0 or less: off), got {self.top_n_sigma}", exit_code=2
            )
        for name in ("xtc_probability", "xtc_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                flag = "--" + name.replace("_", "-")
                raise EadError(f"{flag} must be in [0, 1], got {getattr(self, name)}", exit_code=2)
        if self.mirostat not in MIROSTAT_VERSIONS:
            message = f"--mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got {self.mirostat}"
            raise EadError(message, exit_code=2)
        for name, flag in (("mirostat_tau", "--mirostat-ent"), ("mirostat_eta", "--mirostat-lr")):
            if not 0 <= getattr(self, name) < math.inf:
                message = f"{flag} must be at least 0 and finite, got {getattr(self, name)}"
                raise EadError(message, exit_code=2)
        self._check_dry()
        if not 0 <= self.seed < 2**32 - 1:
            raise EadError(f"--seed must be in [0, 4294967294], got {self.seed}", exit_code=2)
        if not 0 < self.repeat_penalty < math.inf:
            message = f"--repeat-penalty must be above 0 and finite (1: off), got {self.repeat_penalty}"
            raise EadError(message, exit_code=2)
        if self.repeat_last_n < WHOLE_CONTEXT:
            limits = "at least -1 (-1: the whole context, 0: none)"
            message = f"--repeat-last-n must be {limits}, got {self.repeat_last_n}"
            raise EadError(message, exit_code=2)
        check_int32(self.repeat_last_n, "--repeat-last-n")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                flag = "--" + name.replace("_", "-")
                message = f"{flag} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {getattr(self, name)}"
                raise EadError(message, exit_code=2)
        for token, bias in self.logit_bias:
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                limits = f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
                message = f"--logit-bias must be in {limits}, got {bias} for token {token}"
                if bias == -math.inf:
                    message += f" (llama-cli's ban: -{MAX_LOGIT_BIAS:g} all but bans it here)"
                raise EadError(message, exit_code=2)

    def _check_dry(self) -> None:
        if not 0 <= self.dry_multiplier < math.inf:
            message = f"--dry-multiplier must be at least 0 and finite (0: off), got {self.dry_multiplier}"
            raise EadError(message, exit_code=2)
        if not 1 <= self.dry_base < math.inf:
            raise EadError(f"--dry-base must be at least 1 and finite, got {self.dry_base}", exit_code=2)
        for name in ("dry_allowed_length", "dry_penalty_last_n"):
            flag = "--" + name.replace("_", "-")
            if getattr(self, name) < 0:
                raise EadError(f"{flag} must be at least 0, got {getattr(self, name)}", exit_code=2)
            check_int32(getattr(self, name), flag)
        if len(self.dry_sequence_breakers) > MAX_DRY_BREAKERS:
            count = len(self.dry_sequence_breakers)
            message = f"--dry-sequence-breaker: at most {MAX_DRY_BREAKERS} breakers, got {count}"
            raise EadError(message, exit_code=2)
        for breaker in self.dry_sequence_breakers:
            size = len(breaker.encode("utf-8", "surrogateescape"))
            if not 0 < size <= MAX_DRY_BREAKER_BYTES:
                limit = f"1 to {MAX_DRY_BREAKER_BYTES} bytes (llama.cpp's limit)"
                message = f"--dry-sequence-breaker must be {limit}, got {quoted(breaker)}"
                raise EadError(message, exit_code=2)

    @property
    def dry_on(self) -> bool:
        """Whether DRY changes a row: llama_sampler_init_dry's own test of a no-op (its base is at least
        1 here), and not under Mirostat, whose chain has no DRY sampler."""
        return self.dry_multiplier != 0 and self.dry_penalty_last_n != 0 and self.mirostat == 0

    @property
    def chain_only(self) -> str | None:
        """The flag of the first sampler on that llama.cpp's chain alone runs, where a draw is made: not
        ``probabilities`` (speculative decoding's distribution: XTC's cut is itself a draw), nor a
        llama-server model's row (its top tokens alone); None where none is on. DRY's at any temperature:
        llama.cpp's sampler computes its penalty, with the local models' vocabulary."""
        if self.dry_on:
            return "--dry-multiplier"
        if self.temp == 0:
            return None
        on = {
            "--mirostat": self.mirostat != 0,
            "--top-n-sigma": self.top_n_sigma > 0,
            "--typical": self.typical_p < 1.0,
            "--xtc-probability": self.xtc_probability > 0.0,
        }
        return next((flag for flag, given in on.items() if given), None)

    @property
    def penalises(self) -> bool:
        """Whether ``penalised`` changes a row: a logit bias, a ban, or a penalty over a window of tokens."""
        return bool(self.logit_bias) or bool(self.banned) or self._penalties_on

    @property
    def _penalties_on(self) -> bool:
        # llama_sampler_penalties_apply's own test of a no-op; Mirostat's chain has no penalties sampler
        off = self.repeat_penalty == 1 and self.frequency_penalty == 0 and self.presence_penalty == 0
        return self.repeat_last_n != 0 and not off and self.mirostat == 0

    def penalised(
        self,
        logits: np.ndarray,
        tokens: Sequence[int],
        end: int | None = None,
        dry: DryPenalty | None = None,
    ) -> np.ndarray:
        """The row llama.cpp's chain samples from after its logit-bias (``banned`` at -inf), penalties
        and DRY (``dry``, where it is on) samplers, for the position after ``tokens[:end]`` (all of them
        if ``end`` is None): the prompt's tokens count, as llama-server and llama-cli accept the prompt
        into the chain before the first draw. A copy, in float32 as llama.cpp computes it (so a greedy
        choice is the same token); ``logits`` itself where nothing is penalised.

        Of each token that occurs ``count`` times in the window, a logit above 0 is divided by
        ``repeat_penalty`` and one at or below 0 multiplied, then ``count x frequency_penalty +
        presence_penalty`` is subtracted (llama_sampler_penalties_apply). Stateless: the window is read
        from the tokens before the row, so a row of a verified draft is judged with the draft before it,
        and a rollback leaves nothing to undo."""
        row = logits
        if self.penalises:
            row = np.array(logits, dtype=np.float32)
            for token, bias in self.logit_bias:
                row[token] += np.float32(bias)
            row[list(self.banned)] = -np.inf
        if self._penalties_on:
            end = len(tokens) if end is None else end
            start = 0 if self.repeat_last_n == WHOLE_CONTEXT else max(0, end - self.repeat_last_n)
            ids, counts = np.unique(np.asarray(tokens[start:end], dtype=np.int64), return_counts=True)
            found = row[ids]
            repeat = np.float32(self.repeat_penalty)
            found = np.where(found <= 0, found * repeat, found / repeat)
            found -= counts.astype(np.float32) * np.float32(self.frequency_penalty) + np.float32(
                self.presence_penalty
            )
            row[ids] = found
        return row if dry is None else dry.penalised(row, tokens, end)


class DryPenalty:
    """llama.cpp's DRY sampler (``SamplingParams.dry_multiplier``) over rows of ead's own, as a function
    of the tokens before each row: the window it keeps (the last ``dry_penalty_last_n`` tokens, a ring in
    llama.cpp) is brought to those tokens first, by the one token the text grew by, else refilled (a
    rollback, a check of held tokens), so a row of a verified draft is judged with the draft before it
    and nothing needs undoing. One per answer, shared by every model (they share the ``vocab`` whose
    tokens' texts its sequence breakers are found in); ``context``: the most tokens a window can hold."""

    def __init__(self, params: SamplingParams, vocab: llama_cpp.llama_vocab_p, context: int) -> None:
        breakers = [breaker.encode("utf-8", "surrogateescape") for breaker in params.dry_sequence_breakers]
        texts = (ctypes.c_char_p * len(breakers))(*breakers)
        # no longer than the context: llama.cpp allocates the whole window when the sampler starts
        self._window = min(params.dry_penalty_last_n, context)
        self._sampler = llama_cpp.llama_sampler_init_dry(
            vocab,
            params.dry_multiplier,
            params.dry_base,
            params.dry_allowed_length,
            self._window,
            texts,
            len(breakers),
        )
        self._held: list[int] = []
        self._candidates = np.empty(0, CANDIDATE)

    def penalised(self, row: np.ndarray, tokens: Sequence[int], end: int | None = None) -> np.ndarray:
        """``row`` (after the bias and the penalties) with DRY's penalties, for the position after
        ``tokens[:end]``; a float32 copy."""
        end = len(tokens) if end is None else end
        window = list(tokens[max(0, end - self._window) : end])
        if window != self._held:
            if window and (self._held + window[-1:])[-self._window :] == window:
                llama_cpp.llama_sampler_accept(self._sampler, window[-1])
            else:
                llama_cpp.llama_sampler_reset(self._sampler)
                for token in window:
                    llama_cpp.llama_sampler_accept(self._sampler, token)
            self._held = window
        if len(self._candidates) != len(row):
            self._candidates = np.empty(len(row), CANDIDATE)
            self._candidates["id"] = np.arange(len(row))
        candidates = self._candidates
        candidates["logit"] = row
        candidates["p"] = 0.0
        data = candidates.ctypes.data_as(llama_cpp.llama_token_data_p)
        array = llama_cpp.llama_token_data_array(data=data, size=len(row), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))  # in place, in the same order
        return candidates["logit"].copy()

    def close(self) -> None:
        if self._sampler is not None:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None


MAX_DRY_BREAKERS = 64  # each is matched against every token's text once, when a sampler starts
MAX_DRY_BREAKER_BYTES = 40  # llama.cpp cuts a longer one to its first 40 bytes: refused here, not cut
MIROSTAT_VERSIONS = (0, 1, 2)  # off, Mirostat, Mirostat 2.0: llama.cpp's --mirostat
MIROSTAT_CANDIDATES = 100  # the tokens Mirostat 1 estimates the distribution's shape from, as llama.cpp's

# repeat_last_n's -1: llama-server and llama-cli count the whole context (n_ctx tokens), which holds
# every token before a row
WHOLE_CONTEXT = -1
MAX_PENALTY = 2.0  # OpenAI's bound of presence_penalty and frequency_penalty
MAX_LOGIT_BIAS = 100.0  # and of a logit bias


def unknown_token(ids: Iterable[int], n_vocab: int, where: str) -> str | None:
    """Why token ids given for ``where`` are refused: the first that is not in the vocabulary (ids 0 to
    ``n_vocab`` - 1), said once for the command line and HTTP alike; None if each is in it."""
    unknown = next((token for token in ids if token >= n_vocab), None)
    if unknown is None:
        return None
    return f"{where}: token id {unknown} is not in the vocabulary (ids 0-{n_vocab - 1})"


REMOTE_ROW = "not with a llama-server model"
# why Mirostat goes with no step that takes tokens back: each draw moves its target (llama.cpp's mu)
MIROSTAT_NO_ROLLBACK = "Mirostat's running target cannot take a token back"
INFILL_LOCAL = f"the infill sampler runs in a local model's chain: {REMOTE_ROW}"


class GrammarDeadEnd(EadError):
    """The grammar allows no token where the text must go on: no text can meet it (a JSON schema whose
    pattern has an empty class, ``[b-a]``), or, where the end of generation is banned (``end_banned``),
    only the end may be left, which the message says, naming the ban as the caller gave it."""

    def __init__(self, end_banned: bool, banned_by: str = "--ignore-eos") -> None:
        self.end_banned = end_banned
        ended = f", or only by its end, which {banned_by} bans" if end_banned else ""
        super().__init__(f"the grammar allows no token here: no answer can meet it{ended}")


class GrammarRefusal(EadError):
    """The grammar rules out a token that the answer was to begin with."""

    def __init__(self, index: int) -> None:
        super().__init__(f"the grammar rules out token {index} of the answer's start")
        self.index = index


# llama.cpp's llama_token_data, as numpy lays it out: the candidates a chain with a grammar draws from
CANDIDATE = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Sampler:
    """A llama.cpp sampler chain; ``sample(ctx)`` draws from that context's last row of logits. With a
    grammar (``grammars``, the writing model's, needed), it comes first in the chain and every token
    sampled is accepted by it. The logit bias and the penalties are applied to the row before the chain
    (``SamplingParams.penalised``), where llama.cpp's chain has them first, and DRY after them (``dry``,
    the answer's, needed where it is on). The infill sampler and Mirostat 1 (its vocabulary's size) need
    the writing models' ``vocab`` (they share it)."""

    def __init__(
        self,
        params: SamplingParams,
        grammars: ParsedGrammars | None = None,
        vocab: llama_cpp.llama_vocab_p | None = None,
        dry: DryPenalty | None = None,
    ) -> None:
        if params.infill and vocab is None:
            raise EadError(INFILL_LOCAL)
        if params.dry_on and dry is None:
            raise EadError(f"--dry-multiplier runs in a local model's chain: {REMOTE_ROW}")
        self._argmax = params.temp == 0 and params.grammar is None and not params.infill
        self._greedy = self._argmax and not params.penalises and dry is None
        self._params = params
        self._dry = dry
        self._rng = np.random.default_rng(params.seed)
        grammar = None
        if params.grammar is not None:
            if grammars is None:
                raise EadError("a grammar needs a local model's vocabulary")
            # before the chain: a refusal leaks nothing
            grammar = grammars.sampler(params.grammar, params.grammar_start, params.grammar_trigger)
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        add = llama_cpp.llama_sampler_chain_add
        if grammar is not None:
            add(self._chain, grammar)
        if params.temp == 0 and not params.infill:
            add(self._chain, llama_cpp.llama_sampler_init_greedy())
        elif params.mirostat:  # llama.cpp's chain for it: the temperature, then Mirostat's own draw
            add(self._chain, llama_cpp.llama_sampler_init_temp(params.temp))
            tau, eta = params.mirostat_tau, params.mirostat_eta
            if params.mirostat == 1:
                assert vocab is not None, "Mirostat 1 needs the vocabulary's size"
                n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
                mirostat = llama_cpp.llama_sampler_init_mirostat
                add(self._chain, mirostat(n_vocab, params.seed, tau, eta, MIROSTAT_CANDIDATES))
            else:
                add(self._chain, llama_cpp.llama_sampler_init_mirostat_v2(params.seed, tau, eta))
        else:  # temp 0 with infill: llama.cpp's temperature keeps the likeliest token, then infill judges it
            if params.top_n_sigma > 0:  # llama.cpp's reads 0 or less as off
                add(self._chain, llama_cpp.llama_sampler_init_top_n_sigma(params.top_n_sigma))
            if params.top_k > 0:
                add(self._chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.typical_p < 1.0:
                add(self._chain, llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
            add(self._chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(self._chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            if params.xtc_probability > 0.0:
                xtc = llama_cpp.llama_sampler_init_xtc
                add(self._chain, xtc(params.xtc_probability, params.xtc_threshold, 1, params.seed))
            add(self._chain, llama_cpp.llama_sampler_init_temp(params.temp))
            if params.infill:
                add(self._chain, llama_cpp.llama_sampler_init_infill(vocab))
            add(self._chain, llama_cpp.llama_sampler_init_dist(params.seed))

    @property
    def greedy(self) -> bool:
        """Whether ``sample`` takes the row's argmax (temp 0, no grammar, nothing penalised)."""
        return self._greedy

    def sample(
        self,
        ctx: llama_cpp.llama_context_p | None,
        logits: np.ndarray,
        index: int = -1,
        tokens: Sequence[int] = (),
    ) -> int:
        """Choose a token from row ``index`` of ctx's last batch of logits (``logits`` is a view of it),
        the row that follows ``tokens`` (the prompt and the answer so far: the penalties' window).

        Greedy takes the argmax of the view: the same token as llama.cpp's greedy sampler (the first
        maximum), without building its 151,936-entry candidate array every token (~0.5 ms). Without a
        context (a remote model's top-k row) the same chain runs in numpy, on the seeded generator.
        """
        if self._greedy:
            return int(logits.argmax())  # the method: np.argmax's dispatch costs ~2 us a token
        row = self._params.penalised(logits, tokens, dry=self._dry)
        if self._argmax:
            return int(row.argmax())  # greedy over the penalised row
        if ctx is None:
            if self._params.grammar is not None:
                raise EadError("a grammar needs a local model's context: not with a llama-server model")
            if self._params.infill:
                raise EadError(INFILL_LOCAL)
            if self._params.chain_only is not None:
                raise EadError(f"{self._params.chain_only} runs in a local model's chain: {REMOTE_ROW}")
            dist = probabilities(row, self._params)
            return int(self._rng.choice(dist.shape[0], p=dist))
        if row is logits and self._params.grammar is None:
            return llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        return self._from_row(row)

    def _from_row(self, logits: np.ndarray) -> int:
        """llama_sampler_sample's steps (the chain applied to every token, the choice accepted) on a row
        of our own (penalised), with a look between them: where a grammar leaves no token, llama.cpp
        would accept one it ruled out, and its grammar's exception, thrown through the C API, aborts the
        process."""
        candidates = np.empty(len(logits), CANDIDATE)
        candidates["id"] = np.arange(len(logits))
        candidates["logit"] = logits
        candidates["p"] = 0.0
        data = candidates.ctypes.data_as(llama_cpp.llama_token_data_p)
        array = llama_cpp.llama_token_data_array(data=data, size=len(logits), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        chosen = array.data[array.selected]  # the samplers may have moved the data
        if not math.isfinite(chosen.logit):
            # an end of generation may be the one token it allows: say so, not test for it (a second pass)
            raise GrammarDeadEnd(end_banned=bool(self._params.banned))
        llama_cpp.llama_sampler_accept(self._chain, chosen.id)
        return chosen.id

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


class ParsedGrammars:
    """One vocabulary's grammars, each text parsed by llama.cpp once while it is among the last few used
    (``KEPT`` of them, of ``KEPT_CHARS`` characters together).

    A parse takes stderr for the call (see ``shared_stderr``) and milliseconds for a large schema; ead
    serve checks a request's grammar when it arrives and samples with it when its turn comes, and clients
    send the same schema again and again. A grammar sampler carries one answer's state, so each answer
    gets a copy (llama_sampler_clone) of the parsed one, which nothing samples with.
    """

    KEPT = 16  # distinct grammars: a copy of a parsed one costs microseconds, a parse up to ~10 ms
    # and their characters together: a parsed grammar holds ~16 bytes a character (a 16 MiB one, which a
    # schema's may reach, ~260 MB); the last used is kept whatever its size
    KEPT_CHARS = 2**22

    def __init__(self, vocab: llama_cpp.llama_vocab_p) -> None:
        self._vocab: llama_cpp.llama_vocab_p | None = vocab  # None once closed: the model is freed next
        self._parsed: OrderedDict[tuple[str, int | None], llama_cpp.llama_sampler_p] = OrderedDict()
        self._chars = 0  # of the grammars in _parsed
        self._lock = threading.Lock()  # ead serve's preparing threads check, its engine thread samples

    def check(self, grammar: str, start: Sequence[int] = (), trigger: int | None = None) -> None:
        """Parse the text now, so a grammar llama.cpp refuses is an error before any work is queued, and
        one that rules out a token of ``start`` (``GrammarRefusal``) too."""
        llama_cpp.llama_sampler_free(self.sampler(grammar, start, trigger))

    def sampler(
        self, grammar: str, start: Sequence[int] = (), trigger: int | None = None
    ) -> llama_cpp.llama_sampler_p:
        """A fresh grammar sampler for one answer (the caller frees it, or a chain that owns it), past
        ``start``: tokens the answer begins with that were not drawn (an assistant prefill); lazy, bound
        from the token ``trigger`` on, where one is given (``SamplingParams.grammar_trigger``)."""
        with self._lock:
            sampler = llama_cpp.llama_sampler_clone(self._parsed_sampler(grammar, trigger))
        try:
            _follow(sampler, start)
        except GrammarRefusal:
            llama_cpp.llama_sampler_free(sampler)
            raise
        return sampler

    def _parsed_sampler(self, grammar: str, trigger: int | None) -> llama_cpp.llama_sampler_p:
        if self._vocab is None:  # a parse would read the freed vocabulary, and its grammar never be freed
            raise EadError("the model is closed: no grammar can be parsed for it")
        key = (grammar, trigger)
        parsed = self._parsed.get(key)
        if parsed is not None:
            self._parsed.move_to_end(key)
            return parsed
        parsed = self._parsed[key] = _parse(self._vocab, grammar, trigger)
        self._chars += len(grammar)
        while len(self._parsed) > 1 and (len(self._parsed) > self.KEPT or self._chars > self.KEPT_CHARS):
            self._free(*self._parsed.popitem(last=False))  # the least recently used
        return parsed

    def _free(self, key: tuple[str, int | None], parsed: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_free(parsed)
        self._chars -= len(key[0])

    def close(self) -> None:
        """Free the parsed grammars (before the model: safe to call twice); none is parsed after."""
        with self._lock:
            self._vocab = None
            while self._parsed:
                self._free(*self._parsed.popitem())


# llama_grammar_parser::parse (llama-grammar.cpp) refuses a grammar with one fprintf to stderr:
# "%s: error parsing grammar: %s\n\n%s\n" of __func__, its reason, the grammar whole
PARSER_WORDS = b"parse: error parsing grammar: "
PARSER_PRINT = re.compile(b"^" + re.escape(PARSER_WORDS), re.MULTILINE)  # at a line's start only
# llama_grammar_init_impl's refusals of a text its parser took
UNPARSED_REFUSALS = "it has no rule 'root', or a rule that reaches itself before any text (left recursion)"


def _parse(vocab: llama_cpp.llama_vocab_p, grammar: str, trigger: int | None) -> llama_cpp.llama_sampler_p:
    """llama.cpp's grammar sampler for a GBNF text (lazy, with a ``trigger`` token: not a pattern, whose
    match llama.cpp feeds the grammar from inside a token, aborting the process where the token goes on
    past it with text the grammar rules out); a grammar it cannot parse is a one-line error, with
    llama.cpp's reason. Its parser prints such a grammar whole to the process's
    stderr (a C fprintf: a client's schema in ead serve's log, newlines and all), so stderr goes to a
    file for the call."""
    text = grammar.encode()
    with shared_stderr.captured(lambda received: _parser_print(received, text)) as caught:
        if trigger is None:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, text, b"root")
        else:
            no_patterns = (ctypes.c_char_p * 0)()
            tokens = (llama_cpp.llama_token * 1)(trigger)
            init = llama_cpp.llama_sampler_init_grammar_lazy_patterns
            sampler = init(vocab, text, b"root", no_patterns, 0, tokens, 1)
    if sampler:
        return sampler
    reason = caught.printed.removeprefix(PARSER_WORDS).partition(b"\n")[0]
    # where its parser took the text, llama.cpp refuses in a log line of its own, which ead keeps quiet
    reason = cut(reason.decode("utf-8", "replace")) or UNPARSED_REFUSALS
    raise EadError(f"llama.cpp could not parse the grammar: {reason}")


def _parser_print(received: bytes, grammar: bytes) -> shared_stderr.Span:
    """Where the parser's refusal of ``grammar`` lies in what stderr received while it ran, among other
    threads' lines (a client's reply must not carry them, nor the log lose them): from the first line
    that starts as the parser's does to the grammar printed after it. One fprintf writes it at once, up
    to glibc's 8 KiB; should another thread's line split a longer one, the rest is taken as the
    parser's, so the grammar never reaches the log."""
    found = PARSER_PRINT.search(received)
    if found is None:
        return 0, 0
    tail = b"\n\n" + grammar + b"\n"
    end = received.rfind(tail, found.start())
    return found.start(), end + len(tail) if end >= 0 else len(received)


def _follow(sampler: llama_cpp.llama_sampler_p, tokens: Sequence[int]) -> None:
    """Accept ``tokens`` into a grammar sampler, each once the grammar allows it (alone, it is not set
    to -inf): llama.cpp aborts the process on a token its grammar rules out."""
    candidate = np.zeros(1, CANDIDATE)
    data = candidate.ctypes.data_as(llama_cpp.llama_token_data_p)
    for index, token in enumerate(tokens):
        candidate[0] = (token, 0.0, 0.0)
        array = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        if not math.isfinite(candidate[0]["logit"]):
            raise GrammarRefusal(index)
        llama_cpp.llama_sampler_accept(sampler, token)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution the sampler chain draws from, as an array: needed where a rule compares two
    models' probabilities (speculative decoding's acceptance test).

    Same order as the chain: top-k, then top-p and min-p on the softmax of the raw logits, then the
    temperature over what is left. Greedy (temp 0) is one-hot on the argmax. Not with the infill
    sampler, which only llama.cpp's chain runs.
    """
    if params.infill:
        raise EadError("the infill sampler is not run by speculative decoding: use another --mode")
    if params.chain_only is not None:
        raise EadError(f"{params.chain_only} is not run by speculative decoding: use another --mode")
    out = np.zeros(logits.shape[0], dtype=np.float64)
    if params.temp == 0:
        out[int(np.argmax(logits))] = 1.0
        return out
    values = logits.astype(np.float64)
    order = np.argsort(-values, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = values[order]
    raw = np.exp(kept - kept[0])
    raw /= raw.sum()
    cutoff = int(np.searchsorted(np.cumsum(raw), params.top_p)) + 1  # smallest prefix with mass >= top_p
    keep = min(cutoff, len(order))
    keep = max(1, min(keep, int(np.count_nonzero(raw[:keep] >= params.min_p * raw[0]))))
    tempered = np.exp((kept[:keep] - kept[0]) / params.temp)
    out[order[:keep]] = tempered / tempered.sum()
    return out

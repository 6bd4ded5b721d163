"""A thinking model's answer (Qwen3, DeepSeek-R1's distills, QwQ) split into its reasoning and its content.

These models write a ``<think>...</think>`` block before the answer, or their template opens the block in
the prompt (DeepSeek-R1's ends with ``<think>\\n``), so that the answer starts inside it. As llama.cpp's
``--reasoning-format deepseek`` (and ``auto``, its default) parses it: a block opens only at the start of
the answer (after whitespace), the first ``</think>`` closes it, the reasoning and the content after it
are stripped of the whitespace around them, and a block the length limit cut is all reasoning. A
splitter takes the text as it is decoded, a marker split across tokens included, so a stream's reasoning
and content come apart as they are written. Pure Python: no model needed to test it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

OPEN, CLOSE = "<think>", "</think>"
# llama.cpp's --reasoning-format: 'none' leaves the block in the content; 'deepseek' (and 'auto', its
# default) splits it off
REASONING_FORMATS = ("auto", "deepseek", "none")


class Split(NamedTuple):
    """Text of an answer, as reasoning and content."""

    reasoning: str = ""
    content: str = ""


def template_variables(reasoning_budget: int) -> dict[str, Any]:
    """The chat template's variables for llama.cpp's ``--reasoning-budget``: 0 turns thinking off through
    ``enable_thinking``, where a template reads it (Qwen3's); -1 leaves the template's default."""
    return {"enable_thinking": False} if reasoning_budget == 0 else {}


def thinks(template: str | None) -> bool:
    """Whether a chat template is a thinking model's: Qwen3's, QwQ's and DeepSeek-R1's all name
    ``</think>`` (to open the block or to drop it from earlier turns). Other models' answers are left
    whole, as they were, so a ``<think>`` they happen to write stays their content."""
    return bool(template) and CLOSE in template


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt leaves a block open, so that the answer starts inside it."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def answer_start(template: str | None, prompt: str, reasoning_format: str = "auto") -> bool | None:
    """How an answer to the rendered ``prompt`` is split: None, left whole (a model that does not think,
    or the format 'none'); else whether it starts inside a block."""
    if reasoning_format == "none" or not thinks(template):
        return None
    return opens_thinking(prompt)


class ReasoningSplitter:
    """Text pushed as decoded, given back as the reasoning and content it is known to be: a possible
    marker's beginning and whitespace that may turn out to be the block's end are held back."""

    def __init__(self, inside: bool = False) -> None:
        # start: nothing but whitespace yet, so a block may still open; after: the block closed, the
        # whitespace after it not content yet
        self._state = "reasoning" if inside else "start"
        self._held = ""
        self._reasoning_shown = False

    def push(self, text: str) -> Split:
        """The reasoning and the content that ``text`` completes."""
        self._held += text
        reasoning, content = [], []
        while True:
            if self._state == "start":
                rest = self._held.lstrip()
                if rest.startswith(OPEN):
                    self._state, self._held = "reasoning", rest[len(OPEN) :]
                    continue
                if OPEN.startswith(rest):  # only whitespace, or a marker's beginning: not yet known
                    break
                self._state = "content"
            elif self._state == "reasoning":
                end = self._held.find(CLOSE)
                if end >= 0:
                    reasoning.append(self._shown_reasoning(self._held[:end].rstrip()))
                    self._state, self._held = "after", self._held[end + len(CLOSE) :]
                    continue
                shown = self._held[: _marker_start(self._held, CLOSE)].rstrip()
                reasoning.append(self._shown_reasoning(shown))
                self._held = self._held[len(shown) :]
                break
            elif self._state == "after":
                self._held = self._held.lstrip()
                if not self._held:
                    break
                self._state = "content"
            else:
                content.append(self._held)
                self._held = ""
                break
        return Split("".join(reasoning), "".join(content))

    def flush(self) -> Split:
        """What is held at the answer's end: a block still open is reasoning (without its trailing
        whitespace), a marker's beginning that never finished is content."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return Split(self._shown_reasoning(held.rstrip()), "")
        return Split("", "" if self._state == "after" else held)

    def _shown_reasoning(self, text: str) -> str:
        if not self._reasoning_shown:
            text = text.lstrip()
            self._reasoning_shown = bool(text)
        return text


def _marker_start(text: str, marker: str) -> int:
    """Where a beginning of ``marker`` that ``text`` ends with starts (``len(text)``: none)."""
    for start in range(max(0, len(text) - len(marker) + 1), len(text)):
        if marker.startswith(text[start:]):
            return start
    return len(text)


def split_reasoning(text: str, inside: bool = False) -> Split:
    """A whole answer's reasoning and content."""
    splitter = ReasoningSplitter(inside)
    pushed, flushed = splitter.push(text), splitter.flush()
    return Split(pushed.reasoning + flushed.reasoning, pushed.content + flushed.content)


def last_at(tokens: Sequence[int], sequence: Sequence[int]) -> int:
    """Where the last occurrence of ``sequence`` in ``tokens`` starts; -1: none (or an empty one)."""
    sequence = tuple(sequence)
    for position in range(len(tokens) - len(sequence), -1, -1) if sequence else ():
        if tuple(tokens[position : position + len(sequence)]) == sequence:
            return position
    return -1


@dataclass(frozen=True)
class BlockTags:
    """A thinking block's tags as one model's tokens: ``start`` (``<think>``) and ``end`` (``</think>``)."""

    start: tuple[int, ...]
    end: tuple[int, ...]

    def left_open(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` leaves a block open, so that the answer starts inside it (``opens_thinking``
        over tokens): its last start tag after its last end tag."""
        return last_at(prompt, self.start) > last_at(prompt, self.end)


# llama.cpp's reasoning-budget sampler's states (common/reasoning-budget.h)
IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting-utf8", "forcing", "done"


def utf8_complete(piece: bytes) -> bool:
    """Whether a token's bytes end on a whole UTF-8 character (llama.cpp's common_utf8_is_complete), so
    that a budget spent mid-character lets the character finish before it forces the end."""
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:  # the last character's lead byte: the length it announces
            return back >= (4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1)
    return not piece


class Matcher:
    """Which of some token sequences the tokens seen end with (the longest), forgetting what came before
    a match, as llama.cpp's Aho-Corasick token matcher does."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        unique = {tuple(sequence) for sequence in sequences if sequence}
        self.sequences = sorted(unique, key=len, reverse=True)
        self._seen: tuple[int, ...] = ()

    def advance(self, token: int) -> tuple[int, ...] | None:
        longest = len(self.sequences[0]) if self.sequences else 0
        self._seen = (*self._seen, token)[-longest:] if longest else ()
        for sequence in self.sequences:
            if self._seen[-len(sequence) :] == sequence:
                self._seen = ()
                return sequence
        return None

    def reset(self) -> None:
        self._seen = ()


class ReasoningBudget:
    """llama.cpp's ``--reasoning-budget N`` over token ids (its reasoning-budget sampler): after a start
    sequence (``<think>``) it counts the block's tokens; a natural end sequence (``</think>``) ends it;
    once ``budget`` are written (and the last character is whole) the ``forced`` tokens (the message's,
    then the end tag's) are written one by one; then it passes on, until a new block opens. The decoder
    asks ``forced_token`` before it samples and tells ``accept`` each token written. No model: a token's
    bytes come from ``token_bytes`` (None: every token a whole character)."""

    def __init__(
        self,
        start: Sequence[int],
        ends: Sequence[Sequence[int]],
        forced: Sequence[int],
        budget: int,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        self.budget = budget
        self.forced = tuple(forced)
        self.state = IDLE
        self.remaining = budget
        self._start_tag = tuple(start)
        self._start, self._end = Matcher([start]), Matcher(ends)
        self._token_bytes = token_bytes
        self._forced_at = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """Start over for an answer to ``prompt``, whose tokens from its last start sequence on are
        accepted, as llama.cpp accepts the generation prompt's: a prompt that opens the block leaves the
        machine counting, the tokens after the start tag already counted."""
        self.state, self.remaining, self._forced_at = IDLE, self.budget, 0
        self._start.reset()
        self._end.reset()
        position = last_at(prompt, self._start_tag)
        for token in prompt[position:] if position >= 0 else ():
            self.accept(token)

    @property
    def forced_token(self) -> int | None:
        """The token the budget writes next in place of a sampled one, or None."""
        if self.state != FORCING or self._forced_at >= len(self.forced):
            return None
        return self.forced[self._forced_at]

    def accept(self, token: int) -> None:
        """Advance past a token written (sampled or forced)."""
        if self.state in (IDLE, DONE):
            if self._start.advance(token) is not None:
                self._open()
        elif self.state == FORCING:
            self._forced_at += 1
            if self._forced_at >= len(self.forced):
                self.state = DONE
        elif self._end.advance(token) is not None:
            self.state = DONE
        else:
            whole = self._token_bytes is None or utf8_complete(self._token_bytes(token))
            if self.state == COUNTING:
                self.remaining -= 1
            if self.remaining > 0:
                return
            if whole:
                self._force()
            elif self.state == COUNTING:  # spent mid-character: the character finishes first
                self.state = WAITING_UTF8
                self._end.reset()

    def _open(self) -> None:
        self.state, self.remaining = COUNTING, self.budget
        self._end.reset()
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state, self._forced_at = FORCING, 0
        self._end.reset()

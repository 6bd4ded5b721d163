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

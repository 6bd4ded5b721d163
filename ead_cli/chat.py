"""A multi-turn conversation on the engine, kept as the very tokens both models' KV caches hold.

``Conversation.tokens`` is the conversation as the models read it: the chat template's text for each
turn, every answer as the tokens the models wrote (never re-tokenized), closed with the template's
end-of-turn text. A new turn appends only the tokens of the text the template adds for it (the
rendering with the turn minus the rendering without), so ``Runner.align`` keeps both caches and each
model reads only what it has not seen yet. Should a rendering not extend the previous one (a new
system message, a template that rewrites past turns), the whole rendering is tokenized again and the
caches keep the prefix that still matches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .calibrate import SavedTau, with_saved_tau
from .decoder import Summary, TokenEvent
from .engine import build_decoder
from .errors import EadError, shown_path
from .options import GenerationOptions, PolicyOptions
from .paths import write_whole
from .prompt import (
    Message,
    check_fits,
    check_length_fits,
    check_prompt_text,
    check_system_fits,
    check_text,
    context_size,
    encode_rendered,
    render_chat,
)
from .response import Response
from .runner import Runner
from .signals import main_thread_signals
from .thinking import answer_start, template_variables, thinks

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class _Request:
    """What an answer was asked with: the messages up to the user's, the prompt and its text."""

    messages: list[Message]
    prompt: list[int]
    rendered: str
    policy: PolicyOptions
    generation: GenerationOptions
    system: str | None


class ContextFull(EadError):
    """The conversation leaves no room for the next answer: only a new conversation helps."""


@dataclass(frozen=True)
class Turn:
    """One exchange and the settings it ran with. ``answer`` is the text of the answer's tokens;
    ``system``: the system message the answer read (a later one re-reads the conversation under it)."""

    user: str
    answer: str
    events: tuple[TokenEvent, ...]
    summary: Summary
    policy: PolicyOptions
    generation: GenerationOptions
    system: str | None = None

    @property
    def cut(self) -> bool:
        """The answer did not end by itself (Ctrl-C, the token limit, a full context)."""
        return self.summary.finish_reason != "stop"


@dataclass(frozen=True)
class Totals:
    """Figures summed over every answer of the session, across new conversations."""

    answers: int = 0
    generated: int = 0
    large_written: int = 0
    switches: int = 0
    flops: float = 0.0
    wall_s: float = 0.0

    @property
    def large_share(self) -> float:
        return self.large_written / self.generated if self.generated else 0.0

    def add(self, summary: Summary) -> Totals:
        return Totals(
            self.answers + 1,
            self.generated + summary.generated,
            self.large_written + summary.models[-1].written,
            self.switches + summary.switches,
            self.flops + summary.flops,
            self.wall_s + summary.wall_s,
        )


class Conversation:
    """Messages, token list and settings of a chat over loaded runners (smallest first).

    Each answer gets a fresh decoder over the same runners, so settings changed with ``configure``
    (or a new ``system`` message) apply from the next answer on. ``load_pair``: the conversation began
    with the large model alone (the default mode); the first settings that turn the pair on call it for
    every runner, the large one among them, and the others read the conversation when they first answer.
    """

    def __init__(
        self,
        runners: Sequence[Runner],
        policy: PolicyOptions,
        generation: GenerationOptions,
        *,
        system: str | None = None,
        load_pair: Callable[[], Sequence[Runner]] | None = None,
    ) -> None:
        self.runners = tuple(runners)
        self._load_pair = load_pair
        self._text_model = self.runners[0]  # renders and tokenizes the whole conversation, whoever joins
        if not self._text_model.chat_template:
            raise EadError(
                f"{shown_path(self._text_model.path.name)} has no chat template, which ead chat needs "
                "(ead generate --raw works without one)",
                exit_code=2,
            )
        self.configure(policy, generation)
        self.system = system
        self.totals = Totals()
        self.messages: list[Message] = []
        self.thinking: bool | None = None  # how the answer being written is split (thinking.answer_start)
        self.turns: list[Turn] = []
        self.tokens: list[int] = []
        self._text = ""  # the template's text that ``tokens`` stand for

    @property
    def system(self) -> str | None:
        return self._system

    @system.setter
    def system(self, text: str | None) -> None:
        """The system message for the next answers (empty: none); refused, changing nothing, for what a
        prompt is refused for (a NUL byte, bytes that are not UTF-8) and where it leaves the context no
        room for a message and an answer: said now, not as a prompt too long at the next message."""
        if text:
            check_text(text, "the system message")
            check_system_fits(self._text_model, text, self.runners)
        self._system = text or None

    @property
    def thinks(self) -> bool:
        """Whether the model is a thinking one (its template names ``</think>``): thinking can be turned
        off or on for it alone."""
        return thinks(self._text_model.chat_template)

    @property
    def n_ctx(self) -> int:
        return context_size(self.runners)

    @property
    def full(self) -> bool:
        """No room is left for another turn."""
        return len(self.tokens) >= self.n_ctx

    def configure(self, policy: PolicyOptions, generation: GenerationOptions) -> None:
        """Settings for the next answers; values the engine refuses raise EadError and change nothing.
        ``policy`` is kept as asked: ``ead calibrate --save``'s τ applies to each answer that runs the
        pair with no τ given (``effective_policy``), whatever mode or policy a command chose since."""
        if policy.mode != "large" and len(self.runners) == 1 and self._load_pair is not None:
            self.runners, self._load_pair = tuple(self._load_pair()), None
        build_decoder(self.runners, with_saved_tau(policy, self.runners).options, generation)  # validates
        self.policy, self.generation = policy, generation

    @property
    def saved_tau(self) -> SavedTau:
        """The settings the next answer runs with (the asked ones, the pair's saved τ where it applies),
        and why a τ saved for the policy does not apply to them."""
        return with_saved_tau(self.policy, self.runners)

    @property
    def effective_policy(self) -> PolicyOptions:
        """The settings the next answer runs with (``saved_tau``'s)."""
        return self.saved_tau.options

    def reset(self) -> None:
        """Start a new conversation (same system message and settings). The caches keep what matches."""
        self.messages, self.turns, self.tokens, self._text = [], [], [], ""

    def ask(self, text: str) -> Iterator[TokenEvent]:
        """Start the answer to a user message; return its stream of token events.

        Raises at once, changing nothing, if the message is empty or leaves no room for an answer:
        ContextFull where only the conversation so far is in the way, so a new one would take it.
        Once iterated, however the stream ends (finished, closed early as on Ctrl-C, or raising), the
        turn is in ``turns`` and its answer, closed with the template's end of turn, in ``tokens``.
        """
        check_prompt_text(text)
        messages = [*self.messages, {"role": "user", "content": text}]
        # The message alone, as the template writes it (which may trim it): too long by its length, no
        # new conversation would help.
        alone = self._render(messages[-1:], add_generation_prompt=True)
        check_length_fits(self._text_model, alone, self.runners)
        rendered = self._render(messages, add_generation_prompt=True) if self.messages else alone
        prompt = self._extend(self.tokens, self._text, rendered)
        if len(prompt) >= self.n_ctx and self.turns:
            check_fits(encode_rendered(self._text_model, alone), self.runners)  # a new one would not help
            raise ContextFull(
                f"the context is full: the conversation with this message is {len(prompt)} tokens, "
                f"the context holds {self.n_ctx}"
            )
        check_fits(prompt, self.runners)
        policy = self.effective_policy
        decoder = build_decoder(self.runners, policy, self.generation)
        self.thinking = answer_start(
            self._text_model.chat_template, rendered, self.generation.reasoning_format
        )
        request = _Request(messages, prompt, rendered, policy, self.generation, self.system)
        return self._stream(decoder.generate(prompt), request)

    def _stream(self, response: Response[TokenEvent, Summary], request: _Request) -> Iterator[TokenEvent]:
        events: list[TokenEvent] = []
        stream = iter(response)
        try:
            for event in stream:
                events.append(event)
                yield event
        finally:
            # a second Ctrl-C (or SIGTERM) waits, to be raised once the turn is recorded
            with main_thread_signals():
                try:
                    stream.close()  # the loop ends (its rollbacks done) before the turn is recorded
                finally:
                    last = response.last_event  # counted, but a Ctrl-C came before it was handed out
                    if last is not None and (not events or last.index > events[-1].index):
                        events.append(last)
                    self._close_turn(request, response.summary(), events)

    def _close_turn(self, request: _Request, summary: Summary, events: list[TokenEvent]) -> None:
        """Record the turn; close the answer with the template's end-of-turn text, cut or not."""
        runner = self._text_model
        content = [event.token for event in events]
        if content and summary.finish_reason == "stop" and runner.is_end_of_generation(content[-1]):
            content.pop()  # the template writes its own end of turn (align drops this token from a cache)
        answer = b"".join(runner.token_bytes(token) for token in content).decode("utf-8", errors="replace")
        messages = [*request.messages, {"role": "assistant", "content": answer}]
        closed = self._render(messages, add_generation_prompt=False)
        tokens = self._extend(request.prompt + content, request.rendered + answer, closed)
        turn = Turn(
            request.messages[-1]["content"],
            answer,
            tuple(events),
            summary,
            request.policy,
            request.generation,
            request.system,
        )
        # One assignment, so a second Ctrl-C cannot leave the tokens and the messages out of step.
        self.tokens, self.messages, self._text, self.turns, self.totals = (
            tokens,
            messages,
            closed,
            [*self.turns, turn],
            self.totals.add(summary),
        )

    def _render(self, messages: list[Message], *, add_generation_prompt: bool) -> str:
        system: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        rendered = render_chat(
            self._text_model,
            system + messages,
            add_generation_prompt=add_generation_prompt,
            template_kwargs=template_variables(self.generation.reasoning_budget),
        )
        assert rendered is not None  # the template's presence is checked in __init__
        return rendered

    def _extend(self, tokens: list[int], text: str, rendered: str) -> list[int]:
        """Tokens for ``rendered``, given ``tokens`` that stand for ``text``: when the rendering extends
        that text, only the new text is tokenized; otherwise the whole rendering is."""
        runner = self._text_model
        if tokens and rendered.startswith(text):
            return tokens + runner.tokenize(rendered[len(text) :], add_special=False)
        return encode_rendered(runner, rendered)

    def transcript(self) -> dict[str, object]:
        """The conversation as JSON-ready data: every answer token with its model and entropy, figures."""
        return {
            "models": {runner.name: runner.location for runner in self.runners},
            "system": self.system,
            "n_ctx": self.n_ctx,
            "conversation_tokens": self.tokens,
            "turns": [
                {
                    "system": turn.system,
                    "user": turn.user,
                    "answer": turn.answer,
                    "cut": turn.cut,
                    "policy": asdict(turn.policy),
                    "generation": asdict(turn.generation),
                    "tokens": [asdict(event) for event in turn.events],
                    "summary": asdict(turn.summary),
                }
                for turn in self.turns
            ],
            "session": {**asdict(self.totals), "large_share": self.totals.large_share},
        }

    def save(self, path: Path) -> None:
        """Write the transcript as JSON, whole or not at all (``write_whole``: a disk that fills midway
        leaves an earlier transcript as it was). A path that cannot be written is a one-line error."""
        text = json.dumps(self.transcript(), ensure_ascii=False, indent=1) + "\n"
        # A name's byte that is not UTF-8 (a model file's path) is a lone surrogate, which UTF-8 cannot
        # encode: escaped as ensure_ascii escapes it, it reads back as the same name.
        text = _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
        try:
            write_whole(path, text)
        except OSError as error:
            raise EadError(f"cannot write {shown_path(path)}: {error.strerror or error}") from None
        except ValueError as error:  # a name no file can have: a NUL byte in it
            raise EadError(f"cannot write {shown_path(path)}: {error}") from None

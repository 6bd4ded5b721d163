"""From the user's text to prompt token ids: the GGUF's own chat template (or one given in its place),
rendered in a sandbox."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
import llama_cpp
import numpy as np
from jinja2.sandbox import SecurityError
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from .errors import EadError, cut, quoted, shown_path
from .model_info import builtin_rendering, builtin_templates, template_family
from .paths import read_file_text, unreadable
from .remote import RemoteRunner
from .runner import Runner

Message = dict[str, Any]  # role and content; with tools, an assistant's tool_calls, a tool's tool_call_id
Runners = Sequence[Runner | RemoteRunner]  # a run's models, whose smallest context is the run's


def _token_text(runner: Runner, token: int) -> str:
    if token < 0:
        return ""
    text = llama_cpp.llama_vocab_get_text(runner.vocab, token)
    return ctypes.string_at(text).decode("utf-8", errors="replace") if text else ""


def check_prompt_text(text: str, what: str = "the prompt") -> str:
    """Refuse prompts nothing sensible can come of; ``what`` names where one came from in a message
    ('the prompt file NAME')."""
    if not text or text.isspace():  # not strip(): a copy of a long prompt
        raise EadError(f"{what} is empty", exit_code=2)
    check_text(text, what)
    return text


def check_text(text: str, what: str) -> None:
    """Refuse text for a model (a prompt, a system message) with a NUL byte, or that held bytes which are
    not UTF-8: Python keeps those of a terminal line, an argument or a pipe as lone surrogates, which the
    tokenizer cannot encode (a traceback where it meets them)."""
    if "\x00" in text:
        raise EadError(f"{what} contains a NUL byte", exit_code=2)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        byte = len(text[: error.start].encode("utf-8"))
        raise EadError(f"{what} is not valid UTF-8 (byte {byte})", exit_code=2) from None


class ChatTemplate(NamedTuple):
    """A chat template: a model's own, or one given in place of it (--chat-template, --chat-template-file,
    as llama-cli and llama-server take them) for every model of a run."""

    text: str  # a Jinja template, or the name of one of llama.cpp's builtin formatters
    origin: str  # how a message names it: 'the chat template of NAME.gguf', '--chat-template-file FILE'
    builtin: bool = False  # llama.cpp's own formatter, which takes no tools and no variables

    def render(
        self,
        messages: list[Message],
        *,
        eos: str = "",
        bos: str = "",
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The conversation as this template writes it (``render_chat``); any failure, and a rendering
        without text (which would leave nothing to decode), is a one-line error naming the template."""
        if self.builtin:
            turns = [(message["role"], message.get("content") or "") for message in messages]
            written = builtin_rendering(self.text, turns, add_generation_prompt)
            rendered = written.decode("utf-8", errors="replace") if written is not None else ""
        else:
            try:
                formatter = Jinja2ChatFormatter(
                    template=self.text,
                    eos_token=eos,
                    bos_token=bos,
                    add_generation_prompt=add_generation_prompt,
                )
                rendered = formatter(messages=messages, tools=tools, **(template_kwargs or {})).prompt
            except Exception as error:  # the template is a program from a file: what it raises is its fault
                raise EadError(f"{self.origin} failed: {_template_failure(error)}") from None
        if not rendered or rendered.isspace():  # the messages are never empty: one dropping them is broken
            raise EadError(f"{self.origin} rendered no text")
        return rendered


def given_template(name: str | None, file: Path | None, jinja: bool = True) -> ChatTemplate | None:
    """The chat template given in place of the models' own, checked before any model loads: a builtin's
    name (llama-server's --chat-template; its choices listed where it is none), a value with Jinja's
    markers (a template itself, as llama.cpp reads the option's value too), or a Jinja template's file,
    which without ``jinja`` (--no-jinja) is the builtin llama.cpp recognises it as (``without_jinja``);
    rendered once, as llama.cpp's common_chat_verify_template does, so one that fails is refused at the
    start (exit 2), not at each prompt. None: neither given."""
    if file is not None:
        origin = f"--chat-template-file {shown_path(file)}"
        try:
            template = ChatTemplate(read_file_text(file), origin)
        except (OSError, UnicodeDecodeError) as error:
            raise EadError(f"{origin} could not be read: {unreadable(error)}", exit_code=2) from None
    elif name is None:
        return None
    elif name in builtin_templates():
        template = ChatTemplate(name, f"--chat-template {name}", builtin=True)
    elif "{{" in name or "{%" in name:
        template = ChatTemplate(name, "--chat-template")
    else:
        raise EadError(
            f"--chat-template {quoted(name)} is no builtin template: choose one of "
            f"{', '.join(builtin_templates())}, or give a Jinja template (--chat-template-file FILE)",
            exit_code=2,
        )
    if not jinja:
        template = without_jinja(template)
    try:
        template.render([{"role": "user", "content": "test"}])
    except EadError as error:
        raise EadError(str(error), exit_code=2) from None
    return template


def without_jinja(template: ChatTemplate) -> ChatTemplate:
    """The builtin formatter of llama.cpp that writes ``template``'s chats under --no-jinja, as llama-server
    and llama-cli without Jinja do: the one it recognises the template as by its markers (its family,
    named as ``ead models show`` names it), which takes no tools and no variables; one it recognises as
    none is refused (exit 2)."""
    if template.builtin:
        return template
    family = template_family(template.text)
    if family in (None, "other"):
        message = (
            f"--no-jinja: llama.cpp's own formatters do not recognise {template.origin} "
            "(leave out --no-jinja to render it with Jinja)"
        )
        raise EadError(message, exit_code=2)
    name = family.split(" or ")[0]  # those named together write every turn alike
    return ChatTemplate(name, f"{template.origin}, as llama.cpp's {name} formatter writes it", builtin=True)


def chat_template(runner: Runner) -> ChatTemplate | None:
    """The template that writes ``runner``'s chats: the one given in place of its own
    (``runner.template_override``), else its GGUF's; None if it has neither."""
    if runner.template_override is not None:
        return runner.template_override
    own = runner.chat_template
    return ChatTemplate(own, f"the chat template of {shown_path(runner.path.name)}") if own else None


def override_template(runners: Runners, template: ChatTemplate) -> None:
    """Every local model of a run writes its chats with ``template``: the text that thinking.py and
    serve's tools read included (a builtin's is its name, which names neither)."""
    for runner in runners:
        if isinstance(runner, Runner):
            runner.chat_template = template.text
            runner.template_override = template


def render_chat(
    runner: Runner,
    messages: list[Message],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str | None:
    """The conversation as the model's chat template writes it (``chat_template``), or None if it has none.

    ``add_generation_prompt``: end with the opening of an assistant turn (False: the conversation as
    it stands, e.g. to find the text a new turn adds); ``tools``: OpenAI's tool definitions, which a
    template with tool support writes into the prompt; ``template_kwargs``: more variables for the
    template, as llama.cpp's ``chat_template_kwargs`` (``enable_thinking=False``: Qwen3's thinking off,
    where the template reads it). llama-cpp-python renders templates with
    jinja2's immutable sandbox, so a hostile template cannot reach files or Python internals.
    """
    template = chat_template(runner)
    if template is None:
        return None
    return template.render(
        messages,
        eos=_token_text(runner, llama_cpp.llama_vocab_eos(runner.vocab)),
        bos=_token_text(runner, llama_cpp.llama_vocab_bos(runner.vocab)),
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        template_kwargs=template_kwargs,
    )


def _template_failure(error: Exception) -> str:
    """One line on why a template failed; an error without a message (MemoryError) is named by its type."""
    if isinstance(error, jinja2.TemplateNotFound):
        return f"it includes {error.name!r}, and chat templates cannot load files"
    if isinstance(error, jinja2.TemplateSyntaxError):  # where, in a file of many lines
        return f"line {error.lineno}: {error.message or type(error).__name__}"
    lines = str(error).strip().splitlines()
    detail = lines[0] if lines else type(error).__name__
    return f"refused by the sandbox: {detail}" if isinstance(error, SecurityError) else detail


def render_prompt(
    runner: Runner,
    text: str,
    *,
    system: str | None = None,
    raw: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt's whole text: the chat template unless ``raw`` (or the model has none), given
    ``template_kwargs`` (``render_chat``)."""
    check_prompt_text(text)
    if system:
        check_text(system, "the system message")
    return _render_prompt(runner, text, system=system, raw=raw, template_kwargs=template_kwargs)


def encode_prompt(runner: Runner, text: str, *, raw: bool = False) -> list[int]:
    """Prompt token ids: the chat template unless ``raw`` (or the model has none), BOS as the vocab wants."""
    return encode_rendered(runner, render_prompt(runner, text, raw=raw))


def _render_prompt(
    runner: Runner, text: str, *, system: str | None, raw: bool, template_kwargs: dict[str, Any] | None = None
) -> str:
    """A prompt's text: the chat template's rendering unless ``raw``; without a template the system
    message, if any, leads the text."""
    messages: list[Message] = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    rendered = None if raw else render_chat(runner, messages, template_kwargs=template_kwargs)
    if rendered is None:
        rendered = text if raw or not system else f"{system}\n\n{text}"
    return rendered


def check_system_fits(runner: Runner, system: str, runners: Runners) -> None:
    """Refuse a system message that leaves no room for a message and an answer, naming it rather than
    the prompt it would make too long: the tokens counted are those of the prompt it opens with an empty
    message, the template's text around it included."""
    opened = _render_prompt(runner, "", system=system, raw=False)
    check_length_fits(runner, opened, runners, "the system message")
    check_fits(encode_rendered(runner, opened), runners, "the system message")


def encode_fitting(runner: Runner, rendered: str, runners: Runners) -> list[int]:
    """``encode_rendered`` for a prompt that must leave the context of ``runners`` room for an answer: one
    too long is refused, and one too long by its length alone before it is tokenized
    (``check_length_fits``)."""
    check_length_fits(runner, rendered, runners)
    prompt = encode_rendered(runner, rendered)
    check_fits(prompt, runners)
    return prompt


def encode_rendered(runner: Runner, rendered: str) -> list[int]:
    """Token ids of a whole prompt's text: BOS first if the vocab wants one and the text lacks it."""
    bos = _token_text(runner, llama_cpp.llama_vocab_bos(runner.vocab))
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(runner.vocab)) and not (bos and rendered.startswith(bos))
    return runner.tokenize(rendered, add_special=add_bos)


# The tokens llama.cpp's tokenizer finds by their text (its cache_special_tokens).
SPECIAL_ATTRIBUTES = (
    llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
)


def special_token_pattern(runner: Runner) -> re.Pattern[str] | None:
    """The texts the tokenizer reads as one special token each (``<|im_end|>``), longest first, as one
    pattern; None if the vocabulary has none. A pass over the vocabulary: ~50 ms for 151,936 tokens."""
    texts = {
        _token_text(runner, token)
        for token in range(runner.n_vocab)
        if llama_cpp.llama_vocab_get_attr(runner.vocab, token) & SPECIAL_ATTRIBUTES
    }
    texts.discard("")
    if not texts:
        return None
    return re.compile("|".join(re.escape(text) for text in sorted(texts, key=len, reverse=True)))


def check_special_tokens_fit(text: str, specials: re.Pattern[str] | None, n_ctx: int) -> None:
    """Refuse, before tokenizing it, a text holding more special tokens' texts than the context has room
    for: each is a token, and llama.cpp's tokenizer takes time quadratic in their number (20,000 take
    ~0.7 s, the ~400,000 of a 4 MiB request minutes), which a server must not spend on a prompt that
    ``check_fits`` would refuse anyway."""
    special = nth_special_token(text, specials, n_ctx)
    if special is not None:
        raise EadError(
            f"the prompt holds {n_ctx} or more special tokens (such as {special.group()!r}) and does not "
            f"fit the context of {n_ctx} tokens",
            exit_code=2,
        )


def nth_special_token(text: str, specials: re.Pattern[str] | None, n: int) -> re.Match[str] | None:
    """The ``n``-th special token's text in ``text`` and where it is, found without tokenizing it (None if
    it holds fewer): a bound on them is checked before llama.cpp's tokenizer spends time quadratic in
    their number, or the text cut there."""
    if specials is None:
        return None
    for count, special in enumerate(specials.finditer(text), 1):
        if count >= n:
            return special
    return None


# A text with fewer characters than this per token of the context is tokenized outright (ordinary text
# averages ~4 a token; llama.cpp holds ~75 bytes a token while it tokenizes: ~10 MB for 4096 tokens).
TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN = 32
C_WHITESPACE = " \t\n\v\f\r"  # what a special token's lstrip/rstrip swallows (C's isspace)


def fewest_tokens(runner: Runner, text: str, enough: int) -> int:
    """A lower bound on the tokens of ``text`` (0 where the tokenizer rewrites text first). From its
    length: a token stands for at most ``token_reach.longest`` bytes and a character is at least one, so
    every character counts but whitespace that a special token may swallow. Tighter where the tokens
    spell the text's bytes as they stand (``token_reach.by_pair``): from the longest piece each pair of
    bytes can start (``_fewest_by_pairs``), counted up to ``enough`` (the count that settles the question)
    over the text's first ``enough`` longest pieces, however long the rest."""
    reach = runner.token_reach
    if reach is None:
        return 0
    kept = len(text)
    if reach.strips_whitespace:
        kept -= sum(text.count(space) for space in C_WHITESPACE)
    by_length = -(-kept // reach.longest)
    if reach.by_pair is None or reach.strips_whitespace or by_length >= enough:
        return by_length
    head = text[: enough * reach.longest + 1].encode("utf-8")  # enough tokens end within it
    return max(by_length, _fewest_by_pairs(head, reach.by_pair, reach.longest, enough))


# Bytes read at a time by _fewest_by_pairs: its arrays take a few hundred KiB, whatever the text.
PAIR_BLOCK = 1 << 16


def _fewest_by_pairs(data: bytes, by_pair: np.ndarray, longest: int, enough: int) -> int:
    """A lower bound on the tokens that spell ``data``, counted up to ``enough``. A token that starts at
    byte i ends by i + reach(i), the longest piece starting with bytes i and i + 1 (``longest`` at the
    last byte), so the k-th token starts by e(k), where e(0) = 0 and e(k + 1) is the furthest i + reach(i)
    for any i up to e(k): the k for which e(k) first reaches the end is at most the count. Bytes that no
    piece longer than one starts (a run of 'z') are a token each, where the length alone says 1/longest."""
    furthest = count = end = 0
    for start in range(0, len(data), PAIR_BLOCK):
        stop = min(start + PAIR_BLOCK, len(data))
        block = np.frombuffer(data, dtype=np.uint8, count=min(stop + 1, len(data)) - start, offset=start)
        reach = np.full(stop - start, longest, dtype=np.int64)
        pairs = block[:-1].astype(np.int64) << 8 | block[1:]
        reach[: len(pairs)] = by_pair[pairs]
        ends = np.maximum.accumulate(np.arange(start, stop) + reach)
        ends = np.maximum(ends, furthest)
        furthest = int(ends[-1])
        while start <= end < stop and count < enough:
            end = int(ends[end - start])
            count += 1
        if count >= enough:
            break
    return count


def check_length_fits(runner: Runner, text: str, runners: Runners, what: str = "the prompt") -> None:
    """Refuse, before tokenizing it with ``runner``, a text too long for the context of ``runners`` by its
    length alone: llama.cpp's tokenizer holds every token of the whole text (~75 bytes each, ~750 MB for
    10 MB of text) whatever the buffer it is given. A text short enough to tokenize cheaply skips the
    vocabulary pass this takes. ``what`` is what is too long."""
    n_ctx = context_size(runners)
    if len(text) < n_ctx * TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN:
        return
    fewest = fewest_tokens(runner, text, n_ctx)
    if fewest >= n_ctx:
        past = _past_the_context(runners, what)
        raise EadError(f"{what} is at least {fewest} tokens ({len(text)} characters), {past}", exit_code=2)


def check_fits(prompt: list[int], runners: Runners, what: str = "the prompt") -> None:
    """A prompt must leave room in the context of ``runners`` for at least one generated token; ``what``
    is what is too long."""
    if len(prompt) >= context_size(runners):
        raise EadError(f"{what} is {len(prompt)} tokens, {_past_the_context(runners, what)}", exit_code=2)


def context_size(runners: Runners) -> int:
    """The run's context: every model holds the whole sequence."""
    return min(runner.n_ctx for runner in runners)


def context_advice(runners: Runners) -> str:
    """How to make the context larger: --ctx sizes the local models', a server its own, which is the run's
    where it is the smallest ('raise --ctx' had been the advice there, which changed nothing). The
    server's -c is named as llama-server's: ead's own -c is --ctx."""
    narrowest = min(runners, key=lambda runner: runner.n_ctx)  # the first, a local one, in a tie
    if isinstance(narrowest, RemoteRunner):
        return f"start the llama-server at {cut(narrowest.url)} with a larger context, llama-server -c N"
    return "raise --ctx"


def _past_the_context(runners: Runners, what: str) -> str:
    n_ctx = context_size(runners)
    return (
        f"too many for the context of {n_ctx} tokens: it takes at most {n_ctx - 1}, to leave room for "
        f"the answer ({context_advice(runners)} or shorten {what})"
    )


# llama-server's fill-in-the-middle layout (format_prompt_infill, tools/server): the repository's name and
# the current file's, which it writes having none from the request, and what parts extra files where the
# vocabulary has no file separator.
FIM_REPOSITORY = "myproject\n"
FIM_CURRENT_FILE = "filename\n"
FIM_SNIPPET = "\n\n--- snippet ---\n\n"


class KeptTokens(NamedTuple):
    """The tokens kept of a text's end or start, and whether the text has more (its tokens were cut)."""

    tokens: list[int]
    cut: bool


class InfillCut(NamedTuple):
    """What a fill-in-the-middle prompt keeps of the code at the cursor where llama-server's /infill cuts
    it to the batch: the tokens kept before the cursor and after it (None: all of them), and the batch."""

    prefix_kept: int | None
    suffix_kept: int | None
    batch: int


def line_start_before(text: str, chars: int) -> int:
    """Where the last line of ``text`` that starts at least ``chars`` characters before its end starts:
    after a newline, at a printable ASCII character (a blank that indents a line is none); 0 where none
    does. Pre-tokenizers that cut at lines (``Runner.cuts_at_lines``) split every text there."""
    end = len(text) - chars
    while end > 0:
        newline = text.rfind("\n", 0, end)
        if newline < 0:
            return 0
        if "!" <= text[newline + 1] <= "~":
            return newline + 1
        end = newline
    return 0


def line_end_after(text: str, chars: int) -> int:
    """Where the first line of ``text`` that ends at least ``chars`` characters after its start ends:
    after an ASCII letter or digit, at a newline; ``len(text)`` where none does."""
    start = max(chars, 1)
    while (newline := text.find("\n", start)) >= 0:
        if text[newline - 1].isascii() and text[newline - 1].isalnum():
            return newline
        start = newline + 1
    return len(text)


def tail_tokens(runner: Runner, text: str, keep: int) -> KeptTokens:
    """The last ``keep`` tokens of ``text`` read as text, as the whole text's tokens end, for llama-server's
    cut of /infill's prefix, and whether the text has more. Where the vocabulary cuts at lines, only the
    text from the last line start with ``keep`` of its longest tokens after it is read (as many characters
    give at least that many tokens): a 4 MiB prefix had been tokenized whole, a million tokens, for its
    last 384."""
    if keep <= 0:
        return KeptTokens([], bool(text))
    chars = _kept_chars(runner, text, keep)
    start = 0 if chars is None else line_start_before(text, chars)
    read = _plain(runner, text[start:])
    return KeptTokens(read[-keep:], start > 0 or len(read) > keep)


def head_tokens(runner: Runner, text: str, keep: int) -> KeptTokens:
    """The first ``keep`` tokens of ``text`` read as text (/infill's suffix), read as ``tail_tokens``
    reads a text's end: from its start to the first line end with ``keep`` longest tokens before it."""
    if keep <= 0:
        return KeptTokens([], bool(text))
    chars = _kept_chars(runner, text, keep)
    end = len(text) if chars is None else line_end_after(text, chars)
    read = _plain(runner, text[:end])
    return KeptTokens(read[:keep], end < len(text) or len(read) > keep)


def _kept_chars(runner: Runner, text: str, keep: int) -> int | None:
    """How many characters of a text's end (or start) hold its ``keep`` tokens there, a token standing
    for at most ``token_reach.longest`` bytes; None where the whole text is read: a short one (tokenized
    outright, without the vocabulary's passes this takes), or a vocabulary that does not cut at lines or
    has a token that swallows blanks (a text's length bounds its tokens no more)."""
    if len(text) < keep * TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN:
        return None
    reach = runner.token_reach
    if reach is None or reach.strips_whitespace or not runner.cuts_at_lines:
        return None
    return keep * reach.longest


def _plain(runner: Runner, text: str) -> list[int]:
    """A text's tokens, its special tokens' texts read as text (code around a cursor: a file that holds
    ``<|im_end|>`` ends nothing)."""
    return runner.tokenize(text, add_special=False, parse_special=False)


def encode_infill(
    runner: Runner,
    prefix: str,
    suffix: str,
    *,
    extra: Sequence[tuple[str, str]] = (),
    middle: str = "",
    answer_tokens: int,
    runners: Runners,
    on_cut: Callable[[InfillCut], None] | None = None,
) -> list[int]:
    """The token ids of a fill-in-the-middle prompt, the code before the cursor (``prefix``) and after it
    (``suffix``), with other files of the project (``extra``: name and text) before them and ``middle``
    after the prefix, laid out and trimmed as llama-server's /infill does, so that an editor's client gets
    the answer it would get there: the prefix's last three quarters of a batch, the suffix's first quarter
    less the middle, and the extra files' last tokens that leave the context a batch and twice the answer
    limit (``answer_tokens``: the server's or command's, llama-server's -n, not a request's: a client's
    n_predict does not move the room). The code is read as text (a special token's text in a file is no
    token), the middle as a prompt is. A model without FIM tokens, or a prompt too long for the context,
    is refused. ``on_cut`` is told where the prefix or the suffix is cut (``ead generate`` says so)."""
    pre, suf, mid = check_infill(runner)
    check_text(prefix, "the prefix")
    check_text(suffix, "the suffix")
    check_text(middle, "the prompt")
    for name, text in extra:
        check_text(name, "an extra file's name")
        check_text(text, f"the extra file {quoted(name)}")

    middle_tokens = runner.tokenize(middle, add_special=False, parse_special=True)
    n_batch, n_ctx = runner.n_batch, context_size(runners)
    extra_tokens = _extra_tail(runner, extra, max(0, n_ctx - n_batch - 2 * answer_tokens))
    before = tail_tokens(runner, prefix, 3 * (n_batch // 4))
    after = head_tokens(runner, suffix, n_batch // 4 - (2 + len(middle_tokens)))
    prefix_tokens, suffix_tokens = before.tokens, after.tokens
    if on_cut and (before.cut or after.cut):
        kept = (len(prefix_tokens) if before.cut else None, len(suffix_tokens) if after.cut else None)
        on_cut(InfillCut(*kept, n_batch))
    add_bos = llama_cpp.llama_vocab_get_add_bos(runner.vocab)
    bos = [llama_cpp.llama_vocab_bos(runner.vocab)] if add_bos else []
    prompt = [
        *extra_tokens,
        *bos,
        *(pre, *prefix_tokens, *middle_tokens),
        *(suf, *suffix_tokens),
        mid,
    ]
    check_fits(prompt, runners)
    return prompt


def _extra_tail(runner: Runner, extra: Sequence[tuple[str, str]], room: int) -> list[int]:
    """The last ``room`` tokens of the extra files' part of a fill-in-the-middle prompt (the repository's
    name, each file after its separator and name, or a snippet's, and the current file's name), as
    llama-server's n_extra_take takes them from the whole part's tokens: read from the end, a file only as
    far as the room reaches (``tail_tokens``), none before it (a project's files had been tokenized whole
    for the few hundred tokens of them kept)."""
    repository = llama_cpp.llama_vocab_fim_rep(runner.vocab)
    separator = llama_cpp.llama_vocab_fim_sep(runner.vocab)
    pieces: list[list[int] | str] = []  # in the prompt's order: tokens, or a text read as text
    if repository != llama_cpp.LLAMA_TOKEN_NULL:
        pieces += [[repository], FIM_REPOSITORY]
    for name, text in extra:
        pieces += [[separator], f"{name}\n"] if separator != llama_cpp.LLAMA_TOKEN_NULL else [FIM_SNIPPET]
        pieces.append(text)
    if separator != llama_cpp.LLAMA_TOKEN_NULL:
        pieces += [[separator], FIM_CURRENT_FILE]
    kept: list[int] = []
    for piece in reversed(pieces):
        if len(kept) >= room:
            break
        if isinstance(piece, str):
            tail = tail_tokens(runner, piece, room - len(kept))
            kept[:0] = tail.tokens
            if tail.cut:
                break
        else:
            kept[:0] = piece[max(0, len(piece) - (room - len(kept))) :]
    return kept


def check_infill(runner: Runner) -> tuple[int, int, int]:
    """The prefix, suffix and middle tokens of a fill-in-the-middle prompt; a model without them refused,
    named."""
    tokens = infill_tokens(runner)
    if tokens is None:
        raise EadError(
            f"{shown_path(runner.label)} has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
            "<|fim_middle|>): it cannot complete code at a cursor",
            exit_code=2,
        )
    return tokens


def infill_tokens(runner: Runner) -> tuple[int, int, int] | None:
    """The prefix, suffix and middle tokens of the vocabulary (llama.cpp's, from the GGUF or found by their
    text), or None if it lacks one: the model cannot fill in the middle."""
    vocab = runner.vocab
    tokens = (
        llama_cpp.llama_vocab_fim_pre(vocab),
        llama_cpp.llama_vocab_fim_suf(vocab),
        llama_cpp.llama_vocab_fim_mid(vocab),
    )
    return None if llama_cpp.LLAMA_TOKEN_NULL in tokens else tokens

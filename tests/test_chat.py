"""The conversation library on real llama.cpp with tiny models: token bookkeeping across turns, KV
reuse, cut answers, a full context, settings, the JSON transcript."""

from __future__ import annotations

import itertools
import json
import re
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from types import FrameType

import numpy as np
import pytest
from ctrl_c import indices_before_ctrl_c
from tiny_models import CHATML, NEAR_UNIFORM_SCALE, open_pair, write_tiny_model

from ead_cli.chat import ContextFull, Conversation, Turn
from ead_cli.decoder import Decoder
from ead_cli.errors import EadError
from ead_cli.options import GenerationOptions, PolicyOptions
from ead_cli.prompt import encode_prompt, encode_rendered, render_chat, render_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

SYSTEM = "Answer briefly."
SWITCHING = PolicyOptions(tau=3.0)  # the tiny pair's entropies cross 3 bits: both models write


def answer(conversation: Conversation, text: str) -> Turn:
    for _ in conversation.ask(text):
        pass
    return conversation.turns[-1]


def content(turn: Turn) -> list[int]:
    """The answer's tokens as the conversation keeps them: without a final end-of-generation token."""
    tokens = [event.token for event in turn.events]
    return tokens[:-1] if turn.summary.finish_reason == "stop" else tokens


def test_the_token_list_is_the_template_text_with_the_answers_as_written(runners: list[Runner]) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=12), system=SYSTEM)
    first = answer(conversation, "hello wörld")
    after_first = list(conversation.tokens)
    second = answer(conversation, "and again")
    tokens = conversation.tokens

    # The first prompt is exactly what `ead generate` sends; later turns only append.
    sent = encode_rendered(runners[0], render_prompt(runners[0], "hello wörld", system=SYSTEM))
    assert tokens[: first.summary.prompt_tokens] == sent
    assert tokens[: len(after_first)] == after_first
    assert second.summary.prompt_tokens > len(after_first)

    # Each answer sits where its turn's prompt ends, as the tokens the models wrote ...
    spans = []
    for turn in (first, second):
        start, written = turn.summary.prompt_tokens, content(turn)
        assert tokens[start : start + len(written)] == written
        spans.append(range(start, start + len(written)))
    # ... and everything else is the template's own text, tokenized as a whole rendering would be.
    scaffold = [token for i, token in enumerate(tokens) if not any(i in span for span in spans)]
    empty_answers = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hello wörld"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "and again"},
        {"role": "assistant", "content": ""},
    ]
    assert scaffold == encode_rendered(
        runners[0], render_chat(runners[0], empty_answers, add_generation_prompt=False)
    )
    assert conversation.messages == [
        {"role": "user", "content": "hello wörld"},
        {"role": "assistant", "content": first.answer},
        {"role": "user", "content": "and again"},
        {"role": "assistant", "content": second.answer},
    ]


def test_a_new_turn_reads_only_what_each_model_has_not_seen(
    runners: list[Runner], tiny_pair: tuple[Path, Path]
) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=30))
    first = answer(conversation, "hello")
    read = [runner.n_past for runner in runners]
    closed = len(conversation.tokens)
    second = answer(conversation, "tell me more")
    prompt = second.summary.prompt_tokens
    assert {event.model for event in first.events + second.events} == {"small", "large"}
    for report, already in zip(second.summary.models, read, strict=True):
        # Nothing of the first turn's prompt is read again; a model reads the answer tokens it skipped
        # (at least the last one: no model reads it during the answer), the end of turn, the new turn.
        assert first.summary.prompt_tokens <= already < first.summary.prompt_tokens + first.summary.generated
        assert report.prefill_tokens == prompt - already
        assert report.prefill_tokens < prompt - first.summary.prompt_tokens
    assert prompt - closed == len(
        runners[0].tokenize(
            "<|im_start|>user\ntell me more<|im_end|>\n<|im_start|>assistant\n", add_special=False
        )
    )
    # The reused caches hold exactly what a fresh read of the whole conversation gives.
    tokens = conversation.tokens[:-1]
    for runner, path in zip(runners, tiny_pair, strict=True):
        reused = runner.sync(tokens, prompt_len=len(tokens), own_tail=False).copy()
        with Runner(path, name="fresh", n_ctx=512, n_threads=1) as fresh:
            expected = fresh.sync(tokens, prompt_len=len(tokens), own_tail=False)
            np.testing.assert_allclose(reused, expected, rtol=0, atol=0.01)


def test_with_one_model_the_second_prefill_is_exactly_the_new_tokens(runners: list[Runner]) -> None:
    conversation = Conversation(runners, PolicyOptions(mode="small"), GenerationOptions(max_tokens=20))
    first = answer(conversation, "hello")
    assert first.summary.finish_reason == "length"
    second = answer(conversation, "more")
    small, large = second.summary.models
    answered = first.summary.prompt_tokens + first.summary.generated
    # The answer's last token (never read while answering), then the template's new text.
    assert small.prefill_tokens == 1 + second.summary.prompt_tokens - answered
    assert large.prefill_tokens == 0


def test_a_stream_closed_early_is_kept_cut_and_closed_like_the_template(runners: list[Runner]) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=100))
    stream = conversation.ask("hello")
    events = list(itertools.islice(stream, 5))
    stream.close()  # what Ctrl-C does in the REPL
    turn = conversation.turns[-1]
    assert turn.cut and turn.summary.finish_reason == "interrupted"
    assert [e.token for e in turn.events] == [e.token for e in events]
    end_of_turn = runners[0].tokenize("<|im_end|>\n", add_special=False)
    assert (
        conversation.tokens == conversation.tokens[: turn.summary.prompt_tokens] + content(turn) + end_of_turn
    )
    assert conversation.messages[-1] == {"role": "assistant", "content": turn.answer}

    closed = list(conversation.tokens)
    following = answer(conversation, "go on")
    assert following.summary.generated == 100
    assert conversation.tokens[: len(closed)] == closed
    assert following.summary.prompt_tokens > len(closed)


def test_a_second_ctrl_c_while_a_cut_answer_is_closed_still_records_it(runners: list[Runner]) -> None:
    """A second Ctrl-C that lands while the first one's answer is being closed (here sent the moment the
    turn starts being recorded) had stopped the recording: no turn, and the REPL died of an IndexError
    reading it. It now waits until the turn is recorded, then stops as a Ctrl-C does."""
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=100))
    stream = conversation.ask("hello")
    events = list(itertools.islice(stream, 5))
    record = Conversation._close_turn.__code__

    def second_ctrl_c(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame.f_code is record:
            sys.setprofile(None)
            # to the main thread: ead's other threads block it
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    sys.setprofile(second_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            stream.close()  # the first Ctrl-C, in the REPL
    finally:
        sys.setprofile(None)
    [turn] = conversation.turns
    assert turn.cut and [e.token for e in turn.events] == [e.token for e in events]
    assert conversation.messages[-1] == {"role": "assistant", "content": turn.answer}


def test_a_ctrl_c_between_counting_and_handing_out_a_token_keeps_it_in_the_turn(
    runners: list[Runner],
) -> None:
    """A Ctrl-C after the decoder counted a token but before the stream handed it out had left the turn
    one token short of its summary (and of the answer the models had read): the turn takes the token
    counted (``last_event``). The profiler trips SIGINT as the fourth token is counted."""
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=100))
    stream = conversation.ask("hello")
    try:
        handed_out = indices_before_ctrl_c(stream, Decoder._announce.__code__, 4)
    finally:
        stream.close()
    [turn] = conversation.turns
    assert handed_out == [0, 1, 2]
    assert [event.index for event in turn.events] == [0, 1, 2, 3] and turn.summary.generated == 4


def test_an_end_of_generation_token_gives_way_to_the_templates_end_of_turn(tmp_path: Path) -> None:
    # Near-uniform models: each step draws <|endoftext|> or <|im_end|> with probability 2/267.
    paths = tuple(
        write_tiny_model(tmp_path / f"{role}.gguf", seed=seed, logit_scale=NEAR_UNIFORM_SCALE)
        for role, seed in (("small", 0), ("large", 1))
    )
    runners = open_pair(paths)
    sampling = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    try:
        for seed in range(40):
            conversation = Conversation(
                runners, SWITCHING, GenerationOptions(replace(sampling, seed=seed), max_tokens=400)
            )
            turn = answer(conversation, "hello")
            if turn.summary.finish_reason == "stop":
                break
        else:
            pytest.fail("no seed ended an answer with an end-of-generation token")
        assert not turn.cut
        assert runners[0].is_end_of_generation(turn.events[-1].token)
        start = turn.summary.prompt_tokens
        written = [event.token for event in turn.events[:-1]]
        end_of_turn = runners[0].tokenize("<|im_end|>\n", add_special=False)
        assert conversation.tokens[start:] == written + end_of_turn
    finally:
        for runner in runners:
            runner.close()


def test_a_new_system_message_re_renders_the_conversation(runners: list[Runner]) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=8))
    first = answer(conversation, "hello")
    conversation.system = SYSTEM
    second = answer(conversation, "more")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first.answer},
        {"role": "user", "content": "more"},
    ]
    expected = encode_rendered(runners[0], render_chat(runners[0], messages))
    assert conversation.tokens[: second.summary.prompt_tokens] == expected


def test_chat_max_tokens_minus_one_answers_until_the_context_is_full(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """ead chat -n -1 (llama.cpp's no limit) had been refused: the answer runs to the context's end, and
    /max-tokens -1 sets it in a conversation too."""
    from test_cli import ead

    saved = tmp_path / "chat.json"
    args = ["chat", "--large", str(tiny_pair[1]), "--threads", "1", "--ctx", "256"]
    for given, commands in (
        (["-n", "-1"], f"hello\n/save {saved}\n"),
        (["-n", "4"], f"/max-tokens -1\nhello\n/save {saved}\n"),
    ):
        result = ead(*args, *given, stdin=commands)
        assert result.returncode == 0, result.stderr
        (turn,) = json.loads(saved.read_text())["turns"]
        assert turn["summary"]["finish_reason"] == "length"
        assert turn["summary"]["prompt_tokens"] + turn["summary"]["generated"] == 257


def test_a_full_context_refuses_the_next_turn_until_a_reset(tiny_pair: tuple[Path, Path]) -> None:
    runners = open_pair(tiny_pair, n_ctx=64)  # llama.cpp makes it 256
    try:
        conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=1000))
        first = answer(conversation, "hello")
        assert first.summary.finish_reason == "length"
        assert first.summary.prompt_tokens + first.summary.generated == conversation.n_ctx + 1
        assert conversation.full
        before = (list(conversation.tokens), len(conversation.turns))
        with pytest.raises(ContextFull, match=r"the context is full: .* \d+ tokens, the context holds 256"):
            conversation.ask("more")
        assert (conversation.tokens, len(conversation.turns)) == before
        # A message too long for any conversation is told so, not sent to /reset, which would not help.
        too_long = "word " * 300
        with pytest.raises(EadError, match=r"^the prompt is \d+ tokens, too many for the context") as full:
            conversation.ask(too_long)
        assert not isinstance(full.value, ContextFull)
        assert (conversation.tokens, len(conversation.turns)) == before
        conversation.reset()
        assert not conversation.full and conversation.turns == []
        with pytest.raises(EadError) as fresh:
            conversation.ask(too_long)
        assert str(fresh.value) == str(full.value)
        again = answer(conversation, "hello")
        assert again.summary.generated > 0
        assert conversation.totals.answers == 2
    finally:
        for runner in runners:
            runner.close()


def test_bad_settings_are_refused_and_change_nothing(runners: list[Runner]) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=4))
    with pytest.raises(EadError, match="window must be at least 1, got 0"):
        conversation.configure(replace(SWITCHING, window=0), conversation.generation)
    assert conversation.policy == SWITCHING
    conversation.configure(replace(SWITCHING, tau=1000.0), conversation.generation)
    assert answer(conversation, "hello").summary.large_share == 0.0
    with pytest.raises(EadError, match="the prompt is empty"):
        conversation.ask("  ")
    assert len(conversation.turns) == 1


def test_a_system_message_is_refused_for_what_a_prompt_is_refused_for(runners: list[Runner]) -> None:
    """A NUL byte, which a prompt is refused for (as serve refuses it in a system message), had passed in
    /system: it is refused the same way, and the system message stays as it was."""
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=4), system=SYSTEM)
    for text, message in (
        ("be\x00brief", "the system message contains a NUL byte"),
        ("be \udcffrief", r"the system message is not valid UTF-8 \(byte 3\)"),
    ):
        with pytest.raises(EadError, match=f"^{message}$"):
            conversation.system = text
        assert conversation.system == SYSTEM


def test_a_system_message_longer_than_the_context_is_refused_by_name_at_once(runners: list[Runner]) -> None:
    """A system message that leaves no room for a message had been taken, and each message then refused as
    'the prompt is 628 tokens': it is refused by name when given, at the start or later, and a system
    message given later leaves the one before in place. Each 'z' is one token; the template adds 28."""

    def too_long(tokens: int) -> str:
        return re.escape(
            f"the system message is {tokens} tokens, too many for the context of 512 tokens: it takes at "
            "most 511, to leave room for the answer (raise --ctx or shorten the system message)"
        )

    generation = GenerationOptions(max_tokens=4)
    with pytest.raises(EadError, match=f"^{too_long(628)}$"):
        Conversation(runners, SWITCHING, generation, system="z" * 600)
    conversation = Conversation(runners, SWITCHING, generation, system=SYSTEM)
    with pytest.raises(EadError, match=f"^{too_long(512)}$"):
        conversation.system = "z" * 484
    assert conversation.system == SYSTEM
    conversation.system = "z" * 483  # 511 tokens with the template's: room for an answer, if not a message
    assert conversation.system == "z" * 483
    # One too long by its length alone is refused before it is tokenized (~75 bytes a token meanwhile).
    too_long_by_length = re.escape(
        "the system message is at least 1267 tokens (16464 characters), too many for the context of "
        "512 tokens: it takes at most 511, to leave room for the answer (raise --ctx or shorten the "
        "system message)"
    )
    with pytest.raises(EadError, match=f"^{too_long_by_length}$"):
        conversation.system = "z" * 16_384
    assert conversation.system == "z" * 483


def test_a_message_is_bounded_by_its_length_as_the_template_writes_it(
    tmp_path: Path, tiny_large: Path
) -> None:
    """A template may rewrite a message (Llama 3's and Gemma's trim it): a message of 'hi' and 20,000
    spaces is a few tokens as written, and had been refused as 'at least 1539 tokens' by the length of
    the text typed."""
    trimming = write_tiny_model(
        tmp_path / "trimming.gguf", chat_template=CHATML.replace("message.content", "message.content | trim")
    )
    runners = open_pair((trimming, tiny_large), n_ctx=256)
    try:
        conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=2))
        prompt_tokens = answer(conversation, "hi" + " " * 20_000).summary.prompt_tokens
        assert prompt_tokens == len(encode_prompt(runners[0], "hi"))
        with pytest.raises(EadError, match=r"^the prompt is at least \d+ tokens \(\d+ characters\)"):
            conversation.ask("z" * 20_000 + "  ")  # too long as written too: refused before tokenizing
    finally:
        for runner in runners:
            runner.close()


def test_a_model_without_a_chat_template_is_refused(tmp_path: Path, tiny_large: Path) -> None:
    bare = write_tiny_model(tmp_path / "bare.gguf", chat_template=None)
    runners = open_pair((bare, tiny_large))
    try:
        with pytest.raises(EadError, match=r"bare\.gguf has no chat template"):
            Conversation(runners, SWITCHING, GenerationOptions())
    finally:
        for runner in runners:
            runner.close()


def test_the_transcript_has_every_token_with_its_model_and_entropy(
    runners: list[Runner], tmp_path: Path
) -> None:
    conversation = Conversation(runners, SWITCHING, GenerationOptions(max_tokens=10))
    turns = [answer(conversation, "hello"), answer(conversation, "more")]
    path = tmp_path / "chat.json"
    conversation.save(path)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["conversation_tokens"] == conversation.tokens
    for data, turn in zip(saved["turns"], turns, strict=True):
        assert data["answer"] == turn.answer
        assert [t["token"] for t in data["tokens"]] == [e.token for e in turn.events]
        assert [t["model"] for t in data["tokens"]] == [e.model for e in turn.events]
        assert [t["entropy"] for t in data["tokens"]] == [e.entropy for e in turn.events]
        assert data["summary"]["prompt_tokens"] == turn.summary.prompt_tokens
        assert data["policy"]["tau"] == 3.0
    assert saved["session"]["generated"] == 20
    with pytest.raises(EadError, match="cannot write"):
        conversation.save(tmp_path / "missing" / "chat.json")


def test_the_default_mode_chats_with_the_large_model_alone_until_a_command_turns_the_pair_on(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """ead chat in the default mode loads the large model alone; /mode ead loads the small one, which
    reads the conversation so far and writes from the next answer. A small file that cannot load is
    a one-line error at that command, and the chat goes on with the large model."""
    from test_cli import ead, pair_args

    saved = tmp_path / "chat.json"
    commands = f"hello\n/mode ead\nhello again\n/save {saved}\n"
    result = ead("chat", *pair_args(tiny_pair), "--temp", "0", "--max-tokens", "12", stdin=commands)
    assert result.returncode == 0, result.stderr
    assert "loading the small model" in result.stderr.decode()
    transcript = json.loads(saved.read_text())
    assert list(transcript["models"]) == ["small", "large"]
    first, second = transcript["turns"]
    assert {token["model"] for token in first["tokens"]} == {"large"}
    first_models = {model["role"]: model for model in first["summary"]["models"]}
    second_models = {model["role"]: model for model in second["summary"]["models"]}
    assert list(first_models) == ["large"] and list(second_models) == ["small", "large"]
    assert second["policy"]["mode"] == "ead"
    # The small model reads the whole conversation on joining; the large one only the new turn.
    read_before = first_models["large"]["prefill_tokens"] + len(first["tokens"])
    assert second_models["small"]["prefill_tokens"] > read_before > second_models["large"]["prefill_tokens"]

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_pair[0].read_bytes()[:4096])
    broken = ead("chat", *pair_args((cut, tiny_pair[1])), "--max-tokens", "4", stdin="hi\n/mode ead\nhi\n")
    errors = [line for line in broken.stderr.decode().splitlines() if line.startswith("error:")]
    assert broken.returncode == 1 and len(errors) == 1 and "could not load" in errors[0]
    assert broken.stdout.decode().count("\n") >= 2  # both answers, by the large model

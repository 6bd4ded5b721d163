"""A thinking model's answer split into reasoning and content (ead_cli/thinking.py), without a model;
thinking turned off through the chat template (a tiny model whose template reads ``enable_thinking``);
and `ead generate`'s and `ead chat`'s --reasoning-format, --reasoning-budget and --hide-thinking on a tiny
thinking pair."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_cli import ANSI_CODES, at_a_terminal, ead, large_args, pair_args
from tiny_models import CHATML, THINKING_TEMPLATE, vocabulary, write_scripted_pair, write_tiny_model

from ead_cli.cli.render import DIM, DONE_THINKING, RESET, THINKING
from ead_cli.decoder import Decoder
from ead_cli.engine import block_tags
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_rendered, render_chat
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams
from ead_cli.serve.converter import json_schema_grammar
from ead_cli.thinking import (
    COUNTING,
    DONE,
    FORCING,
    IDLE,
    WAITING_UTF8,
    BlockTags,
    ReasoningBudget,
    ReasoningSplitter,
    Split,
    opens_thinking,
    split_reasoning,
    thinks,
    utf8_complete,
)


def pushed_apart(pieces: list[str], inside: bool = False) -> list[Split]:
    """Each piece's split, then the flush's."""
    splitter = ReasoningSplitter(inside)
    return [splitter.push(piece) for piece in pieces] + [splitter.flush()]


def joined(splits: list[Split]) -> Split:
    return Split("".join(s.reasoning for s in splits), "".join(s.content for s in splits))


@pytest.mark.parametrize(
    ("text", "inside", "expected"),
    [
        ("<think>\nweigh it\n</think>\n\nThe answer.", False, Split("weigh it", "The answer.")),
        ("  <think>a</think>b", False, Split("a", "b")),  # whitespace before the block is no content
        ("weigh it</think>\n\nThe answer.", True, Split("weigh it", "The answer.")),  # opened by the prompt
        ("<think>\n\n</think>\n\nThe answer.", False, Split("", "The answer.")),  # thinking off (Qwen3)
        ("<think>cut off at the limi", False, Split("cut off at the limi", "")),  # an unfinished block
        ("Just an answer.", False, Split("", "Just an answer.")),
        ("\nJust an answer.", False, Split("", "\nJust an answer.")),  # no block: the text as it was
        ("Say <think>x</think> here", False, Split("", "Say <think>x</think> here")),  # not at the start
        ("<think>a</think>b</think>c", False, Split("a", "b</think>c")),  # the first close ends it
        ("<thin", False, Split("", "<thin")),  # a marker's beginning that never finished
        ("a <b> </thinker", True, Split("a <b> </thinker", "")),
    ],
)
def test_an_answer_splits_as_llama_cpps_deepseek_format(text: str, inside: bool, expected: Split) -> None:
    assert split_reasoning(text, inside) == expected


@pytest.mark.parametrize("inside", [False, True])
def test_any_cut_into_tokens_gives_the_whole_answers_split(inside: bool) -> None:
    """Markers and whitespace split across tokens anywhere: the pieces add up to the whole's split, and
    no piece gives out text that a later one turns into something else."""
    text = ("" if inside else " <think>") + "\nstep one\n\nstep two \n</think>\n\nThe answer: <think>."
    whole = split_reasoning(text, inside)
    assert whole == Split("step one\n\nstep two", "The answer: <think>.")
    for size in (1, 2, 3, 5):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert joined(pushed_apart(pieces, inside)) == whole
    for cut in range(len(text) + 1):
        assert joined(pushed_apart([text[:cut], text[cut:]], inside)) == whole


def test_reasoning_is_given_out_as_it_comes_and_a_marker_is_held_until_known() -> None:
    splits = pushed_apart(["<thi", "nk>Let me ", "see. </thi", "nk>", "\n", "Yes", "."])
    assert splits == [
        Split("", ""),  # maybe a marker
        Split("Let me", ""),  # the space may be the reasoning's last
        Split(" see.", ""),  # '</thi' may close the block
        Split("", ""),
        Split("", ""),  # whitespace after the block
        Split("", "Yes"),
        Split("", "."),
        Split("", ""),
    ]


def test_thinking_templates_and_prompts_that_open_the_block_are_told_apart() -> None:
    assert thinks(THINKING_TEMPLATE) and not thinks("{{ messages }}") and not thinks(None)
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("<|im_start|>assistant\n")


def test_block_tags_tell_a_prompt_that_leaves_the_block_open_by_its_tokens() -> None:
    """As ``opens_thinking`` over text, with tags of several tokens: the last start after the last end."""
    tags = BlockTags(start=(7, 8), end=(9, 8))
    assert tags.left_open([1, 7, 8, 2]) and tags.left_open([7, 8, 3, 9, 8, 7, 8])
    assert (
        not tags.left_open([7, 8, 3, 9, 8]) and not tags.left_open([1, 2]) and not tags.left_open([7, 2, 8])
    )


# llama.cpp's reasoning-budget tests' tokens (tests/test-reasoning-budget.cpp): <think> 100, </think> 101,
# a message 102
START, END, MESSAGE = 100, 101, 102


def written(
    wanted: list[int],
    budget: int,
    prompt: tuple[int, ...] = (),
    token_bytes: Callable[[int], bytes] | None = None,
    ends: tuple[tuple[int, ...], ...] = ((END,),),
) -> tuple[list[int], list[str]]:
    """The tokens an answer writes where a model would write ``wanted`` in turn and the budget forces
    its tokens in between (a model's wish is kept for the step after the forcing), and the machine's
    state after each."""
    budget_machine = ReasoningBudget((START,), ends, (MESSAGE, END), budget, token_bytes)
    budget_machine.begin(prompt)
    tokens, states, wishes = [], [], iter(wanted)
    while True:
        forced = budget_machine.forced_token
        token = forced if forced is not None else next(wishes, None)
        if token is None:
            return tokens, states
        budget_machine.accept(token)
        tokens.append(token)
        states.append(budget_machine.state)


def test_a_block_that_ends_within_its_budget_is_left_as_written() -> None:
    tokens, states = written([START, 50, 51, END, 52], budget=5)
    assert tokens == [START, 50, 51, END, 52]
    assert states == [COUNTING, COUNTING, COUNTING, DONE, DONE]


def test_a_spent_budget_forces_the_message_and_the_end_tag_then_the_answer_follows() -> None:
    tokens, states = written([START, 50, 51, 52, 53], budget=2)
    assert tokens == [START, 50, 51, MESSAGE, END, 52, 53]
    assert states == [COUNTING, COUNTING, FORCING, FORCING, DONE, DONE, DONE]


def test_a_budget_of_0_forces_the_end_as_soon_as_the_block_opens() -> None:
    assert written([START, 50, 51], budget=0)[0] == [START, MESSAGE, END, 50, 51]


def test_no_block_no_budget() -> None:
    tokens, states = written([50, 51, 52, 53], budget=1)
    assert tokens == [50, 51, 52, 53]
    assert set(states) == {IDLE}


def test_each_new_block_gets_a_fresh_budget() -> None:
    tokens, _ = written([START, 50, END, START, 60, 61, 62, 63], budget=2)
    assert tokens == [START, 50, END, START, 60, 61, MESSAGE, END, 62, 63]


def test_any_end_sequence_ends_the_block_naturally() -> None:
    tokens, states = written([START, 50, 103, 104, 52], budget=5, ends=((END,), (103, 104)))
    assert tokens == [START, 50, 103, 104, 52]
    assert states[-2:] == [DONE, DONE]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ((7, START), [50, 51, MESSAGE, END, 52]),  # the prompt opened the block: counting from the start
        ((7, START, 8), [50, MESSAGE, END, 51, 52]),  # its tokens after the start tag already count
        ((START, 8, END, 9), [50, 51, 52]),  # an earlier block, closed: nothing to count
        ((7, 8), [50, 51, 52]),
    ],
)
def test_a_prompt_that_leaves_the_block_open_starts_the_count(
    prompt: tuple[int, ...], expected: list[int]
) -> None:
    assert written([50, 51, 52], budget=2, prompt=prompt)[0] == expected


def test_a_budget_spent_mid_character_lets_the_character_finish() -> None:
    e_acute = "\u00e9".encode()
    pieces = {START: b"<think>", 50: b"a", 51: e_acute[:1], 52: e_acute[1:] + b" ", 53: b"b"}
    tokens, states = written([START, 50, 51, 52, 53], budget=2, token_bytes=pieces.__getitem__)
    assert tokens == [START, 50, 51, 52, MESSAGE, END, 53]
    assert states[2:4] == [WAITING_UTF8, FORCING]


E_ACUTE, EURO, GRINNING = ("\u00e9".encode(), "\u20ac".encode(), "\U0001f600".encode())


@pytest.mark.parametrize(
    ("piece", "whole"),
    [
        (b"", True),
        (b"a", True),
        (E_ACUTE, True),
        (E_ACUTE[:1], False),
        (EURO[:2], False),
        (GRINNING, True),
        (GRINNING[:3], False),
        (E_ACUTE[1:], False),  # llama.cpp's too: a piece of continuation bytes alone is not known whole
    ],
)
def test_a_tokens_last_character_is_known_whole_or_not_as_llama_cpp_knows_it(
    piece: bytes, whole: bool
) -> None:
    assert utf8_complete(piece) is whole


def test_thinking_is_turned_off_through_the_template(tmp_path: Path) -> None:
    """A template that reads ``enable_thinking`` (Qwen3's): on, it opens the block, so the answer starts
    inside it; off, it writes an empty block, so the answer starts after it; a key the template does not
    read changes nothing."""
    model = write_tiny_model(tmp_path / "think.gguf", vocab="think", chat_template=THINKING_TEMPLATE)
    runner = Runner(model, name="small", n_threads=1)
    try:
        messages = [{"role": "user", "content": "hi"}]
        on = render_chat(runner, messages)
        off = render_chat(runner, messages, template_kwargs={"enable_thinking": False})
        opening = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert on == opening + "<think>\n" and opens_thinking(on)
        assert off == opening + "<think>\n\n</think>\n\n" and not opens_thinking(off)
        assert render_chat(runner, messages, template_kwargs={"unread": 1}) == on
        # each marker one token, as in Qwen3's vocabulary
        markers = runner.tokenize("<think></think>", add_special=False)
        assert markers == [runner.n_vocab - 2, runner.n_vocab - 1]
    finally:
        runner.close()


CLOSE_ID = vocabulary("think")[0].index("</think>")


def generate(pair: tuple[Path, Path], *options: str) -> str:
    """`ead generate`'s answer to "hi", greedy, with </think> favoured so that the block closes ~10
    tokens in and text follows it."""
    args = [*pair_args(pair), "--tau", "3", "-n", "32", "--logit-bias", f"{CLOSE_ID}+5", *options, "hi"]
    done = ead("generate", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_generate_shows_the_thinking_between_ollamas_lines_or_hides_it(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    raw = generate(tiny_think_pair, "--reasoning-format", "none")
    before, closed, after = raw.partition("</think>")
    assert closed and after.strip()
    shown = THINKING + before.strip() + DONE_THINKING + after.lstrip()
    assert generate(tiny_think_pair) == generate(tiny_think_pair, "--reasoning-format", "deepseek") == shown
    assert (
        generate(tiny_think_pair, "--hide-thinking")
        == generate(tiny_think_pair, "--hidethinking")
        == after.lstrip()
    )


def test_at_a_terminal_the_thinking_is_dimmed_and_the_answer_is_not(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    args = [
        "generate",
        *pair_args(tiny_think_pair),
        "--tau",
        "3",
        "-n",
        "32",
        "--logit-bias",
        f"{CLOSE_ID}+5",
        "hi",
    ]
    styled = at_a_terminal(*args, env={"TERM": "xterm"}).decode()
    plain = at_a_terminal(*args, "--no-color", env={"TERM": "xterm"}).decode()
    assert ANSI_CODES.sub("", styled) == plain and plain.startswith(THINKING)
    thinking, _, answer = styled.partition(DONE_THINKING.strip())
    assert all(run.startswith(DIM) for run in thinking.split(RESET) if run)  # every run of it dimmed
    assert DIM not in answer and ANSI_CODES.sub("", answer).strip()


def test_a_reasoning_budget_of_0_turns_thinking_off_through_the_template(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    """The template writes an empty block, so the answer starts past it: no thinking, the text as written
    (another text than with thinking on: the prompt is another)."""
    off = generate(tiny_think_pair, "--reasoning-budget", "0")
    assert not off.startswith(THINKING)
    assert off == generate(tiny_think_pair, "--reasoning-budget", "0", "--reasoning-format", "none")
    assert off != generate(tiny_think_pair, "--reasoning-format", "none")


def test_thinking_options_for_a_model_that_does_not_think_are_said_unused(
    tiny_pair: tuple[Path, Path], tiny_think_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A template without a thinking block leaves --reasoning-budget and the rest nothing to act on: said
    in the one note, once, by generate, chat and serve (at start, in its log); a thinking model's are not."""
    from serve_process import Server

    options = ["--reasoning-budget", "8", "--reasoning-budget-message", "done", "--reasoning-format", "none"]
    flags = "--reasoning-budget, --reasoning-budget-message, --reasoning-format"
    unused = f"note: a chat template without a thinking block leaves {flags}"

    def notes(command: str, pair: tuple[Path, Path], *args: str) -> list[str]:
        stdin, prompt = ("hi\n", []) if command == "chat" else (None, ["hi"])
        done = ead(command, *large_args(pair), "--max-tokens", "2", *args, *prompt, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.decode().splitlines() if line.startswith("note:")]

    for command in ("generate", "chat"):
        assert notes(command, tiny_pair, *options, "--hide-thinking") == [f"{unused}, --hide-thinking unused"]
        assert notes(command, tiny_pair, "--reasoning-budget", "0") == [
            "note: a chat template without a thinking block leaves --reasoning-budget unused"
        ]
        assert notes(command, tiny_think_pair, *options, "--hide-thinking") == []
    with Server([*pair_args(tiny_pair), "--tau", "3", *options], tmp_path / "server.log") as server:
        said = [line for line in server.log().splitlines() if line.startswith("note:")]
        assert server.stop() == 0
    assert said == [f"{unused} unused"]


def test_hide_thinking_with_json_lines_is_said_unused(tiny_think_pair: tuple[Path, Path]) -> None:
    """--format jsonl writes every token, the thinking's too, as it writes them all: --hide-thinking,
    which only the text hides by, had been dropped there without a word. Said in generate's one note; the
    lines are those written without it."""
    args = [*pair_args(tiny_think_pair), "--tau", "3", "-n", "32", "--logit-bias", f"{CLOSE_ID}+5", "hi"]

    def run(*options: str) -> tuple[list[dict], list[str]]:
        done = ead("generate", *args, "--format", "jsonl", *options)
        assert done.returncode == 0, done.stderr
        events = [event for event in map(json.loads, done.stdout.splitlines()) if event["type"] == "token"]
        return events, [line for line in done.stderr.decode().splitlines() if line.startswith("note:")]

    hidden, notes = run("--hide-thinking")
    assert notes == ["note: --format jsonl (every token, the thinking's too) leaves --hide-thinking unused"]
    shown, none = run()
    assert hidden == shown and none == []
    assert "</think>" in [event["text"] for event in shown]


def tokens_written(pair: tuple[Path, Path], *options: str) -> list[dict]:
    """`ead generate --format jsonl`'s token events for ``generate``'s prompt."""
    lines = generate(pair, "--format", "jsonl", *options).splitlines()
    return [event for event in map(json.loads, lines) if event["type"] == "token"]


def test_a_spent_reasoning_budget_closes_the_block_with_the_message_and_the_answer_follows(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    """The prompt opens the block with ``<think>\n``: its newline counts, as llama.cpp's prefill counts
    it, so a budget of 3 leaves the model two tokens of thinking; then the message and ``</think>`` are
    written token by token (by whichever model the policy has write) and the answer follows, as
    the thinking split from it shows."""
    free = tokens_written(tiny_think_pair)
    assert [event["text"] for event in free].index("</think>") > 4  # thinks longer than the budget
    budgeted = tokens_written(
        tiny_think_pair, "--reasoning-budget", "3", "--reasoning-budget-message", " Enough."
    )
    texts = [event["text"] for event in budgeted]
    # the model's own: two tokens, the second a lone UTF-8 lead byte (no text yet), so a third finishes
    # the character before the message, as llama.cpp waits for it
    assert texts[1] == "" and [event["token"] for event in budgeted[:3]] == [
        event["token"] for event in free[:3]
    ]
    closed = texts.index("</think>")
    assert "".join(texts[3:closed]) == " Enough." and closed + 1 < len(texts)
    assert all(event["model"] in ("small", "large") for event in budgeted)
    shown = generate(tiny_think_pair, "--reasoning-budget", "3", "--reasoning-budget-message", " Enough.")
    thinking = "".join(texts[:closed])
    assert shown.startswith(THINKING + thinking.strip() + DONE_THINKING)


@pytest.mark.parametrize(
    ("step", "named"),
    [
        (["--verify", "0.5"], "--verify"),
        (["--mode", "spec"], "--mode spec"),
    ],
)
def test_a_budget_is_refused_with_a_step_that_could_not_take_its_tokens_back(
    tiny_think_pair: tuple[Path, Path], step: list[str], named: str
) -> None:
    done = ead("generate", *pair_args(tiny_think_pair), "--reasoning-budget", "3", *step, "hi")
    expected = f"error: --reasoning-budget 3 cannot go with {named}: a forced </think> cannot be taken back\n"
    assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", expected)


OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
JSON_MODE = ["--json-schema", json.dumps(OBJECT), "-n", "64"]


def bound_json(text: str) -> dict:
    """The JSON object an answer's content holds, checked against ``OBJECT``."""
    value = json.loads(text)
    assert isinstance(value, dict) and isinstance(value["a"], int), text
    return value


def test_a_grammar_binds_the_answer_after_the_thinking(tiny_think_pair: tuple[Path, Path]) -> None:
    """The prompt opens the block: it is written free, as without the grammar, and the grammar binds
    what follows </think> (llama-server's order), so the content is the schema's JSON."""
    free = generate(tiny_think_pair, "-n", "64", "--reasoning-format", "none")
    raw = generate(tiny_think_pair, *JSON_MODE, "--reasoning-format", "none")
    thinking, closed, content = raw.partition("</think>")
    assert closed and thinking == free.partition("</think>")[0]
    bound_json(content)
    assert generate(tiny_think_pair, *JSON_MODE) == THINKING + thinking.strip() + DONE_THINKING + content


def test_a_reasoning_budget_cuts_the_thinking_short_before_the_grammar_binds(
    tiny_think_pair: tuple[Path, Path],
) -> None:
    """--reasoning-budget 3 with a grammar: the budget's message and </think> are forced (the grammar
    is not bound yet), then the grammar binds the rest, as llama-server does with a json_schema."""
    budget = ["--reasoning-budget", "3", "--reasoning-budget-message", " Enough."]
    free = tokens_written(tiny_think_pair, *budget)
    budgeted = tokens_written(tiny_think_pair, *budget, *JSON_MODE)
    texts = [event["text"] for event in budgeted]
    closed = texts.index("</think>")
    ids = [event["token"] for event in budgeted]
    assert ids[: closed + 1] == [event["token"] for event in free[: closed + 1]]
    assert "".join(texts[3:closed]) == " Enough."
    bound_json("".join(texts[closed + 1 :]))


# Qwen3's way: the template names </think> but leaves the block to the model, which opens it itself
OWN_BLOCK_TEMPLATE = CHATML.replace(
    "{{ message.content }}",
    "{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    "{{ message.content }}",
)


def test_a_model_that_opens_its_own_block_thinks_before_the_grammar_binds(tmp_path: Path) -> None:
    """A first token that opens the block is let through the grammar, which binds what follows
    </think>: JSON mode does not turn such a model's thinking off."""
    pair = write_scripted_pair(tmp_path, "own", OWN_BLOCK_TEMPLATE, ["Ċ", "<think>", "o", "k", "</think>"])
    done = ead("generate", *pair_args(pair), "--tau", "3", *JSON_MODE, "--reasoning-format", "none", "hi")
    assert done.returncode == 0, done.stderr
    raw = done.stdout.decode()
    assert raw.startswith("<think>ok</think>"), raw
    bound_json(raw.removeprefix("<think>ok</think>"))


def test_an_answer_begun_by_a_prefill_is_bound_from_its_first_token_as_without_thinking(
    tmp_path: Path,
) -> None:
    """A prefill that starts the answer (the JSON value's start, ead serve's assistant prefill): the
    grammar binds the first token drawn, as for a model that does not think, where the model's own
    ``<think>`` next had been let through mid-value (a block opens only at the answer's start), the
    token drawn twice; the same tokens, sampled and greedy, as the plain path's."""
    pair = write_scripted_pair(tmp_path, "own", OWN_BLOCK_TEMPLATE, ["Ċ", "<think>", "o", "k", "</think>"])
    with Runner(pair[1], name="large", n_ctx=256, n_threads=1) as runner:
        prefill = tuple(runner.spelling('{"a": ') or ())
        prompt = encode_rendered(runner, render_chat(runner, [{"role": "user", "content": "hi"}]) + '{"a": ')
        tags = block_tags(runner)
        assert tags is not None and not tags.left_open(prompt)
        grammar = json_schema_grammar(OBJECT, "response_format")
        for temp in (0.0, 0.8):
            sampling = SamplingParams(grammar=grammar, grammar_start=prefill, temp=temp, seed=7)
            answers = [
                [
                    event.token
                    for event in Decoder([runner], ("large",), Fixed(0), sampling, **given).run(prompt)
                ]
                for given in ({"thinking_tags": tags}, {})
            ]
            assert answers[0] == answers[1] and tags.start[0] not in answers[0]
            bound_json('{"a": ' + "".join(runner.token_bytes(token).decode() for token in answers[0]))


def test_a_budget_the_thinking_stays_within_changes_nothing(tiny_think_pair: tuple[Path, Path]) -> None:
    assert generate(tiny_think_pair, "--reasoning-budget", "30") == generate(tiny_think_pair)


def test_chat_shows_each_answers_thinking_as_generate_does(tiny_think_pair: tuple[Path, Path]) -> None:
    """Each answer of a chat is split afresh; its first answer is generate's for the same prompt, with
    thinking on, off, or hidden."""
    args = [*pair_args(tiny_think_pair), "--tau", "3", "-n", "32", "--logit-bias", f"{CLOSE_ID}+5"]
    for options in ([], ["--reasoning-budget", "0"], ["--hide-thinking"]):
        done = ead("chat", *args, *options, stdin="hi\n")
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode() == generate(tiny_think_pair, *options)
    two = ead("chat", *args, stdin="hi\nhi again\n").stdout.decode()
    assert two.count(THINKING) == two.count(DONE_THINKING) == 2 and two.startswith(generate(tiny_think_pair))


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            ["--reasoning-budget", "-2"],
            "--reasoning-budget must be at least -1 (-1: unrestricted, 0: thinking off), got -2",
        ),
        (["--reasoning-format", "deepseek-legacy"], "--reasoning-format"),
    ],
)
def test_bad_reasoning_options_are_one_line(
    tiny_pair: tuple[Path, Path], option: list[str], message: str
) -> None:
    done = ead("generate", *pair_args(tiny_pair), *option, "hi")
    assert done.returncode == 2 and done.stdout == b""
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines

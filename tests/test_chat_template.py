"""--chat-template NAME and --chat-template-file FILE: the chat template given in place of the GGUF's, as
llama-cli and llama-server take them, for both models of the pair; a bad one refused at the start."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import Server
from test_cli import EAD, assert_one_line_error, ead, pair_args
from test_serve import CTX, TAU, serving
from test_serve_tools import TOOLS, TOOLS_TEMPLATE, chat
from tiny_models import THINKING_TEMPLATE, write_tiny_model

from ead_cli.runner import Runner

# a template that writes the last message alone: the prompt --raw sends
BARE = "{{ messages[-1]['content'] }}"
# llama.cpp's llama3 builtin, as its own formatter writes a user's turn and the assistant's opening
LLAMA3_HI = (
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
PROMPT = "hello wörld"
JSONL = ["--format", "jsonl"]


def template_file(folder: Path, text: str, name: str = "template.jinja") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def generated(pair: tuple[Path, Path], *args: str) -> tuple[str, int]:
    """`ead generate --format jsonl` in ead mode, both models writing: the text and the prompt's tokens."""
    result = subprocess.run(
        [
            EAD,
            "generate",
            *pair_args(pair),
            *TAU,
            "--mode",
            "ead",
            "--max-tokens",
            "12",
            *JSONL,
            *args,
            PROMPT,
        ],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return "".join(line["text"] for line in lines[:-1]), lines[-1]["prompt_tokens"]


def test_generate_renders_the_prompt_with_a_template_file(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The file's template writes the prompt: one that writes the message alone sends what --raw sends,
    where the GGUF's ChatML sends more."""
    bare = generated(tiny_pair, "--chat-template-file", str(template_file(tmp_path, BARE)))
    raw = generated(tiny_pair, "--raw")
    own = generated(tiny_pair)
    assert bare == raw
    assert bare[1] < own[1]


def test_generate_takes_a_builtin_name_and_a_template_text(tiny_pair: tuple[Path, Path]) -> None:
    """A name is llama.cpp's builtin (chatml: the tiny models' own template); a value with Jinja's markers
    is a template, as llama.cpp reads --chat-template's value."""
    assert generated(tiny_pair, "--chat-template", "chatml") == generated(tiny_pair)
    assert generated(tiny_pair, "--chat-template", BARE) == generated(tiny_pair, "--raw")
    llama3 = generated(tiny_pair, "--chat-template", "llama3")
    assert llama3[1] > generated(tiny_pair)[1]  # its headers are longer than ChatML's


@pytest.mark.parametrize(
    ("template", "fragments"),
    [
        ("{% for m in messages %}\n{{ m.content }", ("line 2: unexpected '}'",)),
        ("{{ raise_exception('no system message') }}", ("no system message",)),
        ("{{ messages[0].content.nothing() }}", ("has no attribute 'nothing'",)),
        ("{% if false %}x{% endif %}", ("rendered no text",)),
        ("{% include 'other.jinja' %}", ("cannot load files",)),
    ],
)
def test_a_template_file_that_does_not_parse_or_render_is_refused_naming_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path, template: str, fragments: tuple[str, ...]
) -> None:
    path = template_file(tmp_path, template, "bad template.jinja")
    result = ead("generate", *pair_args(tiny_pair), "--chat-template-file", str(path), PROMPT)
    assert_one_line_error(result, 2, f"error: --chat-template-file '{path}' ", *fragments)


def test_chat_writes_every_turn_with_the_template_given_whichever_model_joins(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """ead chat starts with the large model alone and the small one joins at /mode ead: the conversation
    both read is written in llama3's turns throughout, none of the models' own ChatML."""
    saved = tmp_path / "chat.json"
    commands = f"hello\n/mode ead\nagain\n/save {saved}\n"
    args = ["chat", *pair_args(tiny_pair), "--chat-template", "llama3", "--temp", "0", "--max-tokens", "6"]
    result = ead(*args, stdin=commands)
    assert result.returncode == 0, result.stderr
    transcript = json.loads(saved.read_text())
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        written = b"".join(runner.token_bytes(token) for token in transcript["conversation_tokens"])
    text = written.decode(errors="replace")  # an answer cut at its token limit may end inside a character
    assert text.startswith(LLAMA3_HI.replace("hi", "hello"))
    assert "<|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|>" in text
    assert text.count("<|start_header_id|>assistant<|end_header_id|>\n\n") == 2
    assert "<|im_start|>" not in text


# commands besides generate, chat and serve that write chats, each with what it needs but the models
TEMPLATED = {
    "calibrate": ["calibrate", "--policy", "gate", "--no-check", "--prompts", "{prompts}"],
    "bench humaneval": ["bench", "humaneval", "--ids", "0", "--strategies", "large", "--out", "{out}"],
    "bench prompts": ["bench", "prompts", "{prompts}", "--strategies", "large", "--out", "{out}"],
}
# renders the one message a template is checked with at the start, and refuses any other
ONLY_THE_CHECK = (
    "{% if messages[-1]['content'] != 'test' %}{{ raise_exception('a prompt reached it') }}{% endif %}"
    "{{ messages[-1]['content'] }}"
)


def templated(name: str, folder: Path) -> list[str]:
    prompts = folder / "prompts.txt"
    prompts.write_text("Write a function.\nWrite a poem.\n")
    return [arg.format(prompts=prompts, out=folder / "out") for arg in TEMPLATED[name]]


@pytest.mark.parametrize("command", ["generate", *TEMPLATED])
def test_a_bad_name_lists_the_choices(tiny_pair: tuple[Path, Path], tmp_path: Path, command: str) -> None:
    args = ["generate", PROMPT] if command == "generate" else templated(command, tmp_path)
    result = ead(*args, *pair_args(tiny_pair), "--chat-template", "chatmll")
    assert not (tmp_path / "out").exists()
    line = assert_one_line_error(
        result, 2, "--chat-template 'chatmll'", "chatml, ", "llama3", "--chat-template-file"
    )
    assert "llama2-sys" in line


@pytest.mark.parametrize("command", list(TEMPLATED))
def test_calibrate_and_the_benches_write_their_prompts_with_the_template_given(
    tiny_pair: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    """The template given writes the prompts each command sends the models, not only generate's, chat's
    and serve's: one that refuses any but the start's check stops the run at its first prompt, in one
    line naming it, before anything is written."""
    result = ead(*templated(command, tmp_path), *pair_args(tiny_pair), "--chat-template", ONLY_THE_CHECK)
    assert_one_line_error(result, 1, "error: --chat-template failed: a prompt reached it")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--chat-template-file", "missing.jinja"], ("--chat-template-file missing.jinja", "No such file")),
        (["--chat-template", "chatml", "--chat-template-file", "t.jinja"], ("not both",)),
        (
            ["--chat-template", "chatml", "--raw"],
            ("--chat-template gives a chat template, which --raw leaves out",),
        ),
    ],
)
def test_a_template_that_cannot_be_used_is_refused(
    tiny_pair: tuple[Path, Path], tmp_path: Path, args: list[str], fragments: tuple[str, ...]
) -> None:
    template_file(tmp_path, BARE, "t.jinja")
    result = subprocess.run(
        [EAD, "generate", *pair_args(tiny_pair), *args, PROMPT],
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert_one_line_error(result, 2, *fragments)


def test_serve_refuses_a_broken_template_file_at_its_start(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    path = template_file(tmp_path, "{{ messages[0].content.nothing() }}")
    result = ead("serve", *pair_args(tiny_pair), "--port", "0", "--chat-template-file", str(path))
    assert_one_line_error(result, 2, "--chat-template-file", "has no attribute 'nothing'")


@pytest.fixture(scope="module")
def overridden(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose chat template is llama.cpp's llama3, where the models' own is ChatML."""
    folder = tmp_path_factory.mktemp("serve-template")
    with serving([*pair_args(tiny_pair), *TAU, *CTX, "--chat-template", "llama3"], folder / "log") as running:
        yield running


def test_serve_writes_the_chat_with_the_template_given(overridden: Server) -> None:
    """/apply-template and the chat routes write the given template's prompt: the openai client's chat
    answer is the completion of that prompt, and /props names it."""
    hi = [{"role": "user", "content": "hi"}]
    applied = httpx.post(f"{overridden.url}/apply-template", json={"messages": hi}, timeout=60)
    prompt = applied.json()["prompt"]
    assert prompt == LLAMA3_HI
    client = openai.OpenAI(base_url=overridden.base_url, api_key="unused", max_retries=0, timeout=60)
    chat = client.chat.completions.create(model="ead", messages=hi, max_tokens=12, temperature=0, seed=1)  # type: ignore[arg-type]
    completion = client.completions.create(model="ead", prompt=prompt, max_tokens=12, temperature=0, seed=1)
    assert chat.usage is not None and completion.usage is not None
    assert chat.usage.prompt_tokens == completion.usage.prompt_tokens
    assert chat.choices[0].message.content == completion.choices[0].text
    assert httpx.get(f"{overridden.url}/props", timeout=60).json()["chat_template"] == "llama3"


def test_tools_are_taken_where_the_template_given_renders_them(
    tiny_pair: tuple[Path, Path], tmp_path: Path, overridden: Server
) -> None:
    """Tool calling reads the template given: the tiny models' own ChatML renders no tools, a file that
    renders them takes them into the prompt; a builtin's formatter writes none, so a request with tools
    is refused by name."""
    path = template_file(tmp_path, TOOLS_TEMPLATE)
    hi = [{"role": "user", "content": "hi"}]
    with serving([*pair_args(tiny_pair), "--chat-template-file", str(path)], tmp_path / "log") as server:
        applied = httpx.post(
            f"{server.url}/apply-template", json={"messages": hi, "tools": TOOLS}, timeout=60
        )
        assert applied.status_code == 200, applied.text
        assert applied.json()["prompt"].startswith("<|im_start|>system\n<tools>{")
        assert chat(server, messages=hi, tools=TOOLS, max_tokens=4).status_code == 200
    refused = chat(overridden, messages=hi, tools=TOOLS)
    assert refused.status_code == 400
    assert (
        refused.json()["error"]["message"] == "tools: --chat-template llama3 has no tool support by ead serve"
    )


def test_thinking_follows_the_template_given(tiny_think_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A thinking pair given a template without a thinking block (chatml) is no thinking model: its
    thinking options go unused, said in a note; given its own thinking template back, they are used."""
    args = ["generate", *pair_args(tiny_think_pair), "--max-tokens", "4", "--reasoning-budget", "0", PROMPT]
    plain = ead(*args, "--chat-template", "chatml")
    assert plain.returncode == 0, plain.stderr
    assert (
        "a chat template without a thinking block leaves --reasoning-budget unused" in plain.stderr.decode()
    )
    thinking = ead(*args, "--chat-template-file", str(template_file(tmp_path, THINKING_TEMPLATE)))
    assert thinking.returncode == 0, thinking.stderr
    assert "--reasoning-budget" not in thinking.stderr.decode()


# ChatML with a default system turn, as Qwen2.5's template writes one: Jinja writes it, llama.cpp's own
# chatml formatter (which recognises the template by its markers) does not
HELPFUL = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_HI = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def helpful_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("helpful")
    return (
        write_tiny_model(folder / "small.gguf", seed=0, chat_template=HELPFUL),
        write_tiny_model(folder / "large.gguf", seed=1, chat_template=HELPFUL),
    )


def test_no_jinja_writes_the_chats_as_llama_cpps_own_formatter(
    helpful_pair: tuple[Path, Path], tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--no-jinja, as llama-server's: the models' own template, or one given, is written by the builtin
    llama.cpp recognises it as (chatml, without the default system turn Jinja writes); --jinja is the
    default."""
    jinja = generated(helpful_pair)
    assert generated(helpful_pair, "--jinja") == jinja
    builtin = generated(helpful_pair, "--no-jinja")
    assert builtin == generated(helpful_pair, "--chat-template", "chatml")
    assert builtin[1] < jinja[1]  # the system turn left out
    given = ["--chat-template-file", str(template_file(tmp_path, HELPFUL))]
    assert generated(tiny_pair, *given, "--no-jinja") == generated(tiny_pair, "--chat-template", "chatml")
    assert generated(tiny_pair, *given)[1] == jinja[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--chat-template", BARE],
            "--no-jinja: llama.cpp's own formatters do not recognise --chat-template (leave out --no-jinja",
        ),
        (["--raw"], "--no-jinja gives a chat template, which --raw leaves out"),
    ],
)
def test_no_jinja_refuses_what_llama_cpps_formatters_cannot_write(
    tiny_pair: tuple[Path, Path], args: list[str], message: str
) -> None:
    result = ead("generate", *pair_args(tiny_pair), "--no-jinja", *args, PROMPT)
    assert_one_line_error(result, 2, message)


def test_serve_no_jinja_writes_every_chat_with_the_builtin(
    helpful_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """ead serve --no-jinja: /apply-template and /props say the builtin; it writes no tools, so a request
    with tools is refused by name, as under --chat-template chatml."""
    hi = [{"role": "user", "content": "hi"}]
    with serving([*pair_args(helpful_pair), *CTX, "--no-jinja"], tmp_path / "log") as server:
        applied = httpx.post(f"{server.url}/apply-template", json={"messages": hi}, timeout=60)
        assert applied.json()["prompt"] == CHATML_HI
        assert httpx.get(f"{server.url}/props", timeout=60).json()["chat_template"] == "chatml"
        refused = chat(server, messages=hi, tools=TOOLS)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "tools"

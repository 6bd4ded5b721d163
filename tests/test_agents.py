"""Real coding agents against `ead serve`, end to end: Claude Code (`claude -p`) over Anthropic's Messages
API and Codex CLI (`codex exec`) over OpenAI's Responses API, both as ./scripts/install_agents.sh installs
them (pinned, with npm), each run once, headless, against one real server on the real 0.5B model behind a
recording proxy: the agent exits 0, its answer is the text the server streamed, and every request it sent
was answered (no 4xx or 5xx). Each agent's own prompt is cut to a line and no tools (its full prompt, 5-20k
tokens, would cost minutes of prefill on 2 cores): the shapes of the full first requests are replayed by
hand in tests/test_serve_anthropic.py and tests/test_serve_responses.py."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from serve_process import Server
from test_serve import serving

from ead_cli.paths import ead_cache_dir

KEY = "local-key"
AGENTS = ead_cache_dir() / "agents"  # where ./scripts/install_agents.sh installs them
INSTALL = "./scripts/install_agents.sh installs it with npm"
PROMPT = "Say hello."
BRIEF = "Be brief."

pytestmark = pytest.mark.real


def agent(name: str, product: str) -> Path:
    """The installed agent's command, or the test skipped saying why."""
    command = AGENTS / "node_modules" / ".bin" / name
    if shutil.which("node") is None:
        pytest.skip(f"no node: {product} runs on node ({INSTALL})")
    if not command.exists():
        pytest.skip(f"{product} is not installed in {AGENTS} ({INSTALL})")
    return command


class Recorded(BaseHTTPRequestHandler):
    """Passes each request on to the server and its reply back as it comes (a stream stays a stream),
    keeping the method, path, status and reply of each in ``seen``."""

    protocol_version = "HTTP/1.1"
    upstream: ClassVar[tuple[str, int]]
    seen: ClassVar[list[tuple[str, str, int, bytes]]]

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        passed = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=300)
        upstream.request(self.command, self.path, body=body, headers=passed)
        reply = upstream.getresponse()
        self.send_response(reply.status)
        for name, value in reply.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        answer = b""
        while chunk := reply.read1(65536):
            answer += chunk
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        upstream.close()
        self.seen.append((self.command, self.path, reply.status, answer))

    do_GET = do_POST = do_HEAD = _relay

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(real_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The 0.5B model alone, Claude's model names taken (``--any-model``), a key, as docs/serve.md says."""
    small = str(real_pair[0])
    args = ["--small", small, "--large", small, "--mode", "small", "--any-model", "--api-key", KEY]
    args += ["--ctx", "16384", "--max-tokens", "256"]
    with serving(args, tmp_path_factory.mktemp("agents") / "server.log") as running:
        yield running


@pytest.fixture
def proxy(server: Server) -> Iterator[tuple[str, list[tuple[str, str, int, bytes]]]]:
    """A recording proxy in front of the server: its URL and what it saw."""
    host, port = server.url.removeprefix("http://").split(":")
    handler = type("Handler", (Recorded,), {"upstream": (host, int(port)), "seen": []})
    listening = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=listening.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{listening.server_address[1]}", handler.seen
    listening.shutdown()
    listening.server_close()


def events(stream: bytes) -> list[dict]:
    """The data of a reply's server-sent events."""
    lines = stream.decode().replace("\r\n", "\n").split("\n")
    return [json.loads(line.removeprefix("data:")) for line in lines if line.startswith("data:")]


def run(command: list[str], home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """An agent run headless in a HOME (and working folder) of its own, nothing of ours in its env."""
    return subprocess.run(
        command,
        cwd=home,
        env={"PATH": os.environ["PATH"], "HOME": str(home), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_claude_code_answers_through_the_messages_api(
    proxy: tuple[str, list[tuple[str, str, int, bytes]]], tmp_path: Path
) -> None:
    url, seen = proxy
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": KEY,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",  # the server's --max-tokens: a longer answer fails the run
    }
    options = ["--system-prompt", BRIEF, "--tools", "", "--disable-slash-commands"]
    command = [str(agent("claude", "Claude Code")), "-p", PROMPT, "--output-format", "json", *options]
    done = run(command, tmp_path, env)
    assert done.returncode == 0, (done.stdout, done.stderr, seen)
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["stop_reason"] == "end_turn", result
    assert [status for *_, status, _ in seen] == [200] * len(seen), seen
    asked = [(method, path) for method, path, _, _ in seen if method == "POST"]
    assert asked == [("POST", "/v1/messages?beta=true")]  # the answer, streamed
    answer = [event for event in events(seen[-1][3]) if event["type"] == "content_block_delta"]
    streamed = "".join(event["delta"]["text"] for event in answer)
    assert streamed.strip() and result["result"] == streamed
    assert {event["ead"]["model"] for event in answer} == {"small"}  # each token's writer came along


def test_codex_answers_through_the_responses_api(
    proxy: tuple[str, list[tuple[str, str, int, bytes]]], tmp_path: Path
) -> None:
    url, seen = proxy
    home = tmp_path / "codex"
    home.mkdir()
    (home / "instructions.md").write_text(BRIEF)
    # Codex's own settings, web search left as it is (offered: ead serve does not offer it to the model)
    (home / "config.toml").write_text(
        f'model = "ead"\nmodel_provider = "ead"\n'
        f'model_instructions_file = "{home / "instructions.md"}"\ncheck_for_update_on_startup = false\n'
        f"[analytics]\nenabled = false\n"
        f'[model_providers.ead]\nname = "ead serve"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        f'env_key = "EAD_KEY"\n'
    )
    last = tmp_path / "last.txt"
    # without its sub-agent tools (their namespace is taken: test_serve_responses.py) the 0.5B answers in
    # text; with them it wrote an exec_command call that Codex refused, ending the run
    options = ["--skip-git-repo-check", "--ephemeral", "--sandbox", "read-only", "--disable", "multi_agent"]
    command = [str(agent("codex", "Codex CLI")), "exec", *options, "--json", "-o", str(last), PROMPT]
    done = run(command, tmp_path, {"CODEX_HOME": str(home), "EAD_KEY": KEY})
    assert done.returncode == 0, (done.stdout, done.stderr, seen)
    said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    items = [event["item"] for event in said if event["type"] == "item.completed"]
    messages = [item["text"] for item in items if item["type"] == "agent_message"]
    assert [(method, path, status) for method, path, status, _ in seen] == [("POST", "/v1/responses", 200)]
    completed = [event for event in events(seen[0][3]) if event["type"] == "response.completed"]
    output = completed[0]["response"]["output"]
    texts = [part["text"] for item in output if item["type"] == "message" for part in item["content"]]
    streamed = "".join(texts)
    assert streamed.strip() and messages == [streamed] and last.read_text() == streamed

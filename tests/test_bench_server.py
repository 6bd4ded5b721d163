"""llama.cpp's own loops as bench strategies: real llama-server processes (started by ``ead bench``
itself) on the tiny GGUF pair, and once on the real demo pair."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_bench import children, wait_gone
from test_cli import EAD, assert_one_line_error

from ead_cli.bench import grid, native
from ead_cli.bench.results import RESULTS_FILE, read_results
from ead_cli.errors import EadError
from ead_cli.options import GenerationOptions
from ead_cli.remote import built_server
from ead_cli.runner import Runner

pytestmark = pytest.mark.skipif(
    not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh builds it (CI does)"
)

SERVER_COLUMNS = ("server tok/s", "acceptance", "same text")


def ead(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"} | (env or {})
    return subprocess.run([EAD, *args], capture_output=True, env=full_env, timeout=600)


def samples(out: Path) -> dict[tuple[str, str], dict]:
    _, records = read_results(out / RESULTS_FILE)
    return {(record["strategy"], record["task_id"]): record for record in records}


def report(out: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """report.md as headers and rows by strategy."""
    lines = (out / "report.md").read_text().splitlines()
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return headers, rows


@pytest.fixture(scope="module")
def tiny_bench(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every server family (two draft lengths, two n-gram types, their stacks) beside the Python loop, on
    three prompts."""
    folder = tmp_path_factory.mktemp("bench")
    prompts = folder / "prompts.txt"
    prompts.write_text("hi there\nThe quick brown fox\ndef fibonacci(n):\n")
    out = folder / "out"
    result = ead(
        "bench", "prompts", str(prompts), "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]),
        "--threads", "1", "--max-tokens", "48", "--out", str(out),
        "--strategies", "large,server-large,server-spec,server-ngram,server-stack",
        "--server-draft", "2,3", "--server-ngram", "ngram-mod,ngram-simple",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    return out


NAMES = (
    "server-large",
    "server-spec draft=2",
    "server-spec draft=3",
    "server-ngram type=ngram-mod",
    "server-ngram type=ngram-simple",
    "server-spec draft=2 type=ngram-mod",  # server-stack: llama.cpp's draft model and n-gram type together
    "server-spec draft=2 type=ngram-simple",
    "server-spec draft=3 type=ngram-mod",
    "server-spec draft=3 type=ngram-simple",
)


def test_greedy_server_strategies_write_the_python_loops_large_only_text(tiny_bench: Path) -> None:
    """The same token ids in, greedy, the same max tokens: llama.cpp's loop writes what ours does.
    Speculation is lossless for greedy decoding; on these random-weight models no top-2 logits are
    close enough for the batched verification's rounding to flip an argmax (on the real pair some do:
    docs/native-peers.md counts them)."""
    records = samples(tiny_bench)
    prompts = sorted({task for _, task in records})
    assert len(prompts) == 3
    for task in prompts:
        large = records[("large-only", task)]
        assert large["generated"] == 48
        for name in NAMES:
            record = records[(name, task)]
            assert record["text"] == large["text"], name
            assert (record["generated"], record["finish_reason"]) == (large["generated"], "length")
            assert record["prompt_tokens"] == large["prompt_tokens"]


def test_server_samples_carry_the_servers_timings_and_no_schedule(tiny_bench: Path) -> None:
    records = samples(tiny_bench)
    for (name, _), record in records.items():
        if name == "large-only":
            assert record["schedule"] and "server" not in record
            continue
        assert record["schedule"] is None
        server = record["server"]
        assert server["prompt_n"] == record["prompt_tokens"]  # cache_prompt off: the whole prompt, each time
        assert server["predicted_n"] == record["generated"]
        assert server["prompt_ms"] > 0 and server["predicted_ms"] > 0 and record["wall_s"] > 0
        assert record["models"]["large"]["server_s"] <= record["wall_s"]
        if name.startswith("server-spec"):
            # the small model drafted (--spec-type draft-simple): N tokens a round, at most (a stacked
            # n-gram type drafts longer runs where it finds one)
            draft = int(name.split("draft=")[1].split()[0])
            assert 0 < server["draft_n"] <= (64 if " type=" in name else draft) * record["generated"]
            assert record["drafted"] == server["draft_n"]
            assert record["acceptance_rate"] == server["draft_n_accepted"] / server["draft_n"]
            assert record["models"]["small"]["written"] == server["draft_n_accepted"]
        else:
            assert "small" not in record["models"]


def test_the_report_has_a_row_per_strategy_with_the_servers_columns(tiny_bench: Path) -> None:
    headers, rows = report(tiny_bench)
    for column in ("agreement", "wall s", "wall vs large", "tok/s", *SERVER_COLUMNS):
        assert column in headers
    assert list(rows) == ["large-only", *NAMES]
    assert rows["large-only"]["server tok/s"] == "-"
    for name in NAMES:
        assert float(rows[name]["server tok/s"]) > 0
        assert float(rows[name]["wall vs large"]) > 0
        assert rows[name]["agreement"] == "1.000" and rows[name]["same text"] == "3"
    for name in ("server-spec draft=2", "server-spec draft=3"):
        assert rows[name]["acceptance"].endswith("%")
    csv = (tiny_bench / "report.csv").read_text().splitlines()
    assert "server_tokens_per_s" in csv[0] and "same_text" in csv[0]


def test_a_draft_model_that_is_the_large_model_is_accepted_almost_always(tiny_pair, tmp_path) -> None:
    """The acceptance the report shows is the server's own: the large model drafting for itself."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n")
    large = str(tiny_pair[1])
    result = ead(
        "bench", "prompts", str(prompts), "--small", large, "--large", large, "--threads", "1",
        "--max-tokens", "40", "--strategies", "large,server-spec", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    record = samples(tmp_path / "out")[("server-spec draft=3", "prompt/0")]
    assert record["acceptance_rate"] > 0.9
    assert record["text"] == samples(tmp_path / "out")[("large-only", "prompt/0")]["text"]


def test_the_servers_read_in_the_bench_models_batches(tiny_pair: tuple[Path, Path]) -> None:
    """llama.cpp's loops are compared alike: each server is started with the batch and micro-batch the
    bench's own models read in (--batch-size, --ubatch-size), with their threads (--threads,
    --threads-batch), their KV cache types (the small model's as the draft's) and flash attention."""
    caches = {"small": ("f32", "bf16"), "large": ("bf16", "f32")}
    runners = [
        Runner(
            path,
            name=role,
            n_ctx=256,
            n_threads=1,
            n_threads_batch=2,
            n_batch=8,
            n_ubatch=4,
            cache_types=caches[role],
            flash_attn="off",
        )
        for path, role in zip(tiny_pair, ("small", "large"), strict=True)
    ]
    try:
        with native.NativePeers(runners, GenerationOptions(max_tokens=8)) as peers:
            large = grid.NativeOptions("large")
            peers.client(large, runners[1].tokenize("hi there", add_special=False))
            [server] = children(os.getpid(), "llama-server")
            argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")
            assert argv[argv.index("-b") + 1] == "8" and argv[argv.index("-ub") + 1] == "4"
            assert argv[argv.index("-t") + 1] == "1" and argv[argv.index("-tb") + 1] == "2"
            given = {flag: argv[argv.index(flag) + 1] for flag in ("-ctk", "-ctv", "-ctkd", "-ctvd", "-fa")}
            assert given == {"-ctk": "bf16", "-ctv": "f32", "-ctkd": "f32", "-ctvd": "bf16", "-fa": "off"}
    finally:
        for runner in runners:
            runner.close()


def test_a_draft_model_is_given_the_threads_and_batch_threads() -> None:
    """llama-server's draft model reads with the bench's threads: -td for its drafts, -tbd for batches."""
    flags = grid.NativeOptions("spec", draft=3).flags(Path("small.gguf"), 1, 2)
    assert flags[flags.index("-td") + 1] == "1" and flags[flags.index("-tbd") + 1] == "2"
    assert flags[flags.index("--spec-draft-model") + 1] == "small.gguf"


def test_replay_skips_server_samples_and_refuses_them_by_name(tiny_pair, tiny_bench: Path, tmp_path) -> None:
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    result = ead("bench", "replay", str(tiny_bench), *models, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr.decode()
    replayed = json.loads((tmp_path / "replay.json").read_text())
    assert [row["strategy"] for row in replayed["strategies"]] == ["large-only"]
    refused = ead("bench", "replay", str(tiny_bench), *models, "--strategies", "server-large")
    assert_one_line_error(refused, 2, "server-large on prompt/", "has no schedule")


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server-draft", "0"], "--server-draft: 0 is below 1"),
        (["--server-draft", "65"], "--server-draft: 65 is not in [1, 64]"),
        (["--server-draft", "3,x"], "--server-draft: 'x' is not a valid value"),
        (["--server-ngram", "ngram-nope"], "--server-ngram: 'ngram-nope' is not one of ngram-simple"),
        (["--server-ngram", "draft-simple"], "--server-ngram: 'draft-simple' is not one of"),
        (["--temp", "0.7"], "server strategies decode greedily"),
    ],
)
def test_bad_server_options_are_one_line(tiny_pair, tmp_path, args: list[str], message: str) -> None:
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    result = ead("bench", "humaneval", "--ids", "1", *models, "--strategies", "server-spec,server-ngram",
                 *args, "--out", str(tmp_path / "out"))  # fmt: skip
    assert_one_line_error(result, 2, message)
    assert not (tmp_path / "out").exists()


def test_a_missing_server_binary_is_one_line_before_any_model_loads(tiny_pair, tmp_path) -> None:
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    result = ead(
        "bench", "humaneval", "--ids", "1", *models, "--strategies", "large,server-large",
        "--out", str(tmp_path / "out"), env={"EAD_CACHE": str(tmp_path / "empty")},
    )  # fmt: skip
    assert_one_line_error(result, 1, "no llama-server at", "build_llama_server.sh")
    assert not (tmp_path / "out").exists()


def test_a_server_that_stops_at_start_is_one_error_with_its_last_log_line(tiny_pair, tmp_path) -> None:
    with (
        pytest.raises(EadError, match=r"llama-server stopped at start: .*--no-such-flag"),
        native.llama_server(tiny_pair[1], ["--no-such-flag"], tmp_path / "log"),
    ):
        pass


def test_a_server_that_dies_mid_bench_is_named_with_its_end_and_the_samples_kept(tiny_pair, tmp_path) -> None:
    """Killed under the bench (the OOM killer, a crash): which server and how it ended, not an address
    on loopback that refused a connection; the samples it wrote stay, for the same command to resume."""
    out = tmp_path / "out"
    bench = subprocess.Popen(
        [EAD, "bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]),
         "--threads", "1", "--ids", "0-40", "--strategies", "server-large", "--max-tokens", "32",
         "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while '"sample"' not in ((out / RESULTS_FILE).read_text() if (out / RESULTS_FILE).exists() else ""):
        assert bench.poll() is None and time.monotonic() < deadline, "no sample was written"
        time.sleep(0.05)
    for server in children(bench.pid, "llama-server"):
        os.kill(server, signal.SIGKILL)
    err = bench.communicate(timeout=120)[1].decode().replace("\r", "\n")
    assert bench.returncode == 1 and "Traceback" not in err
    said = "error: the llama-server of server-large stopped (killed by SIGKILL): "
    assert err.strip().splitlines()[-1].startswith(said)
    assert samples(out)


def test_a_bench_killed_outright_takes_its_servers_with_it(tiny_pair, tmp_path) -> None:
    """kill -9 (the OOM killer) leaves a bench no time to stop its servers: each had served on, orphaned,
    holding its model's memory."""
    out = tmp_path / "out"
    bench = subprocess.Popen(
        [EAD, "bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]),
         "--threads", "1", "--ids", "0-40", "--strategies", "server-large", "--max-tokens", "32",
         "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (servers := children(bench.pid, "llama-server")):
        assert bench.poll() is None and time.monotonic() < deadline, "no server started"
        time.sleep(0.05)
    logs = Path(os.readlink(f"/proc/{servers[0]}/fd/1")).parent  # which the bench, killed, cannot remove
    bench.kill()
    bench.wait()
    assert wait_gone(str(servers[0])), "the server outlived its bench"
    shutil.rmtree(logs)


CHANGING_PROXY = """#!{python}
# llama-server behind a proxy that changes each sample's reply (not the warm-up's, of one token): its
# timings as EAD_TEST_TIMINGS says (null drops them, an object sets their fields, a null field dropped),
# its token ids to EAD_TEST_TOKENS where given
import http.client, http.server, json, os, re, subprocess, sys, tempfile, time
from ead_cli.bench.sandbox import dying_with_this_process

log = tempfile.TemporaryFile()
real = subprocess.Popen(
    [{server!r}, *sys.argv[1:]], stdout=log, stderr=subprocess.STDOUT, preexec_fn=dying_with_this_process()
)
while not (found := re.search(rb"listening on http://127\\.0\\.0\\.1:(\\d+)", log.read())):
    log.seek(0)
    time.sleep(0.05)
upstream = ("127.0.0.1", int(found.group(1)))
change = json.loads(os.environ["EAD_TEST_TIMINGS"])
tokens = json.loads(os.environ.get("EAD_TEST_TOKENS", "null"))


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.forward(None)

    def do_POST(self):
        self.forward(self.rfile.read(int(self.headers["Content-Length"])))

    def forward(self, body):
        connection = http.client.HTTPConnection(*upstream, timeout=600)
        connection.request(self.command, self.path, body=body, headers={{"Content-Type": "application/json"}})
        reply = connection.getresponse()
        status, payload = reply.status, reply.read()
        if self.path == "/completion" and json.loads(body)["n_predict"] > 1:
            answer = json.loads(payload)
            if change is None:
                del answer["timings"]
            for key, value in (change or {{}}).items():
                answer["timings"].pop(key) if value is None else answer["timings"].update({{key: value}})
            if tokens is not None:
                answer["tokens"] = tokens
            payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
print(f"listening on http://127.0.0.1:{{proxy.server_port}}", flush=True)
try:
    proxy.serve_forever()
finally:
    real.terminate()
"""


@pytest.mark.parametrize(
    ("timings", "said"),
    [
        (None, "sent no timings"),
        ({"prompt_n": None}, "sent timings without prompt_n"),
        ({"prompt_ms": -5.0}, "sent prompt_ms -5.0: not a time (a number above 0)"),
        ({"predicted_ms": 0}, "sent predicted_ms 0: not a time (a number above 0)"),
        ({"predicted_n": "4"}, 'sent predicted_n "4": not a count of at least 1'),
        ({"draft_n": 2, "draft_n_accepted": 3}, "sent draft_n_accepted 3: more than its draft_n 2"),
    ],
)
def test_a_server_reply_without_sensible_timings_is_refused_in_one_line(
    tiny_pair: tuple[Path, Path], tmp_path: Path, timings: dict | None, said: str
) -> None:
    """A sample's figures are llama-server's own timings: a reply without them had been recorded as 0
    ms, silently, and one with a count or a time that is no such thing recorded as sent (-5 ms) or ended
    the bench in a traceback (a count sent as text). The real server's replies, changed on their way."""
    assert_refused_reply(tiny_pair, tmp_path, {"EAD_TEST_TIMINGS": json.dumps(timings)}, said)


@pytest.mark.parametrize(
    ("tokens", "said"),
    [
        ([1, "7"], 'sent token id "7": not a token id of its model (0 to {last})'),
        ([1.5], "sent token id 1.5: not a token id of its model (0 to {last})"),
        ([-1], "sent token id -1: not a token id of its model (0 to {last})"),
        ([1, 10**9], "sent token id 1000000000: not a token id of its model (0 to {last})"),
    ],
)
def test_a_server_reply_with_token_ids_of_no_token_is_refused_in_one_line(
    tiny_pair: tuple[Path, Path], tmp_path: Path, tokens: list, said: str
) -> None:
    """The text is made from the token ids llama-server returns: one sent as text had ended the bench in a
    traceback, a fraction had been cut to an integer, and one past the vocabulary read outside it."""
    with Runner(tiny_pair[1], name="large", n_ctx=64, n_threads=1) as large:
        last = large.n_vocab - 1
    env = {"EAD_TEST_TIMINGS": "{}", "EAD_TEST_TOKENS": json.dumps(tokens)}
    assert_refused_reply(tiny_pair, tmp_path, env, said.format(last=last))


def assert_refused_reply(
    tiny_pair: tuple[Path, Path], tmp_path: Path, env: dict[str, str], said: str
) -> None:
    """A bench of server-large whose llama-server's replies are changed as ``env`` tells ``CHANGING_PROXY``
    ends on the one line that its server ``said`` it, and records nothing of the sample."""
    cache = tmp_path / "cache"
    binary = cache / built_server().relative_to(built_server().parents[2])
    binary.parent.mkdir(parents=True)
    binary.write_text(CHANGING_PROXY.format(python=sys.executable, server=str(built_server())))
    binary.chmod(0o755)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi there\n")
    out = tmp_path / "out"
    result = ead(
        "bench", "prompts", str(prompts), "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]),
        "--threads", "1", "--max-tokens", "4", "--strategies", "server-large", "--out", str(out),
        env={"EAD_CACHE": str(cache), "NO_COLOR": "1", **env},
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"error: the llama-server of server-large {said}"
    assert samples(out) == {}  # nothing recorded of the sample


def test_the_ngram_types_are_the_ones_this_build_offers() -> None:
    """NGRAM_TYPES checks --server-ngram before anything starts: it must match the binary's --help."""
    help_text = subprocess.run([str(built_server()), "--help"], capture_output=True, text=True).stdout
    line = next(line for line in help_text.splitlines() if line.startswith("--spec-type"))
    offered = line.split()[1].split(",")
    assert set(grid.NGRAM_TYPES) == {name for name in offered if name.startswith("ngram-")}
    assert grid.DRAFT_TYPE in offered


# ------------------------------------------------------------------------------------- the real pair


@pytest.mark.real
def test_the_real_pair_native_loops_on_one_humaneval_task(real_pair, tmp_path) -> None:
    """HumanEval/2 on the demo pair: llama.cpp's large-alone loop writes the Python loop's text and stops
    at the same closing fence; its speculative decoding drafts with the 0.5B and passes."""
    small, large = real_pair
    out = tmp_path / "out"
    result = ead(
        "bench", "humaneval", "--ids", "2", "--small", str(small), "--large", str(large), "--threads", "1",
        "--max-tokens", "128", "--strategies", "large,server-large,server-spec", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    records = samples(out)
    large_only = records[("large-only", "HumanEval/2")]
    native_large = records[("server-large", "HumanEval/2")]
    spec = records[("server-spec draft=3", "HumanEval/2")]
    assert large_only["finish_reason"] == "stop" and large_only["passed"]
    assert native_large["text"] == large_only["text"]
    assert (native_large["generated"], native_large["finish_reason"]) == (large_only["generated"], "stop")
    assert spec["passed"] and spec["server"]["draft_n"] > 0 and spec["acceptance_rate"] > 0.5
    assert "server tok/s" in result.stdout.decode()

"""llama.cpp's own decoding loops as bench strategies: the ``llama-server`` that
``scripts/build_llama_server.sh`` builds, driven over loopback.

Three peers, what a llama.cpp user would run instead of ead:

- ``server-large``: the large model alone, llama.cpp's C++ loop (against the Python loop of ``large-only``);
- ``server-spec draft=N``: llama.cpp's speculative decoding, the small model as its draft model
  (``--spec-draft-model``, ``--spec-type draft-simple``, ``--spec-draft-n-max N``; llama.cpp's default is 3);
- ``server-ngram type=T``: draft-free n-gram speculation (``--spec-type T``, e.g. ``ngram-mod``).

Each configuration gets one server, started on a free loopback port (``--port 0``; the address is read
from its log) the first time a sample needs it and stopped when the bench ends, so startup is never
in a sample's time. A sample is one ``POST /completion``: the bench's own token ids as the prompt (the
same ids the Python strategies get), greedy (the top-k sampler alone with k=1), the bench's max tokens
and stop strings, ``cache_prompt`` off so every sample pays its whole prefill. The text is rebuilt here
from the token ids the server returns, through the same stop-string and end-of-generation handling as
the Python loop, so both sides' texts and token counts mean the same.

Figures: wall-clock is what the client waits for the reply; the server's own ``timings`` (prompt and
generation milliseconds, and for speculation ``draft_n`` and ``draft_n_accepted``) go in the record's
``server`` field, each checked (``server_timings``). FLOPs are estimated from those counts (2 x
parameters per token each model reads), since the server does not report what it computed.

Greedy speculative decoding is lossless in exact arithmetic, but llama.cpp computes a verification batch
with other kernels than a one-token step, so at near-ties the argmax can differ and the text part from
one-token greedy decoding; ``agreement`` and ``same text`` in the report show how often.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from ..decoder import ModelReport, Summary
from ..errors import EadError, cut, shown_path
from ..figures import is_count, is_figure
from ..hardware import Repack, repack_choice, server_repack_args
from ..options import GenerationOptions
from ..registry import is_remote
from ..remote import RemoteError, RemoteRunner, built_server
from ..runner import Runner, forward_flops
from ..signals import popen_with_signals_held
from ..text import TextStream
from .grid import NativeOptions
from .sandbox import dying_with_this_process, signal_name

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 3600.0  # a whole answer in one reply, on a busy machine
STOP_TIMEOUT_S = 10.0


def server_binary() -> Path:
    """The built llama-server, or a one-line error saying how to build it (one that is there but cannot run
    too, before any model loads; EAD_CACHE moves where it is looked for)."""
    binary = built_server()
    if not binary.is_file():
        raise EadError(f"no llama-server at {shown_path(binary)}: ./scripts/build_llama_server.sh builds it")
    if not os.access(binary, os.X_OK):
        raise EadError(
            f"llama-server at {shown_path(binary)} cannot run (not executable): "
            "./scripts/build_llama_server.sh builds it"
        )
    return binary


def check_peers(generation: GenerationOptions, refs: Sequence[str]) -> None:
    """What the server strategies need, refused before any model loads: greedy decoding (each sample is
    top-k 1), the small and the large model as local files (each server loads them itself), and the
    built llama-server. ``refs``: the bench's models, smallest first, as given."""
    if generation.sampling.temp != 0:
        raise EadError("server strategies decode greedily: leave --temp at 0", exit_code=2)
    for ref in (refs[0], refs[-1]):
        if is_remote(ref):
            raise EadError(f"server strategies need local model files, not {cut(ref)}", exit_code=2)
    server_binary()


# ------------------------------------------------------------------------------------------ a server


@dataclass(frozen=True)
class Server:
    """A running llama-server: its process, address and log."""

    process: subprocess.Popen
    url: str
    log: Path


@contextmanager
def llama_server(
    model: Path,
    args: Sequence[str],
    log: Path,
    *,
    repack: Repack | None = None,
) -> Iterator[Server]:
    """llama-server on a free loopback port (the OS picks it; the log says which), one slot, no web UI;
    yields once it listens (it may still be loading: ``GET /health`` says), stops it cleanly after.
    ``repack`` None: the same decision as a local load (``--no-repack`` where AMX would crash)."""
    binary = server_binary()
    with open(log, "wb") as handle:
        command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-np", "1"]
        command += ["--no-webui", *server_repack_args(repack or repack_choice()), *args]
        try:  # a file that is no program for this system (a build cut short): its reason, one line
            process = popen_with_signals_held(
                command,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                preexec_fn=dying_with_this_process(),  # not left serving by a bench killed outright
            )
        except OSError as error:
            raise EadError(f"cannot start llama-server at {shown_path(binary)}: {error.strerror}") from None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (found := re.search(rb"listening on (http://127\.0\.0\.1:\d+)", log.read_bytes())):
            if process.poll() is not None:
                raise EadError(f"llama-server stopped at start: {last_log_line(log)}")
            if time.monotonic() > deadline:
                raise EadError(f"llama-server did not start within {START_TIMEOUT_S:g} s")
            time.sleep(0.05)
        yield Server(process, found.group(1).decode(), log)
    finally:
        stop(process)


def last_log_line(log: Path) -> str:
    """What a server that stopped said last (an assertion, a refused option), cut to a line's length."""
    lines = log.read_text(errors="replace").strip().splitlines() or ["no output"]
    return lines[-1][:200]


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (llama-server shuts down cleanly on it), SIGKILL if it has not within a few seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


# ------------------------------------------------------------------------------------------ the peers


def _is_some_count(value: Any) -> bool:
    return is_count(value) and value >= 1


def _is_some_time(value: Any) -> bool:
    return is_figure(value) and value > 0


# llama-server's timings of a sample -> (check, what each must be): every reply reads a prompt (cache_prompt
# off) and writes a token, each in some time (a generation's at least 1 us: llama-server clamps it there)
_TIMINGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "prompt_n": (_is_some_count, "a count of at least 1"),
    "prompt_ms": (_is_some_time, "a time (a number above 0)"),
    "predicted_n": (_is_some_count, "a count of at least 1"),
    "predicted_ms": (_is_some_time, "a time (a number above 0)"),
    "draft_n": (is_count, "a count"),
    "draft_n_accepted": (is_count, "a count"),
}
_UNDRAFTED = {"draft_n": 0, "draft_n_accepted": 0}  # llama-server leaves them out where it drafted none


def server_timings(reply: dict[str, Any], server: str) -> dict[str, Any]:
    """A sample's own figures from llama-server's ``timings``, each checked: a reply without them had been
    recorded as 0 ms without a word, and one with nonsense (-5 ms, a count as text) as sent, or ended the
    bench in a traceback; now one line naming ``server`` and the field, and no record."""
    timings = reply.get("timings")
    if not isinstance(timings, dict):
        raise RemoteError(f"{server} sent no timings")
    given = _UNDRAFTED | timings
    for key, (check, expected) in _TIMINGS.items():
        if key not in given:
            raise RemoteError(f"{server} sent timings without {key}")
        if not check(given[key]):
            raise RemoteError(f"{server} sent {key} {cut(json.dumps(given[key]))}: not {expected}")
    if given["draft_n_accepted"] > given["draft_n"]:
        accepted, drafted = given["draft_n_accepted"], given["draft_n"]
        raise RemoteError(f"{server} sent draft_n_accepted {accepted}: more than its draft_n {drafted}")
    return {key: given[key] for key in _TIMINGS}


def server_tokens(reply: dict[str, Any], server: str, n_vocab: int) -> list[int]:
    """The token ids of llama-server's reply, each checked to be one of its model's: one sent as text had
    ended the bench in a traceback, a fraction had been cut to an integer, and one past the vocabulary had
    been read outside it (a negative one aborts llama.cpp); now one line naming ``server`` and the id."""
    for token in reply["tokens"]:
        if not (is_count(token) and token < n_vocab):
            given, ids = cut(json.dumps(token)), f"0 to {n_vocab - 1}"
            raise RemoteError(f"{server} sent token id {given}: not a token id of its model ({ids})")
    return reply["tokens"]


class NativePeers:
    """The servers of a bench run, started on first use and stopped together at the end.

    ``runners`` are the bench's own models (smallest first): their files are what the servers load,
    their tokenizer turns the returned ids into text exactly as the Python loop does. The bench checks
    them and ``generation`` with ``check_peers`` before they load.
    """

    def __init__(self, runners: Sequence[Runner], generation: GenerationOptions) -> None:
        self.small, self.large = runners[0], runners[-1]
        self.generation = generation
        self.threads = self.large.n_threads  # as many as ead's own runners use
        self.threads_batch = self.large.n_threads_batch
        self.n_ctx = self.large.n_ctx
        self._stack = ExitStack()
        self._logs = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="ead-native-")))
        self._clients: dict[NativeOptions, RemoteRunner] = {}
        self._servers: dict[NativeOptions, Server] = {}

    def client(self, options: NativeOptions, warm_prompt: Sequence[int]) -> RemoteRunner:
        """The server of a configuration, started (and warmed with one short request) on first use."""
        if options not in self._clients:
            args = [
                "-c", str(self.n_ctx), "-b", str(self.large.n_batch), "-ub", str(self.large.n_ubatch),
                "-t", str(self.threads), "-tb", str(self.threads_batch),
                "-ctk", self.large.cache_types[0], "-ctv", self.large.cache_types[1],
                "-ctkd", self.small.cache_types[0], "-ctvd", self.small.cache_types[1],
                "-fa", self.large.flash_attn,
                *options.flags(self.small.path, self.threads, self.threads_batch),
            ]  # fmt: skip
            log = self._logs / f"{options.kind}-{len(self._clients)}.log"
            server = self._stack.enter_context(
                llama_server(self.large.path, args, log, repack=self.large.repack)
            )
            client = RemoteRunner(
                server.url, name=options.name, tokenizer=self.small, timeout_s=REPLY_TIMEOUT_S
            )
            self._stack.callback(client.close)
            self._servers[options] = server
            self._complete(client, warm_prompt, 1)
            self._clients[options] = client
        return self._clients[options]

    def _complete(self, client: RemoteRunner, prompt: Sequence[int], n_predict: int) -> dict[str, Any]:
        reply = client.request(
            "POST",
            "/completion",
            {
                "prompt": list(prompt),
                "n_predict": n_predict,
                "cache_prompt": False,
                "samplers": ["top_k"],
                "top_k": 1,
                "stop": list(self.generation.stop),
                "return_tokens": True,
                "response_fields": ["tokens", "stop_type", "timings"],
            },
        )
        if not isinstance(reply, dict) or not isinstance(reply.get("tokens"), list):
            raise EadError(f"{client.url}/completion sent no token ids (is it llama-server?)")
        return reply

    def generate(self, options: NativeOptions, prompt: Sequence[int]) -> tuple[str, Summary, dict[str, Any]]:
        """One sample: its text, a Summary like the Python loop's, and the server's own timings."""
        client = self.client(options, prompt)
        began = perf_counter()
        try:
            reply = self._complete(client, prompt, self.generation.max_tokens)
        except RemoteError:
            self._check_running(options)
            raise
        wall = perf_counter() - began
        name = f"the llama-server of {options.name}"
        server = server_timings(reply, name)
        tokens = server_tokens(reply, name, self.large.n_vocab)
        text, generated, finish = self._text(tokens, reply.get("stop_type"), len(prompt))
        return text, self._summary(options, len(prompt), generated, finish, wall, server), server

    def _check_running(self, options: NativeOptions) -> None:
        """A request that failed because the server died under the bench (a crash, the OOM killer): which
        server and how it ended, not the loopback address that refused the connection."""
        server = self._servers[options]
        with contextlib.suppress(subprocess.TimeoutExpired):  # a connection cut as it dies: its end follows
            server.process.wait(timeout=1)
        code = server.process.returncode
        if code is not None:
            ended = f"killed by {signal_name(-code)}" if code < 0 else f"exit status {code}"
            message = f"the llama-server of {options.name} stopped ({ended}): {last_log_line(server.log)}"
            raise EadError(message) from None

    def _text(self, tokens: list[int], stop_type: Any, prompt_len: int) -> tuple[str, int, str]:
        """The text, tokens generated and finish reason, by the Python loop's rules: a token that ends
        the generation or completes a stop string is counted, nothing after it."""
        stream, pieces, generated, finish = TextStream(self.generation.stop), [], 0, "length"
        for token in tokens:
            generated += 1
            pieces.append(stream.push(self.large.token_bytes(token)))
            if self.large.is_end_of_generation(token) or stream.stopped:
                finish = "stop"
                break
            if generated >= self.generation.max_tokens or prompt_len + generated > self.n_ctx:
                break
        else:
            if stop_type in ("eos", "word"):  # an end-of-generation token it did not return
                finish = "stop"
        pieces.append(stream.flush())
        return "".join(pieces), generated, finish

    def _summary(
        self,
        options: NativeOptions,
        prompt_len: int,
        generated: int,
        finish: str,
        wall: float,
        server: dict[str, Any],
    ) -> Summary:
        """The Python loop's figures as far as the server's counts give them. Drafted tokens the large
        model accepted count as the small model's (as in the Python ``spec``). FLOPs as a Runner counts
        them, from estimated reads: the large model reads the prompt, each token it keeps but the last,
        and each draft token it rejects, with a logits row for each after the prompt's last; the
        drafter reads the prompt and its drafts."""
        drafted, accepted = int(server["draft_n"]), int(server["draft_n_accepted"])
        by_small = accepted if options.kind == "spec" else 0
        large_reads = prompt_len + max(generated - 1, 0) + drafted - accepted
        reports = [
            ModelReport(
                role="large",
                path=str(self.large.path),
                params=self.large.n_params,
                written=generated - by_small,
                prefill_tokens=int(server["prompt_n"]),
                prefill_s=float(server["prompt_ms"]) / 1000,
                decode_tokens=int(server["predicted_n"]),
                decode_s=float(server["predicted_ms"]) / 1000,
                catchup_tokens=0,
                catchup_s=0.0,
                flops=forward_flops(self.large, large_reads, large_reads - prompt_len + 1),
                requests=1,
                network_s=wall,
                server_s=(float(server["prompt_ms"]) + float(server["predicted_ms"])) / 1000,
            )
        ]
        if options.kind == "spec":
            small = self.small
            reports.insert(
                0,
                ModelReport("small", str(small.path), small.n_params, by_small, 0, 0.0, 0, 0.0, 0, 0.0,
                            flops=forward_flops(small, prompt_len + drafted, drafted)),
            )  # fmt: skip
        return Summary.of(
            reports,
            finish_reason=finish,
            prompt_tokens=prompt_len,
            generated=generated,
            wall_s=wall,
            drafted=drafted,
            accepted=accepted,
        )

    def close(self) -> None:
        """Stop every server (and drop their logs)."""
        self._stack.close()

    def __enter__(self) -> NativePeers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

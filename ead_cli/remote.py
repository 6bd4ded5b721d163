"""A model served by llama.cpp's ``llama-server``, behind the interface the decoder uses for a local one.

Token ids go over the wire, never text, so both sides see the same tokens. Each step is one
``POST /completion`` with every token so far as the prompt, ``n_predict`` 1 and ``n_probs`` k: the
server's prompt cache keeps the prefix it has already read, so a call computes only the new tokens
(the catch-up), and the reply carries the top-k probabilities of the next token (the softmax of the
raw logits, before any sampler). The token is chosen here, from those k, by the run's own sampler.

What llama-server cannot give: logits at every position of a batch, which ``--verify`` and speculative
decoding need, so a remote model cannot be the checker (``build_decoder`` refuses it in one line).

Entropy from the top k: H_k = -sum p_i log2 p_i over the k, plus the tail's share. The tail holds
r = 1 - sum p_i, and no tail token is likelier than the k-th, so the tail's entropy is at least
r log2(1/p_k) (the tail as tokens each as likely as the k-th) and at most r log2((|V| - k) / r) (spread
evenly over the rest). ``entropy`` returns the lower bound; ``scripts/topk_entropy.py`` measures both
against the exact entropy on the demo pair.
"""

from __future__ import annotations

import html
import http.client
import io
import json
import math
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from .errors import EadError, cut, quoted
from .options import DEFAULT_TIMEOUT_S, DEFAULT_TOP_K, check_remote_settings
from .paths import ead_cache_dir
from .runner import Phase, PhaseCounter, RunnerStats, forward_flops

# The server's own pick is unused, but it must be a whole character: for a token that ends inside a
# UTF-8 sequence llama-server holds the text back, and its probabilities with it. A logit bias (not
# reflected in the probabilities) makes it pick "a". 100 is the most OpenAI-compatible servers accept.
UNUSED_PICK_BIAS = 100
ADDRESS_FORM = (
    "a server address must look like http://HOST:PORT[/PREFIX], or the same ending in /v1 (OpenAI-compatible)"
)
# An endpoint of llama-server's own (an OpenAI one is what follows /v1) that ends an address given where
# the server's is meant: llama.cpp's docs show each as a full URL (http://localhost:8080/completion)
LLAMA_SERVER_ENDPOINT = re.compile(
    r"/(chat/completions|completions?|(de)?tokenize|embeddings?|infill|rerank(ing)?|apply-template"
    r"|health|props|slots|metrics|models)$"
)
# What reading a reply that is not as documented raises; OverflowError: a number past a float or 64 bits
MALFORMED = (KeyError, IndexError, TypeError, ValueError, OverflowError)
# The largest reply read: a token step's at --remote-top-k 1000 is 83 kB on Qwen2.5-Coder 1.5B
MAX_REPLY_BYTES = 16 << 20
# The most of a server's own message an error quotes; of a 404's page, which says only what is not there
MESSAGE_CHARS = 200
NOT_FOUND_CHARS = 60
# An HTML page's parts that are no words of it: its head (the title the body repeats), scripts, comments
PAGE_NOISE = re.compile(r"<(head|script|style)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
TAG = re.compile(r"<[^>]*>")
# How far above 1 the top-k probabilities may add up: float32 rounding, never a real excess
PROBABILITY_SLACK = 1e-3
# Strings whose tokenization must agree on both sides: ASCII, code, whitespace runs, accents, CJK,
# emoji (byte fallback), digits, and the chat template's special tokens.
PROBES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "    \t\t  \n\n\n   trailing   ",
    "naïve café, Straße, Ελληνικά, русский, עברית, العربية",
    "日本語のテキスト、中文文本 한국어 텍스트",
    "emoji 🤖🧪🚀 and 1234567890 3.14159e-10",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
)
# The probes in one text: the server's tokens for it tell a model from another under the same name
PROBE_TEXT = "\n".join(PROBES)


def built_server() -> Path:
    """Where ``scripts/build_llama_server.sh`` puts the llama-server it builds from the vendored llama.cpp."""
    return ead_cache_dir() / "llama-server" / "0.3.36" / "llama-server"


def remote_label(url: str) -> str:
    """What a model on a llama-server is called (its runner's ``label``, before it connects): its address
    without a trailing slash, the runner's ``url``."""
    return url.rstrip("/")


def server_address(url: str) -> tuple[str, int, str]:
    """A server address's host, port and path (no trailing slash): the prefix a reverse proxy serves
    the server under, then /v1 for an OpenAI-compatible endpoint. One that does not read as
    http://HOST:PORT[/PREFIX][/v1] is a usage error, an unclosed IPv6 bracket or a bad port too (urlsplit
    checks the port only when asked for it). So are the parts ead would not use, rather than dropped
    without a word: port 0, a query or fragment, a user and password, spaces in the host or path, and a
    host name the resolver cannot encode (a label past 63 characters or empty: a traceback had followed).
    Another scheme (https, ftp, file) is named as such, and a path that ends in an endpoint (anything
    after /v1, or one of llama-server's own) with the server's address to give instead."""
    bad = EadError(f"{quoted(url)}: {ADDRESS_FORM}", exit_code=2)
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("", "http"):  # '' where http:// is mistyped: http//HOST
            why = "ead reaches a server over plain http:// only"
            if parts.scheme == "file":
                why = "a model file is given by its path, not as a file:// address"
            raise EadError(f"{quoted(url)}: {why}; {ADDRESS_FORM}", exit_code=2)
        port = 80 if parts.port is None else parts.port
        (parts.hostname or "").encode("idna")  # as getaddrinfo encodes it; UnicodeError is a ValueError
    except ValueError:
        raise bad from None
    path = parts.path.rstrip("/")
    if (
        parts.scheme != "http"
        or not parts.hostname
        or port == 0
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
        or not path.isascii()  # http.client sends the request line in ASCII
        or not all(char.isprintable() and not char.isspace() for char in parts.netloc + path)
    ):
        raise bad
    ending = _endpoint(path)
    if ending is not None:
        served, endpoint = ending
        address = cut(f"{parts.scheme}://{parts.netloc}{served}")
        message = f"{quoted(url)} ends in the endpoint {cut(endpoint)}: give the server's address, {address}"
        raise EadError(message, exit_code=2)
    return parts.hostname, port, path


def _endpoint(path: str) -> tuple[str, str] | None:
    """(the server's path, the endpoint after it) where an address's ``path`` ends in an endpoint."""
    api, v1, after = path.partition("/v1/")
    if v1:
        return f"{api}/v1", f"/{after}"
    found = LLAMA_SERVER_ENDPOINT.search(path)
    return (path[: found.start()], found.group()) if found else None


class RemoteError(EadError):
    """The server failed: unreachable, too slow, an HTTP error (its ``status``), or a reply that makes
    no sense."""

    def __init__(self, message: str, status: int | None = None, answer: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.answer = answer  # the server's own words, with the status: 'HTTP 503: Loading model'


class TimedReply(http.client.HTTPResponse):
    """A reply that must come whole, head and body, by ``deadline``: the socket's timeout bounds each
    read alone, so a server sending a byte now and then had held ead for as long as it liked (in the
    head, until the server stopped; the body had been checked between reads)."""

    def __init__(
        self, sock: socket.socket, *args: Any, deadline: float, timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # the base class's reader, whose reads each wait as long as the timeout
        self._reads = ReadsUntil(sock, deadline, timeout_s)
        self.fp = io.BufferedReader(self._reads)

    def begin(self) -> None:
        """Read the head; one the connection closed in (before its blank line) is an incomplete reply,
        where http.client had taken it for a whole one with an empty body (a healthy server's)."""
        super().begin()
        if self._reads.ended:  # the head is read a line at a time: its end is never read past
            raise http.client.IncompleteRead(b"")


class ReadsUntil(io.RawIOBase):
    """A socket's bytes, each read waiting only for what is left until ``deadline`` (TimeoutError past
    it), the socket's own timeout put back after (the next request's send has the whole of it);
    ``ended``: the connection closed."""

    def __init__(self, sock: socket.socket, deadline: float, timeout_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._reader = sock.makefile("rb", buffering=0)  # counted by the socket, which stays open for it
        self._deadline = deadline
        self._timeout_s = timeout_s
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._sock.settimeout(left)
        try:
            count = self._reader.readinto(buffer)
        finally:
            self._sock.settimeout(self._timeout_s)
        self.ended = count == 0
        return count

    def close(self) -> None:
        self._reader.close()
        super().close()


class Tokenizer(Protocol):
    """What a remote runner borrows from a local model with the same vocabulary."""

    n_vocab: int

    def token_bytes(self, token: int) -> bytes: ...

    def is_end_of_generation(self, token: int) -> bool: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]: ...


@dataclass
class NetworkStats:
    """Requests made, seconds waiting for replies, bytes each way, and the server's own compute time."""

    requests: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    server_s: float = 0.0


class RemoteRunner:
    """A llama-server at ``url`` as a runner: ``sync`` returns a logits row that holds the top-k
    log-probabilities of the next token (-inf elsewhere), ``entropy`` the top-k estimate."""

    kind = "a llama-server"  # what a server that has not the endpoints ead asks is not
    ctx = None  # no local llama.cpp context: the sampler draws from the row itself
    logits_row = -1  # the one row it keeps
    model = None

    def __init__(
        self,
        url: str,
        *,
        name: str,
        tokenizer: Tokenizer,
        top_k: int = DEFAULT_TOP_K,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        api_key: str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self._host, self._port, path = server_address(url)
        check_remote_settings(top_k, timeout_s, api_key)
        # on every request, as llama.cpp's own clients send a llama-server's --api-key; never shown
        self._authorization = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self._api_key = api_key
        self.url = remote_label(url)
        parts = urlsplit(url)
        self._origin = f"{parts.scheme}://{parts.netloc}"  # a request's path follows it (with any prefix)
        self._root = path.removesuffix("/v1")  # llama-server's own endpoints, behind a proxy's prefix too
        self.name = name
        self.label = self.location = self.url
        self.top_k = top_k
        self.timeout_s = timeout_s
        self._tokenizer = tokenizer
        self._safe_token = tokenizer.tokenize("a", add_special=False)[0]
        self._connection: http.client.HTTPConnection | None = None
        self.network = NetworkStats()
        self.stats = RunnerStats.empty()
        self.n_past = 0  # tokens the server holds for us, as far as we know
        self._served: str | None = None  # the served model's fingerprint when it was last checked
        self._local_name = "the local model"  # check_tokenizer's, for a check again
        self._checking_again = False
        self._wait_until_ready(progress)
        meta, listed = self._meta()
        self._describe(meta)
        self._served = self._fingerprint(listed)
        self.file_bytes: int | None = None
        self._row = np.full(tokenizer.n_vocab, -np.inf, dtype=np.float32)
        self._top_ids = np.zeros(0, dtype=np.int64)
        self._top_probs = np.zeros(0, dtype=np.float64)

    def _describe(self, meta: dict[str, Any]) -> None:
        """Take the listed sizes. A context with no room for a prompt is refused here, once (it had failed
        every request after): llama-server says 0 only where it has no model (its router's /props), so
        0 is not read as 'unknown'."""
        n_ctx = int(meta["n_ctx"])
        if n_ctx < 2:  # llama-server refuses a prompt that fills its context, and a prompt has a token
            where = self._at(self._listing_path())
            raise RemoteError(f"{where} reports a context of {n_ctx} tokens: no prompt fits")
        self._described = meta
        self.n_vocab = int(meta["n_vocab"])
        self.n_ctx = n_ctx - 1
        self.n_params = int(meta["n_params"])
        self.n_embd = int(meta["n_embd"])
        self.head_params = self.n_vocab * self.n_embd
        self.body_params = max(self.n_params - self.head_params, 0)

    # ------------------------------------------------------------------------------------- the protocol

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One HTTP exchange; every failure becomes a RemoteError naming the server."""
        data = json.dumps(body).encode() if body is not None else None
        began = perf_counter()
        try:
            response, payload = self._exchange(method, path, data)
        except TimeoutError:
            self._drop_connection()
            # the origin: an OpenAI address's /v1 is in the path (it had been '.../v1 did not answer /v1/...')
            waited = f"did not answer {cut(path)} within {self.timeout_s:g} s"
            raise RemoteError(f"{cut(self._origin)} {waited}") from None
        except (OSError, http.client.HTTPException) as error:
            self._drop_connection()
            raise RemoteError(self._failure(path, error)) from None
        finally:
            self.network.requests += 1
            self.network.seconds += perf_counter() - began
        self.network.bytes_sent += len(data or b"")
        self.network.bytes_received += len(payload)
        if 300 <= response.status < 400:
            raise RemoteError(self._redirect(path, response))
        try:
            reply = json.loads(payload) if payload else None
        except (ValueError, RecursionError):  # nested past Python's limit: not JSON ead can read
            if response.status < 400:
                raise RemoteError(f"{self._at(path)} sent a reply that is not JSON") from None
            reply = page_text(payload.decode("utf-8", "replace"))  # an error page (a proxy's) says why
        if response.status == 404:  # llama-server has every endpoint ead asks
            said = _error_message(reply, self._api_key, NOT_FOUND_CHARS)
            asked = f"{method} {cut(path)} answered HTTP 404 ({said})"
            raise RemoteError(f"{cut(self.url)} is not {self.kind}: {asked}", 404)
        if response.status == 401:  # a llama-server started with --api-key
            asked = f"{method} {cut(path)} answered HTTP 401: {_error_message(reply, self._api_key)}"
            if self._authorization:
                raise RemoteError(f"{cut(self.url)} refused the API key given ({asked})", 401)
            how = "give it with --remote-api-key or EAD_REMOTE_API_KEY"
            raise RemoteError(f"{cut(self.url)} asks for an API key ({asked}): {how}", 401)
        if response.status >= 400:
            answer = f"HTTP {response.status}: {_error_message(reply, self._api_key)}"
            raise RemoteError(f"{self._at(path)} failed with {answer}", response.status, answer)
        return reply

    def _redirect(self, path: str, response: http.client.HTTPResponse) -> str:
        """A 3xx in one line with where it points: ead follows none (a request's body and the address
        the tokenizer was checked at would not follow), and one had been taken for a healthy server,
        then 'did not describe the model' followed."""
        location = response.getheader("Location")
        where = f"to {one_line(location)}: give that address" if location else "without saying where"
        return f"{self._at(path)} redirects (HTTP {response.status}) {where}"

    def _failure(self, path: str, error: OSError | http.client.HTTPException) -> str:
        """Why an exchange failed, in one line: a connection refused or lost is 'unreachable'; a reply
        cut short, or not HTTP at all (an https server, another service: what it sent, quoted), is
        said as such (both had been 'unreachable', the latter with the raw bytes and their newline)."""
        if isinstance(error, http.client.IncompleteRead):
            return f"{self._at(path)} sent an incomplete reply"
        if isinstance(error, http.client.BadStatusLine) and not isinstance(error, ConnectionError):
            return f"{self._at(path)} did not answer in HTTP: it sent {error.line[:40]!r}"
        if isinstance(error, http.client.HTTPException) and not isinstance(error, ConnectionError):
            return f"{self._at(path)} sent a malformed HTTP reply ({one_line(str(error))})"
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return f"{cut(self.url)} is unreachable ({one_line(reason)})"

    def _exchange(self, method: str, path: str, data: bytes | None) -> tuple[http.client.HTTPResponse, bytes]:
        """Send on the kept-alive connection; if the server had closed it while idle (llama-server does
        after a few seconds), send once more on a new one. Every request here can safely be repeated.
        A connection the server closes after its reply is dropped here, so the next one is checked.
        Each attempt has the whole timeout: the retry had kept the first's deadline, so a connection
        that died after a while cut short a reply that came within the timeout of its own request."""
        headers = self._authorization | ({"Content-Type": "application/json"} if data is not None else {})
        reused = self._connection is not None
        while True:
            try:
                if self._connection is None:  # refused: none is kept, so the next request checks again
                    self._check_again()  # its requests may leave one open, which this one takes
                if self._connection is None:
                    self._connection = http.client.HTTPConnection(
                        self._host, self._port, timeout=self.timeout_s
                    )
                deadline = time.monotonic() + self.timeout_s
                timed = partial(TimedReply, deadline=deadline, timeout_s=self.timeout_s)
                self._connection.response_class = timed
                self._connection.request(method, path, body=data, headers=headers)
                response = self._connection.getresponse()
                body = self._body(response, path)
                if response.will_close:  # http.client would open the next one itself, unchecked
                    self._drop_connection()
                return response, body
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
                self._drop_connection()
                if not reused:
                    raise
                reused = False
            except BaseException:  # Ctrl-C while waiting: the reply left unread would block the next request
                self._drop_connection()
                raise

    def _body(self, response: http.client.HTTPResponse, path: str) -> bytes:
        """The reply's body, a piece at a time: ``MAX_REPLY_BYTES`` bounds its size (an endless one had
        filled the memory), as ``TimedReply`` bounds its time."""
        body = bytearray()
        while piece := response.read1(1 << 16):
            body += piece
            if len(body) > MAX_REPLY_BYTES:
                limit = f"{MAX_REPLY_BYTES >> 20} MiB"
                raise RemoteError(f"{self._at(path)} sent a reply of more than {limit}")
        if response.length:  # read1 takes a connection closed early for the end of the body
            raise http.client.IncompleteRead(bytes(body), response.length)
        response.close()  # read1 leaves a reply read to its length open, and the connection waiting on it
        return bytes(body)

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _check_again(self) -> None:
        """On a new connection, before its first request: whether the server still serves the model it
        was checked with. A server restarted on the same port with another model (the old connection
        dies with it) had answered with another vocabulary, silently; a model with another fingerprint
        (three requests per connection, none per token) is checked again, and refused with the reason as
        long as it is served. A model that shares the tokenizer is taken, with its sizes."""
        if self._served is None or self._checking_again:
            return  # still starting, or this is the check's own new connection
        self._checking_again = True
        try:
            described = self._described
            meta, listed = self._meta()
            served = self._fingerprint(listed)
            if served == self._served:
                return
            try:
                self._describe(meta)
                self.check_tokenizer(self._local_name)
            except EadError as error:
                self._describe(described)  # and checked again on the next connection
                if isinstance(error, RemoteError):
                    raise
                now = quoted(str(listed.get("id")))
                raise RemoteError(f"{cut(self.url)} now serves another model ({now}): {error}") from None
            self._served = served
        finally:
            self._checking_again = False

    def _fingerprint(self, listed: dict[str, Any]) -> str:
        """What tells the served model from another: the listing's id and sizes (``served_model``), and
        the server's tokens for the probes and its end-of-generation ids, which tell another tokenizer
        under the same name and sizes (a file replaced in place, an alias kept; a model whose end of turn
        is another token, which /props does not say: it names the end-of-sequence token alone)."""
        end_of_generation_ids = sorted(self._end_of_generation())
        return json.dumps([served_model(listed), self._tokenize(PROBE_TEXT), end_of_generation_ids])

    def _wait_until_ready(self, progress: Callable[[str], None] | None) -> None:
        """GET /health until the server has loaded its model (503 while loading), up to the timeout: the
        wait said through ``progress`` (it had been a minute without a word), and past it, the server
        named as not ready (the last 503 had been quoted as any failure)."""
        deadline = time.monotonic() + self.timeout_s
        waited = False
        while True:
            try:
                self.request("GET", self._health_path())
                return
            except RemoteError as error:
                if error.status != 503:
                    raise
                if time.monotonic() > deadline:
                    still = f"was still not ready after {self.timeout_s:g} s ({error.answer}"
                    raise RemoteError(f"{cut(self.url)} {still}; --remote-timeout sets the wait)") from None
                if progress is not None and not waited:
                    wait = f"for up to {self.timeout_s:g} s (--remote-timeout)"
                    progress(f"waiting for {cut(self.url)}: not ready ({error.answer}), {wait}")
                waited = True
            time.sleep(0.2)

    def _health_path(self) -> str:
        return f"{self._root}/health"

    def _listing_path(self) -> str:
        return f"{self._root}/v1/models"

    def _meta(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The listed model's sizes, and its entry in the listing."""
        reply = self.request("GET", self._listing_path())
        try:
            model = reply["data"][0]
            meta = model["meta"]
            for key in ("n_vocab", "n_ctx", "n_params", "n_embd"):
                int(meta[key])
        except MALFORMED:
            raise RemoteError(
                f"{self._at(self._listing_path())} did not describe the model (is it llama-server?)"
            ) from None
        return meta, model

    def _tokenize(self, text: str) -> list[int]:
        """The server's own tokens for ``text``, no special ones added: llama-server's fields and
        vLLM's (``prompt``, ``add_special_tokens``) in one body, each server ignoring the other's."""
        path = f"{self._root}/tokenize"
        body = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
        try:
            reply = self.request("POST", path, body | {"parse_special": True})
        except RemoteError as error:
            if error.status != 404:
                raise
            # an OpenAI-compatible server without it (LM Studio's, ollama's): not 'not OpenAI-compatible'
            message = "not found (HTTP 404): ead's tokenizer check needs it (llama-server and vLLM have one)"
            raise RemoteError(f"{self._at(path)} {message}", 404) from None
        try:
            return [int(token) for token in reply["tokens"]]
        except MALFORMED:
            raise RemoteError(f"{self._at(path)} sent a malformed reply") from None

    # ----------------------------------------------------------------------------- the runner interface

    def check_tokenizer(self, local_name: str) -> None:
        """Refuse a server whose tokenizer differs from the local model's: vocabulary size, the
        tokenization of probe strings (special tokens included), and the end-of-generation token."""
        self._local_name = local_name

        def refuse(reason: str) -> EadError:
            pair = f"models {quoted(local_name)} and {quoted(self.url)}"
            return EadError(f"{pair} do not share a tokenizer: {reason}")

        local = self._tokenizer
        if self.n_vocab != local.n_vocab and abs(self.n_vocab - local.n_vocab) > 0.01 * local.n_vocab:
            raise refuse(f"{local_name} has {local.n_vocab} tokens but the server's model {self.n_vocab}")
        for probe in PROBES:
            theirs, ours = self._tokenize(probe), local.tokenize(probe, add_special=False)
            if theirs != ours:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                    min(len(ours), len(theirs)),
                )
                raise refuse(f"{probe[:24]!r}... tokenizes differently from token {at} on")
        theirs_eog, ours_eog = self._end_of_generation(), end_of_generation(local)
        if theirs_eog != ours_eog:
            token = min(theirs_eog ^ ours_eog)
            where = "the server's model" if token in theirs_eog else local_name
            raise refuse(f"token {token} ends a generation only in {where}")

    def _end_of_generation(self) -> frozenset[int]:
        """The server's end-of-generation ids: with ignore_eos it bans each with a logit bias, and
        reports the biases in its generation settings."""
        reply = self.request(
            "POST",
            self._step_path(),
            {
                "prompt": [0],
                "n_predict": 1,
                "ignore_eos": True,
                "cache_prompt": False,
                "response_fields": ["generation_settings/logit_bias"],
            },
        )
        try:
            biases = reply["generation_settings/logit_bias"]
            return frozenset(int(entry["token"]) for entry in biases)
        except MALFORMED:
            message = "did not report its end-of-generation tokens"
            raise RemoteError(f"{self._at(self._step_path())} {message}") from None

    def sync(
        self,
        tokens: Sequence[int],
        *,
        prompt_len: int,
        own_tail: bool,
        guess: Callable[[], Sequence[int]] | None = None,
    ) -> np.ndarray:
        """Send every token so far; return a row with the next token's top-k log-probabilities.
        ``guess`` is ignored: the server returns no rows for guessed tokens."""
        n = len(tokens)
        if n > self.n_ctx:
            raise EadError(f"{n} tokens do not fit the server's context of {self.n_ctx} tokens")
        began = perf_counter()
        ids, logprobs, computed, server_ms = self._next_token(tokens)
        step = self._at(self._step_path())
        if not len(ids) or ids.min() < 0 or ids.max() >= len(self._row):
            raise RemoteError(f"{step} sent probabilities for tokens that do not exist here")
        check_probabilities(logprobs, step)
        ids, logprobs = in_order(ids, logprobs, step)
        self._count(tokens, prompt_len, own_tail, computed, perf_counter() - began)
        self.network.server_s += server_ms / 1000
        self.n_past = n
        row = self._row
        row[self._top_ids] = -np.inf
        row[ids] = logprobs
        self._top_ids, self._top_probs = ids, np.exp(logprobs)
        return row

    def _step_path(self) -> str:
        return f"{self._root}/completion"

    def _at(self, path: str) -> str:
        """An endpoint's address as a message names it, cut (a 10,000-character prefix had been echoed
        whole in every error)."""
        return cut(f"{self._origin}{path}")

    def _next_token(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int, float]:
        """One completion call: (top-k ids, their log-probabilities, tokens computed, server ms)."""
        reply = self.request(
            "POST",
            self._step_path(),
            {
                "prompt": list(tokens),
                "n_predict": 1,
                "n_probs": self.top_k,
                "cache_prompt": True,
                "samplers": ["top_k"],
                "top_k": 1,
                "logit_bias": [[self._safe_token, UNUSED_PICK_BIAS]],
                "post_sampling_probs": False,
                "response_fields": ["completion_probabilities", "timings"],
            },
        )
        try:
            ids, logprobs = _top_entries(reply["completion_probabilities"][0]["top_logprobs"])
        except MALFORMED:
            raise RemoteError(
                f"{self._at(self._step_path())} sent a malformed reply (no top probabilities)"
            ) from None
        return ids, logprobs, *self._timings(reply, len(tokens))

    def _timings(self, reply: dict[str, Any], n: int) -> tuple[int, float]:
        """Tokens the server computed and its milliseconds, from its ``timings`` where it reports them:
        a count past the prompt, or a time that is negative or NaN, is malformed (it had gone into the
        --stats summary as given, NaN making its JSON invalid)."""
        timings = reply.get("timings") if isinstance(reply.get("timings"), dict) else {}
        try:
            computed = int(timings.get("prompt_n", max(n - self.n_past, 0)))
            server_ms = float(timings.get("prompt_ms", 0.0)) + float(timings.get("predicted_ms", 0.0))
            if not (0 <= computed <= n and 0 <= server_ms < math.inf):
                raise ValueError
        except MALFORMED:
            raise RemoteError(f"{cut(self.url)} sent malformed timings") from None
        return computed, server_ms

    def _count(
        self, tokens: Sequence[int], prompt_len: int, own_tail: bool, computed: int, seconds: float
    ) -> None:
        """Book the tokens the server computed under the phase a local runner would have used."""
        start = len(tokens) - computed
        phase: Phase = (
            "prefill" if start < prompt_len else "decode" if own_tail and computed == 1 else "catchup"
        )
        counter: PhaseCounter = getattr(self.stats, phase)
        counter.tokens += computed
        counter.seconds += seconds
        self.stats.logits_rows += 1

    def entropy(self, row: np.ndarray) -> float:
        """Top-k estimate, in bits, of the entropy of the distribution ``sync`` returned last (the lower
        bound: the tail as tokens as likely as the k-th)."""
        return topk_entropy(self._top_probs, self.n_vocab)[0]

    def truncate(self, n: int) -> None:
        """Nothing to free here: the server keeps the common prefix of the next prompt by itself."""
        self.n_past = min(self.n_past, n)

    def align(self, tokens: Sequence[int]) -> int:
        """A new run: the server keeps what it can of its cache by itself; the network figures restart."""
        self.n_past = 0
        self.network = NetworkStats()
        return 0

    def flops(self) -> float:
        return forward_flops(self, self.stats.tokens_read, self.stats.logits_rows)

    def token_bytes(self, token: int) -> bytes:
        return self._tokenizer.token_bytes(token)

    def is_end_of_generation(self, token: int) -> bool:
        return self._tokenizer.is_end_of_generation(token)

    def close(self) -> None:
        self._drop_connection()


def check_probabilities(logprobs: np.ndarray, step: str) -> None:
    """Refuse log-probabilities that are no probabilities: NaN, above 0 (a probability above 1), or top
    ones that add up to more than 1; the entropy estimate from them had been nonsense, silently."""
    if not np.all(np.isfinite(logprobs) & (logprobs <= 0)):
        bad = next(float(value) for value in logprobs if not (math.isfinite(value) and value <= 0))
        raise RemoteError(f"{step} sent a malformed reply (log-probabilities must be at most 0, got {bad:g})")
    total = float(np.exp(logprobs).sum())
    if total > 1 + PROBABILITY_SLACK:
        message = f"top probabilities that add up to more than 1: {total:.4g}"
        raise RemoteError(f"{step} sent a malformed reply ({message})")


def in_order(ids: np.ndarray, logprobs: np.ndarray, step: str) -> tuple[np.ndarray, np.ndarray]:
    """The top k, likeliest first: the estimate takes the last for the least likely (a server listing
    them in another order had given another entropy, silently); the same token twice is malformed."""
    unique, counts = np.unique(ids, return_counts=True)
    if counts.max() > 1:
        raise RemoteError(f"{step} sent a malformed reply (token {unique[counts.argmax()]} twice)")
    order = np.argsort(-logprobs, kind="stable")
    return ids[order], logprobs[order]


def _top_entries(entries: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Ids and log-probabilities from llama-server's ``[{"id", "logprob", ...}, ...]``."""
    ids = np.array([int(entry["id"]) for entry in entries], dtype=np.int64)
    return ids, np.array([float(entry["logprob"]) for entry in entries], dtype=np.float64)


def _error_message(reply: Any, api_key: str | None, limit: int = MESSAGE_CHARS) -> str:
    """The server's own words from an error reply, on one line and at most ``limit`` characters: OpenAI's
    ``{"error": {"message": ...}}``, the bare ``{"error": "..."}`` others send (it had been a
    traceback) or a text that is not JSON (a proxy's error page: it had been 'no message'), its lines
    joined (they had broken the one-line error) and one past ``limit`` characters cut; ``api_key`` as
    ***, where a server quotes the Authorization header it got (it had been said)."""
    error = reply.get("error") if isinstance(reply, dict) else reply if isinstance(reply, str) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not message:
        return "no message"
    return one_line(str(message).replace(api_key, "***") if api_key else str(message), limit)


def page_text(text: str) -> str:
    """An error page's words: an HTML one (a web server's, a proxy's) without its markup, which had
    been quoted with them ('HTTP 404: <!DOCTYPE HTML> <html lang="en"> <head> ...')."""
    if "<" not in text:
        return text
    return html.unescape(TAG.sub(" ", PAGE_NOISE.sub(" ", text)))


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Text a server sent, as a part of a one-line message: whitespace runs (newlines) as one space, and
    at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OpenAIRunner(RemoteRunner):
    """An OpenAI-compatible completions endpoint (``http://HOST:PORT/v1``: vLLM, llama-server's own /v1,
    and others): token ids as the prompt, ``max_tokens`` 1, ``logprobs`` k.

    Differences from llama-server's native API: top log-probabilities come keyed by token text (vLLM
    sends ``token_id:N`` when asked with ``return_tokens_as_token_ids``; other text is mapped back to
    an id by the local tokenizer when it is exactly one token, else left in the tail mass); there is no
    prompt-cache report, so the catch-up counted is what this side sent since the last call; the
    tokenizer check needs the server's ``/tokenize`` (vLLM and llama-server have one); the server's
    end-of-generation ids and parameter count are not compared or known unless it reports them.
    """

    kind = "an OpenAI-compatible server"

    def _health_path(self) -> str:
        return self._listing_path()  # no /health in the OpenAI API; listing the models needs one loaded

    def _meta(self) -> tuple[dict[str, Any], dict[str, Any]]:
        reply = self.request("GET", self._listing_path())
        try:
            model = reply["data"][0]
            self._model_id = str(model["id"])
        except (KeyError, IndexError, TypeError):
            message = "lists no model (is it OpenAI-compatible?)"
            raise RemoteError(f"{self._at(self._listing_path())} {message}") from None
        meta = model.get("meta") if isinstance(model.get("meta"), dict) else {}
        local = self._tokenizer
        try:  # checked here as llama-server's are: a null, text or a number past 64 bits had been a traceback
            sizes = {
                "n_vocab": int(meta.get("n_vocab", local.n_vocab)),
                "n_ctx": int(meta.get("n_ctx", model.get("max_model_len", 4096))),
                "n_params": int(meta.get("n_params", 0)),
                "n_embd": int(meta.get("n_embd", 0)),
            }
        except MALFORMED:
            message = "did not describe the model (is it OpenAI-compatible?)"
            raise RemoteError(f"{self._at(self._listing_path())} {message}") from None
        return sizes, model

    def _end_of_generation(self) -> frozenset[int]:
        return end_of_generation(self._tokenizer)  # not listed by these servers: taken on trust

    def _step_path(self) -> str:
        return f"{self._root}/v1/completions"

    def _next_token(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int, float]:
        reply = self.request(
            "POST",
            self._step_path(),
            {
                "model": self._model_id,
                "prompt": list(tokens),
                "max_tokens": 1,
                "logprobs": self.top_k,
                "temperature": 0,
                "logit_bias": {str(self._safe_token): UNUSED_PICK_BIAS},
                "return_tokens_as_token_ids": True,
            },
        )
        try:
            ids, logprobs = self._parse_logprobs(reply["choices"][0]["logprobs"])
        except MALFORMED:
            raise RemoteError(
                f"{self._at(self._step_path())} sent a malformed reply (no log-probabilities)"
            ) from None
        return ids, logprobs, *self._timings(reply, len(tokens))

    def _parse_logprobs(self, logprobs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """llama-server's shape (``content[0].top_logprobs`` with ids) or OpenAI's legacy one
        (``top_logprobs[0]``: token text -> log-probability)."""
        if "content" in logprobs:
            return _top_entries(logprobs["content"][0]["top_logprobs"])
        pairs = []
        for text, logprob in logprobs["top_logprobs"][0].items():
            token = self._token_id(text)
            if token is not None:
                pairs.append((token, float(logprob)))
        pairs.sort(key=lambda pair: -pair[1])
        ids = np.array([token for token, _ in pairs], dtype=np.int64)
        return ids, np.array([logprob for _, logprob in pairs], dtype=np.float64)

    def _token_id(self, text: str) -> int | None:
        if text.startswith("token_id:"):
            return int(text.removeprefix("token_id:"))
        ids = self._tokenizer.tokenize(text, add_special=False, parse_special=False)
        return ids[0] if len(ids) == 1 else None


def any_remote(runners: Iterable[object]) -> bool:
    """Whether any of ``runners`` is a model on a server: what needs a local context (a grammar, the infill
    sampler, bound tool calls) cannot reach it, and ``--fallback`` has a server to fall back from."""
    return any(isinstance(runner, RemoteRunner) for runner in runners)


def connect(url: str, **kwargs: Any) -> RemoteRunner:
    """A runner for a server address: ``.../v1`` is an OpenAI-compatible endpoint, else llama-server."""
    runner = OpenAIRunner if server_address(url)[2].endswith("/v1") else RemoteRunner
    return runner(url, **kwargs)


def served_model(model: dict[str, Any]) -> str:
    """What names the model a server lists, to tell another one: its id (llama-server's is the file's
    path or alias) and sizes, not what changes by the request (``created``, vLLM's permission ids)."""
    fields = {key: model.get(key) for key in ("id", "root", "max_model_len", "meta")}
    return json.dumps(fields, sort_keys=True, default=str)


def end_of_generation(tokenizer: Tokenizer) -> frozenset[int]:
    return frozenset(token for token in range(tokenizer.n_vocab) if tokenizer.is_end_of_generation(token))


def topk_entropy(probs: np.ndarray, n_vocab: int) -> tuple[float, float]:
    """(lower, upper) bounds in bits on the entropy of a distribution over ``n_vocab`` tokens of which
    only the top ``probs`` (descending) are known. See the module docstring."""
    probs = np.asarray(probs, dtype=np.float64)
    known = probs[probs > 0]
    head = float(-(known * np.log2(known)).sum())
    tail = max(0.0, 1.0 - float(probs.sum()))
    rest = n_vocab - len(probs)
    if tail <= 0 or rest <= 0 or not len(known):
        return head, head
    lower = head + tail * math.log2(1.0 / known[-1])
    upper = head + tail * math.log2(rest / tail)
    return lower, max(lower, upper)

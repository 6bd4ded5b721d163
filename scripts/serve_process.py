"""A real `ead serve` in a subprocess on a free loopback port, for the serve tests and bench_serve.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

EAD = str(Path(sys.executable).with_name("ead"))
LISTENING = re.compile(r"ead serve: (http://\S+)/v1 ")


class Server:
    """``ead serve ARGS --port 0``; its stderr (the server's log) goes to a file so it never blocks. ``ead``:
    another venv's (tests/test_deps.py: one at the declared lower bounds), else this Python's."""

    def __init__(
        self, args: list[str], log: Path, *, env: dict[str, str] | None = None, ead: str = EAD
    ) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - open for the server's lifetime
        self.process = subprocess.Popen(
            [ead, "serve", *args, *([] if "--port" in args else ["--port", "0"])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env={**os.environ, **(env or {})},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.url = self._wait_listening()
        self.base_url = f"{self.url}/v1"

    def _wait_listening(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = LISTENING.search(self.log())
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                raise RuntimeError(f"ead serve exited with {self.process.returncode}: {self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"ead serve did not start listening: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        self._log.close()
        return code

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self._log.close()

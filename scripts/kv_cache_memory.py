"""What a quantized KV cache saves: each model loaded with each cache type (K and V alike, as -ctk T -ctv T
give them), llama.cpp's own report of the cache it made (its log line: the whole context's K and V), and
the bytes the context saves of a prompt's first tokens read (``llama_state_seq_get_size``), as one JSON
object. Memory only: nothing here is timed.

    python scripts/kv_cache_memory.py --models qc0.5b,qc1.5b --types f16,q8_0,q4_0 --ctx 8192 --threads 1 \\
        --out docs/results/kv-cache/memory.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import re
import sys
from pathlib import Path

import llama_cpp

from ead_cli import registry
from ead_cli.hardware import this_cpu
from ead_cli.options import KV_CACHE_TYPES
from ead_cli.runner import Runner

# llama_kv_cache: size =   96.00 MiB (  8192 cells,  24 layers,  1/1 seqs), K (f16):   48.00 MiB, V (f16): ...
KV_REPORT = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \((\w+)\): +([\d.]+) MiB, "
    r"V \((\w+)\): +([\d.]+) MiB"
)
PROMPT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 40


class LlamaLog:
    """llama.cpp's log lines, kept while installed (its callback replaces llama-cpp-python's)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self._callback = llama_cpp.llama_log_callback(self._keep)  # kept alive as long as this object
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _keep(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        self.text.append(text.decode("utf-8", errors="replace"))

    def reports(self) -> list[re.Match[str]]:
        return list(KV_REPORT.finditer("".join(self.text)))


def measure(path: Path, cache_type: str, n_ctx: int, threads: int, prompt_tokens: int, log: LlamaLog) -> dict:
    before = len(log.reports())
    with Runner(
        path, name="large", n_ctx=n_ctx, n_threads=threads, cache_types=(cache_type, cache_type)
    ) as runner:
        (report,) = log.reports()[before:]
        tokens = runner.tokenize(PROMPT, add_special=False)[:prompt_tokens]
        runner.sync(tokens, prompt_len=len(tokens), own_tail=False)
        state = llama_cpp.llama_state_seq_get_size(runner.ctx, 0)
        total, cells, layers, k_type, k_mib, v_type, v_mib = report.groups()
        assert (k_type, v_type) == (cache_type, cache_type), report.group()
        return {
            "model": path.name,
            "cache_type": cache_type,
            "n_ctx": runner.n_ctx,
            "kv_mib": float(total),
            "k_mib": float(k_mib),
            "v_mib": float(v_mib),
            "cells": int(cells),
            "layers": int(layers),
            "prompt_tokens": len(tokens),
            "state_bytes": state,
            "llama_cpp_report": report.group(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qc0.5b,qc1.5b", help="aliases or .gguf paths, comma-separated")
    parser.add_argument("--types", default="f16,q8_0,q4_0", help=f"of {', '.join(KV_CACHE_TYPES)}")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=256, help="read before the state is sized")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    catalog = registry.load_catalog()
    log = LlamaLog()
    runs = []
    for ref in args.models.split(","):
        path = registry.resolve(ref, catalog, allow_download=False)
        first = None
        for cache_type in args.types.split(","):
            run = measure(path, cache_type, args.ctx, args.threads, args.prompt_tokens, log)
            first = first or run
            run["kv_of_first_type"] = round(run["kv_mib"] / first["kv_mib"], 4)
            run["state_of_first_type"] = round(run["state_bytes"] / first["state_bytes"], 4)
            runs.append(run)
            print(
                json.dumps({k: run[k] for k in ("model", "cache_type", "kv_mib", "state_bytes")}),
                file=sys.stderr,
            )
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu": this_cpu()[0],
        "machine": platform.machine(),
        "llama_cpp_python": llama_cpp.__version__,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The large model local against the same model on a llama-server on this machine: wall-clock, what the
network adds, and the gate's cost either way, in alternating rounds (ratios from the same run).

    .venv/bin/python scripts/bench_remote.py --rounds 3 --out docs/results/remote.json

Starts ``llama-server`` (``scripts/build_llama_server.sh`` builds it) on a free loopback port with the
large model, one thread like the local runs, and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path

from ead_cli import registry
from ead_cli.bench import native
from ead_cli.engine import build_decoder, close_all, load_runners
from ead_cli.options import GenerationOptions, ModelOptions, PolicyOptions
from ead_cli.prompt import encode_prompt

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    catalog = registry.load_catalog()
    small, large = (
        registry.resolve(a, catalog, allow_download=False) for a in (catalog.small, catalog.large)
    )
    server = contextlib.ExitStack()
    log = Path(server.enter_context(tempfile.TemporaryDirectory())) / "server.log"
    url = server.enter_context(native.llama_server(large, ["-c", "4096", "-t", "1"], log)).url
    setups = {
        where: load_runners(ModelOptions(small=str(small), large=target, threads=1, allow_download=False))
        for where, target in (("local", str(large)), ("remote", url))
    }
    walls: dict[str, list[float]] = {}
    figures: dict[str, dict] = {}
    try:
        for _ in range(args.rounds):
            for where, runners in setups.items():
                for mode in ("large", "ead"):
                    name = f"{where} {'large alone' if mode == 'large' else 'gate tau=1'}"
                    for runner in runners:
                        runner.truncate(0)
                    decoder = build_decoder(
                        runners, PolicyOptions(mode=mode), GenerationOptions(max_tokens=args.tokens)
                    )
                    list(decoder.run(encode_prompt(runners[0], PROMPT)))
                    summary = decoder.summary()
                    walls.setdefault(name, []).append(summary.wall_s)
                    report = summary.models[-1]
                    figures[name] = {
                        "generated": summary.generated,
                        "large_share": summary.large_share,
                        "requests": report.requests,
                        "network_s": report.network_s,
                        "server_s": report.server_s,
                        "bytes_sent": report.bytes_sent,
                        "bytes_received": report.bytes_received,
                    }
    finally:
        for runners in setups.values():
            close_all(runners)
        server.close()
    reference = statistics.median(walls["local large alone"])
    result = {
        name: {
            "median_wall_s": statistics.median(values),
            "wall_vs_local_large": statistics.median(values) / reference,
            "walls_s": values,
            **figures[name],
        }
        for name, values in walls.items()
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

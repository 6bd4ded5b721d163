"""Render a real coloured answer of the demo pair as the README's picture (docs/images/demo.svg).

Runs ``ead generate --stats`` on the default pair with colour forced, exactly as ./scripts/demo.sh does,
and turns its terminal output (the legend, the answer coloured by model, the stats) into an SVG with rich's
own exporter, so the picture is what a terminal shows, not a mock-up:

    .venv/bin/python scripts/demo_image.py [--out docs/images/demo.svg] [-- extra ead generate options]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

PROMPT = "Write a Python function that checks whether a number is prime"
COMMAND_SHOWN = f'./scripts/demo.sh "{PROMPT}"'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images/demo.svg"))
    parser.add_argument("--width", type=int, default=100, help="terminal columns of the picture")
    parser.add_argument("options", nargs="*", help="extra options for ead generate (after --)")
    args = parser.parse_args()
    ead = Path(sys.executable).with_name("ead")
    run = subprocess.run(
        [str(ead), "generate", "--stats", *args.options, PROMPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows them (ead flushes each token)
        text=True,
        env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": str(args.width)},
        check=False,
    )
    if run.returncode != 0:
        sys.exit(f"ead generate failed: {run.stdout.strip()}")
    console = Console(record=True, width=args.width, force_terminal=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(Text(f"$ {COMMAND_SHOWN}", style="bold"))
    console.print(Text.from_ansi(run.stdout.rstrip("\n")), soft_wrap=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(console.export_svg(title="ead"))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()

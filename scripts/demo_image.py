"""Render a real coloured answer of the demo pair as the README's picture (docs/images/demo.svg).

Runs ``ead generate --mode ead --stats`` on the default pair, as ./scripts/demo.sh does, on a
pseudo-terminal of the picture's width, and turns what that terminal got (the legend, the answer coloured
by model, the stats) into an SVG with rich's own exporter, so the picture is what a terminal shows, not a
mock-up:

    .venv/bin/python scripts/demo_image.py [--out docs/images/demo.svg] [-- extra ead generate options]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
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
    command = [str(ead), "generate", "--mode", "ead", "--stats", *args.options, PROMPT]
    output, code = _on_terminal(command, args.width)
    if code != 0:
        sys.exit(f"ead generate failed: {output.strip()}")
    console = Console(record=True, width=args.width, force_terminal=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(Text(f"$ {COMMAND_SHOWN}", style="bold"))
    console.print(Text.from_ansi(output.rstrip("\n")), soft_wrap=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(console.export_svg(title="ead"))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


def _on_terminal(command: list[str], columns: int) -> tuple[str, int]:
    """Run ``command`` with stdout and stderr on one pseudo-terminal ``columns`` wide; what it showed, and
    its exit code."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n"), process.wait()


if __name__ == "__main__":
    main()

"""A crash inside llama.cpp is never a user's only message.

Before a model file is first used on this machine, a child process loads it as ead would and decodes a
few tokens (one batch, then one single-token step: both kernels a generation runs). A child killed by a
signal (SIGSEGV, SIGILL, ...) becomes one paragraph: what crashed, the likely cause, the option that avoids
it, where to report. A child that passes leaves a marker keyed by the file, llama-cpp-python's and ead's
versions, the CPU, the repack decision and GPU offload, so later runs pay nothing (a stat and a hash);
where the cache cannot be written, the check passes unremembered. Markers of deleted files are dropped.
Anything else (a slow child, an unreadable file) is left to the real load, which reports it as usual.

``python -m ead_cli.smoke`` checks the default pair (``scripts/setup.sh`` ends with it); ``--child`` is
the child's own entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

from . import __version__
from .errors import EadError
from .hardware import AMX_BUG, REPACK_ENV, Repack, repack_choice, this_cpu

SMOKE_TIMEOUT_S = 300.0  # a child this slow has not crashed: the real load goes on and reports what it finds
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
SMOKE_PROMPT = "def add(a, b):"
REPORT_AT = "https://github.com/ggml-org/llama.cpp/issues"


def marker_path(path: Path, repack: Repack, n_gpu_layers: int | None) -> Path:
    """Where a passed check of this file, on this CPU, with these libraries and settings, is remembered."""
    from .paths import ead_cache_dir

    stat = path.stat()
    cpu, flags = this_cpu()
    key = "|".join(
        (
            str(path.resolve()),
            str(stat.st_size),
            str(stat.st_mtime_ns),
            version("llama-cpp-python"),
            __version__,
            cpu,
            " ".join(sorted(flags)),
            repack.word,
            str(n_gpu_layers),
        )
    )
    return ead_cache_dir() / "smoke" / hashlib.sha256(key.encode(errors="surrogateescape")).hexdigest()[:32]


def crash_message(label: str, signal_number: int, repack: Repack) -> str:
    """One paragraph for a llama.cpp crash in the smoke child: what, the likely cause, the way out, where."""
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    what = f"llama.cpp crashed ({name}) while decoding a few test tokens of {label}"
    if signal_number == signal.SIGILL:
        cause = (
            "An illegal instruction means llama.cpp was compiled for another CPU (llama-cpp-python compiles "
            "for the machine it is built on, and pip reuses a wheel it built elsewhere): reinstall it here "
            "with `pip install --no-cache-dir --force-reinstall llama-cpp-python==0.3.36`."
        )
    elif repack.enabled:
        cause = (
            "The likely cause is llama.cpp's weight repacking for this CPU (on Intel CPUs with AMX its AMX "
            f"buffer crashes on the first matrix product: {AMX_BUG}); ead had it on ({repack.reason}). "
            f"Run again with --no-repack (or {REPACK_ENV}=off) to load the weights without it."
        )
    else:
        cause = (
            f"Weight repacking was already off ({repack.reason}), so the cause lies elsewhere in llama.cpp "
            "on this CPU: try --n-gpu-layers 0, fewer --threads, or another quantisation of the model."
        )
    return (
        f"{what}, so ead stopped before loading it in this process. {cause} Please report it at "
        f"{REPORT_AT} with the output of `lscpu` and `ead --version` (CPU: {this_cpu()[0]})."
    )


def check_model(
    path: Path,
    *,
    repack: Repack,
    n_gpu_layers: int | None = None,
    threads: int | None = None,
    command: Sequence[str] | None = None,
) -> bool:
    """Load and decode ``path`` in a child once per machine and setting; raise the paragraph if it crashes.
    Returns whether a child ran (False: a marker says it passed before).

    ``command`` replaces the child's command line (tests give one that crashes)."""
    marker = marker_path(path, repack, n_gpu_layers)
    if marker.exists():
        return False
    if command is None:
        command = [sys.executable, "-m", "ead_cli.smoke", "--child", str(path), "--repack", repack.word]
        command += ["--n-gpu-layers", str(n_gpu_layers)] if n_gpu_layers is not None else []
        command += ["--threads", str(threads)] if threads is not None else []
    try:
        result = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, timeout=SMOKE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return True
    if result.returncode < 0 and -result.returncode in CRASH_SIGNALS:
        raise EadError(crash_message(path.name, -result.returncode, repack))
    if result.returncode == 0:
        with contextlib.suppress(OSError):  # a cache that cannot be written: the check runs again next time
            marker.parent.mkdir(parents=True, exist_ok=True)
            forget_deleted_models(marker.parent)
            marker.write_text(f"{path}\n", encoding="utf-8", errors="surrogateescape")  # a name's bytes
    return True


def forget_deleted_models(folder: Path) -> None:
    """Delete the markers of model files that no longer exist (each marker holds its file's path), as a
    new one is written: files that come and go (a test's, a twin rewritten) do not pile up markers."""
    for marker in folder.iterdir():
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = marker.read_text(encoding="utf-8").splitlines()
            if lines and not Path(lines[0]).exists():
                marker.unlink()


def check_models(
    paths: Sequence[Path], *, repack: Repack, n_gpu_layers: int | None = None, threads: int | None = None
) -> bool:
    """``check_model`` for each file; whether any child ran."""
    ran = [check_model(path, repack=repack, n_gpu_layers=n_gpu_layers, threads=threads) for path in paths]
    return any(ran)


def _decode_a_few(path: Path, repack: bool, n_gpu_layers: int | None, threads: int | None) -> None:
    """The child: load as ead does, read the prompt in one batch, then decode one token alone."""
    import numpy as np

    from .runner import Runner

    with Runner(
        path, name="smoke", n_ctx=64, n_threads=threads, n_gpu_layers=n_gpu_layers, repack=repack
    ) as runner:
        tokens = runner.tokenize(SMOKE_PROMPT, add_special=True)
        logits = runner.sync(tokens, prompt_len=len(tokens), own_tail=False)
        tokens.append(int(np.argmax(logits)))
        runner.sync(tokens, prompt_len=len(tokens) - 1, own_tail=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ead_cli.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=Path, help="decode a few tokens of this file (the child's role)")
    parser.add_argument("--repack", choices=("on", "off"))
    parser.add_argument("--n-gpu-layers", type=int)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    repack = None if args.repack is None else args.repack == "on"
    if args.child is not None:
        _decode_a_few(args.child, repack_choice(repack).enabled, args.n_gpu_layers, args.threads)
        return 0
    from . import registry

    def progress(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        catalog = registry.load_catalog()
        aliases = (catalog.small, catalog.large)
        paths = [registry.resolve(alias, catalog, progress=progress) for alias in aliases]
        choice = repack_choice(repack)
        ran = check_models(paths, repack=choice, n_gpu_layers=args.n_gpu_layers, threads=args.threads)
    except EadError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    if ran:
        names = ", ".join(path.name for path in paths)
        progress(f"smoke decode passed: {names} (weight repacking {choice.word}: {choice.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The GPU run: from a bare CUDA machine with no network and the bundle of scripts/pack_gpu_run.sh to
one JSON file of figures (docs/gpu-run.md). Standard library only: it runs before anything is installed.

Steps, each a few subprocesses with their own time limit, each resumable on its own (``--step``), so a
machine that allows ten minutes a command runs them one command at a time:

    build     a venv over the system Python (its numpy), the carried wheels, llama-cpp-python compiled
              from the trimmed sdist (CUDA unless --cpu), or the bundle's prebuilt wheel where it loads
              and offloads (pack_gpu_run.sh --wheel: no compile on the device), ead-cli from this checkout
    twins     random-weight twins of the small and large shapes (scripts/write_twin.py, llama.cpp's
              own gguf-py from the sdist) with the real pair's tokenizer
    replay    ead bench replay of the recorded schedules on each twin pair, every layer offloaded
    speed     ead bench speed for each pair, its cost model checked against the replay
    overhead  scripts/bench_overhead.py on the tiny twin and the small one (where the loop's cost shows)

Every call writes ``gpu-run.json`` (every step done so far, the device, the versions) to $OUT, or to
the work folder's out/ when $OUT is unset, anew after every command, so a call killed from outside still
leaves every figure before it. ``--limit`` bounds the whole call: each command is killed at its deadline.
Every command that loads a model gets ead's weight-repacking decision for this machine as EAD_REPACK
(off where llama.cpp's AMX path would crash). ``--python`` skips the build and uses that interpreter's
installed llama_cpp and ead_cli (the test suite does, so CI compiles once).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import site
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("build", "twins", "replay", "speed", "overhead")
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}"
SCHEDULES = ROOT / "docs/results/humaneval-odd-schedules/results.jsonl"
STRATEGIES = "large-only,gate tau=1,gate tau=1 verify=0.1,lookahead tau=1,ead tau=0.5,spec"
GPU_SHAPES = ("qwen2.5-0.5b", "qwen2.5-14b")
TINY_SHAPES = ("qwen2.5-tiny", "qwen2.5-tiny")  # the real vocabulary, a two-layer body: the CPU test
LIMIT_S = 540  # per call: under a device's ten minutes, so the call still writes its report
TAIL = 4000  # characters of a command's output kept in the report
Figures = Path | Callable[[dict[str, Any]], Any]  # a command's JSON file, or how to read its result


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", action="append", choices=STEPS, help="run this step only (repeatable)")
    parser.add_argument("--cpu", action="store_true", help="build without CUDA, offload nothing")
    parser.add_argument("--tiny", action="store_true", help=f"tiny twins ({TINY_SHAPES[0]}) for a CPU test")
    parser.add_argument("--bundle", type=Path, default=ROOT / "gpu-run", help="what pack_gpu_run.sh made")
    parser.add_argument("--work", type=Path, default=ROOT / "gpu-work", help="venv, sources, twins, state")
    parser.add_argument("--python", type=Path, help="an interpreter with llama_cpp and ead_cli: no build")
    parser.add_argument("--small", help="the small twin's shape (default: qwen2.5-0.5b)")
    parser.add_argument("--large", help="the large twins' shapes, comma-separated (default: qwen2.5-14b)")
    parser.add_argument("--tokenizer", type=Path, help="the twins' tokenizer (default: the bundle's)")
    parser.add_argument("--schedules", type=Path, default=SCHEDULES, help="a bench's results.jsonl")
    parser.add_argument("--strategies", default=STRATEGIES, help="the recorded strategies to replay")
    parser.add_argument("--threads", type=int, help="CPU threads (default: ead's, all cores)")
    parser.add_argument("--replays", type=int, default=1, help="each pair's replay this many times")
    parser.add_argument("--overhead-tokens", type=int, default=128)
    parser.add_argument("--overhead-runs", type=int, default=5)
    parser.add_argument(
        "--limit", type=int, default=LIMIT_S, help=f"seconds this call may run (default {LIMIT_S})"
    )
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error("--limit must be at least 1 second")
    if args.replays < 1:
        parser.error("--replays must be at least 1")
    small, large = TINY_SHAPES if args.tiny else GPU_SHAPES
    args.small = args.small or small
    args.large = [name.strip() for name in (args.large or large).split(",") if name.strip()]
    args.tokenizer = args.tokenizer or args.bundle / "tokenizer.gguf"
    args.steps = [step for step in STEPS if step in (args.step or STEPS)]
    if "build" in args.steps and args.python:
        parser.error("--python uses an installed llama_cpp: leave out the build step (--step ...)")
    needs = {"build": args.bundle / f"{SDIST}.tar.gz", "twins": args.tokenizer, "replay": args.schedules}
    for step, path in needs.items():
        if step in args.steps and not path.is_file():
            parser.error(f"{path} is missing (the {step} step needs it): run scripts/pack_gpu_run.sh")
    venv_python = args.work / "venv" / "bin" / "python"
    if "build" not in args.steps and not args.python and not venv_python.is_file():
        # a device given back between calls (even by an idle wait) is a bare machine again
        parser.error(
            f"{args.work} has no venv (the {args.steps[0]} step needs the build step's): "
            "a fresh machine? run --step build first"
        )
    return args


def run(
    command: list[str], *, limit: int, env: dict[str, str] | None = None, log: Path | None = None
) -> dict[str, Any]:
    """Run a command within the time limit (it and every process it started are killed past it); its
    exit status, seconds and its output (``Run.record`` keeps the tail). No time left: not started, as
    if timed out."""
    if limit <= 0:
        return {
            "command": command,
            "rc": 124,
            "seconds": 0.0,
            "stdout": "",
            "stderr": "not started: no time left",
        }
    began = time.perf_counter()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, **(env or {})}, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            out, err = process.communicate(timeout=limit)
            rc = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # pip's cmake, ninja and compilers too
            out, err = process.communicate()
            rc, err = 124, err + f"\ntimed out after {limit} s"
    seconds = round(time.perf_counter() - began, 2)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out + err, encoding="utf-8")
    print(f"  {seconds:7.1f} s  rc {rc}  {' '.join(command)[:160]}", file=sys.stderr, flush=True)
    result = {"command": command, "rc": rc, "seconds": seconds, "stdout": out, "stderr": err[-TAIL:]}
    return {**result, "env": env} if env else result


class Run:
    """One GPU run's folders, settings and report; each step returns a dict that lands in the report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.limit
        self.work = args.work.resolve()
        self.venv = self.work / "venv"
        self.src = self.work / "src" / SDIST
        self.python = str(args.python or self.venv / "bin" / "python")
        self.twins = self.work / "twins"
        self.wheels = args.bundle.resolve() / "wheels"
        self.state = self.work / "steps"
        self.out = Path(os.environ.get("OUT") or self.work / "out")
        self.libraries = [] if args.cpu else cuda_library_dirs()
        # asked once: nvidia-smi, nvcc, cmake and git do not change during a call
        self.about = {**about(args), "cuda_library_dirs": self.libraries}
        self.running: dict[str, Any] | None = None  # the step under way: its name and commands so far

    def left(self) -> int:
        """Seconds left until this call's deadline (``--limit``)."""
        return int(self.deadline - time.monotonic())

    def run(self, command: list[str], *, figures: Figures | None = None, **options: Any) -> dict[str, Any]:
        """A command within what is left of the call's time, recorded at once with what it measured
        (``figures``: the JSON file it writes, or how to read them from its result) as its report.
        Its loader finds CUDA's runtime and cuBLAS in ``libraries`` (a prebuilt wheel needs them)."""
        env = options.pop("env", None)
        if self.libraries:
            found = [*self.libraries, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
            env = {"LD_LIBRARY_PATH": os.pathsep.join(found), **(env or {})}
        result = run(command, limit=self.left(), env=env, **options)
        if isinstance(figures, Path):
            result["report"] = read_json(figures)
        elif figures is not None:
            result["report"] = figures(result)  # from the whole output: the report keeps its tail
        return self.record(result)

    def record(self, result: dict[str, Any]) -> dict[str, Any]:
        """A finished command into the running step (the tail of its output), and the report written anew."""
        result["stdout"] = result["stdout"][-TAIL:]
        if self.running is not None:
            self.running["commands"].append(result)
        self.write_report()
        return result

    def write_report(self) -> Path:
        """gpu-run.json: every finished step, and the one under way with its commands so far."""
        steps = {step: read_json(self.state / f"{step}.json") for step in STEPS}
        if self.running is not None:
            steps[self.running["step"]] = {
                "ok": False, "finished": False, "commands": self.running["commands"],
            }  # fmt: skip
        report = {**self.about, "steps": {step: done for step, done in steps.items() if done is not None}}
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu-run.json"
        partial = path.with_suffix(".json.part")  # renamed whole: a kill mid-write leaves the last report
        partial.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        partial.replace(path)
        return path

    def step(self, name: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one step, its report written before it starts, after each command and when it ends."""
        self.running = {"step": name, "commands": []}
        self.write_report()
        began = time.perf_counter()
        result = action()
        result["seconds"] = round(time.perf_counter() - began, 2)
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        self.running = None
        self.write_report()
        return result

    @functools.cached_property
    def repack(self) -> dict[str, Any]:
        """ead's weight-repacking decision on this machine (hardware.repack_choice: EAD_REPACK if set,
        else off where llama.cpp's AMX buffer is active), asked once a call in the run's own Python."""
        decided = self.run([self.python, "-c", REPACK_PROBE], figures=printed_json)["report"]
        if decided is not None and "error" not in decided:
            return decided
        return {
            "enabled": False,
            "word": "off",
            "reason": "ead could not decide here: off, which never crashes",
        }

    def model_env(self) -> dict[str, str]:
        """The environment of a command that loads a model: every load takes the same repack decision."""
        return {"EAD_REPACK": self.repack["word"]}

    def pip(self, *args: str, log: Path | None = None, env: dict[str, str] | None = None) -> dict:
        return self.run(
            [self.python, "-m", "pip", "install", "--no-index", "--find-links", str(self.wheels), *args],
            log=log, env={"PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})},
        )  # fmt: skip

    def build(self) -> dict[str, Any]:
        """The venv, the wheels, llama-cpp-python compiled from the carried sources, ead-cli."""
        sdist = self.args.bundle / f"{SDIST}.tar.gz"
        commands = []
        if not Path(self.python).exists():  # pip from the carried wheel: a system Python may lack ensurepip
            commands.append(self.record(make_venv(sys.executable, self.venv, limit=self.left())))
            wheel = str(next(self.wheels.glob("pip-*.whl")))
            commands.append(
                self.run([self.python, f"{wheel}/pip", "install", "--no-index", "--quiet", wheel])
            )
        commands.append(self.pip("scikit-build-core", "hatchling"))
        if not self.src.is_dir():  # also the twins' gguf-py
            with tarfile.open(sdist) as archive:
                archive.extractall(self.src.parent, filter="data")
        prebuilt = self.install_prebuilt()
        if prebuilt is not None and prebuilt["ok"]:
            built = prebuilt
        else:
            built = {**self.compile(), "prebuilt": prebuilt}
        check = self.run([self.python, "-m", "pip", "check"])
        return {**built, "setup": commands, "pip_check": check["stdout"].strip()}

    def install_prebuilt(self) -> dict[str, Any] | None:
        """The bundle's prebuilt llama-cpp-python wheel and ead-cli, kept where llama.cpp loads and (unless
        --cpu) offloads to the GPU; None where the bundle has no such wheel."""
        wheels = sorted((self.args.bundle / "prebuilt").glob(f"{SDIST}-*.whl"))
        if not wheels:
            return None
        install = self.pip("--no-deps", "--force-reinstall", str(wheels[0]))
        ead = self.pip("--no-build-isolation", str(ROOT)) if install["rc"] == 0 else None
        versions = self.versions() if ead is not None and ead["rc"] == 0 else {}
        offloads = versions.get("gpu_offload") is True or self.args.cpu
        ok = "error" not in versions and bool(versions) and offloads
        return {
            "ok": ok,
            "wheel": wheels[0].name,
            "install": install,
            "install_ead_cli": ead,
            "versions": versions,
            "why_not": None if ok else "the wheel did not install, load or offload: compiled instead",
            "repack": self.repack if ok else None,
        }

    def compile(self) -> dict[str, Any]:
        """llama-cpp-python compiled from the carried sources (CUDA unless --cpu), then ead-cli."""
        cmake_args = ["-DLLAVA_BUILD=off"]
        if not self.args.cpu:
            cmake_args.append("-DGGML_CUDA=on")
            arch = os.environ.get("CUDA_ARCH") or cuda_arch()
            if arch:
                cmake_args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
        env = {"CMAKE_ARGS": " ".join(cmake_args), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
        # A build folder that outlives the command: a compile cut off by a time limit resumes on a rerun.
        build_dir = self.work / ("build-cpu" if self.args.cpu else "build-cuda")
        compile_ = self.pip(
            "--no-build-isolation", "--no-deps", "--no-cache-dir", "--force-reinstall", "-v",
            f"--config-settings=build-dir={build_dir}", str(self.src),
            env=env, log=self.work / "logs" / "llama-cpp-python-build.log",
        )  # fmt: skip
        compile_["cmake_args"] = env["CMAKE_ARGS"]
        if compile_["rc"] == 124:
            compile_["resume"] = f"cut off: run the build step again, it resumes in {build_dir}"
        install = self.pip("--no-build-isolation", str(ROOT)) if compile_["rc"] == 0 else None
        ok = compile_["rc"] == 0 and install is not None and install["rc"] == 0
        return {
            "ok": ok,
            "compile_seconds": compile_["seconds"],
            "compile": compile_,
            "install_ead_cli": install,
            "versions": self.versions(),
            "repack": self.repack if ok else None,
        }

    def versions(self) -> dict[str, Any]:
        probe = (
            "import json, sys, numpy, llama_cpp, ead_cli\n"
            "print(json.dumps({'python': sys.version.split()[0], 'numpy': numpy.__version__,\n"
            "  'llama_cpp_python': llama_cpp.__version__, 'ead_cli': ead_cli.__version__,\n"
            "  'gpu_offload': bool(llama_cpp.llama_supports_gpu_offload()),\n"
            "  'llama_cpp_system_info': llama_cpp.llama_print_system_info().decode()}))"
        )
        result = self.run([self.python, "-c", probe], figures=printed_json)
        return result["report"] if result["report"] is not None else {"error": result["stderr"]}

    def shapes(self) -> list[str]:
        """Every twin shape of the run, once each: the small one, the large ones, the tiny one."""
        return list(dict.fromkeys([self.args.small, *self.args.large, *self.overhead_shapes()]))

    def overhead_shapes(self) -> list[str]:
        """The loop's overhead is measured where it shows: on a GPU the tiny twin (the real vocabulary at
        thousands of tokens a second) and the small one; a large twin's decode hides it."""
        return [self.args.small] if self.args.cpu else list(dict.fromkeys([TINY_SHAPES[0], self.args.small]))

    def twin(self, shape: str) -> Path:
        return self.twins / f"{shape}.gguf"

    def write_twins(self) -> dict[str, Any]:
        """Each shape once (a rerun keeps a finished twin: write_twin.py renames only complete files)."""
        env = {"GGUF_PY": str(self.src / "vendor/llama.cpp/gguf-py")} if self.src.is_dir() else {}
        written = {}
        for seed, shape in enumerate(self.shapes()):
            path = self.twin(shape)
            if path.exists():
                written[shape] = {"reused": True, "bytes": path.stat().st_size}
                continue
            command = [self.python, str(ROOT / "scripts/write_twin.py"), "--shape", shape, "--tokenizer-from",
                       str(self.args.tokenizer), "--out", str(path), "--seed", str(seed)]  # fmt: skip
            self.twins.mkdir(parents=True, exist_ok=True)
            result = self.run(command, env=env)
            written[shape] = {**result, "bytes": path.stat().st_size if path.exists() else None}
        return {"ok": all(t.get("rc", 0) == 0 for t in written.values()), "twins": written}

    def pairs(self) -> list[tuple[str, Path, Path]]:
        small = self.twin(self.args.small)
        return [(f"{self.args.small}+{large}", small, self.twin(large)) for large in self.args.large]

    def model_options(self, small: Path, large: Path) -> list[str]:
        options = ["--small", str(small), "--large", str(large)]
        options += ["--n-gpu-layers", "0" if self.args.cpu else "-1"]
        return options + (["--threads", str(self.args.threads)] if self.args.threads else [])

    def replay(self) -> dict[str, Any]:
        """Each pair's replay, ``--replays`` times interleaved (pairs: the first; repeats: the others),
        and with repeats the median of each strategy's ratio over them (ead bench report's median-of-N.md)."""
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in self.pairs()}
        for run in range(1, self.args.replays + 1):
            for name, small, large in self.pairs():
                out = self.replay_folder(name, run)
                command = [self.python, "-m", "ead_cli", "bench", "replay", str(self.args.schedules),
                           *self.model_options(small, large), "--strategies", self.args.strategies,
                           "--out", str(out)]  # fmt: skip
                runs[name].append(self.run(command, env=self.model_env(), figures=out / "replay.json"))
        ok = all(done["rc"] == 0 for pair_runs in runs.values() for done in pair_runs)
        medians = {}
        for name in runs if self.args.replays > 1 else []:
            folders = [str(self.replay_folder(name, run)) for run in range(1, self.args.replays + 1)]
            table = self.replay_folder(name, 1) / f"median-of-{self.args.replays}.md"
            command = [self.python, "-m", "ead_cli", "bench", "report", *folders]
            medians[name] = self.run(command, figures=lambda _, table=table: read_text(table))
            ok = ok and medians[name]["rc"] == 0
        return {
            "ok": ok,
            "repack": self.repack,
            "pairs": {name: pair_runs[0] for name, pair_runs in runs.items()},
            "repeats": {name: pair_runs[1:] for name, pair_runs in runs.items()},
            "medians": medians,
        }

    def replay_folder(self, name: str, run: int) -> Path:
        return self.work / "replay" / (name if run == 1 else f"{name}-run{run}")

    def speed(self) -> dict[str, Any]:
        results = {}
        for name, small, large in self.pairs():
            out = self.work / "speed" / f"{name}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            replayed = self.work / "replay" / name / "replay.json"
            check = ["--check", str(replayed)] if replayed.exists() else []
            command = [self.python, "-m", "ead_cli", "bench", "speed", *self.model_options(small, large),
                       *check, "--json", str(out)]  # fmt: skip
            results[name] = self.run(command, env=self.model_env(), figures=out)
        return {"ok": all(r["rc"] == 0 for r in results.values()), "repack": self.repack, "pairs": results}

    def overhead(self) -> dict[str, Any]:
        """The loop's cost over bare llama-cpp-python on each twin, one model's and the gate's on two
        contexts of it (llama.cpp offloads every layer by default when it has a GPU backend; the CPU
        test's build has none)."""
        results = {}
        for shape in self.overhead_shapes():
            script = str(ROOT / "scripts/bench_overhead.py")
            command = [self.python, script, "--model", str(self.twin(shape)), "--pair", "--tokens",
                       str(self.args.overhead_tokens), "--runs", str(self.args.overhead_runs)]  # fmt: skip
            command += ["--threads", str(self.args.threads)] if self.args.threads else []
            results[shape] = self.run(command, env=self.model_env(), figures=printed_json)
        return {"ok": all(r["rc"] == 0 for r in results.values()), "repack": self.repack, "models": results}


REPACK_PROBE = (
    "import json\nfrom ead_cli.hardware import repack_choice\nchoice = repack_choice()\n"
    "print(json.dumps({'enabled': choice.enabled, 'word': choice.word, 'reason': choice.reason,\n"
    "  'automatic': choice.automatic}))"
)
PARENT_PTH = "_gpu_run_parent.pth"
SITE_DIRS = (
    "import json, sys, sysconfig\n"
    "paths = sysconfig.get_paths()\n"
    "print(json.dumps({'nested': sys.prefix != sys.base_prefix,\n"
    "  'site': list(dict.fromkeys([paths['purelib'], paths['platlib']]))}))"
)


def make_venv(python: str, venv: Path, *, limit: int) -> dict[str, Any]:
    """A venv over ``python`` that sees every package ``python`` sees.

    ``--system-site-packages`` reaches only the base interpreter's site-packages: where ``python`` is
    itself a venv (a device's python3 may be), the packages installed in it, numpy among them, would be
    missing. So a .pth file in the new venv adds that venv's site-packages through ``site.addsitedir``,
    which also runs the .pth files there (editable installs, a venv nested once more), after the new
    venv's own packages, so what pip installs in the new venv comes first."""
    made = run([python, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], limit=limit)
    if made["rc"] != 0:
        return made
    parent, own = (site_dirs(interpreter) for interpreter in (python, str(venv / "bin" / "python")))
    made["parent_venv_site"] = parent["site"] if parent["nested"] else None
    if parent["nested"]:
        lines = [f"import site; site.addsitedir({path!r})\n" for path in parent["site"]]
        (Path(own["site"][0]) / PARENT_PTH).write_text("".join(lines), encoding="utf-8")
    return made


def site_dirs(python: str) -> dict[str, Any]:
    """Whether ``python`` runs in a venv, and where its packages are installed."""
    done = subprocess.run([python, "-c", SITE_DIRS], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def printed_json(result: dict[str, Any]) -> Any:
    """What a command that prints one JSON object printed, where it succeeded; else None, or what was
    wrong with its output."""
    if result["rc"] != 0:
        return None
    try:
        return json.loads(result["stdout"])
    except json.JSONDecodeError as error:
        return {"error": f"its output is not one JSON object: {error}"}


def cuda_library_dirs() -> list[str]:
    """Folders with CUDA's runtime or cuBLAS where the loader may not look: the nvidia-* wheels of this
    Python (a device's PyTorch brings them) and the toolkit's own lib64."""
    roots = [Path(path) for path in (*site.getsitepackages(), site.getusersitepackages())]
    wheels = [lib for root in roots for lib in sorted(root.glob("nvidia/*/lib"))]
    candidates = [*wheels, Path("/usr/local/cuda/lib64")]
    return [
        str(folder)
        for folder in dict.fromkeys(candidates)
        if any(folder.glob("libcublas.so*")) or any(folder.glob("libcudart.so*"))
    ]


def cuda_arch() -> str | None:
    """The GPU's compute capability as CMake wants it (9.0 -> 90): one architecture compiles fastest."""
    caps = query_gpu("compute_cap")
    return caps[0]["compute_cap"].replace(".", "") if caps else None


def query_gpu(*fields: str) -> list[dict[str, str]]:
    """nvidia-smi's answer per GPU, or nothing where there is no nvidia-smi or no GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [
        dict(zip(fields, (v.strip() for v in line.split(",")), strict=True))
        for line in done.stdout.splitlines()
    ]


def tool_version(command: list[str], word: str) -> str | None:
    """The first line of a tool's version output that has ``word``; None where the tool is missing."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((line.strip() for line in done.stdout.splitlines() if word in line), None)


def machine() -> dict[str, Any]:
    gpus = query_gpu("name", "memory.total", "driver_version", "compute_cap")
    return {
        "gpus": gpus,
        "device": gpus[0]["name"] if gpus else None,
        "system": platform.platform(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "nvcc": tool_version(["nvcc", "--version"], "release"),
        "cmake": tool_version(["cmake", "--version"], "version"),
        "ninja": tool_version(["ninja", "--version"], "."),
    }


def about(args: argparse.Namespace) -> dict[str, Any]:
    """The report's head: what ran, where, with which settings."""
    return {
        "kind": "gpu run",
        "cpu_test": args.cpu,
        "tiny": args.tiny,
        "note": (
            "a CPU test of the GPU run: no GPU, llama.cpp built without CUDA"
            if args.cpu
            else "llama.cpp built with CUDA, every layer offloaded"
        )
        + "; random-weight twins: the timings are real, the text is noise",
        "machine": machine(),
        "checkout": tool_version(["git", "-C", str(ROOT), "rev-parse", "HEAD"], ""),  # None: no .git
        "bundle": read_json(args.bundle / "MANIFEST.json"),
        "settings": {
            "small": args.small,
            "large": args.large,
            "schedules": os.path.relpath(args.schedules, ROOT),
            "strategies": args.strategies.split(","),
            "threads": args.threads,
            "replays": args.replays,
            "overhead_tokens": args.overhead_tokens,
            "overhead_runs": args.overhead_runs,
            "limit_s": args.limit,
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    gpu_run = Run(args)
    actions = {"build": gpu_run.build, "twins": gpu_run.write_twins, "replay": gpu_run.replay,
               "speed": gpu_run.speed, "overhead": gpu_run.overhead}  # fmt: skip
    failed = []
    for step in args.steps:
        if gpu_run.left() <= 0:
            failed.append(f"{step} (not started: --limit {args.limit} s ran out)")
            continue
        print(f"{step}...", file=sys.stderr, flush=True)
        if not gpu_run.step(step, actions[step])["ok"]:
            failed.append(step)
            if step in ("build", "twins"):  # the later steps need what these make
                break
    print(f"wrote {gpu_run.write_report()}", file=sys.stderr)
    if failed:
        print(f"error: step(s) failed: {', '.join(failed)} (see gpu-run.json)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ead bench: task selection, the sandbox, strategies, resumable results, the figures and the reports.

Generation runs on the tiny GGUF pair (one thread: a 2-thread barrier on a busy 2-core machine is slow);
tiny models write garbage code, so every HumanEval sample fails, but every file and figure must be right.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ctrl_c import ctrl_c_at_return
from test_cli import NO_LOCKS, assert_one_line_error, interruptible
from test_readme import help_text

from ead_cli.bench import native
from ead_cli.bench.grid import SWEPT, Grid, Strategy, all_families, build_strategies, parse_grid
from ead_cli.bench.report import aggregate, agreement, repeats_table, report_table, write_report
from ead_cli.bench.results import Record, Results, check_repeats, differing, read_results
from ead_cli.bench.run import Bench, Plan, humaneval_bench, prompts_bench, run_bench
from ead_cli.bench.sandbox import Outcome, check_solution, run_program, sandbox_note
from ead_cli.bench.tasks import (
    USER_MESSAGE,
    Task,
    completion_code,
    humaneval_prompt,
    load_humaneval,
    load_prompts,
    parse_ids,
    select_tasks,
)
from ead_cli.errors import EadError
from ead_cli.hardware import machine_words, repack_choice, this_cpu
from ead_cli.option_table import BENCH, on
from ead_cli.options import ModelOptions, PolicyOptions
from ead_cli.policies import POLICY_KINDS
from ead_cli.remote import built_server
from ead_cli.runner import Runner, gpu_offload_available, padded_context
from ead_cli.sampling import SamplingParams

EAD = str(Path(sys.executable).with_name("ead"))
PYTHON = sys.executable  # the bench's own interpreter, before a test gives the sandbox another
ADD = Task(
    "HumanEval/0", "def add(a, b):\n", "add", "def check(candidate):\n    assert candidate(2, 3) == 5\n"
)


@pytest.fixture(scope="module")
def humaneval() -> list[Task]:
    return load_humaneval()


# ------------------------------------------------------------------------------------ tasks and ids


def test_ids_take_numbers_and_inclusive_ranges_sorted_once() -> None:
    assert parse_ids("5, 1,3-4,3") == [1, 3, 4, 5]
    assert parse_ids("7-7") == [7]


@pytest.mark.parametrize(
    ("spec", "message"),
    [("a", "'a' is not a number"), ("5-3", "runs backwards"), ("1,", "'' is not a number")],
)
def test_bad_ids_are_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(EadError, match=message) as error:
        parse_ids(spec)
    assert error.value.exit_code == 2


def test_splits_go_by_the_task_number(humaneval: list[Task]) -> None:
    assert len(humaneval) == 164
    even = select_tasks(humaneval, split="even")
    odd = select_tasks(humaneval, split="odd")
    assert len(even) == len(odd) == 82
    assert {t.number % 2 for t in even} == {0} and {t.number % 2 for t in odd} == {1}
    chosen = select_tasks(humaneval, ids="0-9", split="odd", limit=3)
    assert [t.task_id for t in chosen] == ["HumanEval/1", "HumanEval/3", "HumanEval/5"]
    assert [t.task_id for t in select_tasks(humaneval, ids="12,2")] == ["HumanEval/2", "HumanEval/12"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"split": "three"}, "--split must be one of even, odd, all"),
        ({"ids": "1,3", "split": "even"}, "no tasks selected"),
        ({"ids": "200"}, "no task 200 .the tasks are 0-163."),
        ({"limit": 0}, "--limit must be at least 1"),
    ],
)
def test_bad_selections_are_usage_errors(humaneval: list[Task], options: dict, message: str) -> None:
    with pytest.raises(EadError, match=message) as error:
        select_tasks(humaneval, **options)
    assert error.value.exit_code == 2


def test_a_jsonl_suffix_in_capitals_is_read_as_json_lines(tmp_path: Path) -> None:
    """A file named PROMPTS.JSONL (a suffix's case is the file system's, as .GGUF is a model's) had its
    records taken as text, each prompt the JSON line itself."""
    rows = tmp_path / "PROMPTS.JSONL"
    rows.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert load_prompts(rows) == ["a", "b"]


def test_prompt_lists_read_text_lines_or_jsonl(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first\n\n  \nsecond {\n")
    assert load_prompts(text) == ["first", "second {"]
    assert load_prompts(text, limit=1) == ["first"]
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "a\\nb"}\n\n{"prompt": "c", "id": 3}\n')
    assert load_prompts(rows) == ["a\nb", "c"]
    # a line ends at a newline alone: a form feed, U+0085 or U+2028 inside a prompt (or a record's, which
    # json.dumps leaves unescaped) is its text, and Windows' line ends are taken off
    text.write_text("page\x0cbreak\u2028and\x85more\r\nsecond\r\n", newline="")
    assert load_prompts(text) == ["page\x0cbreak\u2028and\x85more", "second"]
    rows.write_text('{"prompt": "a\u2028b\x85c"}\r\n', newline="")  # as json.dumps leaves them
    assert load_prompts(rows) == ["a\u2028b\x85c"]
    # a file saved as "UTF-8 with BOM": the mark is no text (a .jsonl's first line had been refused)
    rows.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n')
    text.write_bytes(b"\xef\xbb\xbffirst\n")
    assert load_prompts(rows) == ["a"] and load_prompts(text) == ["first"]
    rows.write_text('{"prompt": "a"}\n["b"]\n')
    with pytest.raises(EadError, match='line 2: not a JSON object with a "prompt" string'):
        load_prompts(rows)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(EadError, match="no prompts in"):
        load_prompts(tmp_path / "empty.txt")
    rows.write_text('{"prompt": "a"}\n{"prompt": " \\n"}\n')  # it had been "the prompt is empty" (which?)
    with pytest.raises(EadError, match=f"^{re.escape(str(rows))} line 2: the prompt is empty$"):
        load_prompts(rows)  # once the models had loaded
    for path, lines, fault in (
        (rows, '{"prompt": "a\\u0000b"}\n', "contains a NUL byte"),
        (text, "first\nsec\x00ond\n", "contains a NUL byte"),
        (rows, '{"prompt": "a\\ud800"}\n', "is not valid UTF-8 (byte 1)"),
    ):
        path.write_text(lines)
        with pytest.raises(EadError, match=f"line [12]: the prompt {re.escape(fault)}$") as refused:
            load_prompts(path)
        assert str(refused.value).startswith(f"{path} line ")


# ------------------------------------------------------------------------------------ prompt and code


def test_the_prompt_is_the_chat_template_with_the_assistant_turn_opened_by_a_fence(
    tiny_small: Path, humaneval: list[Task]
) -> None:
    task = humaneval[0]
    with Runner(tiny_small, name="small", n_ctx=2048, n_threads=1) as runner:
        tokens = humaneval_prompt(runner, task)
        text = b"".join(runner.token_bytes(t) for t in tokens).decode()
        special = runner.tokenize("<|im_start|>", add_special=False)
    assert special[0] in tokens  # control tokens are parsed, not spelled out
    message = USER_MESSAGE.format(prompt=task.prompt.rstrip())
    assert "```python\nfrom typing import List\n\n\ndef has_close_elements(" in message
    assert message.endswith('    """\n```')
    # Control tokens render as nothing; everything else is the ChatML turn, then the prefill.
    assert text == f"user\n{message}\nassistant\n```python\n"


def test_a_body_alone_gets_the_tasks_prompt_in_front() -> None:
    assert completion_code(ADD, "    return a + b\n") == "def add(a, b):\n    return a + b\n"
    whole = "import math\n\ndef add(a, b):\n    return a + b\n"
    assert completion_code(ADD, whole) == whole
    assert completion_code(ADD, "def adder(a, b):\n    return 1\n").startswith("def add(a, b):\n")


# ------------------------------------------------------------------------------------------ sandbox


@pytest.fixture
def unprivileged(monkeypatch: pytest.MonkeyPatch) -> str:
    """As root, the sandbox's interpreter set to a Python that nobody can run, so that the programs run as
    nobody: the venv's may lie where nobody cannot reach it (a pyenv under /root), a system one does not."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox changes user only where the bench runs as root")
    nobody = pwd.getpwnam("nobody")
    for python in (PYTHON, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            subprocess.run(
                [python, "-I", "-c", ""], user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], check=True
            )
        except (OSError, subprocess.CalledProcessError):
            continue
        monkeypatch.setattr(sys, "executable", python)
        return python
    pytest.skip("no Python here that nobody can run")


@pytest.fixture(params=["as the bench's user", "as nobody"])
def either_user(request: pytest.FixtureRequest) -> None:
    """The program run as the bench's user, and (the bench run as root) as nobody."""
    if request.param == "as nobody":
        request.getfixturevalue("unprivileged")


def test_a_correct_solution_passes_and_a_wrong_one_fails() -> None:
    assert check_solution(ADD, "def add(a, b):\n    return a + b\n") == Outcome("passed")
    wrong = check_solution(ADD, "def add(a, b):\n    return a - b\n")
    assert wrong == Outcome("failed", "AssertionError")
    assert not wrong.passed


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    outcome = check_solution(ADD, "def add(a, b):\n    while True:\n        pass\n", timeout_s=1)
    assert outcome == Outcome("timeout", "no result within 1 s")  # the limit, not the loop, ended it


def test_the_time_limit_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A grandchild that outlives the program dies with its group. It says its pid first, and must be gone
    (or a zombie no one reaps) once the program is stopped; it had been looked for by a marker it would
    write a second later, which a slow machine could write later still, so a surviving grandchild passed."""
    pid_file = tmp_path / "grandchild.pid"
    grandchild = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    code = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
    code += "time.sleep(60)\n"
    run_program(code, timeout_s=3)
    if not pid_file.exists() or not pid_file.read_text():
        pytest.skip("no grandchild started (the sandbox refuses to fork but to root)")
    assert wait_gone(pid_file.read_text()), "the grandchild outlived the limit"


def programs_run_as_root() -> bool:
    """Whether the sandbox's programs may start processes and threads: root's only (a root bench whose Python
    nobody can run), the limit of none holds for every other user."""
    return run_program("import os\nprint(os.getuid())\n").stdout == "0\n"


def wait_gone(pid: str) -> bool:
    """Whether the process is gone (or a zombie no one reaps) within 30 s."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + 30
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not status.exists() or "State:\tZ" in status.read_text()


@pytest.mark.parametrize("leave", ["os.setsid()", "os.setpgid(0, 0)"])
def test_a_grandchild_that_leaves_the_process_group_is_ended_too(tmp_path: Path, leave: str) -> None:
    """A daemon (fork, a new session or process group, fork, the middle one exits) is out of the group that
    is killed at the end; it had lived on after the sample, as the user who ran the bench (root can fork)."""
    pid_file = tmp_path / "daemon.pid"
    code = f"""import os, time
if os.fork() == 0:
    {leave}
    if os.fork() == 0:
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    os._exit(0)
time.sleep(0.5)
def add(a, b):
    return a + b
"""
    if not programs_run_as_root():
        pytest.skip("the sandbox refuses to fork but to root")
    assert check_solution(ADD, code, timeout_s=5) == Outcome("passed")
    assert pid_file.read_text()
    assert wait_gone(pid_file.read_text()), "the daemon outlived the sample"


def children(pid: int, named: str) -> list[int]:
    """The processes ``pid`` started whose command line holds ``named``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int((entry / "stat").read_bytes().rpartition(b")")[2].split()[1])
            if parent == pid and named.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def test_a_program_dies_with_a_bench_killed_mid_sample(either_user: None) -> None:
    """A bench killed outright (kill -9, the OOM killer) cannot end its program at the time limit: the
    program, in a session of its own, had slept on for good, adopted by init."""
    bench = f"import sys\nsys.executable = {sys.executable!r}  # the sandbox's interpreter, as the test's\n"
    bench += "from ead_cli.bench.sandbox import run_program\n"
    bench += "run_program('import time; time.sleep(600)', timeout_s=600)\n"
    process = subprocess.Popen([PYTHON, "-c", bench])
    deadline = time.monotonic() + 60
    while not (programs := [pid for pid in children(process.pid, "program.py") if sleeps(pid)]):
        assert process.poll() is None and time.monotonic() < deadline, "the program did not start"
        time.sleep(0.05)
    folder = os.readlink(f"/proc/{programs[0]}/cwd")  # which the bench, killed, cannot remove
    process.kill()
    process.wait()
    assert wait_gone(str(programs[0])), "the program outlived its bench"
    shutil.rmtree(folder)


def sleeps(pid: int) -> bool:
    """Whether the sandboxed program ``pid`` is the one that sleeps, not the probe of whom programs run as."""
    with contextlib.suppress(OSError):
        return "sleep" in Path(f"/proc/{pid}/cwd/program.py").read_text()
    return False


REAL_TIME = signal.SIGRTMIN + 2  # no name in signal.Signals


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("chunks = []\nwhile True:\n    chunks.append(bytes(10**8))\n", "MemoryError"),
        ("def add(a, b:\n    return a + b\n", "SyntaxError"),
        ("def add(a, b):\n    return add(a, b)\n", "RecursionError"),
        ("print('x' * 10**6)\n" * 20, "File too large"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed by SIGKILL"),
        (f"import os\nos.kill(os.getpid(), {REAL_TIME})\n", f"killed by signal {REAL_TIME}"),
    ],
)
def test_crashes_are_failed_samples(code: str, error: str) -> None:
    outcome = check_solution(ADD, code, timeout_s=5)
    assert outcome.status == "failed"
    assert error in outcome.error


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "print('ead-bench-passed-0123456789abcdef')\nraise SystemExit\n",
        "def add(a, b):\n    raise SystemExit(0)\n",
    ],
)
def test_exiting_before_the_checks_or_faking_success_is_a_failure(code: str) -> None:
    outcome = check_solution(ADD, code)
    assert outcome.status == "failed"
    assert not outcome.passed


@pytest.mark.parametrize(
    "after_the_checks",
    [
        "import atexit\natexit.register(lambda: print('y' * 5000))\n",
        "import threading\nthreading.Timer(0.2, print, ['z\\n' * 3000]).start()\n",  # a thread, later
    ],
)
def test_output_after_the_sentinel_does_not_hide_it(after_the_checks: str) -> None:
    """The checks ran to the end and the program exited 0: it passes however much it prints afterwards (the
    sentinel had been looked for in the last 4 KiB only, and the sample failed, 'before the checks')."""
    if "threading" in after_the_checks and not programs_run_as_root():
        pytest.skip("no threads in the sandbox but for root")
    solution = f"{after_the_checks}def add(a, b):\n    return a + b\n"
    assert check_solution(ADD, solution) == Outcome("passed")
    wrong = f"{after_the_checks}def add(a, b):\n    return a - b\n"
    assert check_solution(ADD, wrong) == Outcome("failed", "AssertionError")


@pytest.mark.usefixtures("either_user")
def test_the_program_runs_isolated_in_an_empty_folder_without_stdin() -> None:
    probe = "import os, sys\nprint(sorted(os.listdir('.')), sys.stdin.read() == '', sorted(os.environ))\n"
    result = run_program(probe)
    assert result.returncode == 0
    assert result.stdout.strip() == "['program.py'] True ['HOME', 'LANG', 'PATH', 'TMPDIR']"


@pytest.mark.parametrize(
    "cleanup",
    [
        "for name in os.listdir('.'):\n    os.remove(name)\n",
        "folder = os.getcwd()\nos.chdir('/')\nshutil.rmtree(folder)\n",
    ],
)
@pytest.mark.usefixtures("either_user")
def test_a_program_that_deletes_its_folders_files_is_still_judged(cleanup: str) -> None:
    """Its output is caught outside the folder: deleting everything there (or the folder) had taken the
    captured output away and crashed the bench with FileNotFoundError."""
    solution = f"import os, shutil\n{cleanup}def add(a, b):\n    return a + b\n"
    assert check_solution(ADD, solution) == Outcome("passed")
    failing = f"import os, shutil\n{cleanup}def add(a, b):\n    return a - b\n"
    assert check_solution(ADD, failing) == Outcome("failed", "AssertionError")


def test_as_root_the_programs_run_as_nobody_without_groups(unprivileged: str) -> None:
    nobody = pwd.getpwnam("nobody")
    identity = run_program("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
    assert identity.stdout == f"{nobody.pw_uid} {nobody.pw_gid} []\n"
    assert sandbox_note() is None
    assert check_solution(ADD, "def add(a, b):\n    return a + b\n") == Outcome("passed")
    assert check_solution(ADD, "def add(a, b):\n    return a - b\n") == Outcome("failed", "AssertionError")


def test_as_nobody_a_program_cannot_start_processes(unprivileged: str) -> None:
    """Root's limit of no new processes is not enforced; nobody's is. Each child it did start says its
    pid, and none may be left once the program is judged."""
    code = """import os, time
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    print(pid, flush=True)
"""
    result = run_program(code, timeout_s=5)
    assert result.returncode == 1 and "BlockingIOError" in result.stderr
    assert all(wait_gone(pid) for pid in result.stdout.split())


def judged_by_a_bench_of_its_own(code: str) -> subprocess.CompletedProcess:
    """ADD's tests run on ``code`` by a bench in a process and session of its own (the sandbox's
    interpreter as the test's), so that a program which can kill its parent, or its parent's group,
    kills that bench, not pytest."""
    bench = f"""import sys
sys.executable = {sys.executable!r}
from ead_cli.bench.sandbox import check_solution
from ead_cli.bench.tasks import Task
task = Task(*{dataclasses.astuple(ADD)!r})
print(check_solution(task, {code!r}))
"""
    return subprocess.run(
        [PYTHON, "-c", bench], capture_output=True, text=True, timeout=120, start_new_session=True
    )


@pytest.mark.parametrize("parent", ["os.kill(os.getppid(), 9)", "os.killpg(os.getpgid(os.getppid()), 9)"])
def test_as_nobody_a_program_cannot_signal_the_bench(unprivileged: str, parent: str) -> None:
    result = judged_by_a_bench_of_its_own(f"import os\ndef add(a, b):\n    {parent}\n    return a + b\n")
    assert (result.returncode, result.stderr) == (0, "")
    refused = "PermissionError: [Errno 1] Operation not permitted"
    assert result.stdout == f"{Outcome('failed', refused)}\n"


@pytest.mark.parametrize("group", ["os.killpg(0, 9)", "os.kill(0, 9)", "os.killpg(os.getpgid(0), 9)"])
def test_a_program_that_kills_its_process_group_ends_itself_alone(either_user: None, group: str) -> None:
    """The program runs in a session of its own: its process group is not the bench's, so killing it (a
    cleanup that ends 'everything of ours') ends the program, a failed sample, and the bench judges on."""
    result = judged_by_a_bench_of_its_own(f"import os\ndef add(a, b):\n    {group}\n    return a + b\n")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{Outcome('failed', 'killed by SIGKILL')}\n"


def test_a_python_nobody_cannot_run_runs_the_programs_as_root_with_a_note(
    unprivileged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv under /root, say: the bench still runs, its programs as root, and says so in one line when it
    is made (before any model loads), not in a refusal of every sample."""
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    python.symlink_to(unprivileged)
    monkeypatch.setattr(sys, "executable", str(python))
    note = sandbox_note()
    assert note is not None and "\n" not in note
    why = f"could not start the sandbox: [Errno 13] Permission denied: '{python}'"
    assert note.startswith(f"note: the programs run as root: nobody cannot run {python} here ({why}); ")
    assert humaneval_job([ADD], tmp_path / "out").note == note
    assert run_program("import os\nprint(os.getuid())\n").stdout == "0\n"
    assert check_solution(ADD, "def add(a, b):\n    return a + b\n") == Outcome("passed")


def test_a_bench_refused_after_the_load_says_its_one_line_without_the_note(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The note came as soon as the models loaded, so a bench refused after that (a prompt too long for
    the context) said two lines: it comes before the first sample, where a program is about to run."""
    if os.geteuid() != 0:
        pytest.skip("the note is a root bench's")
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    python.symlink_to(PYTHON)
    source = f"import sys\nsys.executable = {str(python)!r}\nfrom ead_cli.cli import main\nmain(sys.argv[1:])"
    small, large = tiny_pair
    models = ["--small", str(small), "--large", str(large), "--threads", "1"]
    bench = ["bench", "humaneval", *models, "--ids", "1", "--strategies", "ead", "--ctx", "64"]
    out = ["--max-tokens", "8", "--out", str(tmp_path / "out")]
    result = subprocess.run([PYTHON, "-c", source, *bench, *out], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("error: the prompt is ") and result.stderr.count("\n") == 1, result.stderr


def test_as_nobody_a_program_cannot_write_roots_files(unprivileged: str, tmp_path: Path) -> None:
    folder = tmp_path / "root-only"
    folder.mkdir(mode=0o755)
    target = folder / "written"
    code = f"open({str(target)!r}, 'w').write('x')\ndef add(a, b):\n    return a + b\n"
    outcome = check_solution(ADD, code)
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.startswith("PermissionError: [Errno 13] Permission denied")
    assert not target.exists()


# --------------------------------------------------------------------------------------- strategies


EAD_TAUS = "0.125,0.25,0.5,1"  # --ead-tau as the bench gives it when it is not set: no ead strategy needs it


def sweep(ead_tau: str, gate_tau: str, *options: str | None, **named: str) -> Grid:
    """parse_grid with the ead and gate thresholds first, as the tests below give them."""
    return parse_grid({"ead": ead_tau, "gate": gate_tau}, *options, **named)  # type: ignore[arg-type]


def test_the_default_sweep_and_its_names() -> None:
    strategies = build_strategies(all_families(), Grid())
    assert [s.name for s in strategies] == [
        "small-only",
        "large-only",
        "gate tau=1",
        "ead tau=0.125",
        "ead tau=0.25",
        "ead tau=0.5",
        "ead tau=1",
        "lookahead tau=1",
        "spec",
    ]
    ead = strategies[5].policy
    assert (ead.mode, ead.policy, ead.tau, ead.window, ead.min_run) == ("ead", "ead", 0.5, None, 10)
    assert strategies[-1].policy == PolicyOptions(mode="spec")


def test_ablations_are_the_cartesian_product_with_the_ead_taus() -> None:
    grid = sweep("0.5,1,0.5", "1,2", "3,5", "4", "before,after", "2,8", "1.5")
    strategies = build_strategies("ead,gate,spec", grid)
    names = [s.name for s in strategies]
    assert len(names) == 2 * 2 * 2 + 2 * 2 + 2
    assert [name for name in names if name.startswith("ead ")][:2] == [
        "ead tau=0.5 window=3 min_run=4",
        "ead tau=0.5 window=3 min_run=4 switch_point=after",
    ]
    assert "gate tau=2 switch_point=after" in names
    assert names[-1] == "spec draft=8 draft_entropy_stop=1.5"


def test_lookup_lengths_multiply_every_loop_of_eads_own_and_name_each_variant() -> None:
    grid = sweep(EAD_TAUS, "1", None, "10", "before", "4", None, lookup="0,6")
    names = [s.name for s in build_strategies("large,gate,spec,server-large", grid)]
    assert names == [
        "large-only", "large-only lookup=6", "gate tau=1", "gate tau=1 lookup=6", "spec", "spec lookup=6",
        "server-large",
    ]  # fmt: skip
    longer = sweep(EAD_TAUS, "1", None, "10", "before", "4", None, lookup="0,12", lookup_draft="16,32")
    names = [s.name for s in build_strategies("large", longer)]
    assert names == ["large-only", "large-only lookup=12", "large-only lookup=12 lookup_draft=32"]
    assert [s.policy.lookup_draft for s in build_strategies("large", longer)] == [16, 16, 32]


def test_values_that_differ_past_six_digits_are_named_apart() -> None:
    """A name had held six significant digits: 0.1234567 and 0.1234568 were one name, so the second
    was dropped from the sweep unsaid, and a resume at either took the other's samples as its own."""
    grid = sweep("0.1234567,0.1234568,0.5", "1", None, "10", "before", "4", "0.30000001,0.3")
    names = [s.name for s in build_strategies("ead,spec", grid)]
    assert names == [
        "ead tau=0.1234567", "ead tau=0.1234568", "ead tau=0.5",
        "spec draft_entropy_stop=0.30000001", "spec draft_entropy_stop=0.3",
    ]  # fmt: skip
    taus = [s.policy.tau for s in build_strategies("ead,spec", grid) if s.policy.mode == "ead"]
    assert taus == [0.1234567, 0.1234568, 0.5]


def test_verify_and_burst_sweeps_multiply_the_gate_strategies() -> None:
    grid = sweep(EAD_TAUS, "1", None, "10", "before", "4", None, "none,0.1", "1,line,adaptive,line")
    names = [s.name for s in build_strategies("gate", grid)]
    assert names == [
        "gate tau=1",
        "gate tau=1 burst=line",
        "gate tau=1 burst=adaptive",
        "gate tau=1 verify=0.1",
        "gate tau=1 burst=line verify=0.1",
        "gate tau=1 burst=adaptive verify=0.1",
    ]


def test_patterns_and_an_adaptive_tau_apply_to_every_strategy_they_fit() -> None:
    grid = sweep("0.5", "1,2", None, "10", "before", "4", None)
    grid = dataclasses.replace(grid, patterns=("@code", r"def \w+"), tau_range=(0.5, 2.0))
    names = [s.name for s in build_strategies("small,ead,gate", grid)]
    assert names == [
        "small-only",
        "gate tau=1 patterns=@code|def \\w+ tau_range=0.5:2",
        "gate tau=2 patterns=@code|def \\w+ tau_range=0.5:2",
        "ead tau=0.5 tau_range=0.5:2",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("0.5,x", "1", None, "10", "before", "4", None), "--ead-tau: 'x' is not a valid value"),
        (("-1", "1", None, "10", "before", "4", None), "--ead-tau: -1 is below 0"),
        (("nan", "1", None, "10", "before", "4", None), "--ead-tau: nan is below 0 or not finite"),
        (("1", "1", "0", "10", "before", "4", None), "--window: 0 is below 1"),
        (("1", "1", None, "2.5", "before", "4", None), "--min-run: '2.5' is not a valid value"),
        (("1", "1", None, "10", "during", "4", None), "--switch-point: 'during' is not one of before, after"),
        (("1", "1", None, "10", "before", "0", None), "--draft: 0 is below 1"),
        (("1", "1", None, "10", "before", "4", None, "0"), r"--verify: 0 is not in \(0, 1\]"),
        (("1", "1", None, "10", "before", "4", None, "0.1,x"), "--verify: 'x' is not a valid value"),
        (("1", "1", None, "10", "before", "4", None, None, "0"), "--burst: 0 is below 1"),
        (("1", "1", None, "10", "before", "4", None, None, "lines"), "--burst: 'lines' is not a valid value"),
    ],
)
def test_bad_sweep_values_are_usage_errors(args: tuple, message: str) -> None:
    with pytest.raises(EadError, match=message) as error:
        sweep(*args)
    assert error.value.exit_code == 2


def test_unknown_families_are_refused() -> None:
    expected = "--strategies: 'medium' is not one of small, large, gate, ead, lookahead, spec"
    with pytest.raises(EadError, match=expected):
        build_strategies("small,medium", Grid())
    with pytest.raises(EadError, match=r"^--strategies: ' , ' names no strategy$"):
        build_strategies(" , ", Grid())


@pytest.mark.parametrize(
    ("families", "options", "named", "message"),
    [
        ("gate", {"window": "3"}, "--window", "(it applies to ead)"),
        ("small,large", {"ead_tau": "0.5"}, "--ead-tau", "(it applies to ead)"),
        ("small", {"draft": "8"}, "--draft", "(it applies to lookahead, spec)"),
        ("ead,lookahead", {"burst": "line"}, "--burst", "(it applies to gate)"),
        ("server-large", {"lookup": "6"}, "--lookup", "(it applies to small, large, gate, ead,"),
        ("large", {"server_draft": "2"}, "--server-draft", "(it applies to server-spec, server-stack)"),
        ("ead", {"lookup_draft": "31"}, "--lookup-draft", "(nothing here takes it: see its --help)"),
    ],
)
def test_a_sweep_option_no_chosen_strategy_takes_is_refused(
    families: str, options: dict[str, str], named: str, message: str
) -> None:
    """``--strategies gate --window 3`` had run gate alone, the window dropped unsaid: a sweep the user
    asked for that the bench did not run, and a table that looked like it."""
    values = {"ead_tau": EAD_TAUS, "window": None, "draft": "4"} | options
    taus, window, draft = (values.pop(name) for name in ("ead_tau", "window", "draft"))
    grid = sweep(taus, "1", window, "10", "before", draft, None, **values)
    expected = f"{named} is given, but no strategy of --strategies {families!r} takes it {message}"
    with pytest.raises(EadError, match=f"^{re.escape(expected)}") as error:
        build_strategies(families, grid)
    assert error.value.exit_code == 2


def test_each_sweep_options_help_names_the_policies_that_sweep_it() -> None:
    """--verify's help had said "ead and gate" while lookahead sweeps it too."""
    for option in on(BENCH):
        if option.name in SWEPT:
            said = option.sweep.split(":")[0]  # "ead and gate: ..." or "ead windows, ..."
            named = {name for name in POLICY_KINDS if re.search(rf"\b{name}\b", said)}
            sweeping = {name for name, kind in POLICY_KINDS.items() if option.name in kind.sweeps}
            assert named == sweeping, option.flag


def test_sweep_options_at_their_defaults_or_taken_by_a_strategy_pass() -> None:
    defaults = sweep(EAD_TAUS, "1", None, "10", "before", "4", None)
    assert [s.name for s in build_strategies("small", defaults)] == ["small-only"]
    used = sweep("0.5", "1", "3", "10", "before", "4", None, lookup="0,6", lookup_draft="31")
    assert [s.name for s in build_strategies("ead,server-large", used)] == [
        "ead tau=0.5 window=3", "ead tau=0.5 window=3 lookup=6 lookup_draft=31", "server-large",
    ]  # fmt: skip


def test_strategies_as_the_report_names_them() -> None:
    """``--strategies large-only`` had been refused though the report names the strategy so: a lone
    model's name is its family; a swept strategy's name says which family and options to give."""
    names = [strategy.name for strategy in build_strategies("large-only,small-only", Grid())]
    assert names == ["small-only", "large-only"]
    expected = (
        "--strategies: 'ead tau=0.5' is a strategy as the report names it: give its family, ead, "
        "and set its values by their options"
    )
    with pytest.raises(EadError, match=f"^{re.escape(expected)}$") as error:
        build_strategies("ead tau=0.5", Grid())
    assert error.value.exit_code == 2


# ---------------------------------------------------------------------------------- running, resume


def run(
    job: Bench, pair: tuple[Path, Path], plans: list[list[tuple[str, str]]] | None = None, **models: Any
) -> list[Record]:
    """Run a bench on the tiny pair (one thread, unless ``models`` says otherwise), noting each plan as
    (strategy, task id) pairs."""

    def watch(plan: Plan, records: Iterator[Record]) -> None:
        if plans is not None:
            plans.append([(s.name, item.task_id) for s, item in plan])
        for _ in records:
            pass

    options = ModelOptions(str(pair[0]), str(pair[1]), **{"threads": 1} | models)
    return run_bench(job, options, watch=watch)


def baselines() -> list[Strategy]:
    return build_strategies("small,large", Grid())


def humaneval_job(tasks: list[Task], out: Path, max_tokens: int = 8, timeout_s: float = 10.0) -> Bench:
    return humaneval_bench(
        tasks, baselines(), sampling=SamplingParams(), max_tokens=max_tokens, out=out, timeout_s=timeout_s
    )


def test_an_interrupted_bench_resumes_with_only_what_is_missing(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    plans: list[list[tuple[str, str]]] = []
    first = run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, plans)
    assert plans[0] == [
        ("small-only", "HumanEval/0"),
        ("large-only", "HumanEval/0"),
        ("small-only", "HumanEval/1"),
        ("large-only", "HumanEval/1"),
    ]
    assert len(first) == 4
    again = run(humaneval_job(humaneval[:3], tmp_path), tiny_pair, plans)
    assert plans[1] == [("small-only", "HumanEval/2"), ("large-only", "HumanEval/2")]
    assert again[:4] == first
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["config"] + ["sample"] * 6
    run(humaneval_job(humaneval[:3], tmp_path), tiny_pair, plans)
    assert plans[2] == []


def test_a_sample_record_has_every_figure(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    small, large = run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    assert small["strategy"] == "small-only" and small["task_id"] == "HumanEval/0"
    assert PolicyOptions(**small["params"] | {"patterns": ()}) == PolicyOptions(mode="small")
    assert small["passed"] is False and small["outcome"] == "failed" and small["error"]
    assert small["generated"] == 8 and small["finish_reason"] == "length"
    assert small["code"] == humaneval[0].prompt + small["text"]  # garbage has no def line
    assert small["acceptance_rate"] is None
    assert (small["large_share"], large["large_share"]) == (0.0, 1.0)
    for record, writer in ((small, "small"), (large, "large")):
        models = record["models"]
        assert models[writer]["written"] == 8
        # Cold caches: the writing model reads the whole prompt as prefill, every sample.
        assert models[writer]["prefill_tokens"] == record["prompt_tokens"] > 100
        assert models[writer]["decode_tokens"] == 7
        assert record["flops"] == pytest.approx(sum(m["flops"] for m in models.values()))
        assert record["tokens_per_s"] == pytest.approx(8 / record["wall_s"])


def test_a_results_file_of_another_setup_is_refused(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(EadError, match=r"holds results of another setup \(differs in: --max-tokens\)"):
        run(humaneval_job(humaneval[:1], tmp_path, max_tokens=9), tiny_pair)
    with pytest.raises(EadError, match=r"differs in: the models"):
        run(humaneval_job(humaneval[:1], tmp_path), (tiny_pair[0], tiny_pair[0]))
    # what passes depends on the tests' time limit: a resume under another had mixed them without a word
    with pytest.raises(EadError, match=r"differs in: --timeout"):
        run(humaneval_job(humaneval[:1], tmp_path, timeout_s=5.0), tiny_pair)
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_a_chat_template_given_writes_every_prompt_and_parts_the_setup(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """--chat-template NAME or --chat-template-file FILE writes every prompt of a bench, as generate's
    does, and is recorded (a builtin by its name, a Jinja template by its text's SHA-256, inline or from a
    file alike), and so is the builtin --no-jinja writes the models' own with: results under another are
    refused as another setup, before any model loads where they record one (--no-jinja's once they have
    loaded). A bench without one records none, so earlier results stay its repeats."""
    pair = (tmp_path / tiny_pair[0].name, tmp_path / tiny_pair[1].name)
    for copy, original in zip(pair, tiny_pair, strict=True):
        shutil.copyfile(original, copy)

    def config(folder: str) -> Record:
        return json.loads((tmp_path / folder / "results.jsonl").read_text().splitlines()[0])

    own = run(humaneval_job(humaneval[:1], tmp_path / "own"), pair)
    llama3 = run(humaneval_job(humaneval[:1], tmp_path / "llama3"), pair, chat_template="llama3")
    bare_text = "{{ messages[-1]['content'] }}"  # the message alone, no turns around it
    bare_file = tmp_path / "bare.jinja"
    bare_file.write_text(bare_text)
    bare = run(humaneval_job(humaneval[:1], tmp_path / "bare"), pair, chat_template_file=bare_file)
    assert "chat_template" not in config("own") and config("llama3")["chat_template"] == "llama3"
    assert config("bare")["chat_template"] == f"sha256:{hashlib.sha256(bare_text.encode()).hexdigest()}"
    assert bare[0]["prompt_tokens"] < own[0]["prompt_tokens"] != llama3[0]["prompt_tokens"]
    builtin = run(humaneval_job(humaneval[:1], tmp_path / "no-jinja"), pair, jinja=False)
    assert config("no-jinja")["chat_template"] == "chatml"  # the tiny models' own is ChatML
    assert builtin[0]["prompt_tokens"] == own[0]["prompt_tokens"]
    plans: list[list[tuple[str, str]]] = []
    run(humaneval_job(humaneval[:1], tmp_path / "bare"), pair, plans, chat_template=bare_text)
    assert plans == [[]]  # the same template given inline: the same setup, nothing left to run
    kept = {folder: (tmp_path / folder / "results.jsonl").read_bytes() for folder in ("own", "llama3")}
    refused = (
        r"holds results of another setup \(differs in: --chat-template, --chat-template-file or --no-jinja\)"
    )
    others = (
        ("own", {"chat_template": "llama3"}),
        ("llama3", {"chat_template_file": bare_file}),
        ("own", {"jinja": False}),
        ("no-jinja", {}),
    )
    for folder, given in others:
        with pytest.raises(EadError, match=refused):
            run(humaneval_job(humaneval[:1], tmp_path / folder), pair, **given)
    pair[1].write_bytes(b"GGUF" + bytes(pair[1].stat().st_size - 4))  # its name and size, not a model
    for given in ({}, {"chat_template": "chatml"}):
        with pytest.raises(EadError, match=refused):
            run(humaneval_job(humaneval[:1], tmp_path / "llama3"), pair, **given)
    assert {folder: (tmp_path / folder / "results.jsonl").read_bytes() for folder in kept} == kept


NO_SERVER = "http://127.0.0.1:9"  # nothing listens there: a bench that reached it would fail otherwise


@pytest.mark.parametrize(
    ("families", "models", "temp", "refusal"),
    [
        ("large,server-large", "file,file", 0.5, "server strategies decode greedily: leave --temp at 0"),
        ("server-large", "file,server", 0.0, f"server strategies need local model files, not {NO_SERVER}"),
        ("spec", "file,server", 0.0, "--verify and speculative decoding need logits at every position"),
        ("gate", "file,server", 0.0, "--verify and speculative decoding need logits at every position"),
        ("large,spec", "file,file,file", 0.0, "speculative decoding takes two models: a drafter and"),
    ],
)
def test_a_strategy_these_models_cannot_run_is_refused_before_any_model_loads(
    tmp_path: Path, families: str, models: str, temp: float, refusal: str
) -> None:
    """A strategy that cannot run on the models given (a sampling llama-server's loops do not take, a
    model on a server where the loop needs its file or every row of logits (the gate here with
    --verify), speculative decoding over three models) had been refused once every model had loaded and
    a server been reached: here no file is a model llama.cpp can load, and the refusal is still the
    strategy's, with nothing left in --out."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # past the magic check, not a model llama.cpp loads
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\n")
    strategies = build_strategies(families, Grid(verifies=(0.5,)) if families == "gate" else Grid())
    out = tmp_path / "out"
    job = prompts_bench(prompts, strategies, sampling=SamplingParams(temp=temp), max_tokens=4, out=out)
    refs = tuple(str(broken) if kind == "file" else NO_SERVER for kind in models.split(","))
    with pytest.raises(EadError, match=re.escape(refusal)):
        run_bench(job, ModelOptions(models=refs, threads=1), watch=lambda plan, records: None)
    assert not out.exists()


def test_another_setup_that_the_options_give_is_refused_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """Another --max-tokens, --timeout, --temp or --seed, or another bench's folder: the setup had been
    compared only once the models had loaded, the user waiting through the load to be told. Refused as
    the bench is made, before ``run_bench``; the same setup still resumes."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    before = (tmp_path / "results.jsonl").read_bytes()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    for make, differs in (
        (lambda: humaneval_job(humaneval[:1], tmp_path, max_tokens=9), "--max-tokens"),
        (lambda: humaneval_job(humaneval[:1], tmp_path, timeout_s=5.0), "--timeout"),
        (
            lambda: humaneval_bench(
                humaneval[:1], baselines(), sampling=SamplingParams(temp=0.5), max_tokens=8, out=tmp_path
            ),
            "--temp or --seed",
        ),
        (
            lambda: prompts_bench(
                prompts, baselines(), sampling=SamplingParams(), max_tokens=8, out=tmp_path
            ),
            "the bench (HumanEval or a prompts file)",
        ),
    ):
        refused = rf"holds results of another setup \(differs in: {re.escape(differs)}"
        with pytest.raises(EadError, match=refused):
            make()
    assert (tmp_path / "results.jsonl").read_bytes() == before
    assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)) == 4


def test_other_model_files_or_threads_are_refused_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A resume with another model file (told by its name and size) or other --threads had been refused
    only once the models had loaded: a file that llama.cpp cannot load in its place is refused as another
    setup, not loaded (nor decoded by the smoke check's child) first."""
    out = tmp_path / "out"
    run(humaneval_job(humaneval[:1], out), tiny_pair)
    before = (out / "results.jsonl").read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # past the magic check, not a model llama.cpp loads
    with pytest.raises(EadError, match=r"holds results of another setup \(differs in: the models\)"):
        run(humaneval_job(humaneval[:1], out), (tiny_pair[0], broken))
    with pytest.raises(EadError, match=r"\(differs in: the models, --threads\)"):
        run(humaneval_job(humaneval[:1], out), (tiny_pair[0], broken), threads=2)
    assert (out / "results.jsonl").read_bytes() == before
    assert len(run(humaneval_job(humaneval[:2], out), tiny_pair)) == 4  # the same files resume


def test_another_ctx_is_refused_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A resume under another --ctx had been refused only once the models had loaded: the context
    llama.cpp makes of a --ctx given (rounded up to a multiple of 256) is known before, so a model file
    that llama.cpp cannot load, of the same name and size as the one the results were run with, is not
    loaded (nor decoded by the smoke check's child) first. The same --ctx in another spelling resumes."""
    pair = (tmp_path / tiny_pair[0].name, tmp_path / tiny_pair[1].name)
    for copy, original in zip(pair, tiny_pair, strict=True):
        shutil.copyfile(original, copy)
    out = tmp_path / "out"
    run(humaneval_job(humaneval[:1], out), pair, n_ctx=1024)
    before = (out / "results.jsonl").read_bytes()
    assert len(run(humaneval_job(humaneval[:2], out), pair, n_ctx=1000)) == 4  # 1000 makes 1024 too
    resumed = (out / "results.jsonl").read_bytes()
    assert resumed.startswith(before) and len(resumed) > len(before)
    pair[1].write_bytes(b"GGUF" + bytes(pair[1].stat().st_size - 4))  # its name and size, not a model
    with pytest.raises(EadError, match=r"holds results of another setup \(differs in: --ctx\)"):
        run(humaneval_job(humaneval[:2], out), pair, n_ctx=512)
    assert (out / "results.jsonl").read_bytes() == resumed


@pytest.mark.parametrize(
    ("recorded", "same", "other", "differs"),
    [
        # no --ctx: the model's training context (2048) is read from the file, so 512 is made of -ub 1024
        ({}, {"n_ubatch": 1024}, {"n_batch": 64}, "--batch-size, --ubatch-size"),
        # a batch no larger than the context: 1024 is made of -b 2048 and -b 4096 alike
        (
            {"n_ctx": 1024, "n_batch": 2048},
            {"n_ctx": 1024, "n_batch": 4096},
            {"n_ctx": 1024, "n_batch": 2048, "n_ubatch": 64},
            "--ubatch-size",
        ),
    ],
)
def test_other_batch_sizes_are_refused_before_any_model_loads(
    tmp_path: Path,
    tiny_pair: tuple[Path, Path],
    humaneval: list[Task],
    recorded: dict,
    same: dict,
    other: dict,
    differs: str,
) -> None:
    """A resume under another -b or -ub had been refused only once the models had loaded: the batches
    llama.cpp makes of them (one no larger than the context, a micro-batch no larger than the batch) are
    known before, so a model file that llama.cpp cannot load, of the same name and size as the one the
    results were run with, is not loaded first. The same batches asked otherwise resume."""
    pair = (tmp_path / tiny_pair[0].name, tmp_path / tiny_pair[1].name)
    for copy, original in zip(pair, tiny_pair, strict=True):
        shutil.copyfile(original, copy)
    out = tmp_path / "out"
    run(humaneval_job(humaneval[:1], out), pair, **recorded)
    assert len(run(humaneval_job(humaneval[:2], out), pair, **same)) == 4
    resumed = (out / "results.jsonl").read_bytes()
    pair[1].write_bytes(b"GGUF" + bytes(pair[1].stat().st_size - 4))  # its name and size, not a model
    with pytest.raises(EadError, match=rf"holds results of another setup \(differs in: {differs}\)"):
        run(humaneval_job(humaneval[:2], out), pair, **other)
    assert (out / "results.jsonl").read_bytes() == resumed


def test_llama_cpp_makes_the_context_ead_expects_of_a_ctx(tiny_small: Path) -> None:
    """The bench compares a resume's --ctx before any model loads by the context llama.cpp makes of it
    (``runner.padded_context``): held here to what this llama.cpp makes."""
    for asked in (16, 255, 256, 257, 1000, 2048, 3000):
        with Runner(tiny_small, name="small", n_ctx=asked, n_threads=1) as runner:
            assert runner.n_ctx == padded_context(asked) >= asked, asked


@pytest.mark.parametrize(
    ("options", "differs"),
    [
        ({"threads": 2}, "--threads"),
        ({"threads_batch": 2}, "--threads-batch"),
        ({"n_ctx": 1024}, "--ctx"),
        ({"n_batch": 64}, "--batch-size, --ubatch-size"),  # the micro-batch follows a smaller batch
        ({"n_ubatch": 64}, "--ubatch-size"),
        ({"cache_type_k": "f32"}, "the KV cache types: -ctk, -ctv, -ctkd or -ctvd"),
        ({"cache_type_v_draft": "bf16"}, "the KV cache types: -ctk, -ctv, -ctkd or -ctvd"),
        ({"flash_attn": "off"}, "--flash-attn"),
    ],
)
def test_a_resume_under_other_threads_or_another_context_is_refused(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task], options: dict, differs: str
) -> None:
    """The threads, the batch sizes, the KV cache types and flash attention set every sample's wall-clock
    (and the cache types its text), and the context where an answer must stop: a resume under others had
    mixed both kinds of sample in one table without a word."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(EadError, match=rf"holds results of another setup \(differs in: {differs}\)"):
        run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, **options)
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_threads_batch_is_recorded_where_it_is_not_threads_and_another_is_refused_before_models_load(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """-tb as -t is llama.cpp's default, the setup of every results file before ead took -tb: no key, the
    same table. Another -tb is recorded, and a resume under another (or none) refused before the models
    load: a model file llama.cpp cannot load, of the same name and size, is not loaded first."""
    pair = (tmp_path / tiny_pair[0].name, tmp_path / tiny_pair[1].name)
    for copy, original in zip(pair, tiny_pair, strict=True):
        shutil.copyfile(original, copy)
    plain, batched = tmp_path / "plain", tmp_path / "batched"
    run(humaneval_job(humaneval[:1], plain), pair, threads_batch=1)
    assert "threads_batch" not in json.loads((plain / "results.jsonl").read_text().splitlines()[0])
    assert len(run(humaneval_job(humaneval[:2], plain), pair)) == 4  # -t 1 without -tb: the same
    run(humaneval_job(humaneval[:1], batched), pair, threads_batch=2)
    assert json.loads((batched / "results.jsonl").read_text().splitlines()[0])["threads_batch"] == 2
    assert len(run(humaneval_job(humaneval[:2], batched), pair, threads_batch=2)) == 4
    held = {out: (out / "results.jsonl").read_bytes() for out in (plain, batched)}
    pair[1].write_bytes(b"GGUF" + bytes(pair[1].stat().st_size - 4))  # its name and size, not a model
    for out, options in ((batched, {}), (batched, {"threads_batch": 3}), (plain, {"threads_batch": 2})):
        with pytest.raises(EadError, match=r"holds results of another setup \(differs in: --threads-batch\)"):
            run(humaneval_job(humaneval[:3], out), pair, **options)
    assert {out: (out / "results.jsonl").read_bytes() for out in held} == held


def test_a_bench_records_the_machine_and_a_resume_on_another_is_refused(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """Relative costs differ a lot between CPUs (an AMD EPYC's batches gain far less over its decode than
    an AMX Xeon's): the config names the CPU, its cores and the repack decision, and a folder carried to
    another machine, or resumed under the other repack decision, is refused before any model loads."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    config, *samples = path.read_text().splitlines()
    recorded = json.loads(config)["machine"]
    assert recorded == {"cpu": this_cpu()[0], "cpus": os.cpu_count(), "repack": repack_choice().word}
    assert (
        machine_words(recorded)
        == f"{this_cpu()[0]}, {os.cpu_count()} CPUs, weight repacking {recorded['repack']}"
    )
    elsewhere = json.loads(config) | {"machine": recorded | {"cpu": "another CPU"}}
    path.write_text("\n".join([json.dumps(elsewhere), *samples]) + "\n")
    before = path.read_bytes()
    machine = r"differs in: the machine \(its CPU, its cores, or --repack/--no-repack\)"
    with pytest.raises(EadError, match=machine):
        run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)
    assert path.read_bytes() == before
    path.write_text("\n".join([config, *samples]) + "\n")
    before = path.read_bytes()
    with pytest.raises(EadError, match=machine):  # refused before the load: repacking on an AMX CPU crashes
        run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, repack=not repack_choice().enabled)
    assert path.read_bytes() == before


def test_machine_words_take_only_a_machine_record() -> None:
    """An edited file's machine (not an object, a key missing) is said as nothing, not a traceback."""
    assert (
        machine_words({"cpu": "AMD EPYC", "cpus": 2, "repack": "on"})
        == "AMD EPYC, 2 CPUs, weight repacking on"
    )
    assert machine_words("AMD EPYC") is None
    assert machine_words({"cpu": "AMD EPYC", "cpus": 2}) is None


def test_a_setup_differs_in_what_a_user_knows() -> None:
    """A refused resume or repeat had named the config's keys ('source_sha256, gpu_layers'): each is said
    as the option or the file a user would change."""
    stored = {"source_sha256": "a", "gpu_layers": 0, "sampling": {"temp": 0.0}, "threads": 1}
    config = {"source_sha256": "b", "gpu_layers": 99, "sampling": {"temp": 0.5}, "threads": 1}
    assert differing(config, stored) == "--n-gpu-layers, --temp or --seed, the tasks or prompts file changed"


def test_another_bench_is_said_without_what_follows_from_it() -> None:
    """A prompts bench's folder given to a HumanEval bench had been said to differ in the bench, the prompt
    format and the stop strings ('another ead version', which it was not) and the tasks file: the bench
    alone, with what differs beside it."""
    humaneval = {"bench": "humaneval", "stop": ["```"], "prompt": {"user": "u"}, "source_sha256": "a"}
    prompts = {"bench": "prompts", "stop": [], "prompt": {"chat_template": True}, "source_sha256": "b"}
    assert differing(humaneval, prompts) == "the bench (HumanEval or a prompts file)"
    assert differing(humaneval | {"max_tokens": 8}, prompts | {"max_tokens": 9}) == (
        "the bench (HumanEval or a prompts file), --max-tokens"
    )
    assert differing(humaneval, humaneval | {"stop": []}) == "the stop strings (another ead version)"


def test_gpu_layers_part_a_setup_where_llama_cpp_offloads_them(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """Where it cannot (a CPU build), --n-gpu-layers changes nothing, and a resume under another is let be."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    if gpu_offload_available():
        with pytest.raises(EadError, match=r"differs in: --n-gpu-layers\)"):
            run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, n_gpu_layers=0)
    else:
        assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, n_gpu_layers=5)) == 4


def test_a_results_file_from_before_threads_and_context_were_recorded_resumes(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A config without them (an older ead's) resumes as it did, unchecked there."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    config, *samples = path.read_text().splitlines()
    unrecorded = ("threads", "n_ctx", "cache_types", "flash_attn", "machine")
    older = {key: value for key, value in json.loads(config).items() if key not in unrecorded}
    path.write_text("\n".join([json.dumps(older), *samples]) + "\n")
    assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair, threads=2, flash_attn="on")) == 4
    assert json.loads(path.read_text().splitlines()[0]) == older


def test_a_results_file_from_before_the_time_limit_was_recorded_resumes_at_the_default(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A results file whose config lacks ``timeout_s`` (written before it was recorded, under the default)
    resumes at the default, and is refused under another limit."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    config, *samples = path.read_text().splitlines()
    older = {key: value for key, value in json.loads(config).items() if key != "timeout_s"}
    path.write_text("\n".join([json.dumps(older), *samples]) + "\n")
    run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)
    assert [json.loads(line)["task_id"] for line in path.read_text().splitlines()[1:]] == [
        "HumanEval/0",
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/1",
    ]
    with pytest.raises(EadError, match=r"differs in: --timeout"):
        run(humaneval_job(humaneval[:2], tmp_path, timeout_s=5.0), tiny_pair)


def test_a_results_file_from_before_mirostat_and_dry_resumes_with_them_off(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A config whose sampling lacks the samplers added since (Mirostat, DRY: off when it was written)
    resumes, and its runs are repeats of today's: a report over both had said 'differs in: --temp or
    --seed'."""
    run(humaneval_job(humaneval[:1], tmp_path / "old"), tiny_pair)
    path = tmp_path / "old" / "results.jsonl"
    config, *samples = path.read_text().splitlines()
    older = json.loads(config)
    older["sampling"] = {
        name: value for name, value in older["sampling"].items() if not name.startswith(("mirostat", "dry_"))
    }
    assert len(older["sampling"]) < len(json.loads(config)["sampling"])
    path.write_text("\n".join([json.dumps(older), *samples]) + "\n")
    assert len(run(humaneval_job(humaneval[:2], tmp_path / "old"), tiny_pair)) == 4
    assert json.loads(path.read_text().splitlines()[0]) == older
    run(humaneval_job(humaneval[:2], tmp_path / "new"), tiny_pair)
    result = ead("bench", "report", str(tmp_path / "new"), str(tmp_path / "old"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "new" / "median-of-2.md").exists()


def test_nowhere_to_write_and_nothing_to_write_are_refused_before_any_model_loads(
    tmp_path: Path, humaneval: list[Task]
) -> None:
    """Checked as the bench is made, before ``run_bench`` loads a model: one line each, exit 2. A FIFO
    where results.jsonl goes had been read for a resume, waiting for ever for a writer; a folder there had
    been said with exit 1."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "replayed").mkdir()
    (tmp_path / "replayed" / "replay.json").write_text("{}")
    (tmp_path / "piped").mkdir()
    os.mkfifo(tmp_path / "piped" / "results.jsonl")
    (tmp_path / "nested" / "results.jsonl").mkdir(parents=True)
    (tmp_path / "reported" / "report.md").mkdir(parents=True)  # said after every sample had run
    for out, max_tokens, message in (
        (tmp_path / "reported", 8, "cannot save the report to {tmp}/reported/report.md: it is a folder"),
        (tmp_path / "a-file", 8, "results to {tmp}/a-file/results.jsonl: {tmp}/a-file is not a folder"),
        (tmp_path / "piped", 8, "results.jsonl is not a file: a bench keeps its results in one;"),
        (tmp_path / "nested", 8, "nested/results.jsonl: it is a folder"),
        (tmp_path / "a-file" / "below", 8, "below/results.jsonl: {tmp}/a-file is not a folder"),
        (tmp_path / "replayed", 8, "holds a replay (replay.json): use another --out"),
        (tmp_path / "fine", 0, "--max-tokens must be at least 1, got 0"),
    ):
        with pytest.raises(EadError, match=re.escape(message.format(tmp=tmp_path))) as error:
            humaneval_job(humaneval[:1], out, max_tokens=max_tokens)
        assert error.value.exit_code == 2
    assert not (tmp_path / "replayed" / "results.jsonl").exists()


def test_a_bench_resumes_beside_the_replay_that_bench_replay_writes_there_by_default(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """``bench replay`` writes replay.json beside the results it replays: the bench's folder had then been
    refused as a replay's, so the bench could be neither resumed nor extended."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    (tmp_path / "replay.json").write_text("{}")
    assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json", "/tmp"], "cannot save the speed figures to /tmp: it is a folder"),  # "." is: given_file
        (["--json", "/proc/ead/figures.json"], "the speed figures to /proc/ead/figures.json: No such file"),
    ],
)
def test_bench_speeds_json_path_is_checked_before_the_measurement(args: list[str], message: str) -> None:
    result = subprocess.run(
        [EAD, "bench", "speed", "--small", "missing-small.gguf", "--large", "missing-large.gguf", *args],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.decode().startswith("error: ")
    assert message in result.stderr.decode() and "Traceback" not in result.stderr.decode()


def test_a_strategy_the_engine_refuses_stops_the_bench_before_any_model_loads() -> None:
    grid = sweep("1", "1", None, "10", "before", "4,100", None)
    with pytest.raises(EadError, match=r"draft must be in \[1, 64\], got 100") as error:
        build_strategies("small,spec", grid)
    assert error.value.exit_code == 2


@pytest.mark.parametrize(
    "edit",
    [
        lambda record: record.pop("task_id"),  # it had been a KeyError traceback as the models loaded
        lambda record: record.update(wall_s="x"),  # a TypeError in the report, after every new sample
        lambda record: record.update(passed="yes"),
        lambda record: record.update(models=5),  # an AttributeError traceback before any model loaded
        lambda record: record.update(wall_s=-1.0),  # values no bench writes: summed into the report as read
        lambda record: record.update(large_share=2),
        lambda record: record.update(switches=-1),
    ],
)
def test_a_damaged_sample_record_stops_a_resume_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task], edit: Callable[[Record], object]
) -> None:
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    config, first, *rest = path.read_text().splitlines()
    damaged = json.loads(first)
    edit(damaged)
    path.write_text("".join(f"{line}\n" for line in (config, json.dumps(damaged), *rest)))
    before = path.read_bytes()
    with pytest.raises(EadError, match=f"{re.escape(str(path))} holds a sample record ead cannot read"):
        humaneval_job(humaneval[:2], tmp_path)
    assert path.read_bytes() == before


def test_a_results_file_that_cannot_be_opened_to_append_is_one_line(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A dangling link as results.jsonl (to a folder that is not there): it had been a traceback."""
    (tmp_path / "results.jsonl").symlink_to(tmp_path / "gone" / "results.jsonl")
    path = re.escape(str(tmp_path / "results.jsonl"))
    with pytest.raises(EadError, match=f"cannot save the results to {path}: No such file or directory"):
        run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)


@pytest.fixture
def read_only(request: pytest.FixtureRequest) -> Callable[[Path], None]:
    """Makes a file no one may write to: root too (immutable), who may write any file whatever its mode."""

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
        elif subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
            request.addfinalizer(lambda: subprocess.run(["chattr", "-i", str(path)], check=True))
        else:
            pytest.skip("no immutable files here (chattr)")

    return make


def test_a_results_file_that_cannot_take_more_is_refused_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task], read_only: Callable[[Path], None]
) -> None:
    """A results.jsonl closed to writing in a folder open to it: found once the models had loaded."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    read_only(tmp_path / "results.jsonl")
    path = re.escape(str(tmp_path / "results.jsonl"))
    refused = f"^cannot save the results to {path}: (Operation not permitted|Permission denied)$"
    with pytest.raises(EadError, match=refused) as error:
        humaneval_job(humaneval[:2], tmp_path)
    assert error.value.exit_code == 2


def test_a_second_bench_on_the_same_folder_is_refused_while_the_first_runs(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """The same command in a second terminal had run the first one's pending samples again, its records
    interleaved with the first's (and a line the first was writing taken for one cut short)."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    config, _ = read_results(path)
    refused = f"^another bench is writing {re.escape(str(path))}: wait for it to end, or use another --out$"
    with Results(path, config):  # a bench running: before any model loads, and as its results open
        with pytest.raises(EadError, match=refused):
            humaneval_job(humaneval[:2], tmp_path)
        with pytest.raises(EadError, match=refused):
            Results(path, config)
    assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)) == 4


def test_a_resumed_bench_whose_models_fail_to_load_lets_its_results_go(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A resumed bench holds its results locked from its check into its run: a run that ends before they
    open lets them go, not only as the bench is dropped."""
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    job = humaneval_job(humaneval[:2], tmp_path)
    missing = tmp_path / "missing.gguf"
    with pytest.raises(EadError, match="not found"):
        run(job, (missing, missing))
    assert len(run(humaneval_job(humaneval[:2], tmp_path), tiny_pair)) == 4


def test_a_first_bench_whose_models_fail_to_load_leaves_nothing_behind(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    """A new --out is held from the bench's check by an empty results file: a bench that ends before it
    writes its config record takes the file away again, and the folders made for it, so that nothing
    looks like results; a folder that was there stays."""
    missing = tmp_path / "missing.gguf"
    new, given = tmp_path / "new" / "out", tmp_path / "given"
    given.mkdir()
    for out in (new, given):
        job = humaneval_job(humaneval[:1], out)
        assert (out / "results.jsonl").read_bytes() == b""  # held from the check on
        with pytest.raises(EadError, match="not found"):
            run(job, (missing, missing))
    assert not (tmp_path / "new").exists()
    assert list(given.iterdir()) == []
    assert len(run(humaneval_job(humaneval[:1], new), tiny_pair)) == 2


@pytest.mark.parametrize(
    ("stop", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"), (signal.SIGKILL, -9, None)],
    ids=["SIGINT", "SIGTERM", "SIGKILL"],
)
def test_a_first_bench_stopped_as_its_models_load_leaves_nothing_that_looks_like_results(
    tmp_path: Path, tiny_pair: tuple[Path, Path], stop: signal.Signals, code: int, said: str | None
) -> None:
    """A real bench stopped while it loads its models: Ctrl-C or SIGTERM end it in one line and leave no
    folder; killed outright, it leaves its empty results file, which ``bench report`` finds no samples in
    and the next run takes as new. Either way the same command then runs."""
    out = tmp_path / "new" / "out"
    args = ["bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    args += ["--threads", "1", "--strategies", "large", "--max-tokens", "4", "--ids", "0", "--out", str(out)]
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    bench = subprocess.Popen(
        [sys.executable, "-c", HELD_AT_LOADING, str(gate), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    try:
        writer = open_when_read(gate, bench)  # it is at its loading, its results held
        try:
            assert (out / "results.jsonl").read_bytes() == b""
            bench.send_signal(stop)
            _, err = bench.communicate(timeout=300)
        finally:
            os.close(writer)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == code and "Traceback" not in err.decode(), err.decode()
    if said is not None:
        assert err.decode().strip().splitlines()[-1] == f"error: {said}"
        assert not (tmp_path / "new").exists()
    else:
        assert (out / "results.jsonl").read_bytes() == b""
        report = subprocess.run([EAD, "bench", "report", str(out)], capture_output=True, timeout=300)
        assert_one_line_error(report, 2, f"no samples in {out / 'results.jsonl'}")
    again = subprocess.run([EAD, *args], capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()
    assert [record["task_id"] for record in read_results(out / "results.jsonl")[1]] == ["HumanEval/0"]


# ``python -c HELD_AT_LOADING GATE ARGS``: ead, its bench saying on stderr that its models load, and held
# there until GATE (a FIFO another process writes) ends: a bench between its check of the results and their
# opening. With /dev/null for GATE it is only said. It waits in short selects, not one blocking read: a
# SIGTERM once left that read blocked for 300 s (CI, Intel Xeon; not seen again in 100 runs, cause unproven).
# One way: a thread other than the main one takes the signal, and Python runs the handler only when the main
# thread next runs bytecode, which a select that times out does within 50 ms.
HELD_AT_LOADING = """
import select
import sys
from ead_cli.signals import main_thread_signals

with main_thread_signals():  # as ead's main imports numpy: OpenBLAS's threads must not take the signal
    from ead_cli.bench import run
from ead_cli.cli import main

load_runners = run.load_runners


def held(*args, **kwargs):
    print("loading the models", file=sys.stderr, flush=True)
    with open(sys.argv[1]) as gate:
        while not select.select([gate], [], [], 0.05)[0]:
            pass
        gate.read()
    return load_runners(*args, **kwargs)


run.load_runners = held
main(sys.argv[2:])
"""


def open_when_read(fifo: Path, reader: subprocess.Popen) -> int:
    """The FIFO's write end, once ``reader`` has opened it to read (ENXIO until then); the test failed with
    the reader's stderr if it ends first."""
    while True:
        with contextlib.suppress(OSError):  # ENXIO: no reader yet
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        if reader.poll() is not None:
            pytest.fail(reader.communicate()[1].decode())
        time.sleep(0.05)


@pytest.mark.parametrize("first_run", [False, True], ids=["a resume", "a first run"])
def test_a_second_bench_started_while_the_first_loads_its_models_is_refused_before_loading_its_own(
    tmp_path: Path, tiny_pair: tuple[Path, Path], first_run: bool
) -> None:
    """The check of a resumed bench's results locked the file and let it go, to lock it again once the
    models had loaded: a second bench on the same --out started between the two passed its check as well,
    loaded its models and ran the first one's pending samples. A first run into a new --out had no file to
    lock before its models loaded: the second was refused only once its own had loaded. The first is held
    at its loading by a FIFO it reads; the second, run alike, says so if it loads its models."""
    out = tmp_path / "out"
    args = ["bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    args += ["--threads", "1", "--strategies", "large", "--max-tokens", "4", "--out", str(out)]
    if not first_run:
        started = subprocess.run([EAD, *args, "--ids", "0"], capture_output=True, timeout=300)
        assert started.returncode == 0, started.stderr.decode()
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    first = subprocess.Popen(
        [sys.executable, "-c", HELD_AT_LOADING, str(gate), *args, "--ids", "0,1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        writer = open_when_read(gate, first)
        try:
            second = subprocess.run(
                [sys.executable, "-c", HELD_AT_LOADING, os.devnull, *args, "--ids", "0,1"],
                capture_output=True,
                timeout=300,
            )
        finally:
            os.close(writer)  # the first goes on
        _, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    path = out / "results.jsonl"
    assert_one_line_error(
        second, 2, f"another bench is writing {path}: wait for it to end, or use another --out"
    )
    assert first.returncode == 0, first_err.decode()
    assert first_err.decode().count("loading the models") == 1
    assert [record["task_id"] for record in read_results(path)[1]] == ["HumanEval/0", "HumanEval/1"]


def test_a_results_file_on_a_filesystem_without_locks_is_written_unlocked_with_a_warning(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    """NFS without its lock daemon or a FUSE filesystem refuses flock (ENOLCK, EOPNOTSUPP): the bench had
    ended in a traceback there. No such filesystem is at hand, so the child's flock alone raises as theirs
    does. The lock only stops a second bench on the same --out, so the bench runs on, and says that."""
    out = tmp_path / "out"
    args = ["bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    args += ["--threads", "1", "--ids", "0", "--strategies", "large", "--max-tokens", "4", "--out", str(out)]
    warning = (
        f"warning: cannot lock {out / 'results.jsonl'} (No locks available): nothing stops a second "
        "bench on the same --out"
    )
    for _ in ("a first run", "a resume"):  # a resume locks the file before the models load as well
        result = subprocess.run(
            [sys.executable, "-c", NO_LOCKS, *args], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count(warning) == 1, result.stderr
    assert [record["task_id"] for record in read_results(out / "results.jsonl")[1]] == ["HumanEval/0"]


def test_a_line_cut_short_by_a_kill_is_dropped_and_rerun(
    tmp_path: Path, tiny_pair: tuple[Path, Path], humaneval: list[Task]
) -> None:
    run(humaneval_job(humaneval[:1], tmp_path), tiny_pair)
    path = tmp_path / "results.jsonl"
    path.write_bytes(path.read_bytes()[:-40])
    plans: list[list[tuple[str, str]]] = []
    records = run(humaneval_job(humaneval[:1], tmp_path), tiny_pair, plans)
    assert plans == [[("large-only", "HumanEval/0")]]
    assert [r["strategy"] for r in records] == ["small-only", "large-only"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def write_results(path: Path, text: str) -> Path:
    """A hand-made results file: a config record of this format, then ``text``."""
    path.write_text(json.dumps({"type": "config", "format": 1}) + "\n" + text)
    return path


def test_blank_lines_in_a_results_file_are_skipped(tmp_path: Path) -> None:
    """An editor's blank or whitespace-only lines (a trailing newline pair) had refused the whole file."""
    sample = json.dumps({"type": "sample", "strategy": "large-only", "task_id": "t/0"})
    path = write_results(tmp_path / "results.jsonl", f"\n{sample}\n  \t\n\n")
    config, records = read_results(path)
    assert config is not None and [r["task_id"] for r in records] == ["t/0"]
    for damaged, number in ((f"{sample[:-5]}\n\n{sample}\n", 2), (f"\n {sample[:-5]}\n", 3)):
        with pytest.raises(EadError, match=f"line {number} is not JSON"):
            read_results(write_results(path, damaged))


def test_a_text_with_a_unicode_line_separator_reads_back_whole(tmp_path: Path) -> None:
    """Records are written unescaped (``ensure_ascii=False``): a text holding U+2028, U+0085 or a form
    feed had been split there as a line of its own, and the file refused as not JSON."""
    text = "a\u2028b\x85c\x0cd\x1ce"
    sample = {"type": "sample", "strategy": "large-only", "task_id": "t/0", "text": text}
    path = write_results(tmp_path / "results.jsonl", json.dumps(sample, ensure_ascii=False) + "\n")
    assert [r["text"] for r in read_results(path)[1]] == [text]


@pytest.mark.parametrize(
    ("figures", "field", "value"),
    [
        ('"wall_s": NaN', "wall_s", "nan"),
        ('"generated": -Infinity', "generated", "-inf"),
        ('"flops": 1e999', "flops", "inf"),  # past a float's range: read as infinite
        ('"models": {"large": {"decode_s": Infinity}}', "models.large.decode_s", "inf"),
    ],
)
def test_a_figure_that_is_not_finite_refuses_the_file_naming_its_line(
    tmp_path: Path, figures: str, field: str, value: str
) -> None:
    """A hand-made NaN or infinity had been summed into the report, which printed nan."""
    sample = f'{{"type": "sample", "strategy": "large-only", "task_id": "t/0", {figures}}}'
    path = write_results(tmp_path / "results.jsonl", f"{sample}\n")
    with pytest.raises(EadError) as refused:
        read_results(path)
    assert str(refused.value) == f"{path} line 2: {field} is {value}, not a finite number"


@pytest.mark.parametrize("line", ["NaN", "[1, Infinity]"])
def test_a_line_that_is_no_record_is_refused_as_such_even_holding_a_nan(tmp_path: Path, line: str) -> None:
    """A bare NaN had been refused as 'line 2:  is nan' (a field of no name), a list by its item."""
    path = write_results(tmp_path / "results.jsonl", f"{line}\n")
    with pytest.raises(EadError) as refused:
        read_results(path)
    assert str(refused.value) == f"{path} line 2 is not a record (a JSON object)"


STOP_AT_THE_SECOND_CHECK = """
import sys
from ead_cli.bench import run
from ead_cli.cli import main

checked = []
real = run.check_solution


def check_then_stop(*args, **kwargs):
    if checked:
        raise {stop}
    checked.append(1)
    return real(*args, **kwargs)


run.check_solution = check_then_stop
main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    ("stop", "code", "said"), [("KeyboardInterrupt", 130, "interrupted"), ("Terminated", 143, "terminated")]
)
def test_a_stopped_bench_says_which_samples_it_kept(
    tmp_path: Path, tiny_pair: tuple[Path, Path], stop: str, code: int, said: str
) -> None:
    small, large = tiny_pair
    args = [
        "bench",
        "humaneval",
        "--small",
        str(small),
        "--large",
        str(large),
        "--ids",
        "0",
        "--strategies",
        "small,large",
        "--max-tokens",
        "8",
        "--out",
        str(tmp_path),
    ]
    source = STOP_AT_THE_SECOND_CHECK.format(stop=stop)
    if stop == "Terminated":
        source = "from ead_cli.signals import Terminated\n" + source
    result = subprocess.run(
        [sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == code and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    results = tmp_path / "results.jsonl"
    assert f"kept 1 of the 2 samples to run in {results}: the same command resumes" in lines[-2]
    assert lines[-1] == f"error: {said}"
    assert [json.loads(line)["type"] for line in results.read_text().splitlines()] == ["config", "sample"]


def test_a_bench_of_one_sample_stopped_says_it_in_the_singular(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    """Stopped at its one sample's check: 'kept 0 of the 1 sample to run', counted as every count is said
    (it had said '0 of the 1 samples to run are kept')."""
    small, large = tiny_pair
    args = ["bench", "humaneval", "--small", str(small), "--large", str(large), "--ids", "0"]
    args += ["--strategies", "large", "--max-tokens", "8", "--out", str(tmp_path)]
    source = STOP_AT_THE_SECOND_CHECK.format(stop="KeyboardInterrupt").replace("if checked:", "if True:")
    result = subprocess.run(
        [sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 130 and "Traceback" not in result.stderr
    results = tmp_path / "results.jsonl"
    said = f"kept 0 of the 1 sample to run in {results}: the same command resumes"
    assert said in result.stderr.strip().splitlines()[-2]


def test_a_real_ctrl_c_mid_bench_keeps_whole_samples_and_the_same_command_runs_only_the_rest(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    """SIGINT sent to a real bench once its first samples are on disk, wherever it then is (a decode, a
    program under test, a write): exit 130, the samples it says it kept are whole records in the file, and
    the same command runs the others once each."""
    out = tmp_path / "out"
    args = ["bench", "humaneval", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    args += ["--threads", "1", "--strategies", "small,large", "--max-tokens", "16", "--ids", "0-15"]
    args += ["--out", str(out)]
    results = out / "results.jsonl"
    bench = subprocess.Popen([EAD, *args], stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        while bench.poll() is None and (not results.exists() or results.read_text().count("\n") < 3):
            time.sleep(0.05)
        bench.send_signal(signal.SIGINT)
        _, err = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 130 and "Traceback" not in err, err
    kept = re.search(r"kept (\d+) of the 32 samples to run in ", err)
    assert kept is not None and err.strip().splitlines()[-1] == "error: interrupted", err
    text = results.read_text()
    assert text.endswith("\n")
    _, records = read_results(results)
    assert len(records) == int(kept.group(1)) >= 2
    again = subprocess.run([EAD, *args], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{32 - len(records)}/{32 - len(records)}" in again.stderr  # the progress bar: the rest alone
    pairs = [(record["strategy"], record["task_id"]) for record in read_results(results)[1]]
    assert len(pairs) == len(set(pairs)) == 32


def test_a_prompts_file_is_read_once_so_a_pipe_gives_it(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    """The prompts were read, then the file read again after the models loaded, for its hash in the
    results' config: a named pipe, written once, had been waited on for ever for a second writer (and
    `<(...)` hashed as empty). Its one read gives both, so the run resumes from the same file's bytes."""
    text = "Say hi\nName a colour\n"
    fifo, file, out = tmp_path / "prompts.txt", tmp_path / "file" / "prompts.txt", tmp_path / "out"
    os.mkfifo(fifo)
    file.parent.mkdir()
    file.write_text(text)
    args = ["bench", "prompts", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    args += ["--strategies", "large", "--max-tokens", "2", "--out", str(out)]
    writer = subprocess.Popen(["sh", "-c", 'printf "$0" > "$1"', text, str(fifo)])
    piped = subprocess.run([EAD, *args[:2], str(fifo), *args[2:]], capture_output=True, timeout=120)
    writer.wait(timeout=120)
    assert piped.returncode == 0, piped.stderr.decode()
    resumed = subprocess.run([EAD, *args[:2], str(file), *args[2:]], capture_output=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr.decode()  # the same bytes: the same config, no refusal
    samples = read_results(out / "results.jsonl")[1]
    assert [record["task_id"] for record in samples] == ["prompt/0", "prompt/1"]


def test_prompt_lists_measure_agreement_with_the_large_model(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hi\nName a colour\n")
    strategies = build_strategies("small,large", Grid())
    job = prompts_bench(
        prompts,
        strategies,
        sampling=SamplingParams(),
        max_tokens=12,
        out=tmp_path,
    )
    records = run(job, tiny_pair)
    assert [r["task_id"] for r in records] == ["prompt/0"] * 2 + ["prompt/1"] * 2
    assert all(r["passed"] is None and r["code"] is None for r in records)
    small, large = aggregate(records)
    assert large.agreement == 1.0 and large.pass_at_1 is None
    texts = {(r["strategy"], r["task_id"]): r["text"] for r in records}
    expected = [agreement(texts["small-only", t], texts["large-only", t]) for t in ("prompt/0", "prompt/1")]
    assert small.agreement == pytest.approx(sum(expected) / 2)
    assert small.agreement < 1.0  # the tiny models were written from different seeds


# ----------------------------------------------------------------------------------------- figures


def record(
    strategy: str, task: str, *, passed: bool | None, generated: int, large_share: float, **extra
) -> dict:
    """A hand-written sample record: large model 3x the small one's parameters."""
    written_large = round(generated * large_share)
    base = {
        "strategy": strategy,
        "task_id": task,
        "passed": passed,
        "generated": generated,
        "large_share": large_share,
        "param_cost": (generated - written_large + 3 * written_large) / (3 * generated),
        "switches": 0,
        "acceptance_rate": None,
        "text": "a b c d",
        "models": {
            role: {"prefill_s": 0.5, "decode_s": 1.0, "catchup_s": 0.25} for role in ("small", "large")
        },
    }
    return base | extra


RECORDS = [
    record("large-only", "t/0", passed=True, generated=10, large_share=1.0, flops=100.0, wall_s=2.0),
    record("large-only", "t/1", passed=False, generated=30, large_share=1.0, flops=300.0, wall_s=6.0),
    record("ead", "t/0", passed=True, generated=20, large_share=0.5, flops=80.0, wall_s=1.0, switches=2),
    record(
        "ead",
        "t/1",
        passed=True,
        generated=20,
        large_share=0.25,
        flops=40.0,
        wall_s=3.0,
        switches=5,
        text="a b x d",
    ),
    record(
        "spec", "t/0", passed=False, generated=5, large_share=1.0, flops=10.0, wall_s=1.0, acceptance_rate=0.5
    ),
    record(
        "spec", "t/1", passed=False, generated=5, large_share=1.0, flops=10.0, wall_s=1.0, acceptance_rate=1.0
    ),
]


def test_the_aggregate_figures() -> None:
    large, ead, spec = aggregate(RECORDS)
    assert (large.strategy, large.samples, large.pass_at_1, large.agreement) == ("large-only", 2, 0.5, 1.0)
    assert (large.flops_rel, large.wall_rel, large.param_cost) == (1.0, 1.0, 1.0)
    assert ead.pass_at_1 == 1.0
    # Token-weighted: (20 x 0.5 + 20 x 0.25) / 40 large tokens.
    assert ead.large_share == pytest.approx(0.375)
    assert ead.param_cost == pytest.approx((15 + 3 * 5 + 10 + 3 * 10) / (3 * 40))
    assert ead.agreement == pytest.approx((1.0 + 0.75) / 2)  # 3 of 4 words in place: 2 x 3 / 8
    assert (ead.flops, ead.flops_rel) == (120.0, pytest.approx(0.3))
    assert (ead.wall_s, ead.wall_rel) == (4.0, pytest.approx(0.5))
    assert ead.tokens_per_s == pytest.approx(10.0)
    assert ead.switches == 3.5
    assert ead.acceptance_rate is None and spec.acceptance_rate == 0.75
    assert ead.model_s == {
        "small_prefill_s": 1.0,
        "small_decode_s": 2.0,
        "small_catchup_s": 0.5,
        "large_prefill_s": 1.0,
        "large_decode_s": 2.0,
        "large_catchup_s": 0.5,
    }


def test_a_bench_cut_short_is_set_against_large_only_on_the_same_tasks() -> None:
    """Cut short mid-task, large-only has run t/1 and ead has not: ead's ratios are over t/0 alone."""
    cut = [r for r in RECORDS if (r["strategy"], r["task_id"]) != ("ead", "t/1")]
    _, ead, _ = aggregate(cut)
    assert (ead.wall_s, ead.wall_rel) == (1.0, pytest.approx(1.0 / 2.0))  # not 1 s against 8 s
    assert (ead.flops, ead.flops_rel) == (80.0, pytest.approx(80.0 / 100.0))


def test_without_large_only_there_are_no_relative_figures() -> None:
    (ead,) = aggregate([r for r in RECORDS if r["strategy"] == "ead"])
    assert ead.flops_rel is ead.wall_rel is ead.agreement is None
    headers, rows = report_table([ead])
    # Columns no strategy has a value for are left out; a missing value in a kept column is "-".
    assert headers == [
        "strategy",
        "n",
        "pass@1",
        "large share",
        "param cost",
        "TFLOP",
        "wall s",
        "tok/s",
        "switches",
    ]
    headers, rows = report_table(aggregate(RECORDS))
    assert [row[headers.index("FLOPs vs large")] for row in rows] == ["1.00", "0.30", "0.05"]
    assert [row[headers.index("acceptance")] for row in rows] == ["-", "-", "75.0%"]


def test_rollbacks_are_a_count_where_a_strategy_takes_tokens_back_and_not_applicable_elsewhere() -> None:
    """The rollbacks column had shown "-" for 0, which is a count where the strategy takes written
    tokens back (--verify, a lookahead policy) and rejected none; "-" is for one that takes none back."""

    def taking_back(strategy: str, params: dict, rollbacks: tuple[int, int]) -> list[dict]:
        return [
            record(
                strategy,
                task,
                passed=True,
                generated=10,
                large_share=0.5,
                flops=1.0,
                wall_s=1.0,
                params=params,
                rollbacks=count,
            )
            for task, count in zip(("t/0", "t/1"), rollbacks, strict=True)
        ]

    gate = {"mode": "ead", "policy": "gate", "verify": None}
    records = [
        *RECORDS,
        *taking_back("gate tau=1", gate, (0, 0)),
        *taking_back("gate tau=1 verify=0.1", gate | {"verify": 0.1}, (0, 0)),
        *taking_back("lookahead tau=1", gate | {"policy": "lookahead"}, (2, 1)),
    ]
    headers, rows = report_table(aggregate(records))
    shown = {row[0]: row[headers.index("rollbacks")] for row in rows}
    assert shown == {
        "large-only": "-",
        "ead": "-",
        "spec": "-",
        "gate tau=1": "-",
        "gate tau=1 verify=0.1": "0.00",
        "lookahead tau=1": "1.50",
    }
    headers, _ = report_table(aggregate(RECORDS))
    assert "rollbacks" not in headers


def test_the_report_files_hold_the_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    aggregates = aggregate(RECORDS)
    files = write_report(tmp_path, aggregates)
    with open(files.csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["strategy"] for row in rows] == ["large-only", "ead", "spec"]
    ead = rows[1]
    assert float(ead["pass_at_1"]) == 1.0 and float(ead["large_share"]) == 0.375
    assert float(ead["wall_rel"]) == 0.5 and float(ead["flops"]) == 120.0
    assert float(ead["large_decode_s"]) == 2.0 and ead["acceptance_rate"] == ""
    assert float(rows[2]["acceptance_rate"]) == 0.75
    markdown = files.markdown.read_text().splitlines()
    assert markdown[0].startswith("| strategy | n | pass@1 | agreement | large share | param cost |")
    assert markdown[1].startswith("| --- | ---: |")
    assert markdown[3].startswith("| ead | 2 | 100.0% | 0.875 | 37.5% | 0.583 |")
    assert files.plot == tmp_path / "plot.png" and files.note is None
    assert files.plot.read_bytes().startswith(b"\x89PNG")


def test_a_folder_where_a_report_file_goes_is_refused_before_any_is_written(tmp_path: Path) -> None:
    """report.md a folder: report.csv had been written before the failure, a report of one file."""
    (tmp_path / "report.md").mkdir()
    message = f"cannot save the report to {tmp_path / 'report.md'}: it is a folder"
    with pytest.raises(EadError, match=re.escape(message)):
        write_report(tmp_path, aggregate(RECORDS))
    assert [path.name for path in tmp_path.iterdir()] == ["report.md"]


def test_a_ctrl_c_while_the_plot_is_written_leaves_the_old_plot_whole(tmp_path: Path) -> None:
    """Tripped as the PNG writer's second chunk is out: the plot had been cut there (103 bytes of it)."""
    pytest.importorskip("matplotlib")
    png = pytest.importorskip("PIL.PngImagePlugin")
    whole = write_report(tmp_path, aggregate(RECORDS)).plot
    assert whole is not None
    before = whole.read_bytes()
    with ctrl_c_at_return(png.putchunk.__code__, 2) as chunks:
        write_report(tmp_path, aggregate(RECORDS[:-1]))
    assert len(chunks) >= 2 and whole.read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plot.png", "report.csv", "report.md"]


def test_repeats_give_each_strategy_its_median_ratio_with_the_range_fastest_first() -> None:
    def scaled(factor: float) -> list[dict]:
        """A repeat in which ead took ``factor`` times as long and spec did not run."""
        return [
            r | {"wall_s": r["wall_s"] * factor} if r["strategy"] == "ead" else r
            for r in RECORDS
            if r["strategy"] != "spec"
        ]

    table = repeats_table([aggregate(RECORDS), aggregate(scaled(2.0)), aggregate(scaled(1.25))])
    assert table.splitlines() == [
        "| strategy | wall vs large-only, median (range) | runs | passed | same text |",
        "| --- | ---: | ---: | ---: | ---: |",
        "| spec | 0.25 (0.25-0.25) | 1 | 0 | 2 |",
        "| ead | 0.62 (0.50-1.00) | 3 | 2/2/2 | 1/1/1 |",  # ratios 0.5, 1.0 and 0.625
        "| large-only | 1.00 (1.00-1.00) | 3 | 1/1/1 | 2/2/2 |",
    ]


def test_repeats_count_the_passing_samples_themselves() -> None:
    """A sample left unjudged (passed null) had made the passes round(pass@1 x samples): 1 of 2 judged
    over 3 samples read as 2 passes."""
    one_unjudged = [
        record("ead", f"t/{task}", passed=passed, generated=4, large_share=0.5, flops=1.0, wall_s=1.0)
        for task, passed in enumerate((True, None, False))
    ]
    (ead,) = aggregate(one_unjudged)
    assert (ead.samples, ead.pass_at_1, ead.passed) == (3, 0.5, 1)
    assert "| ead | - | 1 | 1 | - |" in repeats_table([[ead]]).splitlines()


def test_a_strategy_is_held_to_its_tasks_in_the_first_run_that_has_it() -> None:
    """Repeats are checked task set by task set against the first run holding the strategy, not only the
    first run: a strategy missing from it had been medianed over a whole run and one cut short."""
    large = [r for r in RECORDS if r["strategy"] == "large-only"]
    whole = [r for r in RECORDS if r["strategy"] != "spec"]
    cut = [*large, *(r for r in whole if (r["strategy"], r["task_id"]) == ("ead", "t/0"))]
    with pytest.raises(EadError, match=r"^c ran ead on other tasks than b: not a repeat$") as refused:
        check_repeats([(Path("a"), {}, large), (Path("b"), {}, whole), (Path("c"), {}, cut)])
    assert refused.value.exit_code == 2
    check_repeats([(Path("a"), {}, large), (Path("b"), {}, whole), (Path("c"), {}, whole)])


def test_a_median_over_fewer_runs_than_the_strategy_ran_in_says_over_how_many() -> None:
    """A run without large-only gives no ratio: the median had read as one over every run counted."""
    alone = [r for r in RECORDS if r["strategy"] == "ead"]
    table = repeats_table([aggregate(RECORDS), aggregate(alone), aggregate(RECORDS)])
    assert "| ead | 0.50 (0.50-0.50) over 2 | 3 | 2/2/2 | 1/-/1 |" in table.splitlines()
    table = repeats_table([aggregate(RECORDS), aggregate(alone)])
    assert "| ead | 0.50 (0.50-0.50) over 1 | 2 | 2/2 | 1/- |" in table.splitlines()


def test_without_matplotlib_the_plot_is_skipped_with_a_note(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what a missing package raises
    files = write_report(tmp_path, aggregate(RECORDS))
    assert files.plot is None and not (tmp_path / "plot.png").exists()
    assert files.note == "matplotlib is not installed (pip install 'ead-cli[plot]'): no plot"
    assert files.csv.exists() and files.markdown.exists()


# -------------------------------------------------------------------------------------- command line


def ead(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"}
    return subprocess.run([EAD, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("spelling", ["--ead-tau", "--tau"])
def test_the_bench_names_each_policys_threshold_by_the_policy(spelling: str) -> None:
    """--ead-tau beside --gate-tau and --lookahead-tau (the older --tau still parses)."""
    result = ead("bench", "humaneval", "--strategies", "ead", spelling, "-1")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: --ead-tau: -1 is below 0 or not finite\n"


@pytest.mark.parametrize("spelling", ["--draft-entropy-stop", "--draft-stop"])
def test_the_bench_takes_generates_name_for_the_draft_entropy_stop(spelling: str) -> None:
    """One name per option across commands: ead generate's --draft-entropy-stop (the older --draft-stop
    still parses), checked before any model loads."""
    result = ead("bench", "humaneval", "--strategies", "spec", spelling, "-1")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: --draft-entropy-stop: -1 is below 0 or not finite\n"


def test_bench_humaneval_end_to_end(tmp_path: Path, tiny_pair: tuple[Path, Path]) -> None:
    out = tmp_path / "out"
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    result = ead("bench", "humaneval", "--ids", "0,1", *models, "--max-tokens", "16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "pass@1" in result.stdout and "ead tau=0.125" in result.stdout
    assert "18/18" in result.stderr  # the progress bar: 9 strategies x 2 tasks
    # as root with a Python nobody cannot run (this venv's, if under /root), the bench says so once
    assert result.stderr.count("note: the programs run as root") == (sandbox_note() is not None)
    config, records = read_results(out / "results.jsonl")
    assert config["max_tokens"] == 16 and config["stop"] == ["```"]
    assert config["models"]["small"]["file"] == tiny_pair[0].name
    assert len(records) == 18
    assert {r["task_id"] for r in records} == {"HumanEval/0", "HumanEval/1"}
    assert all(r["passed"] is False and r["outcome"] == "failed" for r in records)
    assert all(1 <= r["generated"] <= 16 for r in records)
    with open(out / "report.csv", newline="") as handle:
        rows = {row["strategy"]: row for row in csv.DictReader(handle)}
    assert len(rows) == 9
    assert all(row["samples"] == "2" and float(row["pass_at_1"]) == 0.0 for row in rows.values())
    assert float(rows["small-only"]["large_share"]) == 0.0 and float(rows["large-only"]["large_share"]) == 1.0
    assert float(rows["large-only"]["wall_rel"]) == 1.0
    assert (
        float(rows["spec"]["agreement"]) == 1.0
    )  # greedy speculative decoding writes the large model's text
    assert rows["spec"]["acceptance_rate"] != "" and rows["ead tau=1"]["acceptance_rate"] == ""
    for name, row in rows.items():
        mine = [r for r in records if r["strategy"] == name]
        assert float(row["wall_s"]) == pytest.approx(sum(r["wall_s"] for r in mine))
        assert int(row["generated"]) == sum(r["generated"] for r in mine)
    assert (out / "report.md").read_text().count("\n") == 11
    assert (out / "plot.png").exists() or "matplotlib is not installed" in result.stderr

    again = ead("bench", "report", str(out))
    assert again.returncode == 0, again.stderr
    assert again.stdout == result.stdout
    assert_repeats_are_checked(out, tmp_path)


def test_a_bench_over_part_of_its_folder_reports_every_sample_the_folder_holds(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    """A bench of fewer tasks or strategies than its --out holds had rewritten the folder's report with
    its own samples alone: report.csv disagreed with results.jsonl (and with ``bench report`` of it), and
    a strategy added to a folder lost the large-only already there, its figures relative to none."""
    out = tmp_path / "out"
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    common = [*models, "--max-tokens", "8", "--out", str(out)]
    first = ead("bench", "humaneval", "--ids", "0,1", "--strategies", "small,large", *common)
    assert first.returncode == 0, first.stderr
    added = ead("bench", "humaneval", "--ids", "1", "--strategies", "spec", *common)
    assert added.returncode == 0, added.stderr
    _, records = read_results(out / "results.jsonl")
    with open(out / "report.csv", newline="") as handle:
        rows = {row["strategy"]: row for row in csv.DictReader(handle)}
    assert {name: int(row["samples"]) for name, row in rows.items()} == {
        "small-only": 2, "large-only": 2, "spec": 1,
    }  # fmt: skip
    for name, row in rows.items():
        assert float(row["wall_s"]) == pytest.approx(
            sum(r["wall_s"] for r in records if r["strategy"] == name)
        )
    large_on_1 = next(r for r in records if r["strategy"] == "large-only" and r["task_id"] == "HumanEval/1")
    assert float(rows["spec"]["wall_rel"]) == pytest.approx(
        float(rows["spec"]["wall_s"]) / large_on_1["wall_s"]
    )
    report = ead("bench", "report", str(out))
    assert report.returncode == 0, report.stderr
    assert added.stdout == report.stdout


def assert_repeats_are_checked(out: Path, tmp_path: Path) -> None:
    """``bench report`` takes true repeats only (one setup, each strategy on the same tasks, distinct
    folders), and a damaged results file is one line naming it."""
    lines = (out / "results.jsonl").read_text().splitlines()
    config = json.loads(lines[0])

    def variant(name: str, kept: list[str]) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(f"{line}\n" for line in kept))
        return str(tmp_path / name)

    repeat = variant("repeat", lines)
    moved = {**config["machine"], "cpus": 64}  # the same bench on a bigger machine: not a repeat
    (tmp_path / "nothing").mkdir()
    assert ead("bench", "report", str(out), repeat).returncode == 0
    # the median table says the machine its runs were timed on, from the files
    assert machine_words(config["machine"]) in (out / "median-of-2.md").read_text().splitlines()[2]
    unrecorded = {key: value for key, value in config.items() if key != "machine"}  # an older ead's file
    older = variant("older", [json.dumps(unrecorded), *lines[1:]])
    assert ead("bench", "report", older, repeat).returncode == 0
    elsewhere = variant("elsewhere", [json.dumps({**config, "machine": moved}), *lines[1:]])
    for folders, message in (
        ([str(out), str(out)], "a folder is given twice"),
        ([str(out), variant("longer", [json.dumps({**config, "max_tokens": 32}), *lines[1:]])],
         "(differs in: --max-tokens)"),
        ([str(out), variant("fewer", lines[:-1])], "on other tasks than"),
        ([str(out), elsewhere], "(differs in: the machine (its CPU, its cores, or --repack/--no-repack))"),
        # an older file first: the runs after it are still held to one machine
        ([older, repeat, elsewhere],
         f"{elsewhere}/results.jsonl is not a repeat of {repeat}/results.jsonl (differs in: the machine"),
        ([variant("damaged", [*lines, '{"type": "sample", "strategy": "x"}'])],
         "holds a sample record ead cannot read (KeyError"),
        ([variant("models", [*lines[:-1], json.dumps({**json.loads(lines[-1]), "models": 5})])],
         "holds a sample record ead cannot read (AttributeError"),  # it had been a traceback
        ([variant("listed", [*lines, "[1, 2]"])], f"line {len(lines) + 1} is not a record"),
        ([str(tmp_path / "no-such")], "no-such is not a folder"),
        ([str(out / "results.jsonl")], "results.jsonl is not a folder"),
        # an empty folder had been "no samples in FOLDER/results.jsonl", a file it does not hold
        ([str(tmp_path / "nothing")], "nothing holds no results.jsonl or replay.json"),
        ([str(out), str(tmp_path / "nothing")], "nothing holds no results.jsonl or replay.json"),
    ):  # fmt: skip
        refused = ead("bench", "report", *folders)
        assert refused.returncode != 0 and refused.stderr.startswith("error: "), refused.stderr
        assert message in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["humaneval", "--out", ""], "'--out'"),
        (["prompts", "prompts.txt", "--out", ""], "'--out'"),
        (["prompts", ""], "'FILE'"),  # had been "cannot read .: Is a directory"
        (["replay", ""], "'RESULTS'"),
        (["replay", "results.jsonl", "--out", ""], "'--out'"),
        (["speed", "--json", ""], "'--json'"),
        (["speed", "--check", ""], "'--check'"),
        (["report", "bench-results", ""], "'FOLDERS...'"),
    ],
)
def test_an_empty_path_is_refused_naming_the_option(tmp_path: Path, args: list[str], named: str) -> None:
    """'' had meant the current folder (Path('') is '.'): results written or read there unasked. Not
    'give . for the current folder' either: --json and --check name a file."""
    models = ["--small", "missing-small.gguf", "--large", "missing-large.gguf"]
    result = subprocess.run(
        [EAD, "bench", *args, *(models if args[0] != "report" else [])],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: Invalid value for {named}: an empty path names no file or")
    assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("config", "what"), [({"format": 2}, "format 2"), ({}, "no format")])
def test_results_of_another_format_are_refused(tmp_path: Path, config: Record, what: str) -> None:
    """A results file another version of ead wrote (its config's format) had been reported as this one's:
    its records may mean other things under the same keys. One line; no report written."""
    sample = {"type": "sample", "strategy": "large-only", "task_id": "t/0"}
    records = [{"type": "config", **config}, sample]
    (tmp_path / "results.jsonl").write_text("".join(f"{json.dumps(record)}\n" for record in records))
    result = ead("bench", "report", str(tmp_path))
    assert (result.returncode, result.stdout) == (1, "")
    path = tmp_path / "results.jsonl"
    assert result.stderr == f"error: {path} holds results of {what}; this ead reads format 1\n"
    assert sorted(tmp_path.iterdir()) == [path]


def test_a_pipe_in_place_of_the_results_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A pipe named results.jsonl had been read (and, to resume, opened to append) until a writer (a
    reader) came: bench report and a bench on that --out hung for ever. One line, before any model loads."""
    path = tmp_path / "results.jsonl"
    os.mkfifo(path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    expected = f"error: {path} is not a file: a bench keeps its results in one; move it away\n"
    for args in (["report", str(tmp_path)], ["prompts", str(prompts), "--out", str(tmp_path)]):
        result = ead("bench", *args)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", expected)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split", "three"], "--split must be one of even, odd, all"),
        (["--ids", "1,3", "--split", "even"], "no tasks selected"),
        (["--tau", "0.5,,1"], "--ead-tau: '' is not a valid value"),
        (["--strategies", "ead,fast"], "--strategies: 'fast' is not one of"),
        (["--strategies", "gate", "--window", "3"], "--window is given, but no strategy of --strategies"),
        (["--timeout", "0"], "--timeout must be above 0 and at most 86400 seconds, got 0.0"),
        (["--timeout", "inf"], "--timeout must be above 0 and at most 86400 seconds, got inf"),
        (["--timeout", "1e300"], "at most 86400 seconds"),  # with inf: a traceback after the first answer
        (["--max-tokens", "-1"], "--max-tokens must be at least 1, got -1"),  # answers are measured
    ],
)
def test_bad_bench_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = ead("bench", "humaneval", *args, "--out", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_a_long_bad_value_is_echoed_cut_to_a_readable_length(tmp_path: Path) -> None:
    """A 100 kB bad value of a bench option had been echoed whole in its error line, as the other
    commands' no longer are: cut to 80 characters, its full length said."""
    junk = "x" * 100_000
    cut = f"{junk[:80]!r}... (100000 characters)"
    for args, fragment in [
        (["--split", junk], f"got {cut}"),
        (["--ids", junk], f"--ids: {cut} is not a number"),
        (["--tau", junk], f"--ead-tau: {cut} is not a valid value"),
        (["--switch-point", junk], f"--switch-point: {cut} is not one of"),
        (["--strategies", junk], f"--strategies: {cut} is not one of"),
        (["--strategies", "server-ngram", "--server-ngram", junk], f"--server-ngram: {cut} is not one of"),
    ]:
        result = ead("bench", "humaneval", *args, "--out", str(tmp_path))
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert fragment in line and len(line) < 300, line


def test_a_range_of_ids_past_the_last_task_is_refused_without_counting_it_out() -> None:
    """A typo's end (an extra digit, twenty of them) is named as the first task missing; every number of
    the range had been put in a set first, which took all memory until the kernel killed the bench."""

    def three_gibibytes_at_most() -> None:  # a regression ends in a MemoryError, not the machine's memory
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))

    result = subprocess.run(
        [EAD, "bench", "humaneval", "--small", "missing.gguf", "--large", "missing.gguf",
         "--ids", "160-99999999999999999999"],
        capture_output=True, text=True, timeout=120, preexec_fn=three_gibibytes_at_most,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: --ids: no task 164 (the tasks are 0-163)\n"


# ------------------------------------------------------------------------- server strategies, no server


def unusable_server(cache: Path, content: str, mode: int) -> Path:
    """A file where ``scripts/build_llama_server.sh`` puts llama-server, under the cache root EAD_CACHE
    names, that cannot run as one."""
    binary = cache / built_server().relative_to(built_server().parents[2])
    binary.parent.mkdir(parents=True)
    binary.write_text(content)
    binary.chmod(mode)
    return binary


def test_a_server_binary_that_is_not_executable_is_one_line_before_any_model_loads(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    binary = unusable_server(tmp_path / "cache", "#!/bin/sh\n", 0o644)
    models = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    out = tmp_path / "out"
    args = ["bench", "humaneval", "--ids", "1", *models, "--strategies", "server-large", "--out", str(out)]
    env = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"}
    env["EAD_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run([EAD, *args], capture_output=True, env=env)
    assert_one_line_error(result, 1, f"llama-server at {binary} cannot run (not executable)", "build_llama")
    assert not out.exists()


def test_a_server_binary_the_system_cannot_run_is_one_line(
    tmp_path: Path, tiny_large: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file with the execute bit that is no program (a build cut short, another machine's binary): the
    system's reason, not an OSError's traceback."""
    binary = unusable_server(tmp_path / "cache", "not a program\n", 0o755)
    monkeypatch.setenv("EAD_CACHE", str(tmp_path / "cache"))
    expected = rf"^cannot start llama-server at {re.escape(str(binary))}: Exec format error$"
    with pytest.raises(EadError, match=expected), native.llama_server(tiny_large, [], tmp_path / "log"):
        pass


@pytest.mark.parametrize(
    ("command", "limit", "out"),
    [
        ("humaneval", "Run at most this many tasks.", "(default: bench-results/humaneval-SPLIT)."),
        ("prompts", "Run the file's first N prompts alone.", "(default: bench-results/prompts-STEM, STEM"),
    ],
)
def test_each_bench_helps_with_its_own_limit_and_folder(command: str, limit: str, out: str) -> None:
    """bench prompts' help had said its --limit ran 'this many tasks' and named humaneval's folder beside
    its own; each command says what it runs and where it writes."""
    shown = " ".join(help_text(("bench", command)).replace("│", " ").split())  # rich's panels, if drawn
    assert limit in shown and out in shown
    assert ("humaneval" in shown) == (command == "humaneval")

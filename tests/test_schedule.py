"""Recorded schedules, their replay on other models, and the cost model of ``ead bench speed``.

Real llama.cpp on the tiny models: every strategy's schedule, re-executed, must leave each model's
cache exactly as the generation left it and read exactly the recorded tokens per phase.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import EAD, assert_one_line_error, ead, ead_to_a_closed_pipe
from tiny_models import MIDDLE_ENTROPY_BITS, write_tiny_model

from ead_cli.bench import replay, schedule, speed
from ead_cli.bench.report import PHASES
from ead_cli.bench.results import RESULTS_FILE, read_results
from ead_cli.engine import build_decoder
from ead_cli.errors import EadError, quoted
from ead_cli.hardware import machine_words, repack_choice, this_cpu
from ead_cli.options import GenerationOptions, PolicyOptions
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPT = "def fibonacci(n):\n    # the n-th Fibonacci number, 日本"
MIDDLE = MIDDLE_ENTROPY_BITS
STRATEGIES = {
    "large": PolicyOptions(mode="large"),
    "gate": PolicyOptions("ead", "gate", tau=MIDDLE),
    "gate verify": PolicyOptions("ead", "gate", tau=MIDDLE, verify=0.5),
    "lookahead": PolicyOptions("ead", "lookahead", tau=MIDDLE, draft=4),
    "ead": PolicyOptions("ead", "ead", tau=MIDDLE, window=2, min_run=3),
    "spec": PolicyOptions(mode="spec", draft=4),
    "large lookup": PolicyOptions(mode="large", lookup=1),
    "gate verify lookup": PolicyOptions("ead", "gate", tau=MIDDLE, verify=0.5, lookup=1),
    "spec lookup": PolicyOptions(mode="spec", draft=4, lookup=2),
}


@pytest.fixture
def open_runners() -> Iterator:
    opened: list[Runner] = []

    def open_models(*paths: Path, n_ctx: int = 512, n_batch: int = 512) -> list[Runner]:
        runners = [
            Runner(path, name=role, n_ctx=n_ctx, n_threads=1, n_batch=n_batch)
            for path, role in zip(paths, ("small", "large"), strict=True)
        ]
        opened.extend(runners)
        return runners

    yield open_models
    for runner in opened:
        runner.close()


def record(
    runners: list[Runner], policy: PolicyOptions, max_tokens: int = 60
) -> tuple[list, list[int], list]:
    """A generation from cold caches: its schedule, its final token list, each model's reads per phase."""
    for runner in runners:
        runner.truncate(0)
    decoder = build_decoder(runners, policy, GenerationOptions(SamplingParams(), max_tokens))
    with schedule.ScheduleRecorder(runners) as recorder:
        list(decoder.run(encode_prompt(runners[0], PROMPT)))
    counts = [(r.stats.prefill.tokens, r.stats.decode.tokens, r.stats.catchup.tokens) for r in runners]
    return recorder.steps, list(decoder.tokens), counts


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("n_batch", [512, 8])  # 8: feeds longer than a batch run in parts
def test_a_replay_leaves_every_cache_as_the_generation_did(
    open_runners, tiny_pair: tuple[Path, Path], name: str, n_batch: int
) -> None:
    runners = open_runners(*tiny_pair, n_batch=n_batch)
    steps, tokens, counts = record(runners, STRATEGIES[name])
    assert schedule.check_schedule(steps, 2) == steps
    ends = [runner.n_past for runner in runners]
    json.loads(json.dumps(steps))  # it travels as JSON in the results file

    fresh = open_runners(*tiny_pair, n_batch=n_batch)
    _, stats = schedule.replay(fresh, steps)
    assert [(s.prefill.tokens, s.decode.tokens, s.catchup.tokens) for s in stats] == counts
    assert [runner.n_past for runner in fresh] == ends
    for runner in fresh:  # every cached position holds the token the generation left there
        assert runner.align(tokens) == runner.n_past


def test_rollbacks_and_merged_decodes_are_in_the_schedule(open_runners, tiny_pair: tuple[Path, Path]) -> None:
    runners = open_runners(*tiny_pair)
    lookahead, _, _ = record(runners, STRATEGIES["lookahead"])
    assert any(step[1] == "t" for step in lookahead)  # spans taken back
    large, _, counts = record(runners, STRATEGIES["large"], max_tokens=20)
    # The prompt (prefill), then 19 one-token decodes merged into one step: 20 tokens, the last unread.
    assert [step[:2] for step in large] == [[1, "p"], [1, "d"]]
    assert len(large[1][3]) == 19 == counts[1][1]
    assert large[1][2] == large[0][2] + len(large[0][3])


def test_a_schedule_replays_on_other_models_of_the_tokenizer(
    open_runners, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Another large model (other weights, sharper outputs) pays every recorded batch."""
    steps, _, counts = record(open_runners(*tiny_pair), STRATEGIES["gate"])
    other = write_tiny_model(tmp_path / "other.gguf", seed=9, logit_scale=8.0)
    _, stats = schedule.replay(open_runners(tiny_pair[0], other), steps)
    assert [(s.prefill.tokens, s.decode.tokens, s.catchup.tokens) for s in stats] == counts


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ({"a": 1}, "not a list of steps"),
        ([[0, "x", 0, [1], 1]], "step 0 is malformed"),
        ([[2, "d", 0, [1], 1]], "step 0 is malformed"),  # model 2 of a pair
        ([[0, "p", 0, [], 1]], "step 0 is malformed"),
        ([[0, "c", 0, [1, 2], 3]], "step 0 is malformed"),  # more rows than tokens
        ([[0, "p", 0, [1], 1], [1, "t", -1]], "step 1 is malformed"),
        ([[0, "p", 0, [1, 2], 1], [0, "d", 3, [1], 1]], "step 1 starts at position 3, where model 0 has"),
        ([[0, "p", 0, [1, 2], 1], [0, "t", 5], [0, "c", 1, [1], 1]], "step 2 starts at position 1"),
    ],
)
def test_malformed_schedules_are_refused(steps: object, message: str) -> None:
    with pytest.raises(schedule.ScheduleError, match=message):
        schedule.check_schedule(steps, 2)
    rolled_back = [[0, "p", 0, [1, 2], 1], [0, "t", 1], [0, "c", 1, [3, 4], 2], [1, "t", 9]]
    assert schedule.check_schedule(rolled_back, 2) == rolled_back


def test_batch_counts_split_long_feeds_and_count_each_decode() -> None:
    steps = [[1, "p", 0, list(range(20)), 1], [1, "d", 20, [5, 6, 7], 1], [0, "c", 0, list(range(23)), 1]]
    small, large = schedule.batch_counts(steps, 2, n_batch=8)
    assert large.sizes == {"prefill": {8: 2, 4: 1}, "decode": {1: 3}}
    assert small.sizes == {"catchup": {8: 2, 7: 1}}


# ----------------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, tiny_pair: tuple[Path, Path]) -> Path:
    """A real bench run through the CLI: two tasks, the strategies issue 12 replays."""
    out = tmp_path_factory.mktemp("bench")
    result = ead(
        "bench", "humaneval", "--ids", "0,1", "--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]),
        "--threads", "1", "--strategies", "large,gate,ead,lookahead,spec", "--gate-tau", str(MIDDLE),
        "--tau", str(MIDDLE), "--lookahead-tau", str(MIDDLE), "--verify", "none,0.5", "--max-tokens", "24",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


def test_bench_replay_on_the_recording_pair_reproduces_the_counts(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    config, records = read_results(recorded / RESULTS_FILE)
    assert config["tokenizer"]["tokens"] == 267 and len(config["tokenizer"]["sha256"]) == 64
    assert all(record["schedule"] for record in records)
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    result = ead("bench", "replay", str(recorded), *pair, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert b"replay vs large" in result.stdout and b"schedule replays" in result.stderr
    report = json.loads((tmp_path / replay.REPLAY_FILE).read_text())
    assert report["kind"] == "schedule replay" and report["threads"] == report["threads_batch"] == 1
    assert report["machine"]["cpu"] == this_cpu()[0] and report["machine"]["repack"] == repack_choice().word
    assert (
        report["models"]["large"]["file"] == tiny_pair[1].name and report["models"]["large"]["twin"] is None
    )
    names = [row["strategy"] for row in report["strategies"]]
    assert names == list(dict.fromkeys(r["strategy"] for r in records))
    assert len(names) == 8  # large-only, spec, and gate, ead and lookahead each without and with verify
    by_name = {row["strategy"]: row for row in report["strategies"]}
    assert by_name["large-only"]["wall_rel"] == 1.0
    for row in report["strategies"]:
        mine = [r for r in records if r["strategy"] == row["strategy"]]
        assert row["samples"] == 2 and row["generated"] == sum(r["generated"] for r in mine)
        assert row["recorded_wall_s"] == pytest.approx(sum(r["wall_s"] for r in mine))
        decoded = sum(r["models"]["large"]["decode_tokens"] for r in mine)
        assert sum(row["batches"]["large"].get("decode", {}).values()) == decoded
    for sample in report["samples"]:
        original = next(
            r for r in records if (r["strategy"], r["task_id"]) == (sample["strategy"], sample["task_id"])
        )
        for role, figures in sample["models"].items():
            for phase in PHASES:
                assert figures[f"{phase}_tokens"] == original["models"][role][f"{phase}_tokens"]
    order = [(s["task_id"], s["strategy"]) for s in report["samples"]]
    assert order == sorted(order, key=lambda key: (key[0], names.index(key[1])))  # task by task


def test_a_replay_checks_that_the_schedule_reads_what_the_record_counted(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Speculative decoding's first check reads the prompt's last token in the draft's batch: live and
    replayed, it counts as prefill. A record from before that (the token as catch-up) still replays;
    a schedule missing a step is refused in one line, before the models load."""
    config, records = read_results(recorded / RESULTS_FILE)
    spec = next(r for r in records if r["strategy"].startswith("spec"))
    large = spec["models"]["large"]
    assert large["prefill_tokens"] == spec["prompt_tokens"]  # a check from the prompt's end, as prefill
    older = json.loads(json.dumps(spec))
    older["models"]["large"]["prefill_tokens"] -= 1
    older["models"]["large"]["catchup_tokens"] += 1
    missing = json.loads(json.dumps(spec))
    missing["schedule"] = [step for step in spec["schedule"] if not (step[0] == 1 and step[1] == "c")][:-1]
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    for name, record in (("older", older), ("missing", missing)):
        (tmp_path / name).mkdir()
        (tmp_path / name / RESULTS_FILE).write_text(json.dumps(config) + "\n" + json.dumps(record) + "\n")
    result = ead("bench", "replay", str(tmp_path / "older"), *pair, "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    sample = json.loads((tmp_path / "out" / replay.REPLAY_FILE).read_text())["samples"][0]
    assert sample["models"]["large"]["prefill_tokens"] == spec["prompt_tokens"]
    result = ead("bench", "replay", str(tmp_path / "missing"), *pair)
    assert_one_line_error(result, 2, f"{tmp_path / 'missing' / RESULTS_FILE} holds a sample record")


@pytest.mark.parametrize("address", ["ftp://x/y", "http://127.0.0.1:8080"])
def test_replay_and_speed_refuse_a_server_address_before_any_model_loads(
    recorded: Path, tmp_path: Path, address: str
) -> None:
    """Both time llama.cpp's own calls, which a server's model has none of: an address had been connected
    to, and refused once it answered (or named as unreachable, or as not http://). Here the small model
    is a file that is not there: the address is said first."""
    pair = ["--small", "absent.gguf", "--large", address]
    for args in (["replay", str(recorded), *pair, "--out", str(tmp_path)], ["speed", *pair]):
        line = assert_one_line_error(ead("bench", *args), 2)
        assert line.startswith(f"error: {quoted(address)} is a server's address, which this command cannot")


@pytest.mark.parametrize("command", ["replay", "speed"])
def test_replay_and_speed_offer_no_server_options(command: str) -> None:
    """Their help had offered a llama-server's http://HOST:PORT for --large and --models, which they
    refuse, and the options of a model on a server (--remote-timeout...), which they never used: now
    neither, and such an option is one that does not exist."""
    shown = ead("bench", command, "--help")
    assert shown.returncode == 0, shown.stderr
    help_text = shown.stdout.decode()
    assert "--large" in help_text and "--models" in help_text
    assert "HOST:PORT" not in help_text and "--remote-" not in help_text
    for option, value in (("--remote-top-k", "5"), ("--remote-timeout", "5"), ("--remote-api-key", "k")):
        result = ead("bench", command, option, value)
        assert_one_line_error(result, 2, f"No such option: {option}")


def test_a_report_that_cannot_be_saved_is_one_line(recorded: Path, tmp_path: Path) -> None:
    """``ead bench report`` where report.md is a folder: it had ended in an IsADirectoryError traceback.
    Now one line naming the file asked for, said before any report file is written (report.csv had been)."""
    shutil.copy(recorded / RESULTS_FILE, tmp_path / RESULTS_FILE)
    (tmp_path / "report.md").mkdir()
    result = ead("bench", "report", str(tmp_path))
    assert_one_line_error(result, 2, f"cannot save the report to {tmp_path / 'report.md'}: it is a folder")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["report.md", RESULTS_FILE]
    (tmp_path / "report.md").rmdir()
    assert ead("bench", "report", str(tmp_path)).returncode == 0
    assert (tmp_path / "report.md").read_text().startswith("| strategy")


def test_a_replay_is_set_against_large_only_on_the_same_tasks() -> None:
    """A results file cut short mid-task: large-only ran t/1, the gate did not; its ratios are over t/0."""
    figures = {"prefill_tokens": 0, "decode_tokens": 0, "catchup_tokens": 0}
    runs = [("large-only", "t/0", 10.0, 8.0), ("large-only", "t/1", 30.0, 24.0), ("gate", "t/0", 5.0, 6.0)]
    records = [
        {
            "strategy": strategy,
            "task_id": task,
            "generated": 10,
            "large_share": 0.5,
            "passed": True,
            "schedule": [],
            "models": {"small": figures, "large": figures},
        }
        for strategy, task, _, _ in runs
    ]
    samples = [replay.ReplayedSample(s, t, wall, recorded, 10, {}) for s, t, wall, recorded in runs]
    large_only, gate = replay.summarise(records, samples, n_batch=512)
    assert (large_only.wall_rel, large_only.recorded_wall_rel) == (1.0, 1.0)
    assert gate.wall_s == 5.0 and gate.wall_rel == pytest.approx(5.0 / 10.0)  # not 5 s against 40 s
    assert gate.recorded_wall_rel == pytest.approx(6.0 / 8.0)


def test_a_replays_passes_are_its_passing_samples_counted(tmp_path: Path) -> None:
    """Counted in the recorded samples (one unjudged: 1 of 2 judged over 3, not round(0.5 x 3) = 2), and
    read back; a report written before they were counted has them from pass@1 over its samples."""
    figures = {"prefill_tokens": 0, "decode_tokens": 0, "catchup_tokens": 0}
    records = [
        {"strategy": "gate", "task_id": f"t/{task}", "generated": 10, "large_share": 0.5, "passed": passed,
         "schedule": [], "models": {"small": figures, "large": figures}}
        for task, passed in enumerate((True, None, False))
    ]  # fmt: skip
    samples = [replay.ReplayedSample("gate", r["task_id"], 1.0, 1.0, 10, {}) for r in records]
    (gate,) = replay.summarise(records, samples, n_batch=512)
    assert (gate.samples, gate.pass_at_1, gate.passed) == (3, 0.5, 1)
    (tmp_path / replay.REPLAY_FILE).write_text(json.dumps({"strategies": [dataclasses.asdict(gate)]}))
    assert replay.read_report(tmp_path)[1] == [gate]
    (tmp_path / replay.REPLAY_FILE).write_text(a_report(without="passed", pass_at_1=0.75, samples=4))
    assert replay.read_report(tmp_path)[1][0].passed == 3


def test_bench_report_gives_the_median_of_repeated_replays(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Repeats of a replay are compared like repeats of a bench: each strategy's median wall-clock
    ratio over them with its range, and the recorded run's passes (no text column: the text is forced)."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    _, records = read_results(recorded / RESULTS_FILE)
    gate = next(name for name in (r["strategy"] for r in records) if name.startswith("gate "))
    chosen = ["--strategies", f"large-only,spec,{gate}"]
    folders = [tmp_path / "run1", tmp_path / "run2", tmp_path / "run3"]
    shown = []
    for folder in folders:
        replayed = ead("bench", "replay", str(recorded), *pair, *chosen, "--out", str(folder))
        assert replayed.returncode == 0, replayed.stderr
        shown.append(replayed.stdout.decode())
    # one replay: its own table, as the replay showed it, not a "median (range)" of one run
    alone = ead("bench", "report", str(folders[0]))
    assert (alone.returncode, alone.stdout.decode()) == (0, shown[0])
    assert "median" not in alone.stdout.decode() and "replay vs large" in shown[0]
    assert sorted(path.name for path in folders[0].iterdir()) == [replay.REPLAY_FILE]
    result = ead("bench", "report", *map(str, folders))
    assert result.returncode == 0, result.stderr
    runs = [json.loads((folder / replay.REPLAY_FILE).read_text())["strategies"] for folder in folders]
    lines = result.stdout.decode().splitlines()
    assert lines[:2] == [
        "| strategy | wall vs large-only, median (range) | runs | passed |",
        "| --- | ---: | ---: | ---: |",
    ]
    assert len(lines) == 5
    for name in ("spec", gate):
        ratios = sorted(row["wall_rel"] for run in runs for row in run if row["strategy"] == name)
        assert f"| {name} | {ratios[1]:.2f} ({ratios[0]:.2f}-{ratios[2]:.2f}) | 3 | 0/0/0 |" in lines
    assert "| large-only | 1.00 (1.00-1.00) | 3 | 0/0/0 |" in lines
    written = folders[0] / "median-of-3.md"
    sources = "".join(f"{folder / replay.REPLAY_FILE}\n" for folder in folders)
    machine = json.loads((folders[0] / replay.REPLAY_FILE).read_text())["machine"]
    assert machine["cpu"] == this_cpu()[0]  # named above the table, as a bench's repeats are
    assert written.read_text() == sources + f"{machine_words(machine)}\n" + result.stdout.decode()
    assert not (folders[1] / "report.md").exists()  # a replay has no per-run report to rewrite
    mixed = ead("bench", "report", str(folders[0]), str(recorded))
    assert_one_line_error(mixed, 2, "give repeats of one kind")
    (folders[2] / replay.REPLAY_FILE).write_text("{}")
    assert_one_line_error(ead("bench", "report", *map(str, folders)), 2, "is not a replay report")


A_STRATEGY = {
    "strategy": "large-only",
    "samples": 1,
    "generated": 8,
    "large_share": 1.0,
    "pass_at_1": None,
    "passed": None,
    "wall_s": 0.5,
    "wall_rel": 1.0,
    "recorded_wall_s": 0.5,
    "recorded_wall_rel": 1.0,
    "tokens_per_s": 16.0,
    "batches": {"small": {}, "large": {"prefill": {"12": 1}, "decode": {"1": 8}}},
}


def a_report(without: str = "", **changed: object) -> str:
    """A replay.json of one strategy, its figures ``changed`` and the one named ``without`` left out."""
    row = {key: value for key, value in {**A_STRATEGY, **changed}.items() if key != without}
    return json.dumps({"kind": "schedule replay", "strategies": [row]})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ("[]", "it holds no list of strategies"),
        ('{"strategies": null}', "it holds no list of strategies"),
        ('{"strategies": []}', "it holds no strategies"),
        ('{"strategies": [1]}', "its strategy 1 is not an object"),
        (a_report(without="batches"), "its strategy 1 has no batches"),
        (a_report(wall_rel="x"), "its strategy 1's wall_rel is 'x', not a ratio (above 0) or null"),
        (a_report(wall_s=float("nan")), "its strategy 1's wall_s is nan, not seconds (a number, at least 0)"),
        (a_report(samples=True), "its strategy 1's samples is True, not a count of at least 1"),
        (a_report(passed=0.5), "its strategy 1's passed is 0.5, not a count or null"),
        # values no replay writes, which the median table and bench speed --check had shown as figures
        (a_report(wall_s=-1.0), "its strategy 1's wall_s is -1.0, not seconds (a number, at least 0)"),
        (
            a_report(recorded_wall_s=-1),
            "its strategy 1's recorded_wall_s is -1, not seconds (a number, at least 0)",
        ),
        (a_report(wall_rel=0), "its strategy 1's wall_rel is 0, not a ratio (above 0) or null"),
        (
            a_report(recorded_wall_rel=-1.0),
            "its strategy 1's recorded_wall_rel is -1.0, not a ratio (above 0) or null",
        ),
        (
            a_report(tokens_per_s=-5.0),
            "its strategy 1's tokens_per_s is -5.0, not a rate (a number, at least 0)",
        ),
        (a_report(large_share=2.0), "its strategy 1's large_share is 2.0, not a share (from 0 to 1)"),
        (a_report(pass_at_1=1.5), "its strategy 1's pass_at_1 is 1.5, not a share (from 0 to 1) or null"),
        (a_report(samples=0), "its strategy 1's samples is 0, not a count of at least 1"),
        (a_report(passed=2), "its strategy 1 passed 2 of its 1 samples"),
        (
            a_report(batches={"large": {"decode": {"0": 8}}}),
            "its strategy 1's batches is {'large': {'decode': {'0': 8}}}, "
            "not batch counts by model and phase",
        ),
        (
            a_report(batches={"large": {"warp": {"1": 8}}}),
            "its strategy 1's batches is {'large': {'warp': {'1': 8}}}, not batch counts by model and phase",
        ),
        (
            a_report(batches={"large": {"decode": {"one": 8}}}),
            "its strategy 1's batches is {'large': {'decode': {'one': 8}}}, "
            "not batch counts by model and phase",
        ),
        (  # a digit to str.isdigit, not to int(): bench speed --check prices the batch by its size
            a_report(batches={"large": {"decode": {"\u00b2": 8}}}),
            "its strategy 1's batches is {'large': {'decode': {'\u00b2': 8}}}, "
            "not batch counts by model and phase",
        ),
    ],
)
def test_a_damaged_replay_report_is_one_line_saying_what_is_wrong(
    tmp_path: Path, text: str, problem: str
) -> None:
    """``ead bench report`` of a replay.json edited or damaged: a figure of the wrong type had ended in a
    traceback where the table formats it (wall_rel), the rest in a Python message ('strategies', 'list
    indices must be integers'), and no strategies in an empty table and exit 0."""
    (tmp_path / replay.REPLAY_FILE).write_text(text)
    line = assert_one_line_error(ead("bench", "report", str(tmp_path)), 2)
    file = tmp_path / replay.REPLAY_FILE
    assert line == f"error: {file} is not a replay report (ead bench replay): {problem}"


def test_a_hand_made_replay_report_reads_and_a_missing_one_is_one_line(tmp_path: Path) -> None:
    (tmp_path / replay.REPLAY_FILE).write_text(a_report())
    report, (strategy,) = replay.read_report(tmp_path)
    assert strategy.batches == A_STRATEGY["batches"] and report["kind"] == "schedule replay"
    with pytest.raises(EadError) as refused:
        speed.read_replay(tmp_path / "none.json")
    assert str(refused.value) == f"cannot read {tmp_path / 'none.json'}: No such file or directory"


AN_EPYC = {"system": "Linux", "processor": "x86_64", "cpu": "AMD EPYC 7B13", "cpus": 2, "repack": "on"}


def a_replay(
    folder: Path,
    large: str = "large.gguf",
    recorded_s: float = 0.5,
    tasks: str = "t/0",
    machine: dict[str, Any] | None = None,
) -> str:
    """A replay.json in ``folder`` with its models and samples: large-only on ``tasks`` (comma-separated),
    replayed on ``large`` on ``machine`` (default AN_EPYC), recorded in ``recorded_s`` each."""
    ids = tasks.split(",")
    report = {
        "kind": "schedule replay",
        "machine": AN_EPYC if machine is None else machine,
        "models": {"small": {"file": "small.gguf", "bytes": 1}, "large": {"file": large, "bytes": 2}},
        "strategies": [{**A_STRATEGY, "samples": len(ids)}],
        "samples": [
            {"strategy": "large-only", "task_id": task, "wall_s": 0.5, "recorded_wall_s": recorded_s,
             "generated": 8, "models": {}}
            for task in ids
        ],
    }  # fmt: skip
    folder.mkdir()
    (folder / replay.REPLAY_FILE).write_text(json.dumps(report))
    return str(folder)


def test_repeats_of_a_replay_are_replays_of_the_same_samples_on_the_same_models(tmp_path: Path) -> None:
    """As repeats of a bench must share a setup: a replay on another model (a 7B twin beside a 14B one),
    of other recorded samples (another results file) or of a strategy on other tasks had been medianed
    with the rest, its table written."""
    first = a_replay(tmp_path / "first")
    assert ead("bench", "report", first, a_replay(tmp_path / "repeat")).returncode == 0
    for folder, message in (
        (a_replay(tmp_path / "14b", large="14b.gguf"), "small.gguf and 14b.gguf, not small.gguf and large"),
        (a_replay(tmp_path / "other", recorded_s=0.75), "large-only on t/0 as recorded otherwise than"),
        (a_replay(tmp_path / "more", tasks="t/0,t/1"), "ran large-only on other tasks than"),
        (
            a_replay(tmp_path / "xeon", machine=AN_EPYC | {"cpu": "Intel(R) Xeon(R)", "repack": "off"}),
            "(replayed on Intel(R) Xeon(R), 2 CPUs, weight repacking off, not AMD EPYC 7B13, 2 CPUs, weight "
            "repacking on)",
        ),
        (a_replay(tmp_path / "4-cpus", machine=AN_EPYC | {"cpus": 4}), "4 CPUs, weight repacking on, not"),
    ):  # fmt: skip
        line = assert_one_line_error(ead("bench", "report", first, folder), 2, message, "not a repeat")
        assert line.startswith(f"error: {folder}")
    assert sorted(path.name for path in (tmp_path / "first").iterdir()) == ["median-of-2.md", "replay.json"]
    # a replay written before the machine was recorded (its system and processor alone) is a repeat of any
    older = a_replay(tmp_path / "older", machine={"system": "Linux", "processor": "x86_64"})
    assert ead("bench", "report", first, older).returncode == 0
    # an older one first: the runs after it are still held to one machine
    after_older = ead("bench", "report", older, first, str(tmp_path / "4-cpus"))
    assert_one_line_error(after_older, 2, f"{tmp_path / '4-cpus'} is not a repeat of {first} (replayed on")
    for name in ("hand-made", "also-hand-made"):  # no models, no samples: nothing to hold them to
        (tmp_path / name).mkdir()
        (tmp_path / name / replay.REPLAY_FILE).write_text(a_report())
    hand_made = [str(tmp_path / "hand-made"), str(tmp_path / "also-hand-made")]
    assert ead("bench", "report", *hand_made).returncode == 0


def test_the_median_table_is_written_when_its_reader_is_gone(tmp_path: Path) -> None:
    """``ead bench report A B | head``: the table had come first and the closed pipe ended the run there
    (141), median-of-2.md not written."""
    first = a_replay(tmp_path / "first")
    result = ead_to_a_closed_pipe("bench", "report", first, a_replay(tmp_path / "repeat"))
    assert result.returncode == 141, result.stderr.decode()
    assert "large-only" in (tmp_path / "first" / "median-of-2.md").read_text()


def test_a_replay_given_twice_is_not_two_repeats(tmp_path: Path) -> None:
    """The same replay folder twice (however spelled) had been the median of two runs, its table written."""
    (tmp_path / replay.REPLAY_FILE).write_text(a_report())
    result = ead("bench", "report", str(tmp_path), f"{tmp_path}/./")
    line = assert_one_line_error(result, 2)
    assert line == "error: a folder is given twice: repeats are distinct runs"
    assert not (tmp_path / "median-of-2.md").exists()


def test_a_replay_whose_checks_pass_the_batch_is_refused_in_one_line(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A recorded check of several rows is one batch (llama.cpp keeps only the last batch's logits): a
    replay with a smaller --batch-size had raised a ValueError; the default batch replays them all."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    result = ead("bench", "replay", str(recorded), *pair, "-b", "2", "--out", str(tmp_path))
    line = assert_one_line_error(result, 2)
    assert re.search(
        r" on \S+ checks \d+ tokens in one batch, past --batch-size 2: pass --batch-size \d+ or more$", line
    )
    assert not (tmp_path / replay.REPLAY_FILE).exists()


def test_bench_speed_times_batches_up_to_the_batch_size(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A batch larger than --batch-size runs as several: only the sizes up to it are timed (and shown)."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1", "-tb", "2"]
    out = tmp_path / "speed.json"
    result = ead("bench", "speed", *pair, "--context", "64", "-b", "8", "-ub", "4", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert b"batch 8" in result.stdout and b"batch 16" not in result.stdout
    figures = json.loads(out.read_text())
    for rates in figures["rates"]:
        assert [int(size) for size in rates["tokens_per_s"]] == [1, 2, 4, 8]
    # where they were measured: the table's caption and the file say it
    assert figures["machine"] == {
        "cpu": this_cpu()[0],
        "cpus": os.cpu_count(),
        "repack": repack_choice().word,
    }
    assert figures["threads"] == {"decode": 1, "batch": 2}  # -tb: the batches' threads
    caption = f"tokens of context, 1 thread (2 for batches), {machine_words(figures['machine'])}\n"
    assert caption.encode() in result.stdout


def test_bench_speed_prices_a_replay(recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1"]
    assert ead("bench", "replay", str(recorded), *pair, "--out", str(tmp_path)).returncode == 0
    out = tmp_path / "speed.json"
    result = ead("bench", "speed", *pair, "--context", "64", "--check", str(tmp_path), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert b"speed vs large alone" in result.stdout and b"switching" in result.stdout
    report = json.loads(out.read_text())
    small, large = report["rates"]
    assert [int(size) for size in small["tokens_per_s"]] == list(speed.BATCH_SIZES)
    assert all(rate > 0 for rates in (small, large) for rate in rates["tokens_per_s"].values())
    assert [row["share"] for row in report["expectations"]] == list(speed.SHARES)
    assert [row["catchup_batch"] for row in report["expectations"]] == [50, 20, 10, 5, 3, 2]
    for model in (small, large):  # what is still out of order is what the rates say
        timed = {int(size): rate for size, rate in model["tokens_per_s"].items()}
        assert model["out_of_order"] == speed.falls(timed)
    assert all(row["answer_speedup"] > 0 for row in report["expectations"])
    assert len(report["checks"]) == 8
    for check in report["checks"]:
        assert check["priced_s"] > 0 and check["formula_s"] > 0 and check["measured_s"] > 0


def test_bench_speed_checks_a_replay_only_against_its_own_models(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Rates of other models had priced the replay's batches beside its measured wall-clock, rc 0."""
    small, large = (str(path) for path in tiny_pair)
    assert ead("bench", "replay", str(recorded), "--small", small, "--large", large, "--threads", "1",
               "--out", str(tmp_path)).returncode == 0  # fmt: skip
    out = tmp_path / "speed.json"
    swapped = ["--small", large, "--large", small, "--threads", "1", "--context", "64"]
    result = ead("bench", "speed", *swapped, "--check", str(tmp_path), "--json", str(out))
    line = assert_one_line_error(result, 2)
    file = tmp_path / replay.REPLAY_FILE
    assert line == (
        f"error: {file} is a replay on {tiny_pair[0].name} and {tiny_pair[1].name}, not "
        f"{tiny_pair[1].name} and {tiny_pair[0].name}: check it with the models it ran on"
    )
    assert not out.exists()


def test_bench_speed_writes_its_figures_over_no_file_it_reads(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--json naming the replay --check reads, or a model, had replaced it with the figures (a model
    file gone, a replay's hours of wall-clock lost), exit 0: refused before the measurement."""
    small, large = tmp_path / "small.gguf", tmp_path / "large.gguf"
    for copy, source in zip((small, large), tiny_pair, strict=True):
        shutil.copy(source, copy)
    pair = ["--small", str(small), "--large", str(large), "--threads", "1"]
    assert ead("bench", "replay", str(recorded), *pair, "--out", str(tmp_path)).returncode == 0
    pair += ["--context", "16"]
    file = tmp_path / replay.REPLAY_FILE
    kept = {path: path.read_bytes() for path in (small, large, file)}
    for check, out in ((tmp_path, file), (file, file), (None, large), (tmp_path, small)):
        result = ead("bench", "speed", *pair, *(["--check", str(check)] if check else []), "--json", str(out))
        assert_one_line_error(result, 2, f"--json {out} is a file ead bench speed reads")
    assert {path: path.read_bytes() for path in kept} == kept


def test_a_replay_report_that_would_be_a_folder_is_refused_before_any_model_loads(
    recorded: Path, tmp_path: Path
) -> None:
    """A folder where replay.json goes had been said once the whole replay had run, its table unshown."""
    (tmp_path / replay.REPLAY_FILE).mkdir()
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    result = ead("bench", "replay", str(recorded), *missing, "--out", str(tmp_path))
    file = tmp_path / replay.REPLAY_FILE
    assert_one_line_error(result, 2, f"cannot save the replay report to {file}: it is a folder")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "gate tau=9"], "'gate tau=9' is not in"),
        (["--strategies", ","], "--strategies: ',' names no strategy"),
        (["--strategies", ""], "--strategies: '' names no strategy"),
    ],
)
def test_bad_replay_requests_are_one_line(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    result = ead("bench", "replay", str(recorded), *pair, *args, "--out", str(tmp_path))
    assert_one_line_error(result, 2, message)
    assert not (tmp_path / replay.REPLAY_FILE).exists()


def test_a_replay_on_another_tokenizer_is_refused(
    recorded: Path, tiny_pair: tuple[Path, Path], tiny_other_vocab: Path
) -> None:
    other = ["--small", str(tiny_other_vocab), "--large", str(tiny_other_vocab)]
    result = ead("bench", "replay", str(recorded), *other)
    assert_one_line_error(result, 1, "does not have the tokenizer the schedules were recorded with")
    same = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[0]), "--strategies", "large-only"]
    assert ead("bench", "replay", str(recorded), *same).returncode == 0  # any models of the tokenizer


def test_a_record_without_a_schedule_or_fingerprint_is_refused(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    lines = (recorded / RESULTS_FILE).read_text().splitlines()
    sample = json.loads(lines[1]) | {"schedule": None}
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / RESULTS_FILE).write_text("\n".join([lines[0], json.dumps(sample)]) + "\n")
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    result = ead("bench", "replay", str(tmp_path / "remote"), *pair, "--strategies", sample["strategy"])
    assert_one_line_error(result, 2, "has no schedule", "cannot be replayed")
    result = ead("bench", "replay", str(tmp_path / "remote"), *pair)
    assert_one_line_error(result, 2, "no sample", "has a schedule to replay")
    config = json.loads(lines[0])
    del config["tokenizer"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / RESULTS_FILE).write_text("\n".join([json.dumps(config), lines[1]]) + "\n")
    result = ead("bench", "replay", str(tmp_path / "old"), *pair)
    assert_one_line_error(result, 2, "without a tokenizer fingerprint")


def test_a_replay_of_no_results_file_says_so(tmp_path: Path) -> None:
    """A mistyped path, or a folder without results.jsonl, is named as missing: it had been reported as
    holding no samples."""
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    for given, named in (
        (tmp_path / "typo.jsonl", tmp_path / "typo.jsonl"),
        (tmp_path, tmp_path / RESULTS_FILE),
    ):
        result = ead("bench", "replay", str(given), *missing)
        line = assert_one_line_error(result, 2, "give a bench's results.jsonl or its --out folder")
        assert line.startswith(f"error: {named} does not exist:")
    (tmp_path / RESULTS_FILE).write_text("")
    assert_one_line_error(ead("bench", "replay", str(tmp_path), *missing), 2, "no samples in")


@pytest.mark.parametrize(
    ("text", "problem"),
    [("not json\n", "line 1 is not JSON"), ('{"type": "sample"}\n', "does not start with a config record")],
    ids=["not JSON", "no config record"],
)
def test_a_replay_of_a_file_that_holds_no_bench_results_says_so_in_its_own_words(
    tmp_path: Path, text: str, problem: str
) -> None:
    """Another file given to replay had been told to "move the file away to start over", the bench's
    advice for its own results, which replay neither moves nor starts: it says what to give instead."""
    given = tmp_path / "notes.txt"
    given.write_text(text)
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    line = assert_one_line_error(ead("bench", "replay", str(given), *missing), 2)
    assert line == (
        f"error: {given} {problem}: it is not a bench's results file; give a bench's results.jsonl or its "
        "--out folder"
    )


def large(sample: dict) -> dict:
    """A sample record's figures of the large model."""
    return sample["models"]["large"]


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda sample: sample.pop("strategy"), "KeyError: 'strategy'"),
        (lambda sample: sample.pop("models"), "KeyError: 'models'"),
        (lambda sample: sample["models"].pop("small"), "KeyError: 'small'"),
        (lambda sample: sample.update(wall_s="fast"), "wall_s is 'fast', not seconds (a number, at least 0)"),
        # the figures' values, read where they had been summed into a report of nonsense or a traceback
        (lambda sample: sample.update(strategy=5), "strategy is 5, not text"),
        (lambda sample: sample.update(wall_s=-1.0), "wall_s is -1.0, not seconds (a number, at least 0)"),
        (lambda sample: sample.update(wall_s=True), "wall_s is True, not seconds"),
        (lambda sample: sample.update(large_share=2), "large_share is 2, not a share (from 0 to 1)"),
        (lambda sample: sample.update(generated=3.5), "generated is 3.5, not a count"),
        (lambda sample: sample.update(generated="16"), "generated is '16', not a count"),
        (lambda sample: large(sample).update(decode_tokens=-1), "models.large.decode_tokens is -1, not a"),
        (lambda sample: large(sample).update(decode_tokens="15"), "models.large.decode_tokens is '15'"),
        (
            lambda sample: large(sample).update(decode_tokens=999),
            "its schedule reads 23 decode tokens with the large model, the record 999",
        ),
        (  # a step past the end of what its model has read: an IndexError traceback after both models loaded
            lambda sample: sample["schedule"][1].__setitem__(2, 600),
            "step 1 starts at position 600, where model 1 has read 515 tokens",
        ),
        (  # a step over what its model has read: llama.cpp's 'failed to decode' once both had loaded
            lambda sample: sample["schedule"][1].__setitem__(2, 3),
            "step 1 starts at position 3, where model 1 has read 515 tokens",
        ),
        (lambda sample: sample["schedule"][1].__setitem__(1, "x"), "step 1 is malformed"),
    ],
    ids=[
        "no strategy",
        "no models",
        "no small model",
        "a wall time in words",
        "a number for a strategy",
        "negative seconds",
        "a boolean for seconds",
        "a share of 2",
        "half a token",
        "a count in words",
        "a negative count",
        "a count in words in a model",
        "counts the schedule does not read",
        "a gap in the schedule",
        "an overlap in the schedule",
        "an unknown step",
    ],
)
def test_a_damaged_sample_record_is_one_line_before_any_model_loads(
    recorded: Path, tmp_path: Path, damage: Callable[[dict], object], error: str
) -> None:
    """An edited results file: one line naming it, exit 2, where the first read of the missing figure had
    been a traceback (for the figures, after both models had loaded); the models given do not exist."""
    lines = (recorded / RESULTS_FILE).read_text().splitlines()
    sample = json.loads(lines[1])
    damage(sample)
    (tmp_path / RESULTS_FILE).write_text("\n".join([lines[0], json.dumps(sample), *lines[2:]]) + "\n")
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    result = ead("bench", "replay", str(tmp_path), *missing)
    line = assert_one_line_error(result, 2, "holds a sample record ead cannot read", error)
    assert line.startswith(f"error: {tmp_path / RESULTS_FILE} holds")
    assert not (tmp_path / replay.REPLAY_FILE).exists()


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda config: config.update(tokenizer=5), "tokenizer is 5, not a token count and a fingerprint"),
        (lambda config: config.update(tokenizer="x"), 'tokenizer is "x", not a token count and a'),
        (lambda config: config["tokenizer"].pop("sha256"), 'tokenizer is {"tokens": 267}, not a token'),
        (lambda config: config["tokenizer"].update(tokens="267"), 'tokenizer is {"tokens": "267", '),
        (lambda config: config.update(models=5), "models is 5, not the models by role"),
        (lambda config: config.update(models={}), "models is {}, not the models by role"),
    ],
    ids=["a number", "text", "no fingerprint", "a count in words", "models a number", "no models"],
)
def test_a_damaged_config_record_is_one_line_before_any_model_loads(
    recorded: Path, tmp_path: Path, damage: Callable[[dict], object], problem: str
) -> None:
    """The tokenizer's record had been a traceback where it is compared, once the models had loaded; the
    models' a 'sample record ead cannot read'."""
    lines = (recorded / RESULTS_FILE).read_text().splitlines()
    config = json.loads(lines[0])
    damage(config)
    (tmp_path / RESULTS_FILE).write_text("\n".join([json.dumps(config), *lines[1:]]) + "\n")
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    result = ead("bench", "replay", str(tmp_path), *missing)
    line = assert_one_line_error(result, 2, problem)
    assert line.startswith(f"error: {tmp_path / RESULTS_FILE}'s config record is not one ead bench writes: ")


def test_a_token_past_the_vocabulary_is_refused_before_any_model_loads(
    recorded: Path, tmp_path: Path
) -> None:
    """It had been llama.cpp's 'failed to decode', exit 1, once the replay had begun."""
    lines = (recorded / RESULTS_FILE).read_text().splitlines()
    sample = json.loads(lines[1])
    sample["schedule"][-1][3][-1] = 267
    (tmp_path / RESULTS_FILE).write_text("\n".join([lines[0], json.dumps(sample)]) + "\n")
    missing = ["--small", str(tmp_path / "none.gguf"), "--large", str(tmp_path / "none.gguf")]
    result = ead("bench", "replay", str(tmp_path), *missing, "--out", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "feeds token 267, past the 267 tokens of the recorded tokenizer")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda sample: sample.update(wall_s=-1.0), "wall_s is -1.0, not seconds (a number, at least 0)"),
        (lambda sample: sample.update(large_share=1.5), "large_share is 1.5, not a share (from 0 to 1)"),
        (lambda sample: sample.update(generated=-16), "generated is -16, not a count"),
        (lambda sample: sample.update(switches=0.5), "switches is 0.5, not a count"),
        (lambda sample: sample.update(flops=-1.0), "flops is -1.0, not a figure (a number, at least 0)"),
        (lambda sample: sample.update(acceptance_rate=2.0), "acceptance_rate is 2.0, not a share (from 0"),
        (lambda sample: large(sample).update(decode_s=-0.5), "models.large.decode_s is -0.5, not seconds"),
    ],
    ids=["negative seconds", "a share above 1", "a negative count", "half a switch", "negative flops",
         "an acceptance above 1", "negative model seconds"],
)  # fmt: skip
def test_bench_report_names_a_figure_no_bench_writes(
    recorded: Path, tmp_path: Path, damage: Callable[[dict], object], error: str
) -> None:
    """A results file edited to figures no bench writes had been reported as they were: -1 s and a
    negative rate, a large share of 150%, a negative switch count."""
    lines = (recorded / RESULTS_FILE).read_text().splitlines()
    sample = json.loads(lines[1])
    damage(sample)
    (tmp_path / RESULTS_FILE).write_text("\n".join([lines[0], json.dumps(sample), *lines[2:]]) + "\n")
    line = assert_one_line_error(ead("bench", "report", str(tmp_path)), 2, error)
    assert line.startswith(f"error: {tmp_path / RESULTS_FILE} holds a sample record ead cannot read")
    assert sorted(path.name for path in tmp_path.iterdir()) == [RESULTS_FILE]


def test_a_schedule_past_the_context_is_refused(
    recorded: Path, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--ctx", "64"]
    result = ead("bench", "replay", str(recorded), *pair, "--out", str(tmp_path))
    # llama.cpp makes a context of at least 256 tokens
    assert_one_line_error(result, 2, "reaches position", "past the context of 256 tokens")


# --------------------------------------------------------------------------------- the cost model


def rates(decode: float, prefill_small: float, prefill_large: float, name: str = "m") -> speed.Rates:
    """Rates that are ``decode`` for a single token, ``prefill_small`` below 16, ``prefill_large`` above."""
    table = {
        size: decode if size == 1 else prefill_small if size < 16 else prefill_large
        for size in (1, 2, 8, 16, 128)
    }
    return speed.Rates(name, 1, 256, table)


def test_batch_times_interpolate_between_measured_sizes() -> None:
    r = speed.Rates("m", 1, 256, {1: 10.0, 4: 40.0})
    assert r.seconds(1) == pytest.approx(0.1)
    assert r.seconds(4) == pytest.approx(0.1)
    assert r.seconds(2) == pytest.approx(
        2 * (0.1 + 0.025) / 2
    )  # halfway in log2 between 0.1 and 0.025 s/token
    assert r.seconds(64) == pytest.approx(64 * 0.025)  # flat beyond the largest
    assert r.prefill(4) == pytest.approx(40.0)


@pytest.mark.parametrize("rows", [1, 8])
def test_a_batch_rate_asks_for_the_rows_it_is_told_and_rolls_back(
    open_runners, tiny_pair: tuple[Path, Path], rows: int
) -> None:
    _, runner = open_runners(*tiny_pair)
    tokens = speed.filler_tokens(runner, 48)
    runner.feed(tokens, 0, 32, "prefill")
    before = runner.stats.logits_rows
    assert speed.batch_rate(runner, tokens, 32, 8, rows=rows) > 0
    assert runner.n_past == 32  # every batch rolled back to the context
    batches = runner.stats.catchup.tokens // 8
    assert batches >= 2  # a warm-up and at least one timed batch
    assert runner.stats.logits_rows - before == batches * rows  # logits at the last row, or every row


def test_sizes_slower_per_token_than_a_smaller_one_are_out_of_order() -> None:
    assert speed.falls({1: 10.0, 2: 20.0, 4: 40.0, 8: 39.0}) == []  # within 5% of the best before
    assert speed.falls({1: 10.0, 2: 20.0, 4: 40.0, 8: 30.0, 16: 37.0, 32: 80.0}) == [8, 16]
    assert speed.falls({1: 10.0}) == []


def test_a_whole_answer_pays_its_prompt_in_each_model_that_reads_it() -> None:
    small = rates(50.0, 75.0, 140.0)
    large = rates(4.0, 6.0, 12.0)
    prompt, answer = speed.PROMPT_TOKENS, speed.ANSWER_TOKENS
    alone = speed.answer_seconds(small, large, None)
    assert alone == pytest.approx(prompt / 12 + answer / 4)
    pair = speed.answer_seconds(small, large, 0.05)
    assert pair == pytest.approx(
        prompt / 12 + prompt / 140 + answer * speed.seconds_per_token(small, large, 0.05)
    )
    # The small model's read of the prompt makes a short answer gain less than the per-token figure says.
    (row,) = [row for row in speed.expectations(small, large) if row.share == 0.05]
    assert 1 < row.answer_speedup < row.speedup


def test_the_cost_model_and_its_break_even() -> None:
    small = rates(50.0, 75.0, 140.0)
    large = rates(4.0, 6.0, 12.0)  # a far pair: prefill 3x decode
    t = speed.seconds_per_token(small, large, 0.05)  # catch-up batches of 20 tokens
    assert t == pytest.approx(0.95 * (1 / 50 + 1 / 12) + 0.05 * (1 / 4 + 1 / 50))  # one token: decode rate
    even = speed.break_even(small, large)
    assert even is not None and 0.6 < even < 0.8
    assert (
        speed.seconds_per_token(small, large, even)
        < 1 / 4
        < speed.seconds_per_token(small, large, even + 0.002)
    )
    assert "beats" in speed.verdict(small, large)
    near = rates(37.0, 55.0, 105.0)  # the demo pair on this CPU: the large model's catch-up costs too much
    assert speed.break_even(rates(45.0, 70.0, 250.0), near) is None
    assert "never" in speed.verdict(rates(45.0, 70.0, 250.0), near)


def test_pricing_a_schedules_batches() -> None:
    small = speed.Rates("s", 1, 256, {1: 100.0})
    large = speed.Rates("l", 1, 256, {1: 10.0, 16: 40.0})
    batches = {"small": {"decode": {"1": 50}}, "large": {"prefill": {"16": 2}, "catchup": {1: 3}}}
    assert speed.price_batches(batches, (small, large)) == pytest.approx(0.5 + 2 * 16 / 40 + 0.3)


def test_the_formula_prices_large_only_as_the_large_model_alone() -> None:
    small = rates(50.0, 75.0, 140.0)
    large = rates(4.0, 6.0, 12.0)
    large_only = {
        "strategy": "large-only",
        "large_share": 1.0,
        "generated": 100,
        "wall_s": 30.0,
        "wall_rel": 1.0,
        "batches": {"small": {}, "large": {"prefill": {"128": 1}, "decode": {"1": 99}}},
    }
    gate = {
        "strategy": "gate tau=1",
        "large_share": 0.05,
        "generated": 100,
        "wall_s": 15.0,
        "wall_rel": 0.5,
        "batches": {"small": {"prefill": {"128": 1}, "decode": {"1": 94}}, "large": {"catchup": {"16": 6}}},
    }
    reference, switching = speed.check_replay({"strategies": [large_only, gate]}, small, large)
    # The small model took no part: no read of every large token (at 1/50 s each) is charged to it.
    assert reference.formula_s == pytest.approx(100 / 4)
    assert reference.formula_rel == pytest.approx(1.0)
    assert switching.formula_s == pytest.approx(100 * speed.seconds_per_token(small, large, 0.05))
    assert switching.formula_rel == pytest.approx(switching.formula_s / (100 / 4))


def test_a_large_only_replay_of_no_tokens_gives_no_formula_ratio() -> None:
    """Large-only answers of no token (an end at once) are priced 0 s: the ratios to it had been a
    ZeroDivisionError traceback after the measurement; they are not given, as for a replay without it."""
    small, large = rates(50.0, 75.0, 140.0), rates(4.0, 6.0, 12.0)
    rows = [
        {"strategy": name, "large_share": share, "generated": 0, "wall_s": 0.5, "wall_rel": 1.0,
         "batches": {"small": {"prefill": {"8": 1}} if share < 1 else {}, "large": {"prefill": {"8": 1}}}}
        for name, share in (("large-only", 1.0), ("gate tau=1", 0.0))
    ]  # fmt: skip
    checks = speed.check_replay({"strategies": rows}, small, large)
    assert [check.formula_rel for check in checks] == [None, None]


def test_speed_needs_a_local_pair_and_a_context_that_fits(tiny_pair: tuple[Path, Path]) -> None:
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1])]
    assert_one_line_error(ead("bench", "speed", *pair, "--context", "0"), 2, "--context must be in")
    too_long = ead("bench", "speed", *pair, "--ctx", "128", "--context", "200")  # 256 tokens of context
    assert_one_line_error(too_long, 2, "--context must be in [1, 120]")
    with pytest.raises(EadError, match="not a replay report"):
        speed.read_replay(Path(__file__))


def test_speed_without_json_refuses_a_closed_stdout(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Without --json the tables on stdout are all bench speed leaves: with stdout closed (``>&-``) it had
    measured both models, shown nothing, exit 0. With --json the figures still go to the file, also where
    the tables' reader is gone."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1", "--context", "16"]
    line = shlex.join([EAD, "bench", "speed", *pair])
    closed = subprocess.run(["bash", "-c", f"{line} >&-"], capture_output=True, timeout=120)
    assert_one_line_error(closed, 1, "cannot write the speed figures: stdout is closed")
    out = tmp_path / "speed.json"
    saved = subprocess.run(["bash", "-c", f"{line} --json {out} >&-"], capture_output=True, timeout=120)
    assert saved.returncode == 0, saved.stderr.decode()
    assert json.loads(out.read_text())["verdict"]
    # a reader gone (``| head``): the tables had come first and the closed pipe ended the run, unsaved
    out.unlink()
    piped = ead_to_a_closed_pipe("bench", "speed", *pair, "--json", str(out))
    assert piped.returncode == 141, piped.stderr.decode()
    assert json.loads(out.read_text())["verdict"]


def test_speed_json_through_a_link_is_checked_and_written_where_the_link_points(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--json a link into a folder not made yet: its check tried the link's own folder and passed, and the
    figures, measured, were then lost ('No such file or directory'); into a file's place, refused first."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1", "--context", "16"]
    link = tmp_path / "speed.json"
    link.symlink_to(tmp_path / "new" / "speed.json")
    result = ead("bench", "speed", *pair, "--json", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and json.loads(link.read_text())["rates"]
    (tmp_path / "blocker").write_text("")
    blocked = tmp_path / "blocked.json"
    blocked.symlink_to(tmp_path / "blocker" / "speed.json")
    refused = ead("bench", "speed", *pair, "--json", str(blocked))
    assert assert_one_line_error(refused, 2) == (
        f"error: cannot save the speed figures to {blocked}: {tmp_path / 'blocker'} is not a folder"
    )


def test_speed_json_to_dev_stdout_is_written_into_the_pipe(tiny_pair: tuple[Path, Path]) -> None:
    """--json /dev/stdout with stdout a pipe: its check had tried to write a scratch file in /proc/PID/fd
    (the pipe's 'folder') and refused it, and the save would have replaced a file of no name there."""
    pair = ["--small", str(tiny_pair[0]), "--large", str(tiny_pair[1]), "--threads", "1", "--context", "16"]
    result = ead("bench", "speed", *pair, "--json", "/dev/stdout")
    assert result.returncode == 0, result.stderr
    figures, _ = json.JSONDecoder().raw_decode(result.stdout.decode())  # saved before the tables
    assert figures["rates"]


@pytest.mark.real
@pytest.mark.parametrize("name", ["gate verify", "spec"])
def test_the_demo_pair_replays_its_own_schedule_exactly(
    open_runners, real_pair: tuple[Path, Path], name: str
) -> None:
    runners = open_runners(*real_pair, n_ctx=1024)
    policy = STRATEGIES[name]
    if policy.mode == "ead":
        policy = PolicyOptions("ead", "gate", tau=1.0, verify=0.1)
    steps, tokens, counts = record(runners, policy, max_tokens=48)
    ends = [runner.n_past for runner in runners]
    _, stats = schedule.replay(runners, steps)  # from empty caches again
    assert [(s.prefill.tokens, s.decode.tokens, s.catchup.tokens) for s in stats] == counts
    assert [runner.n_past for runner in runners] == ends
    assert all(runner.align(tokens) == runner.n_past for runner in runners)

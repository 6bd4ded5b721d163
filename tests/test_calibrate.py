"""ead calibrate: τ for a target share from replayed entropy streams, checked by real runs, saved per pair."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import httpx
import pytest
from serve_process import Server
from test_cli import assert_one_line_error, ead, ead_to_a_closed_pipe, pair_args

from ead_cli import calibrate as calibration
from ead_cli.errors import EadError, shown_path
from ead_cli.options import PolicyOptions


def test_gate_tau_hands_exactly_the_target_share_of_a_replayed_stream() -> None:
    streams = [[float(h) for h in range(10)], [0.5, 8.5]]
    tau, share = calibration.tau_for_share(streams, PolicyOptions(policy="gate"), 0.25)
    assert share == pytest.approx(3 / 12)  # the three highest of 12: 9, 8.5 and 8
    assert 7.0 < tau <= 8.0
    assert calibration.simulated_share(streams, PolicyOptions(policy="gate"), tau) == share


def test_lookahead_replay_counts_a_rewritten_span_once_and_decides_the_last_draft() -> None:
    options = PolicyOptions(policy="lookahead", draft=3)
    # span 1 (mean 4/3) is rewritten by the large model, span 2 stands, the open draft [5] ends the
    # stream: it is decided on what it has and rewritten too
    stream = [2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 5.0]
    assert calibration.simulated_share([stream], options, 1.0) == pytest.approx(4 / 7)
    assert calibration.simulated_share([stream], options, 6.0) == 0.0
    tau, share = calibration.tau_for_share([stream], options, 0.5)
    assert share == pytest.approx(4 / 7) and tau == pytest.approx(4 / 3, abs=1e-6)  # the edge of span 1


def test_ead_replay_counts_hysteresis_and_the_window() -> None:
    stream = [0.0] * 20 + [3.0] * 30 + [0.0] * 50
    options = PolicyOptions(policy="ead")
    tau, share = calibration.tau_for_share([stream], options, 0.3)
    assert share == pytest.approx(0.3, abs=0.02)
    # the same τ replayed by hand through a fresh policy gives the same share
    policy = PolicyOptions(policy="ead", tau=tau).make_policy()
    assert sum(policy.observe(h) for h in stream) / len(stream) == pytest.approx(share)


def test_a_line_burst_and_patterns_are_replayed_on_the_answers_text() -> None:
    """calibrate --burst line or --pattern: the replay feeds the policy each step's text, as the decoder
    does; unfed, a line burst never ended and a pattern never fired."""
    stream = [0.0, 5.0, 0.0, 0.0, 0.0, 0.0]
    text = ["def", " f", "():\n", "  x", " = 1", "\n"]
    line = PolicyOptions(policy="gate", burst="line")
    assert calibration.simulated_share([stream], line, 1.0, [text]) == pytest.approx(2 / 6)  # ' f' to '():\n'
    pattern = PolicyOptions(policy="gate", patterns=("^  x",))
    assert calibration.simulated_share([stream], pattern, 9.0, [text]) == pytest.approx(2 / 6)  # ' = 1', '\n'


def test_answers_too_short_to_switch_find_no_tau() -> None:
    """The paper's rule waits min_run (10) tokens before a switch: over 4-token answers every τ hands
    the large model nothing, and a τ of 0 would hand it everything once answers are longer."""
    streams = [[5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]]
    too_short = "the ead policy hands the large model no token at any tau over 8 answer tokens"
    with pytest.raises(EadError, match=too_short):
        calibration.tau_for_share(streams, PolicyOptions(policy="ead"), 0.1)
    # one token is a sentence too ('no token of these 1' had read badly)
    with pytest.raises(EadError, match="hands the large model no token at any tau over 1 answer token:"):
        calibration.tau_for_share([[5.0]], PolicyOptions(policy="ead"), 0.1)
    assert calibration.tau_for_share(streams, PolicyOptions(policy="gate"), 0.5)[1] == 0.5  # gate switches


def test_prompts_split_into_calibration_and_held_out_halves() -> None:
    calibrate, held_out = calibration.split_prompts("code")
    assert calibrate == list(calibration.PROMPTS["code"][:2]) and held_out == list(
        calibration.PROMPTS["code"][2:]
    )
    every = calibration.split_prompts("all")
    assert len(every[0]) == len(every[1]) == 6 and not set(every[0]) & set(every[1])
    assert calibration.split_prompts("all", ["a", "b", "c"]) == (["a", "c"], ["b"])
    with pytest.raises(EadError, match="--domain must be one of code, prose, maths, all"):
        calibration.split_prompts("poetry")
    with pytest.raises(EadError, match="at least 2 prompts"):
        calibration.split_prompts("all", ["only one"])


def test_saved_taus_merge_per_pair_and_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAD_CONFIG", str(tmp_path / "sub" / "calibration.json"))
    small, large = "a.gguf", "b.gguf"
    gate = calibration.Calibration("gate", 1.25, 0.2, 0.2, 0.21)
    calibration.save(small, large, [gate])
    calibration.save(small, large, [calibration.Calibration("ead", 0.75, 0.2, 0.19, None)])
    defaults = calibration.rule_settings(PolicyOptions(mode="ead", policy="gate"))  # none recorded
    assert calibration.PairTaus.read(small, large).saved("gate") == (1.25, defaults)
    ead = calibration.rule_settings(PolicyOptions(mode="ead", policy="ead"))
    assert ead == {"window": 5, "min_run": 10, "switch_point": "before", "tau_range": None}
    assert calibration.PairTaus.read(small, large).saved("ead") == (0.75, ead)
    assert calibration.PairTaus.read(large, small).saved("gate") is None  # the pair is ordered
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["calibration.json"]  # no temporary left


def test_a_corrupt_calibration_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "calibration.json"
    path.write_text("{not json")
    monkeypatch.setenv("EAD_CONFIG", str(path))
    with pytest.raises(EadError, match="cannot read the calibration file"):
        calibration.PairTaus.read("a.gguf", "b.gguf").saved("gate")


def test_calibrate_saves_and_generate_uses_the_tau_unless_given(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # brackets: rich's markup read '[backup]' as a style and dropped it from the lines that name the file
    config = (
        tmp_path / "a-folder-whose-name-takes-the-notes-past-eighty-columns [backup]" / "calibration.json"
    )
    env = {"EAD_CONFIG": str(config)}
    result = ead(  # a narrow COLUMNS: the table in a pipe is whole, not squeezed (and wrapped) into it
        "calibrate",
        *pair_args(tiny_pair),
        "--target-share",
        "0.3",
        "--max-tokens",
        "40",
        "--save",
        env=env | {"COLUMNS": "30"},
    )
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.decode().splitlines()
    assert header == "policy  tau (bits)  predicted share  measured share (held out)"
    assert [row.split()[0] for row in rows] == ["gate", "ead"]
    measured = "the built-in code, prose and maths prompts, written with the chat template of " + shown_path(
        tiny_pair[0].name
    )
    # one line, however long
    assert f"saved to '{config}', measured on {measured}" in result.stderr.decode().splitlines()
    saved = json.loads(config.read_text())
    entry = saved[f"{tiny_pair[0].name} + {tiny_pair[1].name}"]
    assert entry["gate"]["measured_on"] == entry["ead"]["measured_on"] == measured
    assert entry["gate"]["predicted_share"] == pytest.approx(0.3, abs=0.05)
    assert 0 < entry["gate"]["measured_share"] < 1

    def taus(*extra: str) -> set[float]:
        run = ead(
            "generate", *pair_args(tiny_pair), "--max-tokens", "5", "--format", "jsonl", *extra, "hi", env=env
        )
        assert run.returncode == 0, run.stderr
        return {json.loads(line)["tau"] for line in run.stdout.decode().splitlines()[:-1]}

    assert taus() == {None}  # the default mode, the large model alone: no threshold
    assert taus("--mode", "ead") == {entry["gate"]["tau"]}  # the pair switching: the saved one
    assert taus("--policy", "ead") == {entry["ead"]["tau"]}
    assert taus("--tau", "2") == {2.0}
    said = ead("generate", *pair_args(tiny_pair), "--mode", "ead", "--stats", "x", env=env)
    tau = entry["gate"]["tau"]
    note = f"tau {tau:.3f}: calibrated for this pair on {measured} ('{config}'); --tau overrides"
    assert note in said.stderr.decode().splitlines()


def test_a_saved_tau_says_which_prompts_and_template_it_was_measured_on(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A prompts file and a template given in place of the models' own are recorded with the τ, and a run
    that uses the τ says them; an entry of an older ead, without them, is used and said as before."""
    config, prompts = tmp_path / "calibration.json", tmp_path / "mine.txt"
    prompts.write_text("write a loop\nsort a list\n")
    env = {"EAD_CONFIG": str(config)}
    given = ["--prompts", str(prompts), "--chat-template", "llama2", "--no-check", "--save"]
    result = ead(
        "calibrate", *pair_args(tiny_pair), "--policy", "gate", "--max-tokens", "20", *given, env=env
    )
    assert result.returncode == 0, result.stderr
    measured = f"the prompts of {shown_path(prompts)}, written with --chat-template llama2"
    entry = json.loads(config.read_text())[f"{tiny_pair[0].name} + {tiny_pair[1].name}"]["gate"]
    assert entry["measured_on"] == measured

    def note() -> str:
        said = ead("generate", *pair_args(tiny_pair), "--mode", "ead", "--stats", "x", env=env)
        assert said.returncode == 0, said.stderr
        return next(line for line in said.stderr.decode().splitlines() if "calibrated for this pair" in line)

    tau, where = entry["tau"], f"({shown_path(config)}); --tau overrides"
    assert note() == f"tau {tau:.3f}: calibrated for this pair on {measured} {where}"
    del entry["measured_on"]
    config.write_text(json.dumps({f"{tiny_pair[0].name} + {tiny_pair[1].name}": {"gate": entry}}))
    assert note() == f"tau {tau:.3f}: calibrated for this pair {where}"
    entry["measured_on"] = 3
    config.write_text(json.dumps({f"{tiny_pair[0].name} + {tiny_pair[1].name}": {"gate": entry}}))
    refused = ead("generate", *pair_args(tiny_pair), "--mode", "ead", "x", env=env)
    assert_one_line_error(refused, 1, f"the calibration file {config}", "holds gate measured_on 3 for")


def test_a_policy_that_cannot_be_calibrated_leaves_the_others_shown_and_saved(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Answers of one token give the gate a τ but the ead policy (its window and minimum run) none: the
    gate's row is shown and saved, and the ead policy's failure is the one line of error (exit 1). The
    failure had ended the run, the gate's τ lost with it."""
    config = tmp_path / "calibration.json"
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "1", "--no-check", "--save"]
    result = ead(*args, env={"EAD_CONFIG": str(config)})
    assert result.returncode == 1, result.stderr
    rows = [line.split()[0] for line in result.stdout.decode().splitlines()[1:]]
    assert rows == ["gate"]
    errors = [line for line in result.stderr.decode().splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: the ead policy hands the large model no token at any tau over 12 answer tokens: "
        "calibrate on longer answers (--max-tokens) or more prompts"
    ]
    saved = json.loads(config.read_text())[f"{tiny_pair[0].name} + {tiny_pair[1].name}"]
    assert list(saved) == ["gate"]
    alone = ead("calibrate", *pair_args(tiny_pair), "--max-tokens", "1", "--no-check", "--policy", "ead")
    assert alone.returncode == 1 and alone.stdout == b""  # no table of nothing
    assert alone.stderr.decode().splitlines()[-1] == errors[0]


@pytest.mark.parametrize(("name", "reason"), [("conf/", "Is a directory"), ("kept.json/", "Not a directory")])
def test_a_config_named_as_a_folder_is_refused_before_the_calibration(
    tiny_pair: tuple[Path, Path], tmp_path: Path, name: str, reason: str
) -> None:
    """EAD_CONFIG=conf/ lost its / on its way to a Path: calibrate --save had written the file conf (and
    over kept.json for kept.json/). Refused as a shell refuses '> conf/', before any model loads."""
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    value = f"{tmp_path}/{name}"
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "1", "--no-check", "--save"]
    assert_one_line_error(ead(*args, env={"EAD_CONFIG": value}), 1, f"EAD_CONFIG={value}: {reason}")
    assert [path.name for path in tmp_path.iterdir()] == ["kept.json"] and kept.read_text() == "{}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--target-share", "0"], "--target-share must be in (0, 1)"),
        (["--target-share", "1"], "--target-share must be in (0, 1)"),
        (["--domain", "poetry"], "--domain must be one of"),
        (["--domain", ""], "--domain must be one of code, prose, maths, all, got ''"),  # had been all
        # the file's prompts replaced the domain's without a word
        (
            ["--domain", "code", "--prompts", "/dev/null"],
            "--domain picks built-in prompts, which --prompts replaces",
        ),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    ],
)
def test_calibrate_refuses_bad_settings_before_loading(
    tiny_pair: tuple[Path, Path], args: list[str], fragment: str
) -> None:
    assert_one_line_error(ead("calibrate", *pair_args(tiny_pair), *args), 2, fragment)


def test_calibrate_save_refuses_a_file_it_cannot_use_before_loading(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A calibration whose result could not be saved never starts: one line, and no table on stdout. Paths
    that need quotes in a shell are shown quoted (``shown_path``)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spaced = tmp_path / "my folder"
    spaced.write_text("")
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "4", "--no-check", "--save"]
    for config, fragment in [
        (
            blocker / "calibration.json",
            f"cannot save the calibration to {blocker}/calibration.json: {blocker} is not a folder",
        ),
        (blocker / "sub" / "calibration.json", f"calibration.json: {blocker} is not a folder"),
        (garbled, f"cannot read the calibration file {garbled}"),
        (spaced / "calibration.json", f"to '{spaced}/calibration.json': '{spaced}' is not a folder"),
    ]:
        result = ead(*args, env={"EAD_CONFIG": str(config)})
        assert_one_line_error(result, 1, fragment)
    assert garbled.read_text() == "{not json"  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "garbled.json", "my folder"]


@pytest.mark.parametrize("command", ["calibrate", "generate"])
def test_a_calibration_file_that_is_no_file_is_refused_unread(
    tiny_pair: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    """EAD_CONFIG naming a pipe (mkfifo) had calibrate --save wait for ever for a writer before its run,
    and generate --mode ead before its answer (the saved taus read); a folder had been read, and failed
    as 'Is a directory'. Each is refused unread, in one line, and left as it was."""
    pipe, folder = tmp_path / "pipe.json", tmp_path / "folder.json"
    os.mkfifo(pipe)
    folder.mkdir()
    if command == "calibrate":
        args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "1", "--no-check", "--save"]
    else:
        args = ["generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "1", "hi"]
    for config in (pipe, folder):
        line = assert_one_line_error(ead(*args, env={"EAD_CONFIG": str(config)}), 1)
        assert line == f"error: {config} is not a file: ead keeps its calibration in one; move it away"
    assert stat.S_ISFIFO(pipe.stat().st_mode) and list(folder.iterdir()) == []


def test_a_calibration_refused_after_its_save_was_checked_leaves_no_folder(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The check that the taus can be saved had made their folders, left behind when the run was refused
    afterwards (here a missing large model)."""
    config = tmp_path / "new" / "ead-cli" / "calibration.json"
    args = ["calibrate", "--small", str(tiny_pair[0]), "--large", str(tmp_path / "no-such.gguf"), "--save"]
    assert_one_line_error(ead(*args, env={"EAD_CONFIG": str(config)}), 1, "no-such.gguf")
    assert list(tmp_path.iterdir()) == []


def test_calibrate_saves_the_taus_when_the_tables_reader_is_gone(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """``ead calibrate --save | head``: the table had come first, and the closed pipe ended the run there
    (141), the calibration not saved."""
    config = tmp_path / "calibration.json"
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "40", "--no-check", "--policy", "gate"]
    result = ead_to_a_closed_pipe(*args, "--save", env={"EAD_CONFIG": str(config)})
    assert result.returncode == 141, result.stderr.decode()
    assert "gate" in json.loads(config.read_text())[f"{tiny_pair[0].name} + {tiny_pair[1].name}"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_file_is_named(tiny_pair: tuple[Path, Path]) -> None:
    """/proc takes no new file, even from root: the line names the folder, not the random name of the
    scratch file that found it out (it had said '(/proc/tmpgr7a92di)')."""
    config = "/proc/ead-calibration.json"
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "4", "--no-check", "--save"]
    line = assert_one_line_error(
        ead(*args, env={"EAD_CONFIG": config}), 1, f"cannot save the calibration to {config}: "
    )
    assert line.endswith(" (/proc)")


def test_a_prompt_too_long_for_the_context_is_named_before_any_answer_runs(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A held-out line too long for the context had failed only after the calibration answers ran,
    as '600 tokens do not fit the context of 256 tokens', naming no prompt; unchecked, it calibrates, and
    is named as a calibration prompt."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a function.\n" + "x" * 600 + "\n")
    args = ["calibrate", *pair_args(tiny_pair), "--prompts", str(prompts), "--ctx", "256", "--policy", "gate"]
    error = assert_one_line_error(ead(*args), 2)
    assert re.fullmatch(
        r"error: held-out prompt 1 \('x{30}\.\.\.'\): the prompt is \d+ tokens, too many for the context "
        r"of 256 tokens: it takes at most 255, to leave room for the answer \(raise --ctx or shorten the "
        r"prompt\)",
        error,
    ), error
    unchecked = assert_one_line_error(ead(*args, "--no-check"), 2)
    assert unchecked.startswith("error: calibration prompt 2 ('xxx"), unchecked


def test_one_prompt_a_side_is_said_in_the_singular(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Two prompts, one to calibrate and one to check: the progress lines count them as every count is
    said ('answers 1 calibration prompts', 'on 1 held-out prompts' they had been)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a function.\nWrite a poem.\n")
    args = ["calibrate", *pair_args(tiny_pair), "--prompts", str(prompts), "--max-tokens", "20"]
    result = ead(*args, "--policy", "gate")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.decode().splitlines()
    assert lines[0] == "the small model answers 1 calibration prompt"
    assert re.fullmatch(r"checking gate at tau \d+\.\d{3} on 1 held-out prompt", lines[1]), lines


def test_unchecked_every_prompt_calibrates(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """--no-check holds no prompt out, as nothing is checked: every prompt of a file calibrates (the 2nd,
    4th... had been dropped unsaid, and a file of one prompt refused as needing one to check), and so do
    every domain's built-in ones."""
    assert calibration.split_prompts("all", ["a", "b", "c"], check=False) == (["a", "b", "c"], [])
    assert calibration.split_prompts("all", ["only one"], check=False) == (["only one"], [])
    assert calibration.split_prompts("code", check=False) == (list(calibration.PROMPTS["code"]), [])
    prompts = tmp_path / "prompts.txt"
    args = ["calibrate", *pair_args(tiny_pair), "--prompts", str(prompts), "--max-tokens", "20"]
    for written, said in (("a\nb\nc\n", "3 calibration prompts"), ("A poem.\n", "1 calibration prompt")):
        prompts.write_text(written)
        result = ead(*args, "--policy", "gate", "--no-check")
        assert result.returncode == 0, result.stderr
        assert result.stderr.decode().splitlines()[0] == f"the small model answers {said}"
        assert re.match(r"gate +\d+\.\d{3} ", result.stdout.decode().splitlines()[1])
    # checked, a prompt is still held out for the check
    assert_one_line_error(ead(*args, "--policy", "gate"), 2, "at least 2 prompts")


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("[1]", "is not an object of policies, each an object"),
        ('{"gate": 3}', "is not an object of policies, each an object"),
        ('{"gate": {"tau": Infinity}}', "holds gate tau Infinity for"),
        ('{"gate": {"tau": NaN}}', "holds gate tau NaN for"),
        ('{"gate": {"tau": -5}}', "holds gate tau -5 for"),
        ('{"gate": {"tau": "1"}}', 'holds gate tau "1" for'),
        ('{"gate": {}}', "holds gate tau null for"),
    ],
)
def test_a_saved_tau_is_checked_as_tau_is(
    tiny_pair: tuple[Path, Path], tmp_path: Path, entry: str, fragment: str
) -> None:
    """A hand-edited calibration file: the wrong shape, or a τ --tau would refuse, is one line naming the
    file, for generate and for calibrate --save (before it loads anything)."""
    config = tmp_path / "calibration.json"
    config.write_text(f'{{"{tiny_pair[0].name} + {tiny_pair[1].name}": {entry}}}')
    env = {"EAD_CONFIG": str(config)}
    generate = ead("generate", *pair_args(tiny_pair), "--mode", "ead", "--max-tokens", "2", "hi", env=env)
    line = assert_one_line_error(generate, 1, f"the calibration file {config}", fragment)
    if "tau" in fragment:
        assert line.endswith("a tau is a finite number of bits, at least 0")
    else:
        calibrate = ead("calibrate", *pair_args(tiny_pair), "--max-tokens", "4", "--save", env=env)
        assert_one_line_error(calibrate, 1, f"the calibration file {config}", fragment)


def test_chat_applies_the_saved_tau_to_whatever_policy_a_command_turns_on(
    tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare chat starts in the large-alone mode; a command that turns the pair on gets the pair's
    calibrated τ for its policy, as ead generate and ead serve do, and a τ given wins."""
    config = tmp_path / "calibration.json"
    monkeypatch.setenv("EAD_CONFIG", str(config))
    small, large = tiny_pair[0].name, tiny_pair[1].name
    for policy, tau in (("gate", 1.25), ("ead", 0.75)):
        calibration.save(small, large, [calibration.Calibration(policy, tau, 0.2, 0.2, None)])
    commands = "/stats\n/window 1\n/policy ead\n/window 5\n/tau 2\n/policy gate\n"
    result = ead("chat", *pair_args(tiny_pair), stdin=commands, env={"EAD_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    settings = re.findall(r"settings: mode (\w+) · policy (\w+) · tau ([\d.]+)", result.stderr.decode())
    assert settings == [
        ("large", "gate", "1"),  # the large model alone: no threshold at work (the policy's own is shown)
        ("ead", "gate", "1.25"),
        ("ead", "ead", "0.5"),  # its τ was measured with the ead policy's window of 5: not this one's
        ("ead", "ead", "0.75"),
        ("ead", "ead", "2"),
        ("ead", "gate", "2"),
    ]
    note = (
        "note: the ead tau calibrated for this pair was measured with --window 5; this run's --window 1 "
        "uses tau 0.5 (ead calibrate --policy ead --window 1 calibrates it)"
    )
    assert result.stderr.decode().splitlines().count(note) == 1


def test_a_saved_tau_applies_only_under_the_settings_it_was_measured_with(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A τ saved by calibrate had been applied whatever --window, --min-run... said, though it was
    measured under one set of them: it applies where the run's settings match those recorded beside it
    (an older entry, without them, was measured with the defaults), elsewhere the policy's default τ
    does and one note says why. Settings the policy does not read (the gate's --min-run) do not count;
    a --tau given wins, unsaid."""
    config = tmp_path / "calibration.json"
    small, large = tiny_pair[0].name, tiny_pair[1].name
    # the gate's entry as an older ead wrote it: no settings, measured with the defaults (window 1)
    config.write_text(json.dumps({f"{small} + {large}": {"gate": {"tau": 1.25, "target_share": 0.2}}}))
    env = {"EAD_CONFIG": str(config)}

    def run(*extra: str) -> tuple[set[float], list[str]]:
        args = ["generate", *pair_args(tiny_pair), "--max-tokens", "3", "--format", "jsonl", *extra, "hi"]
        result = ead(*args, env=env)
        assert result.returncode == 0, result.stderr
        taus = {json.loads(line)["tau"] for line in result.stdout.decode().splitlines()[:-1]}
        return taus, result.stderr.decode().splitlines()

    assert run("--mode", "ead") == ({1.25}, [])
    unread = ["note: --policy gate leaves --min-run unused"]  # and it does not count
    assert run("--mode", "ead", "--window", "1", "--min-run", "3") == ({1.25}, unread)  # the gate's window
    taus, notes = run("--mode", "ead", "--window", "3", "--switch-point", "after")
    assert taus == {1.0}
    assert notes == [
        "note: the gate tau calibrated for this pair was measured with --window 1 --switch-point before; "
        "this run's --window 3 --switch-point after uses tau 1 (ead calibrate --policy gate --window 3 "
        "--switch-point after calibrates it)"
    ]
    assert run("--window", "3", "--tau", "2") == ({2.0}, [])


def served_taus(server: Server, ead: dict) -> set[float]:
    """The τs in force over a short answer of a real ``ead serve`` to a request with this ``ead`` object."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "ead": ead}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return {token["tau"] for token in reply.json()["ead"]["tokens"]}


def test_serve_reads_the_saved_taus_once_at_its_start(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A server's settings are those it started with, as llama-server's: ead serve reads the calibration
    file once, at its start (it had read it twice per request). A calibration saved while it serves, or a
    file spoiled meanwhile, changes nothing until it starts again."""
    config = tmp_path / "calibration.json"
    pair = f"{tiny_pair[0].name} + {tiny_pair[1].name}"
    config.write_text(json.dumps({pair: {"gate": {"tau": 1.25}}}))
    env = {"EAD_CONFIG": str(config)}
    with Server(pair_args(tiny_pair), tmp_path / "first.log", env=env) as server:
        assert served_taus(server, {"mode": "ead"}) == {1.25}
        config.write_text(json.dumps({pair: {"gate": {"tau": 2.5}}}))
        assert served_taus(server, {"mode": "ead"}) == {1.25}
        config.write_text("{not json")
        assert served_taus(server, {"mode": "ead"}) == {1.25}
        assert server.stop() == 0, server.log()
    config.write_text(json.dumps({pair: {"gate": {"tau": 2.5}}}))
    with Server(pair_args(tiny_pair), tmp_path / "again.log", env=env) as server:
        assert served_taus(server, {"mode": "ead"}) == {2.5}
        assert server.stop() == 0, server.log()


def test_serve_logs_once_per_setting_a_request_whose_rule_options_leave_the_saved_tau(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A request whose rule options differ from those the saved τ was measured under gets the policy's
    default τ, as a run does: its server's log says so once per distinct setting, not per request (it had
    said nothing), and a setting the start-up note named is not named again."""
    config = tmp_path / "calibration.json"
    config.write_text(json.dumps({f"{tiny_pair[0].name} + {tiny_pair[1].name}": {"gate": {"tau": 1.25}}}))
    env = {"EAD_CONFIG": str(config)}
    window_3 = (
        "note: the gate tau calibrated for this pair was measured with --window 1; this run's --window 3 "
        "uses tau 1 (ead calibrate --policy gate --window 3 calibrates it)"
    )
    after = (
        "note: the gate tau calibrated for this pair was measured with --switch-point before; this run's "
        "--switch-point after uses tau 1 (ead calibrate --policy gate --switch-point after calibrates it)"
    )
    with Server(pair_args(tiny_pair), tmp_path / "bare.log", env=env) as server:
        assert served_taus(server, {"window": 3}) == {1.0}
        assert served_taus(server, {"window": 3}) == {1.0}
        assert served_taus(server, {"mode": "ead"}) == {1.25}
        assert served_taus(server, {"switch_point": "after"}) == {1.0}
        assert served_taus(server, {"window": 3, "policy": "gate"}) == {1.0}
        assert served_taus(server, {"tau": 2, "window": 3}) == {2.0}  # a τ given: no note
        assert server.stop() == 0, server.log()
        notes = [line for line in server.log().splitlines() if line.startswith("note: the gate tau")]
        assert notes == [window_3, after]
    with Server([*pair_args(tiny_pair), "--window", "3"], tmp_path / "window.log", env=env) as server:
        assert served_taus(server, {}) == {1.0}
        assert served_taus(server, {"window": 1}) == {1.25}
        assert server.stop() == 0, server.log()
        notes = [line for line in server.log().splitlines() if line.startswith("note: the gate tau")]
        assert notes == [window_3]  # said at the start, for the server's own --window 3


def test_serve_checks_every_saved_tau_of_the_pair_at_its_start(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A server reads the pair's τs once, at its start, and checks each policy's there: a hand-edited
    entry is one line before it serves, where a request for that policy had been a 400 naming the
    operator's file to a client."""
    config = tmp_path / "calibration.json"
    entries = {"gate": {"tau": 1.25}, "lookahead": {"tau": -1}}
    config.write_text(json.dumps({f"{tiny_pair[0].name} + {tiny_pair[1].name}": entries}))
    args = ["serve", *pair_args(tiny_pair), "--mode", "ead", "--port", "0"]
    result = ead(*args, env={"EAD_CONFIG": str(config)})
    assert_one_line_error(result, 1, f"the calibration file {config} holds lookahead tau -1 for")


def test_calibrate_records_the_settings_it_measured_under(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """calibrate takes the options that shape each policy's rule, calibrates under them and saves them
    beside the τ: a run with them gets that τ, a run with the defaults does not."""
    config = tmp_path / "calibration.json"
    env = {"EAD_CONFIG": str(config)}
    args = ["calibrate", *pair_args(tiny_pair), "--max-tokens", "40", "--no-check", "--save"]
    result = ead(*args, "--policy", "ead", "--window", "3", "--min-run", "4", env=env)
    assert result.returncode == 0, result.stderr
    entry = json.loads(config.read_text())[f"{tiny_pair[0].name} + {tiny_pair[1].name}"]["ead"]
    assert entry["settings"] == {"window": 3, "min_run": 4, "switch_point": "before", "tau_range": None}
    streams = [[0.0] * 20 + [3.0] * 30 + [0.0] * 50]
    assert entry["tau"] != calibration.tau_for_share(streams, PolicyOptions(policy="ead"), 0.1)[0]

    def tau_of(*extra: str) -> tuple[set[float], str]:
        args = [
            "generate",
            *pair_args(tiny_pair),
            "--policy",
            "ead",
            "--max-tokens",
            "3",
            "--format",
            "jsonl",
        ]
        run = ead(*args, *extra, "hi", env=env)
        assert run.returncode == 0, run.stderr
        events = run.stdout.decode().splitlines()[:-1]
        return {json.loads(line)["tau"] for line in events}, run.stderr.decode()

    assert tau_of("--window", "3", "--min-run", "4") == ({entry["tau"]}, "")
    taus, note = tau_of()
    assert taus == {0.5}
    assert note == (
        "note: the ead tau calibrated for this pair was measured with --window 3 --min-run 4; this run's "
        "--window 5 --min-run 10 uses tau 0.5 (ead calibrate --policy ead calibrates it)\n"
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--burst", "2", "--policy", "ead"],
            "--burst shapes --policy gate, which this calibration leaves out",
        ),
        (["--draft", "3"], "--draft shapes --policy lookahead, which this calibration leaves out"),
        (["--window", "0"], "--window must be at least 1, got 0"),
    ],
)
def test_calibrate_refuses_a_setting_no_policy_it_calibrates_reads(
    tiny_pair: tuple[Path, Path], args: list[str], fragment: str
) -> None:
    assert_one_line_error(ead("calibrate", *pair_args(tiny_pair), *args), 2, fragment)


@pytest.mark.parametrize(
    "settings", ['"window 3"', '{"window": 0}', '{"temp": 1}', '{"burst": "lines"}', '{"min_run": "x"}']
)
def test_saved_settings_are_checked_as_the_options_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: str
) -> None:
    config = tmp_path / "calibration.json"
    config.write_text(f'{{"a.gguf + b.gguf": {{"gate": {{"tau": 1, "settings": {settings}}}}}}}')
    monkeypatch.setenv("EAD_CONFIG", str(config))
    with pytest.raises(EadError, match=f"the calibration file {config} holds gate settings .* for a.gguf"):
        calibration.PairTaus.read("a.gguf", "b.gguf").saved("gate")


def test_calibrate_without_the_check_loads_the_small_model_alone(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--no-check: the small model answers alone and nothing runs the large one, which had been loaded all
    the same (its memory and load time, a 14B's minutes). It is named, not loaded: a large file that
    would fail to load does not matter there, and the τ is saved under its name; checked, it does."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_pair[1].read_bytes()[:4096])
    config = tmp_path / "calibration.json"
    args = ["calibrate", "--small", str(tiny_pair[0]), "--large", str(cut), "--threads", "1"]
    args += ["--max-tokens", "20", "--policy", "gate"]
    result = ead(*args, "--no-check", "--save", env={"EAD_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    assert list(json.loads(config.read_text())) == [f"{tiny_pair[0].name} + cut.gguf"]
    assert_one_line_error(ead(*args), 1, "could not load", "cut.gguf")
    missing = ["--large", str(tmp_path / "no-such.gguf")]  # a name that cannot resolve still matters
    assert_one_line_error(ead(*args, *missing, "--no-check"), 1, "no-such.gguf")

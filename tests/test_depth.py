"""ead depth: the early exit inside llama.cpp's graph, its exactness against the full-depth simulation,
the readout, the profile, the baselines and the command line, on tiny generated models (8 blocks)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from ctrl_c import ctrl_c_at_return, indices_before_ctrl_c
from test_cli import (
    EAD,
    assert_one_line_error,
    at_a_terminal,
    ead,
    ead_to_a_closed_pipe,
    interruptible,
    read_to_the_end,
)
from test_habits import MEANT, TYPED
from test_readme import help_text
from tiny_models import write_tiny_model

from ead_cli.bench.sandbox import sandbox_note
from ead_cli.depth.evaluate import plain_greedy_ms, plot, verdict
from ead_cli.depth.model import DepthModel, DepthOptions
from ead_cli.depth.probes import LayerTap
from ead_cli.depth.profile import (
    isotonic_nonincreasing,
    load_profile,
    probe_layers,
    profile_dir,
    profile_path,
    save_profile,
)
from ead_cli.depth.readout import Head, entropy_bits, file_digest, load_head, low_rank_factors, read_rows
from ead_cli.depth.teacher import calibrate, calibration_corpus
from ead_cli.errors import EadError, counted, quoted
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

N_LAYER = 8
PROMPT = "hello wörld 日本"


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("depth") / "deep.gguf", n_layer=N_LAYER)


@pytest.fixture(scope="module")
def model(deep_model: Path) -> Iterator[DepthModel]:
    loaded = DepthModel(deep_model, n_threads=1, n_ctx=512)
    loaded.cache = deep_model.parent
    corpus = calibration_corpus(["prose"], probe_every=2, tokens=512)
    loaded.profile = calibrate(loaded, corpus, probe_every=2, tokens=512)
    yield loaded
    loaded.close()


def run(model: DepthModel, options: DepthOptions, max_tokens: int = 40, prompt_text: str = PROMPT):
    prompt = model.runner.tokenize(prompt_text, add_special=False)
    response = model.generate(prompt, options, SamplingParams(), max_tokens=max_tokens)
    return list(response), response.summary()


def plain_greedy(path: Path, max_tokens: int, prompt_text: str = PROMPT, n_ctx: int = 512) -> list[int]:
    """Greedy decoding on an ordinary runner (no callback): llama.cpp's own full-depth logits."""
    runner = Runner(path, name="plain", n_ctx=n_ctx, n_threads=1)
    try:
        tokens = runner.tokenize(prompt_text, add_special=False)
        out = []
        for _ in range(max_tokens):
            token = int(np.argmax(runner.sync(tokens, prompt_len=len(tokens) - len(out), own_tail=bool(out))))
            out.append(token)
            tokens.append(token)
        return out
    finally:
        runner.close()


def test_the_callback_stops_the_graph_and_decode_keeps_the_cells(deep_model: Path) -> None:
    """Returning false at block 3 of 8: no later block's output is computed, llama_decode returns 0 and
    the cache holds every position."""
    tap = LayerTap()
    seen: list[int] = []
    tap.see = lambda layer, tensor: (seen.append(layer), layer != 3)[1]
    runner = Runner(deep_model, name="m", n_ctx=512, n_threads=1, eval_callback=tap.callback)
    try:
        tokens = runner.tokenize(PROMPT, add_special=False)
        tap.want(range(1, N_LAYER + 1))
        runner.feed(tokens, 0, len(tokens), "prefill")  # raises unless llama_decode returned 0
        assert seen == [1, 2, 3]
        seen.clear()
        tokens.append(100)
        runner.feed(tokens, len(tokens) - 1, len(tokens), "decode")
        assert seen == [1, 2, 3]
        memory = llama_cpp.llama_get_memory(runner.ctx)
        assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == len(tokens) - 1
    finally:
        runner.close()


def test_readout_by_hand_equals_the_callbacks(deep_model: Path) -> None:
    """RMSNorm and the output matrix in float64 numpy give the callback's logits at a middle block, and
    at the last block the readout is llama.cpp's own logits (to float rounding: the norm's sum is taken
    in another order; on the real Q8_0 head the activations' quantisation makes them bit-equal)."""
    tap = LayerTap()
    hidden: dict[int, np.ndarray] = {}
    tap.see = lambda layer, tensor: (hidden.__setitem__(layer, read_rows(tensor)[-1]), True)[1]
    runner = Runner(deep_model, name="m", n_ctx=512, n_threads=1, eval_callback=tap.callback)
    try:
        tokens = runner.tokenize(PROMPT, add_special=False)
        tap.want([3, N_LAYER])
        logits = runner.sync(tokens, prompt_len=len(tokens), own_tail=False).copy()
    finally:
        runner.close()
    head = Head(load_head(deep_model), 1)
    assert np.allclose(head.logits(hidden[N_LAYER])[0], logits, rtol=1e-5, atol=1e-5)
    reader = gguf.GGUFReader(deep_model)
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
    h = hidden[3].astype(np.float64)
    by_hand = tensors["output.weight"] @ (h / np.sqrt(np.mean(h**2) + 1e-6) * tensors["output_norm.weight"])
    assert np.allclose(head.logits(hidden[3])[0], by_hand, rtol=1e-4, atol=1e-4)
    assert entropy_bits(by_hand)[0] == pytest.approx(entropy_bits(head.logits(hidden[3]))[0], abs=1e-4)


def test_a_margin_that_never_exits_is_full_depth_greedy(model: DepthModel, deep_model: Path) -> None:
    events, summary = run(model, DepthOptions(margin=1000.0, probe_every=2))
    assert [e.token for e in events] == plain_greedy(deep_model, len(events))
    assert set(summary.depths) == {N_LAYER}
    assert summary.flop_ratio > 1.0  # the probes were paid for and saved nothing


@pytest.mark.parametrize(
    "options",
    [
        DepthOptions(margin=0.0, probe_every=2),
        DepthOptions(margin=0.0, probe_every=2, condition="both"),
        DepthOptions(margin=0.0, probe_every=2, estimator="topk", top_k=16),
        DepthOptions(margin=0.0, probe_every=2, estimator="lowrank", rank=8),
        DepthOptions(confidence=5.0, probe_every=1),
    ],
    ids=lambda options: options.label,
)
def test_early_exit_equals_the_full_depth_simulation(model: DepthModel, options: DepthOptions) -> None:
    real_events, real = run(model, options)
    simulated_events, simulated = run(model, replace(options, simulate=True))
    assert [e.token for e in real_events] == [e.token for e in simulated_events]
    assert real.depths == simulated.depths
    assert [e.probes for e in real_events] == [e.probes for e in simulated_events]
    assert min(real.depths) < N_LAYER  # it did exit early
    assert all(b <= a for a, b in itertools.pairwise(real.depths))  # monotone
    assert real.flops < real.full_flops


def test_early_exit_on_a_quantized_cache_with_flash_attention_equals_its_simulation(tmp_path: Path) -> None:
    """-ctk/-ctv and -fa reach depth's one model: the graph stopped at a probe layer leaves a q8_0/q4_0
    cache read as the full-depth simulation's, token for token (heads of 32 values: a block)."""
    wide = write_tiny_model(tmp_path / "wide.gguf", n_layer=N_LAYER, n_head=2)
    loaded = DepthModel(wide, n_threads=1, n_ctx=512, cache_types=("q8_0", "q4_0"), flash_attn="on")
    try:
        corpus = calibration_corpus(["prose"], probe_every=2, tokens=512)
        loaded.profile = calibrate(loaded, corpus, probe_every=2, tokens=512)
        options = DepthOptions(margin=0.0, probe_every=2)
        real_events, real = run(loaded, options)
        simulated_events, simulated = run(loaded, replace(options, simulate=True))
    finally:
        loaded.close()
    assert [e.token for e in real_events] == [e.token for e in simulated_events]
    assert real.depths == simulated.depths
    assert min(real.depths) < N_LAYER  # it did exit early


def test_fixed_depth_equals_a_truncated_copy(tmp_path: Path, model: DepthModel) -> None:
    copy = write_tiny_model(tmp_path / "four.gguf", n_layer=N_LAYER, keep_layers=4)
    events, summary = run(model, DepthOptions(fixed_depth=4))
    assert [e.token for e in events] == plain_greedy(copy, len(events))
    assert set(summary.depths) == {4}


def test_a_prompt_longer_than_a_batch_is_probed_at_its_last_token(tmp_path: Path, deep_model: Path) -> None:
    """The prompt is decoded 512 tokens at a time: the first token's probes read the last batch's last
    row (they had read the first batch's, so its token came from the middle of the prompt)."""
    copy = write_tiny_model(tmp_path / "four.gguf", n_layer=N_LAYER, keep_layers=4)
    loaded = DepthModel(deep_model, n_threads=1, n_ctx=2048)
    try:
        prompt_text = " ".join(f"line {i}: {PROMPT}" for i in range(60))
        assert len(loaded.runner.tokenize(prompt_text, add_special=False)) > 2 * loaded.runner.n_batch
        events, _ = run(loaded, DepthOptions(fixed_depth=4), max_tokens=6, prompt_text=prompt_text)
    finally:
        loaded.close()
    assert [e.token for e in events] == plain_greedy(copy, len(events), prompt_text, n_ctx=2048)


def test_a_split_model_reads_out_through_its_last_shards_head(tmp_path: Path, model: DepthModel) -> None:
    """A split GGUF keeps output.weight in its last shard: it had been 'no usable readout'."""
    first = write_tiny_model(tmp_path / "split.gguf", n_layer=N_LAYER, split_max_tensors=40)
    assert first.name == "split-00001-of-00002.gguf"
    split = DepthModel(first, n_threads=1, n_ctx=512)
    try:
        options = DepthOptions(confidence=5.0, probe_every=1)
        events, _ = run(split, options)
    finally:
        split.close()
    whole, _ = run(model, options)
    assert [(e.token, e.depth, e.probes) for e in events] == [(e.token, e.depth, e.probes) for e in whole]
    assert min(e.depth for e in events) < N_LAYER


def test_a_rank_above_the_embedding_width_is_the_full_rank(model: DepthModel) -> None:
    """The 64-wide model's output matrix has rank 64: --rank 100 had been a numpy broadcast traceback."""
    wide, _ = run(model, DepthOptions(probe_every=2, estimator="lowrank", rank=100))
    full_rank, _ = run(model, DepthOptions(probe_every=2, estimator="lowrank", rank=64))
    assert [(e.token, e.depth, e.probes) for e in wide] == [(e.token, e.depth, e.probes) for e in full_rank]


def test_a_damaged_low_rank_cache_is_computed_again_and_one_that_cannot_be_saved_is_one_line(
    model: DepthModel, tmp_path: Path
) -> None:
    """The factors' cache had been read into a traceback (BadZipFile, a pickle refused) when damaged, and
    a cache folder with a file in its way had been a NotADirectoryError."""
    cache = tmp_path / "factors.npz"
    a, b = low_rank_factors(model.head, 4, cache)
    for damage in (cache.read_bytes()[:1000], b"garbage", b""):
        cache.write_bytes(damage)
        again = low_rank_factors(model.head, 4, cache)
        assert np.array_equal(again[0], a) and np.array_equal(again[1], b)
        assert np.array_equal(np.load(cache)["a"], a)  # whole again
    assert sorted(path.name for path in tmp_path.iterdir()) == ["factors.npz"]
    fresh = tmp_path / "fresh" / "depth" / "factors.npz"  # the cache's folders are made as it is saved
    assert np.array_equal(low_rank_factors(model.head, 4, fresh)[0], a) and fresh.exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(EadError, match=f"cannot save the low-rank factors to {re.escape(str(blocker))}/"):
        low_rank_factors(model.head, 4, blocker / "depth" / "factors.npz")


def test_the_free_schedule_rises_and_pays_for_backfill(model: DepthModel) -> None:
    _, free = run(model, DepthOptions(margin=0.0, probe_every=2, schedule="free"))
    assert any(b > a for a, b in itertools.pairwise(free.depths))
    assert free.backfill_blocks > 0


def test_isotonic_regression_is_non_increasing() -> None:
    assert isotonic_nonincreasing([3.0, 5.0, 2.0, 2.5, 1.0]) == [4.0, 4.0, 2.25, 2.25, 1.0]
    profile = isotonic_nonincreasing(list(np.random.default_rng(0).normal(size=20)))
    assert all(b <= a for a, b in itertools.pairwise(profile))


def test_profile_is_saved_whole_and_checked(model: DepthModel, tmp_path: Path, deep_model: Path) -> None:
    path = save_profile(model.profile, tmp_path / "p.json")
    assert load_profile(deep_model, path) == model.profile
    assert list(tmp_path.iterdir()) == [path]
    other = write_tiny_model(tmp_path / "other.gguf", n_layer=N_LAYER, seed=5)
    with pytest.raises(EadError, match="another model file"):
        load_profile(other, path)
    saved = json.loads(path.read_text())
    saved["tables"]["none"][0][0] = float("nan")  # an edit JSON lets through as NaN
    path.write_text(json.dumps(saved))
    with pytest.raises(EadError, match=r"corrupt \(bad tables\)"):
        load_profile(deep_model, path)
    saved["tables"]["none"][0][0] = 1.0
    del saved["tables"]["position"][1:]  # an edit that left one of its three buckets
    path.write_text(json.dumps(saved))
    with pytest.raises(EadError, match=r"corrupt \(bad tables\)"):  # it had been an IndexError at token 33
        load_profile(deep_model, path)
    path.write_text('{"model": 1}')
    with pytest.raises(EadError, match="corrupt"):
        load_profile(deep_model, path)
    with pytest.raises(EadError, match=f"run ead depth calibrate {re.escape(str(other))}$"):
        load_profile(other, tmp_path / "none.json")  # the hint names the file to pass, not its bare name


def test_two_models_of_one_file_name_keep_their_own_profiles(
    model: DepthModel, tmp_path: Path, deep_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profiles were kept by file name alone: calibrating another deep.gguf overwrote this one's, which
    was then refused as made for another file. Keyed by the file's digest too, each keeps its own."""
    monkeypatch.setenv("EAD_CONFIG", str(tmp_path / "config" / "calibration.json"))
    (tmp_path / "elsewhere").mkdir()
    namesake = write_tiny_model(tmp_path / "elsewhere" / deep_model.name, n_layer=N_LAYER, seed=5)
    theirs = replace(model.profile, digest=file_digest(namesake))
    for profile, path in ((model.profile, deep_model), (theirs, namesake)):
        save_profile(profile, profile_path(path))
    assert (load_profile(deep_model), load_profile(namesake)) == (model.profile, theirs)


def test_a_profile_saved_under_the_file_name_alone_still_loads(
    model: DepthModel, tmp_path: Path, deep_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved before profiles were keyed by digest (depth/deep.gguf.json): read, its digest checked."""
    monkeypatch.setenv("EAD_CONFIG", str(tmp_path / "calibration.json"))
    save_profile(model.profile, profile_dir() / f"{deep_model.name}.json")
    assert load_profile(deep_model) == model.profile
    (tmp_path / "elsewhere").mkdir()
    namesake = write_tiny_model(tmp_path / "elsewhere" / deep_model.name, n_layer=N_LAYER, seed=5)
    with pytest.raises(EadError, match=r"deep\.gguf\.json was made for another model file"):
        load_profile(namesake)


def test_a_profile_whose_tables_are_not_an_object_is_corrupt(
    model: DepthModel, tmp_path: Path, deep_model: Path
) -> None:
    path = save_profile(model.profile, tmp_path / "p.json")
    saved = json.loads(path.read_text())
    for key in ("tables", "counts"):  # an edit that made an object a list: it had been an AttributeError
        path.write_text(json.dumps(saved | {key: []}))
        with pytest.raises(EadError, match="is corrupt"):
            load_profile(deep_model, path)


def test_a_profile_whose_probe_layers_calibrate_never_writes_is_corrupt(
    model: DepthModel, tmp_path: Path, deep_model: Path
) -> None:
    """Edited probe layers had been taken as they were: none was an IndexError traceback in generate,
    ValueError in eval; a first one of 0 a '--probe-every must be at least 1' nobody typed; layers past
    the model's or out of order paired the tables' values with other layers, exit 0."""
    path = save_profile(model.profile, tmp_path / "p.json")
    saved = json.loads(path.read_text())
    for probes in ([], [0, 2, 4, 8], [8, 6, 4, 2], [4, 8, 12, 16], [2, 4, 6, 7]):
        rows = {name: [[1.0] * len(probes)] * len(table) for name, table in saved["tables"].items()}
        path.write_text(json.dumps(saved | {"probes": probes, "raw": [1.0] * len(probes), "tables": rows}))
        with pytest.raises(EadError, match=r"corrupt \(bad probe layers\)"):
            load_profile(deep_model, path)


def test_probe_spacing_outside_the_model_is_refused() -> None:
    with pytest.raises(EadError, match=r"--probe-every must be in \[1, 8\]"):
        probe_layers(N_LAYER, 9)
    assert probe_layers(N_LAYER, 3) == (3, 6, 8)


# ------------------------------------------------------------------------------------------ command line


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, deep_model: Path) -> dict[str, str]:
    env = {"EAD_CONFIG": str(tmp_path_factory.mktemp("cfg") / "calibration.json")}
    result = ead(
        "depth",
        "calibrate",
        str(deep_model),
        "--corpus",
        "prose",
        "--tokens",
        "256",
        "--probe-every",
        "2",
        "--threads",
        "1",
        env=env,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert "saved" in result.stderr.decode()
    return env


def depth_generate(model: Path, *extra: str, env: dict[str, str]):
    return ead(
        "depth", "generate", str(model), PROMPT, "--probe-every", "2", "--threads", "1", *extra, env=env
    )


def test_generate_probes_where_the_profile_was_calibrated_unless_told(
    config: dict[str, str], deep_model: Path
) -> None:
    """Without --probe-every, generate probes at the profile's layers (calibrated every 2 blocks): it had
    probed every 4, half of them, unless the calibration's spacing was given again."""
    args = ["depth", "generate", str(deep_model), PROMPT, "--threads", "1", "--max-tokens", "4"]
    for extra, layers in (((), {"2", "4", "6", "8"}), (("--probe-every", "4"), {"4", "8"})):
        result = ead(*args, "--format", "jsonl", *extra, env=config)
        assert result.returncode == 0, result.stderr.decode()
        tokens = [json.loads(line) for line in result.stdout.decode().splitlines()[:-1]]
        assert tokens and all(set(token["probes"]) <= layers for token in tokens)
        probed = set().union(*(token["probes"] for token in tokens))  # up to each token's exit
        assert ("2" in probed) == ("2" in layers), probed


def test_generate_jsonl_and_stats(config: dict[str, str], deep_model: Path) -> None:
    result = depth_generate(deep_model, "--max-tokens", "12", "--format", "jsonl", "--stats", env=config)
    assert result.returncode == 0, result.stderr.decode()
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    tokens, summary = records[:-1], records[-1]
    assert len(tokens) == 12 and summary["type"] == "summary"
    assert [t["depth"] for t in tokens] == summary["depths"]
    assert all(int(layer) <= t["depth"] or int(layer) == N_LAYER for t in tokens for layer in t["probes"])
    assert "mean depth" in result.stderr.decode() and "depth histogram" in result.stderr.decode()


def test_generate_takes_llama_clis_escapes_as_ead_generate_does(
    config: dict[str, str], deep_model: Path
) -> None:
    """depth generate had sent -p 'a\\nb' and -r '\\n' as typed, a backslash and an n: generate's -e rule
    (on by default; --no-escape) holds for its prompt and its reverse prompts too."""

    def answer(*extra: str) -> tuple[int, str]:
        args = ["depth", "generate", str(deep_model), "--threads", "1", "-n", "8", "--format", "jsonl"]
        result = ead(*args, *extra, env=config)
        assert result.returncode == 0, result.stderr.decode()
        *tokens, summary = (json.loads(line) for line in result.stdout.decode().splitlines())
        return summary["prompt_tokens"], "".join(token["text"] for token in tokens)

    meant = answer("--no-escape", "-p", MEANT)
    assert answer("-p", TYPED) == answer("-e", TYPED) == meant
    literal = answer("--no-escape", "-p", TYPED)
    assert literal[0] > meant[0]
    text = meant[1]
    stop = text[len(text) // 2 :][:2]  # two characters from the answer's middle, typed as their bytes
    typed_stop = "".join(f"\\x{byte:02x}" for byte in stop.encode())
    assert answer("-p", MEANT, "-r", typed_stop) == (meant[0], text[: text.index(stop)])
    assert answer("--no-escape", "-p", MEANT, "-r", typed_stop) == meant


def test_batch_size_help_says_what_a_batch_is_in_depth() -> None:
    """--batch-size, declared once with generate's, had told depth's users of drafts and lookup guesses,
    which depth has none of: its help there says what it reads in batches."""

    def batch_size_line(*command: str) -> str:
        return next(line for line in help_text(command).splitlines() if "--batch-size" in line)

    for command in ("calibrate", "generate", "eval"):
        line = batch_size_line("depth", command)
        assert "draft" not in line and "lookup" not in line
        assert "teacher-forced windows" in line
    assert "a draft or a lookup guess" in batch_size_line("generate")


def test_stats_at_a_narrow_terminal_are_wrapped_at_spaces(config: dict[str, str], deep_model: Path) -> None:
    """As ead generate's: at a terminal 40 columns wide each line of figures wraps between words (it had
    been left to the terminal, which broke it mid-word); in a pipe each stays one line."""
    args = ("depth", "generate", str(deep_model), PROMPT, "--probe-every", "2", "--threads", "1")
    args += ("--max-tokens", "12", "--stats", "--no-color")
    narrow = at_a_terminal(*args, env=config, columns=40, stream=2).decode()
    lines = narrow.splitlines()
    assert max(map(len, lines)) <= 40 and len(lines) > 5, narrow
    piped = ead(*args, env=config).stderr.decode().splitlines()
    assert [line for line in piped if line.startswith("12 tokens (length)")]
    words = " ".join(line.rstrip() for line in lines).split()  # a word broken across lines: two words here
    timeless = re.compile(r"\d[\d.,]*")  # the timings differ between the two runs
    piped_words = " ".join(piped).split()
    assert [timeless.sub("#", word) for word in words] == [timeless.sub("#", word) for word in piped_words]


@pytest.mark.parametrize("command", ["generate", "calibrate", "eval"])
@pytest.mark.parametrize("address", ["ftp://x/y", "http://127.0.0.1:8080", "HTTP:/gpu-box"])
def test_a_server_address_is_refused_as_no_model_depth_can_run(
    tmp_path: Path, command: str, address: str
) -> None:
    """ead depth runs the model's layers itself: an address had been looked up as a file, 'model file not
    found: ftp:/x/y' (its slashes collapsed)."""
    args = ["depth", command, address, *(["hi"] if command == "generate" else [])]
    result = ead(*args, env={"EAD_CONFIG": str(tmp_path / "calibration.json")})
    expected = f"{quoted(address)} is a server's address, which this command cannot use: it runs the model"
    assert assert_one_line_error(result, 2).startswith(f"error: {expected}")
    assert not list(tmp_path.iterdir())


def test_generate_takes_the_context_size_its_error_names(config: dict[str, str], deep_model: Path) -> None:
    """A prompt too long says 'raise --ctx': depth generate had no such option (its context was 4096)."""
    args = ("depth", "generate", str(deep_model), "z" * 300, "--raw", "--probe-every", "2", "--threads", "1")
    too_long = ead(*args, "--ctx", "256", env=config)  # llama.cpp rounds a context up to 256 tokens
    assert_one_line_error(too_long, 2, "the prompt is 300 tokens, too many for the context of 256", "--ctx")
    result = ead(*args, "--ctx", "320", "--format", "jsonl", env=config)
    assert result.returncode == 0, result.stderr.decode()
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    assert summary["finish_reason"] == "length"
    assert (summary["prompt_tokens"], summary["generated"]) == (300, 212)  # 320 is rounded up to 512


def test_generate_colours_tokens_with_a_legend(config: dict[str, str], deep_model: Path) -> None:
    result = depth_generate(deep_model, "--max-tokens", "8", env={**config, "FORCE_COLOR": "1"})
    assert result.returncode == 0
    assert "exit depth (of 8 blocks)" in result.stderr.decode()
    assert "\x1b[" in result.stdout.decode()


def test_a_ctrl_c_after_a_token_is_chosen_counts_only_tokens_shown(model: DepthModel) -> None:
    """The summary had counted a token before its event was made: a Ctrl-C in between (a full-suite run
    here, once: 14 generated, 13 shown) left one counted that no output showed. It is counted with the
    event it makes (``last_event``, which stream_answer shows if the loop did not hand it out). SIGINT is
    tripped as the third token's bytes are looked up."""
    prompt = model.runner.tokenize(PROMPT, add_special=False)
    response = model.generate(prompt, DepthOptions(), SamplingParams(), max_tokens=10)
    handed_out = indices_before_ctrl_c(response, Runner.token_bytes.__code__, 3)
    assert handed_out == [0, 1]
    last = response.last_event
    shown = handed_out + ([last.index] if last is not None and last.index > handed_out[-1] else [])
    assert response.summary().generated == len(shown)


def test_ctrl_c_keeps_the_partial_answer_its_summary_and_stats(deep_model: Path) -> None:
    """As ead generate: the answer so far, its jsonl summary and --stats, then 'interrupted' and exit 130;
    it had stopped with neither (in text, the answer's last line unended before 'error: interrupted')."""
    args = ["depth", "generate", str(deep_model), "--fixed-depth", "4", "--max-tokens", "4000"]
    process = subprocess.Popen(
        [EAD, *args, "--threads", "1", "--format", "jsonl", "--stats", PROMPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # streaming has begun
    process.send_signal(signal.SIGINT)
    rest, err = read_to_the_end(process)
    assert process.returncode == 130, err.decode()
    lines = (first + rest).decode().splitlines()
    summary = json.loads(lines[-1])
    assert summary["type"] == "summary" and summary["finish_reason"] == "interrupted"
    assert 1 <= summary["generated"] == len(lines) - 1 < 4000
    errors = err.decode().splitlines()
    assert f"{counted(summary['generated'], 'token')} (interrupted)" in errors[0]
    assert "Traceback" not in err.decode()
    assert errors[-1] == "error: interrupted"


def test_calibrate_reads_the_tokens_asked_in_whole_windows(deep_model: Path, tmp_path: Path) -> None:
    """--tokens 256 over code,prose had read 512 (a window each), and 600 had read 1024 (each corpus's 300
    rounded up to two windows): the tokens are shared out in whole windows, rounded down, and fewer
    than a window a corpus is refused, saying why."""
    env = {"EAD_CONFIG": str(tmp_path / "calibration.json")}
    base = ("depth", "calibrate", str(deep_model), "--probe-every", "2", "--threads", "1")
    result = ead(*base, "--tokens", "600", env=env)  # code,prose: a window of 256 each, 88 left unread
    said = result.stderr.decode()
    assert result.returncode == 0, said
    assert "window 2/2" in said and "window 3/" not in said
    assert "448 tokens of code,prose" in said  # two windows, less their prompts' 32 tokens each
    one = ead(*base, "--tokens", "600", "--corpus", "prose", env=env)  # two windows of the one corpus
    assert "window 2/2" in one.stderr.decode() and "448 tokens of prose" in one.stderr.decode()
    refused = ead(*base, "--tokens", "256", env=env)
    assert assert_one_line_error(refused, 2) == (
        "error: --tokens must be at least 512 (a window of 256 tokens for each of 2 corpora), got 256"
    )
    alone = ead(*base, "--tokens", "255", "--corpus", "prose", env=env)
    assert assert_one_line_error(alone, 2) == "error: --tokens must be at least 256 (a window), got 255"


def test_eval_reads_the_tokens_asked_in_whole_windows(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """depth eval --tokens 300 had scored two windows of each corpus (300 rounded up to 512), and
    --tokens 64 a whole window: as calibrate, whole windows rounded down, and fewer than one refused."""
    out = tmp_path / "eval.json"
    args = ("depth", "eval", str(deep_model), "--threads", "1", "--no-timing", "--out", str(out))
    result = ead(*args, "--tokens", "300", env=config)
    assert result.returncode == 0, result.stderr.decode()
    scored = {
        corpus: {row["tokens"] for row in rows}
        for corpus, rows in json.loads(out.read_text())["perplexity"].items()
    }
    assert scored == {"code": {224}, "prose": {224}}  # one window each, less its prompt's 32 tokens
    refused = ead(*args, "--tokens", "255", env=config)
    assert assert_one_line_error(refused, 2) == "error: --tokens must be at least 256 (a window), got 255"


def test_ctrl_c_in_calibration_saves_nothing_and_leaves_no_folder(deep_model: Path, tmp_path: Path) -> None:
    """Ctrl-C during the teacher forcing: 'interrupted', exit 130, no profile, and not the folders the
    check that it could be saved had made (they had been left behind)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"word{index} hello wörld" for index in range(20000)))
    config = tmp_path / "cfg" / "calibration.json"
    args = ["depth", "calibrate", str(deep_model), "--corpus", str(corpus), "--tokens", "60000"]
    process = subprocess.Popen(
        [EAD, *args, "--probe-every", "2", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "EAD_CONFIG": str(config)},
        preexec_fn=interruptible,
    )
    assert process.stderr is not None
    while not (line := process.stderr.readline()).startswith(b"window 1/"):  # teacher forcing has begun
        assert line, "the calibration ended before its first window"
    process.send_signal(signal.SIGINT)
    rest, err = read_to_the_end(process)
    assert process.returncode == 130, err.decode()
    assert rest == b"" and "Traceback" not in err.decode()
    assert err.decode().splitlines()[-1] == "error: interrupted"
    assert not config.parent.exists()


def test_a_depth_profile_that_is_no_file_is_refused_unread(deep_model: Path, tmp_path: Path) -> None:
    """A pipe (mkfifo) where the model's profile is kept had depth generate wait for ever for a writer,
    and depth calibrate, after all its teacher forcing, for a reader; a folder had been read by depth
    generate, and failed as 'Is a directory' (calibrate's 'it is a folder': test_bad_inputs_are_one_line).
    Each is refused before any work, in one line, and left as it was."""
    config = {"EAD_CONFIG": str(tmp_path / "calibration.json")}
    path = tmp_path / "depth" / f"{deep_model.name}-{file_digest(deep_model)}.json"
    path.parent.mkdir()
    generate = ("generate", str(deep_model), PROMPT, "--threads", "1")
    calibrate = ("calibrate", str(deep_model), "--corpus", "prose", "--threads", "1")
    refused = f"error: {path} is not a file: ead keeps a depth profile in one; move it away"
    os.mkfifo(path)
    for command in (generate, calibrate):
        assert assert_one_line_error(ead("depth", *command, env=config), 1) == refused  # no 'window 1/4'
    assert stat.S_ISFIFO(path.stat().st_mode)
    path.unlink()
    path.mkdir()
    assert assert_one_line_error(ead("depth", *generate, env=config), 1) == refused
    assert path.is_dir() and not any(path.iterdir())


def test_a_pipe_in_place_of_the_low_rank_factors_is_computed_over(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """The factors' cache is ead's own: a pipe (mkfifo) there had been waited on for ever for a writer; it
    is not read, and the factors computed are saved in its place, as over a damaged cache."""
    cache = tmp_path / "cache"
    factors = cache / "depth" / f"{deep_model.name}-{file_digest(deep_model)}-r4.npz"
    factors.parent.mkdir(parents=True)
    os.mkfifo(factors)
    args = ("depth", "generate", str(deep_model), PROMPT, "--estimator", "lowrank", "--rank", "4")
    result = ead(*args, "--threads", "1", "--max-tokens", "2", env={**config, "EAD_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr.decode()
    assert np.load(factors)["a"].shape[1] == 4


def test_the_advice_to_calibrate_is_a_command_to_paste(deep_model: Path, tmp_path: Path) -> None:
    """With no profile, depth generate's advice had named the file the model resolved to (a home folder
    spelled out, an alias's file in the cache) and left out the --probe-every that generate then asked
    for: it is the command to paste, the model as typed, with the --probe-every given."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(deep_model, home / "deep.gguf")
    env = {"HOME": str(home), "EAD_CONFIG": str(tmp_path / "config" / "calibration.json")}
    base = ("depth", "generate", "~/deep.gguf", PROMPT, "--threads", "1", "--max-tokens", "2")
    line = assert_one_line_error(ead(*base, "--probe-every", "2", env=env), 1, "no depth profile")
    command = line.split(": run ", 1)[1]
    assert command == "ead depth calibrate '~/deep.gguf' --probe-every 2"
    calibrated = ead(*shlex.split(command)[1:], "--corpus", "prose", "--tokens", "256", env=env)
    assert calibrated.returncode == 0, calibrated.stderr.decode()
    assert ead(*base, "--probe-every", "2", env=env).returncode == 0
    other = assert_one_line_error(ead(*base, "--probe-every", "3", env=env), 2)
    assert other.endswith(": run ead depth calibrate '~/deep.gguf' --probe-every 3")
    (saved,) = (tmp_path / "config" / "depth").iterdir()
    saved.write_text("[]")
    corrupt = assert_one_line_error(ead(*base, "--probe-every", "2", env=env), 1, "is corrupt")
    assert corrupt.endswith(": run ead depth calibrate '~/deep.gguf' --probe-every 2 again")


# llama.cpp's line for the KV cache it makes, and for flash attention (EAD_VERBOSE shows its log)
KV_LINE = re.compile(r"llama_kv_cache: size = .*, K \((\w+)\): .*, V \((\w+)\): ")
FLASH_LINE = re.compile(r"llama_context: flash_attn += (\w+)")
LOAD_LINE = re.compile(r"\(load_mode = ([\w+]+)\)")


def test_every_depth_command_takes_generates_cache_flash_and_load_settings(tmp_path: Path) -> None:
    """-ctk/-ctv, -fa and -lm (or --no-mmap, --mlock) reach llama.cpp as its log says it made them, on each
    depth command; the defaults are f16, auto and a mapping."""
    wide = write_tiny_model(tmp_path / "wide.gguf", n_layer=N_LAYER, n_head=2)
    env = {"EAD_CONFIG": str(tmp_path / "config" / "calibration.json"), "EAD_VERBOSE": "1"}
    settings = ("-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on", "--no-mmap")
    commands = (
        ("calibrate", "--corpus", "prose", "--tokens", "256", "--probe-every", "2"),
        ("generate", PROMPT, "--probe-every", "2", "-n", "4"),
        ("eval", "--tokens", "256", "--no-timing"),
    )
    for command, *extra in commands:
        result = ead("depth", command, str(wide), "--threads", "1", *extra, *settings, env=env)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        log = result.stderr.decode()
        made = (set(KV_LINE.findall(log)), set(FLASH_LINE.findall(log)), set(LOAD_LINE.findall(log)))
        assert made == ({("q8_0", "q4_0")}, {"enabled"}, {"none"}), command
    default = ead(
        "depth", "generate", str(wide), PROMPT, "--threads", "1", "-n", "2", "--fixed-depth", "4", env=env
    )
    assert default.returncode == 0, default.stderr.decode()[-2000:]
    log = default.stderr.decode()
    made = (KV_LINE.findall(log), FLASH_LINE.findall(log), LOAD_LINE.findall(log))
    assert made == ([("f16", "f16")], ["auto"], ["mmap"])  # auto maps the file on a CPU
    locked = ead("depth", "generate", str(wide), PROMPT, "-n", "2", "--fixed-depth", "4", "--mlock", env=env)
    assert LOAD_LINE.findall(locked.stderr.decode()) == ["mmap+mlock"], locked.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-ctk", "q3_k"], "--cache-type-k must be one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "),
        (
            ["-ctv", "q8_0", "-fa", "off"],
            "--cache-type-v q8_0 needs flash attention: leave --flash-attn auto",
        ),
        (["-fa", "maybe"], "--flash-attn must be on, off or auto, got 'maybe'"),
        (["-lm", "lock"], "--load-mode must be one of auto, none, mmap, mlock, mmap+mlock, dio, got 'lock'"),
        (
            ["-lm", "mmap", "--no-mmap"],
            "--load-mode says how the weights load: leave out --no-mmap and --mlock",
        ),
    ],
)
@pytest.mark.parametrize(
    "command", [("calibrate", "--corpus", "prose"), ("generate", PROMPT, "--fixed-depth", "2"), ("eval",)]
)
def test_a_bad_cache_flash_or_load_setting_is_refused_before_the_model_is_looked_for(
    tmp_path: Path, command: tuple[str, ...], args: list[str], fragment: str
) -> None:
    name, *extra = command
    result = ead("depth", name, str(tmp_path / "no-such.gguf"), *extra, *args)
    assert_one_line_error(result, 2, fragment)


def test_bad_inputs_are_one_line(config: dict[str, str], deep_model: Path, tmp_path: Path) -> None:
    base = ("depth", "generate", str(deep_model), PROMPT, "--threads", "1")
    assert_one_line_error(ead(*base, "--probe-every", "9", env=config), 2, "--probe-every")
    advice = f"run ead depth calibrate {deep_model} --probe-every 3"
    assert_one_line_error(ead(*base, "--probe-every", "3", env=config), 2, advice)
    assert_one_line_error(ead(*base, "--margin", "-1", env=config), 2, "--margin")
    missing = {"EAD_CONFIG": str(tmp_path / "none" / "calibration.json")}
    assert_one_line_error(ead(*base, env=missing), 1, "no depth profile")
    # Values wrong whatever the model are refused before the profile is looked for, by the name typed.
    for option in ("--probe-every", "--estimator-k", "--rank", "--fixed-depth"):
        assert_one_line_error(ead(*base, option, "0", env=missing), 2, f"{option} must be at least 1, got 0")
    assert_one_line_error(ead(*base, "--ctx", "8", env=missing), 2, "--ctx must be at least 16, got 8")
    for command in ("generate", "calibrate", "eval"):  # a blank model is a usage error, as --large '' is
        blank = ead("depth", command, " ", env=missing)
        assert "unknown model alias" not in assert_one_line_error(blank, 2, "MODEL must name a model")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    # calibrate's values, before the model loads (the missing model file would be the error otherwise)
    calibrate = ("depth", "calibrate", str(tmp_path / "no-such.gguf"), "--threads", "1")
    for option, value, message in (
        ("--corpus", str(empty), f"the corpus {empty} is empty"),
        ("--corpus", "poetry", "cannot read corpus file poetry"),
        ("--corpus", "", "--corpus names no corpus"),
        ("--corpus", " , ", "--corpus names no corpus"),
        (
            "--tokens",
            "511",
            "--tokens must be at least 512 (a window of 256 tokens for each of 2 corpora), got",
        ),
        ("--probe-every", "0", "--probe-every must be at least 1, got 0"),
    ):
        assert_one_line_error(ead(*calibrate, option, value, env=missing), 2, message)
    assert not (tmp_path / "none").exists()  # nothing half-written
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "depth").write_text("")  # a file where the profiles' folder goes
    in_the_way = {"EAD_CONFIG": str(blocked / "calibration.json")}
    # one line: said before the teacher forcing (no "window 1/1"), not in a traceback after it
    assert_one_line_error(
        ead("depth", "calibrate", str(deep_model), "--corpus", "prose", "--threads", "1", env=in_the_way),
        1,
        f"cannot save the depth profile to {blocked}/depth/deep.gguf-{file_digest(deep_model)}.json: "
        f"{blocked}/depth is not a folder",
    )
    folder = {"EAD_CONFIG": str(tmp_path / "folder" / "calibration.json")}
    profile = tmp_path / "folder" / "depth" / profile_path(deep_model).name
    profile.mkdir(parents=True)  # a folder where the profile goes: said after the teacher forcing, too
    assert_one_line_error(
        ead("depth", "calibrate", str(deep_model), "--corpus", "prose", "--threads", "1", env=folder),
        1,
        f"cannot save the depth profile to {profile}: it is a folder",
    )
    headless = tmp_path / "headless.gguf"
    writer = gguf.GGUFWriter(headless, "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_one_line_error(ead("depth", "calibrate", str(headless), env=missing), 1, "no usable readout")
    # depth eval's own values, before the model loads (a missing file would be the error otherwise)
    evaluate = ("depth", "eval", str(tmp_path / "no-such.gguf"), "--no-timing")
    assert_one_line_error(
        ead(*evaluate, "--tokens", "0", env=missing), 2, "--tokens must be at least 256 (a window), got 0"
    )
    no_tokens = ead(*evaluate, "--max-tokens", "0", env=missing)  # a ZeroDivisionError after the quality part
    assert_one_line_error(no_tokens, 2, "--max-tokens must be at least 1, got 0")
    assert_one_line_error(ead(*evaluate, "--ids", "1-", env=missing), 2, "--ids: '1-' is not a number")
    assert_one_line_error(ead(*evaluate, "--tune-ids", "0,999", env=missing), 2, "--tune-ids: no task 999")
    # a margin tuned on a task it is then reported on: the verdict had been measured on what was tuned
    shared = ead(*evaluate, "--ids", "1,3,5", "--tune-ids", "0-3", env=missing)
    assert_one_line_error(shared, 2, "--tune-ids and --ids share HumanEval/1: tune on other tasks")
    empty = ead(*evaluate, "--out", "", env=missing)  # it had been the current folder: "is not a file"
    assert_one_line_error(empty, 2, "Invalid value for '--out': an empty path names no file or folder")
    out = blocked / "depth" / "eval.json"  # it had been a FileExistsError traceback after the whole eval
    assert_one_line_error(
        ead(*evaluate, "--out", str(out), env=missing), 2, f"cannot save the evaluation to {out}: "
    )
    # its folders are made to check they take a file, and removed again when the run stops (no model)
    fresh = tmp_path / "fresh" / "eval.json"
    assert_one_line_error(ead(*evaluate, "--out", str(fresh), env=missing), 1, "no-such.gguf")
    assert not fresh.parent.exists()


def test_a_verdict_counts_one_operating_point_in_the_singular() -> None:
    """One point that breaks the rule and one that keeps it: counted as every count is said (the verdict
    had said '1 operating points break the rule', '1 points save')."""
    rows = [
        {"rule": "fixed 4", "flop_reduction": 0.5, "ppl_rise": 2.0},
        {"rule": "fixed 20", "flop_reduction": 0.2, "ppl_rise": 0.0},
    ]
    said = verdict({"model": "deep.gguf", "perplexity": {"code": rows}})
    assert said.startswith(
        "deep.gguf: falsified (1 operating point breaks the rule, e.g. fixed 4 on code: 50% fewer FLOPs, "
        "perplexity x3; 1 point saves >= 15% within 1% perplexity)"
    ), said


def test_eval_reports_every_operating_point_and_a_verdict(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """The quality part alone first (--no-timing), then the timing part, which reuses it from --out."""
    out = tmp_path / "eval.json"
    args = ("depth", "eval", str(deep_model), "--tokens", "256", "--ids", "1", "--max-tokens", "6")
    quality = ead(*args, "--threads", "1", "--out", str(out), "--no-timing", env=config)
    assert quality.returncode == 0, quality.stderr.decode()
    assert "not measured" in quality.stdout.decode().splitlines()[-1]
    assert "humaneval" not in json.loads(out.read_text())
    assert b"note: the programs run as root" not in quality.stderr  # no HumanEval, no sandbox
    result = ead(*args, "--tune-ids", "0", "--threads", "1", "--out", str(out), env=config)
    assert result.returncode == 0, result.stderr.decode()
    assert "reused" in result.stderr.decode()
    # as root with a Python nobody cannot run (this venv's, if under /root), said once for both HumanEval runs
    assert result.stderr.count(b"note: the programs run as root") == (sandbox_note() is not None)
    verdict = result.stdout.decode().strip().splitlines()[-1]  # after the tables
    assert verdict.startswith("deep.gguf: ") and "falsified" in verdict and "not measured" not in verdict
    report = json.loads(out.read_text())
    assert verdict == report["verdict"]
    for corpus in ("code", "prose"):
        rules = [row["rule"] for row in report["perplexity"][corpus]]
        assert {"emad m=0", "fixed k=8", "confidence h0=1", "emad m=1 schedule=free"} <= set(rules)
        full = next(row for row in report["perplexity"][corpus] if row["rule"] == "fixed k=8")
        assert full["ppl_rise"] == 0.0 and full["flop_reduction"] == pytest.approx(0.0)
    assert {name: set(entry) for name, entry in report["estimators"].items()} == {
        "full": {"probe_ms"},
        "topk": {"probe_ms", "mae_bits", "decisions_changed"},
        "lowrank": {"probe_ms", "mae_bits", "decisions_changed"},
    }
    assert "full depth (no callback)" in report["humaneval"]
    assert {"emad m=0", "emad m=4"} <= set(report["tuning"]) and report["tuning"]["emad m=0"]["tasks"] == [
        "HumanEval/0"
    ]
    assert report["stop_timing"][0]["stop"] == "full depth (no callback)"
    assert out.with_suffix(".png").exists()


def test_eval_measures_a_damaged_quality_part_again(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """An --out whose quality part was edited, damaged or made for other operating points (an older ead)
    is measured again, not read into a traceback; the file is then whole again."""
    out = tmp_path / "eval.json"
    args = ("depth", "eval", str(deep_model), "--tokens", "256", "--threads", "1", "--out", str(out))
    first = ead(*args, "--no-timing", env=config)
    assert first.returncode == 0, first.stderr.decode()
    whole = json.loads(out.read_text())
    code = whole["perplexity"]["code"]
    damaged = [
        whole | {"perplexity": 5},
        whole | {"perplexity": {"code": [{"rule": "emad m=0"}], "prose": []}},
        whole | {"perplexity": {c: rows[1:] for c, rows in whole["perplexity"].items()}},
        whole | {"estimators": {"topk": 1}},
        # NaN (Python's JSON reads it) had been reused and written again: no JSON for other readers
        whole | {"perplexity": whole["perplexity"] | {"code": [r | {"perplexity": math.nan} for r in code]}},
        # read by no table, they had been carried into the new file as edited
        whole | {"stability": "x"},
        whole | {"stability": []},
        whole | {"stability": [{"margin": "x"}]},
        whole | {"profiles": 5},
        whole | {"profiles": {**whole["profiles"], "code": [1.0]}},
    ]
    for edit in damaged:
        out.write_text(json.dumps(edit))
        again = ead(*args, "--no-timing", env=config)
        assert again.returncode == 0, again.stderr.decode()
        assert "reused" not in again.stderr.decode()
        measured = json.loads(out.read_text())
        assert [measured[key] for key in ("perplexity", "stability", "profiles")] == [
            whole[key] for key in ("perplexity", "stability", "profiles")
        ]


def test_a_ctrl_c_while_the_plot_is_written_leaves_the_old_plot_whole(tmp_path: Path) -> None:
    """Tripped as the PNG writer's second chunk is out: the plot had been cut there."""
    pytest.importorskip("matplotlib")
    png = pytest.importorskip("PIL.PngImagePlugin")
    rows = [
        {"rule": "emad m=0", "flop_ratio": 0.5, "ppl_rise": 0.25},
        {"rule": "fixed k=8", "flop_ratio": 1.0, "ppl_rise": 0.0},
    ]
    result = {"model": "deep.gguf", "perplexity": {"code": rows, "prose": rows}}
    path = tmp_path / "eval.png"
    assert plot(result, path) is None
    before = path.read_bytes()
    with ctrl_c_at_return(png.putchunk.__code__, 2) as chunks:
        plot(result | {"model": "other.gguf"}, path)
    assert len(chunks) >= 2 and path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["eval.png"]


def test_eval_out_is_a_file_and_an_empty_one_holds_no_previous_results(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """A device as --out had been read for previous results: /dev/zero until memory ran out (an OOM kill),
    /dev/null as 'not JSON'; an empty file (mktemp's) was 'not JSON' too."""

    def three_gibibytes_at_most() -> None:  # a regression ends in a MemoryError, not the machine's memory
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))

    evaluate = [EAD, "depth", "eval", str(tmp_path / "no-such.gguf"), "--no-timing", "--out"]
    for device in ("/dev/zero", "/dev/null"):
        result = subprocess.run(
            [*evaluate, device], capture_output=True, timeout=120, preexec_fn=three_gibibytes_at_most
        )
        assert_one_line_error(result, 2, f"--out {device} is not a file")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    args = ("depth", "eval", str(deep_model), "--tokens", "256", "--threads", "1", "--no-timing")
    result = ead(*args, "--out", str(empty), env=config)
    assert result.returncode == 0, result.stderr.decode()
    assert "perplexity" in json.loads(empty.read_text())


def test_eval_out_and_its_plot_are_two_files_said_before_the_eval(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """--out eval.png had written the figures there, then the plot over them ('wrote eval.png and
    eval.png'), exit 0: the figures lost. A folder where the plot goes had been an error after the whole
    eval, its verdict unshown. Both are one line before the model loads (no such model here)."""
    args = ("depth", "eval", str(tmp_path / "no-such.gguf"), "--no-timing", "--out")
    png = tmp_path / "eval.png"
    assert_one_line_error(ead(*args, str(png), env=config), 2, f"--out {png} is where the plot goes")
    (tmp_path / "eval.png").mkdir()
    out = tmp_path / "eval.json"
    assert_one_line_error(ead(*args, str(out), env=config), 2, f"cannot save the plot to {png}: ")
    assert not out.exists()


def test_eval_refuses_an_out_that_is_the_profile_it_reads(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """--out naming the model's own depth profile (or a link to it) had been read as previous figures,
    then written over with the evaluation: the next depth command found a corrupt profile. Refused in one
    line before the evaluation, the profile as it was (a copy: the module's config stays whole)."""
    folder = tmp_path / "cfg"
    (folder / "depth").mkdir(parents=True)
    env = {"EAD_CONFIG": str(folder / "calibration.json")}
    profile = profile_path(deep_model).name
    saved = Path(config["EAD_CONFIG"]).parent / "depth" / profile
    (folder / "depth" / profile).write_bytes(saved.read_bytes())
    link = tmp_path / "eval.json"
    link.symlink_to(folder / "depth" / profile)
    args = ("depth", "eval", str(deep_model), "--tokens", "256", "--threads", "1", "--no-timing", "--out")
    for out in (folder / "depth" / profile, link):
        refused = ead(*args, str(out), env=env)
        assert_one_line_error(refused, 2, f"--out {out} is the depth profile ead depth eval reads")
        assert (folder / "depth" / profile).read_bytes() == saved.read_bytes()
        assert not out.with_suffix(".png").exists()


def test_eval_without_out_refuses_a_closed_stdout(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """Without --out the tables and the verdict on stdout are all an eval leaves: with stdout closed
    (``>&-``) it had run to the end, shown nothing, exit 0. With --out the figures still go to the file."""
    args = [EAD, "depth", "eval", str(deep_model), "--tokens", "256", "--threads", "1", "--no-timing"]

    env = {**os.environ, **config}

    def without_stdout(*extra: str) -> subprocess.CompletedProcess:
        line = f"{shlex.join([*args, *extra])} >&-"
        return subprocess.run(["bash", "-c", line], capture_output=True, env=env, timeout=120)

    assert_one_line_error(without_stdout(), 1, "cannot write the evaluation: stdout is closed")
    out = tmp_path / "eval.json"
    saved = without_stdout("--out", str(out))
    assert saved.returncode == 0, saved.stderr.decode()
    assert "verdict" in json.loads(out.read_text())


def test_eval_saves_its_figures_when_the_tables_reader_is_gone(
    config: dict[str, str], deep_model: Path, tmp_path: Path
) -> None:
    """``ead depth eval --out F | head``: the tables had come first, and the closed pipe ended the run
    there (141), the figures of the whole evaluation not saved."""
    out = tmp_path / "eval.json"
    args = ("depth", "eval", str(deep_model), "--tokens", "256", "--threads", "1", "--no-timing")
    result = ead_to_a_closed_pipe(*args, "--out", str(out), env=config)
    assert result.returncode == 141, result.stderr.decode()
    assert "verdict" in json.loads(out.read_text()) and out.with_suffix(".png").exists()


def test_the_wall_clock_reference_stops_at_a_full_context_as_depths_loop_does(
    model: DepthModel, deep_model: Path
) -> None:
    """``ead depth eval --max-tokens 100000``: the reference loop had fed past the context, '4097 tokens do
    not fit the context of 4096 tokens' after the whole quality part; it ends where generate ends."""
    plain = Runner(deep_model, name="plain", n_ctx=model.runner.n_ctx, n_threads=1)
    try:
        prompt = model.runner.tokenize(PROMPT, add_special=False)
        out, _ = plain_greedy_ms(plain, prompt, max_tokens=10 * model.runner.n_ctx)
    finally:
        plain.close()
    events, summary = run(model, DepthOptions(fixed_depth=N_LAYER), max_tokens=10 * model.runner.n_ctx)
    assert summary.finish_reason == "length" and len(prompt) + len(events) == model.runner.n_ctx
    assert out == [event.token for event in events]

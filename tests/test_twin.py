"""Random-weight twins (scripts/write_twin.py): real shapes and types, a real tokenizer, a mark, and
llama.cpp loads and runs them. Timing equivalence with the real model is measured, not tested here
(docs/where-it-pays.md)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_cli import assert_one_line_error, ead, large_args

from ead_cli.runner import Runner

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import write_twin  # noqa: E402
from bench_overhead import LOOPS  # noqa: E402


def write(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "write_twin.py"), *args], capture_output=True, timeout=120
    )


def tensors(path: Path) -> list[tuple[str, tuple[int, ...], int]]:
    return [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type)) for t in gguf.GGUFReader(path).tensors
    ]


def strings(path: Path, key: str) -> list[bytes]:
    field = gguf.GGUFReader(path).fields[key]
    return [bytes(field.parts[i]) for i in field.data]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory, tiny_small: Path) -> Path:
    out = tmp_path_factory.mktemp("twin") / "tiny-twin.gguf"
    result = write("--shape", "qwen2-tiny", "--tokenizer-from", str(tiny_small), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_a_twin_has_the_shapes_types_tokenizer_and_mark(twin: Path, tiny_small: Path) -> None:
    shape = write_twin.SHAPES["qwen2-tiny"]
    assert tensors(twin) == [(s.name, s.shape, int(s.kind)) for s in write_twin.q4_k_m_tensors(shape)]
    kinds = {kind for _, _, kind in tensors(twin)}
    assert kinds == {int(gguf.GGMLQuantizationType.F32), int(gguf.GGMLQuantizationType.Q4_K),
                     int(gguf.GGMLQuantizationType.Q6_K)}  # fmt: skip
    source = strings(tiny_small, "tokenizer.ggml.tokens")
    assert strings(twin, "tokenizer.ggml.tokens") == [*source, b"[PAD267]"]  # padded as Qwen pads
    assert strings(twin, "tokenizer.ggml.merges") == strings(tiny_small, "tokenizer.ggml.merges")
    assert strings(twin, "tokenizer.chat_template") == strings(tiny_small, "tokenizer.chat_template")
    assert strings(twin, write_twin.TWIN_KEY) == [b"qwen2-tiny"]
    assert not twin.with_name(twin.name + ".partial").exists()


def test_its_weights_spread_like_a_trained_models(twin: Path) -> None:
    for tensor in gguf.GGUFReader(twin).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all()
        if tensor.name.endswith("norm.weight"):
            assert (values == 1).all()
        elif tensor.name.endswith(".weight"):
            assert 0.01 < values.std() < 0.05 and abs(values.mean()) < 0.005, tensor.name


def test_llama_cpp_runs_a_twin_and_ead_says_what_it_is(twin: Path, tiny_small: Path) -> None:
    with Runner(twin, name="large", n_ctx=256, n_threads=1) as runner:
        assert runner.twin_of == "qwen2-tiny"
        logits = runner.sync(runner.tokenize("def f(x):", add_special=False), prompt_len=9, own_tail=False)
        assert np.isfinite(logits).all() and logits.std() > 0
    result = ead("generate", *large_args((tiny_small, twin)), "--mode", "large", "--max-tokens", "5", "hi")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.decode().splitlines() if line.startswith("note:")]
    assert notes == [
        "note: tiny-twin.gguf is a random-weight twin of qwen2-tiny: for timing only, its text is noise"
    ]


def test_the_overhead_bench_prices_the_gate_on_two_contexts_against_a_bare_pair(twin: Path) -> None:
    """``bench_overhead.py --pair``: the gate on two contexts of a model beside the bare pair loop, the
    ratio of their medians; without it, no pair loops (the GPU run's overhead step reads the rest). With
    ``--no-decode`` a no-op stands in for every timed llama_decode, and the overheads follow the medians;
    with ``--time-decodes`` a token's time splits into llama_decode's and the rest."""
    command = [sys.executable, str(SCRIPTS / "bench_overhead.py"), "--model", str(twin), "--tokens", "8"]
    command += ["--runs", "3", "--threads", "1"]
    reports = []
    for extra in (["--pair"], [], ["--pair", "--no-decode"], ["--time-decodes"]):
        result = subprocess.run([*command, *extra], capture_output=True, timeout=300)
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    paired, alone, undecoded, timed = reports
    for loop in ("bare_pair", "bare_pair_serial", "gate_pair_needed", "gate_pair_needed_in_turn"):
        assert len(paired[f"{loop}_tok_s"]) == 3 and min(paired[f"{loop}_tok_s"]) > 0
        assert paired[f"{loop}_median_tok_s"] == pytest.approx(
            statistics.median(paired[f"{loop}_tok_s"]), abs=0.01
        )
        assert f"{loop}_tok_s" not in alone
    ratio = paired["gate_pair_needed_median_tok_s"] / paired["bare_pair_median_tok_s"]
    assert paired["gate_pair_needed_ratio"] == pytest.approx(ratio, rel=1e-3)
    serial = paired["gate_pair_needed_median_tok_s"] / paired["bare_pair_serial_median_tok_s"]
    assert paired["gate_pair_needed_serial_ratio"] == pytest.approx(serial, rel=1e-3)
    in_turn = paired["gate_pair_needed_in_turn_median_tok_s"] / paired["bare_pair_serial_median_tok_s"]
    assert paired["gate_pair_needed_in_turn_serial_ratio"] == pytest.approx(in_turn, rel=1e-3)
    assert paired["gate_needed_ratio"] > 0 and alone["gate_needed_ratio"] > 0
    assert "gate_pair_needed_ratio" not in alone
    # --no-decode: the no-op took every decode after the prompts, warm-up (16 tokens) and 3 runs of 8:
    # one a token in each one-context loop (LOOPS: eight), two in each pair loop (four)
    assert (paired["no_decode"], paired["decodes_skipped"]) == (False, 0)
    assert len(LOOPS) == 8 and undecoded["decodes_skipped"] == (16 + 3 * 8) * (8 + 4 * 2)
    assert undecoded["no_decode"] and paired["ead_in_turn_ratio"] > 0
    for loop, base in (("gate_needed", "bare"), ("gate_pair_needed", "bare_pair")):
        extra = 1e6 / undecoded[f"{loop}_median_tok_s"] - 1e6 / undecoded[f"{base}_median_tok_s"]
        assert undecoded[f"{loop}_overhead_us"] == pytest.approx(extra, abs=0.2)
    # --time-decodes: each loop's token split into the time inside llama_decode calls and the rest
    assert timed["time_decodes"] and not paired["time_decodes"] and "bare_decode_us" not in paired
    for loop in LOOPS:
        assert timed[f"{loop}_decode_us"] > 0 and timed[f"{loop}_outside_us"] > 0
        assert timed[f"{loop}_decode_us"] < 1e6 / min(timed[f"{loop}_tok_s"])


def test_a_twin_like_a_file_copies_every_tensors_shape_and_type(tmp_path: Path, tiny_large: Path) -> None:
    out = tmp_path / "like.gguf"
    assert write("--like", str(tiny_large), "--out", str(out)).returncode == 0
    assert tensors(out) == tensors(tiny_large)
    assert strings(out, "tokenizer.ggml.tokens") == strings(tiny_large, "tokenizer.ggml.tokens")
    with Runner(out, name="large", n_ctx=256, n_threads=1) as runner, Runner(tiny_large, name="x") as real:
        assert (runner.n_params, runner.n_vocab, runner.twin_of) == (
            real.n_params,
            real.n_vocab,
            tiny_large.name,
        )


def test_a_tokenizer_only_file_carries_the_tokenizer_alone(tmp_path: Path, tiny_small: Path) -> None:
    tokenizer = tmp_path / "tokenizer.gguf"
    assert (
        write("--tokenizer-only", "--tokenizer-from", str(tiny_small), "--out", str(tokenizer)).returncode
        == 0
    )
    assert tensors(tokenizer) == [] and tokenizer.stat().st_size < tiny_small.stat().st_size
    out = tmp_path / "twin.gguf"
    assert (
        write("--shape", "qwen2-tiny", "--tokenizer-from", str(tokenizer), "--out", str(out)).returncode == 0
    )
    assert strings(out, "tokenizer.ggml.tokens") == [
        *strings(tiny_small, "tokenizer.ggml.tokens"),
        b"[PAD267]",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "qwen9-1t", "--tokenizer-from", "x", "--out", "y"], "invalid choice: 'qwen9-1t'"),
        (["--shape", "qwen2-tiny", "--out", "y"], "--tokenizer-from is needed"),
        (
            ["--shape", "qwen2-tiny", "--tokenizer-from", __file__, "--out", "y"],
            "is not a readable GGUF file",
        ),
    ],
)
def test_bad_requests_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "write_twin.py"), *args], capture_output=True, timeout=60, cwd=tmp_path
    )
    assert_one_line_error(result, 2 if "invalid" in message or "needed" in message else 1, message)
    assert not (tmp_path / "y").exists()


def test_a_vocabulary_larger_than_the_shape_is_refused(tmp_path: Path, tiny_other_size: Path) -> None:
    result = write(
        "--shape", "qwen2-tiny", "--tokenizer-from", str(tiny_other_size), "--out", str(tmp_path / "t")
    )
    assert_one_line_error(result, 1, "the tokenizer has 331 tokens, more than the shape's 268")


@pytest.mark.real
def test_the_named_shapes_are_the_real_files_tensor_for_tensor(real_pair: tuple[Path, Path]) -> None:
    for shape, path in zip(("qwen2.5-0.5b", "qwen2.5-1.5b"), real_pair, strict=True):
        specs = write_twin.q4_k_m_tensors(write_twin.SHAPES[shape])
        assert sorted((s.name, s.shape, int(s.kind)) for s in specs) == sorted(tensors(path))

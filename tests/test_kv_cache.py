"""llama-cli's KV cache types (-ctk/-ctv, the draft model's -ctkd/-ctvd) and flash attention (-fa): checked
before any model is looked for, made by llama.cpp as asked (its own log line, the cache's bytes), and a
type a model's attention heads cannot hold refused in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import llama_cpp
import pytest
from serve_process import Server
from test_cli import assert_one_line_error, ead, pair_args
from tiny_models import N_EMBD, N_HEAD_KV, N_LAYER, write_tiny_model

from ead_cli.hardware import this_cpu
from ead_cli.runner import Runner

CHOICES = "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"
# llama.cpp's line for each KV cache it makes (EAD_VERBOSE shows its log)
KV_LINE = re.compile(r"llama_kv_cache: size = .*, K \((\w+)\): .*, V \((\w+)\): ")


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny pair with attention heads of 32 values, a quantized cache's block (the tiny pair's are 16)."""
    folder = tmp_path_factory.mktemp("wide")
    small, large = (write_tiny_model(folder / f"wide{seed}.gguf", seed=seed, n_head=2) for seed in (0, 1))
    return small, large


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-ctk", "q3_k"], f"--cache-type-k must be one of {CHOICES}, got 'q3_k'"),
        (["--cache-type-v", "F16"], f"--cache-type-v must be one of {CHOICES}, got 'F16'"),
        (["-ctkd", "q8"], f"--cache-type-k-draft must be one of {CHOICES}, got 'q8'"),
        (["-ctvd", ""], f"--cache-type-v-draft must be one of {CHOICES}, got ''"),
        (["-fa", "maybe"], "--flash-attn must be on, off or auto, got 'maybe'"),
        (
            ["-ctv", "q8_0", "-fa", "off"],
            "--cache-type-v q8_0 needs flash attention: leave --flash-attn auto or on",
        ),
        (["-ctvd", "q4_0", "-fa", "0"], "--cache-type-v-draft q4_0 needs flash attention"),
    ],
)
@pytest.mark.parametrize(
    "command", [("generate", "hi"), ("chat",), ("serve", "--port", "0"), ("bench", "speed")]
)
def test_a_bad_cache_type_or_flash_attention_is_refused_before_any_model_is_looked_for(
    tmp_path: Path, command: tuple[str, ...], args: list[str], fragment: str
) -> None:
    absent = (tmp_path / "small.gguf", tmp_path / "large.gguf")
    assert_one_line_error(ead(*command, *pair_args(absent), *args), 2, fragment)


def test_each_model_gets_its_cache_types_and_flash_attention(wide_pair: tuple[Path, Path]) -> None:
    """-ctk/-ctv are the large model's, -ctkd/-ctvd the small one's (llama-cli's draft model, f16 unless
    given), as llama.cpp's own log says it made them; -fa reaches both contexts."""
    args = ["generate", *pair_args(wide_pair), "--mode", "ead", "-n", "4", "-c", "256", "hi"]
    result = ead(
        *args, "-ctk", "q8_0", "-ctv", "q4_0", "-ctkd", "q4_1", "-fa", "on", env={"EAD_VERBOSE": "1"}
    )
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stderr.decode()
    assert KV_LINE.findall(log) == [("q4_1", "f16"), ("q8_0", "q4_0")]  # the small model loads first
    assert log.count("llama_context: flash_attn            = enabled") == 2
    default = ead(*args, env={"EAD_VERBOSE": "1"}).stderr.decode()
    assert KV_LINE.findall(default) == [("f16", "f16")] * 2
    assert default.count("flash_attn            = auto") == 2


def test_a_quantized_cache_holds_its_bytes_per_value(wide_pair: tuple[Path, Path]) -> None:
    """The cache of 64 tokens read, as llama.cpp saves it: f16 two bytes a value, q8_0 34 and q4_0 18
    bytes per block of 32, f32 four; K and V each of its own type."""
    values = 64 * N_LAYER * N_HEAD_KV * (N_EMBD // 2)  # tokens x layers x one of K or V's values per token

    def saved(cache_types: tuple[str, str]) -> int:
        with Runner(wide_pair[1], name="large", n_ctx=256, n_threads=1, cache_types=cache_types) as runner:
            runner.sync(list(range(10, 74)), prompt_len=64, own_tail=False)
            return llama_cpp.llama_state_seq_get_size(runner.ctx, 0)

    f16 = saved(("f16", "f16"))
    assert f16 - saved(("q8_0", "q8_0")) == 2 * values * (2 - 34 / 32)
    assert f16 - saved(("q4_0", "q4_0")) == 2 * values * (2 - 18 / 32)
    assert f16 - saved(("q8_0", "f16")) == values * (2 - 34 / 32)
    assert saved(("f32", "f32")) - f16 == 2 * values * 2


def test_flash_attention_off_takes_the_other_kernel(wide_pair: tuple[Path, Path]) -> None:
    """On and off read the same prompt through different attention kernels: close, not equal logits."""

    def first_logits(flash_attn: str) -> list[float]:
        with Runner(wide_pair[1], name="large", n_ctx=256, n_threads=1, flash_attn=flash_attn) as runner:
            return runner.sync(list(range(10, 74)), prompt_len=64, own_tail=False).tolist()

    on, off = first_logits("on"), first_logits("off")
    assert on != off
    assert max(abs(a - b) for a, b in zip(on, off, strict=True)) < 0.05


def test_a_cache_type_the_heads_cannot_hold_is_one_line(tiny_pair: tuple[Path, Path]) -> None:
    """The tiny pair's heads of 16 values split no block of 32: llama.cpp would make no context (with flash
    attention) or abort (without); ead names the model and what it can take."""
    result = ead("generate", *pair_args(tiny_pair), "-ctk", "q8_0", "-n", "2", "hi")
    assert_one_line_error(
        result,
        2,
        "a q8_0 K cache stores blocks of 32 values, which do not divide the attention heads of "
        f"{tiny_pair[1].name} (16 values): give it f16, bf16 or f32",
    )


def test_ead_serve_takes_the_cache_types(wide_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A server whose models hold quantized caches answers, its log saying what llama.cpp made."""
    args = [
        *pair_args(wide_pair),
        "--mode",
        "ead",
        "-c",
        "256",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-ctvd",
        "q4_0",
    ]
    with Server(args, tmp_path / "server.log", env={"EAD_VERBOSE": "1"}) as server:
        reply = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        assert server.stop() == 0
        assert KV_LINE.findall(server.log()) == [("f16", "q4_0"), ("q8_0", "q8_0")]


def test_the_memory_script_reports_what_llama_cpp_made(wide_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """scripts/kv_cache_memory.py: the whole context's cache by type, as llama.cpp reports it (a tiny model:
    2 layers, K and V of 64 values a token, 2048 cells: 1 MiB at f16, 34/64 of it at q8_0, 18/64 at q4_0)."""
    out = tmp_path / "memory.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "kv_cache_memory.py"
    args = [
        "--models",
        str(wide_pair[1]),
        "--types",
        "f16,q8_0,q4_0",
        "--ctx",
        "2048",
        "--prompt-tokens",
        "64",
    ]
    result = subprocess.run(
        [sys.executable, str(script), *args, "--out", str(out)], capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    measured = json.loads(out.read_text())
    assert measured["cpu"] == this_cpu()[0]  # the CPU named as every script of the project names it
    runs = measured["runs"]
    assert [(run["cache_type"], run["kv_mib"], run["cells"], run["layers"]) for run in runs] == [
        ("f16", 1.0, 2048, 2),
        ("q8_0", 0.53, 2048, 2),
        ("q4_0", 0.28, 2048, 2),
    ]
    assert [run["kv_of_first_type"] for run in runs] == [1.0, 0.53, 0.28]
    assert runs[0]["state_bytes"] - runs[1]["state_bytes"] == 64 * 2 * 128 * (2 - 34 / 32)


def test_the_small_models_cache_types_are_said_unused_where_it_does_not_load(
    tiny_pair: tuple[Path, Path],
) -> None:
    """The default mode loads the large model alone: -ctkd and -ctvd go unused, said as --small is."""
    result = ead("generate", *pair_args(tiny_pair), "-ctkd", "f32", "-ctvd", "bf16", "-n", "2", "hi")
    assert result.returncode == 0, result.stderr.decode()
    note = result.stderr.decode().strip()
    assert note.startswith("note: the default mode (--mode large) leaves --small, --cache-type-k-draft, ")
    assert "--cache-type-v-draft unused" in note
    ead_mode = ead("generate", *pair_args(tiny_pair), "--mode", "ead", "-ctkd", "f32", "-n", "2", "hi")
    assert ead_mode.returncode == 0 and ead_mode.stderr == b""

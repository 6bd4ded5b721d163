"""scripts/soak.py on the tiny pair: 200 generations in one process leave memory, descriptors and threads
where they were after the warm-up."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def test_two_hundred_generations_leak_nothing(tiny_pair: tuple[Path, Path]) -> None:
    small, large = tiny_pair
    args = ["--small", str(small), "--large", str(large), "--count", "200", "--max-tokens", "8"]
    result = subprocess.run(
        [sys.executable, str(SOAK), *args, "--threads", "1"], capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    assert figures["failures"] == []
    assert (figures["small"], figures["large"]) == (small.name, large.name)
    assert figures["generations"] == 200 and figures["warmup"] == 30
    assert 200 <= figures["tokens"] <= 200 * 8  # sampled runs may end early at <|im_end|>
    assert figures["fds_end"] == figures["fds_start"]
    assert figures["threads_end"] == figures["threads_start"]
    assert figures["python_threads_end"] == figures["python_threads_start"]
    growth = figures["rss_growth_mib"]
    assert growth == pytest.approx(figures["rss_end_mib"] - figures["rss_start_mib"], abs=0.11)
    assert growth <= figures["rss_bound_mib"] == 64
    assert figures["rss_anon_growth_mib"] <= 64
    assert figures["rss_start_mib"] <= figures["rss_max_mib"] >= figures["rss_end_mib"]


def test_growth_past_a_bound_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict the exit status rests on, for figures a leak would produce."""
    monkeypatch.syspath_prepend(str(SOAK.parent))
    soak = importlib.import_module("soak")
    start = soak.Sample(rss_mib=100.0, anon_mib=50.0, fds=8, threads=2, python_threads=1)
    assert soak.failures(start, soak.Sample(164.0, 50.0, 8, 2, 1), 64) == []  # at the bound: no failure
    assert soak.failures(start, soak.Sample(90.0, 50.0, 7, 1, 1), 64) == []  # shrinking is fine
    assert soak.failures(start, soak.Sample(164.5, 50.0, 8, 2, 1), 64) == [
        "RSS grew by 64.5 MiB (bound 64 MiB)"
    ]
    assert soak.failures(start, soak.Sample(100.0, 50.0, 9, 2, 1), 64) == [
        "open file descriptors grew from 8 to 9"
    ]
    assert soak.failures(start, soak.Sample(100.0, 50.0, 8, 2, 2), 64) == [
        "threads grew from 2 to 2 (Python: 1 to 2)"
    ]
    assert len(soak.failures(start, soak.Sample(200.0, 50.0, 9, 3, 1), 64)) == 3

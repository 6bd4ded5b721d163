"""ead depth on the real Qwen2.5-Coder 0.5B (24 blocks, Q8_0 head): the readout, the early exit, and its
equality with the full-depth simulation. Few tokens: the machine is shared."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ead_cli.depth.model import DepthModel, DepthOptions
from ead_cli.depth.readout import read_rows
from ead_cli.prompt import encode_prompt
from ead_cli.sampling import SamplingParams

pytestmark = pytest.mark.real
PROMPT = "Write a Python function that checks whether a number is prime"


@pytest.fixture(scope="module")
def model(real_pair: tuple[Path, Path]) -> Iterator[DepthModel]:
    loaded = DepthModel(real_pair[0], n_threads=1, n_ctx=1024)
    yield loaded
    loaded.close()


def test_the_last_blocks_readout_is_llama_cpps_logits_bit_for_bit(model: DepthModel) -> None:
    hidden: dict[int, np.ndarray] = {}
    model.tap.see = lambda layer, tensor: (hidden.__setitem__(layer, read_rows(tensor)[-1]), True)[1]
    model.tap.want([model.n_layer])
    try:
        tokens = encode_prompt(model.runner, PROMPT)
        model.runner.truncate(0)
        logits = model.runner.sync(tokens, prompt_len=len(tokens), own_tail=False).copy()
    finally:
        model.tap.see = None
    assert np.array_equal(model.head.logits(hidden[model.n_layer])[0], logits)


def test_early_exit_equals_simulation_on_the_real_model(model: DepthModel) -> None:
    """A confidence exit at 6 bits (no profile needed) leaves full depth within a few tokens."""
    options = DepthOptions(confidence=6.0, probe_every=4)
    prompt = encode_prompt(model.runner, PROMPT)
    real_response = model.generate(prompt, options, SamplingParams(), max_tokens=12)
    real_events, real = list(real_response), real_response.summary()
    sim_response = model.generate(prompt, replace(options, simulate=True), SamplingParams(), max_tokens=12)
    sim_events, simulated = list(sim_response), sim_response.summary()
    assert [e.token for e in real_events] == [e.token for e in sim_events]
    assert real.depths == simulated.depths
    assert min(real.depths) < model.n_layer
    assert real.flops < real.full_flops

"""llama.cpp's grammar parser, as ead serve's JSON mode uses it: each distinct grammar parsed once, with
the process's stderr taken for the parse (see ead_cli/shared_stderr.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from ead_cli import shared_stderr
from ead_cli.runner import Runner
from ead_cli.sampling import ParsedGrammars

DIGITS = 'root ::= [0-9]+ "."'


@pytest.fixture(scope="module")
def grammars(tiny_small: Path) -> Iterator[ParsedGrammars]:
    with Runner(tiny_small, name="small", n_ctx=256, n_threads=1) as runner:
        yield runner.grammars


def finishes_while_stderr_is_held(call: threading.Thread, wait: float = 5) -> bool:
    """Whether ``call`` ends while another thread holds the lock every parse takes with stderr."""
    with shared_stderr.LOCK:
        call.start()
        call.join(timeout=wait)
        finished = not call.is_alive()
    call.join()
    return finished


def test_a_grammar_checked_once_is_not_parsed_again_for_its_answers(grammars: ParsedGrammars) -> None:
    """ead serve checked a request's grammar when it came and parsed it again when it ran: two parses
    (each with stderr taken) per request. The answers now get copies of the one parse."""
    grammars.check(DIGITS)
    samplers: list[llama_cpp.llama_sampler_p] = []
    for _ in range(2):  # each answer has its own copy: a grammar sampler holds one answer's state
        copy = threading.Thread(target=lambda: samplers.append(grammars.sampler(DIGITS)))
        assert finishes_while_stderr_is_held(copy)
    assert len(samplers) == 2 and samplers[0] != samplers[1]
    for sampler in samplers:
        llama_cpp.llama_sampler_free(sampler)
    new = threading.Thread(target=grammars.check, args=('root ::= "new"',))
    assert not finishes_while_stderr_is_held(new, wait=0.5)  # a grammar not seen before: parsed, stderr taken

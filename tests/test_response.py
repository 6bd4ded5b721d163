"""One generation protocol (``response.Response``) over the real decoder on the tiny models: the events,
``text()``, and the summary after the last event and after the caller stops early."""

from __future__ import annotations

from ead_cli.engine import build_decoder
from ead_cli.options import GenerationOptions, PolicyOptions
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner

PROMPT = "Write a haiku about the sea."


def test_text_is_the_events_text_and_the_summary_counts_them(runners: list[Runner]) -> None:
    prompt = encode_prompt(runners[0], PROMPT)
    events = list(build_decoder(runners, PolicyOptions(), GenerationOptions(max_tokens=16)).generate(prompt))
    response = build_decoder(runners, PolicyOptions(), GenerationOptions(max_tokens=16)).generate(prompt)
    assert response.text() == "".join(event.text for event in events)
    assert response.summary().generated == len(events) == 16
    assert response.last_event == events[-1]


def test_the_summary_after_stopping_early_counts_what_was_handed_out(runners: list[Runner]) -> None:
    prompt = encode_prompt(runners[0], PROMPT)
    response = build_decoder(runners, PolicyOptions(), GenerationOptions(max_tokens=16)).generate(prompt)
    taken = []
    for event in response:
        taken.append(event)
        if len(taken) == 5:
            break
    assert response.summary().generated == 5
    assert response.last_event == taken[-1]
    assert response.text() == "".join(event.text for event in taken)  # the loop has ended: nothing more

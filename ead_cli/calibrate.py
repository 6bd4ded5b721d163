"""`ead calibrate`: the τ that hands a chosen share of tokens to the large model, for a model pair.

Users do not know what τ to pick, and τ in bits means different things for different models and
domains. The small model writes answers to sample prompts alone; its entropy stream is replayed through
each policy (a pure state machine, so replaying is exact for the policy, and cheap) while τ is bisected
until the simulated large-model share meets the target. The replay cannot know how the large model's
tokens would have changed the text, so the prediction is then checked by real runs at that τ on
held-out prompts, and both shares are reported. Saved results live in one JSON file per user, keyed by
the pair's file names and the policy; ``ead generate`` and ``ead chat`` use them when no ``--tau`` is given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .decoder import Decoder
from .errors import EadError, counted, quoted, shown_path
from .options import PolicyOptions
from .paths import check_can_save, check_kept_file, config_file, lookup, read_file_text, save_json, unreadable
from .policies import Fixed
from .prompt import encode_fitting, render_prompt
from .runner import Runner
from .sampling import SamplingParams

# Per domain: the first half calibrates, the second half checks (held out).
PROMPTS: dict[str, tuple[str, ...]] = {
    "code": (
        "Write a Python function that returns the longest palindromic substring of a string.",
        "Implement a least-recently-used cache class in Python with get and put in O(1).",
        "Write a Python function that merges overlapping intervals in a list of pairs.",
        "Write a Python function that parses a CSV line with quoted fields into a list of strings.",
    ),
    "prose": (
        "Write a short paragraph describing a rainy morning in a small harbour town.",
        "Explain to a new colleague, in a few sentences, why code review matters.",
        "Write a polite email declining an invitation to speak at a conference.",
        "Describe the smell and sound of a bakery at dawn in one paragraph.",
    ),
    "maths": (
        "Solve for x: 3x + 7 = 2x - 5. Show each step.",
        "A train travels 180 km in 2.5 hours. What is its average speed in m/s? Show your work.",
        "What is the sum of the interior angles of a hexagon? Explain the reasoning.",
        "Find the derivative of f(x) = x^3 * sin(x) and simplify.",
    ),
}
DOMAINS = (*PROMPTS, "all")
BISECTIONS = 40


@dataclass(frozen=True)
class Calibration:
    """One policy's result: ``predicted_share`` on the calibration prompts (replayed small-model
    entropies), ``measured_share`` from real runs on the held-out prompts (None if not checked)."""

    policy: str
    tau: float
    target_share: float
    predicted_share: float
    measured_share: float | None


def split_prompts(domain: str, file_prompts: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(calibration prompts, held-out prompts): a file's prompts alternate (blank lines skipped, so not
    its line numbers); built-ins split each domain."""
    if file_prompts is not None:
        if len(file_prompts) < 2:
            raise EadError("calibration needs at least 2 prompts (half to calibrate, half to check)", 2)
        return list(file_prompts[::2]), list(file_prompts[1::2])
    if domain not in DOMAINS:
        raise EadError(f"--domain must be one of {', '.join(DOMAINS)}, got {quoted(domain)}", exit_code=2)
    domains = list(PROMPTS) if domain == "all" else [domain]
    calibrate = [p for d in domains for p in PROMPTS[d][: len(PROMPTS[d]) // 2]]
    held_out = [p for d in domains for p in PROMPTS[d][len(PROMPTS[d]) // 2 :]]
    return calibrate, held_out


def _encode_each(runners: Sequence[Runner], prompts: Sequence[str], kind: str) -> list[list[int]]:
    """Each prompt's token ids, each checked to leave the context room for an answer: a prompt too long
    is one line naming it before any answer runs, not after minutes of calibration."""
    encoded = []
    for number, prompt in enumerate(prompts, 1):
        rendered = render_prompt(runners[0], prompt)
        try:
            tokens = encode_fitting(runners[0], rendered, runners)
        except EadError as error:
            excerpt = prompt if len(prompt) <= 30 else f"{prompt[:30]}..."
            raise EadError(f"{kind} prompt {number} ({excerpt!r}): {error}", error.exit_code) from None
        encoded.append(tokens)
    return encoded


def small_entropies(
    runners: Sequence[Runner], prompts: Sequence[list[int]], max_tokens: int
) -> list[list[float]]:
    """The small model's entropy at each step of its own greedy answer to each prompt (token ids)."""
    streams = []
    for prompt in prompts:
        decoder = Decoder(runners, ("small", "large"), Fixed(0), SamplingParams(), max_tokens=max_tokens)
        streams.append([event.entropy for event in decoder.run(prompt)])
    return streams


def simulated_share(streams: Sequence[Sequence[float]], options: PolicyOptions, tau: float) -> float:
    """The large model's share if the policy at ``tau`` saw these entropy streams. Where the large model
    writes, its entropy is taken to be the small one's at that position (a lookahead rewrite replays
    the span's)."""
    large = total = 0
    for stream in streams:
        policy = replace(options, tau=tau).make_policy()
        writers: list[int] = []
        step = 0
        while step < len(stream):
            writers.append(policy.observe(stream[step]))
            step += 1
            taken_back = policy.take_back(step == len(stream))
            if taken_back:  # lookahead: the large model rewrites those positions
                del writers[-taken_back:]
                step -= taken_back
        large += sum(writers)
        total += len(stream)
    return large / total if total else 0.0


def tau_for_share(
    streams: Sequence[Sequence[float]], options: PolicyOptions, target: float
) -> tuple[float, float]:
    """The τ whose simulated share is closest to ``target`` (bisection: the share falls as τ rises);
    returns (τ, its simulated share). Answers too short for the policy to switch at all (the paper's
    rule waits ``min_run`` tokens) leave every τ at share 0: no τ is found, rather than a τ of 0 that
    longer answers would hand wholly to the large model."""
    low, high = 0.0, max((max(s) for s in streams if s), default=0.0) + 1e-6
    share_low, share_high = simulated_share(streams, options, low), simulated_share(streams, options, high)
    if share_low == 0.0:
        tokens = sum(len(stream) for stream in streams)
        raise EadError(
            f"the {options.policy} policy hands the large model no token at any tau over "
            f"{counted(tokens, 'answer token')}: calibrate on longer answers (--max-tokens) or more prompts"
        )
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        share = simulated_share(streams, options, middle)
        if share > target:
            low, share_low = middle, share
        else:
            high, share_high = middle, share
    if abs(share_low - target) < abs(share_high - target):
        return low, share_low
    return high, share_high


def measured_share(
    runners: Sequence[Runner], options: PolicyOptions, prompts: Sequence[list[int]], max_tokens: int
) -> float:
    """The large model's share over real runs (both models) at the options' τ, on prompts' token ids."""
    large = total = 0
    for prompt in prompts:
        for runner in runners:
            runner.truncate(0)
        decoder = Decoder(
            runners, ("small", "large"), options.make_policy(), SamplingParams(), max_tokens=max_tokens
        )
        events = list(decoder.run(prompt))
        large += sum(event.model == "large" for event in events)
        total += len(events)
    return large / total if total else 0.0


def check_target_share(target: float) -> None:
    if not 0 < target < 1:
        raise EadError(f"--target-share must be in (0, 1), got {target}", exit_code=2)


def calibrate(
    runners: Sequence[Runner],
    policies: Sequence[PolicyOptions],
    target: float,
    prompts: tuple[Sequence[str], Sequence[str]],
    *,
    max_tokens: int = 96,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Calibration], list[EadError]]:
    """Calibrate each policy on the first prompt list; check on the second with real runs. A policy that
    cannot be calibrated on these answers is its error, beside the others' results (they had been lost
    with it: the gate's τ found, then the ead policy's failure ended the run)."""
    check_target_share(target)
    calibration_prompts = _encode_each(runners, prompts[0], "calibration")
    held_out = _encode_each(runners, prompts[1], "held-out") if check else []
    if progress:
        progress(f"the small model answers {counted(len(calibration_prompts), 'calibration prompt')}")
    streams = small_entropies(runners, calibration_prompts, max_tokens)
    results, failures = [], []
    for options in policies:
        try:
            tau, predicted = tau_for_share(streams, options, target)
        except EadError as error:
            failures.append(error)
            continue
        measured = None
        if check:
            if progress:
                progress(
                    f"checking {options.policy} at tau {tau:.3f} on "
                    f"{counted(len(held_out), 'held-out prompt')}"
                )
            measured = measured_share(runners, replace(options, tau=tau), held_out, max_tokens)
        results.append(Calibration(options.policy, tau, target, predicted, measured))
    return results, failures


# ---------------------------------------------------------------------------------------------- storage


def pair_key(small: str, large: str) -> str:
    """Models by their labels: file names, or a server's address."""
    return f"{small} + {large}"


def _read(path: Path) -> dict[str, dict[str, dict]]:
    """The saved pairs, each an object of policies, each an object (what ``save`` writes); none without
    a file. Any other shape is one line naming the file, not a failure of the code that reads it; so is
    a pipe, a device or a folder in its place, refused unread: a pipe was waited on for ever for a writer."""
    check_kept_file(path, "ead keeps its calibration")
    if lookup(path) is None:
        return {}
    try:
        data = json.loads(read_file_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise EadError(f"cannot read the calibration file {shown_path(path)}: {unreadable(error)}") from None
    if not isinstance(data, dict):
        raise EadError(f"the calibration file {shown_path(path)} is not a JSON object")
    for pair, policies in data.items():
        if not isinstance(policies, dict) or not all(isinstance(entry, dict) for entry in policies.values()):
            shape = "is not an object of policies, each an object"
            raise EadError(f"the calibration file {shown_path(path)}: {pair!r} {shape}")
    return data


def check_saving() -> Path:
    """Where ``save`` will write, tried before a calibration runs (minutes of work that a file it cannot
    read or a folder it cannot write would throw away): the file read, its folder made and written to."""
    path = config_file()
    _read(path)
    check_can_save(path, "the calibration")
    return path


def save(small: str, large: str, results: Sequence[Calibration], path: Path | None = None) -> Path:
    """Merge the results into the calibration file (written whole to a temporary name, then renamed: a
    failed write leaves the old file as it was, and no temporary)."""
    path = path or config_file()
    data = _read(path)
    entry = data.setdefault(pair_key(small, large), {})
    for result in results:
        entry[result.policy] = {
            "tau": result.tau,
            "target_share": result.target_share,
            "predicted_share": result.predicted_share,
            "measured_share": result.measured_share,
        }
    return save_json(path, data, "the calibration", indent=2)


def saved_tau(small: str, large: str, policy: str) -> float | None:
    """The τ saved for this pair and policy, or None; checked as --tau is (a finite number of bits, at
    least 0), the file named, since an edited file can hold anything."""
    path = config_file()
    pair = pair_key(small, large)
    entry = _read(path).get(pair, {}).get(policy)
    if entry is None:
        return None
    tau = entry.get("tau")
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not 0 <= tau < math.inf:
        raise EadError(
            f"the calibration file {shown_path(path)} holds {policy} tau {json.dumps(tau)} for {pair}: "
            "a tau is a finite number of bits, at least 0"
        )
    return float(tau)


def with_saved_tau(options: PolicyOptions, runners: Sequence[Runner]) -> tuple[PolicyOptions, bool]:
    """The options with the pair's calibrated τ where none was given (bits only, not with --normalize);
    True when one was applied."""
    if options.tau is not None or options.mode != "ead" or options.normalize or len(runners) != 2:
        return options, False
    tau = saved_tau(runners[0].label, runners[1].label, options.policy)
    return (replace(options, tau=tau), True) if tau is not None else (options, False)

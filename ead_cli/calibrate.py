"""`ead calibrate`: the τ that hands a chosen share of tokens to the large model, for a model pair.

Users do not know what τ to pick, and τ in bits means different things for different models and
domains. The small model writes answers to sample prompts alone; its entropy stream is replayed through
each policy (a pure state machine, so replaying is exact for the policy, and cheap) while τ is bisected
until the simulated large-model share meets the target. The replay cannot know how the large model's
tokens would have changed the text, so the prediction is then checked by real runs at that τ on
held-out prompts, and both shares are reported. Saved results live in one JSON file per user, keyed by
the pair's file names and the policy, each τ beside the rule settings it was measured under (its window,
minimum run...: ``rule_settings``); ``ead generate``, ``chat`` and ``serve`` use one when no ``--tau`` is
given and their settings are those.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from .decoder import Decoder
from .errors import EadError, counted, quoted, shown_path
from .option_table import OPTIONS
from .options import PolicyOptions
from .paths import check_can_save, check_kept_file, config_file, lookup, read_file_text, save_json, unreadable
from .policies import POLICY_KINDS, Fixed
from .prompt import chat_template, encode_fitting, render_prompt
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
    settings: dict[str, Any] | None = None  # ``rule_settings`` of its options; None: the policy's defaults


def rule_settings(options: PolicyOptions) -> dict[str, Any]:
    """The settings besides τ that decide what ``options.policy`` does with a τ (``PolicyKind.rule_options``),
    by the option table's names, as JSON values: the policy's own window where none is given."""
    kind = POLICY_KINDS[options.policy]
    settings: dict[str, Any] = {}
    for option in OPTIONS.values():
        if option.attribute in kind.rule_options:
            value = getattr(options, option.attribute)
            if option.name == "window" and value is None:
                value = kind.window
            settings[option.name] = list(value) if isinstance(value, tuple) else value
    return settings


def calibrated_policies(names: Sequence[str], given: dict[str, Any]) -> list[PolicyOptions]:
    """Each policy to calibrate with the rule settings ``given`` (PolicyOptions fields) that it reads. One
    that none of them reads would be recorded nowhere: a usage error, as a bad value is."""
    for field in given:
        if not any(field in POLICY_KINDS[name].rule_options for name in names):
            flag = next(option.flag for option in OPTIONS.values() if option.attribute == field)
            readers = [kind.name for kind in POLICY_KINDS.values() if field in kind.rule_options]
            shaped = " and ".join(f"--policy {name}" for name in readers)
            raise EadError(f"{flag} shapes {shaped}, which this calibration leaves out", exit_code=2)
    return [
        PolicyOptions(
            mode="ead",
            policy=name,
            **{field: value for field, value in given.items() if field in POLICY_KINDS[name].rule_options},
        )
        for name in names
    ]


def split_prompts(
    domain: str, file_prompts: Sequence[str] | None = None, *, check: bool = True
) -> tuple[list[str], list[str]]:
    """(calibration prompts, held-out prompts): a file's prompts alternate (blank lines skipped, so not
    its line numbers); built-ins split each domain. Unchecked (``check`` False) none is held out: a prompt
    kept for a check that never runs would only leave the calibration fewer answers."""
    if domain not in DOMAINS:
        raise EadError(f"--domain must be one of {', '.join(DOMAINS)}, got {quoted(domain)}", exit_code=2)
    domains = list(PROMPTS) if domain == "all" else [domain]
    if not check:
        every = file_prompts if file_prompts is not None else [p for d in domains for p in PROMPTS[d]]
        return list(every), []
    if file_prompts is not None:
        if len(file_prompts) < 2:
            raise EadError("calibration needs at least 2 prompts (half to calibrate, half to check)", 2)
        return list(file_prompts[::2]), list(file_prompts[1::2])
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


def small_answers(
    runners: Sequence[Runner], prompts: Sequence[list[int]], max_tokens: int
) -> tuple[list[list[float]], list[list[str]]]:
    """The small model's entropy at each step of its own greedy answer to each prompt (token ids), and
    each step's text (a line burst and patterns read it)."""
    streams, texts = [], []
    for prompt in prompts:
        decoder = Decoder(runners, ("small", "large"), Fixed(0), SamplingParams(), max_tokens=max_tokens)
        events = list(decoder.run(prompt))
        streams.append([event.entropy for event in events])
        # each token's own text, as the decoder hands it to the policy (an event's text holds back a
        # split character's bytes and a stop string's start)
        texts.append([runners[0].token_bytes(event.token).decode("utf-8", "replace") for event in events])
    return streams, texts


def simulated_share(
    streams: Sequence[Sequence[float]],
    options: PolicyOptions,
    tau: float,
    texts: Sequence[Sequence[str]] = (),
) -> float:
    """The large model's share if the policy at ``tau`` saw these entropy streams (and ``texts``, each
    step's text, where the policy reads it: a line burst, patterns). Where the large model writes, its
    entropy and text are taken to be the small one's at that position (a lookahead rewrite replays the
    span's)."""
    large = total = 0
    for number, stream in enumerate(streams):
        policy = replace(options, tau=tau).make_policy()
        writers: list[int] = []
        step = 0
        while step < len(stream):
            writers.append(policy.observe(stream[step]))
            if policy.wants_text:
                policy.see(texts[number][step])
            step += 1
            taken_back = policy.take_back(step == len(stream))
            if taken_back:  # lookahead: the large model rewrites those positions
                del writers[-taken_back:]
                step -= taken_back
        large += sum(writers)
        total += len(stream)
    return large / total if total else 0.0


def tau_for_share(
    streams: Sequence[Sequence[float]],
    options: PolicyOptions,
    target: float,
    texts: Sequence[Sequence[str]] = (),
) -> tuple[float, float]:
    """The τ whose simulated share is closest to ``target`` (bisection: the share falls as τ rises);
    returns (τ, its simulated share). Answers too short for the policy to switch at all (the paper's
    rule waits ``min_run`` tokens) leave every τ at share 0: no τ is found, rather than a τ of 0 that
    longer answers would hand wholly to the large model."""
    low, high = 0.0, max((max(s) for s in streams if s), default=0.0) + 1e-6
    share_low = simulated_share(streams, options, low, texts)
    share_high = simulated_share(streams, options, high, texts)
    if share_low == 0.0:
        tokens = sum(len(stream) for stream in streams)
        raise EadError(
            f"the {options.policy} policy hands the large model no token at any tau over "
            f"{counted(tokens, 'answer token')}: calibrate on longer answers (--max-tokens) or more prompts"
        )
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        share = simulated_share(streams, options, middle, texts)
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


def measured_on(domain: str, file: Path | None, runner: Runner) -> str:
    """What a calibration's answers were written from, as its saved τ says it when a run uses it: the
    prompts (a domain's built-in ones, or a file's) and the chat template that wrote them."""
    if file is not None:
        prompts = f"the prompts of {shown_path(file.resolve())}"
    elif domain == "all":
        *first, last = PROMPTS
        prompts = f"the built-in {', '.join(first)} and {last} prompts"
    else:
        prompts = f"the built-in {domain} prompts"
    template = chat_template(runner)
    return f"{prompts}, written with {template.origin}" if template else f"{prompts}, as raw text"


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
    streams, texts = small_answers(runners, calibration_prompts, max_tokens)
    results, failures = [], []
    for options in policies:
        try:
            tau, predicted = tau_for_share(streams, options, target, texts)
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
        results.append(Calibration(options.policy, tau, target, predicted, measured, rule_settings(options)))
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


def save(
    small: str,
    large: str,
    results: Sequence[Calibration],
    path: Path | None = None,
    measured: str | None = None,
) -> Path:
    """Merge the results into the calibration file (written whole to a temporary name, then renamed: a
    failed write leaves the old file as it was, and no temporary), each with what it was ``measured`` on
    (``measured_on``)."""
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
        if result.settings is not None:
            entry[result.policy]["settings"] = result.settings
        if measured is not None:
            entry[result.policy]["measured_on"] = measured
    return save_json(path, data, "the calibration", indent=2)


@dataclass(frozen=True)
class PairTaus:
    """The τs saved for one pair of models, as the calibration file held them when it was ``read``: each
    policy's entry, checked where a run asks for it. ``ead serve`` reads them once, at its start (a
    server's settings are its start's, as llama-server's); ``generate`` when it runs, ``chat`` for each
    answer."""

    path: Path
    pair: str
    entries: dict[str, dict]

    @classmethod
    def read(cls, small: str, large: str) -> PairTaus:
        path = config_file()
        pair = pair_key(small, large)
        return cls(path, pair, _read(path).get(pair, {}))

    def saved(self, policy: str) -> tuple[float, dict[str, Any]] | None:
        """The τ saved for this policy and the rule settings it was measured under (an entry of an older
        ead, without them: the policy's defaults), or None; each checked as the options are (a τ: a finite
        number of bits, at least 0), the file named, since an edited file can hold anything."""
        entry = self.entries.get(policy)
        if entry is None:
            return None
        tau = entry.get("tau")
        if isinstance(tau, bool) or not isinstance(tau, int | float) or not 0 <= tau < math.inf:
            raise EadError(
                f"the calibration file {shown_path(self.path)} holds {policy} tau {json.dumps(tau)} for "
                f"{self.pair}: a tau is a finite number of bits, at least 0"
            )
        defaults = PolicyOptions(mode="ead", policy=policy)
        known = rule_settings(defaults)
        settings = entry.get("settings", {})
        try:
            if not isinstance(settings, dict) or not settings.keys() <= known.keys():
                raise TypeError(settings)
            fields = {
                OPTIONS[name].attribute: tuple(value) if isinstance(value, list) else value
                for name, value in settings.items()
            }
            return float(tau), rule_settings(replace(defaults, **fields))
        except (EadError, TypeError, ValueError):
            raise EadError(
                f"the calibration file {shown_path(self.path)} holds {policy} settings "
                f"{json.dumps(settings)} for {self.pair}: not the {policy} policy's options "
                f"({', '.join(known)}) and values it takes"
            ) from None

    def measured_on(self, policy: str) -> str | None:
        """What this policy's τ was measured on (``measured_on``'s words); None for an entry of an older
        ead, which did not record it."""
        said = self.entries.get(policy, {}).get("measured_on")
        if said is not None and not isinstance(said, str):
            raise EadError(
                f"the calibration file {shown_path(self.path)} holds {policy} measured_on "
                f"{json.dumps(said)} for {self.pair}: not a text"
            )
        return said

    def applied(self, options: PolicyOptions) -> SavedTau:
        """``options`` with this policy's saved τ where it was measured under their rule settings."""
        saved = self.saved(options.policy)
        if saved is None:
            return SavedTau(options)
        tau, measured = saved
        settings = rule_settings(options)
        if settings == measured:
            return SavedTau(replace(options, tau=tau), applied=True, on=self.measured_on(options.policy))
        return SavedTau(options, mismatch=_mismatch(options.policy, measured, settings))


class SavedTau(NamedTuple):
    """``options`` with the pair's saved τ where it ``applied`` (``on``: what it was measured on, where
    its entry says); ``mismatch``: a note where one was saved for the policy under other rule settings
    than the run's, which keep the policy's default τ."""

    options: PolicyOptions
    applied: bool = False
    mismatch: str | None = None
    on: str | None = None


def saved_taus(options: PolicyOptions, runners: Sequence[Runner]) -> PairTaus | None:
    """The pair's saved τs, read and checked now (a bad entry one line at a server's start, not a 400 to
    a client later), where options changed over these (a server's requests) may take one: two models and
    no τ given (a request cannot take the server's τ away). None elsewhere, where nothing reads them."""
    if options.tau is not None or len(runners) != 2:
        return None
    taus = PairTaus.read(runners[0].label, runners[1].label)
    for policy in POLICY_KINDS:
        taus.saved(policy)
        taus.measured_on(policy)
    return taus


def with_saved_tau(
    options: PolicyOptions, runners: Sequence[Runner], taus: PairTaus | None = None
) -> SavedTau:
    """The options with the pair's calibrated τ where none was given (bits only, not with --normalize)
    and it was measured under this run's rule settings; from ``taus`` (``saved_taus``'s, read once at a
    server's start), else read now."""
    if options.tau is not None or options.mode != "ead" or options.normalize or len(runners) != 2:
        return SavedTau(options)
    if taus is None:
        taus = PairTaus.read(runners[0].label, runners[1].label)
    return taus.applied(options)


def _mismatch(policy: str, measured: dict[str, Any], settings: dict[str, Any]) -> str:
    """Why a saved τ does not apply, the settings that differ named both ways, and the command that
    calibrates the run's."""
    differ = [name for name in settings if settings[name] != measured[name]]
    defaults = rule_settings(PolicyOptions(mode="ead", policy=policy))
    given = [name for name in settings if settings[name] != defaults[name]]
    command = " ".join(part for part in (f"ead calibrate --policy {policy}", _flags(given, settings)) if part)
    return (
        f"the {policy} tau calibrated for this pair was measured with {_flags(differ, measured)}; this "
        f"run's {_flags(differ, settings)} uses tau {POLICY_KINDS[policy].tau:g} ({command} calibrates it)"
    )


def _flags(names: Sequence[str], settings: dict[str, Any]) -> str:
    """Rule settings as a command line gives them: ``--window 3 --pattern '^def'``, ``no --tau-range``."""
    words = []
    for name in names:
        flag, value = OPTIONS[name].flag, settings[name]
        if value is None or value == []:
            words.append(f"no {flag}")
        elif name == "tau_range":
            words.append(f"{flag} {value[0]:g}:{value[1]:g}")
        elif isinstance(value, list):
            words += [f"{flag} {shlex.quote(item)}" for item in value]
        else:
            words.append(f"{flag} {value}")
    return " ".join(words)

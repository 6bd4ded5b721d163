"""``ead generate``, ``ead chat``, ``ead serve`` and ``ead calibrate``: a pair's answers, and the tau
that hands a share of them to the large model.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import EadError, counted, shown_path
from ..options import (
    NO_LIMIT,
    SMALL_MODEL_FLAGS,
    ModelOptions,
    PolicyOptions,
    answer_limit,
    check_max_tokens,
)
from .groups import (
    CHAT_MODEL_OPTIONS,
    DECODING_OPTIONS,
    RULE_SETTINGS,
    Decoding,
    Escape,
    FormatOpt,
    Grammar,
    GrammarFile,
    HideThinking,
    JsonSchema,
    JsonSchemaFile,
    MaxTokens,
    NoColor,
    OutputFormat,
    PolicyName,
    PromptArg,
    PromptFile,
    PromptOpt,
    Raw,
    Stats,
    Stop,
    Suffix,
    System,
    given_path,
    prompt_on_stdin,
    read_grammar,
    read_prompt,
    read_stops,
    with_options,
)
from .output import check_stdout, misopened, print_table, say, say_progress, stderr

if TYPE_CHECKING:
    from ..calibrate import PairTaus
    from ..prompt import InfillCut
    from .render import JsonlRenderer, TextRenderer


@with_options(CHAT_MODEL_OPTIONS)
@with_options(DECODING_OPTIONS)
def generate(
    model_options: ModelOptions,
    decoding: Decoding,
    prompt: PromptArg = None,
    prompt_option: PromptOpt = None,
    prompt_file: PromptFile = None,
    stop: Stop = None,
    grammar: Grammar = None,
    grammar_file: GrammarFile = None,
    json_schema: JsonSchema = None,
    json_schema_file: JsonSchemaFile = None,
    system: System = None,
    raw: Raw = False,
    suffix: Suffix = None,
    escape: Escape = True,
    output_format: FormatOpt = OutputFormat.text,
    hide_thinking: HideThinking = False,
    stats: Stats = False,
    no_color: NoColor = False,
) -> None:
    """Generate one answer: by default the large model alone (the fastest way to its quality here);
    --mode ead or any switching option (--tau, --policy...) switches between the small and the large
    model by entropy. With --suffix, the middle between the prompt and the suffix (code completion)."""
    from ..engine import (
        build_decoder,
        check_biased_tokens,
        check_grammar,
        close_all,
        load_runners,
        unused_options,
    )
    from ..prompt import (
        check_system_fits,
        context_advice,
        encode_fitting,
        encode_infill,
        render_prompt,
    )
    from ..text import process_escapes
    from ..thinking import answer_start, template_variables
    from .render import (
        JsonlRenderer,
        TextRenderer,
        mode_line,
        print_lines,
        print_stats,
        stream_answer,
        wants_color,
    )

    if raw and system:  # the template is what places a system message: --raw dropped it unsaid
        raise EadError("--system needs the chat template, which --raw leaves out: put it in the prompt", 2)
    if suffix is not None and system:
        raise EadError("--system needs the chat template, which --suffix leaves out (fill-in-the-middle)", 2)
    if (raw or suffix is not None) and model_options.template_given:
        left_out = "--raw leaves out" if raw else "--suffix leaves out (fill-in-the-middle)"
        raise EadError(f"{model_options.template_given} gives a chat template, which {left_out}", 2)
    on_stdin = prompt_on_stdin(prompt, prompt_option, prompt_file)
    bound = read_grammar(grammar, grammar_file, json_schema, json_schema_file, prompt_on_stdin=on_stdin)
    text = read_prompt(prompt, prompt_option, prompt_file, escape)
    stops = read_stops(stop, escape)
    if suffix is not None and escape:
        suffix = process_escapes(suffix)
    check_stdout("the answer")
    policy_options, generation = _for_models(decoding, model_options)
    generation = replace(generation, stop=stops)
    if bound is not None:
        generation = replace(generation, sampling=replace(generation.sampling, grammar=bound[0]))
    # The large model alone for the whole answer (the default mode): the small one never loads.
    large_only = policy_options.mode == "large"
    runners = load_runners(model_options, progress=say_progress, large_only=large_only)
    try:
        check_biased_tokens(generation, runners)
        policy_options = _apply_saved_tau(policy_options, runners, announce=stats or sys.stderr.isatty())
        # Plain text shows no entropies: a step whose decision needs none skips it (JSON lines show them).
        entropy = "exact" if output_format is OutputFormat.jsonl else "needed"
        if bound is not None:
            check_grammar(runners, policy_options, *bound)
        decoder = build_decoder(runners, policy_options, generation, entropy=entropy)
        if suffix is not None:
            answer = min(generation.max_tokens, decoder.n_ctx)
            tokens = encode_infill(
                runners[0], text, suffix, answer_tokens=answer, runners=runners, on_cut=_say_infill_cut
            )
            thinking = None  # code at the cursor, no chat turn: nothing to split
        else:
            variables = template_variables(generation.reasoning_budget)
            rendered = render_prompt(runners[0], text, system=system, raw=raw, template_kwargs=variables)
            if system:  # a system message too long is named, not the prompt it makes too long
                check_system_fits(runners[0], system, runners)
            tokens = encode_fitting(runners[0], rendered, runners)
            thinking = answer_start(runners[0].chat_template, rendered, generation.reasoning_format)
        # said once the run is sure to start: a refusal stays the one line
        unused = unused_options(
            model_options, policy_options, generation, runners, settled=True, hide_thinking=hide_thinking
        )
        if hide_thinking and output_format is OutputFormat.jsonl:  # only the text renderer hides
            unused.setdefault("--hide-thinking", "--format jsonl (every token, the thinking's too)")
        _say_unused(unused, "--mode ead")
        if output_format is OutputFormat.jsonl:
            renderer: TextRenderer | JsonlRenderer = JsonlRenderer(sys.stdout)
        else:
            renderer = TextRenderer(
                sys.stdout, color=wants_color(sys.stdout), thinking=thinking, hide_thinking=hide_thinking
            )
            if renderer.color:
                # Written as is: rich would count its escape codes as text and wrap the line early.
                legend = renderer.legend({r.name: r.label for r in runners})
                print(f"{legend}  · {mode_line(policy_options)}", file=sys.stderr, flush=True)
        response = decoder.generate(tokens)
        try:
            exit_code = stream_answer(response, renderer)
        finally:
            summary = response.summary()
            if summary.fallback:
                note = f"{summary.fallback}: the small model wrote the rest"
                stderr.print(note, style="dim", soft_wrap=True)
            limit = answer_limit(generation.max_tokens, decoder.n_ctx)
            if summary.finish_reason == "length" and summary.generated < limit:
                # a length stop short of --max-tokens: the context ran out, which "length" hides
                asked = "" if generation.max_tokens == NO_LIMIT else f" of the {generation.max_tokens} asked"
                note = (
                    f"the context ({decoder.n_ctx} tokens) is full: the answer stops at {summary.generated} "
                    f"tokens{asked} ({context_advice(runners)})"
                )
                stderr.print(note, style="dim", soft_wrap=True)
            if stats:
                print_lines(stderr, mode_line(policy_options))
                print_stats(stderr, summary)
    finally:
        close_all(runners)
    if exit_code:
        raise typer.Exit(exit_code)


@with_options(CHAT_MODEL_OPTIONS)
@with_options(DECODING_OPTIONS)
def chat(
    model_options: ModelOptions,
    decoding: Decoding,
    system: System = None,
    stop: Stop = None,
    escape: Escape = True,
    hide_thinking: HideThinking = False,
    no_color: NoColor = False,
) -> None:
    """Talk with the pair: a conversation whose answers stream in the colour of the model that wrote
    each token. /help lists the commands; a pipe or a file is read as typed at a terminal (commands,
    continued lines and blocks alike)."""
    from ..engine import check_biased_tokens, close_all, load_runners, unused_options
    from .repl import run_chat

    if sys.stdin is None:  # the shell closed it (<&-)
        raise EadError("ead chat reads its turns from stdin, which is closed", exit_code=2)
    if problem := misopened(0):  # 0>/dev/tty: readline would take its failing reads for the input's end
        raise EadError(problem)
    stops = read_stops(stop, escape)
    check_stdout("the conversation")
    policy_options, generation = _for_models(decoding, model_options)
    generation = replace(generation, stop=stops)
    # The default mode starts with the large model alone; a command that turns the pair on loads the rest.
    runners = load_runners(model_options, progress=say_progress, large_only=policy_options.mode == "large")
    loaded = list(runners)

    def load_pair() -> list:
        say_progress("loading the small model: the pair switches from the next answer")
        loaded[:] = load_runners(model_options, progress=say_progress, reuse=runners[-1])
        return loaded

    try:
        check_biased_tokens(generation, runners)
        unused = unused_options(
            model_options, policy_options, generation, runners, settled=False, hide_thinking=hide_thinking
        )
        _say_unused(unused, "/mode ead")
        _apply_saved_tau(policy_options, runners, announce=True)  # said once; each answer applies it
        lazy = load_pair if len(runners) == 1 else None
        exit_code = run_chat(
            runners, policy_options, generation, system=system, load_pair=lazy, hide_thinking=hide_thinking
        )
    finally:
        close_all(loaded)
    if exit_code:
        raise typer.Exit(exit_code)


@with_options(CHAT_MODEL_OPTIONS)
@with_options(DECODING_OPTIONS)
def serve(
    model_options: ModelOptions,
    decoding: Decoding,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to listen on (any but loopback: see --api-key).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(metavar="PORT", help="Port to listen on (0: any free one, said on stderr).")
    ] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="EAD_API_KEY",
            metavar="KEY",
            help=(
                "Every request but /health and the page must carry Authorization: Bearer KEY "
                "(or x-api-key: KEY)."
            ),
        ),
    ] = None,
    queue: Annotated[
        int, typer.Option(help="Requests that may wait while one generates; past them, 503 and Retry-After.")
    ] = 16,
    reuse: Annotated[
        bool,
        typer.Option(
            help="Keep the cached prefix a prompt shares with the previous request (--no-reuse: read every "
            "prompt whole, bit for bit the logits of generate)."
        ),
    ] = True,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ORIGIN",
            help="A web page's origin (scheme://host[:port], or *) that may use the server (repeatable).",
        ),
    ] = None,
    any_model: Annotated[
        bool, typer.Option(help="Answer requests whatever model they name (default: 404 unless 'ead').")
    ] = False,
    shutdown_timeout: Annotated[
        float, typer.Option(help="Seconds a stop waits for open requests before cutting them off.")
    ] = 30.0,
    read_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a request's line and headers may take to come whole, and its body between two "
            "parts; past them, 408."
        ),
    ] = 30.0,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Serve GET /metrics: Prometheus's text format, llama-server's names and ead's (off: 501).",
        ),
    ] = False,
    embeddings: Annotated[
        bool,
        typer.Option(
            "--embeddings",
            "--embedding",
            help="Serve embeddings (/v1/embeddings, /embedding, /api/embed...): the largest local model, "
            "mean-pooled (off: 501).",
        ),
    ] = False,
    ping_interval: Annotated[
        float,
        typer.Option(
            help="Seconds a stream may send no event before a keep-alive one, and again every interval, "
            "whatever the engine does (queued, reading the prompt, holding the answer back): Anthropic's "
            "ping, Responses' response.in_progress (0: no timer, one at every batch or token that sends "
            "nothing).",
        ),
    ] = 10.0,
) -> None:
    """Serve the models over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    streamed or not) and a chat page at /. The options of generate are each request's defaults."""
    from .. import calibrate as calibration
    from ..engine import check_biased_tokens, close_all, load_runners, unused_options

    try:
        from .. import serve as serving
    except ImportError as error:
        message = f"ead serve needs the serve extra ({error.name} is missing): pip install 'ead-cli[serve]'"
        raise EadError(message) from None
    options = serving.ServeOptions(
        host,
        port,
        api_key,
        queue,
        reuse,
        tuple(cors_origin or ()),
        any_model,
        shutdown_timeout,
        read_timeout,
        metrics,
        embeddings,
        ping_interval,
    )
    policy_options, generation = _for_models(decoding, model_options)
    with serving.listen(options) as sock:  # a port in use is the one line, before the models load
        runners = load_runners(model_options, progress=say_progress)
        try:
            check_biased_tokens(generation, runners)
            unused = unused_options(model_options, policy_options, generation, runners, settled=False)
            _say_unused(unused, "--mode ead, or a request's ead.mode,")
            taus = calibration.saved_taus(policy_options, runners)  # read once: every request's
            _apply_saved_tau(policy_options, runners, announce=True, taus=taus)
            defaults = serving.Defaults(policy_options, generation, taus)
            serving.serve(runners, defaults, options, sock, say=say)
        finally:
            close_all(runners)


def _say_unused(unused: dict[str, str], switches: str) -> None:
    """One line for the options given that go unused, by what leaves them so: a mode's, a policy's or
    greedy decoding's, they are not refused (docs/switching.md), but a typo'd combination is not silent.
    ``switches``: what turns the pair on in this command, said where the small model goes unused."""
    by_reason: dict[str, list[str]] = {}
    for flag, reason in unused.items():
        by_reason.setdefault(reason, []).append(flag)
    parts = []
    for reason, flags in by_reason.items():
        part = f"{reason} leaves {', '.join(flags)} unused"
        if flags[0] in SMALL_MODEL_FLAGS:  # listed first
            part += f" ({switches} switches between the pair)"
        parts.append(part)
    if parts:  # names no file: wrapped at a terminal, as chat's first lines are
        from .render import print_lines

        print_lines(stderr, "note: " + "; ".join(parts), style="dim")


def _say_infill_cut(cut: InfillCut) -> None:
    """One note where --suffix's prompt keeps part of the code, as llama-server's /infill does: unsaid,
    the code past a few hundred tokens either side of the cursor had gone unread."""
    parts = []
    if cut.prefix_kept is not None:
        parts.append(f"the code before the cursor is cut to its last {counted(cut.prefix_kept, 'token')}")
    if cut.suffix_kept is not None:
        cutting = "the code after it" if parts else "the code after the cursor is cut"
        parts.append(f"{cutting} to its first {counted(cut.suffix_kept, 'token')}")
    batch = f"--batch-size {cut.batch}: a larger one keeps more"
    say_progress(f"note: {', and '.join(parts)}, as llama-server's /infill does ({batch})")


def _for_models(decoding: Decoding, model_options: ModelOptions) -> Decoding:
    """The decoding options checked against the number of models (before any model loads)."""
    policy_options, generation = decoding
    return replace(policy_options, levels=model_options.count), generation


def _apply_saved_tau(
    options: PolicyOptions, runners: list, *, announce: bool, taus: PairTaus | None = None
) -> PolicyOptions:
    from .. import calibrate as calibration
    from ..paths import config_file

    saved = calibration.with_saved_tau(options, runners, taus)
    if saved.mismatch is not None:  # said whenever: the τ the user calibrated goes unused
        say_progress(f"note: {saved.mismatch}")
    elif saved.applied and announce:
        on = "" if saved.on is None else f" on {saved.on}"
        say_progress(
            f"tau {saved.options.tau:.3f}: calibrated for this pair{on} ({shown_path(config_file())}); "
            "--tau overrides"
        )
    return saved.options


@with_options(CHAT_MODEL_OPTIONS)
@with_options(RULE_SETTINGS)
def calibrate(
    model_options: ModelOptions,
    rule_settings: dict,
    target_share: Annotated[
        float, typer.Option(help="The share of tokens the large model should write, in (0, 1).")
    ] = 0.1,
    policy: Annotated[
        list[PolicyName] | None,
        typer.Option(help="Policies to calibrate (repeatable; default: gate and ead)."),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option(metavar="DOMAIN", help="Built-in prompts: code, prose, maths or all (default: all)."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="A prompt file instead (one per line, blank lines skipped, or .jsonl): the 1st, 3rd... "
            "calibrate, the 2nd, 4th... check (--no-check: all calibrate).",
            parser=given_path,
        ),
    ] = None,
    max_tokens: MaxTokens = 96,
    check: Annotated[
        bool,
        typer.Option(
            help="Check the prediction with real runs of the pair on the held-out prompts (--no-check: the "
            "small model alone answers every prompt, none held out, and alone loads)."
        ),
    ] = True,
    save: Annotated[
        bool,
        typer.Option(
            "--save",
            help="Save the taus for this pair, with the rule options they were measured under: generate, "
            "chat and serve use them when the pair switches with the same ones.",
        ),
    ] = False,
) -> None:
    """The tau that hands about --target-share of the tokens to the large model, per policy, under the
    rule options given (--window, --min-run, --burst...; each policy's own where none is): a saved tau
    applies to the runs whose rule options are those, another keeps the policy's default tau."""
    from .. import calibrate as calibration
    from ..bench.tasks import load_prompts
    from ..engine import close_all, load_runners, model_labels

    calibration.check_target_share(target_share)
    if model_options.count != 2:
        raise EadError("calibrate takes a pair (--small and --large), not a cascade", exit_code=2)
    check_max_tokens(max_tokens)
    if prompts and domain is not None:  # the file's prompts replace the built-in ones: it went unused
        raise EadError("--domain picks built-in prompts, which --prompts replaces: give one of them", 2)
    file_prompts = load_prompts(prompts, None) if prompts else None
    split = calibration.split_prompts("all" if domain is None else domain, file_prompts, check=check)
    names = list(dict.fromkeys(p.value for p in policy or [PolicyName.gate, PolicyName.ead]))
    policies = calibration.calibrated_policies(names, rule_settings)
    saving = calibration.check_saving() if save else None
    if saving is None:  # the table is all a run without --save leaves
        check_stdout("the calibrated taus")
    # --no-check: the small model answers alone, the large one is named, not loaded
    runners = load_runners(model_options, progress=say_progress, small_only=not check)
    try:
        # saved unchecked: the large model named by its file (fetched where it is not yet), not loaded
        labels = model_labels(model_options, say_progress) if saving is not None and not check else None
        results, failures = calibration.calibrate(
            runners, policies, target_share, split, max_tokens=max_tokens, check=check, progress=say_progress
        )
        if not results:
            raise failures[0]
        if saving is not None:  # before the table: a reader gone (`| head`) ends the run where it is shown
            pair = labels or (runners[0].label, runners[1].label)
            written_from = calibration.measured_on("all" if domain is None else domain, prompts, runners[0])
            path = calibration.save(*pair, results, saving, written_from)
        table = Table(box=None, pad_edge=False)
        for column in ("policy", "tau (bits)", "predicted share", "measured share (held out)"):
            table.add_column(column, justify="left" if column == "policy" else "right")
        for result in results:
            measured = "-" if result.measured_share is None else f"{result.measured_share:.1%}"
            table.add_row(result.policy, f"{result.tau:.3f}", f"{result.predicted_share:.1%}", measured)
        print_table(table)
        if saving is not None:
            say_progress(f"saved to {shown_path(path)}, measured on {written_from}")
    finally:
        close_all(runners)
    if failures:  # the others are shown (and saved): one line for the first that could not be calibrated
        raise failures[0]

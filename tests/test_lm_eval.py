"""EleutherAI's lm-evaluation-harness against `ead serve`, as its users run it on a served model
(`lm_eval --model local-completions`): multiple-choice scoring through echoed log-probabilities and
generation, the tokens through the server's own tokenizer (vLLM's /tokenizer_info and /tokenize, which
lm-eval finds by itself). Each score, every prompt read whole, is checked against llama.cpp's logits
of every position, computed apart, and with the caches reused against those; each generation against the
same request sent directly. Tasks read local files: nothing comes from the hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve_echo import reference_rows, tokenized

LM_EVAL = Path(sys.executable).parent / "lm_eval"
QUESTIONS = [
    {"question": "def fib(n):\n    return", "choices": [" n", " fib(n - 1) + fib(n - 2)", " 0"], "answer": 1},
    {"question": "hello", "choices": [" wörld", " world 日本"], "answer": 0},
    {"question": "x = [1, 2,", "choices": [" 3]", " 4]", "\n"], "answer": 0},
]
PROMPTS = [{"prompt": "def add(a, b):\n"}, {"prompt": "hello wörld"}]
TASKS = {
    # the choices as written after the question (lm-eval's default puts a space between them)
    "ead_mc": """task: ead_mc
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list: [{{metric: acc, aggregation: mean, higher_is_better: true}}]
""",
    "ead_gen": """task: ead_gen
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: ""
generation_kwargs: {{until: ["\\n\\n"], max_gen_toks: 12, temperature: 0}}
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
""",
}


def write_task(folder: Path, name: str, rows: list[dict]) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(TASKS[name].format(data=json.dumps(str(data))), encoding="utf-8")


def samples(output: Path, task: str) -> list[dict]:
    (path,) = output.glob(f"*/samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return sorted(rows, key=lambda row: row["doc_id"])


def encoded_pair(server: Server, context: str, continuation: str) -> tuple[list[int], int]:
    """The tokens lm-eval sends for a (context, continuation) pair and how many are the context's
    (its ``_encode_pair``: the context's trailing spaces moved to the continuation, the whole encoded)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    return tokenized(server, context + continuation), len(tokenized(server, context))


OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def run_lm_eval(server: Server, folder: Path, tasks: str, output: Path, arguments: str = "") -> None:
    """lm-eval's ``tasks`` (local files in ``folder``) against ``server``, its samples to ``output``."""
    model_args = f"base_url={server.base_url}/completions,model=ead,num_concurrent=1,max_retries=1{arguments}"
    command = [str(LM_EVAL), "--model", "local-completions", "--model_args", model_args, "--tasks", tasks]
    command += [
        "--include_path",
        str(folder),
        "--batch_size",
        "2",
        "--log_samples",
        "--output_path",
        str(output),
    ]
    environment = {**os.environ, **OFFLINE, "HF_HOME": str(folder / "hf")}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Using remote tokenizer" in done.stderr  # the server's tokenizer, found by lm-eval


def cached_prompt_tokens(server: Server) -> float:
    """The prompt tokens the server's caches kept, in all (its /metrics)."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    (line,) = (
        line for line in metrics.splitlines() if line.startswith("llamacpp:prompt_tokens_cached_total ")
    )
    return float(line.split()[1])


@pytest.fixture(scope="module")
def lm_eval_run(
    tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    """``ead serve`` on the tiny pair (its default mode: the large model alone), every prompt read whole
    (``--no-reuse``: the rows llama.cpp gives a prompt read from its start), and lm-eval's results."""
    tmp_path = tmp_path_factory.mktemp("lm-eval")
    write_task(tmp_path, "ead_mc", QUESTIONS)
    write_task(tmp_path, "ead_gen", PROMPTS)
    output = tmp_path / "out"
    serve = [*pair_args(tiny_pair), "--ctx", "2048", "--metrics"]
    with Server([*serve, "--no-reuse"], tmp_path / "server.log") as server:
        run_lm_eval(server, tmp_path, "ead_mc,ead_gen", output)
        # the same scores with the prompts sent as text (lm-eval decodes them through /detokenize)
        run_lm_eval(server, tmp_path, "ead_mc", tmp_path / "as-text", ",tokenized_requests=False")
        yield server, output


def test_lm_eval_scores_choices_by_the_large_model_s_log_probabilities(
    lm_eval_run: tuple[Server, Path], tiny_pair: tuple[Path, Path]
) -> None:
    server, output = lm_eval_run
    rows = samples(output, "ead_mc")
    assert len(rows) == len(QUESTIONS)
    right = 0
    for row, question in zip(rows, QUESTIONS, strict=True):
        scores = []
        for index, (choice, response) in enumerate(zip(question["choices"], row["resps"], strict=True)):
            arguments = row["arguments"][f"gen_args_{index}"]
            assert arguments == {"arg_0": question["question"], "arg_1": choice}
            tokens, context = encoded_pair(server, question["question"], choice)
            reference = reference_rows(tiny_pair[1], tokens)
            positions = range(context - 1, len(tokens) - 1)  # row i predicts token i + 1
            expected = [float(reference[i, tokens[i + 1]]) for i in positions]
            loglikelihood, greedy = response[0]
            assert float(loglikelihood) == pytest.approx(sum(expected), abs=1e-4)
            assert (greedy == "True") == all(reference[i].argmax() == tokens[i + 1] for i in positions)
            scores.append(sum(expected))
        right += int(np.argmax(scores)) == question["answer"]
    (results,) = output.glob("*/results_*.json")
    accuracy = json.loads(results.read_text())["results"]["ead_mc"]["acc,none"]
    assert accuracy == pytest.approx(right / len(QUESTIONS))
    as_text = samples(output.parent / "as-text", "ead_mc")
    assert [row["resps"] for row in as_text] == [row["resps"] for row in rows]


def test_lm_eval_with_the_caches_reused_scores_within_rounding(
    lm_eval_run: tuple[Server, Path], tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """By default a choice that begins as the one scored before keeps its scores and reads past them:
    the caches kept some of lm-eval's prompts (none read whole), and each choice's score is the one read
    whole but for llama.cpp's rounding of a prompt read in pieces (up to 0.02 a row on the tiny models)."""
    whole_server, whole = lm_eval_run
    assert cached_prompt_tokens(whole_server) == 0
    write_task(tmp_path, "ead_mc", QUESTIONS)
    with Server([*pair_args(tiny_pair), "--ctx", "2048", "--metrics"], tmp_path / "server.log") as server:
        run_lm_eval(server, tmp_path, "ead_mc", tmp_path / "out")
        assert cached_prompt_tokens(server) > 0
    reused = samples(tmp_path / "out", "ead_mc")
    for row, read_whole in zip(reused, samples(whole, "ead_mc"), strict=True):
        scores = [float(response[0][0]) for response in row["resps"]]
        expected = [float(response[0][0]) for response in read_whole["resps"]]
        assert scores == pytest.approx(expected, abs=0.1)


def test_lm_eval_generates_what_the_server_answers_directly(lm_eval_run: tuple[Server, Path]) -> None:
    server, output = lm_eval_run
    rows = samples(output, "ead_gen")
    for row, prompt in zip(rows, PROMPTS, strict=True):
        body = {"prompt": prompt["prompt"], "max_tokens": 12, "temperature": 0, "stop": ["\n\n"]}
        direct = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
        assert row["resps"] == [[direct["choices"][0]["text"]]]

"""Tiny GGUF models written at test time, so fast tests run real llama.cpp decoding in milliseconds.

Each model is a 2-layer llama-architecture network (64-dim embeddings, 4 heads, 2 KV heads,
feed-forward 128, F32, random weights from a fixed seed) with a Qwen-like tokenizer: byte-level BPE
over the 256 GPT-2 byte tokens (so any UTF-8 text round-trips, multi-byte characters split across
tokens), a few merges, and the control tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``
(EOS = EOT = ``<|im_end|>``; llama.cpp also ends generations at ``<|endoftext|>``; no BOS added),
plus a ChatML chat template.

``logit_scale`` multiplies the output matrix and so sets the entropy of the next-token distribution
without changing the greedy path (the argmax is scale-invariant). The output rows also get random
log-normal gains, so the entropy varies from step to step. Measured over 50 greedy steps after
``"hello wörld 日本"`` with seeds 0 and 1 (entropy in bits over the full 267-token vocab, whose
maximum is log2(267) = 8.06):

===========  ==========  ==========  ======================
logit_scale  median      range       steps above 3 bits
===========  ==========  ==========  ======================
0.05         8.06        8.06-8.06   all
0.5          7.7         7.4-7.9     all
1            6.2         3.6-7.3     all
2            2.1-2.7     0.2-5.1     22-32 %
4            0.7-0.9     0.0-3.0     0-2 %
8            0.2         0.0-1.8     none
40           0.00        0.0-1.0     none (49 of 50 < 0.5)
===========  ==========  ==========  ======================

So ``NEAR_UNIFORM_SCALE`` (0.05) gives almost uniform outputs, ``NEAR_DETERMINISTIC_SCALE`` (40)
almost one-hot ones, and ``MIDDLE_SCALE`` (2, the default) entropies that cross
``MIDDLE_ENTROPY_BITS`` (3) now and then during a greedy generation, so a switching policy with that
threshold uses both models. Control tokens get the median row gain: ``<|im_end|>`` is reachable when
sampling (as likely as a typical token) but greedy generations from seeds 0-15 run 200 tokens without
an end-of-generation token (after a ChatML prompt, 22-45 % of 100 greedy steps are above 3 bits).
Writing a model takes ~3 ms; loading it with ``llama_cpp.Llama(n_ctx=512, verbose=False)`` takes
3-5 ms (up to ~9 ms for the first load in a process).

Vocabularies (``vocab=``): ``"base"``; ``"other"`` (same size, but token 258 is ``re`` instead of
``er``: same-size, different tokenizer); ``"bigger"`` (64 more merged tokens: a size far off);
``"padded"`` (``base`` plus 2 unused padding ids at the end, as Qwen2.5 7B pads its vocabulary);
``"phi-3"`` (``base`` plus ``<unk>``, ``<s>``, ``</s>``: the model's name then holds "phi-3", for which
llama.cpp gives control tokens RSTRIP, so that they swallow the whitespace after them); ``"long"``
(``base`` plus ``LONG_TOKEN``, 64 ``=`` as one user-defined token: a piece as long as real vocabularies'
longest, such as Qwen2's 128-byte runs); ``"spm"`` (a SentencePiece tokenizer, llama.cpp's "llama": the
256 ``<0xNN>`` byte tokens, ``SPM_PIECES`` and the control tokens; it puts a space before a text and reads
"▁" as one, as Llama 2's, Mistral's and Phi-3's do); ``"think"`` (``base`` plus ``<think>`` and
``</think>``, user-defined tokens as in Qwen3's vocabulary: text when detokenized), for ``QWEN3_LIKE``;
``"think-call"`` (``think`` plus ``CALL_TOKEN`` and ``NAN_CALL_TOKEN``, a whole tool call each as one
user-defined token, so that a ``script`` can make a tiny model think and then call a tool); ``"think-bare"``
(``think`` plus ``BARE_OPENING``, a bare call's opening as one user-defined token, so that a ``script`` can
make it think and then open a bare call whose arguments its random rows write);
``"tool-tags"`` (``base`` plus ``<tool_call>`` and ``</tool_call>``, user-defined tokens as in Qwen2.5's
vocabulary, which a call's grammar is triggered by); ``"fim"`` (``base`` plus Qwen2.5-Coder's six
fill-in-the-middle control tokens, ``FIM_SPECIALS``, which llama.cpp finds by their text: the
repository-level layout, ``<|fim_pad|>``, ``<|repo_name|>`` and ``<|file_sep|>`` ending a generation);
``"fim-bare"`` (``base`` plus the first three alone: prefix, suffix, middle, as CodeGemma's and
StarCoder's are, with no file separator).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

from ead_cli.runner import Runner

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A thinking model's template in short: ChatML whose assistant turn opens the block in the prompt, as
# DeepSeek-R1's and Qwen3's thinking-only models' do (the answer starts inside it), and with Qwen3's
# enable_thinking false an empty block instead, so the answer starts past it; an earlier turn's
# reasoning_content written back in its block, as Qwen3's writes it
THINKING_TEMPLATE = CHATML.replace(
    "{{ message.content }}",
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ message.content }}",
) + (
    "{% if add_generation_prompt %}{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)
THINK_SPECIALS = ("<think>", "</think>")
TOOL_TAGS = ("<tool_call>", "</tool_call>")
CALL_TOKEN = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
# A call whose arguments hold NaN, which Python's json reads and JSON has not
NAN_CALL_TOKEN = '<tool_call>{"name": "multiply", "arguments": {"a": NaN}}</tool_call>'
# A bare call's opening, up to the name of test_serve_tools' PICK
BARE_OPENING = '{"name": "pick"'
# THINKING_TEMPLATE with Qwen3's tools: their JSON in a system turn, an earlier call in its markup
THINKING_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}"
) + THINKING_TEMPLATE.replace(
    "{{ message.content }}",
    "{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}"
    "</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}",
)

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2

NEAR_UNIFORM_SCALE = 0.05
MIDDLE_SCALE = 2.0
NEAR_DETERMINISTIC_SCALE = 40.0
# What a script adds to the logit of each token it names after the one before it: far past the random
# rows' (|logit| < 30) and the other script rows' pull
SCRIPT_LOGIT = 100.0
MIDDLE_ENTROPY_BITS = 3.0

BASE_MERGES = ("Ġ t", "t h", "e r", "i n", "Ġ a", "h e", "o n", "Ġt h")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PHI3_SPECIALS = ("<unk>", "<s>", "</s>")  # llama.cpp's Phi-3 rule sets their attributes: they must exist
LONG_TOKEN = "=" * 64
LINE_TOKEN = "x\nclass"  # a user-defined token across a line's end: found in a text before it is split
FIM_SPECIALS = (
    *("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    *("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
)
# A SentencePiece vocabulary's pieces ("▁" a space): a text's other characters are spelled in byte tokens
SPM_PIECES = ("▁", "{", "}", '"', ":", ",", "a", "e", "t", "▁{", '▁"', "▁t", "th", "▁th", "er", "in")
N_PADDING = 2
# The median row gain: control tokens are no likelier than typical ones, so generations run on.
CONTROL_ROW_GAIN = 1.0


def byte_tokens() -> list[str]:
    """The 256 byte tokens as GPT-2's ``bytes_to_unicode`` spells them, in GPT-2's id order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    rest = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(rest)}
    return [chars[b] for b in printable + rest]


def _merges(vocab: str) -> list[str]:
    if vocab == "spm":
        return []  # SentencePiece merges by the scores of the tokens it forms
    if vocab in (
        "base",
        "padded",
        "phi-3",
        "long",
        "line-token",
        "think",
        "think-call",
        "think-bare",
        "tool-tags",
        "fim",
        "fim-bare",
    ):
        return list(BASE_MERGES)
    if vocab == "other":
        return [("r e" if m == "e r" else m) for m in BASE_MERGES]
    if vocab == "bigger":
        letters = "abcdfgjk"  # none of these pairs is already a base merge
        return list(BASE_MERGES) + [f"{a} {b}" for a in letters for b in letters]
    raise ValueError(
        f"unknown vocab {vocab!r}: use 'base', 'other', 'bigger', 'padded', 'phi-3', 'long', 'think', "
        "'think-call', 'think-bare', 'tool-tags', 'spm', "
        "'fim' or 'fim-bare'"
    )


def vocabulary(vocab: str = "base") -> tuple[list[str], list[int], list[str]]:
    """Token texts, token types and merges of one of the test vocabularies."""
    merges = _merges(vocab)
    if vocab == "spm":
        tokens = [f"<0x{byte:02X}>" for byte in range(256)] + list(SPM_PIECES) + list(SPECIALS)
        types = [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(SPM_PIECES)
        return tokens, [int(t) for t in types + [gguf.TokenType.CONTROL] * len(SPECIALS)], merges
    tokens = byte_tokens() + [m.replace(" ", "") for m in merges] + list(SPECIALS)
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    if vocab == "padded":
        tokens += [f"[PAD{len(tokens) + i}]" for i in range(N_PADDING)]
        types += [gguf.TokenType.UNUSED] * N_PADDING
    if vocab == "phi-3":
        tokens += PHI3_SPECIALS
        types += [gguf.TokenType.CONTROL] * len(PHI3_SPECIALS)
    if vocab == "long":
        tokens.append(LONG_TOKEN)
        types.append(gguf.TokenType.USER_DEFINED)
    if vocab == "line-token":
        tokens.append(LINE_TOKEN)
        types.append(gguf.TokenType.USER_DEFINED)
    if vocab in ("think", "think-call", "think-bare"):
        tokens += THINK_SPECIALS
        types += [gguf.TokenType.USER_DEFINED] * len(THINK_SPECIALS)
    if vocab == "think-call":
        tokens += (CALL_TOKEN, NAN_CALL_TOKEN)
        types += [gguf.TokenType.USER_DEFINED] * 2
    if vocab == "think-bare":
        tokens.append(BARE_OPENING)
        types.append(gguf.TokenType.USER_DEFINED)
    if vocab == "tool-tags":
        tokens += TOOL_TAGS
        types += [gguf.TokenType.USER_DEFINED] * len(TOOL_TAGS)
    if vocab in ("fim", "fim-bare"):
        fim = FIM_SPECIALS if vocab == "fim" else FIM_SPECIALS[:3]
        tokens += fim
        types += [gguf.TokenType.CONTROL] * len(fim)
    return tokens, [int(t) for t in types], merges


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    logit_scale: float = MIDDLE_SCALE,
    vocab: str = "base",
    chat_template: str | None = CHATML,
    n_ctx_train: int = 2048,
    eot_token: str = "<|im_end|>",
    split_max_tensors: int = 0,
    tokenizer_pre: str = "default",
    n_layer: int = N_LAYER,
    keep_layers: int | None = None,
    script: Sequence[str] = (),
    n_head: int = N_HEAD,
) -> Path:
    """Write a tiny random llama model with a byte-level BPE tokenizer to ``path`` and return its file.

    ``eot_token`` names the end-of-turn token in the metadata; another control token than the default
    gives a model whose end-of-generation ids differ while every token text stays the same.
    ``n_layer`` blocks are drawn; ``keep_layers`` writes only the first of them (the same weights: a
    truncated copy of the ``n_layer`` model, for ``ead depth``'s fixed-depth check).
    ``split_max_tensors`` > 0 writes a split GGUF as llama.cpp's gguf-split does (21 tensors in all:
    11 gives two shards, ``<stem>-00001-of-00002.gguf`` and ``-00002-``); the first shard is returned.
    ``tokenizer_pre`` names llama.cpp's pre-tokenizer ("gemma4": "▁" read as a space, as Gemma 4 does).
    ``script`` (token texts, each once but the last) makes a bigram model that writes it, greedy: the
    blocks write nothing into the residual stream, so the last token alone decides the next, and each
    token's output row points at the one before it (the first follows the prompt's last token).
    ``n_head`` attention heads share the embedding (16 values each by default; 2 heads: 32, the block of
    a quantized KV cache).
    """
    tokens, types, merges = vocabulary(vocab)
    n_vocab = len(tokens)
    eos = tokens.index("<|im_end|>")
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    head_dim = N_EMBD // n_head
    tensors = {"token_embd.weight": normal(n_vocab, N_EMBD, std=1.0)}
    for i in range(n_layer):
        blk = f"blk.{i}"
        tensors |= {
            f"{blk}.attn_norm.weight": np.ones(N_EMBD, np.float32),
            f"{blk}.attn_q.weight": normal(N_EMBD, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.attn_k.weight": normal(N_HEAD_KV * head_dim, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.attn_v.weight": normal(N_HEAD_KV * head_dim, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.attn_output.weight": normal(N_EMBD, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.ffn_norm.weight": np.ones(N_EMBD, np.float32),
            f"{blk}.ffn_gate.weight": normal(N_FF, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.ffn_up.weight": normal(N_FF, N_EMBD, std=N_EMBD**-0.5),
            f"{blk}.ffn_down.weight": normal(N_EMBD, N_FF, std=N_FF**-0.5),
        }
    # Output row i gives logits ~ N(0, (logit_scale * gain_i)^2): the log-normal gains make a few
    # tokens dominate when the hidden state points their way, so the entropy varies between steps.
    gains = np.exp(rng.standard_normal(n_vocab) * 0.5).astype(np.float32)
    gains[np.array(types) != gguf.TokenType.NORMAL] = CONTROL_ROW_GAIN
    output = normal(n_vocab, N_EMBD, std=N_EMBD**-0.5) * gains[:, None] * np.float32(logit_scale)
    if len(set(script[:-1])) < len(script) - 1:
        raise ValueError(f"a script names each token once but the last, as a bigram can: {script}")
    for before, after in itertools.pairwise(script):
        hidden = tensors["token_embd.weight"][tokens.index(before)]
        normed = hidden / np.sqrt(np.mean(hidden**2))  # as output_norm leaves it
        output[tokens.index(after)] += np.float32(SCRIPT_LOGIT / N_EMBD) * normed
    if script:
        for name in tensors:
            if name.endswith((".attn_output.weight", ".ffn_down.weight")):
                tensors[name] = np.zeros_like(tensors[name])
    tensors |= {"output_norm.weight": np.ones(N_EMBD, np.float32), "output.weight": output}
    blocks = n_layer if keep_layers is None else keep_layers
    tensors = {
        name: data
        for name, data in tensors.items()
        if not name.startswith("blk.") or int(name.split(".")[1]) < blocks
    }

    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name(f"tiny-{vocab}-seed{seed}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama" if vocab == "spm" else "gpt2")
    writer.add_tokenizer_pre(tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if vocab == "spm":  # the longer a piece, the likelier: the pieces merge wherever they can
        normal = int(gguf.TokenType.NORMAL)
        writer.add_token_scores(
            [float(len(token)) if kind == normal else 0.0 for token, kind in zip(tokens, types, strict=True)]
        )
    else:
        writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_eot_token_id(tokens.index(eot_token))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    first = writer.format_shard_names(Path(path))[0]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return first


def write_scripted_pair(
    folder: Path, stem: str, chat_template: str, script: Sequence[str], vocab: str = "think-call"
) -> tuple[Path, Path]:
    """A small and a large tiny model of the ``vocab`` vocabulary (seeds 0 and 1) that both write
    ``script`` under ``chat_template``: a pair whose answer is known, whichever model writes."""
    small, large = (
        write_tiny_model(
            folder / f"{stem}{seed}.gguf",
            seed=seed,
            vocab=vocab,
            chat_template=chat_template,
            script=script,
        )
        for seed in (0, 1)
    )
    return small, large


def open_pair(paths: tuple[Path, Path], n_ctx: int = 512) -> list[Runner]:
    """Load a (small, large) pair on one thread: tiny models gain nothing from more, and on a busy machine
    llama.cpp's thread barrier waits for a descheduled thread on every token."""
    roles = ("small", "large")
    return [Runner(p, name=role, n_ctx=n_ctx, n_threads=1) for p, role in zip(paths, roles, strict=True)]

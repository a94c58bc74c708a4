"""Prompts for a language model's greedy decoding (``--mode predict`` with ``predict_input.prompt_file``).

A prompt file is UTF-8 text, one prompt per line; blank lines are skipped. ``encode_prompts``
tokenizes them into fixed arrays both frameworks decode from:

    tokens         (N, L) int32   each prompt left-aligned, then ``pad_id`` up to L
    prompt_length  (N,)   int32   the prompt's tokens

with L = the longest prompt + ``max_new_tokens``, so that the generated tokens land in place
(token t + 1 is the argmax of the logits at position t; the causal mask makes the padding
behind a prompt invisible to it). A prompt that leaves fewer than ``max_new_tokens`` of the
model's positions is refused with its file and line. ``completions`` cuts each row's new
tokens at the end-of-text id, and ``write_completions`` writes them as JSON lines.
``prompt_batches`` (PyTorch) and ``prompt_dataset`` (tf.data) batch the arrays in file order;
the last batch may be short: decoding runs on the CPU or a GPU, not on the device.
"""

from __future__ import annotations

import json
from pathlib import Path
import numpy as np

from common.errors import UserError
from common.io import atomic_open


def read_prompts(path) -> list[tuple[int, str]]:
    """(line number, prompt) of each non-blank line, the line's end removed."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such prompt file (predict_input.prompt_file)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {e.start}); a prompt file is UTF-8, one prompt "
                        f"per line") from None
    prompts = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not prompts:
        raise UserError(f"{path}: no prompt (every line is blank); write one prompt per line")
    return prompts


def encode_prompts(path, tokenizer, max_new_tokens: int, positions: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """The prompt file's tokens as the arrays of the module docstring. ``positions``: the
    longest sequence the model takes (model.max_position_embeddings)."""
    prompts = read_prompts(path)
    encoded = []
    for number, text in prompts:
        ids = tokenizer.encode(text).ids
        if len(ids) + max_new_tokens > positions:
            raise UserError(f"{path}:{number}: the prompt has {len(ids)} tokens; with predict_input.max_new_tokens "
                            f"{max_new_tokens} it needs {len(ids) + max_new_tokens} positions, and the model has "
                            f"{positions} (model.max_position_embeddings): shorten it or generate fewer tokens")
        encoded.append(ids)
    length = max(len(ids) for ids in encoded) + max_new_tokens
    tokens = np.full((len(encoded), length), pad_id, np.int32)
    for row, ids in zip(tokens, encoded):
        row[:len(ids)] = ids
    return {"tokens": tokens, "prompt_length": np.array([len(ids) for ids in encoded], np.int32)}


def completions(tokens: np.ndarray, prompt_length: np.ndarray, max_new_tokens: int, eos_id: int) -> list[list[int]]:
    """Each row's generated ids: the ``max_new_tokens`` after its prompt, cut before the first ``eos_id``."""
    out = []
    for row, start in zip(np.asarray(tokens), np.asarray(prompt_length)):
        new = [int(t) for t in row[int(start):int(start) + max_new_tokens]]
        out.append(new[:new.index(eos_id)] if eos_id in new else new)
    return out


def write_completions(path, prompt_file, tokenizer, tokens: np.ndarray, prompt_length: np.ndarray,
                      max_new_tokens: int, eos_id: int) -> int:
    """``path``: one JSON object per prompt, ``{"line", "prompt", "completion"}`` (the prompt
    file's line number, its text, the decoded new tokens). Returns the count written."""
    prompts = read_prompts(prompt_file)
    generated = completions(tokens, prompt_length, max_new_tokens, eos_id)
    if len(generated) != len(prompts):
        raise UserError(f"{prompt_file}: {len(prompts)} prompts, but {len(generated)} were decoded; was the file "
                        f"changed during the run?")
    with atomic_open(path, "w") as f:
        for (number, text), ids in zip(prompts, generated):
            f.write(json.dumps({"line": number, "prompt": text, "completion": tokenizer.decode(ids)},
                               ensure_ascii=False) + "\n")
    return len(prompts)



def prompt_batches(arrays: dict[str, np.ndarray], batch_size: int):
    """A DataLoader of (tokens, prompt_length) int64 batches, in file order."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    dataset = TensorDataset(torch.from_numpy(arrays["tokens"]).long(), torch.from_numpy(arrays["prompt_length"]).long())
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


def prompt_dataset(arrays: dict[str, np.ndarray], batch_size: int):
    """A tf.data.Dataset of {tokens, prompt_length} int32 batches, in file order."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)

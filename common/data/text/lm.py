"""Language-model data (GPT-2): documents -> byte-level BPE ids -> packed next-token windows.

What ``datasets/prepare_gpt2.py`` runs, and the readers of what it writes.

- ``pack_documents``: GPT-2's packing. The documents are concatenated, each followed by
  ``<|endoftext|>``, and the stream is cut into windows of max_seq_length + 1 tokens with
  stride max_seq_length, so every token but the stream's first is a label exactly once::

      stream    d0 d0 d0 EOT d1 d1 EOT            (max_seq_length 4)
      window 0  d0 d0 d0 EOT d1    input_ids = window[:-1], labels = window[1:]
      window 1  d1 d1 EOT pad pad  the last window, padded with EOT; padded labels are 0
                                   and attention_mask 0 there (1 on every real label)

- ``prepare_lm``: a byte-level BPE trained on the corpus (``encoder.json`` + ``vocab.bpe``,
  GPT-2's two files), a deterministic share of the documents held out for eval, the
  examples of each split packed and shuffled with the seed, written as shards in HDF5
  (PyTorch side) and/or TFRecords (TensorFlow side), the same examples in both::

      encoder.json, vocab.bpe        the tokenizer the ids refer to
      tokenizer.json                 the same tokenizer in one file (``tokenizer_json=True``, the
                                     llama folders): ``tokenizers.Tokenizer.from_file`` and
                                     transformers' PreTrainedTokenizerFast read it
      meta.json                      vocab_size, max_seq_length, eot_id, counts per split,
                                     corpus fingerprint, settings, each complete file's count
      train-0000K.h5 / .tfrecord     num_shards shards (K = 0..num_shards-1)
      eval-00000.h5 / .tfrecord      the held-out documents' examples

  Each file is written under a temporary name and renamed into place, and enters
  meta.json once complete: a rerun skips every file meta.json records that still holds
  its count, and (re)makes the others. A rerun with other settings stops, naming the
  first setting that differs.
- Readers, each checking the schema first (one ``UserError`` line naming the file and what
  is wrong): ``read_lm_hdf5`` (numpy), ``LMHDF5Dataset`` (torch, imported when made),
  ``lm_dataset`` (tf.data, TensorFlow imported when called), and ``check_lm_meta`` (the
  model's vocab_size and max_sequence_length against the data's).

Every array is (examples, max_seq_length): ``input_ids``, ``labels`` and
``attention_mask`` (int32 in HDF5, int64 features in TFRecords, int32 from ``lm_dataset``,
int64 tensors from ``LMHDF5Dataset``).
"""

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np

from common.data.text.corpus import corpus_fingerprint, default_corpus, read_corpus
from common.data.text.shards import (
    FORMATS, HDF5Examples, Schema, ShardResult, check_arrays, check_formats, check_tfrecord, count_tfrecord,
    previous_files, read_hdf5, tfrecord_dataset, write_hdf5, write_shards, write_tfrecord,
)
from common.errors import UserError

FIELDS = ("input_ids", "attention_mask", "labels")
DEFAULT_VOCAB_SIZE = 4096  # the default corpus fills exactly 4,096 pieces (8,192 would stop at 5,136)
MIN_VOCAB_SIZE = 257  # the 256 byte symbols and <|endoftext|>
META = "meta.json"


def pack_documents(token_docs: list[list[int]], max_seq_length: int, eot_id: int) -> dict[str, np.ndarray]:
    """The windows of ``token_docs`` (see the module docstring); int32 arrays (N, max_seq_length)."""
    if max_seq_length < 1:
        raise UserError(f"max_seq_length {max_seq_length}: must be at least 1")
    m = max_seq_length
    pieces = [p for d in token_docs for p in (np.asarray(d, dtype=np.int64), np.array([eot_id]))]
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    n = max(0, -(-(len(stream) - 1) // m))  # ceil((L - 1) / m): windows until every label is covered
    padded = np.full(n * m + 1, eot_id, dtype=np.int64)
    padded[:len(stream)] = stream[:n * m + 1]
    real = np.arange(1, n * m + 1) < len(stream)  # (N*M,) whether label position p+1 is in the stream
    labels = np.where(real, padded[1:], 0)
    return {
        "input_ids": padded[:-1].reshape(n, m).astype(np.int32),
        "attention_mask": real.reshape(n, m).astype(np.int32),
        "labels": labels.reshape(n, m).astype(np.int32),
    }


# --- readers (common/data/text/shards.py does the work) -----------------------------------------

SCHEMA = Schema(tuple((n, "seq") for n in FIELDS), "language-model", binary=("attention_mask",))


def _lengths(max_seq_length) -> dict:
    return {"seq": max_seq_length} if max_seq_length is not None else {}


def check_lm_arrays(arrays: dict, path, max_seq_length=None) -> tuple[int, int]:
    """(count, max_seq_length) of one file's arrays, or UserError naming the file and field."""
    n, lengths = check_arrays(arrays, path, SCHEMA, _lengths(max_seq_length))
    return n, lengths["seq"]


def write_lm_hdf5(arrays: dict[str, np.ndarray], path) -> None:
    write_hdf5(arrays, path, SCHEMA)


def read_lm_hdf5(path, max_seq_length=None) -> dict[str, np.ndarray]:
    """The int32 arrays of one HDF5 shard, schema-checked."""
    return read_hdf5(path, SCHEMA, _lengths(max_seq_length))


class LMHDF5Dataset(HDF5Examples):
    """A map-style torch dataset of every example of the HDF5 shards ``paths``, in file order:
    item k is a dict of int64 tensors (max_seq_length,) ``input_ids``, ``attention_mask``,
    ``labels`` (shards.HDF5Examples)."""

    def __init__(self, paths, max_seq_length=None):
        super().__init__(paths, SCHEMA, _lengths(max_seq_length))
        self.max_seq_length = self.lengths["seq"]


def write_lm_tfrecord(arrays: dict[str, np.ndarray], path) -> None:
    write_tfrecord(arrays, path, SCHEMA)


def check_lm_tfrecord(path, max_seq_length=None) -> int:
    """max_seq_length from the file's first example, or UserError naming the file and the feature."""
    return check_tfrecord(path, SCHEMA, _lengths(max_seq_length))["seq"]


def count_lm_tfrecord(path) -> int:
    return count_tfrecord(path, SCHEMA)


def lm_dataset(paths, max_seq_length=None):
    """A tf.data.Dataset of dicts of int32 (max_seq_length,) tensors over the TFRecord shards ``paths``.

    Every file's first example is checked first; shuffling, repeating and batching are the
    caller's.
    """
    return tfrecord_dataset(paths, SCHEMA, _lengths(max_seq_length))


def read_lm_meta(data_dir) -> dict:
    path = Path(data_dir) / META
    if not path.is_file():
        raise UserError(f"{path}: no such file; prepare the folder with datasets/prepare_gpt2.py")
    try:
        meta = json.loads(path.read_text())
        int(meta["vocab_size"]), int(meta["max_seq_length"]), int(meta["eot_id"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise UserError(f"{path}: unreadable (not the meta.json of datasets/prepare_gpt2.py)") from None
    return meta


def check_lm_meta(data_dir, vocab_size: int, max_seq_length: int) -> dict:
    """data_dir's meta.json, after checking the model's vocab_size and max_sequence_length equal the data's."""
    meta = read_lm_meta(data_dir)
    where = Path(data_dir) / META
    if meta["vocab_size"] != vocab_size:
        raise UserError(f"{where}: the data's vocab has {meta['vocab_size']:,} tokens, but model.vocab_size is "
                        f"{vocab_size:,}; set model.vocab_size: {meta['vocab_size']} or prepare data with "
                        f"--vocab_size {vocab_size}")
    if meta["max_seq_length"] != max_seq_length:
        raise UserError(f"{where}: the data's examples have {meta['max_seq_length']} tokens, but "
                        f"max_sequence_length is {max_seq_length}; use a data_dir prepared with "
                        f"--max_seq_length {max_seq_length}")
    return meta


# --- prepare ---------------------------------------------------------------------------------

def _encode(tokenizer, documents: list[list[str]], progress) -> list[list[int]]:
    ids = []
    for start in range(0, len(documents), 64):
        chunk = [" ".join(d) for d in documents[start:start + 64]]  # a document is one text, as BPE trained it
        ids.extend(e.ids for e in tokenizer.encode_batch(chunk, add_special_tokens=False))
        progress(len(chunk))
    return ids


def prepare_lm(
    output_dir,
    max_seq_length: int = 1024,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    input_files=None,
    field: str = "text",
    formats=FORMATS,
    num_shards: int = 1,
    seed: int = 12345,
    eval_fraction: float = 0.1,
    tokenizer_json: bool = False,
    log=print,
) -> list[ShardResult]:
    """Write the folder of the module docstring; one ShardResult per shard. ``tokenizer_json``
    writes the tokenizer as tokenizer.json too (it changes no example, so it is not one of the
    settings a rerun must repeat)."""
    from common.data.text.prepare import _Progress
    from common.data.text.tokenizer import END_OF_TEXT, train_byte_bpe, vocab_in_id_order, write_gpt2

    if max_seq_length < 1:
        raise UserError(f"max_seq_length {max_seq_length}: must be at least 1")
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(f"vocab_size {vocab_size}: must be at least {MIN_VOCAB_SIZE} (256 bytes and <|endoftext|>)")
    if num_shards < 1:
        raise UserError(f"num_shards {num_shards}: must be at least 1")
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval_fraction {eval_fraction}: must be in [0, 1)")
    io = check_formats(formats)  # a missing library stops before any work

    output_dir = Path(output_dir)
    input_files = list(input_files or [])
    documents = read_corpus(input_files, field) if input_files else default_corpus()
    source = ", ".join(map(str, input_files)) if input_files else "the default corpus (pydoc_data topics)"
    tokenizer = train_byte_bpe(documents, vocab_size)
    vocab = vocab_in_id_order(tokenizer)
    eot_id = tokenizer.token_to_id(END_OF_TEXT)

    progress = _Progress(len(documents), "tokenize")
    token_docs = [d for d in _encode(tokenizer, documents, progress) if d]
    progress.close()
    order = list(range(len(token_docs)))
    random.Random(seed).shuffle(order)  # which documents are held out: the same for a seed
    num_eval = max(1, round(len(order) * eval_fraction)) if eval_fraction > 0 else 0
    if len(order) - num_eval < 1:
        raise UserError(f"{source}: {len(order)} document(s) with text leave none for training after "
                        f"eval_fraction {eval_fraction}")
    split_docs = {"eval": [token_docs[i] for i in order[:num_eval]], "train": [token_docs[i] for i in order[num_eval:]]}
    splits = {}
    for split, docs in split_docs.items():
        arrays = pack_documents(docs, max_seq_length, eot_id)
        perm = list(range(arrays["input_ids"].shape[0]))
        random.Random(f"{seed}/{split}").shuffle(perm)
        splits[split] = {n: a[perm] for n, a in arrays.items()}
    n_train = splits["train"]["input_ids"].shape[0]
    if n_train < num_shards:
        raise UserError(f"{source}: {n_train} training example(s) cannot fill {num_shards} shard(s); "
                        f"lower num_shards or max_seq_length, or give more text")

    settings = {
        "source": source,
        "corpus_fingerprint": corpus_fingerprint(documents),
        "vocab_size_requested": vocab_size,
        "max_seq_length": max_seq_length,
        "seed": seed,
        "num_shards": num_shards,
        "eval_fraction": eval_fraction,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    meta_path = output_dir / META
    done = previous_files(meta_path, settings)
    meta = {
        "vocab_size": len(vocab),
        "max_seq_length": max_seq_length,
        "eot_id": eot_id,
        "counts": {s: int(a["input_ids"].shape[0]) for s, a in splits.items()},
        "tokens": {s: int(a["attention_mask"].sum()) for s, a in splits.items()},
        "documents": {s: len(d) for s, d in split_docs.items()},
        "corpus_fingerprint": settings["corpus_fingerprint"],
        "vocab_sha256": hashlib.sha256("\n".join(vocab).encode()).hexdigest()[:16],
        "settings": settings,
        "files": done,
    }

    tmp_encoder, tmp_merges = output_dir / "encoder.json.tmp", output_dir / "vocab.bpe.tmp"
    write_gpt2(tokenizer, tmp_encoder, tmp_merges)
    os.replace(tmp_encoder, output_dir / "encoder.json")
    os.replace(tmp_merges, output_dir / "vocab.bpe")
    written = "vocab.bpe"
    if tokenizer_json:
        tmp_json = output_dir / "tokenizer.json.tmp"
        tokenizer.save(str(tmp_json))
        os.replace(tmp_json, output_dir / "tokenizer.json")
        written += ", tokenizer.json"
    log(f"{source}: {len(documents):,} documents ({meta['documents']['eval']:,} held out for eval), "
        f"{meta['tokens']['train'] + meta['tokens']['eval']:,} labelled tokens; vocab {len(vocab):,} "
        f"(<|endoftext|> = {eot_id}) -> {output_dir / 'encoder.json'}, {written}")

    shard_counts = {"train": num_shards, "eval": 1 if num_eval else 0}
    return write_shards(output_dir, splits, shard_counts, io, SCHEMA, meta, meta_path, log,
                        what=f"examples of {max_seq_length} tokens")

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

import bisect
import dataclasses
import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from common.data.text.corpus import corpus_fingerprint, default_corpus, read_corpus
from common.errors import UserError

FIELDS = ("input_ids", "attention_mask", "labels")
FORMATS = ("hdf5", "tfrecord")
SUFFIX = {"hdf5": ".h5", "tfrecord": ".tfrecord"}
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


# --- readers ---------------------------------------------------------------------------------

def check_lm_arrays(arrays: dict, path, max_seq_length=None) -> tuple[int, int]:
    """(count, max_seq_length) of one file's arrays, or UserError naming the file and field."""
    for name in FIELDS:
        if name not in arrays:
            raise UserError(f"{path}: not a language-model data file: field {name!r} is missing "
                            f"(expected {', '.join(FIELDS)})")
        a = arrays[name]
        if a.dtype.kind not in "iu" or a.ndim != 2:
            raise UserError(f"{path}: field {name!r} is {a.dtype} of shape {a.shape}; expected 2-D integers")
    n, seq = arrays["input_ids"].shape
    if max_seq_length is not None and seq != max_seq_length:
        raise UserError(f"{path}: examples of {seq} tokens; expected max_seq_length {max_seq_length}")
    for name in FIELDS:
        if arrays[name].shape != (n, seq):
            raise UserError(f"{path}: field {name!r} has shape {arrays[name].shape}; expected {(n, seq)}")
    if not np.isin(arrays["attention_mask"], (0, 1)).all():
        raise UserError(f"{path}: field 'attention_mask' holds values other than 0 and 1")
    return n, seq


def write_lm_hdf5(arrays: dict[str, np.ndarray], path) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for name in FIELDS:
            f.create_dataset(name, data=arrays[name].astype(np.int32), compression="gzip", compression_opts=4)


def read_lm_hdf5(path, max_seq_length=None) -> dict[str, np.ndarray]:
    """The int32 arrays of one HDF5 shard, schema-checked."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            arrays = {n: f[n][()] for n in FIELDS if n in f and isinstance(f[n], h5py.Dataset)}
    except OSError as e:
        raise UserError(f"{path}: not a readable HDF5 file ({str(e).splitlines()[0]})") from None
    check_lm_arrays(arrays, path, max_seq_length)
    return {n: a.astype(np.int32) for n, a in arrays.items()}


def count_lm_hdf5(path) -> int:
    return read_lm_hdf5(path)["input_ids"].shape[0]


class LMHDF5Dataset:
    """A map-style torch dataset of every example of the HDF5 shards ``paths``, in file order.

    Item k is a dict of int64 tensors (max_seq_length,) ``input_ids``, ``attention_mask``,
    ``labels``. Every file is read and checked when the dataset is made (a shard of the
    default corpus is well under a MB), so a wrong file stops before training starts.
    """

    def __init__(self, paths, max_seq_length=None):
        import torch

        paths = [str(p) for p in paths]
        if not paths:
            raise UserError("no HDF5 file given")
        self.shards = []
        for p in paths:
            arrays = read_lm_hdf5(p, max_seq_length)
            max_seq_length = arrays["input_ids"].shape[1]
            self.shards.append({n: torch.from_numpy(a.astype(np.int64)) for n, a in arrays.items()})
        self.max_seq_length = max_seq_length
        self.ends = np.cumsum([s["input_ids"].shape[0] for s in self.shards]).tolist()

    def __len__(self):
        return self.ends[-1]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = bisect.bisect_right(self.ends, index)
        k = index - (self.ends[s - 1] if s else 0)
        return {n: t[k] for n, t in self.shards[s].items()}


def write_lm_tfrecord(arrays: dict[str, np.ndarray], path) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for k in range(arrays["input_ids"].shape[0]):
            feature = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=arrays[n][k].tolist())) for n in FIELDS}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _tf_records(path):
    """A file's serialized records by a plain Python reader (works inside a TF1 graph's input_fn too)."""
    import tensorflow as tf
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        yield from tf.compat.v1.io.tf_record_iterator(str(path))


def check_lm_tfrecord(path, max_seq_length=None) -> int:
    """max_seq_length from the file's first example, or UserError naming the file and the feature."""
    import tensorflow as tf

    try:
        first = next(iter(_tf_records(path)), None)
        example = None if first is None else tf.train.Example.FromString(first)
    except Exception as e:  # DataLossError for a bad record, protobuf's DecodeError for a bad Example
        raise UserError(f"{path}: not a TFRecord file of tf.train.Example ({type(e).__name__})") from None
    if example is None:
        raise UserError(f"{path}: empty TFRecord file (no example in it)")
    feature = example.features.feature
    lengths = {}
    for name in FIELDS:
        if name not in feature:
            raise UserError(f"{path}: not a language-model data file: feature {name!r} is missing "
                            f"(expected {', '.join(FIELDS)})")
        kind = feature[name].WhichOneof("kind")
        if kind != "int64_list":
            raise UserError(f"{path}: feature {name!r} is a {kind}; expected an int64_list")
        lengths[name] = len(feature[name].int64_list.value)
    seq = lengths["input_ids"]
    for name, length in lengths.items():
        if length != (max_seq_length or seq):
            raise UserError(f"{path}: feature {name!r} has {length} values; expected max_seq_length "
                            f"{max_seq_length or seq}")
    return seq


def count_lm_tfrecord(path) -> int:
    import tensorflow as tf

    check_lm_tfrecord(path)
    try:
        return sum(1 for _ in _tf_records(path))
    except tf.errors.OpError as e:
        raise UserError(f"{path}: corrupt TFRecord file ({type(e).__name__})") from None


def lm_dataset(paths, max_seq_length=None):
    """A tf.data.Dataset of dicts of int32 (max_seq_length,) tensors over the TFRecord shards ``paths``.

    Every file's first example is checked first; shuffling, repeating and batching are the
    caller's.
    """
    import tensorflow as tf

    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("no TFRecord file given")
    for p in paths:
        max_seq_length = check_lm_tfrecord(p, max_seq_length)
    spec = {n: tf.io.FixedLenFeature([max_seq_length], tf.int64) for n in FIELDS}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return {n: tf.cast(v, tf.int32) for n, v in example.items()}  # int64 on disk; the models take int32

    return tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


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

@dataclasses.dataclass
class LMShardResult:
    name: str
    examples: int
    files: list[Path]
    skipped: bool


def _io(fmt: str):
    """(writer, counter) of a format, after checking its library imports."""
    if fmt == "hdf5":
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise UserError("format hdf5 needs h5py (pip install h5py)") from None
        return write_lm_hdf5, count_lm_hdf5
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        raise UserError("format tfrecord needs tensorflow; on a PyTorch-only install use format hdf5") from None
    return write_lm_tfrecord, count_lm_tfrecord


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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
    log=print,
) -> list[LMShardResult]:
    """Write the folder of the module docstring; one LMShardResult per shard."""
    from common.data.text.prepare import _Progress
    from common.data.text.tokenizer import END_OF_TEXT, train_byte_bpe, vocab_in_id_order, write_gpt2

    formats = tuple(formats)
    if not formats:
        raise UserError("formats: give at least one of hdf5, tfrecord")
    for fmt in formats:
        if fmt not in FORMATS:
            raise UserError(f"format {fmt!r}: unknown; choose from {', '.join(FORMATS)}")
    if max_seq_length < 1:
        raise UserError(f"max_seq_length {max_seq_length}: must be at least 1")
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(f"vocab_size {vocab_size}: must be at least {MIN_VOCAB_SIZE} (256 bytes and <|endoftext|>)")
    if num_shards < 1:
        raise UserError(f"num_shards {num_shards}: must be at least 1")
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval_fraction {eval_fraction}: must be in [0, 1)")
    io = {fmt: _io(fmt) for fmt in formats}  # a missing library stops before any work

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
    done = {}
    if meta_path.exists():
        try:
            previous = json.loads(meta_path.read_text())
            old_settings, done = previous["settings"], dict(previous["files"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{meta_path}: unreadable; remove it (and the shards) to start over") from None
        for key, value in settings.items():
            if old_settings.get(key) != value:
                raise UserError(f"{output_dir}: holds examples made with {key} = {old_settings.get(key)!r}, "
                                f"not {value!r}; use another output_dir or empty this one")
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

    def save_meta():
        _atomic_write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", meta_path)

    tmp_encoder, tmp_merges = output_dir / "encoder.json.tmp", output_dir / "vocab.bpe.tmp"
    write_gpt2(tokenizer, tmp_encoder, tmp_merges)
    os.replace(tmp_encoder, output_dir / "encoder.json")
    os.replace(tmp_merges, output_dir / "vocab.bpe")
    save_meta()
    log(f"{source}: {len(documents):,} documents ({meta['documents']['eval']:,} held out for eval), "
        f"{meta['tokens']['train'] + meta['tokens']['eval']:,} labelled tokens; vocab {len(vocab):,} "
        f"(<|endoftext|> = {eot_id}) -> {output_dir / 'encoder.json'}, vocab.bpe")

    results, started, made = [], time.perf_counter(), 0
    for split, shards in (("train", num_shards), ("eval", 1 if num_eval else 0)):
        index_parts = np.array_split(np.arange(splits[split]["input_ids"].shape[0]), shards) if shards else []
        for k, indexes in enumerate(index_parts):
            name = f"{split}-{k:05d}"
            arrays = {n: a[indexes] for n, a in splits[split].items()}
            count, files, skipped = len(indexes), [], True
            for fmt in formats:
                f = output_dir / (name + SUFFIX[fmt])
                files.append(f)
                if done.get(f.name) == count and f.exists():
                    try:
                        if io[fmt][1](f) == count:
                            continue
                    except UserError:
                        pass  # a damaged file: made again below
                done.pop(f.name, None)
                save_meta()
                tmp = f.with_name(f.name + ".tmp")
                io[fmt][0](arrays, tmp)
                os.replace(tmp, f)
                done[f.name] = count
                save_meta()
                skipped = False
            made += 0 if skipped else count
            results.append(LMShardResult(name, count, files, skipped))
            sizes = ", ".join(f"{f.name} {f.stat().st_size / 1e6:.2f} MB" for f in files)
            log(f"{name}: complete ({count:,} examples), skipped" if skipped
                else f"{name}: {count:,} examples -> {sizes}")
    seconds = time.perf_counter() - started
    log(f"{sum(r.examples for r in results):,} examples of {max_seq_length} tokens in {output_dir} "
        f"({made:,} written in {seconds:.2f} s)")
    return results

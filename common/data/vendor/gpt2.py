"""GPT-2 language-model data in the vendor's layouts, from this zoo's: what ``zoo prepare vendor_gpt2`` runs.

The vendor's PyTorch GPT-2 folder (its ``GptHDF5DataProcessor``) reads every ``*.h5`` of a
``data_dir``, sorted by name, one folder per split::

    <output_dir>/train/gpt2-1.h5 .. gpt2-K.h5   example k of the split in file k % K, as example_{k // K}
        attrs["n_examples"]                     the file's count of examples
        example_0 .. example_{n-1}              int32 (3, max_seq_length): rows input_ids,
                                                attention_mask, labels
    <output_dir>/eval/gpt2-1.h5

Its TF gpt2, gpt3 and gptj folders (``GptTfRecordsProcessor``) read every ``*.tfrecord*`` of
a ``data_dir`` (``format="tfrecords"``): the same files named ``gpt2-k.tfrecords``, each
example a tf.train.Example of three int64 lists of max_seq_length: ``input_ids``,
``input_mask`` (1 on a real token, 0 on padding: the zoo's attention_mask; the reader
inverts it) and ``labels``.

The examples are this zoo's (common/data/text/lm.py: its byte-level BPE trained on the
corpus, the documents packed into next-token windows, padding masked out by
attention_mask); ``prepare_vendor_lm`` makes them with ``prepare_lm`` in ``output_dir``
itself (encoder.json, vocab.bpe, meta.json and the zoo's own shards, which pytorch/gpt2
reads) and writes them again in the layout above. Each file is written under a temporary
name and renamed into place; a rerun remakes every file (a second for the default
corpus). ``read_vendor_lm_hdf5`` and ``vendor_lm_examples`` read the layout back in the
vendor's reading order, checking it first: one ``UserError`` naming the file and what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from common.data.text.lm import DEFAULT_VOCAB_SIZE, FIELDS, check_lm_arrays, prepare_lm, read_lm_hdf5, read_lm_meta
from common.errors import UserError

ROWS = ("input_ids", "attention_mask", "labels")  # the rows of each example, in the vendor's order
NAME = "gpt2"  # files are NAME-1.h5 .. NAME-K.h5, as the vendor's preparation script names them
SPLITS = ("train", "eval")
SUFFIXES = {"hdf5": ".h5", "tfrecords": ".tfrecords"}  # format -> the files' suffix
TF_FEATURES = {"input_ids": "input_ids", "input_mask": "attention_mask", "labels": "labels"}  # record -> zoo name


def write_vendor_lm_hdf5(arrays: dict[str, np.ndarray], path) -> None:
    """One file of the layout: the examples of ``arrays`` (each (N, max_seq_length)), in order."""
    import h5py

    n, _ = check_lm_arrays(arrays, path)
    stacked = np.stack([arrays[row] for row in ROWS], axis=1).astype(np.int32)  # (N, 3, max_seq_length)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # not *.h5: the vendor's reader never sees a half-written file
    with h5py.File(tmp, "w") as f:
        f.attrs["n_examples"] = n
        for i in range(n):
            f.create_dataset(f"example_{i}", data=stacked[i])
    os.replace(tmp, path)


def read_vendor_lm_hdf5(path) -> dict[str, np.ndarray]:
    """The int32 arrays (N, max_seq_length) of one file of the layout, in its example order, checked."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "n_examples" not in f.attrs:
                raise UserError(f"{path}: not a file of the vendor's GPT-2 layout: no attribute 'n_examples'")
            n = f.attrs["n_examples"]
            if not isinstance(n, (int, np.integer)) or n < 0:
                raise UserError(f"{path}: attribute 'n_examples' must be a count, got {n!r}")
            examples = []
            for i in range(int(n)):
                key = f"example_{i}"
                if key not in f:
                    raise UserError(f"{path}: n_examples is {n}, but there is no dataset {key!r}")
                example = f[key][()]
                if example.dtype.kind not in "iu" or example.ndim != 2 or example.shape[0] != len(ROWS):
                    raise UserError(f"{path}: {key} is {example.dtype} of shape {example.shape}; expected integers "
                                    f"of shape (3, max_seq_length): rows {', '.join(ROWS)}")
                if examples and example.shape != examples[0].shape:
                    raise UserError(f"{path}: {key} has shape {example.shape}, example_0 {examples[0].shape}")
                examples.append(example)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:  # h5py's errors for a damaged file
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: not a readable HDF5 file ({line})") from None
    stacked = np.stack(examples) if examples else np.zeros((0, len(ROWS), 0), np.int32)  # (N, 3, max_seq_length)
    arrays = {row: stacked[:, k, :].astype(np.int32) for k, row in enumerate(ROWS)}
    check_lm_arrays(arrays, path)  # attention_mask 0 and 1 only
    return arrays


def write_vendor_lm_tfrecord(arrays: dict[str, np.ndarray], path) -> None:
    """One TFRecords file of the layout: the examples of ``arrays`` (each (N, max_seq_length)), in order."""
    import tensorflow as tf

    n, _ = check_lm_arrays(arrays, path)
    path = Path(path)
    tmp = path.with_name(path.stem + ".partial")  # no ".tfrecord" in it: the vendor's glob never sees it
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for i in range(n):
            features = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=arrays[name][i].tolist()))
                        for key, name in TF_FEATURES.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    os.replace(tmp, path)


def read_vendor_lm_tfrecord(path) -> dict[str, np.ndarray]:
    """The int32 arrays (N, max_seq_length) of one TFRecords file of the layout, in order, checked."""
    import tensorflow as tf

    columns: dict[str, list] = {name: [] for name in TF_FEATURES.values()}
    try:
        for i, record in enumerate(tf.compat.v1.io.tf_record_iterator(str(path))):
            feature = tf.train.Example.FromString(record).features.feature
            for key, name in TF_FEATURES.items():
                if key not in feature or feature[key].WhichOneof("kind") != "int64_list":
                    raise UserError(f"{path}: example {i} has no int64 feature {key!r} (the vendor's GPT reader "
                                    f"takes {', '.join(TF_FEATURES)})")
                values = np.asarray(feature[key].int64_list.value, np.int64)
                first = columns["input_ids"][0] if columns["input_ids"] else values
                if values.shape != first.shape:
                    raise UserError(f"{path}: example {i}: {key} has {values.size} values, example 0 {first.size}")
                columns[name].append(values)
    except (tf.errors.OpError, ValueError) as e:  # a damaged or non-TFRecords file
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: not a readable TFRecords file ({line})") from None
    arrays = {name: (np.stack(rows) if rows else np.zeros((0, 0), np.int64)).astype(np.int32)
              for name, rows in columns.items()}
    check_lm_arrays(arrays, path)
    return arrays


def vendor_lm_files(data_dir, format: str = "hdf5") -> list[Path]:
    """The files the vendor's reader takes from ``data_dir``: its ``*.h5`` (or ``*.tfrecord*``), sorted."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: no such folder (make one with: zoo prepare vendor_gpt2 --output_dir DIR)")
    pattern = "*.h5" if format == "hdf5" else "*.tfrecord*"
    files = sorted(data_dir.glob(pattern))
    if not files:
        raise UserError(f"{data_dir}: no {pattern} files (make them with: zoo prepare vendor_gpt2 --output_dir DIR"
                        f"{'' if format == 'hdf5' else ' --format tfrecords'})")
    return files


def vendor_lm_examples(data_dir, format: str = "hdf5") -> Iterator[dict[str, np.ndarray]]:
    """Every example of ``data_dir`` as the vendor's reader yields them unshuffled: file by file in name
    order, each file's examples in order; a dict of int32 (max_seq_length,) arrays."""
    read = read_vendor_lm_hdf5 if format == "hdf5" else read_vendor_lm_tfrecord
    for path in vendor_lm_files(data_dir, format):
        arrays = read(path)
        for i in range(arrays["input_ids"].shape[0]):
            yield {row: arrays[row][i] for row in ROWS}


def write_vendor_lm_split(arrays: dict[str, np.ndarray], folder, num_files: int, format: str = "hdf5") -> list[Path]:
    """A split's examples dealt round-robin into ``folder``/gpt2-1.h5 .. gpt2-K.h5 (K = num_files; .tfrecords
    for that format), as the vendor's script deals them; files of that name beyond K, left by an earlier run,
    are removed."""
    if format not in SUFFIXES:
        raise UserError(f"format {format!r}: expected one of {', '.join(SUFFIXES)}")
    suffix, write = SUFFIXES[format], write_vendor_lm_hdf5 if format == "hdf5" else write_vendor_lm_tfrecord
    n = arrays["input_ids"].shape[0]
    if num_files < 1:
        raise UserError(f"num_files {num_files}: must be at least 1")
    if n < num_files:
        raise UserError(f"{folder}: {n} example(s) cannot fill {num_files} files; lower num_files or "
                        f"max_seq_length, or give more text")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(num_files):
        path = folder / f"{NAME}-{k + 1}{suffix}"
        write({row: a[k::num_files] for row, a in arrays.items()}, path)
        paths.append(path)
    for stale in folder.glob(f"{NAME}-*{suffix}"):
        if stale not in paths and stale.stem.removeprefix(f"{NAME}-").isdigit():
            stale.unlink()
    return paths


def prepare_vendor_lm(
    output_dir,
    max_seq_length: int = 1024,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    input_files=None,
    field: str = "text",
    num_files: int = 1,
    seed: int = 12345,
    eval_fraction: float = 0.1,
    format: str = "hdf5",
    log=print,
) -> dict[str, list[Path]]:
    """The zoo's GPT-2 data in ``output_dir`` (prepare_lm, HDF5), then its splits in the vendor's layout
    (``format`` hdf5 for its PyTorch folders, tfrecords for its TF ones) in ``output_dir``/train
    (num_files files) and ``output_dir``/eval (one); the files by split."""
    if num_files < 1:  # before the work
        raise UserError(f"num_files {num_files}: must be at least 1")
    if format not in SUFFIXES:
        raise UserError(f"format {format!r}: expected one of {', '.join(SUFFIXES)}")
    prepare_lm(output_dir, max_seq_length=max_seq_length, vocab_size=vocab_size, input_files=input_files,
               field=field, formats=("hdf5",), seed=seed, eval_fraction=eval_fraction, log=log)
    output_dir = Path(output_dir)
    meta = read_lm_meta(output_dir)
    written = {}
    for split in SPLITS:
        shards = sorted(output_dir.glob(f"{split}-*.h5"))
        if not shards:  # eval_fraction 0: no eval split
            continue
        parts = [read_lm_hdf5(p, max_seq_length) for p in shards]
        arrays = {name: np.concatenate([p[name] for p in parts]) for name in FIELDS}
        written[split] = write_vendor_lm_split(arrays, output_dir / split, num_files if split == "train" else 1,
                                               format)
        log(f"{split}: {arrays['input_ids'].shape[0]:,} examples of {max_seq_length} tokens in the vendor's "
            f"{format} layout -> {output_dir / split} ({len(written[split])} file(s))")
    overrides = [f"{split}_input.data_dir={output_dir / split}" for split in SPLITS if split in written]
    if format == "hdf5":
        overrides.append(f"model.vocab_size={meta['vocab_size']}")
    else:  # the TF folders keep vocab_size with the input
        overrides += [f"{split}_input.vocab_size={meta['vocab_size']}" for split in SPLITS if split in written]
    overrides += [f"train_input.max_sequence_length={max_seq_length}",
                  f"eval_input.max_sequence_length={max_seq_length}", f"model.max_position_embeddings={max_seq_length}"]
    if format == "hdf5":
        log(f"the vendor's GPT-2 folder trains on it with: {' '.join(overrides)}")
    else:  # the vendor's TF run.py takes no overrides on its command line
        log(f"the vendor's TF GPT folders train on it with these params (in the params file): {' '.join(overrides)}")
    return written

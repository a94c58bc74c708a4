"""Fixed-length integer examples as restartable HDF5 and TFRecord shards, written and read.

What ``common/data/text/lm.py`` (GPT-2) and ``seq2seq.py`` (Transformer, T5) share. A
data set is a dict of 2-D integer arrays (examples, length) whose names and lengths a
``Schema`` fixes: each field belongs to a length group ("seq" for a language model;
"source" and "target" for an encoder-decoder), and every field of a group has the group's
length. HDF5 holds one int32 dataset per field (PyTorch side), TFRecords one
``tf.train.Example`` per example with an int64 list per field (TensorFlow side): the same
examples in both.

``write_shards`` writes each split's shards under temporary names, renames them into place
and records each complete file in the caller's meta.json, so a rerun skips what is
complete and remakes the rest. Readers check the schema first and raise ``UserError``
naming the file and what is wrong. h5py, TensorFlow and torch are imported when used.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import time
import zlib
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from common.errors import UserError

FORMATS = ("hdf5", "tfrecord")
SUFFIX = {"hdf5": ".h5", "tfrecord": ".tfrecord"}


@dataclasses.dataclass(frozen=True)
class Schema:
    """Field name -> length group, and what the data is (for messages)."""

    fields: tuple[tuple[str, str], ...]  # ((name, group), ...) in file order
    kind: str  # e.g. "language-model"
    binary: tuple[str, ...] = ()  # fields holding 0 and 1 only (masks)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    def group(self, name: str) -> str:
        return dict(self.fields)[name]


def check_arrays(arrays: Mapping, path, schema: Schema, lengths: Mapping | None = None) -> tuple[int, dict]:
    """(count, {group: length}) of one file's arrays, or UserError naming the file and field."""
    for name in schema.names:
        if name not in arrays:
            raise UserError(f"{path}: not a {schema.kind} data file: field {name!r} is missing "
                            f"(expected {', '.join(schema.names)})")
        a = arrays[name]
        if a.dtype.kind not in "iu" or a.ndim != 2:
            raise UserError(f"{path}: field {name!r} is {a.dtype} of shape {a.shape}; expected 2-D integers")
    n = arrays[schema.names[0]].shape[0]
    found: dict[str, int] = {}
    for name, group in schema.fields:
        length = arrays[name].shape[1]
        expected = (lengths or {}).get(group) or found.get(group)
        if expected is not None and length != expected:
            what = "max_seq_length" if group == "seq" else f"{group} length"
            raise UserError(f"{path}: field {name!r} holds {length} tokens per example; expected {what} {expected}")
        found.setdefault(group, length)
        if arrays[name].shape[0] != n:
            raise UserError(f"{path}: field {name!r} has {arrays[name].shape[0]} examples; expected {n}")
    for name in schema.binary:
        if not np.isin(arrays[name], (0, 1)).all():
            raise UserError(f"{path}: field {name!r} holds values other than 0 and 1")
    return n, found


# --- HDF5 -------------------------------------------------------------------------------------

def write_hdf5(arrays: Mapping[str, np.ndarray], path, schema: Schema) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for name in schema.names:
            # fletcher32: a checksum per chunk, so that a damaged file is refused rather than read as other numbers
            f.create_dataset(name, data=arrays[name].astype(np.int32), compression="gzip", compression_opts=4,
                             fletcher32=True)


def read_hdf5(path, schema: Schema, lengths: Mapping | None = None) -> dict[str, np.ndarray]:
    """The int32 arrays of one HDF5 shard, schema-checked."""
    arrays = read_hdf5_datasets(path, schema.names)
    check_arrays(arrays, path, schema, lengths)
    return {n: a.astype(np.int32) for n, a in arrays.items()}


def read_hdf5_datasets(path, names) -> dict[str, np.ndarray]:
    """The datasets ``names`` of an HDF5 file (those it holds), read whole; a damaged file is a
    UserError naming it. A damaged chunk index or filter list can read as zeros, or as the
    compressed bytes, without an error from HDF5: every chunk must be found as the layout says."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            arrays = {}
            for name in names:
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    continue
                dataset = f[name]
                arrays[name] = dataset[()]
                if dataset.size and not _all_stored(dataset):
                    raise UserError(f"{path}: not a readable HDF5 file (the stored chunks of dataset {name!r} do "
                                    f"not match its layout: the file is damaged or was cut short while written)")
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:  # h5py's errors for a damaged file
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: not a readable HDF5 file ({line})") from None
    return arrays


def _all_stored(dataset) -> bool:
    """Whether every chunk of ``dataset`` (or its one contiguous block) is found where a read
    looks for it: a damaged chunk index can leave one out, or move it, and HDF5 then reads
    the fill value (zeros) in its place without a word."""
    stored = dataset.id.get_storage_size()
    if stored == 0:
        return False
    chunk = dataset.chunks or dataset.shape
    grid = [-(-n // c) for n, c in zip(dataset.shape, chunk)]
    if dataset.id.get_create_plist().get_nfilters() == 0 and \
            stored != int(np.prod(grid)) * int(np.prod(chunk)) * dataset.dtype.itemsize:
        return False  # unfiltered bytes have one size only (a damaged filter list reads gzip's bytes as numbers)
    if dataset.chunks is None:
        return True
    # the chunk index answers a walk over it and a look-up by place on separate paths: the
    # look-up is the one a read takes (a second read of each chunk's stored bytes, compressed)
    plist = dataset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    for index in np.ndindex(*grid):
        try:
            _, raw = dataset.id.read_direct_chunk(tuple(i * c for i, c in zip(index, dataset.chunks)))
            # the zoo's own pipeline (gzip, then Fletcher-32's 4 bytes): the chunk's bytes, unpacked, must
            # be as many as its layout says (a damaged datatype can read float32 as float64 without a word)
            if filters == [_DEFLATE, _FLETCHER32] and \
                    len(zlib.decompress(raw[:-4])) != int(np.prod(chunk)) * dataset.dtype.itemsize:
                return False
        except (OSError, RuntimeError, ValueError, KeyError, zlib.error):
            return False
    return True


_DEFLATE, _FLETCHER32 = 1, 3  # HDF5's filter ids (h5py.h5z.FILTER_DEFLATE, FILTER_FLETCHER32)


class HDF5Examples:
    """A map-style torch dataset of every example of the HDF5 shards ``paths``, in file order.

    Item k is a dict of int64 tensors, one per field. Every file is read and checked when
    the dataset is made (the default corpora's shards are well under a MB), so a wrong file
    stops before training starts.
    """

    def __init__(self, paths, schema: Schema, lengths: Mapping | None = None):
        import torch

        paths = [str(p) for p in paths]
        if not paths:
            raise UserError("no HDF5 file given")
        self.shards = []
        lengths = dict(lengths or {})
        for p in paths:
            arrays = read_hdf5(p, schema, lengths)
            lengths.update({schema.group(n): a.shape[1] for n, a in arrays.items()})
            self.shards.append({n: torch.from_numpy(a.astype(np.int64)) for n, a in arrays.items()})
        self.lengths = lengths
        self.ends = np.cumsum([next(iter(s.values())).shape[0] for s in self.shards]).tolist()

    def __len__(self):
        return self.ends[-1]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = bisect.bisect_right(self.ends, index)
        k = index - (self.ends[s - 1] if s else 0)
        return {n: t[k] for n, t in self.shards[s].items()}


# --- TFRecords --------------------------------------------------------------------------------

def write_tfrecord(arrays: Mapping[str, np.ndarray], path, schema: Schema) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for k in range(arrays[schema.names[0]].shape[0]):
            feature = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=arrays[n][k].tolist()))
                       for n in schema.names}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True))


def tf_records(path):
    """A file's serialized records by a plain Python reader (works inside a TF1 graph's input_fn too)."""
    import tensorflow as tf
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        yield from tf.compat.v1.io.tf_record_iterator(str(path))


def check_tfrecord(path, schema: Schema, lengths: Mapping | None = None) -> dict:
    """{group: length} from the file's first example, or UserError naming the file and the feature."""
    import tensorflow as tf

    try:
        first = next(iter(tf_records(path)), None)
        example = None if first is None else tf.train.Example.FromString(first)
    except Exception as e:  # DataLossError for a bad record, protobuf's DecodeError for a bad Example
        raise UserError(f"{path}: not a TFRecord file of tf.train.Example ({type(e).__name__})") from None
    if example is None:
        raise UserError(f"{path}: empty TFRecord file (no example in it)")
    feature = example.features.feature
    found = dict(lengths or {})
    for name, group in schema.fields:
        if name not in feature:
            raise UserError(f"{path}: not a {schema.kind} data file: feature {name!r} is missing "
                            f"(expected {', '.join(schema.names)})")
        kind = feature[name].WhichOneof("kind")
        if kind != "int64_list":
            raise UserError(f"{path}: feature {name!r} is a {kind}; expected an int64_list")
        length = len(feature[name].int64_list.value)
        expected = found.setdefault(group, length)
        if length != expected:
            what = "max_seq_length" if group == "seq" else f"{group} length"
            raise UserError(f"{path}: feature {name!r} has {length} values; expected {what} {expected}")
    return found


def check_whole_records(path, sizes: list[int]) -> None:
    """A file cut inside the 12-byte header of a record reads as a clean end in TensorFlow's
    reader; the records' sizes must add up to the file's size. (Each record: its length, 8
    bytes, and the length's CRC-32C, 4; the data; the data's CRC-32C, 4.)"""
    whole = sum(size + 16 for size in sizes)
    left = os.path.getsize(path) - whole
    if left:
        raise UserError(f"{path}: corrupt TFRecord file ({left} bytes after its last whole record: cut short "
                        f"while written or copied?)")


def count_tfrecord(path, schema: Schema) -> int:
    import tensorflow as tf

    check_tfrecord(path, schema)
    try:
        sizes = [len(record) for record in tf_records(path)]
    except tf.errors.OpError as e:
        raise UserError(f"{path}: corrupt TFRecord file ({type(e).__name__})") from None
    check_whole_records(path, sizes)
    return len(sizes)


def tfrecord_dataset(paths, schema: Schema, lengths: Mapping | None = None):
    """A tf.data.Dataset of dicts of int32 tensors over the TFRecord shards ``paths``.

    Every file's first example is checked first; shuffling, repeating and batching are the
    caller's.
    """
    import tensorflow as tf

    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("no TFRecord file given")
    lengths = dict(lengths or {})
    for p in paths:
        lengths = check_tfrecord(p, schema, lengths)
    spec = {n: tf.io.FixedLenFeature([lengths[g]], tf.int64) for n, g in schema.fields}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return {n: tf.cast(v, tf.int32) for n, v in example.items()}  # int64 on disk; the models take int32

    return tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


# --- writing a prepared folder ----------------------------------------------------------------

def check_formats(formats) -> dict[str, tuple[Callable, Callable]]:
    """{format: (writer, counter)} after checking each format's library imports."""
    formats = tuple(formats)
    if not formats:
        raise UserError("formats: give at least one of hdf5, tfrecord")
    io = {}
    for fmt in formats:
        if fmt == "hdf5":
            try:
                import h5py  # noqa: F401
            except ImportError:
                raise UserError("format hdf5 needs h5py (pip install h5py)") from None
            io[fmt] = (write_hdf5, lambda path, schema: read_hdf5(path, schema)[schema.names[0]].shape[0])
        elif fmt == "tfrecord":
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                raise UserError("format tfrecord needs tensorflow; on a PyTorch-only install use format hdf5") from None
            io[fmt] = (write_tfrecord, count_tfrecord)
        else:
            raise UserError(f"format {fmt!r}: unknown; choose from {', '.join(FORMATS)}")
    return io


def atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def previous_files(meta_path: Path, settings: Mapping) -> dict:
    """The complete files a previous run recorded in meta_path, after checking it used these settings."""
    if not meta_path.exists():
        return {}
    try:
        previous = json.loads(meta_path.read_text())
        old_settings, done = previous["settings"], dict(previous["files"])
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"{meta_path}: unreadable; remove it (and the shards) to start over") from None
    for key, value in settings.items():
        if old_settings.get(key) != value:
            raise UserError(f"{meta_path.parent}: holds examples made with {key} = {old_settings.get(key)!r}, "
                            f"not {value!r}; use another output_dir or empty this one")
    return done


@dataclasses.dataclass
class ShardResult:
    name: str
    examples: int
    files: list[Path]
    skipped: bool


def write_shards(output_dir: Path, splits: Mapping[str, Mapping[str, np.ndarray]], shard_counts: Mapping[str, int],
                 io: Mapping, schema: Schema, meta: dict, meta_path: Path, log=print,
                 what: str = "examples") -> list[ShardResult]:
    """Each split's arrays as ``<split>-0000K`` shards in every format of ``io``.

    ``meta["files"]`` records each complete file and its count, saved to meta_path around
    every write: a file it records that still holds its count is skipped.
    """
    done = meta["files"]

    def save_meta():
        atomic_write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", meta_path)

    save_meta()
    results, started, made = [], time.perf_counter(), 0
    for split, shards in shard_counts.items():
        total = splits[split][schema.names[0]].shape[0]
        for k, indexes in enumerate(np.array_split(np.arange(total), shards) if shards else []):
            name = f"{split}-{k:05d}"
            arrays = {n: a[indexes] for n, a in splits[split].items()}
            count, files, skipped = len(indexes), [], True
            for fmt, (writer, counter) in io.items():
                f = output_dir / (name + SUFFIX[fmt])
                files.append(f)
                if done.get(f.name) == count and f.exists():
                    try:
                        if counter(f, schema) == count:
                            continue
                    except UserError:
                        pass  # a damaged file: made again below
                done.pop(f.name, None)
                save_meta()
                tmp = f.with_name(f.name + ".tmp")
                writer(arrays, tmp, schema)
                os.replace(tmp, f)
                done[f.name] = count
                save_meta()
                skipped = False
            made += 0 if skipped else count
            results.append(ShardResult(name, count, files, skipped))
            sizes = ", ".join(f"{f.name} {f.stat().st_size / 1e6:.2f} MB" for f in files)
            log(f"{name}: complete ({count:,} examples), skipped" if skipped
                else f"{name}: {count:,} examples -> {sizes}")
    log(f"{sum(r.examples for r in results):,} {what} in {output_dir} "
        f"({made:,} written in {time.perf_counter() - started:.2f} s)")
    return results

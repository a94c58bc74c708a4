"""BERT pretraining examples as TFRecords of tf.train.Example (TensorFlow), written and read.

The feature names, kinds and lengths are those of Google's create_pretraining_data and
run_pretraining (``FEATURES``): int64 lists of max_seq_length (input_ids, input_mask,
segment_ids) and of max_predictions_per_seq (masked_lm_positions, masked_lm_ids), a float
list (masked_lm_weights) and one int64 (next_sentence_labels, 1 = random next).
"""


import numpy as np
import tensorflow as tf
from tensorflow.python.util import deprecation

from common.data.text.pretraining import FEATURES
from common.data.text.shards import check_whole_records
from common.errors import UserError


def write_tfrecord(arrays: dict[str, np.ndarray], path) -> None:
    n = arrays["input_ids"].shape[0]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for k in range(n):
            feature = {}
            for name, (dtype, _) in FEATURES.items():
                values = arrays[name][k]
                if dtype == "float32":
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
                else:
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True))


def _records(path):
    """The file's serialized records, by a plain Python reader rather than tf.data, so that it
    also works while a TF1 graph is being built (an Estimator's input_fn)."""
    with deprecation.silence():  # tf_record_iterator's notice that tf.data is the eager way
        yield from tf.compat.v1.io.tf_record_iterator(str(path))


def _first_example(path) -> tf.train.Example:
    try:
        for record in _records(path):
            return tf.train.Example.FromString(record)
    except Exception as e:  # tf.errors.DataLossError for a bad record, protobuf's DecodeError for a bad Example
        raise UserError(f"{path}: not a TFRecord file of tf.train.Example ({type(e).__name__})") from None
    raise UserError(f"{path}: empty TFRecord file (no example in it)")


def check_tfrecord_schema(path, max_seq_length=None, max_predictions_per_seq=None) -> tuple[int, int]:
    """(max_seq_length, max_predictions_per_seq) from a file's first example, or UserError naming the field."""
    feature = _first_example(path).features.feature
    lengths = {}
    for name, (dtype, unit) in FEATURES.items():
        if name not in feature:
            raise UserError(f"{path}: not a BERT pretraining file: feature {name!r} is missing "
                            f"(expected {', '.join(FEATURES)})")
        kind = feature[name].WhichOneof("kind")
        want = "float_list" if dtype == "float32" else "int64_list"
        if kind != want:
            raise UserError(f"{path}: feature {name!r} is a {kind}; expected a {want}")
        length = len(getattr(feature[name], kind).value)
        if lengths.setdefault(unit, length) != length:
            raise UserError(f"{path}: feature {name!r} has {length} values; expected {lengths[unit]}")
    given = {"seq": max_seq_length, "pred": max_predictions_per_seq, 1: 1}
    for unit, length in lengths.items():
        if given[unit] is not None and given[unit] != length:
            name = next(n for n, (_, u) in FEATURES.items() if u == unit)
            raise UserError(f"{path}: feature {name!r} has {length} values; expected {given[unit]}")
    return lengths["seq"], lengths["pred"]


def count_tfrecord(path) -> int:
    try:
        sizes = [len(record) for record in _records(path)]
    except tf.errors.OpError as e:
        raise UserError(f"{path}: corrupt TFRecord file ({type(e).__name__})") from None
    check_whole_records(path, sizes)
    return len(sizes)


def pretraining_dataset(paths, max_seq_length=None, max_predictions_per_seq=None) -> tf.data.Dataset:
    """A tf.data.Dataset of dicts of int32/float32 tensors over the TFRecord files ``paths``.

    Every file's first example is checked against the schema first, so a wrong file stops
    with one line naming it and the field, before training starts. Shuffling, repeating
    and batching are left to the caller.
    """
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("no TFRecord file given")
    for p in paths:
        max_seq_length, max_predictions_per_seq = check_tfrecord_schema(p, max_seq_length, max_predictions_per_seq)
    lengths = {"seq": max_seq_length, "pred": max_predictions_per_seq, 1: 1}
    spec = {
        name: tf.io.FixedLenFeature([lengths[unit]], tf.float32 if dtype == "float32" else tf.int64)
        for name, (dtype, unit) in FEATURES.items()
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        # int64 is what tf.train.Example stores; the models take int32 (as Google's input_fn)
        return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}

    return tf.data.TFRecordDataset(paths).map(parse, num_parallel_calls=tf.data.AUTOTUNE)

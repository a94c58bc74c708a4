"""Never a traceback from capture (TensorFlow): a catalog of constructs the device cannot run.

Each case is a line a user may write in a model_fn: control flow on a tensor's value, a
data-dependent output size, sparse, ragged, string or complex tensors, Python functions,
ops the device lacks. The graph is built as the TF runner builds it (a tf.compat.v1.Graph,
Keras layers, ``minimize``), captured with ``device.capture.tf.capture`` and validated
with ``validate_graph`` (common/tf/device_run.py), and must be refused cleanly: a
``UserError``, or a failed validation, whose text names the op and points at the case's
own line in this file.
"""

from __future__ import annotations

import pathlib

import pytest

tf = pytest.importorskip("tensorflow")

from device.api import validate_graph  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from zoo_base.errors import UserError  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line(tag: str) -> int:
    """The line of this file that ends with ``# <tag>``."""
    return next(i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{tag}>"))


# Each case: (x (2, 8) float32, img (2, 6, 6, 4) float32, ids (2, 8) int32) -> a tensor the loss adds up.

def tf_cond(x, img, ids):
    return tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2, lambda: x - 1)  # <tf_cond>


def while_loop_data_dependent(x, img, ids):
    _, total = tf.while_loop(lambda i, t: i < tf.reduce_max(ids), lambda i, t: (i + 1, t + 1.0),  # <while_loop_data_dependent>
                             (tf.constant(0), x))
    return total


def where_one_argument(x, img, ids):
    return tf.cast(tf.where(x > 0), tf.float32)  # <where_one_argument>


def boolean_mask(x, img, ids):
    return tf.boolean_mask(x, x > 0)  # <boolean_mask>


def unique(x, img, ids):
    return tf.cast(tf.unique(tf.reshape(ids, [-1])).y, tf.float32)  # <unique>


def top_k(x, img, ids):
    return tf.math.top_k(x, 3).values  # <top_k>


def sort(x, img, ids):
    return tf.sort(x, axis=1)  # <sort>


def argsort(x, img, ids):
    return tf.cast(tf.argsort(x, axis=1), tf.float32)  # <argsort>


def cumprod(x, img, ids):
    return tf.math.cumprod(x, axis=1)  # <cumprod>


def conv3d(x, img, ids):
    return layers.Conv3D(2, 1)(tf.expand_dims(img, 1))  # <conv3d>


def bitwise_and_on_ints(x, img, ids):
    return tf.cast(tf.bitwise.bitwise_and(ids, 3), tf.float32)  # <bitwise_and_on_ints>


def sparse_tensor(x, img, ids):
    return tf.sparse.reduce_sum(tf.sparse.from_dense(x), axis=1)  # <sparse_tensor>


def ragged_tensor(x, img, ids):
    return tf.RaggedTensor.from_tensor(x, padding=0.0).to_tensor()  # <ragged_tensor>


def string_ops(x, img, ids):
    return tf.cast(tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 10), tf.float32)  # <string_ops>


def complex_dtype(x, img, ids):
    return tf.math.real(tf.complex(x, x) * tf.complex(x, -x))  # <complex_dtype>


def fft(x, img, ids):
    return tf.abs(tf.signal.rfft(x))  # <fft>


def py_function(x, img, ids):
    return tf.py_function(lambda a: a * 2, [x], tf.float32)  # <py_function>


def numpy_function(x, img, ids):
    return tf.numpy_function(lambda a: a * 2, [x], tf.float32)  # <numpy_function>


def segment_sum(x, img, ids):
    return tf.math.segment_sum(x[0], tf.sort(ids[0]))  # <segment_sum>


def bincount(x, img, ids):
    return tf.cast(tf.math.bincount(ids), tf.float32)  # <bincount>


def matrix_inverse(x, img, ids):
    return tf.linalg.inv(tf.reshape(x, [2, 2, 2, 2]) + 3.0 * tf.eye(2))  # <matrix_inverse>


def scatter_nd(x, img, ids):
    return tf.tensor_scatter_nd_update(x, [[0, 1]], [5.0])  # <scatter_nd>


def int64_product(x, img, ids):
    return tf.cast(tf.reduce_prod(tf.cast(ids, tf.int64) + 1, axis=1), tf.float32)  # <int64_product>


def float64(x, img, ids):
    return tf.cast(x, tf.float64) * 2.0  # <float64>


def categorical_sample(x, img, ids):
    return tf.cast(tf.random.categorical(x, 2), tf.float32)  # <categorical_sample>


# case -> names of which at least one must appear in the refusal (the call as the user wrote it, or its TF op)
CASES = {
    tf_cond: ("tf.cond",),
    while_loop_data_dependent: ("tf.while_loop",),
    where_one_argument: ("tf.where",),
    boolean_mask: ("tf.boolean_mask", "Where"),
    unique: ("tf.unique",),
    top_k: ("top_k", "TopKV2"),
    sort: ("tf.sort", "TopKV2"),
    argsort: ("tf.argsort", "TopKV2"),
    cumprod: ("tf.math.cumprod",),
    conv3d: ("Conv3D",),
    bitwise_and_on_ints: ("tf.bitwise.bitwise_and",),
    sparse_tensor: ("tf.sparse", "Sparse"),
    ragged_tensor: ("Ragged",),
    string_ops: ("tf.strings",),
    complex_dtype: ("complex",),
    fft: ("tf.signal.rfft",),
    py_function: ("tf.py_function",),
    numpy_function: ("tf.numpy_function",),
    segment_sum: ("tf.math.segment_sum",),
    bincount: ("tf.math.bincount", "Bincount"),
    matrix_inverse: ("tf.linalg.inv",),
    scatter_nd: ("tf.tensor_scatter_nd_update",),
    int64_product: ("tf.reduce_prod",),
    float64: ("float64",),
    categorical_sample: ("tf.random.categorical", "Multinomial"),
}


def refusal(case) -> str:
    """The runner's path: a TRAIN graph, capture, validate; the text of the refusal."""
    tf.keras.backend.clear_session()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, (2, 8), name="x")
        img = v1.placeholder(tf.float32, (2, 6, 6, 4), name="img")
        ids = v1.placeholder(tf.int32, (2, 8), name="ids")
        out = case(x, img, ids)
        loss = tf.reduce_mean(layers.Dense(1)(x)) + tf.reduce_mean(tf.cast(out, tf.float32))
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, v1.train.get_or_create_global_step())
        try:
            ir = capture_tf.capture(graph, inputs=[x, img, ids], loss=loss, train_op=train_op)
        except UserError as e:
            return str(e)
    report = validate_graph(ir, mode="train", profile_name="tiny")
    assert not report.ok, f"{case.__name__} was not refused: {report.to_text()}"
    return report.to_text()


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c.__name__)
def test_each_construct_is_refused_with_its_op_and_line(case):
    text = refusal(case)
    assert f"{__file__}:{_line(case.__name__)}:" in text, text
    assert any(name in text for name in CASES[case]), text


def test_the_catalog_has_at_least_twenty_constructs():
    assert len(CASES) >= 20

"""While loops in TF1 graphs (device/capture/tf/loops.py): a static-length loop is unrolled and
gives TensorFlow's loss and gradients; a loop whose length depends on the data is refused
at the user's line.

The Keras recurrent layers each run their cell in a tf.while_loop over TensorLists; each
case below is one of their forms (reversed, bidirectional, masked, the GRU without
reset_after, SimpleRNN), and a tf.while_loop written by hand.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from device.api import validate_graph  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers
VOCAB, SEQ, BATCH, HIDDEN = 11, 5, 3, 6

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line(tag: str) -> int:
    return next(i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{tag}>"))


def static_while_loop(x):
    """Four steps of h = tanh(h W + 1), written with tf.while_loop: the counter stops at a constant."""
    w = v1.get_variable("w", [x.shape[-1], x.shape[-1]], initializer=v1.glorot_uniform_initializer())
    _, h = tf.while_loop(lambda i, h: i < 4, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w) + 1.0)),
                         (tf.constant(0), x[:, 0]))
    return h


CASES = {
    "lstm-go-backwards": lambda x: layers.LSTM(HIDDEN, go_backwards=True)(x),
    "gru-bidirectional": lambda x: layers.Bidirectional(layers.GRU(HIDDEN, return_sequences=True))(x)[:, -1],
    "gru-reset-before": lambda x: layers.GRU(HIDDEN, reset_after=False)(x),
    "simple-rnn-2-layers": lambda x: layers.SimpleRNN(HIDDEN)(layers.SimpleRNN(HIDDEN, return_sequences=True)(x)),
    "lstm-masked-padding": "mask_zero",
    "tf-while-loop": static_while_loop,
}


def _graph(case):
    """A TRAIN graph of the case; the session, inputs, loss, gradients by variable name, train_op."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        ids = v1.placeholder(tf.int32, (BATCH, SEQ), name="ids")
        labels = v1.placeholder(tf.int32, (BATCH,), name="labels")
        if case == "mask_zero":  # padding id 0 masked: Keras keeps the state where the mask is off
            out = layers.LSTM(HIDDEN)(layers.Embedding(VOCAB, 4, mask_zero=True)(ids))
        else:
            out = case(layers.Embedding(VOCAB, 4)(ids))
        logits = layers.Dense(3)(out)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        variables = v1.trainable_variables()
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(loss, variables)]
        train_op = v1.train.AdamOptimizer(1e-3).minimize(loss, v1.train.get_or_create_global_step())
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    return session, [ids, labels], loss, dict(zip([v.name.split(":")[0] for v in variables], grads)), train_op


def _batch():
    rng = np.random.default_rng(3)
    ids = rng.integers(1, VOCAB, (BATCH, SEQ)).astype(np.int32)
    ids[0, 3:] = 0  # padding at the end of one sequence
    return [ids, np.array([0, 2, 1], np.int32)]


@pytest.mark.parametrize("case", list(CASES))
def test_static_loop_is_unrolled_with_the_frameworks_loss_and_gradients(case):
    session, inputs, loss, grads, train_op = _graph(CASES[case])
    try:
        ir = capture_tf.capture(session.graph, inputs=inputs, loss=loss, train_op=train_op)
        batch = _batch()
        expected_loss, expected_grads = session.run([loss, grads], dict(zip(inputs, batch)))
        weights = capture_tf.read_weights(session, ir)
    finally:
        session.close()
    report = validate_graph(ir, mode="train", profile_name="small")
    assert report.ok, report.to_text()
    assert all(not n.op[0].isupper() for n in ir.nodes), "no TF op left: While and the TensorList ops unrolled"
    got_loss, got_grads = Program(ir, weights).gradients(batch)
    np.testing.assert_allclose(got_loss, expected_loss, rtol=1e-5)
    assert set(got_grads) == set(expected_grads)
    for name, grad in got_grads.items():
        np.testing.assert_allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_unrolled_loop_keeps_only_what_the_loss_reads():
    """The counters, and the lists tf.gradients makes the loop keep for its own backward, leave
    no node and no constant behind."""
    session, inputs, loss, _, train_op = _graph(CASES["simple-rnn-2-layers"])
    try:
        ir = capture_tf.capture(session.graph, inputs=inputs, loss=loss, train_op=train_op)
    finally:
        session.close()
    read = {v for n in ir.nodes for v in n.inputs} | {ir.loss}
    assert [n.name for n in ir.nodes if not read & set(n.outputs)] == []
    assert [name for name in ir.constants if name not in read] == []


def dynamic_loop(x):
    steps = tf.reduce_max(tf.cast(x[:, :, 0] > 0, tf.int32) * tf.range(SEQ))  # a count read from the data
    step = lambda i, h: (i + 1, tf.tanh(h))  # noqa: E731
    _, h = tf.while_loop(lambda i, h: i < steps, step, (tf.constant(0), x[:, 0]))  # <dynamic>
    return h


def test_a_loop_whose_length_depends_on_the_data_is_refused_at_its_line():
    session, inputs, loss, _, train_op = _graph(dynamic_loop)
    try:
        ir = capture_tf.capture(session.graph, inputs=inputs, loss=loss, train_op=train_op)
    finally:
        session.close()
    report = validate_graph(ir, mode="train", profile_name="small")
    assert not report.ok
    (finding,) = [f for f in report.errors if "While" in f.framework_op]
    assert (finding.file, finding.line) == (__file__, _line("dynamic"))
    assert "condition depends on the data" in finding.message, finding.message

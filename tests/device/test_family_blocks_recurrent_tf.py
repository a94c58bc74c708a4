"""The recurrent family block in TensorFlow, end to end (the same in PyTorch:
test_family_blocks_recurrent_torch.py): a 2-layer Keras LSTM classifier, Embedding -> LSTM
(return_sequences) -> LSTM (last step) -> Dense -> sparse softmax cross entropy, and its GRU
variant, in a TF1 graph as the Estimator runner builds it. Each Keras layer is a while loop
over TensorLists, unrolled by the capture (device/capture/tf/loops.py).

Each validates, compiles, gives TensorFlow's gradients on the first batch, and trains on the
emulator for 5 Adam steps with the framework's loss at every step: within 1e-4 relative in
float32, within 2e-2 in bfloat16 and float16 (against the framework's float32 run).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.device.language_blocks import LR, MIXED, VOCAB, check, with_precision
from tests.device.recurrent_blocks import CLASSES, EMBED, HIDDEN, classifier_batches

tf = pytest.importorskip("tensorflow")
from device.api import compile_graph, validate_graph  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers


def tf_classifier(kind: str, ids, labels):
    """Embedding -> 2 recurrent layers -> the last step -> Dense; the mean cross entropy."""
    x = layers.Embedding(VOCAB, EMBED)(ids)  # (B, T, E)
    x = getattr(layers, kind)(HIDDEN, return_sequences=True)(x)  # (B, T, H)
    last = getattr(layers, kind)(HIDDEN)(x)  # (B, H)
    logits = layers.Dense(CLASSES)(last)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_classifier_validates_compiles_and_trains_with_tf_loss(kind, tmp_path):
    batches = [[ids.astype(np.int32), labels.astype(np.int32)] for ids, labels in classifier_batches()]
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        inputs = [v1.placeholder(tf.int32, a.shape, name=f"input_{i}") for i, a in enumerate(batches[0])]
        loss = tf_classifier(kind, *inputs)
        variables = v1.trainable_variables()
        gradients = [tf.convert_to_tensor(g) for g in tf.gradients(loss, variables)]  # the embedding's: dense
        train_op = v1.train.AdamOptimizer(LR).minimize(loss, v1.train.get_or_create_global_step())
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    try:
        session.run(init)
        ir = capture_tf.capture(graph, inputs=inputs, loss=loss, train_op=train_op)
        report = validate_graph(ir, mode="train", profile_name="small")
        assert report.ok, report.to_text()
        assert not {n.op for n in ir.nodes} & {"While", "TensorListStack", "TensorListFromTensor"}  # unrolled
        result = compile_graph(ir, mode="train", profile_name="small", out_dir=tmp_path / "compile")
        kinds = {k.kind for k in result.kernels}
        assert "dense" in kinds and "unsupported" not in kinds, kinds
        initial = capture_tf.read_weights(session, ir)
        feed = dict(zip(inputs, batches[0]))
        expected_grads = dict(zip([v.name.split(":")[0] for v in variables], session.run(gradients, feed)))
        programs = {precision: Program(with_precision(ir, precision), initial, seed=0)
                    for precision in ("float32", *MIXED)}
        expected = [session.run([loss, train_op], dict(zip(inputs, batch)))[0] for batch in batches]
    finally:
        session.close()

    # the gradients of the first step, every weight
    _, grads = Program(ir, initial).gradients(batches[0])
    assert set(grads) == set(expected_grads)
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)

    for precision, program in programs.items():
        losses = [program.train_step(batch, LR) for batch in batches]
        check(losses, expected, precision)

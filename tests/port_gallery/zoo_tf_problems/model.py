"""An MLP on tabular features, in float64 as the original notebook had it."""
import tensorflow as tf

from common.tf.estimator import EstimatorSpec, ModeKeys


def model_fn(features, labels, mode, params):
    p = params["model"]
    x = tf.cast(features, tf.float64)
    for units in p["hidden_units"]:
        x = tf.keras.layers.Dense(units, activation="relu", dtype="float64")(x)
    logits = tf.keras.layers.Dense(p["num_classes"], dtype="float64")(x)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    tf.compat.v1.summary.scalar("loss", loss)
    if mode == ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.AdamOptimizer(params["optimizer"]["learning_rate"])
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        return EstimatorSpec(mode, loss=loss, train_op=train_op)
    accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))
    return EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

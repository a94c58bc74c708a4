"""The modes a model_fn and an input_fn receive, with tf.estimator's values.

Existing model_fns compare ``mode`` against these strings (``mode == "infer"``), so the
values are tf.estimator's own, not the command line's ``predict``.
"""


class ModeKeys:
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)

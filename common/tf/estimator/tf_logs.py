"""TensorFlow's own Python log lines, kept down while the runner builds and restores graphs."""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf


@contextlib.contextmanager
def quiet_tf_logs():
    """TensorFlow's Python logger at ERROR: its deprecation notes about the v1 API this runner
    uses on purpose, and its "Restoring parameters" lines, are not the user's concern."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_logger.setLevel(level)

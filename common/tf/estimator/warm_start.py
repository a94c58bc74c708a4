"""``WarmStartSettings``: tf.estimator's warm start, as the vendor's fine-tuning run.py files ask for it.

``CerebrasEstimator(..., warm_start_from=WarmStartSettings(ckpt, vars_to_warm_start))`` starts a
training whose model_dir holds no checkpoint from the trainable variables of ``ckpt`` that
``vars_to_warm_start`` selects, at step 0; every other variable (a fine-tuning head, the
optimizer's slots) is initialised afresh, and the input starts from its beginning. A model_dir
that holds a checkpoint resumes from it instead, as tf.estimator does. (A plain path as
``warm_start_from`` is this zoo's --checkpoint_path: everything the checkpoint holds.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmStartSettings:
    """tf.estimator.WarmStartSettings' two fields the vendor's zoo sets.

    ``vars_to_warm_start``: a regular expression, or a list of them, matched (``re.match``) against
    each trainable variable's name; None or ".*": every trainable variable."""

    ckpt_to_initialize_from: str
    vars_to_warm_start: str | list[str] | tuple[str, ...] | None = ".*"

    def selects(self, name: str) -> bool:
        patterns = self.vars_to_warm_start
        if patterns is None:
            return True
        if isinstance(patterns, str):
            patterns = [patterns]
        return any(re.match(p, name) for p in patterns)

"""The TF runner's loops call the step backend of --device; --validate_only matches kernels
as the PyTorch runner's does (one set of stages for both)."""

import re

from common.tf.estimator import CerebrasEstimator, RunConfig
from common.tf.estimator.cs_estimator import SessionSteps


def test_device_picks_the_step_backend(tmp_path):
    from common.tf.device_run import EmulatorSteps

    def model_fn(features, labels, mode, params):
        raise AssertionError("not built: picking a backend builds nothing")

    for device, backend in (("cpu", SessionSteps), ("gpu", SessionSteps), ("emulator", EmulatorSteps)):
        estimator = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path), device=device))
        picked = estimator.step_backend()
        assert type(picked) is backend
        assert picked.mixed_policy == (device != "emulator")  # the device rounds to 16 bits itself


def test_validate_only_matches_kernels(tf_mnist, tiny_args, tmp_path, capsys):
    report = tf_mnist.main(tiny_args("--validate_only"))
    assert report.ok
    matched = re.search(r"validation passed.*; (\d+) kernels matched", capsys.readouterr().err)
    assert matched and int(matched.group(1)) > 0
    assert not (tmp_path / "model").exists()

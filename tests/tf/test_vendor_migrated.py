"""A TF folder as the vendor's zoo holds it (tests/fixtures/vendor_zoo/fc_tiny/tf) runs after one
``zoo port migrate``, through its own ``run.py``: its argparse, ``run_utils``, ``CSRunConfig``,
``CerebrasEstimator(...).compile/train/evaluate``, ``cs_enable_summaries``,
``CSEstimatorSpec(host_call=...)`` and ``train_and_evaluate(TrainSpec, EvalSpec)``.

Its model_fn sets a Keras ``mixed_float16`` policy and floatx float16 itself, as the vendor's
fc_mnist does: the CPU and the emulator both compute in float16 and say so.
"""

import logging
import os

import pytest
import yaml

from common.errors import UserError
from common.tf.estimator import CerebrasEstimator, ModeKeys
from common.tf.estimator.utils import cs_disable_summaries, cs_enable_summaries
from common.folder import load_run_module
from common.port.migrate import migrate
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "fixtures", "vendor_zoo", "fc_tiny", "tf")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dest = tmp_path_factory.mktemp("migrated") / "fc_tiny"
    migrate(SRC, str(dest))
    return dest, load_run_module(str(dest))


def _losses(model_dir):
    return dict(read_scalars(os.path.join(model_dir, "train"))["loss"])


def test_trains_evaluates_validates_compiles_and_trains_on_the_emulator_in_float16(folder, tmp_path, caplog):
    _, run = folder
    cpu, emulator = tmp_path / "cpu", tmp_path / "emulator"
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.main(["-m", "train", "-o", str(cpu), "--cs_ip", "10.0.0.1"])
    assert "(float16 compute) from step 0 to 50" in caplog.text
    assert caplog.text.count("10.0.0.1") == 1 and "cs_ip 10.0.0.1 is ignored" in caplog.text
    saved = yaml.safe_load((cpu / "params.yaml").read_text())
    assert saved["runconfig"]["device"] == "cpu" and saved["runconfig"]["model_dir"] == str(cpu)

    metrics = run.main(["-m", "eval", "-o", str(cpu)])
    assert metrics["global_step"] == 50 and metrics["accuracy"] > 0.3
    assert read_scalars(os.path.join(cpu, "eval"))["accuracy"] == [(50, pytest.approx(metrics["accuracy"]))]

    report = run.main(["-m", "train", "--validate_only", "-o", str(tmp_path / "v")])
    assert report.ok and "compute precision is float32" not in report.to_text()
    run.main(["-m", "train", "--compile_only", "-o", str(tmp_path / "c")])
    assert "float16" in (tmp_path / "c" / "compile" / "report.txt").read_text()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.main(["-m", "train", "--device", "emulator", "-o", str(emulator)])
    assert "on the emulator (wse2, float16 compute)" in caplog.text
    on_cpu, on_emulator = _losses(cpu), _losses(emulator)
    assert sorted(on_emulator) == [10, 20, 30, 40, 50]
    assert on_cpu[50] < 0.9 * on_cpu[10]
    assert on_emulator[50] == pytest.approx(on_cpu[50], rel=0.01)


def test_train_and_evaluate_through_the_specs(folder, tmp_path):
    _, run = folder
    metrics = run.main(["-m", "train_and_eval", "-o", str(tmp_path / "te"), "--max_steps", "20",
                        "--eval_steps", "2"])
    assert metrics["global_step"] == 20 and 0.0 <= metrics["accuracy"] <= 1.0


def test_params_and_the_model_policy_disagreeing_is_an_error(folder, tmp_path):
    dest, run = folder
    params = yaml.safe_load(open(dest / "configs" / "params.yaml"))
    params["mixed_precision"] = {"enabled": True, "dtype": "bfloat16"}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(UserError, match="model_fn sets a Keras float16 policy, params ask for "
                                        "mixed_precision.dtype bfloat16"):
        run.main(["-m", "train", "-p", str(path), "-o", str(tmp_path / "md"), "--max_steps", "1"])


def test_the_summary_switches(folder):
    _, run = folder
    params = yaml.safe_load(open(folder[0] / "configs" / "params.yaml"))
    estimator = CerebrasEstimator(run.model_fn, params=params)
    with cs_enable_summaries():
        assert estimator.build(run.train_input_fn, ModeKeys.TRAIN).summary is not None  # the model_fn's loss
    with cs_disable_summaries():
        assert estimator.build(run.train_input_fn, ModeKeys.TRAIN).summary is None

"""tf/mnist on the device: --validate_only, --compile_only, and --device emulator against the CPU runner."""

import json
import os

import numpy as np
import pytest

from common.summaries import read_scalars

pytest.importorskip("device.api")


def _losses(model_dir):
    return [value for _, value in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def test_validate_only_passes_and_writes_nothing(tf_mnist, tiny_args, tmp_path, capsys):
    report = tf_mnist.main(tiny_args("--validate_only"))
    assert report.ok
    assert "validation passed" in capsys.readouterr().err
    assert not (tmp_path / "model").exists()


def test_validate_only_reports_a_dynamic_batch(tf_mnist, tiny_args, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(tiny_args("--validate_only", "train_input.drop_last=false"))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "error: validation failed" in err and "drop_remainder" in err
    assert not (tmp_path / "model").exists()


def test_compile_only_writes_the_report(tf_mnist, tiny_args, tmp_path, capsys):
    tf_mnist.main(tiny_args("--compile_only", "mixed_precision.enabled=true"))
    out, err = capsys.readouterr()
    assert "Estimated overall performance" in out and "samples/s" in out
    folder = tmp_path / "model" / "compile"
    assert sorted(os.listdir(folder)) == ["ir.json", "placement.svg", "report.json", "report.txt"]
    assert f"compile report: {folder} (report.txt, report.json, ir.json, placement.svg)" in err
    report = json.loads((folder / "report.json").read_text())
    assert report["frontend"] == "tf" and report["precision"] == "bfloat16" and report["mode"] == "train"
    # 784*32+32 + 32*16+16 + 16*10+10 parameters of the tiny MLP
    assert report["num_params"] == 25818


def test_too_large_for_pipelined_names_the_kernel_and_suggests_weight_streaming(tf_mnist, tiny_args, tmp_path,
                                                                                 capsys):
    big = ("--compile_only", "model.hidden_sizes=[4096, 4096]", "device.profile=tiny")
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(tiny_args(*big))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "the largest kernel 'dense_1'" in err and "bytes" in err and "device.execution_mode=weight_streaming" in err
    assert not (tmp_path / "model").exists()
    tf_mnist.main(tiny_args(*big, "device.execution_mode=weight_streaming"))
    folder = tmp_path / "model" / "compile"
    assert sorted(os.listdir(folder)) == ["ir.json", "placement.svg", "report.json", "report.txt", "systems.svg"]
    assert f"compile report: {folder} (report.txt, report.json, ir.json, placement.svg, systems.svg)" in (
        capsys.readouterr().err)


def test_train_and_eval_on_the_device_is_the_validators_error(tf_mnist, tiny_args, capsys):
    with pytest.raises(SystemExit):
        tf_mnist.main(tiny_args("--mode", "train_and_eval", "--device", "emulator"))
    assert "train_and_eval is not allowed on the device" in capsys.readouterr().err


def test_fp32_losses_match_the_cpu_for_50_steps(tf_mnist, tiny_args, tmp_path):
    """Same initial weights (same seed), same batches (same pipeline), dropout off: the
    emulator's loss at each of 50 steps is the CPU runner's within 1e-4 relative."""
    same = ("runconfig.max_steps=50", "runconfig.log_steps=1", "runconfig.checkpoint_steps=50", "model.dropout=0.0",
            "optimizer.learning_rate=0.003")
    tf_mnist.main(tiny_args(*same, model_dir=tmp_path / "cpu"))
    tf_mnist.main(tiny_args(*same, "--device", "emulator", model_dir=tmp_path / "emulator"))
    cpu, emulator = _losses(tmp_path / "cpu"), _losses(tmp_path / "emulator")
    assert len(cpu) == len(emulator) == 50
    assert cpu[-1] < 0.5 * cpu[0]  # it learns, so the comparison spans real updates
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)


def test_mixed_precision_losses_match_the_cpu(tf_mnist, tiny_args, tmp_path):
    """bfloat16 compute: Keras' mixed_bfloat16 policy on the CPU, the device's rounding on
    the emulator; the losses agree within 2e-2 relative, and both differ from fp32 training."""
    fp32 = ("runconfig.max_steps=20", "runconfig.log_steps=1", "runconfig.checkpoint_steps=20", "model.dropout=0.0",
            "optimizer.learning_rate=0.001")
    same = (*fp32, "mixed_precision.enabled=true", "mixed_precision.dtype=bfloat16")
    tf_mnist.main(tiny_args(*same, model_dir=tmp_path / "cpu"))
    tf_mnist.main(tiny_args(*same, "--device", "emulator", model_dir=tmp_path / "emulator"))
    np.testing.assert_allclose(_losses(tmp_path / "emulator"), _losses(tmp_path / "cpu"), rtol=2e-2)
    tf_mnist.main(tiny_args(*fp32, model_dir=tmp_path / "cpu32"))
    tf_mnist.main(tiny_args(*fp32, "--device", "emulator", model_dir=tmp_path / "emulator32"))
    # fp32 on the two sides agrees within 1e-4 (above); bfloat16 moves each side's losses by
    # 1e-2 to 2e-2 from its fp32 run, and by nothing if mixed precision were off there
    for side in ("cpu", "emulator"):
        sixteen, thirty_two = np.array(_losses(tmp_path / side)), np.array(_losses(tmp_path / f"{side}32"))
        assert np.max(np.abs(sixteen - thirty_two) / thirty_two) > 1e-3, side


def test_emulator_checkpoints_evaluate_and_resume_on_the_cpu(tf_mnist, tiny_args, tmp_path, capsys):
    """A model trained on the emulator evaluates on the CPU as on the emulator, and resumes on
    the CPU from the emulator's step, weights and Adam state (the losses continue those of
    an uninterrupted emulator run)."""
    same = ("runconfig.log_steps=1", "runconfig.checkpoint_steps=3", "model.dropout=0.0")
    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=6", "--device", "emulator", model_dir=tmp_path / "whole"))
    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=3", "--device", "emulator", model_dir=tmp_path / "m"))
    on_emulator = tf_mnist.main(tiny_args("--mode", "eval", "--device", "emulator", model_dir=tmp_path / "m"))
    on_cpu = tf_mnist.main(tiny_args("--mode", "eval", model_dir=tmp_path / "m"))
    assert on_cpu["global_step"] == on_emulator["global_step"] == 3
    assert on_cpu["accuracy"] == pytest.approx(on_emulator["accuracy"])
    assert on_cpu["loss"] == pytest.approx(on_emulator["loss"], rel=1e-5)
    assert "| Eval Device=emulator Step=3 accuracy=" in capsys.readouterr().err

    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=6", model_dir=tmp_path / "m"))  # resume on the CPU
    np.testing.assert_allclose(_losses(tmp_path / "m"), _losses(tmp_path / "whole"), rtol=1e-4)


def test_cpu_checkpoints_evaluate_and_resume_on_the_emulator(tf_mnist, tiny_args, tmp_path):
    same = ("runconfig.log_steps=1", "runconfig.checkpoint_steps=3", "model.dropout=0.0")
    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=6", model_dir=tmp_path / "whole"))
    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=3", model_dir=tmp_path / "m"))
    on_cpu = tf_mnist.main(tiny_args("--mode", "eval", model_dir=tmp_path / "m"))
    on_emulator = tf_mnist.main(tiny_args("--mode", "eval", "--device", "emulator", model_dir=tmp_path / "m"))
    assert on_cpu["accuracy"] == pytest.approx(on_emulator["accuracy"])
    assert on_cpu["loss"] == pytest.approx(on_emulator["loss"], rel=1e-5)

    tf_mnist.main(tiny_args(*same, "runconfig.max_steps=6", "--device", "emulator", model_dir=tmp_path / "m"))
    np.testing.assert_allclose(_losses(tmp_path / "m"), _losses(tmp_path / "whole"), rtol=1e-4)
    assert sorted(read_scalars(str(tmp_path / "m" / "train"))) == sorted(
        read_scalars(str(tmp_path / "whole" / "train")))  # the same TensorBoard tags


def test_predict_on_the_emulator_matches_the_cpu(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args())
    with np.load(tf_mnist.main(tiny_args("--mode", "predict"))) as cpu:
        cpu = dict(cpu)
    with np.load(tf_mnist.main(tiny_args("--mode", "predict", "--device", "emulator"))) as emulator:
        np.testing.assert_array_equal(emulator["classes"], cpu["classes"])
        np.testing.assert_allclose(emulator["probabilities"], cpu["probabilities"], rtol=1e-4, atol=1e-6)

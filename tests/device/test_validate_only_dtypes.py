"""--validate_only on a model whose ops make a dtype the device lacks, through each runner.

complex64 from an FFT, a complex constant, float64: each is the user's op, so each is a
validation finding with its file:line, the op and the dtype; the run exits 2 with no
traceback and writes nothing.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    (line,) = [start + i for i, source in enumerate(lines) if text in source]
    return line


def _validate_only(run, tmp_path, capsys, *run_args) -> list[str]:
    """stderr's lines of a --validate_only run that must fail with exit code 2."""
    params = tmp_path / "params.yaml"
    params.write_text("runconfig:\n  max_steps: 2\n")
    argv = ["--params", str(params), "--model_dir", str(tmp_path / "md"), "--validate_only"]
    with pytest.raises(SystemExit) as exit_info:
        run(*run_args, argv=argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "frontend bug" not in err
    assert "error: validation failed" in err
    assert not (tmp_path / "md").exists()
    return err.splitlines()


def _finding(lines: list[str], line: int, op: str, dtype: str) -> str:
    """The one finding at this file's ``line`` about ``op`` having ``dtype``."""
    where = f"{__file__}:{line}: "
    # "Cast: ..." or, where the user's call has its own name, "Tensor.double [aten._to_copy]: ..."
    (found,) = [text for text in lines if text.startswith(where)
                and (text[len(where):].startswith(f"{op}: ") or f" [{op}]: " in text or f" [{op}." in text)
                and f"has dtype {dtype}, which the device does not support" in text]
    return found


def test_torch_fft_and_float64_are_validation_errors(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from common.pytorch.base_model import PyTorchBaseModel
    from common.pytorch.run import run

    class Spectral(PyTorchBaseModel):
        def __init__(self, params, device):
            super().__init__(params, torch.nn.Linear(5, 3), device)

        def __call__(self, batch):
            features, labels = batch  # (8, 8), (8,)
            magnitude = torch.fft.rfft(features, dim=-1).abs()  # (8, 5) from complex64
            rotated = (features * 1j).real.sum()  # a complex scalar
            precise = features.double().sum().float()  # float64
            return F.cross_entropy(self.model(magnitude), labels) + 0 * (rotated + precise)

    def data(params):
        return DataLoader(TensorDataset(torch.randn(16, 8), torch.arange(16) % 3), batch_size=8, drop_last=True)

    lines = _validate_only(run, tmp_path, capsys, lambda params, device: Spectral(params, device), data, data,
                           lambda: {})
    fft = _finding(lines, _line_of(Spectral.__call__, "rfft"), "aten._fft_r2c", "complex64")
    assert "FFT in the input pipeline" in fft
    _finding(lines, _line_of(Spectral.__call__, "1j"), "aten.mul", "complex64")
    _finding(lines, _line_of(Spectral.__call__, "double"), "aten._to_copy", "float64")


def test_tf_fft_and_float64_are_validation_errors(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow")
    from common.tf.estimator import EstimatorSpec
    from common.tf.optim import build_train_op
    from common.tf.run import run

    def input_fn(params, mode):
        x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)  # (N, 8)
        y = (np.arange(16) % 3).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4, drop_remainder=True)

    def model_fn(features, labels, mode, params):
        magnitude = tf.abs(tf.signal.rfft(features))  # (4, 5) from complex64
        precise = tf.cast(tf.reduce_sum(tf.cast(features, tf.float64)), tf.float32)  # float64
        logits = tf.keras.layers.Dense(3)(magnitude) + 0 * precise
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    defaults = {"optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}}
    lines = _validate_only(run, tmp_path, capsys, model_fn, input_fn, input_fn, lambda: defaults)
    fft = _finding(lines, _line_of(model_fn, "rfft"), "RFFT", "complex64")
    assert "FFT in the input pipeline" in fft
    _finding(lines, _line_of(model_fn, "float64"), "Cast", "float64")

"""The twins compile to the same estimate: pytorch/t5 and tf/t5 are the same math, so the emulator
must cost them alike (benchmarks/twin_estimates.py compares every shared config).

The tolerances: the FLOPs and the weights are the model's and agree to 1 % (the frameworks split
a loss or a mask into slightly different ops); the stash (what the backward reads) to 5 %;
samples/s to 5 %, the placer's rounding of rectangles to whole rows and columns. Before x * x
stashed its input like square(x), T5's RMS norms kept 3 GiB less in PyTorch (t5_base: 5,995
against 3,998 samples/s)."""

import json
import os

import pytest

torch = pytest.importorskip("torch")  # before TensorFlow
tf = pytest.importorskip("tensorflow")

from common import zoo  # noqa: E402
from common.folder import load_run_module  # noqa: E402


def compile_report(framework, model_dir, config):
    folder = os.path.join(zoo.ROOT, framework, "t5")
    load_run_module(folder).main(["--params", os.path.join(folder, "configs", config), "--compile_only",
                                  "--model_dir", str(model_dir)])
    with open(os.path.join(model_dir, "compile", "report.json")) as f:
        return json.load(f)


def total(report, figure):
    return sum(k[figure] for k in report["kernels"])


def test_t5_twins_compile_to_the_same_estimate(tmp_path):
    pt = compile_report("pytorch", tmp_path / "pt", "params_tiny.yaml")
    tf_ = compile_report("tf", tmp_path / "tf", "params_tiny.yaml")
    assert pt["num_params"] == tf_["num_params"]
    assert total(pt, "weight_bytes") == total(tf_, "weight_bytes")
    assert total(pt, "flops_fwd") == pytest.approx(total(tf_, "flops_fwd"), rel=0.01)
    assert total(pt, "stash_bytes") == pytest.approx(total(tf_, "stash_bytes"), rel=0.05)
    assert pt["performance"]["samples_per_s"] == pytest.approx(tf_["performance"]["samples_per_s"], rel=0.05)

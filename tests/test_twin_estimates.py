"""The twins compile to the same estimate: pytorch/X and tf/X are the same math, so the emulator
must cost them alike, for every family's tiny config (benchmarks/twin_estimates.py compares every
shared config; benchmarks/README.md has its table).

The tolerances: the FLOPs and the weights are the model's and agree to 1 % (the frameworks split
a loss or a mask into slightly different ops); the stash (what the backward reads) to 5 %;
samples/s to 5 %, the placer's rounding of rectangles to whole rows and columns (KNOWN_GAPS: what
some twins still part on, each with its cause). Before x * x
stashed its input like square(x), T5's RMS norms kept 3 GiB less in PyTorch (t5_base: 5,995
against 3,998 samples/s)."""

import json
import os

import pytest

torch = pytest.importorskip("torch")  # before TensorFlow
tf = pytest.importorskip("tensorflow")

from common import zoo  # noqa: E402
from common.folder import load_run_module  # noqa: E402


FAMILIES = ("mnist", "resnet", "unet", "bert", "gpt2", "transformer", "t5")
# the figures a family's twins still part on (PyTorch's over TF's), and why; held at that ratio, so
# a change that closes or widens the gap shows here (benchmarks/README.md has the figures)
KNOWN_GAPS = {
    # masks fed as int64 in PyTorch (F.cross_entropy takes int64 class indices), int32 in TF: 12,288
    # against 8,192 bytes a sample, and input transmission bounds the tiny config (12.2 M / 18.3 M)
    "unet": {"samples_per_s": 2 / 3},
    # TF's stride-2 convolutions with SAME padding are a pad, then the convolution: the conv kernel
    # stashes the padded input (18x18 for 16x16, 10x10 for 8x8), 1,754,624 against 1,611,264 bytes
    "resnet": {"stash_bytes": 1_611_264 / 1_754_624},
    # TF's label-smoothed loss takes a second log-softmax over the vocabulary for the uniform term
    # (tf/transformer/model.py, smoothed_loss), PyTorch's F.cross_entropy(label_smoothing=) one: 1.8 %
    # more FLOPs, and the logits stashed for its backward too (26.4 MB against 18.0 MB)
    "transformer": {"flops_fwd": 574_818_817 / 585_306_625, "stash_bytes": 17_973_256 / 26_353_672},
}


def compile_report(framework, family, model_dir, config):
    folder = os.path.join(zoo.ROOT, framework, family)
    load_run_module(folder).main(["--params", os.path.join(folder, "configs", config), "--compile_only",
                                  "--model_dir", str(model_dir)])
    with open(os.path.join(model_dir, "compile", "report.json")) as f:
        return json.load(f)


def total(report, figure):
    return sum(k[figure] for k in report["kernels"])


@pytest.mark.parametrize("family", FAMILIES)
def test_twins_compile_to_the_same_estimate(tmp_path, family):
    pt = compile_report("pytorch", family, tmp_path / "pt", "params_tiny.yaml")
    tf_ = compile_report("tf", family, tmp_path / "tf", "params_tiny.yaml")
    assert pt["num_params"] == tf_["num_params"]
    assert total(pt, "weight_bytes") == total(tf_, "weight_bytes")
    known = KNOWN_GAPS.get(family, {})
    a, b = pt["performance"], tf_["performance"]
    figures = {"flops_fwd": (total(pt, "flops_fwd"), total(tf_, "flops_fwd"), 0.01),
               "stash_bytes": (total(pt, "stash_bytes"), total(tf_, "stash_bytes"), 0.05),
               # the token inputs of bert, gpt2, transformer and t5 are int64 in PyTorch and int32 in TF:
               # twice the bytes a sample, which bound none of their tiny configs
               "compute_samples_per_s": (a["compute_samples_per_s"], b["compute_samples_per_s"], 0.05),
               "samples_per_s": (a["samples_per_s"], b["samples_per_s"], 0.05)}
    for figure, (x, y, rel) in figures.items():
        if figure in known:
            assert x / y == pytest.approx(known[figure], rel=0.01), figure
        else:
            assert x == pytest.approx(y, rel=rel), figure

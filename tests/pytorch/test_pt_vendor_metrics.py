"""The vendor's PyTorch metric classes (common/pytorch/metrics.py).

Each class is checked against an independent computation (scikit-learn, or torch's own
cross entropy for perplexity) over several batches of unequal size, with weights. Integer
weights are checked as repeats: a prediction of weight 3 counts as three predictions, so
the reference is the unweighted score of the repeated arrays. Then the runner: a small MLP
on the embedded digits, written as a vendor model (metrics built in ``__init__``, called in
``__call__`` when not training, ``__call__`` returning the loss alone), evaluated on the
CPU and on the emulator from one checkpoint.
"""

import functools
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, f1_score, fbeta_score, jaccard_score
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common.data import MNIST_MEAN, MNIST_STD, embedded_digits, load_mnist_arrays
from common.errors import UserError
from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.device_run import capture_step
from common.pytorch.metrics import (Accuracy, AccuracyMetric, CapturedMetricCalls, CBMetric, DiceCoefficientMetric,
                                    FBetaScoreMetric, MeanIOUMetric, Metric, PerplexityMetric, cb_metrics_of,
                                    recording_metric_calls, set_summed_state, summed_state)
from common.pytorch.run import run
from common.summaries import read_scalars
from device.api import validate_graph

RNG_SEED = 0


def batches(num_classes, sizes=(7, 30, 1, 50), seed=RNG_SEED, shape_extra=()):
    """(labels, predictions, integer weights 0..3) per batch, as tensors of shape (size, *shape_extra)."""
    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        shape = (size, *shape_extra)
        labels = rng.integers(0, num_classes, shape)
        # right about half the time, so that every score is far from 0 and 1
        predictions = np.where(rng.random(shape) < 0.5, labels, rng.integers(0, num_classes, shape))
        weights = rng.integers(0, 4, shape)
        out.append(tuple(torch.from_numpy(a) for a in (labels, predictions, weights)))
    return out


def concatenated(parts, repeat_by_weights):
    labels = np.concatenate([p[0].numpy().reshape(-1) for p in parts])
    predictions = np.concatenate([p[1].numpy().reshape(-1) for p in parts])
    if not repeat_by_weights:
        return labels, predictions
    weights = np.concatenate([p[2].numpy().reshape(-1) for p in parts])
    return np.repeat(labels, weights), np.repeat(predictions, weights)


# --- each metric against an independent computation -----------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
def test_accuracy_is_correct_over_counted_not_a_mean_of_batch_means(weighted):
    parts = batches(num_classes=5, shape_extra=(3,))
    metric = AccuracyMetric(name="eval/accuracy")
    for labels, predictions, weights in parts:
        metric(labels=labels.clone(), predictions=predictions.int(), weights=weights.float() if weighted else None)
    expected = accuracy_score(*concatenated(parts, repeat_by_weights=weighted))
    assert metric.compute() == pytest.approx(expected, rel=1e-12)
    assert metric.num_updates == 4
    batch_means = np.mean([np.mean((l == p).numpy()) for l, p, _ in parts])
    assert abs(batch_means - expected) > 0.01  # the batches differ enough to tell the two apart


def test_accuracy_with_fractional_weights_matches_sklearn_sample_weight():
    rng = np.random.default_rng(1)
    labels, predictions = rng.integers(0, 3, 40), rng.integers(0, 3, 40)
    weights = rng.random(40)
    metric = AccuracyMetric()
    metric(labels=torch.from_numpy(labels[:25]), predictions=torch.from_numpy(predictions[:25]),
           weights=torch.from_numpy(weights[:25]))
    metric(torch.from_numpy(labels[25:]), torch.from_numpy(predictions[25:]), torch.from_numpy(weights[25:]))
    assert metric.compute() == pytest.approx(accuracy_score(labels, predictions, sample_weight=weights), rel=1e-12)
    assert metric.name == "AccuracyMetric"  # the class name when none is given, as the vendor's



def test_the_zoos_accuracy_counts_examples_by_their_labels():
    """common/pytorch/metrics.py's own Accuracy, fed numpy outputs and the batch."""
    logits = np.array([[[0.9, 0.1], [0.2, 0.8]], [[0.6, 0.4], [0.3, 0.7]]])  # (B=2, T=2, classes=2): argmax 0 1, 0 1
    accuracy = Accuracy()
    assert np.isnan(accuracy.result())
    accuracy.update({"logits": logits}, (None, np.array([[0, 1], [1, 1]])))  # labels: the last element
    assert (accuracy.correct, accuracy.total, accuracy.result()) == (3, 4, 0.75)
    accuracy.update({"logits": logits}, (None, [0, 0, 0, 0]))  # reshaped to the predictions' shape
    assert (accuracy.correct, accuracy.total) == (5, 8) and type(accuracy.correct) is int
    accuracy.reset()
    assert (accuracy.correct, accuracy.total) == (0, 0)

    by_key = Accuracy(output="scores", labels="y", ignore_index=-100)
    by_key.update({"scores": logits}, {"y": np.array([[0, -100], [1, -100]])})
    assert (by_key.correct, by_key.total) == (1, 2)
    by_index = Accuracy(labels=0)
    by_index.update({"logits": logits[0]}, [np.array([0, 0]), None])
    assert (by_index.correct, by_index.total) == (1, 2)

    with pytest.raises(UserError) as error:
        Accuracy(output="probs").update({"logits": logits, "aux": logits}, (None, [0]))
    assert str(error.value) == "metrics: Accuracy reads output 'probs' but the model returned ['aux', 'logits']"
    with pytest.raises(UserError) as error:
        Accuracy().update({}, (None, [0]))
    assert str(error.value) == "metrics: Accuracy reads output 'logits' but the model returned no outputs"
    for batch, labels in (({"x": 1}, "label"), ((1,), 3), (5, 3)):  # no such key, index, or not indexable
        with pytest.raises(UserError) as error:
            Accuracy(labels=labels).update({"logits": logits}, batch)
        assert str(error.value) == f"metrics: the batch has no element {labels!r} (labels=...)"


@pytest.mark.parametrize("weighted", [False, True])
def test_perplexity_is_exp_of_the_loss_per_token_over_the_eval_set(weighted):
    """The vendor's contract: ``loss`` is the batch's summed loss; tokens are labels or sum(weights)."""
    torch.manual_seed(0)
    metric = PerplexityMetric(name="eval/lm_perplexity")
    all_logits, all_labels, all_masks = [], [], []
    for batch, length in ((3, 5), (1, 5), (6, 5)):
        logits = torch.randn(batch, length, 11)  # (B, T, V)
        labels = torch.randint(0, 11, (batch, length))  # (B, T)
        mask = (torch.rand(batch, length) < 0.7).float() if weighted else torch.ones(batch, length)
        per_token = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none")
        metric(labels=labels, loss=(per_token * mask.reshape(-1)).sum(), weights=mask if weighted else None)
        all_logits.append(logits.reshape(-1, 11)), all_labels.append(labels.reshape(-1))
        all_masks.append(mask.reshape(-1).bool())
    logits, labels, mask = torch.cat(all_logits), torch.cat(all_labels), torch.cat(all_masks)
    expected = torch.exp(F.cross_entropy(logits[mask].double(), labels[mask])).item()
    assert metric.compute() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_mean_iou_and_dice_from_the_accumulated_confusion_matrix(weighted):
    """Both average over the classes seen in labels or predictions: class 5 of 6 never is."""
    parts = batches(num_classes=5, shape_extra=(2, 2))  # (B, H, W) segmentation maps
    miou = MeanIOUMetric(num_classes=6, name="eval/mean_iou")
    dice = DiceCoefficientMetric(num_classes=6, name="eval/dice_coefficient")
    for labels, predictions, weights in parts:
        for metric in (miou, dice):
            # predictions as UNet made them: whole numbers in a float16 tensor
            metric(labels=labels.clone(), predictions=predictions.half(), weights=weights if weighted else None)
    labels, predictions = concatenated(parts, repeat_by_weights=weighted)
    present = np.union1d(labels, predictions)
    assert len(present) == 5
    assert miou.compute() == pytest.approx(jaccard_score(labels, predictions, labels=present, average="macro"),
                                           rel=1e-12)
    assert dice.compute() == pytest.approx(f1_score(labels, predictions, labels=present, average="macro"),
                                           rel=1e-12)


@pytest.mark.parametrize("average_type", ["micro", "macro"])
@pytest.mark.parametrize("beta, ignore_labels, weighted", [(1.0, None, False), (0.5, [0], False), (2.0, [1, 3], True)])
def test_fbeta_against_sklearn(average_type, beta, ignore_labels, weighted):
    parts = batches(num_classes=5)
    metric = FBetaScoreMetric(num_classes=5, beta=beta, average_type=average_type, ignore_labels=ignore_labels)
    padded = []
    for labels, predictions, weights in parts:
        labels = labels.clone()
        labels[::4] = -100  # padding: not counted at all, as the vendor's
        padded.append((labels, predictions, weights))
        metric(labels=labels, predictions=predictions, **({"weights": weights} if weighted else {}))
    labels, predictions = concatenated(padded, repeat_by_weights=weighted)
    counted = labels >= 0
    kept = [c for c in range(5) if c not in (ignore_labels or [])]
    expected = fbeta_score(labels[counted], predictions[counted], beta=beta, labels=kept, average=average_type,
                           zero_division=0)
    assert metric.compute() == pytest.approx(expected, rel=1e-12)


def test_fbeta_macro_counts_a_class_never_seen_as_zero():
    metric = FBetaScoreMetric(num_classes=3, average_type="macro")
    metric(labels=torch.tensor([0, 1, 1]), predictions=torch.tensor([0, 1, 0]))
    expected = f1_score([0, 1, 1], [0, 1, 0], labels=[0, 1, 2], average="macro", zero_division=0)
    assert metric.compute() == pytest.approx(expected) and expected == pytest.approx((2 / 3 + 2 / 3 + 0) / 3)


def test_reset_starts_over():
    metric = MeanIOUMetric(num_classes=3)
    metric(labels=torch.tensor([0, 1]), predictions=torch.tensor([1, 0]))
    metric.reset()
    assert metric.num_updates == 0 and np.isnan(AccuracyMetric().compute())
    metric(labels=torch.tensor([0, 1]), predictions=torch.tensor([0, 1]))
    assert metric.compute() == 1.0 and metric.num_updates == 1


@pytest.mark.parametrize("make, call, message", [
    (lambda: AccuracyMetric(name="eval/accuracy"),
     dict(labels=torch.zeros(4), predictions=torch.zeros(4, 10)),
     "AccuracyMetric 'eval/accuracy': labels has 4 values and predictions 40; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: MeanIOUMetric(num_classes=3, name="eval/mean_iou"),
     dict(labels=torch.tensor([0, 3]), predictions=torch.tensor([0, 1])),
     "MeanIOUMetric 'eval/mean_iou': labels holds 3, outside the 3 classes [0, 3)"),
    (lambda: DiceCoefficientMetric(num_classes=3),
     dict(labels=torch.tensor([0, 1]), predictions=torch.tensor([0.0, 0.5])),
     "DiceCoefficientMetric 'DiceCoefficientMetric': predictions must be class ids, got fractional values such as 0.5"),
    (lambda: PerplexityMetric(), dict(labels=torch.zeros(2, 3), loss=torch.ones(2)),
     "PerplexityMetric 'PerplexityMetric': loss must be the batch's summed loss (one value), got 2 values"),
    (lambda: FBetaScoreMetric(num_classes=3, average_type="weighted"), None,
     "FBetaScoreMetric 'FBetaScoreMetric': average_type must be one of micro, macro, got 'weighted'"),
    (lambda: FBetaScoreMetric(num_classes=1, name="eval/f1"), None,
     "FBetaScoreMetric 'eval/f1': num_classes must be an integer of at least 2, got 1"),
    (lambda: FBetaScoreMetric(num_classes=3, beta=0), None,
     "FBetaScoreMetric 'FBetaScoreMetric': beta must be a positive number, got 0"),
    (lambda: FBetaScoreMetric(num_classes=3, beta=True), None,
     "FBetaScoreMetric 'FBetaScoreMetric': beta must be a positive number, got True"),
    (lambda: FBetaScoreMetric(num_classes=3, beta="1"), None,
     "FBetaScoreMetric 'FBetaScoreMetric': beta must be a positive number, got '1'"),
    (lambda: MeanIOUMetric(num_classes=True), None,
     "MeanIOUMetric 'MeanIOUMetric': num_classes must be an integer of at least 1, got True"),
    (lambda: DiceCoefficientMetric(num_classes=2.0, name="d"), None,
     "DiceCoefficientMetric 'd': num_classes must be an integer of at least 1, got 2.0"),
    (lambda: MeanIOUMetric(num_classes=0), None,
     "MeanIOUMetric 'MeanIOUMetric': num_classes must be an integer of at least 1, got 0"),
    (lambda: MeanIOUMetric(num_classes=2), dict(labels=torch.tensor([0, -1]), predictions=torch.tensor([0, 1])),
     "MeanIOUMetric 'MeanIOUMetric': labels holds -1, outside the 2 classes [0, 2)"),
    (lambda: MeanIOUMetric(num_classes=2), dict(labels=torch.tensor([0, 1]), predictions=torch.tensor([2, 1])),
     "MeanIOUMetric 'MeanIOUMetric': predictions holds 2, outside the 2 classes [0, 2)"),
    (lambda: MeanIOUMetric(num_classes=2), dict(labels=torch.tensor([0.25, 1.0]), predictions=torch.tensor([0, 1])),
     "MeanIOUMetric 'MeanIOUMetric': labels must be class ids, got fractional values such as 0.25"),
    (lambda: AccuracyMetric(), dict(labels=None, predictions=torch.zeros(2)),
     "AccuracyMetric 'AccuracyMetric': labels is None"),
    (lambda: AccuracyMetric(), dict(labels=torch.zeros(2), predictions=None),
     "AccuracyMetric 'AccuracyMetric': predictions is None"),
    (lambda: AccuracyMetric(), dict(labels=torch.zeros(2), predictions=torch.zeros(2), weights=torch.ones(3)),
     "AccuracyMetric 'AccuracyMetric': labels has 2 values and weights 3; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: PerplexityMetric(), dict(labels=torch.zeros(2), loss=None),
     "PerplexityMetric 'PerplexityMetric': loss is None"),
    (lambda: MeanIOUMetric(num_classes=2), dict(labels=torch.zeros(2), predictions=None),
     "MeanIOUMetric 'MeanIOUMetric': predictions is None"),
    (lambda: PerplexityMetric(name="ppl"), dict(labels=None, loss=torch.tensor(1.0)),
     "PerplexityMetric 'ppl': labels is None"),
    (lambda: MeanIOUMetric(num_classes=2), dict(labels=None, predictions=torch.zeros(2)),
     "MeanIOUMetric 'MeanIOUMetric': labels is None"),
    (lambda: DiceCoefficientMetric(num_classes=3), dict(labels=torch.zeros(2), predictions=torch.zeros(3)),
     "DiceCoefficientMetric 'DiceCoefficientMetric': labels has 2 values and predictions 3; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: MeanIOUMetric(num_classes=3), dict(labels=torch.zeros(2), predictions=torch.zeros(2),
                                                weights=torch.ones(3)),
     "MeanIOUMetric 'MeanIOUMetric': labels has 2 values and weights 3; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: FBetaScoreMetric(num_classes=3), dict(labels=None, predictions=torch.zeros(2)),
     "FBetaScoreMetric 'FBetaScoreMetric': labels is None"),
    (lambda: FBetaScoreMetric(num_classes=3), dict(labels=torch.zeros(2), predictions=None),
     "FBetaScoreMetric 'FBetaScoreMetric': predictions is None"),
    (lambda: FBetaScoreMetric(num_classes=3), dict(labels=torch.zeros(2), predictions=torch.zeros(3)),
     "FBetaScoreMetric 'FBetaScoreMetric': labels has 2 values and predictions 3; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: FBetaScoreMetric(num_classes=3), dict(labels=torch.zeros(2), predictions=torch.zeros(2),
                                                   weights=torch.ones(3)),
     "FBetaScoreMetric 'FBetaScoreMetric': labels has 2 values and weights 3; they pair up one to one "
     "(predictions=logits.argmax(-1), not the logits)"),
    (lambda: FBetaScoreMetric(num_classes=3), dict(labels=torch.tensor([0, 1]), predictions=torch.tensor([0, 3])),
     "FBetaScoreMetric 'FBetaScoreMetric': predictions holds 3, outside the 3 classes [0, 3)"),
])
def test_bad_input_is_one_line_naming_the_metric(make, call, message):
    with pytest.raises(UserError) as error:
        make()(**call)
    assert str(error.value) == message


# --- the runner finds them -----------------------------------------------------------------------


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.layer.inner_metric = AccuracyMetric(name="eval/inner")  # on a submodule


class Bare(PyTorchBaseModel):
    """Only what cb_metrics_of reads: the model's attributes and its module tree."""

    def __init__(self):
        self.model = Holder()
        self.metrics = {}


def test_cb_metrics_of_finds_them_on_the_model_its_modules_and_in_containers():
    model = Bare()
    model.accuracy_metric = AccuracyMetric(name="eval/accuracy")
    model.model.module_metric = AccuracyMetric(name="eval/module")  # the vendor's fc_mnist kept it here
    model.eval_metrics_objs = {"mIOU": MeanIOUMetric(num_classes=2, name="eval/mean_iou")}  # the vendor's UNet
    model.listed = [PerplexityMetric(name="ppl")]
    model.again = model.accuracy_metric  # one object found twice counts once
    model.twin = AccuracyMetric(name="eval/accuracy")  # one name twice: suffixed, as the vendor did
    found = cb_metrics_of(model, taken=("loss",))
    assert found == {"accuracy": model.accuracy_metric, "mean_iou": model.eval_metrics_objs["mIOU"],
                     "ppl": model.listed[0], "accuracy_1": model.twin, "module": model.model.module_metric,
                     "inner": model.model.layer.inner_metric}


@pytest.mark.parametrize("name", ["eval/loss", "accuracy"])
def test_a_metric_reporting_as_a_key_taken_is_an_error(name):
    model = Bare()
    model.metrics = {"accuracy": Accuracy()}
    model.metric = AccuracyMetric(name=name)
    with pytest.raises(UserError, match=f"AccuracyMetric '{name}' reports as '{name.removeprefix('eval/')}'"):
        cb_metrics_of(model, taken=("loss", *model.metrics))


# --- a vendor-style model through the runner, on the CPU and on the emulator ------------------------


class DigitsMLP(PyTorchBaseModel):
    """784-32-10 on the embedded digits, written as a vendor model: __call__ returns the loss,
    its metrics are fed inside __call__ only when evaluating."""

    def __init__(self, params, device):
        super().__init__(params, nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10)), device)
        self.compute_eval_metrics = params["model"]["compute_eval_metrics"]
        self.always_call = params["model"]["always_call"]  # as the vendor's fc_mnist: no training guard
        self.accuracy_metric = AccuracyMetric(name="eval/accuracy")
        self.weighted_accuracy = AccuracyMetric(name="eval/weighted_accuracy")
        self.perplexity_metric = PerplexityMetric(name="eval/perplexity")
        self.eval_metrics = {"f1": FBetaScoreMetric(num_classes=10, average_type="macro", name="eval/f1_macro"),
                             "miou": MeanIOUMetric(num_classes=10, name="eval/mean_iou"),
                             "dice": DiceCoefficientMetric(num_classes=10, name="eval/dice")}

    def __call__(self, batch):
        images, labels, weights = batch  # (B, 1, 28, 28) float32, (B,) int64, (B,) float32
        logits = self.model(images)  # (B, 10)
        loss = F.cross_entropy(logits, labels)
        if self.always_call:
            self.accuracy_metric(labels=labels.clone(), predictions=logits.argmax(-1).int())
        elif not self.model.training and self.compute_eval_metrics:
            predictions = logits.argmax(-1).int()  # (B,)
            self.accuracy_metric(labels=labels.clone(), predictions=predictions)
            self.weighted_accuracy(labels=labels.clone(), predictions=predictions, weights=weights)
            self.perplexity_metric(labels=labels, loss=loss * labels.shape[0])  # the summed loss
            for metric in self.eval_metrics.values():
                metric(labels=labels.clone(), predictions=predictions)
        return loss


def default_params():
    return {"model": {"compute_eval_metrics": True, "always_call": False}}


@functools.cache
def digits(split):
    """The embedded digits, normalised, with a weight 0..3 per example."""
    images, labels = load_mnist_arrays(embedded_digits(), split)  # (N, 28, 28) uint8, (N,) int64
    x = torch.from_numpy(images).float().div(255).sub(MNIST_MEAN).div(MNIST_STD).unsqueeze(1)  # (N, 1, 28, 28)
    weights = torch.from_numpy((np.arange(len(labels)) % 4).astype(np.float32))  # (N,)
    return TensorDataset(x, torch.from_numpy(labels), weights)


def train_data(params):
    return DataLoader(digits("train"), batch_size=64, shuffle=True, drop_last=True)


def eval_data(params):
    return DataLoader(digits("test"), batch_size=40, drop_last=True)  # 360 = 9 batches


def model_fn(params, device):
    return DigitsMLP(params, device)


@pytest.fixture(scope="module")
def params_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text("runconfig:\n  max_steps: 40\n  checkpoint_steps: 40\n  log_steps: 20\n"
                    "optimizer:\n  learning_rate: 0.003\n")
    return str(path)


def run_digits(params_file, model_dir, *extra):
    argv = ["--params", params_file, "--model_dir", str(model_dir), *extra]
    return run(model_fn, train_data, eval_data, default_params, argv=argv)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, params_file):
    """40 CPU steps; the checkpoint both evals start from."""
    folder = tmp_path_factory.mktemp("trained")
    run_digits(params_file, folder)
    return str(folder / "checkpoint_40.mdl")


def independent_scores(params_file, checkpoint):
    """The checkpoint's predictions on the eval set, scored by scikit-learn."""
    model = DigitsMLP(load_params(params_file, default_params()), "cpu")
    model.model.load_state_dict(torch.load(checkpoint, weights_only=False)["model"])
    images, labels, weights = digits("test").tensors
    with torch.no_grad():
        predictions = model.model(images).argmax(-1).numpy()
    labels, weights = labels.numpy(), weights.numpy()
    return {"accuracy": accuracy_score(labels, predictions),
            "weighted_accuracy": accuracy_score(labels, predictions, sample_weight=weights),
            "f1_macro": f1_score(labels, predictions, average="macro"),
            "mean_iou": jaccard_score(labels, predictions, average="macro"),
            "dice": f1_score(labels, predictions, average="macro")}


METRIC_KEYS = {"loss", "accuracy", "weighted_accuracy", "perplexity", "f1_macro", "mean_iou", "dice"}


@pytest.fixture(scope="module")
def cpu_eval(tmp_path_factory, params_file, trained):
    folder = tmp_path_factory.mktemp("cpu_eval")
    return folder, run_digits(params_file, folder, "--mode", "eval", "--checkpoint_path", trained)


def test_cpu_eval_reports_every_vendor_metric_like_the_zoos_own(cpu_eval, params_file, trained):
    folder, results = cpu_eval
    assert set(results) == METRIC_KEYS
    expected = independent_scores(params_file, trained)
    assert expected["accuracy"] >= 0.8  # trained: the scores below say something
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, rel=1e-12), key
    assert results["perplexity"] == pytest.approx(np.exp(results["loss"]), rel=1e-6)
    scalars = read_scalars(str(folder / "eval"))  # the TensorBoard tags: the names without "eval/"
    assert set(scalars) == METRIC_KEYS
    assert scalars["accuracy"] == [(40, pytest.approx(results["accuracy"]))]


def eval_line(capsys) -> str:
    """The run's "| Eval ..." log line (the runner logs to stderr)."""
    return next(line.split(" INFO ", 1)[1] for line in capsys.readouterr().err.splitlines() if " INFO | Eval" in line)


def test_the_eval_log_line_carries_the_metrics(tmp_path, params_file, trained, capsys):
    results = run_digits(params_file, tmp_path, "--mode", "eval", "--checkpoint_path", trained)
    line = eval_line(capsys)
    assert f"accuracy={results['accuracy']:.5f}" in line and f"mean_iou={results['mean_iou']:.5f}" in line


def test_emulator_eval_gives_the_cpus_metrics(tmp_path, params_file, trained, cpu_eval, capsys):
    """The metric calls stay on the host and see the emulator's outputs."""
    results = run_digits(params_file, tmp_path, "--mode", "eval", "--device", "emulator", "--checkpoint_path", trained)
    _, cpu = cpu_eval
    assert set(results) == METRIC_KEYS
    # the same predictions: the smallest gap between the two top logits of these 360 digits is
    # 7e-3, where the emulator's fp32 logits differ from torch's by about 1e-7 relative
    for key in ("accuracy", "weighted_accuracy", "f1_macro", "mean_iou", "dice"):
        assert results[key] == cpu[key], key
    assert results["perplexity"] == pytest.approx(cpu["perplexity"], rel=1e-5)
    line = eval_line(capsys)
    assert line.startswith("| Eval Device=emulator Step=40") and f"accuracy={cpu['accuracy']:.5f}" in line
    assert read_scalars(str(tmp_path / "eval"))["accuracy"] == [(40, pytest.approx(cpu["accuracy"]))]


def test_the_eval_graph_returns_the_metrics_tensors_and_adds_no_metric_op(params_file):
    params = load_params(params_file, default_params())
    model = DigitsMLP(params, "cpu")
    batch = next(iter(eval_data(params)))
    graph, calls = capture_step(model, batch, training=False, params=params)
    assert model.model.training  # put back as capture found it
    assert len(calls.calls) == 6 and all(key.startswith("cb_metric:") for key in graph.outputs)
    # labels (a batch input), the argmax predictions, the weights, the summed loss: nothing else
    assert {graph.outputs[key] for key in graph.outputs} >= {"batch_1", "batch_2"}
    ops = {node.op for node in graph.nodes}
    assert ops == {"transpose", "matmul", "add", "relu", "reshape", "cross_entropy_loss", "argmax", "cast", "mul"}
    assert validate_graph(graph, mode="eval", profile_name="wse2").ok
    train_graph, train_calls = capture_step(model, batch, training=True, params=params)
    assert train_graph.outputs == {} and train_calls.calls == []


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_validate_and_compile_only_pass_with_no_unsupported_op(tmp_path, params_file, trained, capsys, mode):
    extra = ["--mode", mode, "--checkpoint_path", trained] if mode == "eval" else []
    report = run_digits(params_file, tmp_path / "v", "--validate_only", *extra)
    assert report.ok and report.errors == [] and [w.kind for w in report.warnings] == ["precision"]
    assert capsys.readouterr().out.startswith("validation passed")
    run_digits(params_file, tmp_path / "c", "--compile_only", *extra)
    assert sorted(os.listdir(tmp_path / "c" / "compile")) == ["ir.json", "placement.svg", "report.json",
                                                             "report.txt"]


def test_calls_made_while_training_do_not_count(tmp_path, params_file, trained):
    """A model that calls its metric in every step (no training guard): only eval batches count,
    on the CPU (train_and_eval) and on the emulator (trains, then evaluates)."""
    final = run_digits(params_file, tmp_path / "cpu", "--mode", "train_and_eval", "model.always_call=true")
    expected = independent_scores(params_file, str(tmp_path / "cpu" / "checkpoint_40.mdl"))["accuracy"]
    assert final["accuracy"] == expected
    emulator = tmp_path / "emulator"
    run_digits(params_file, emulator, "--device", "emulator", "runconfig.max_steps=2", "model.always_call=true")
    results = run_digits(params_file, emulator, "--mode", "eval", "--device", "emulator", "model.always_call=true")
    assert results["accuracy"] == independent_scores(params_file, str(emulator / "checkpoint_2.mdl"))["accuracy"]


def test_a_metric_never_called_in_eval_is_left_out_with_a_warning(tmp_path, params_file, trained, capsys):
    results = run_digits(params_file, tmp_path, "--mode", "eval", "--checkpoint_path", trained,
                         "model.compute_eval_metrics=false")
    assert set(results) == {"loss"}
    warnings = [line for line in capsys.readouterr().err.splitlines() if " WARNING " in line]
    assert sum("metric 'eval/accuracy' (AccuracyMetric) was not called during eval" in w for w in warnings) == 1


def test_a_user_subclass_of_cbmetric_runs_with_its_host_half_only():
    class Count(CBMetric):
        def reset_state(self):
            self.seen = 0

        def update_on_host(self, values):
            assert values.device.type == "cpu" and not values.requires_grad  # the vendor's contract
            self.seen += values.numel()

        def compute(self):
            return float(self.seen)

    metric = Count(name="eval/count")
    metric(torch.ones(3, 2, requires_grad=True))
    assert metric.compute() == 6.0 and metric.num_updates == 1


def test_a_capture_that_keeps_no_metric_calls_still_captures(params_file):
    """Traced by device/capture/torch/ directly (not through the runner): the call does nothing."""
    from device.capture.torch import capture

    params = load_params(params_file, default_params())
    model = DigitsMLP(load_params(params_file, default_params(), ["model.always_call=true"]), "cpu")
    graph = capture(model, model.model, tuple(next(iter(eval_data(params)))))
    assert graph.loss is not None and model.accuracy_metric.num_updates == 0


# --- the edges of each metric, on their own -------------------------------------------------------


def test_perplexity_of_nothing_is_nan_and_of_a_huge_loss_is_inf():
    metric = PerplexityMetric()
    assert np.isnan(metric.compute())
    metric(labels=torch.zeros(2, 3), loss=torch.tensor(3.0))  # 6 tokens
    assert metric.compute() == pytest.approx(math.exp(0.5), rel=1e-12)
    metric(labels=torch.zeros(1), loss=torch.tensor(1e6))  # exp(1e6 / 7) overflows a float
    assert metric.compute() == math.inf
    weighted = PerplexityMetric()
    weighted(labels=torch.zeros(2, 3), loss=torch.tensor([2.0]), weights=torch.tensor([[1.0, 0, 0], [1, 0, 0]]))
    assert weighted.compute() == pytest.approx(math.e, rel=1e-12)  # 2 tokens by the weights, not 6 labels


def test_bfloat16_arguments_are_read_as_their_values():
    """numpy has no bfloat16: the values arrive as float32, whole class ids and a loss alike."""
    accuracy = AccuracyMetric()
    accuracy(labels=torch.tensor([0, 1, 2, 3]), predictions=torch.tensor([0, 1, 2, 0], dtype=torch.bfloat16))
    assert accuracy.compute() == 0.75
    iou = MeanIOUMetric(num_classes=4)
    iou(labels=torch.tensor([0, 1, 2, 3]), predictions=torch.tensor([0, 1, 2, 0], dtype=torch.bfloat16))
    assert iou.compute() == pytest.approx(jaccard_score([0, 1, 2, 3], [0, 1, 2, 0], average="macro"), rel=1e-12)
    perplexity = PerplexityMetric()
    perplexity(labels=torch.zeros(4), loss=torch.tensor(2.0, dtype=torch.bfloat16))
    assert perplexity.compute() == pytest.approx(math.exp(0.5), rel=1e-12)


def test_the_fewest_classes_each_metric_takes():
    iou = MeanIOUMetric(num_classes=1)  # one class: every pixel is it
    iou(labels=torch.zeros(3), predictions=torch.zeros(3))
    assert iou.compute() == 1.0 and iou.confusion_matrix.tolist() == [[3.0]]
    f1 = FBetaScoreMetric(num_classes=2)
    f1(labels=torch.tensor([0, 1, 1, 1]), predictions=torch.tensor([0, 1, 0, 1]))
    assert f1.compute() == pytest.approx(f1_score([0, 1, 1, 1], [0, 1, 0, 1], average="micro"), rel=1e-12)


def test_a_confusion_metric_that_saw_no_class_is_zero():
    for metric in (MeanIOUMetric(num_classes=3), DiceCoefficientMetric(num_classes=3)):
        assert metric.compute() == 0.0
        metric(labels=torch.tensor([0, 1]), predictions=torch.tensor([1, 1]), weights=torch.zeros(2))  # weighed out
        assert metric.compute() == 0.0 and metric.num_updates == 1


def test_fbeta_ignores_labels_outside_the_classes_and_scores_zero_when_every_class_is_ignored():
    labels, predictions = torch.tensor([0, 1, 2, 2, 1, -100]), torch.tensor([0, 2, 2, 1, 1, 0])
    for average_type in ("micro", "macro"):
        plain = FBetaScoreMetric(num_classes=3, average_type=average_type)
        odd = FBetaScoreMetric(num_classes=3, average_type=average_type, ignore_labels=[-100, 3, 7])
        for metric in (plain, odd):
            metric(labels=labels, predictions=predictions)
        assert odd.compute() == plain.compute() == pytest.approx(
            f1_score([0, 1, 2, 2, 1], [0, 2, 2, 1, 1], average=average_type), rel=1e-12)
        everything = FBetaScoreMetric(num_classes=3, average_type=average_type, ignore_labels=[0, 1, 2])
        everything(labels=labels, predictions=predictions)
        assert everything.compute() == 0.0
    assert plain.confusion_matrix.tolist() == [[1, 0, 0], [0, 1, 1], [0, 1, 1]]  # what the processes add up
    nothing = FBetaScoreMetric(num_classes=3)
    nothing(labels=torch.tensor([-100, 3]), predictions=torch.tensor([0, 1]))  # no label counted
    assert nothing.compute() == 0.0 and nothing.confusion_matrix.sum() == 0


def test_update_on_device_must_return_device_outputs():
    class Raw(CBMetric):
        def update_on_device(self, values):
            return [values]

    with pytest.raises(TypeError) as error:
        Raw()(torch.ones(2))
    assert str(error.value) == "Raw.update_on_device must return DeviceOutputs, got list"


def test_recorded_calls_become_step_outputs_and_replay_on_the_host():
    """What a device capture does with the metric calls, without the capture: record, name, replay."""
    accuracy, perplexity = AccuracyMetric(name="eval/accuracy"), PerplexityMetric()
    with recording_metric_calls() as calls:
        with recording_metric_calls() as inner:  # nested: the inner one records, the outer resumes after
            accuracy(labels=torch.tensor([0, 1]), predictions=torch.tensor([0, 0]))
        perplexity(labels=torch.zeros(4), loss=torch.tensor(2.0))
        accuracy(torch.tensor([1]), torch.tensor([1]), torch.tensor([3.0]))
    assert [m for m, _ in inner] == [accuracy] and [m for m, _ in calls] == [perplexity, accuracy]
    assert accuracy.num_updates == perplexity.num_updates == 0  # recorded, not added up
    captured = CapturedMetricCalls(calls)
    # the tensors become named outputs; perplexity's weights (None) stay a constant of the call
    assert sorted(captured.outputs) == ["cb_metric:0:0", "cb_metric:0:1", "cb_metric:1:0", "cb_metric:1:1",
                                        "cb_metric:1:2"]
    assert captured.outputs["cb_metric:0:1"].item() == 2.0 and captured.outputs["cb_metric:1:2"].item() == 3.0
    step = {"loss": np.float32(0.5), **{k: v.numpy() for k, v in captured.outputs.items()}}
    step["cb_metric:1:1"] = np.array([0])  # the device's prediction, not the recorded one
    assert captured.replay(step) == {"loss": np.float32(0.5)}
    assert perplexity.compute() == pytest.approx(math.exp(0.5), rel=1e-12) and perplexity.num_updates == 1
    assert accuracy.compute() == 0.0 and accuracy.num_updates == 1
    accuracy(labels=torch.tensor([1]), predictions=torch.tensor([1]))  # no recording open: added up at once
    assert accuracy.compute() == 0.25 and accuracy.num_updates == 2


def test_summed_state_of_a_metric_without_sums_names_its_module_when_its_source_is_unknown():
    made = type("Median", (Metric,), {"__module__": "zoo_user.metrics"})  # no source file to point at
    with pytest.raises(UserError) as error:
        summed_state(made())
    assert str(error.value) == ("zoo_user.metrics: metric Median has no 'summed' (the attributes reset zeroes and "
                                "update adds to), which a data-parallel eval adds up over the processes; name them, "
                                "e.g. summed = (\"correct\", \"total\")")


def test_set_summed_state_puts_back_each_sum_as_the_type_and_shape_it_had():
    """The all-reduce hands flat float arrays back: a matrix is reshaped and keeps its dtype, an
    integer count is rounded (not truncated), a float sum stays as it came."""
    iou, accuracy, ours = MeanIOUMetric(num_classes=2), AccuracyMetric(), Accuracy()
    set_summed_state(iou, {"confusion_matrix": [2, 0, 1, 3], "_num_updates": np.float64(1.9999999)})
    assert iou.confusion_matrix.dtype == np.float64 and iou.confusion_matrix.tolist() == [[2, 0], [1, 3]]
    assert iou.num_updates == 2 and type(iou.num_updates) is int
    set_summed_state(accuracy, {"total_correct": np.float64(2.5), "total_weight": np.array(4.0)})
    assert (accuracy.total_correct, accuracy.total_weight, accuracy.compute()) == (2.5, 4.0, 0.625)
    set_summed_state(ours, {"correct": np.float32(5.9999995), "total": 8.0})
    assert (ours.correct, ours.total) == (6, 8) and type(ours.total) is int


def test_the_zoos_accuracy_takes_the_argmax_over_the_classes_of_a_sequence():
    """(B, T, C) logits with T != C: the argmax is over the last axis, the classes."""
    rng = np.random.default_rng(2)
    logits, labels = rng.random((2, 3, 4)), rng.integers(0, 4, (2, 3))  # (B=2, T=3, C=4), (B, T)
    accuracy = Accuracy()
    accuracy.update({"logits": logits}, (None, labels))
    expected = accuracy_score(labels.reshape(-1), logits.argmax(-1).reshape(-1), normalize=False)
    assert (accuracy.correct, accuracy.total) == (expected, 6)


def test_numpy_arrays_lists_and_numbers_are_read_as_tensors_are():
    """The host half also takes what is no tensor: the replay of a capture hands constants as they were."""
    accuracy = AccuracyMetric()
    accuracy.update_on_host(np.array([[0, 1], [2, 2]]), [[0, 1], [2, 0]], weights=np.array([[1, 1], [1, 1]]))
    assert accuracy.compute() == 0.75
    perplexity = PerplexityMetric()
    perplexity.update_on_host(np.zeros((2, 3)), 3.0)  # a Python float as the summed loss, 6 tokens
    assert perplexity.compute() == pytest.approx(math.exp(0.5), rel=1e-12)


def test_cb_metrics_of_looks_in_a_mapping_that_is_no_dict():
    import types

    model = Bare()
    model.held = types.MappingProxyType({"a": AccuracyMetric(name="eval/held")})  # read-only: a Mapping, no dict
    assert cb_metrics_of(model) == {"held": model.held["a"], "inner": model.model.layer.inner_metric}


def test_three_metrics_of_one_name_report_as_name_name_1_and_name_2():
    model = Bare()
    model.listed = [AccuracyMetric(name="eval/accuracy") for _ in range(3)]
    assert cb_metrics_of(model) == {"accuracy": model.listed[0], "accuracy_1": model.listed[1],
                                    "accuracy_2": model.listed[2], "inner": model.model.layer.inner_metric}

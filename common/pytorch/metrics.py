"""Eval metrics over the whole eval set, fed numpy arrays.

A model declares its metrics after building itself::

    self.metrics = {"accuracy": Accuracy(output="logits")}

and the runner, for every eval batch, calls ``metric.update(outputs, batch)`` with the
model's outputs and the batch as numpy arrays (the emulator hands the same numpy
outputs), then ``metric.result()`` once at the end. Numpy keeps the metrics identical on
CPU, GPU and the emulator.

Ported models use the vendor's classes instead (``AccuracyMetric``, ``PerplexityMetric``,
``MeanIOUMetric``, ``DiceCoefficientMetric``, ``FBetaScoreMetric``, ``RougeScoreMetric``, on
the base ``CBMetric``): built in the model's ``__init__`` with a name and called inside
``__call__`` while evaluating. The runner finds them on the model and reports them as it
reports ``self.metrics`` (see "the vendor's metric classes" below).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from common.errors import UserError


def _pick(batch: Any, key: int | str) -> np.ndarray:
    """``batch[key]`` of a tuple/list (by index) or a mapping (by name) batch."""
    try:
        return np.asarray(batch[key])
    except (KeyError, IndexError, TypeError):
        raise UserError(f"metrics: the batch has no element {key!r} (labels=...)") from None


class Metric:
    """Accumulates over eval batches; ``result()`` is the value over everything seen.

    ``summed`` names the attributes that ``reset()`` zeroes and ``update()`` adds to
    (numbers or numpy arrays): a data-parallel eval (common/pytorch/distributed.py) adds
    them up over the processes, each of which saw its share of the eval set, before
    ``result()``. A metric whose result is not a function of such sums cannot be reduced.
    """

    summed: tuple[str, ...] | None = None

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, outputs: Mapping[str, np.ndarray], batch: Any) -> None:
        raise NotImplementedError

    def result(self) -> float:
        raise NotImplementedError


class Accuracy(Metric):
    """Fraction of examples whose argmax over the last axis of ``outputs[output]`` is the label.

    ``labels`` says where the labels are in the batch: an index into a tuple batch
    (default: the last element) or a key of a dict batch. Labels equal to ``ignore_index``
    do not count.
    """

    summed = ("correct", "total")

    def __init__(self, output: str = "logits", labels: int | str = -1, ignore_index: int | None = None):
        self.output, self.labels, self.ignore_index = output, labels, ignore_index
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, outputs: Mapping[str, np.ndarray], batch: Any) -> None:
        if self.output not in outputs:
            raise UserError(f"metrics: Accuracy reads output '{self.output}' but the model returned "
                            f"{sorted(outputs) or 'no outputs'}")
        predictions = np.argmax(outputs[self.output], axis=-1)  # (B, ...)
        labels = _pick(batch, self.labels).reshape(predictions.shape)  # (B, ...)
        counted = np.ones(labels.shape, bool) if self.ignore_index is None else labels != self.ignore_index
        self.correct += int(np.sum((predictions == labels) & counted))
        self.total += int(np.sum(counted))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


# --- the vendor's metric classes ------------------------------------------------------------
#
# The contract of the vendor zoo's common/pytorch/metrics (R1.x), which ported models use:
# built in the model's __init__ with a name, called inside __call__ while evaluating,
#
#     self.accuracy_metric = AccuracyMetric(name="eval/accuracy")
#     ...
#     if not self.model.training:
#         self.accuracy_metric(labels=labels.clone(), predictions=logits.argmax(-1).int())
#
# A call splits in two, as the vendor's did: ``update_on_device(...)`` picks the tensors
# the host needs (it runs where the model runs: on the device, it is part of the captured
# step), and ``update_on_host(...)`` accumulates them as CPU tensors. On the CPU or a GPU
# both halves run at the call. On the emulator the call only records what update_on_device
# returned: common/pytorch/device_run.py makes those tensors extra outputs of the captured
# eval step and hands the emulator's values of them to update_on_host after each step
# (CapturedMetricCalls below), so no metric op runs on the device.
#
# The runner finds every CBMetric reachable from the model (cb_metrics_of), resets them at
# the start of each eval and reports ``compute()`` beside the loss, under the metric's name
# without its "eval/" prefix ("eval/accuracy" -> accuracy); a ``compute()`` that gives several
# scores by name (RougeScoreMetric's) reports each as name/score (rouge1/precision). A call made
# while training accumulates, as the vendor's did, and is cleared by that reset: only eval
# batches count.


@dataclass
class DeviceOutputs:
    """What ``update_on_device`` returns: the arguments ``update_on_host`` gets, as CPU tensors."""

    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


# the calls recorded while a device capture runs the model (None: no capture is recording)
_recording: list[tuple["CBMetric", DeviceOutputs]] | None = None


class CBMetric:
    """The vendor's metric base: accumulates over the eval set; ``compute()`` is the value over all of it.

    A subclass writes ``update_on_host(...)`` (the arguments as CPU tensors), ``compute()``
    and ``reset_state()``; ``update_on_device(...)`` passes its arguments through unless
    overridden. ``name`` defaults to the class name. ``summed`` names the attributes
    ``reset_state()`` zeroes and ``update_on_host()`` adds to, as Metric.summed.
    """

    summed: tuple[str, ...] | None = None

    def __init__(self, name: str | None = None):
        self._name = name or type(self).__name__
        self._num_updates = 0
        self.init_state()

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_updates(self) -> int:
        """How many calls this metric has accumulated since the last reset."""
        return self._num_updates

    def init_state(self) -> None:
        self.reset_state()

    def reset_state(self) -> None:
        pass

    def reset(self) -> None:
        self._num_updates = 0
        self.reset_state()

    def update_on_device(self, *args, **kwargs) -> DeviceOutputs:
        return DeviceOutputs(args=list(args), kwargs=dict(kwargs))

    def update_on_host(self, *args, **kwargs) -> None:
        raise NotImplementedError

    def compute(self) -> float:
        raise NotImplementedError

    def __call__(self, *args, **kwargs) -> None:
        outputs = self.update_on_device(*args, **kwargs)
        if not isinstance(outputs, DeviceOutputs):
            raise TypeError(f"{type(self).__name__}.update_on_device must return DeviceOutputs, "
                            f"got {type(outputs).__name__}")
        if _recording is not None:  # a device capture: the tensors become outputs of the captured step
            _recording.append((self, outputs))
            return
        if torch.compiler.is_exporting():  # traced by a capture that keeps no metric calls: nothing to add up
            return
        self._update(*_to_cpu((outputs.args, outputs.kwargs)))

    def _update(self, args: list, kwargs: dict) -> None:
        self.update_on_host(*args, **kwargs)
        self._num_updates += 1

    def _what(self) -> str:
        return f"{type(self).__name__} {self.name!r}"


def _to_cpu(tree: Any) -> Any:
    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


def _values(metric: CBMetric, argument: str, value: Any) -> np.ndarray:
    """A metric argument (a tensor, array or number) as a flat numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.float() if value.dtype == torch.bfloat16 else value  # numpy has no bfloat16
        return value.numpy().reshape(-1)
    if value is None:
        raise UserError(f"{metric._what()}: {argument} is None")
    return np.asarray(value).reshape(-1)


def _same_size(metric: CBMetric, **arrays: np.ndarray | None) -> None:
    (first, a), *others = [(k, v) for k, v in arrays.items() if v is not None]
    for name, b in others:
        if b.size != a.size:
            raise UserError(f"{metric._what()}: {first} has {a.size} values and {name} {b.size}; they pair "
                            f"up one to one (predictions=logits.argmax(-1), not the logits)")


def _class_ids(metric: CBMetric, argument: str, values: np.ndarray, num_classes: int) -> np.ndarray:
    """Integer class ids in [0, num_classes) (predictions may come as whole floats, e.g. float16)."""
    ids = values.astype(np.int64)
    if values.dtype.kind == "f" and not np.array_equal(ids, values):
        raise UserError(f"{metric._what()}: {argument} must be class ids, got fractional values such as "
                        f"{values[ids != values][0]}")
    outside = ids[(ids < 0) | (ids >= num_classes)]
    if outside.size:
        raise UserError(f"{metric._what()}: {argument} holds {outside[0]}, outside the {num_classes} classes "
                        f"[0, {num_classes})")
    return ids


def _check_num_classes(metric: CBMetric, num_classes: Any, least: int) -> int:
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < least:
        raise UserError(f"{metric._what()}: num_classes must be an integer of at least {least}, got {num_classes!r}")
    return num_classes


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int,
                     weights: np.ndarray | None = None) -> np.ndarray:
    """(num_classes, num_classes) float64: rows are labels, columns predictions, cells summed weights."""
    cells = np.bincount(labels * num_classes + predictions, weights=weights, minlength=num_classes * num_classes)
    return cells.astype(np.float64).reshape(num_classes, num_classes)


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (tf.math.divide_no_nan)."""
    safe = np.where(denominator == 0, 1.0, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


class AccuracyMetric(CBMetric):
    """Correct predictions over all predictions: ``labels`` and ``predictions`` are class ids of any
    (equal) size; with ``weights``, each counts its weight (weight 0 masks it out)."""

    summed = ("total_correct", "total_weight")

    def reset_state(self) -> None:
        self.total_correct = 0.0
        self.total_weight = 0.0

    def update_on_device(self, labels, predictions, weights=None, dtype=None) -> DeviceOutputs:
        return DeviceOutputs(args=[labels, predictions, weights])  # dtype: the vendor's on-device result type

    def update_on_host(self, labels, predictions, weights=None) -> None:
        labels, predictions = _values(self, "labels", labels), _values(self, "predictions", predictions)
        weights = None if weights is None else _values(self, "weights", weights).astype(np.float64)
        _same_size(self, labels=labels, predictions=predictions, weights=weights)
        correct = labels == predictions
        self.total_correct += float(correct.sum() if weights is None else (correct * weights).sum())
        self.total_weight += float(correct.size if weights is None else weights.sum())

    def compute(self) -> float:
        return self.total_correct / self.total_weight if self.total_weight else float("nan")


class PerplexityMetric(CBMetric):
    """exp(loss per token) over the eval set.

    ``loss`` is the batch's loss summed over its tokens (not their mean: the vendor's GPT-2
    passes its mean loss times the tokens it was divided by); the tokens are the number of
    ``labels``, or the sum of ``weights`` (the attention mask) when given.
    """

    summed = ("total_loss", "total_tokens")

    def reset_state(self) -> None:
        self.total_loss = 0.0
        self.total_tokens = 0.0

    def update_on_device(self, labels, loss, weights=None, dtype=None) -> DeviceOutputs:
        return DeviceOutputs(args=[labels, loss, weights])

    def update_on_host(self, labels, loss, weights=None) -> None:
        loss = _values(self, "loss", loss)
        if loss.size != 1:
            raise UserError(f"{self._what()}: loss must be the batch's summed loss (one value), got {loss.size} "
                            f"values")
        tokens = _values(self, "labels", labels).size if weights is None else _values(self, "weights", weights).sum()
        self.total_loss += float(loss[0])
        self.total_tokens += float(tokens)

    def compute(self) -> float:
        if not self.total_tokens:
            return float("nan")
        try:
            return math.exp(self.total_loss / self.total_tokens)
        except OverflowError:
            return math.inf


class _ConfusionMetric(CBMetric):
    """Accumulates a weighted confusion matrix of ``labels`` against ``predictions`` (class ids)."""

    summed = ("confusion_matrix",)

    def __init__(self, num_classes: int, name: str | None = None):
        self._name = name or type(self).__name__  # set early: the checks below name the metric
        self.num_classes = _check_num_classes(self, num_classes, least=1)
        super().__init__(name)

    def reset_state(self) -> None:
        self.confusion_matrix = np.zeros((self.num_classes, self.num_classes))  # rows: labels, columns: predictions

    def update_on_host(self, labels, predictions, weights=None) -> None:
        labels, predictions = _values(self, "labels", labels), _values(self, "predictions", predictions)
        weights = None if weights is None else _values(self, "weights", weights).astype(np.float64)
        _same_size(self, labels=labels, predictions=predictions, weights=weights)
        self.confusion_matrix += confusion_matrix(_class_ids(self, "labels", labels, self.num_classes),
                                                  _class_ids(self, "predictions", predictions, self.num_classes),
                                                  self.num_classes, weights)

    def _mean_over_present_classes(self, numerator: np.ndarray, denominator: np.ndarray) -> float:
        """The mean of numerator / denominator over the classes seen (a nonzero denominator); 0 if none."""
        present = denominator != 0
        return float(np.mean(numerator[present] / denominator[present])) if present.any() else 0.0


class MeanIOUMetric(_ConfusionMetric):
    """Mean over the classes seen (in labels or predictions) of TP / (TP + FP + FN)."""

    def compute(self) -> float:
        m = self.confusion_matrix
        true_positives = np.diag(m)
        return self._mean_over_present_classes(true_positives, m.sum(0) + m.sum(1) - true_positives)


class DiceCoefficientMetric(_ConfusionMetric):
    """Mean over the classes seen (in labels or predictions) of 2 TP / (2 TP + FP + FN)."""

    def compute(self) -> float:
        m = self.confusion_matrix
        return self._mean_over_present_classes(2 * np.diag(m), m.sum(0) + m.sum(1))


class FBetaScoreMetric(CBMetric):
    """F-beta of class-id predictions: (1 + beta^2) P R / (beta^2 P + R).

    ``average_type`` "micro" pools every class's counts; "macro" averages the per-class
    scores over all classes (a class never seen scores 0). Classes in ``ignore_labels``
    are left out of both; labels outside [0, num_classes) (padding such as -100) are not
    counted at all, as the vendor's. ``weights`` (our addition; the vendor's took none)
    weighs each prediction.
    """

    AVERAGE_TYPES = ("micro", "macro")
    summed = ("confusion_matrix",)

    def __init__(self, num_classes: int, beta: float = 1.0, average_type: str = "micro",
                 ignore_labels: list[int] | None = None, name: str | None = None):
        self._name = name or type(self).__name__  # set early: the checks below name the metric
        self.num_classes = _check_num_classes(self, num_classes, least=2)
        if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta <= 0:
            raise UserError(f"{self._what()}: beta must be a positive number, got {beta!r}")
        if average_type not in self.AVERAGE_TYPES:
            raise UserError(f"{self._what()}: average_type must be one of {', '.join(self.AVERAGE_TYPES)}, "
                            f"got {average_type!r}")
        self.beta, self.average_type = float(beta), average_type
        self.ignore_labels = list(ignore_labels or [])
        super().__init__(name)

    def reset_state(self) -> None:
        self.confusion_matrix = np.zeros((self.num_classes, self.num_classes))

    def update_on_host(self, labels, predictions, weights=None) -> None:
        labels, predictions = _values(self, "labels", labels), _values(self, "predictions", predictions)
        weights = None if weights is None else _values(self, "weights", weights).astype(np.float64)
        _same_size(self, labels=labels, predictions=predictions, weights=weights)
        counted = (labels >= 0) & (labels < self.num_classes)
        self.confusion_matrix += confusion_matrix(
            labels[counted].astype(np.int64),
            _class_ids(self, "predictions", predictions[counted], self.num_classes),
            self.num_classes, None if weights is None else weights[counted])

    def compute(self) -> float:
        m = self.confusion_matrix
        kept = np.ones(self.num_classes, bool)
        kept[[c for c in self.ignore_labels if 0 <= c < self.num_classes]] = False
        true_positives, predicted, actual = np.diag(m), m.sum(0), m.sum(1)  # (C,) each
        b2 = self.beta**2
        if self.average_type == "micro":
            precision = _divide(true_positives[kept].sum(), predicted[kept].sum())
            recall = _divide(true_positives[kept].sum(), actual[kept].sum())
            return float(_divide((1 + b2) * precision * recall, b2 * precision + recall))
        precision, recall = _divide(true_positives, predicted), _divide(true_positives, actual)  # (C,) each
        per_class = _divide((1 + b2) * precision * recall, b2 * precision + recall)
        return float(per_class[kept].mean()) if kept.any() else 0.0


class RougeScoreMetric(CBMetric):
    """ROUGE-N of extractive summaries: the sentences a model picks against those the labels pick.

    Each example is a document of sentences, each starting at a [CLS] token:
    ``input_ids`` (B, T) its tokens, ``cls_indices`` (B, C) where its sentences start,
    ``cls_weights`` (B, C) 1 for a real sentence and 0 for padding, and ``labels`` and
    ``predictions`` (B, C) 1 for a sentence in the summary. A summary is the words of its
    sentences in order (a sentence runs to the next real [CLS], the last one to the end),
    word pieces joined (``##``), lower-cased, [CLS] [SEP] [PAD] and single punctuation marks
    left out; ``vocab_file`` is the BERT vocab.txt the ids refer to. Over the eval set::

        matched     sum over examples of the n-grams (n = max_n) the two summaries share,
                    each counted min(times in the prediction, times in the labels')
        precision = matched / n-grams of the predicted summaries
        recall    = matched / n-grams of the labels' summaries
        f1_score  = 2 precision recall / (precision + recall)

    ``compute()`` returns the three by name, as the vendor's did; a ratio over no n-grams is
    nan, and f1_score is 0 where precision and recall are both 0. One difference from the
    vendor's: an empty summary has no n-grams here, where the vendor's counted one empty word.
    """

    summed = ("matched_ngrams", "reference_ngrams", "hypothesis_ngrams")
    SKIPPED_WORDS = frozenset({"[cls]", "[sep]", "[pad]"} | set(string.punctuation))

    def __init__(self, vocab_file: str, max_n: int = 1, name: str | None = None):
        from common.data.text.tokenizer import read_vocab_txt  # the tokenizers library, only for this metric

        self._name = name or type(self).__name__  # set early: the checks below name the metric
        if not isinstance(max_n, int) or isinstance(max_n, bool) or max_n < 1:
            raise UserError(f"{self._what()}: max_n must be a whole number of at least 1, got {max_n!r}")
        self.vocab_file, self.max_n = vocab_file, max_n
        self.tokenizer = read_vocab_txt(vocab_file, lowercase=False)
        super().__init__(name)

    def reset_state(self) -> None:
        self.matched_ngrams = 0.0
        self.reference_ngrams = 0.0
        self.hypothesis_ngrams = 0.0

    def update_on_host(self, labels, predictions, cls_indices, cls_weights, input_ids) -> None:
        arrays = {"labels": labels, "predictions": predictions, "cls_indices": cls_indices,
                  "cls_weights": cls_weights, "input_ids": input_ids}
        arrays = {k: _rows(self, k, v) for k, v in arrays.items()}
        shape = arrays["labels"].shape  # (B, C)
        for k in ("predictions", "cls_indices", "cls_weights"):
            if arrays[k].shape != shape:
                raise UserError(f"{self._what()}: {k} has shape {arrays[k].shape} and labels {shape}; both are "
                                f"(batch, sentences)")
        if arrays["input_ids"].shape[0] != shape[0]:
            raise UserError(f"{self._what()}: input_ids holds {arrays['input_ids'].shape[0]} examples and labels "
                            f"{shape[0]}")
        for b in range(shape[0]):
            sentences = self._sentences(arrays["cls_indices"][b], arrays["cls_weights"][b], arrays["input_ids"][b])
            reference = self._ngrams(sentences, arrays["labels"][b])
            hypothesis = self._ngrams(sentences, arrays["predictions"][b])
            self.matched_ngrams += float(sum((reference & hypothesis).values()))
            self.reference_ngrams += float(sum(reference.values()))
            self.hypothesis_ngrams += float(sum(hypothesis.values()))

    def _sentences(self, cls_indices: np.ndarray, cls_weights: np.ndarray, input_ids: np.ndarray) -> list:
        """Per [CLS] slot, the words of its sentence (None for a padding slot)."""
        length = input_ids.shape[0]
        real = np.flatnonzero(cls_weights != 0)
        starts = cls_indices[real].astype(np.int64)
        if ((starts < 0) | (starts >= length)).any():
            raise UserError(f"{self._what()}: cls_indices holds {starts[(starts < 0) | (starts >= length)][0]}, "
                            f"outside the {length} tokens of input_ids")
        sentences: list = [None] * cls_indices.shape[0]
        for k, slot in enumerate(real):
            end = starts[k + 1] if k + 1 < len(starts) else length
            sentences[slot] = self._words(input_ids[starts[k]:end])
        return sentences

    def _words(self, ids: np.ndarray) -> list[str]:
        words: list[str] = []
        for i in ids.tolist():
            token = self.tokenizer.id_to_token(int(i))
            if token is None:
                raise UserError(f"{self._what()}: input_ids holds {i}, outside the vocab of {self.vocab_file}")
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return [w for w in (w.lower() for w in words) if w not in self.SKIPPED_WORDS]

    def _ngrams(self, sentences: list, chosen: np.ndarray) -> Counter:
        words = [w for sentence, pick in zip(sentences, chosen) if sentence is not None and pick != 0
                 for w in sentence]
        n = self.max_n
        return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))

    def compute(self) -> dict[str, float]:
        precision = self.matched_ngrams / self.hypothesis_ngrams if self.hypothesis_ngrams else math.nan
        recall = self.matched_ngrams / self.reference_ngrams if self.reference_ngrams else math.nan
        if precision == 0 and recall == 0:
            f1_score = 0.0
        else:
            f1_score = 2 * precision * recall / (precision + recall)  # nan where either is
        return {"precision": precision, "recall": recall, "f1_score": f1_score}


def _rows(metric: CBMetric, argument: str, value: Any) -> np.ndarray:
    """A (batch, n) argument as a 2-d numpy array of whole numbers."""
    if value is None:
        raise UserError(f"{metric._what()}: {argument} is None")
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.ndim != 2:
        raise UserError(f"{metric._what()}: {argument} must be (batch, n), got shape {array.shape}")
    return array


# --- what the runners do with them ----------------------------------------------------------------


def summed_state(metric: Metric | CBMetric) -> dict[str, Any]:
    """The attributes of ``metric`` that add up over eval batches (``summed``), by name; a vendor
    metric's count of calls with them."""
    fields = getattr(metric, "summed", None)
    if fields is None:
        cls = type(metric)
        try:
            where = f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
        except (OSError, TypeError):
            where = cls.__module__
        raise UserError(f"{where}: metric {cls.__name__} has no 'summed' (the attributes reset zeroes and update "
                        f"adds to), which a data-parallel eval adds up over the processes; name them, e.g. "
                        f"summed = (\"correct\", \"total\")")
    state = {name: getattr(metric, name) for name in fields}
    if isinstance(metric, CBMetric):
        state["_num_updates"] = metric._num_updates
    return state


def set_summed_state(metric: Metric | CBMetric, state: Mapping[str, Any]) -> None:
    """Puts the sums back, each as the type it had (an int stays an int)."""
    for name, value in state.items():
        old = getattr(metric, name)
        if isinstance(old, np.ndarray):
            setattr(metric, name, np.asarray(value, dtype=old.dtype).reshape(old.shape))
        else:  # a number, handed as a 0-d array or a numpy scalar
            value = float(np.asarray(value))
            setattr(metric, name, type(old)(round(value) if isinstance(old, (int, np.integer)) else value))


def report_key(name: str) -> str:
    """The key a metric is reported under: its name without the vendor's "eval/" prefix."""
    return name.removeprefix("eval/")


def cb_metrics_of(model: Any, taken: Iterable[str] = ()) -> dict[str, CBMetric]:
    """Every CBMetric reachable from a PyTorchBaseModel, by report key.

    Looked for in the attributes of the model, of its ``nn.Module`` and of every submodule,
    and in the lists, tuples and dicts held there (the vendor's UNet kept a dict of them).
    Two metrics with one name get suffixes _1, _2, ... as the vendor's did; a name that
    reports as a key in ``taken`` (the loss, the model's own metrics) is an error.
    """
    found: list[CBMetric] = []
    for holder in (model, *model.model.modules()):
        for value in vars(holder).values():
            # dict.values of a dict: looking through params must not count as the model reading them
            items = (dict.values(value) if isinstance(value, dict) else value.values()) if isinstance(value, Mapping) \
                else value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if isinstance(item, CBMetric) and not any(item is seen for seen in found):
                    found.append(item)
    taken = set(taken)
    metrics: dict[str, CBMetric] = {}
    for metric in found:
        key = report_key(metric.name)
        if key in taken:
            raise UserError(f"{metric._what()} reports as {key!r}, which the eval reports already (the loss or "
                            f"one of the model's metrics); give it another name")
        unique, index = key, 0
        while unique in metrics:
            index += 1
            unique = f"{key}_{index}"
        metrics[unique] = metric
    return metrics


@contextlib.contextmanager
def recording_metric_calls() -> Iterator[list[tuple[CBMetric, DeviceOutputs]]]:
    """While open, a CBMetric call records (metric, what update_on_device returned) instead of updating."""
    global _recording
    previous, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = previous


class CapturedMetricCalls:
    """The CBMetric calls of one captured eval step: their tensors as step outputs, replayed on the host.

    ``outputs`` names each tensor a call recorded ("cb_metric:<call>:<leaf>"); the capture
    adds them to the step's outputs. After each step, ``replay`` hands their values (as CPU
    tensors, in the recorded order) to ``update_on_host`` and returns the remaining outputs.
    """

    PREFIX = "cb_metric:"

    def __init__(self, calls: list[tuple[CBMetric, DeviceOutputs]]):
        self.outputs: dict[str, torch.Tensor] = {}
        # per call: the metric, how to rebuild (args, kwargs), and each leaf's output name (None: kept as is)
        self.calls: list[tuple[CBMetric, Any, list[tuple[str | None, Any]]]] = []
        for i, (metric, device_outputs) in enumerate(calls):
            leaves, spec = tree_flatten((device_outputs.args, device_outputs.kwargs))
            named = []
            for j, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor):
                    key = f"{self.PREFIX}{i}:{j}"
                    self.outputs[key] = leaf
                    named.append((key, None))
                else:
                    named.append((None, leaf))
            self.calls.append((metric, spec, named))

    def replay(self, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for metric, spec, named in self.calls:
            leaves = [torch.from_numpy(np.asarray(outputs[key])) if key is not None else value
                      for key, value in named]
            args, kwargs = tree_unflatten(leaves, spec)
            metric._update(args, kwargs)
        return {k: v for k, v in outputs.items() if not k.startswith(self.PREFIX)}

"""The PyTorch capture of an audio model's pieces (device/capture/torch/): a conv1d front end,
group norm, weight-normed convolutions (both of torch's forms), CTC loss in each of its target
forms, and the checks on the data a forward makes in Python (``if labels.max() >= vocab: raise``,
``assert (lengths > 0).all()``), which run on the host on every batch.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.capture.torch import capture, state_of, weights_of  # noqa: E402
from device.passes.validate import validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402
from zoo_base.errors import UserError  # noqa: E402

VOCAB = 6
STEPS_IN = 64  # raw samples per example
BATCH = 3


class AudioCTC(nn.Module):
    """A small DeepSpeech / wav2vec2-style model: conv1d over raw audio, group norm, a weight-normed
    grouped conv (wav2vec2's positional conv, dim=2), an old-style weight-normed conv, a linear head
    and CTC over the frames; the forward checks its labels and lengths in Python."""

    def __init__(self, targets: str = "padded"):
        super().__init__()
        self.targets = targets
        self.front = nn.Conv1d(1, 8, kernel_size=6, stride=3)  # (N, 1, 64) -> (N, 8, 20)
        self.norm = nn.GroupNorm(4, 8)
        self.position = nn.utils.parametrizations.weight_norm(
            nn.Conv1d(8, 8, kernel_size=3, padding=1, groups=2), name="weight", dim=2)
        with pytest.warns(FutureWarning):
            self.mix = nn.utils.weight_norm(nn.Conv1d(8, 8, kernel_size=3, padding=2, dilation=2))
        self.head = nn.Linear(8, VOCAB)
        self.ctc = nn.CTCLoss(blank=0)

    def forward(self, batch):
        audio, labels, frames = batch  # (N, 64), (N, S) with -100 as padding, (N,)
        if labels.max() >= VOCAB:
            raise ValueError(f"labels must be below {VOCAB}")
        assert (frames > 0).all(), "every example needs a frame"
        h = F.gelu(self.norm(self.front(audio[:, None])))  # (N, 8, 20)
        h = h + F.gelu(self.position(h))
        h = self.mix(h)
        log_probs = self.head(h.transpose(1, 2)).log_softmax(-1).transpose(0, 1)  # (T, N, C)
        keep = labels >= 0
        lengths = keep.sum(-1)
        padded = torch.where(keep, labels, 0)  # (N, S): the padding past each length is read by no one
        if self.targets == "padded":  # nn.CTCLoss, (N, S) targets, mean
            return self.ctc(log_probs, padded, frames, lengths)
        if self.targets == "masked":  # transformers' form: labels.masked_select(mask), sum, zero_infinity
            return F.ctc_loss(log_probs, labels.masked_select(keep), frames, lengths, reduction="sum",
                              zero_infinity=True)
        # lengths as Python lists, reduction none
        losses = F.ctc_loss(log_probs, padded, [20, 17, 12], [3, 2, 4], reduction="none")
        return (losses * torch.tensor([1.0, 2.0, 0.5])).sum()


def audio_batch(seed=0, labels=None, frames=(20, 17, 12)):
    g = torch.Generator().manual_seed(seed)
    audio = torch.randn(BATCH, STEPS_IN, generator=g)
    if labels is None:
        labels = torch.tensor([[1, 2, 2, -100], [3, 5, -100, -100], [4, 1, 1, 2]])
    return [audio, labels, torch.tensor(frames)]


def line_of(text: str) -> int:
    source, first = inspect.getsourcelines(AudioCTC.forward)
    return first + next(i for i, line in enumerate(source) if text in line)


def matches_torch(model, graph, batch, rtol=1e-5):
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    loss, grads = program.gradients([t.numpy() for t in batch])
    model.zero_grad()
    expected = model(batch)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=rtol)
    for name, p in model.named_parameters():  # each weight's gradient relative to its largest (the gallery's)
        expected_grad = p.grad.numpy()
        assert np.abs(grads[name] - expected_grad).max() <= rtol * np.abs(expected_grad).max(), name
    return program


@pytest.mark.parametrize("targets", ["padded", "masked", "lists"])
def test_an_audio_model_with_ctc_captures_and_matches_torch(targets):
    torch.manual_seed(0)
    model = AudioCTC(targets)
    batch = audio_batch()
    graph = capture(model, model, batch)
    assert validate(graph, mode="train", profile=None).ok
    ops = [n.op for n in graph.nodes]
    assert ops.count("ctc_loss") == 1 and ops.count("conv2d") == 3 and ops.count("layer_norm") == 1
    # both weight norms are their parameters' arithmetic: g and v of each are the weights
    assert {"position.parametrizations.weight.original0", "position.parametrizations.weight.original1",
            "mix.weight_g", "mix.weight_v"} <= set(graph.params)
    matches_torch(model, graph, batch)


def test_a_check_on_the_data_runs_on_the_host_on_every_batch():
    torch.manual_seed(0)
    model = AudioCTC()
    graph = capture(model, model, audio_batch())
    checks = [n for n in graph.nodes if n.op == "host_check"]
    assert [(n.loc.line, n.attrs["expected"]) for n in checks] == [
        (line_of("if labels.max() >= VOCAB"), False), (line_of("assert (frames > 0).all()"), True)]
    program = matches_torch(model, graph, audio_batch(seed=1))  # another batch that passes both
    file = inspect.getsourcefile(AudioCTC)
    bad_label = audio_batch(labels=torch.tensor([[1, 2, 6, -100], [3, 5, -100, -100], [4, 1, 1, 2]]))
    with pytest.raises(UserError) as error:
        program.gradients([t.numpy() for t in bad_label])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{file}:{line_of('if labels.max() >= VOCAB')} ")
    assert "`if labels.max() >= VOCAB:` is True on this batch and was False" in message
    with pytest.raises(UserError, match=rf":{line_of('assert (frames > 0)')} .*`assert \(frames > 0\).all\(\), "
                                        r"\"every example needs a frame\"` is False on this batch"):
        program.gradients([t.numpy() for t in audio_batch(frames=(20, 0, 12))])


def test_the_run_on_the_batch_leaves_the_buffers_and_the_generators_as_they_were():
    class Checked(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.drop = nn.Dropout(0.5)

        def forward(self, batch):
            x, y = batch
            if (y < 0).any():
                raise ValueError("negative target")
            return ((self.drop(self.bn(x)) - y) ** 2).mean()

    model = Checked()
    torch.manual_seed(3)
    graph = capture(model, model, [torch.randn(5, 4) + 3, torch.zeros(5, 4)])
    assert [n.op for n in graph.nodes].count("host_check") == 1
    np.testing.assert_array_equal(model.bn.running_mean.numpy(), np.zeros(4))
    assert int(model.bn.num_batches_tracked) == 0
    after = torch.rand(3)
    torch.manual_seed(3)
    torch.randn(5, 4)
    torch.testing.assert_close(after, torch.rand(3))  # the capture drew nothing from torch's generator


def test_a_step_that_fails_its_own_check_on_the_capture_batch_is_one_line():
    model = AudioCTC()
    batch = audio_batch(labels=torch.tensor([[1, 9, 2, -100], [3, 5, -100, -100], [4, 1, 1, 2]]))
    with pytest.raises(UserError) as error:
        capture(model, model, batch)
    message = str(error.value)
    assert "\n" not in message and message.count(".py:") == 1
    assert message.startswith(f"{inspect.getsourcefile(AudioCTC)}:{line_of('raise ValueError')}: ")
    assert "the step fails on the batch it is captured with: labels must be below 6" in message


def test_a_value_read_from_a_tensor_is_still_refused_at_its_line():
    class Item(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, batch):
            x, n = batch
            if n.max().item() > 2:  # a Python number, not a tensor: no host check takes it
                x = x * 2
            return self.fc(x).sum()

    model = Item()
    with pytest.raises(UserError, match=r"if n\.max\(\)\.item\(\) > 2:.*could not capture.*data-dependent"):
        capture(model, model, [torch.randn(3, 4), torch.tensor([2])])


def test_a_transposed_conv1d_is_refused_with_its_reason():
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose1d(2, 2, 2, stride=2)

        def forward(self, batch):
            return self.up(batch[0]).sum()

    model = Up()
    graph = capture(model, model, [torch.randn(2, 2, 5)])
    report = validate(graph, mode="train", profile=None)
    assert any("transposed 1-d convolution" in f.message for f in report.errors)


def test_transformers_wav2vec2_for_ctc_captures_with_its_labels_check_on_the_host():
    pytest.importorskip("transformers")
    from tests.gallery import transformers_audio

    spec = transformers_audio.MODELS["Wav2Vec2ForCTC"]
    torch.manual_seed(0)
    model = spec.build()
    (good, other) = transformers_audio.batches(spec, 2)
    batch = [torch.from_numpy(good["input_values"]), torch.from_numpy(good["labels"])]

    def step(b):
        return model(input_values=b[0], labels=b[1]).loss

    graph = capture(step, model, batch)
    assert validate(graph, mode="train", profile=None).ok
    (check,) = [n for n in graph.nodes if n.op == "host_check"]
    assert check.loc.call == "if labels is not None and labels.max() >= self.config.vocab_size:"
    assert [n.op for n in graph.nodes].count("ctc_loss") == 1
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    loss, _ = program.gradients([other["input_values"], other["labels"]])  # another batch, the same branch
    expected = step([torch.from_numpy(other["input_values"]), torch.from_numpy(other["labels"])]).item()
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    labels = other["labels"].copy()
    labels[0, 0] = transformers_audio.VOCAB
    with pytest.raises(UserError, match=r"modeling_wav2vec2\.py:\d+ \(bool\(Tensor\)\): `if labels is not None and "
                                        r"labels\.max\(\) >= self\.config\.vocab_size:` is True on this batch"):
        program.gradients([other["input_values"], labels])

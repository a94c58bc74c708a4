"""The vendor's variable tensor shapes here: ``cbtorch.nn.StripPadding`` zero-fills the padded positions, so a
model that masks them (as the vendor's BERT, T5 and Transformer do) trains with ``model.enable_vts: true``
exactly as without it, on the CPU and on the emulator."""

import argparse

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common.errors import UserError
from common.params import load_params
from common.pytorch import cbtorch
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.runner import FrameworkSteps, Runner
from tests.pytorch.recording import recording

VOCAB, WIDTH, LENGTH, EXAMPLES = 13, 8, 6, 8


def test_strip_padding_keeps_the_unmasked_positions_and_zero_fills_the_rest():
    strip = cbtorch.nn.StripPadding()
    assert isinstance(strip, cbtorch.nn.StripPadding) and isinstance(strip, torch.nn.Module)
    ids = torch.tensor([[5, 6, 7, 9], [3, 4, 8, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = strip(ids, mask)
    assert out.dtype == torch.int64 and out.tolist() == [[5, 6, 7, 0], [3, 4, 0, 0]]
    hidden = torch.randn(2, 4, 3, dtype=torch.float16)  # a mask of (B, T) over (B, T, H)
    out = strip(hidden, mask)
    assert out.dtype == torch.float16 and torch.equal(out[mask.bool()], hidden[mask.bool()])
    assert not out[~mask.bool()].any()


def test_strip_padding_refuses_a_mask_that_does_not_lead_the_tensor_in_one_line():
    with pytest.raises(UserError, match=r"^cbtorch\.nn\.StripPadding: a mask of shape \(2, 3\) for a tensor of "
                                        r"shape \(2, 4\); the mask's shape must lead the tensor's$"):
        cbtorch.nn.StripPadding()(torch.zeros(2, 4), torch.ones(2, 3))


def test_any_other_system_layer_is_one_line_naming_it():
    with pytest.raises(UserError, match=r"^cbtorch\.nn\.Fused is the vendor's system software"):
        cbtorch.nn.Fused


class Tagger(torch.nn.Module):
    """Embeddings, one attention layer whose keys are masked, a per-token head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.query = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, attention_mask):
        x = self.embed(input_ids)
        scores = self.query(x) @ x.transpose(1, 2) / WIDTH ** 0.5
        scores = scores + (1.0 - attention_mask[:, None, :].to(x.dtype)) * -1e4
        return self.head(torch.softmax(scores, -1) @ x)


class VtsModel(PyTorchBaseModel):
    """The vendor's pattern: StripPadding on the inputs and the labels when enable_vts, a loss weighted by the mask."""

    def __init__(self, params, device):
        torch.manual_seed(0)
        self.vts = cbtorch.nn.StripPadding() if params["model"]["enable_vts"] else None
        super().__init__(params, Tagger(), device)

    def __call__(self, data):
        if self.vts:
            for name in ("input_ids", "labels"):
                data[name] = self.vts(data[name], data["attention_mask"])
        logits = self.model(data["input_ids"], data["attention_mask"])
        losses = F.cross_entropy(logits.transpose(1, 2), data["labels"], reduction="none")
        weights = data["attention_mask"].to(losses.dtype)
        return (losses * weights).sum() / weights.sum()


class Examples(Dataset):
    """Sequences of 2 to LENGTH tokens; the padding holds tokens and labels that are not 0, as a loader may leave
    them, so that StripPadding has something to strip."""

    def __len__(self):
        return EXAMPLES

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        mask = (torch.arange(LENGTH) < 2 + index % (LENGTH - 1)).long()
        return {"input_ids": torch.randint(1, VOCAB, (LENGTH,), generator=generator), "attention_mask": mask,
                "labels": torch.randint(1, VOCAB, (LENGTH,), generator=generator)}


def loader(params):
    return DataLoader(Examples(), batch_size=4, shuffle=True)


def train(model_dir, device, enable_vts):
    params = load_params(None, {"model": {"enable_vts": enable_vts},
                                "optimizer": {"optimizer_type": "adam", "learning_rate": 0.05},
                                "runconfig": {"model_dir": str(model_dir), "max_steps": 4, "log_steps": 4,
                                              "checkpoint_steps": 4, "seed": 1}})
    backend = recording(EmulatorSteps if device == "emulator" else FrameworkSteps)
    runner = Runner(argparse.Namespace(mode="train", device=device, checkpoint_path=None), params, VtsModel,
                    loader, loader, backend)
    runner.execute()
    return runner.steps.losses


def test_a_masked_model_trains_with_vts_as_without_on_the_cpu_and_on_the_emulator(tmp_path):
    plain = train(tmp_path / "plain", "cpu", False)
    vts = train(tmp_path / "vts", "cpu", True)
    emulated = train(tmp_path / "emulated", "emulator", True)
    assert len(plain) == 4 and vts == plain  # the padded positions are masked out: nothing changes
    assert emulated == pytest.approx(vts, abs=1e-5)

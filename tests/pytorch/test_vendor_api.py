"""The vendor's API that folders of the vendor's zoo import, once ``zoo port migrate`` has pointed them at
this zoo: the package's names (common/pytorch/vendor_api.py), get_params and BufferedShuffleDataset
(common/pytorch/utils.py) and RougeScoreMetric (common/pytorch/metrics.py), each against what the
vendor's zoo did without its system, computed here by hand."""

import math
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.errors import UserError
from common.folder import import_beside
from common.port.migrate import migrate
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import RougeScoreMetric
from common.pytorch.run import run
from common.pytorch.utils import BufferedShuffleDataset, get_params
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a vendor folder importing every name the vendor's transformers folders take from its common.pytorch
VENDOR_FOLDER = {
    "__init__.py": "",
    "names.py": (
        "from modelzoo.common.pytorch import cb_model as cm\n"
        "from modelzoo.common.pytorch import AP_DISABLED, cbtorch\n"
        "from modelzoo.common.pytorch import amp, modes, name_scope\n"
        "from modelzoo.common.pytorch.metrics import AccuracyMetric, FBetaScoreMetric, PerplexityMetric\n"
        "from modelzoo.common.pytorch.metrics import RougeScoreMetric\n"
        "from modelzoo.common.pytorch.utils import BufferedShuffleDataset, get_params\n"
        "from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel\n"
        "from modelzoo.common.pytorch.run_utils import run\n"
        "\n"
        "\n"
        "def mode_for(is_training):\n"
        "    return modes.TRAIN if is_training else modes.EVAL\n"
        "\n"
        "\n"
        "def stack_params():\n"
        "    if cm.use_cs():\n"
        "        cbtorch.state().autogen_policy = AP_DISABLED\n"
        "    with name_scope('head'):\n"
        "        return amp.get_init_params()\n"),
}


def test_a_migrated_folder_finds_every_vendor_name_here(tmp_path):
    src = tmp_path / "vendor_folder"
    src.mkdir()
    for name, text in VENDOR_FOLDER.items():
        (src / name).write_text(text)
    migration = migrate(str(src), str(tmp_path / "migrated"))
    assert migration.left == []  # no import left that names something this zoo lacks
    names = import_beside(str(tmp_path / "migrated" / "run.py"), "names")
    assert names.mode_for(True) == "train" and names.mode_for(False) == "eval"
    assert names.stack_params() == {}  # off the system: no stack flags, no amp settings


def test_the_modes_are_the_vendors():
    from common.pytorch import modes

    assert modes.get_modes() == ("train", "eval", "train_and_eval", "inference")
    assert modes.is_valid("train_and_eval") and not modes.is_valid("eval_all")


def test_cbtorch_is_one_line_naming_what_was_asked():
    from common.pytorch import cbtorch

    assert cbtorch.nn.StripPadding is cbtorch.nn.StripPadding  # variable tensor shapes: test_vendor_strip_padding.py
    with pytest.raises(UserError, match=r"^cbtorch\.state is the vendor's system software"):
        cbtorch.state()
    assert not hasattr(cbtorch, "__wrapped__")  # Python's probes still get AttributeError


def test_the_vendor_names_load_no_torch_before_the_wait_policy():
    code = "import sys, common.pytorch as p; p.cbtorch, p.modes, p.amp, p.name_scope, p.AP_DISABLED; " \
           "print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# --- get_params -----------------------------------------------------------------------------------

def test_get_params_reads_the_file_as_written_and_picks_a_config(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("small:\n  model:\n    hidden_size: 8\nlarge:\n  model:\n    hidden_size: 64\n")
    assert get_params(str(path)) == {"small": {"model": {"hidden_size": 8}}, "large": {"model": {"hidden_size": 64}}}
    assert get_params(str(path), config="large") == {"model": {"hidden_size": 64}}
    with pytest.raises(UserError, match=r"params\.yaml: no config 'medium' \(it has 'small', 'large'\)"):
        get_params(str(path), config="medium")
    with pytest.raises(UserError, match=r"missing\.yaml: params file not found"):
        get_params(str(tmp_path / "missing.yaml"))


# --- BufferedShuffleDataset -----------------------------------------------------------------------

class Recorded(torch.utils.data.IterableDataset):
    """range(n), recording how many items were read when each one is yielded downstream."""

    def __init__(self, n):
        self.n, self.read = n, 0

    def __iter__(self):
        for i in range(self.n):
            self.read = i + 1
            yield i

    def __len__(self):
        return self.n


def _shuffled(n, buffer_size, seed):
    source = Recorded(n)
    random.seed(seed)
    out, held = [], []
    for item in BufferedShuffleDataset(source, buffer_size):
        out.append(item)
        held.append(source.read - (len(out) - 1))  # items read and not yet yielded, this one included
    return out, held


@pytest.mark.parametrize("buffer_size", [2, 5, 16])
def test_buffered_shuffle_holds_at_most_its_buffer(buffer_size):
    n = 40
    out, held = _shuffled(n, buffer_size, seed=3)
    assert sorted(out) == list(range(n))  # every item once
    assert out != list(range(n))
    assert max(held) == buffer_size + 1  # the buffer and the item that replaces the one yielded
    # nothing comes out before the buffer is full, and item i no earlier than position i - buffer_size + 1
    assert held[0] == buffer_size + 1
    assert all(item < position + buffer_size for position, item in enumerate(out))


def test_buffered_shuffle_of_one_keeps_the_order_and_a_full_buffer_shuffles_everything():
    assert _shuffled(30, 1, seed=0)[0] == list(range(30))
    whole, held = _shuffled(30, 30, seed=0)
    assert held[0] == 30 and sorted(whole) == list(range(30))  # all read first: any item may come first
    assert whole[0] != 0 or whole[1] != 1


def test_buffered_shuffle_repeats_with_the_seed_and_has_the_datasets_length():
    assert _shuffled(50, 7, seed=11)[0] == _shuffled(50, 7, seed=11)[0]
    assert _shuffled(50, 7, seed=11)[0] != _shuffled(50, 7, seed=12)[0]
    assert len(BufferedShuffleDataset(Recorded(9), 4)) == 9
    loader = torch.utils.data.DataLoader(BufferedShuffleDataset(Recorded(10), 3), batch_size=4, drop_last=True)
    assert [b.shape[0] for b in loader] == [4, 4]


def test_buffered_shuffle_refuses_an_empty_buffer():
    with pytest.raises(UserError, match=r"buffer_size must be a whole number of at least 1 \(the input's "
                                        r"shuffle_buffer\), got 0"):
        BufferedShuffleDataset(Recorded(3), 0)


# --- RougeScoreMetric -----------------------------------------------------------------------------

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "dog", "ran", "##s", ".", ",", "Mat"]
ID = {token: i for i, token in enumerate(VOCAB)}


def _document(sentences, length):
    """input_ids (length,) and cls_indices (len(sentences),) of [CLS] s [SEP] [CLS] s [SEP] ... [PAD]..."""
    ids, starts = [], []
    for sentence in sentences:
        starts.append(len(ids))
        ids += [ID["[CLS]"], *(ID[t] for t in sentence.split()), ID["[SEP]"]]
    return ids + [ID["[PAD]"]] * (length - len(ids)), starts


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


def _batch():
    """Two documents; four [CLS] slots each, the last slot of the first one padding (weight 0)."""
    doc0, cls0 = _document(["the cat sat .", "the dog ran ##s", "cat ##s sat , Mat"], length=24)
    doc1, cls1 = _document(["dog ran", "the Mat", "dog sat", "cat ran"], length=24)
    input_ids = torch.tensor([doc0, doc1])
    cls_indices = torch.tensor([cls0 + [0], cls1])
    cls_weights = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    labels = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]])
    predictions = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])  # slot 3 of document 0 is padding: not counted
    return labels, predictions, cls_indices, cls_weights, input_ids


def test_rouge_1_and_2_are_the_hand_counted_ngrams(vocab_file):
    # document 0: labels pick "the cat sat" + "cats sat mat" (punctuation, [CLS] and [SEP] dropped,
    # ##s joined, lower-cased); predictions "the cat sat" + "the dog rans"
    #   unigrams  reference the cat sat cats sat mat (6)   hypothesis the cat sat the dog rans (6)   shared: the cat sat (3)
    #   bigrams   reference the-cat cat-sat sat-cats cats-sat sat-mat (5)
    #             hypothesis the-cat cat-sat sat-the the-dog dog-rans (5)                            shared: 2
    # document 1: labels "the mat" + "cat ran"; predictions "the mat" + "dog sat"
    #   unigrams  4 and 4, shared the mat (2);  bigrams  the-mat mat-cat cat-ran (3) and the-mat mat-dog dog-sat (3), shared 1
    rouge1 = RougeScoreMetric(vocab_file, max_n=1, name="eval/rouge1")
    rouge2 = RougeScoreMetric(vocab_file, max_n=2, name="eval/rouge2")
    rouge1(*_batch())
    rouge2(*_batch())
    r1, r2 = rouge1.compute(), rouge2.compute()
    assert (rouge1.matched_ngrams, rouge1.reference_ngrams, rouge1.hypothesis_ngrams) == (5, 10, 10)
    assert r1 == pytest.approx({"precision": 0.5, "recall": 0.5, "f1_score": 0.5})
    assert (rouge2.matched_ngrams, rouge2.reference_ngrams, rouge2.hypothesis_ngrams) == (3, 8, 8)
    assert r2 == pytest.approx({"precision": 3 / 8, "recall": 3 / 8, "f1_score": 3 / 8})
    assert rouge1.name == "eval/rouge1" and rouge1.num_updates == 1


def test_rouge_adds_up_over_batches_and_resets(vocab_file):
    rouge = RougeScoreMetric(vocab_file)
    labels, predictions, cls_indices, cls_weights, input_ids = _batch()
    rouge(labels[:1], predictions[:1], cls_indices[:1], cls_weights[:1], input_ids[:1])
    rouge(labels[1:], predictions[1:], cls_indices[1:], cls_weights[1:], input_ids[1:])
    p, r = 5 / 10, 5 / 10
    assert rouge.compute() == pytest.approx({"precision": p, "recall": r, "f1_score": 2 * p * r / (p + r)})
    # only document 0, predicted as it is labelled: everything matches
    rouge.reset()
    rouge(labels[:1], labels[:1], cls_indices[:1], cls_weights[:1], input_ids[:1])
    assert rouge.compute() == {"precision": 1.0, "recall": 1.0, "f1_score": 1.0}


def test_rouge_of_nothing_picked(vocab_file):
    rouge = RougeScoreMetric(vocab_file)
    labels, _, cls_indices, cls_weights, input_ids = _batch()
    rouge(labels, torch.zeros_like(labels), cls_indices, cls_weights, input_ids)
    result = rouge.compute()
    assert math.isnan(result["precision"]) and result["recall"] == 0.0 and math.isnan(result["f1_score"])
    assert rouge.hypothesis_ngrams == 0  # an empty summary has no n-grams (not one empty word)


def test_rouge_bad_arguments_are_one_line(vocab_file, tmp_path):
    labels, predictions, cls_indices, cls_weights, input_ids = _batch()
    rouge = RougeScoreMetric(vocab_file, name="eval/rouge1")
    with pytest.raises(UserError, match=r"RougeScoreMetric 'eval/rouge1': predictions has shape \(2, 3\) and labels "
                                        r"\(2, 4\)"):
        rouge(labels, predictions[:, :3], cls_indices, cls_weights, input_ids)
    with pytest.raises(UserError, match=r"input_ids holds 99, outside the vocab of .*vocab\.txt"):
        rouge(labels, predictions, cls_indices, cls_weights, torch.full_like(input_ids, 99))
    with pytest.raises(UserError, match=r"cls_indices holds 30, outside the 24 tokens of input_ids"):
        rouge(labels, predictions, cls_indices + 30 * (cls_indices == 0), cls_weights, input_ids)
    with pytest.raises(UserError, match=r"max_n must be a whole number of at least 1, got 0"):
        RougeScoreMetric(vocab_file, max_n=0)
    with pytest.raises(UserError, match=r"no such vocab file"):
        RougeScoreMetric(str(tmp_path / "absent.txt"))


def test_rouge_takes_numpy_arguments_as_tensors(vocab_file):
    a, b = RougeScoreMetric(vocab_file, max_n=2), RougeScoreMetric(vocab_file, max_n=2)
    batch = _batch()
    a.update_on_host(*batch)
    b.update_on_host(*(np.asarray(x) for x in batch))
    assert a.compute() == b.compute()


# --- the runner reports the vendor's dict-valued metric as one scalar per score --------------------

class PickedSentences(PyTorchBaseModel):
    """A vendor-style summarizer whose picks are the batch's "predictions", so that the eval's ROUGE is the
    hand-counted one above; the loss trains a bias."""

    def __init__(self, params, device):
        super().__init__(params, torch.nn.Linear(1, 1), device)
        self.rouge1 = RougeScoreMetric(params["model"]["vocab_file"], max_n=1, name="eval/rouge1")
        self.rouge2 = RougeScoreMetric(params["model"]["vocab_file"], max_n=2, name="eval/rouge2")

    def __call__(self, data):
        loss = self.model(data["cls_weights"].float().sum(1, keepdim=True)).pow(2).mean()
        if not self.model.training:
            batch = (data["labels"], data["predictions"], data["cls_indices"], data["cls_weights"], data["input_ids"])
            self.rouge1(*batch)
            self.rouge2(*batch)
        return loss


def _picked_data(params):
    labels, predictions, cls_indices, cls_weights, input_ids = _batch()
    examples = [{"labels": labels[i], "predictions": predictions[i], "cls_indices": cls_indices[i],
                 "cls_weights": cls_weights[i], "input_ids": input_ids[i]} for i in range(2)]
    return torch.utils.data.DataLoader(examples, batch_size=1)


def test_the_runner_reports_each_rouge_score(vocab_file, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"model:\n  vocab_file: {vocab_file}\nrunconfig:\n  max_steps: 1\n  checkpoint_steps: 1\n")
    results = run(PickedSentences, _picked_data, _picked_data,
                  argv=["--params", str(params), "--model_dir", str(tmp_path / "run"), "--mode", "train_and_eval"])
    assert {k: v for k, v in results.items() if k.startswith("rouge")} == pytest.approx({
        "rouge1/precision": 0.5, "rouge1/recall": 0.5, "rouge1/f1_score": 0.5,
        "rouge2/precision": 3 / 8, "rouge2/recall": 3 / 8, "rouge2/f1_score": 3 / 8})
    written = read_scalars(str(tmp_path / "run" / "eval"))
    assert written["rouge2/recall"] == [(1, pytest.approx(3 / 8))]

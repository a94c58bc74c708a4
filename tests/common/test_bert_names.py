"""common/bert_names.py: BERT's names in both frameworks, reading either checkpoint, size checks."""

import sys

import numpy as np
import pytest

from common.bert_names import (
    NAMES, check_compatible, read_bert_weights, tf_name_to_torch, torch_name_to_tf, torch_names,
)
from common.errors import UserError

VOCAB, HIDDEN, FILTER, POSITIONS, TYPES, CLASSES = 11, 4, 6, 9, 2, 3


def shapes(layers=2, hidden=HIDDEN, filter_size=FILTER, vocab=VOCAB, classifier=False) -> dict[str, tuple]:
    """The torch shapes of a BERT of this size, written out here independently of the module."""
    s = {
        "bert.embeddings.word_embeddings.weight": (vocab, hidden),
        "bert.embeddings.position_embeddings.weight": (POSITIONS, hidden),
        "bert.embeddings.token_type_embeddings.weight": (TYPES, hidden),
        "bert.embeddings.LayerNorm.weight": (hidden,), "bert.embeddings.LayerNorm.bias": (hidden,),
    }
    for i in range(layers):
        p = f"bert.encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            s[p + part + ".weight"], s[p + part + ".bias"] = (hidden, hidden), (hidden,)
        s[p + "attention.output.LayerNorm.weight"] = s[p + "attention.output.LayerNorm.bias"] = (hidden,)
        s[p + "intermediate.dense.weight"], s[p + "intermediate.dense.bias"] = (filter_size, hidden), (filter_size,)
        s[p + "output.dense.weight"], s[p + "output.dense.bias"] = (hidden, filter_size), (hidden,)
        s[p + "output.LayerNorm.weight"] = s[p + "output.LayerNorm.bias"] = (hidden,)
    s["bert.pooler.dense.weight"], s["bert.pooler.dense.bias"] = (hidden, hidden), (hidden,)
    s["cls.predictions.transform.dense.weight"] = (hidden, hidden)
    s["cls.predictions.transform.dense.bias"] = (hidden,)
    s["cls.predictions.transform.LayerNorm.weight"] = s["cls.predictions.transform.LayerNorm.bias"] = (hidden,)
    s["cls.predictions.bias"] = (vocab,)
    s["cls.seq_relationship.weight"], s["cls.seq_relationship.bias"] = (2, hidden), (2,)
    if classifier:
        s["classifier.weight"], s["classifier.bias"] = (CLASSES, hidden), (CLASSES,)
    return s


def random_weights(seed=0, **size) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes(**size).items()}


# --- names --------------------------------------------------------------------------------

def test_every_name_of_two_layers_round_trips():
    names = torch_names(2, heads=True, classifier=True)
    assert names == list(shapes(classifier=True))  # the same set, in the order of the model's modules
    assert len(names) == 5 + 2 * 16 + 2 + 7 + 2
    tf_names = set()
    for name in names:
        tf_name, transpose = torch_name_to_tf(name)
        assert tf_name_to_torch(tf_name) == (name, transpose)
        tf_names.add(tf_name)
    assert len(tf_names) == len(names)
    assert torch_names(2) == [n for n in names if not n.startswith("classifier.")]
    assert torch_names(1, heads=False) == [n for n in shapes(layers=1) if n.startswith("bert.")]


@pytest.mark.parametrize("tf_name, torch_name, transpose", [
    ("bert/embeddings/word_embeddings", "bert.embeddings.word_embeddings.weight", False),
    ("bert/embeddings/LayerNorm/gamma", "bert.embeddings.LayerNorm.weight", False),
    ("bert/embeddings/LayerNorm/beta", "bert.embeddings.LayerNorm.bias", False),
    ("bert/encoder/layer_11/attention/self/query/kernel", "bert.encoder.layer.11.attention.self.query.weight", True),
    ("bert/encoder/layer_0/attention/output/dense/bias", "bert.encoder.layer.0.attention.output.dense.bias", False),
    ("bert/encoder/layer_3/intermediate/dense/kernel", "bert.encoder.layer.3.intermediate.dense.weight", True),
    ("bert/encoder/layer_3/output/LayerNorm/gamma", "bert.encoder.layer.3.output.LayerNorm.weight", False),
    ("bert/pooler/dense/kernel", "bert.pooler.dense.weight", True),
    ("cls/predictions/transform/dense/kernel", "cls.predictions.transform.dense.weight", True),
    ("cls/predictions/output_bias", "cls.predictions.bias", False),
    ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", False),  # [2, H] as Google made it
    ("output_weights", "classifier.weight", False),  # run_classifier.py: [num_labels, H]
    ("output_bias", "classifier.bias", False),
])
def test_google_and_hugging_face_names(tf_name, torch_name, transpose):
    assert tf_name_to_torch(tf_name) == (torch_name, transpose)
    assert torch_name_to_tf(torch_name) == (tf_name, transpose)


@pytest.mark.parametrize("name", ["global_step", "bert/encoder/layer_0/attention/self/query/kernel/adam_m",
                                  "bert/encoder/layer_x/output/dense/kernel", "bert.embeddings.word_embeddings"])
def test_unknown_names_are_refused(name):
    convert = tf_name_to_torch if "/" in name or name == "global_step" else torch_name_to_tf
    with pytest.raises(UserError, match="not a (TF|PyTorch) BERT"):
        convert(name)


def test_only_dense_kernels_are_transposed():
    transposed = {tf for tf, _, transpose in NAMES if transpose}
    assert transposed == {tf for tf, _, _ in NAMES if tf.endswith("/kernel")}


# --- reading checkpoints --------------------------------------------------------------------

def write_mdl(torch, weights, path, extra=None):
    model = {name: torch.from_numpy(value) for name, value in weights.items()}
    model.update(extra or {})
    torch.save({"model": model, "optimizer": {}, "lr_scheduler": {}, "global_step": 3}, path)


def test_reads_a_zoo_pytorch_checkpoint(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    weights = random_weights(classifier=True)
    # the tied MLM decoder as Hugging Face's state_dict holds it, and a buffer: not weights to load
    extra = {"cls.predictions.decoder.weight": torch.from_numpy(weights["bert.embeddings.word_embeddings.weight"]),
             "bert.embeddings.position_ids": torch.arange(POSITIONS)}
    write_mdl(torch, weights, tmp_path / "checkpoint_3.mdl", extra)
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # reading PyTorch's format never imports TF
    for path in (tmp_path / "checkpoint_3.mdl", tmp_path):  # the file, or the model_dir's newest
        read = read_bert_weights(str(path))
        assert sorted(read) == sorted(weights)
        for name, value in weights.items():
            assert read[name].dtype == np.float32
            np.testing.assert_array_equal(read[name], value)


def test_reads_a_state_dict_of_old_hugging_face_names(tmp_path):
    torch = pytest.importorskip("torch")
    weights = random_weights(layers=1)
    old = {"module." + n.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
           torch.from_numpy(v) for n, v in weights.items()}
    torch.save(old, tmp_path / "pytorch_model.bin")
    read = read_bert_weights(str(tmp_path / "pytorch_model.bin"))
    assert sorted(read) == sorted(weights)
    np.testing.assert_array_equal(read["bert.embeddings.LayerNorm.weight"], weights["bert.embeddings.LayerNorm.weight"])
    # a bare BertModel's state_dict: the same names without "bert."
    encoder = {n: v for n, v in weights.items() if n.startswith("bert.")}
    torch.save({n.removeprefix("bert."): torch.from_numpy(v) for n, v in encoder.items()}, tmp_path / "encoder.pt")
    assert sorted(read_bert_weights(str(tmp_path / "encoder.pt"))) == sorted(encoder)


def write_tf_checkpoint(tf, weights, prefix):
    """Google's layout, written by a v1 Saver as the zoo's TF runner and Google's BERT do,
    with the optimizer's slots and the step counter beside the weights."""
    with tf.Graph().as_default():
        for name, value in weights.items():
            tf_name, transpose = torch_name_to_tf(name)
            tf.compat.v1.Variable(value.T if transpose else value, name=tf_name)
            tf.compat.v1.Variable(np.zeros_like(value.T if transpose else value), name=tf_name + "/adam_m")
        tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, prefix, global_step=5)


def test_reads_a_tf_checkpoint_in_torch_naming_and_layout(tmp_path, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    weights = random_weights(classifier=True)
    prefix = write_tf_checkpoint(tf, weights, str(tmp_path / "model.ckpt"))
    assert prefix.endswith("model.ckpt-5")
    monkeypatch.setitem(sys.modules, "torch", None)  # reading TF's format never imports torch
    for path in (prefix, prefix + ".index", str(tmp_path)):
        read = read_bert_weights(path)
        assert sorted(read) == sorted(weights)  # slots and global_step skipped
        for name, value in weights.items():
            np.testing.assert_array_equal(read[name], value)


def test_a_missing_framework_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "checkpoint_1.mdl").write_bytes(b"")
    (tmp_path / "model.ckpt-1.index").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(UserError, match="needs torch, which is not installed"):
        read_bert_weights(str(tmp_path / "checkpoint_1.mdl"))
    with pytest.raises(UserError, match="needs TensorFlow, which is not installed"):
        read_bert_weights(str(tmp_path / "model.ckpt-1"))


def test_bad_paths(tmp_path):
    with pytest.raises(UserError, match="no such checkpoint"):
        read_bert_weights(str(tmp_path / "nothing.mdl"))
    with pytest.raises(UserError, match="holds no checkpoint"):
        read_bert_weights(str(tmp_path))
    (tmp_path / "weights.txt").write_text("hello")
    with pytest.raises(UserError, match="not a checkpoint format BERT reads"):
        read_bert_weights(str(tmp_path / "weights.txt"))


def test_a_checkpoint_of_another_model_holds_no_bert_weight(tmp_path):
    torch = pytest.importorskip("torch")
    write_mdl(torch, {}, tmp_path / "checkpoint_1.mdl", {"conv1.weight": torch.zeros(2, 1, 3, 3)})
    with pytest.raises(UserError, match=r"checkpoint_1.mdl: holds no BERT weight \(it holds conv1.weight"):
        read_bert_weights(str(tmp_path / "checkpoint_1.mdl"))
    (tmp_path / "damaged.mdl").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="damaged.mdl: not a readable checkpoint"):
        read_bert_weights(str(tmp_path / "damaged.mdl"))


# --- size checks --------------------------------------------------------------------------

def test_a_checkpoint_of_the_same_size_fits_without_its_heads():
    weights = random_weights()
    check_compatible(weights, shapes(classifier=True))  # the classifier starts fresh
    encoder = {n: v for n, v in weights.items() if n.startswith("bert.")}
    check_compatible(encoder, shapes(classifier=True))  # so do the MLM and NSP heads


@pytest.mark.parametrize("size, message", [
    (dict(hidden=8), r"the checkpoint has hidden size 8, this model 4 \(bert.embeddings.word_embeddings.weight "
                     r"is 11x8 there, 11x4 here\)"),
    (dict(vocab=13), r"the checkpoint has vocab size 13, this model 11"),
    (dict(filter_size=7), r"the checkpoint has filter size 7, this model 6 \(bert.encoder.layer.0.intermediate"),
    (dict(layers=3), r"the checkpoint has 3 encoder layers, this model 2"),
    (dict(layers=1), r"the checkpoint has 1 encoder layer, this model 2"),
])
def test_a_checkpoint_of_another_size_is_refused(size, message):
    with pytest.raises(UserError, match=message):
        check_compatible(random_weights(**size), shapes())


def test_missing_encoder_weights_are_listed():
    weights = random_weights()
    del weights["bert.pooler.dense.weight"], weights["bert.pooler.dense.bias"]
    with pytest.raises(UserError, match=r"run/checkpoint_9.mdl lacks 2 encoder weight\(s\) of this model: "
                                        r"bert.pooler.dense.weight, bert.pooler.dense.bias$"):
        check_compatible(weights, shapes(), source="run/checkpoint_9.mdl")


def test_another_number_of_classes_is_named():
    weights = random_weights(classifier=True)
    weights["classifier.weight"] = weights["classifier.weight"][:2]
    with pytest.raises(UserError, match="has number of classes 2, this model 3"):
        check_compatible(weights, shapes(classifier=True))

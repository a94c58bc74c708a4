"""tf/bert: the network's size and weight names, the tied MLM head's loss against numpy, the
prepared default-corpus data, pretraining on the CPU and the emulator (the same losses),
and bad input."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.data.text.tfrecord import write_tfrecord
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.summaries import read_scalars
from common.tf.estimator import ModeKeys

BERT = os.path.join(zoo.ROOT, "tf", "bert")
CONFIGS = os.path.join(BERT, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(BERT, "run.py"), "model", "data", "utils")
v1 = tf.compat.v1


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the input_fn itself, into an empty data_dir (as on a fresh clone)."""
    folder = str(tmp_path_factory.mktemp("bert_data") / "msl128")
    params = params_of(TINY, f"train_input.data_dir={folder}", f"eval_input.data_dir={folder}")
    with tf.Graph().as_default():
        data.train_input_fn(params)
    return folder


def tiny(data_dir, model_dir, *argv):
    return load_run_module(BERT).main(["--params", TINY, "--model_dir", str(model_dir),
                                       f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}", *argv])


def losses(model_dir):
    return [v for _, v in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def placeholders(batch, seq, predictions):
    names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
    features = {n: v1.placeholder(tf.int32, [batch, predictions if n == "masked_lm_positions" else seq], n)
                for n in names}
    labels = {"masked_lm_ids": v1.placeholder(tf.int32, [batch, predictions]),
              "masked_lm_weights": v1.placeholder(tf.float32, [batch, predictions]),
              "next_sentence_labels": v1.placeholder(tf.int32, [batch, 1])}
    return features, labels


def test_bert_base_has_the_reference_weights_and_google_names():
    # 110,106,428: Hugging Face's BertForPreTraining(bert-base-uncased), decoder tied to the word embedding
    with tf.Graph().as_default():
        params = params_of(os.path.join(CONFIGS, "bert_base_msl128.yaml"))
        features, labels = placeholders(1, 128, 20)
        model.model_fn(features, labels, ModeKeys.EVAL, params)
        variables = {v.op.name: v.shape.as_list() for v in v1.trainable_variables()}
    assert sum(int(np.prod(s)) for s in variables.values()) == 110_106_428
    assert variables["bert/embeddings/word_embeddings"] == [30522, 768]
    assert variables["bert/encoder/layer_11/attention/self/query/kernel"] == [768, 768]
    assert variables["bert/encoder/layer_0/output/LayerNorm/gamma"] == [768]
    assert variables["cls/seq_relationship/output_weights"] == [2, 768]
    assert variables["cls/predictions/output_bias"] == [30522]
    assert not [n for n in variables if n.startswith("cls/predictions") and "transform" not in n
                and n != "cls/predictions/output_bias"]  # no decoder matrix of its own: tied


def gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def norm(x, gamma, beta, eps=1e-12):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def test_masked_lm_loss_is_the_weighted_mean_over_gathered_positions_with_tied_output():
    """The graph's MLM loss against numpy from the encoder's output and the head's weights: the
    masked positions gathered, dense + GELU + LayerNorm, logits against the word embedding."""
    rng = np.random.default_rng(0)
    b, t, p, vocab = 3, 16, 4, 50
    params = params_of(TINY, "model.vocab_size=50", "model.disable_nsp=true")
    batch = {"input_ids": rng.integers(5, vocab, (b, t)), "input_mask": np.ones((b, t)),
             "segment_ids": np.zeros((b, t)), "masked_lm_positions": rng.integers(0, t, (b, p)),
             "masked_lm_ids": rng.integers(0, vocab, (b, p)), "masked_lm_weights": np.array(
                 [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32), "next_sentence_labels": np.zeros((b, 1))}
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        features, labels = placeholders(b, t, p)
        sequence, _, table = model.bert_encoder(features, params["model"], training=False)
        mlm_logits = model.masked_lm_head(sequence, features["masked_lm_positions"], table, params["model"])
        loss = model.masked_lm_loss(mlm_logits, labels["masked_lm_ids"], labels["masked_lm_weights"])
        names = ["cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/bias",
                 "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/transform/LayerNorm/beta",
                 "cls/predictions/output_bias", "bert/embeddings/word_embeddings"]
        variables = {v.op.name: v for v in v1.global_variables()}
        feed = {ph: batch[name] for name, ph in {**features, **labels}.items()}
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            seq_out, loss, *weights = session.run([sequence, loss] + [variables[n] for n in names], feed)
    kernel, bias, gamma, beta, out_bias, embedding = weights
    picked = np.take_along_axis(seq_out, batch["masked_lm_positions"][..., None], axis=1).reshape(b * p, -1)
    h = norm(gelu(picked @ kernel + bias), gamma, beta)
    logits = h @ embedding.T + out_bias
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -log_probs[np.arange(b * p), batch["masked_lm_ids"].reshape(-1)]
    w = batch["masked_lm_weights"].reshape(-1)
    np.testing.assert_allclose(loss, (nll * w).sum() / (w.sum() + 1e-5), rtol=1e-5)


def test_a_fresh_data_dir_is_prepared_from_the_default_corpus(data_dir):
    assert os.path.isfile(os.path.join(data_dir, "vocab.txt")) and os.path.isfile(os.path.join(data_dir, "manifest.json"))
    assert data.shard_files(data_dir, "train") and data.shard_files(data_dir, "eval")
    assert not [f for f in os.listdir(data_dir) if f.endswith(".hdf5")]  # only this framework's format
    with open(os.path.join(data_dir, "vocab.txt")) as f:
        assert sum(1 for _ in f) == params_of()["model"]["vocab_size"]  # params_tiny's vocab_size is the corpus's
    params = params_of(TINY, f"train_input.data_dir={data_dir}", "train_input.shuffle=false")
    features, labels = next(iter(data.train_input_fn(params)))
    assert features["input_ids"].shape == (16, 128) and features["masked_lm_positions"].shape == (16, 20)
    assert labels["masked_lm_weights"].dtype == tf.float32 and labels["next_sentence_labels"].shape == (16, 1)
    ids = features["input_ids"].numpy()
    assert (ids[:, 0] == 2).all()  # [CLS]
    positions = features["masked_lm_positions"].numpy()
    weights = labels["masked_lm_weights"].numpy()
    assert (positions[weights > 0] > 0).all()  # masked positions are never [CLS]


def test_tiny_pretrains_and_evaluates_on_the_cpu(data_dir, tmp_path):
    tiny(data_dir, tmp_path, "--mode", "train")
    train_losses = losses(tmp_path)
    assert len(train_losses) == 8 and train_losses[-1] < train_losses[0]
    metrics = tiny(data_dir, tmp_path, "--mode", "eval", "runconfig.eval_steps=4")
    assert {"loss", "masked_lm_accuracy", "masked_lm_loss", "mlm_perplexity", "nsp_accuracy"} <= set(metrics)
    assert metrics["mlm_perplexity"] == pytest.approx(np.exp(metrics["masked_lm_loss"]), rel=1e-5)
    assert 0 <= metrics["masked_lm_accuracy"] <= 1 and 0 <= metrics["nsp_accuracy"] <= 1


def test_two_runs_train_to_the_same_weights_bit_for_bit(data_dir, tmp_path):
    """AdamW's decay, the schedule, dropout and the input order: nothing depends on how TF
    schedules the ops (a decay that raced the step's reads once made the last digits vary)."""
    for run in ("a", "b"):  # each in a process of its own, as a rerun is
        subprocess.run([sys.executable, os.path.join(BERT, "run.py"), "--params", TINY, "--model_dir",
                        str(tmp_path / run), "--mode", "train", f"train_input.data_dir={data_dir}",
                        "runconfig.max_steps=4", "runconfig.checkpoint_steps=4"], check=True, capture_output=True)
    a, b = (tf.train.load_checkpoint(str(tmp_path / run)) for run in ("a", "b"))
    names = [n for n, dtype in a.get_variable_to_dtype_map().items() if dtype != tf.variant]
    assert len(names) > 50
    assert [n for n in names if not np.array_equal(a.get_tensor(n), b.get_tensor(n))] == []


def test_the_emulator_trains_with_the_cpu_losses(data_dir, tmp_path):
    """Same initial weights, same batches, dropout off: the emulator's loss at each step is the
    CPU runner's within 1e-4 relative (as tests/tf/test_tf_device.py for mnist)."""
    same = ("runconfig.max_steps=4", "runconfig.checkpoint_steps=4", "model.dropout_rate=0.0",
            "model.attention_dropout_rate=0.0")
    tiny(data_dir, tmp_path / "cpu", *same)
    tiny(data_dir, tmp_path / "emulator", *same, "--device", "emulator")
    cpu, emulator = losses(tmp_path / "cpu"), losses(tmp_path / "emulator")
    assert len(cpu) == len(emulator) == 4 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    metrics = tiny(data_dir, tmp_path / "emulator", "--mode", "eval", "--device", "emulator", "runconfig.eval_steps=1")
    assert metrics["masked_lm_accuracy"] >= 0 and "nsp_accuracy" in metrics


# --- bad input: one line naming the file or key, a non-zero exit, no traceback --------------------


def one_error_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0], err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def refused(capsys, data_dir, model_dir, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        tiny(data_dir, model_dir, *argv)
    assert exit_info.value.code not in (0, None)
    return capsys.readouterr().err


def test_a_vocab_larger_than_the_embedding(data_dir, tmp_path, capsys):
    err = refused(capsys, data_dir, tmp_path, "model.vocab_size=1000")
    one_error_line(err, os.path.join(data_dir, "vocab.txt"), "3,796 tokens", "model.vocab_size 1,000")


def test_sequences_longer_than_the_position_embeddings(data_dir, tmp_path, capsys):
    err = refused(capsys, data_dir, tmp_path, "model.max_position_embeddings=64")
    one_error_line(err, "train_input.max_sequence_length 128", "model.max_position_embeddings 64")


def test_shards_of_another_sequence_length(data_dir, tmp_path, capsys):
    err = refused(capsys, data_dir, tmp_path, "train_input.max_sequence_length=64")
    one_error_line(err, "train-00000-of-00004.tfrecord", "'input_ids' has 128 values; expected 64")


def test_a_tfrecord_of_the_wrong_schema(data_dir, tmp_path, capsys):
    bad = tmp_path / "bad_data"
    bad.mkdir()
    (bad / "vocab.txt").write_text(open(os.path.join(data_dir, "vocab.txt")).read())
    arrays = {"input_ids": np.zeros((2, 128), np.int64), "input_mask": np.ones((2, 128), np.int64),
              "segment_ids": np.zeros((2, 128), np.int64), "masked_lm_positions": np.zeros((2, 20), np.int64),
              "masked_lm_ids": np.zeros((2, 20), np.int64), "masked_lm_weights": np.zeros((2, 20), np.float32),
              "next_sentence_labels": np.zeros((2, 1), np.int64)}
    write_tfrecord(arrays, bad / "train-00000-of-00001.tfrecord")
    with tf.io.TFRecordWriter(str(bad / "train-00001-of-00001.tfrecord")) as writer:  # no masked_lm_weights
        feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v[0].tolist()))
                   for k, v in arrays.items() if k != "masked_lm_weights"}
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    err = refused(capsys, str(bad), tmp_path / "model")
    one_error_line(err, "train-00001-of-00001.tfrecord", "'masked_lm_weights' is missing")


# --- fine-tuning a classifier from a pretraining checkpoint -----------------------------------

CLASSIFIER = os.path.join(CONFIGS, "classifier_tiny.yaml")


def classifier(data_dir, model_dir, *argv):
    return load_run_module(BERT).main(["--params", CLASSIFIER, "--model_dir", str(model_dir),
                                       f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}", *argv])


@pytest.fixture(scope="module")
def pretrained(data_dir, tmp_path_factory):
    """A model_dir of params_tiny pretrained for 2 steps."""
    model_dir = tmp_path_factory.mktemp("pretrained")
    tiny(data_dir, model_dir, "runconfig.max_steps=2", "runconfig.checkpoint_steps=2")
    return str(model_dir)


def test_the_classifier_fine_tunes_from_a_tf_pretraining_checkpoint(data_dir, pretrained, tmp_path, capsys):
    from common.bert_names import read_bert_weights

    # learning rate 0: the saved step-1 weights are the ones training started from
    classifier(data_dir, tmp_path, f"model.pretrained_checkpoint={pretrained}", "runconfig.max_steps=1",
               "runconfig.checkpoint_steps=1", "optimizer.learning_rate=0.0")
    assert "of this model's variables start from it" in capsys.readouterr().err
    source, tuned = read_bert_weights(pretrained), read_bert_weights(str(tmp_path))
    encoder = [n for n in source if n.startswith("bert.")]
    assert len(encoder) == 39 and all(np.array_equal(tuned[n], source[n]) for n in encoder)
    assert {"classifier.weight", "classifier.bias"} <= set(tuned) and not any(n.startswith("cls.") for n in tuned)
    metrics = classifier(data_dir, tmp_path, "--mode", "eval")
    assert 0 <= metrics["accuracy"] <= 1 and "loss" in metrics


def test_the_classifier_trains_with_a_falling_loss(data_dir, pretrained, tmp_path):
    classifier(data_dir, tmp_path, f"model.pretrained_checkpoint={pretrained}", "runconfig.max_steps=12",
               "optimizer.learning_rate=0.003", "model.dropout_rate=0.0")
    train_losses = losses(tmp_path)
    assert len(train_losses) == 12 and np.mean(train_losses[-4:]) < np.mean(train_losses[:4])


def test_the_classifier_fine_tunes_from_a_pytorch_checkpoint(data_dir, pretrained, tmp_path):
    torch = pytest.importorskip("torch")
    from common.bert_names import read_bert_weights

    # a zoo PyTorch checkpoint (checkpoint_N.mdl, Hugging Face names, torch layout) of other values
    weights = {n: v + 0.5 for n, v in read_bert_weights(pretrained).items()}
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    torch.save({"model": {n: torch.from_numpy(np.ascontiguousarray(v)) for n, v in weights.items()},
                "optimizer": {}, "lr_scheduler": {}, "global_step": 2}, torch_dir / "checkpoint_2.mdl")
    classifier(data_dir, tmp_path / "model", f"model.pretrained_checkpoint={torch_dir}", "runconfig.max_steps=1",
               "runconfig.checkpoint_steps=1", "optimizer.learning_rate=0.0")
    tuned = read_bert_weights(str(tmp_path / "model"))
    assert all(np.array_equal(tuned[n], weights[n]) for n in weights if n.startswith("bert."))


def test_a_checkpoint_of_another_model_size(data_dir, pretrained, tmp_path, capsys):
    with pytest.raises(SystemExit):
        classifier(data_dir, tmp_path, f"model.pretrained_checkpoint={pretrained}", "model.hidden_size=32")
    one_error_line(capsys.readouterr().err, pretrained, "hidden size 64, this model 32")
    with pytest.raises(SystemExit):
        classifier(data_dir, tmp_path, f"model.pretrained_checkpoint={pretrained}", "model.num_hidden_layers=3")
    one_error_line(capsys.readouterr().err, pretrained, "2 encoder layers, this model 3")


def test_a_task_of_another_number_of_classes(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        classifier(data_dir, tmp_path, "model.num_classes=3")
    one_error_line(capsys.readouterr().err, "corpus_topics: 4 classes, but model.num_classes is 3")

"""pytorch/bert: the network's names, tied head, MLM gather loss and padding mask against
reference computations; tiny pretraining on the CPU and the emulator; and bad input."""

import os

import h5py
import numpy as np
import pytest
import torch

from common import zoo
from common.folder import import_beside, load_run_module
from common.params import load_params
from tests.tiny_runs import tiny_runner, train_losses, with_data

BERT = os.path.join(zoo.ROOT, "pytorch", "bert")
CONFIGS = os.path.join(BERT, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(BERT, "run.py"), "model", "data", "utils")
NO_DROPOUT = ("model.dropout_rate=0.0", "model.attention_dropout_rate=0.0")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the loader itself (as on a fresh clone), once for the module."""
    folder = tmp_path_factory.mktemp("bert_msl128")
    data.get_eval_dataloader(params_of(TINY, f"eval_input.data_dir={folder}"))
    return str(folder)


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def tiny_model(*overrides):
    torch.manual_seed(0)
    return model.BertForPretraining(params_of(TINY, *NO_DROPOUT, *overrides)["model"])


def random_batch(p, B=3, T=12, P=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, p["vocab_size"], (B, T), generator=g)
    lengths = torch.tensor([T, T - 3, T - 5])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids * mask
    segments = ((torch.arange(T)[None] >= lengths[:, None] // 2) * mask).long()
    positions = torch.stack([torch.randperm(int(n) - 1, generator=g)[:P] + 1 for n in lengths])
    return ids, mask, segments, positions


def test_weights_have_hugging_face_names_and_the_decoder_is_the_word_embedding():
    net = tiny_model()
    names = set(net.state_dict())
    layer = [f"bert.encoder.layer.1.{n}" for n in (
        "attention.self.query.weight", "attention.self.key.bias", "attention.self.value.weight",
        "attention.output.dense.weight", "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
        "intermediate.dense.weight", "output.dense.bias", "output.LayerNorm.weight")]
    assert names >= {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                     "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                     "bert.pooler.dense.weight", "cls.predictions.transform.dense.weight",
                     "cls.predictions.transform.LayerNorm.bias", "cls.predictions.bias",
                     "cls.seq_relationship.weight", "cls.seq_relationship.bias", *layer}
    assert not any("decoder" in n or "layer.2." in n for n in names)
    # 2 layers of 16 tensors, 5 embedding tensors, 2 pooler, 5 MLM head, 2 NSP head
    assert len(names) == 2 * 16 + 5 + 2 + 5 + 2
    # tied: the MLM head's gradient reaches the word embedding table
    p = params_of(TINY)["model"]
    ids, mask, segments, positions = random_batch(p)
    mlm_logits, nsp_logits = net(ids, mask, segments, positions)
    assert mlm_logits.shape == (3, 4, p["vocab_size"]) and nsp_logits.shape == (3, 2)
    embedding = net.bert.embeddings.word_embeddings.weight
    (grad,) = torch.autograd.grad(mlm_logits[0, 0, 7], embedding)
    assert grad[7].abs().sum() > 0
    with torch.no_grad():
        embedding[7] += 1.0  # the output row of token 7 moves with its input row
    moved, _ = net(ids, mask, segments, positions)
    assert not torch.allclose(moved[..., 7], mlm_logits[..., 7]) and torch.allclose(moved[..., 8], mlm_logits[..., 8])


def test_mlm_loss_on_the_gathered_positions_equals_a_reference():
    net = tiny_model()
    p = params_of(TINY)["model"]
    ids, mask, segments, positions = random_batch(p)
    labels = torch.randint(0, p["vocab_size"], positions.shape, generator=torch.Generator().manual_seed(1))
    weights = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    with torch.no_grad():
        mlm_logits, _ = net(ids, mask, segments, positions)
        loss, _ = model.masked_lm_loss(mlm_logits, labels, weights)
        # reference: the whole sequence through the head, then the positions picked one by one in numpy
        sequence, _ = net.bert(ids, mask, segments)
        head = net.cls.predictions
        everywhere = (head.transform(sequence) @ net.bert.embeddings.word_embeddings.weight.t() + head.bias).numpy()
    total, count = 0.0, 0.0
    for b in range(3):
        for k in range(4):
            row = everywhere[b, positions[b, k]].astype(np.float64)
            log_probs = row - np.log(np.exp(row - row.max()).sum()) - row.max()
            total += -log_probs[labels[b, k]] * float(weights[b, k])
            count += float(weights[b, k])
    assert loss.item() == pytest.approx(total / (count + 1e-5), rel=1e-5)


def test_padding_is_masked_and_segments_count():
    net = tiny_model()
    p = params_of(TINY)["model"]
    ids, mask, segments, positions = random_batch(p)
    with torch.no_grad():
        before, pooled = net.bert(ids, mask, segments)
        other = ids.clone()
        other[1, -3:] = 9  # tokens under the padding mask change
        after, pooled_after = net.bert(other, mask, segments)
        assert torch.allclose(before[1, :-3], after[1, :-3], atol=1e-5) and torch.allclose(pooled, pooled_after, atol=1e-5)
        flipped, _ = net.bert(ids, mask, 1 - segments)
        assert not torch.allclose(flipped[0], before[0])


def test_disable_nsp_drops_the_head_and_its_loss():
    params = params_of(TINY, *NO_DROPOUT, "model.disable_nsp=true")
    m = model.model_fn(params, torch.device("cpu"))
    assert "nsp_accuracy" not in m.metrics
    ids, mask, segments, positions = random_batch(params["model"])
    labels, weights = torch.zeros_like(positions), torch.ones(positions.shape)
    batch = (ids, mask, segments, positions, labels, weights, torch.zeros(3, dtype=torch.long))
    assert isinstance(m(batch), torch.Tensor)  # training: the loss alone (no argmax in the training graph)
    m.model.eval()
    loss, outputs = m(batch)
    assert set(outputs) == {"mlm_predictions", "mlm_losses"}
    expected, _ = model.masked_lm_loss(m.model(ids, mask, segments, positions)[0], labels, weights)
    assert loss.item() == pytest.approx(expected.item())


def test_the_loader_prepares_the_default_corpus_and_yields_tuples(data_dir):
    assert os.path.isfile(os.path.join(data_dir, "vocab.txt"))
    assert sorted(f for f in os.listdir(data_dir) if f.endswith(".hdf5"))[0] == "eval-00000-of-00001.hdf5"
    assert not [f for f in os.listdir(data_dir) if f.endswith(".tfrecord")]  # this framework's format only
    with open(os.path.join(data_dir, "vocab.txt")) as f:
        assert sum(1 for _ in f) == params_of(TINY)["model"]["vocab_size"]
    batch = next(iter(data.get_train_dataloader(params_of(TINY, *with_data(data_dir)))))
    shapes = [tuple(t.shape) for t in batch]
    assert shapes == [(16, 128)] * 3 + [(16, 20)] * 3 + [(16,)]
    assert [t.dtype for t in batch] == [torch.int64] * 5 + [torch.float32, torch.int64]
    ids, mask, _, positions, masked_ids, weights, _ = batch
    assert torch.equal(ids != 0, mask.bool())  # padding is id 0 and mask 0
    assert (ids[:, 0] == 2).all()  # [CLS]
    picked = ids.gather(1, positions)
    real = weights > 0
    assert ((picked == 4) | (picked == masked_ids))[real].float().mean() > 0.7  # 80 % [MASK], 10 % kept


train_tiny = tiny_runner(BERT, TINY)


def test_tiny_pretrains_and_evaluates_on_the_cpu(tmp_path, data_dir):
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0]
    metrics = train_tiny(tmp_path, "--mode", "eval", *with_data(data_dir, "runconfig.eval_steps=3"))
    assert set(metrics) >= {"masked_lm_accuracy", "masked_lm_loss", "mlm_perplexity", "nsp_accuracy", "loss"}
    assert 0 < metrics["masked_lm_accuracy"] < 1 and 0 < metrics["nsp_accuracy"] < 1
    assert metrics["mlm_perplexity"] == pytest.approx(np.exp(metrics["masked_lm_loss"]), rel=1e-6)
    assert metrics["masked_lm_loss"] < np.log(params_of(TINY)["model"]["vocab_size"])  # better than uniform


def test_the_emulator_trains_and_evaluates_as_the_cpu(tmp_path, data_dir):
    argv = with_data(data_dir, *NO_DROPOUT, "runconfig.max_steps=3", "runconfig.eval_steps=2")
    train_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    train_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(emulator) == 3 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    on_cpu = train_tiny(tmp_path / "emulator", "--mode", "eval", *argv)
    on_emulator = train_tiny(tmp_path / "emulator", "--mode", "eval", "--device", "emulator", *argv)
    for name in ("loss", "masked_lm_loss", "masked_lm_accuracy", "nsp_accuracy"):
        assert on_emulator[name] == pytest.approx(on_cpu[name], rel=1e-4), name


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(BERT).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def tiny_argv(tmp_path, *overrides):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train", *overrides]


def test_a_vocab_larger_than_the_embedding_table(tmp_path, capsys, data_dir):
    vocab = os.path.join(data_dir, "vocab.txt")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.vocab_size=1000")),
                          vocab, "3,796 tokens", "model.vocab_size is 1,000")


def test_a_sequence_longer_than_the_position_embeddings(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.max_position_embeddings=64")),
                          "max_sequence_length 128", "model.max_position_embeddings 64")


def test_shards_of_another_sequence_length(tmp_path, capsys, data_dir):
    shard = os.path.join(data_dir, "train-00000-of-00004.hdf5")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "train_input.max_sequence_length=64",
                                                                 "eval_input.max_sequence_length=64")),
                          shard, "input_ids", "(", "64)")


def test_a_shard_of_the_wrong_schema(tmp_path, capsys, data_dir):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("vocab.txt", "eval-00000-of-00001.hdf5"):
        os.link(os.path.join(data_dir, name), folder / name)
    with h5py.File(folder / "train-00000-of-00001.hdf5", "w") as f:
        f.create_dataset("input_ids", data=np.zeros((4, 128), np.int32))
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(folder)), "train-00000-of-00001.hdf5",
                          "masked_lm_positions", "missing")


def test_hidden_size_not_a_multiple_of_the_heads(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.num_heads=3")),
                          "model.hidden_size 64", "model.num_heads 3")


def test_every_weight_gets_a_gradient():
    # every weight of the pretraining model gets a gradient from one step's loss (none is dead)
    params = params_of(TINY, *NO_DROPOUT)
    m = model.model_fn(params, torch.device("cpu"))
    ids, mask, segments, positions = random_batch(params["model"])
    labels, weights = torch.randint(5, 100, positions.shape), torch.ones(positions.shape)
    loss = m((ids, mask, segments, positions, labels, weights, torch.tensor([0, 1, 0])))
    loss.backward()
    dead = [n for n, w in m.model.named_parameters() if w.grad is None or not w.grad.abs().sum() > 0]
    assert dead == []


# --- fine-tuning: the classifier from a pretraining checkpoint -----------------------------------

CLASSIFIER_TINY = os.path.join(CONFIGS, "classifier_tiny.yaml")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_dir):
    """A checkpoint of 2 pretraining steps of params_tiny."""
    model_dir = tmp_path_factory.mktemp("pretrained")
    train_tiny(model_dir, "--mode", "train", *with_data(data_dir, "runconfig.max_steps=2"))
    return str(model_dir / "checkpoint_2.mdl")


def encoder_weights(state):
    return {k: v.numpy() for k, v in state.items() if k.startswith("bert.")}


def test_the_classifier_starts_from_the_pretrained_encoder(pretrained, data_dir):
    saved = encoder_weights(torch.load(pretrained, weights_only=True)["model"])
    params = params_of(CLASSIFIER_TINY, *with_data(data_dir), f"model.pretrained_checkpoint={pretrained}")
    fine_tuned = model.model_fn(params, torch.device("cpu")).model.state_dict()
    loaded = encoder_weights(fine_tuned)
    assert loaded.keys() == saved.keys() and len(loaded) == 2 * 16 + 5 + 2
    for name, value in saved.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    assert fine_tuned["classifier.weight"].shape == (4, 64)


def test_the_classifier_starts_from_a_google_tf_checkpoint(pretrained, data_dir, tmp_path):
    tf = pytest.importorskip("tensorflow")
    from tests.common.test_bert_names import write_tf_checkpoint

    saved = encoder_weights(torch.load(pretrained, weights_only=True)["model"])
    prefix = write_tf_checkpoint(tf, saved, str(tmp_path / "model.ckpt"))  # model.ckpt-5, with Adam slots
    params = params_of(CLASSIFIER_TINY, *with_data(data_dir), f"model.pretrained_checkpoint={prefix}")
    loaded = encoder_weights(model.model_fn(params, torch.device("cpu")).model.state_dict())
    for name, value in saved.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)


def test_fine_tuning_on_the_emulator_matches_the_cpu(pretrained, data_dir, tmp_path):
    argv = ["--params", CLASSIFIER_TINY, "--mode", "train", *with_data(data_dir, *NO_DROPOUT),
            f"model.pretrained_checkpoint={pretrained}", "runconfig.max_steps=3"]
    main = load_run_module(BERT).main
    main([*argv, "--model_dir", str(tmp_path / "cpu")])
    main([*argv, "--model_dir", str(tmp_path / "emulator"), "--device", "emulator"])
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(cpu) == 3 and np.isfinite(cpu).all()
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    metrics = main([*argv, "--model_dir", str(tmp_path / "cpu"), "--mode", "eval", "runconfig.eval_steps=2"])
    assert set(metrics) == {"accuracy", "loss"} and 0 <= metrics["accuracy"] <= 1


def test_a_pretrained_checkpoint_of_another_size(pretrained, tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, ["--params", CLASSIFIER_TINY, "--model_dir", str(tmp_path / "model"),
                                   *with_data(data_dir), f"model.pretrained_checkpoint={pretrained}",
                                   "model.hidden_size=32"],
                          pretrained, "hidden size 64, this model 32")


def test_a_task_of_another_number_of_classes(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, ["--params", CLASSIFIER_TINY, "--model_dir", str(tmp_path / "model"),
                                   *with_data(data_dir), "model.num_classes=3"],
                          "corpus_topics: 4 classes", "model.num_classes is 3")


@pytest.mark.parametrize("config, count", [("bert_base_msl128.yaml", 110_106_428), ("bert_base_msl512.yaml", 110_106_428),
                                           ("bert_large_msl128.yaml", 336_226_108),
                                           ("bert_large_msl512.yaml", 336_226_108)])
def test_published_sizes_have_hugging_face_bert_for_pretraining_weights(config, count):
    # bert-base-uncased / bert-large-uncased as transformers' BertForPreTraining (the decoder tied):
    # BertModel's 109,482,240 / 335,141,888 weights and the two heads
    params = params_of(os.path.join(CONFIGS, config))
    with torch.device("meta"):
        net = model.BertForPretraining(params["model"])
    assert sum(p.numel() for p in net.parameters()) == count
    assert params["model"]["vocab_size"] == 30522


def test_every_config_loads():
    for name in sorted(os.listdir(CONFIGS)):
        params = params_of(os.path.join(CONFIGS, name))
        assert (params["model"]["task"] == "classifier") == name.startswith("classifier"), name

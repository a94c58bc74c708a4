"""tf/transformer: shapes, the one shared embedding variable, the causal and source padding
masks and the label-smoothed loss against reference computations (numpy, and pytorch/transformer's
logits and loss with the same weights where torch is installed); greedy decoding against a slow
step-by-step reference; tiny training on the CPU and the emulator, predict's files; bad input."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.tf.estimator import ModeKeys
from tests.tiny_runs import tiny_runner, train_losses, with_data

TRANSFORMER = os.path.join(zoo.ROOT, "tf", "transformer")
TINY = os.path.join(TRANSFORMER, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(TRANSFORMER, "run.py"), "model", "data", "utils")
v1 = tf.compat.v1
NO_DROPOUT = ("model.dropout_rate=0.0",)
B, S, T = 3, 10, 12


def params_of(*overrides):
    return load_params(TINY, utils.default_params(), list(overrides))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The reversal task prepared by the input_fn itself, into an empty data_dir (as on a fresh clone)."""
    folder = str(tmp_path_factory.mktemp("transformer_data") / "reversal_64")
    with tf.Graph().as_default():
        data.eval_input_fn(params_of(*with_data(folder)))
    return folder


def random_batch(seed=0, vocab=4096):
    """Features of B examples, S source and T target tokens: the last sources padded, as the data pads."""
    rng = np.random.default_rng(seed)
    source_lengths, target_lengths = [S, S - 3, 4], [T, T - 5, 3]
    features = {"input_ids": rng.integers(3, vocab, (B, S)), "decoder_input_ids": rng.integers(3, vocab, (B, T))}
    features["attention_mask"] = (np.arange(S)[None] < np.array(source_lengths)[:, None])
    features["decoder_attention_mask"] = (np.arange(T)[None] < np.array(target_lengths)[:, None])
    features["input_ids"] = np.where(features["attention_mask"], features["input_ids"], 0)
    labels = np.where(features["decoder_attention_mask"], rng.integers(3, vocab, (B, T)), 0)
    return {k: v.astype(np.int32) for k, v in features.items()}, labels.astype(np.int32)


class Net:
    """The teacher-forced logits and the loss (EVAL mode's model_fn) in a graph of their own, on
    (B, S) and (B, T) placeholders, with the variables initialised (seed 0)."""

    def __init__(self, *overrides):
        self.params = params_of(*NO_DROPOUT, *overrides)
        self.p = self.params["model"]
        self.graph = tf.Graph()
        with self.graph.as_default():
            v1.set_random_seed(0)
            self.features = {"input_ids": v1.placeholder(tf.int32, [B, S]),
                             "attention_mask": v1.placeholder(tf.int32, [B, S]),
                             "decoder_input_ids": v1.placeholder(tf.int32, [B, T]),
                             "decoder_attention_mask": v1.placeholder(tf.int32, [B, T])}
            self.labels = v1.placeholder(tf.int32, [B, T])
            self.spec = model.model_fn(self.features, self.labels, ModeKeys.EVAL, self.params)
            self.logits = [op for op in self.graph.get_operations()
                           if op.type == "SparseSoftmaxCrossEntropyWithLogits"][0].inputs[0]  # (B*T, V)
            self.variables = {v.op.name: v for v in v1.global_variables() if v.op.name != "global_step"}
            self.session = v1.Session(graph=self.graph)
            self.session.run(v1.global_variables_initializer())

    def feed(self, features, labels=None):
        fed = {self.features[k]: v for k, v in features.items()}
        return fed if labels is None else {**fed, self.labels: labels}

    def __call__(self, features):  # -> logits (B, T, V)
        return self.session.run(self.logits, self.feed(features)).reshape(B, T, -1)

    def loss(self, features, labels):
        return self.session.run(self.spec.loss, self.feed(features, labels))


def test_shapes_and_one_shared_embedding_variable():
    net = Net()
    shapes = {n: v.shape.as_list() for n, v in net.variables.items()}
    embeddings = [n for n in shapes if "embedding" in n or "output_projection" in n]
    assert embeddings == ["transformer/embedding"] and shapes["transformer/embedding"] == [4096, 64]
    assert shapes["transformer/encoder_layers_0/ffn/fc1/kernel"] == [64, 256]  # (in, out)
    assert shapes["transformer/decoder_layers_1/cross_attn/k_proj/kernel"] == [64, 64]
    assert len([n for n in shapes if n.startswith("transformer/decoder_layers_0/")]) == 2 * 4 * 2 + 2 * 2 + 3 * 2  # attentions, FFN, norms
    features, _ = random_batch()
    logits = net(features)
    assert logits.shape == (B, T, 4096)
    table = net.session.run(net.variables["transformer/embedding"])
    # the output row of token 7 is its embedding row (moved off the all-ones direction, to which
    # the zero-mean post-LN output is blind)
    table[7] += np.random.default_rng(0).normal(size=64).astype(np.float32)
    with net.graph.as_default():
        net.variables["transformer/embedding"].load(table, net.session)
    assert not np.allclose(net(features)[..., 7], logits[..., 7])


def test_unshared_embeddings_are_three_weights_and_pre_ln_adds_a_norm_per_stack():
    names = set(Net("model.share_embedding_weights=false", "model.pre_layer_norm=true").variables)
    assert {"transformer/embedding", "transformer/decoder_embedding", "transformer/output_projection/kernel"} <= names
    assert {"transformer/encoder_norm/gamma", "transformer/decoder_norm/gamma"} <= names


def test_a_target_position_never_sees_the_targets_after_it():
    net = Net()
    features, _ = random_batch()
    changed = {**features, "decoder_input_ids": features["decoder_input_ids"].copy()}
    changed["decoder_input_ids"][:, 7:] = (changed["decoder_input_ids"][:, 7:] + 1) % 4096
    before, after = net(features), net(changed)
    np.testing.assert_allclose(after[:, :7], before[:, :7], rtol=0, atol=1e-5)
    assert not np.allclose(after[:, 7:], before[:, 7:])
    # one (T, T) constant for every decoder layer, broadcast over the batch and the heads
    masks = [op for op in net.graph.get_operations() if op.type == "SelectV2"]
    assert len(masks) == 2 and all(op.inputs[0].shape.as_list() == [T, T] for op in masks)


def test_the_source_padding_changes_nothing():
    net = Net()
    features, _ = random_batch()
    changed = {**features, "input_ids": np.where(features["attention_mask"] == 1, features["input_ids"], 99)}
    assert not np.array_equal(changed["input_ids"], features["input_ids"])
    np.testing.assert_allclose(net(changed), net(features), rtol=0, atol=1e-5)
    changed["input_ids"] = features["input_ids"].copy()
    changed["input_ids"][1, 0] += 1  # a real source token does change its example's logits
    assert not np.allclose(net(changed)[1], net(features)[1])


def test_the_loss_is_a_reference_label_smoothed_cross_entropy_over_the_real_targets():
    net = Net()
    features, labels = random_batch(seed=1)
    logits = net(features).astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    eps, mask = 0.1, features["decoder_attention_mask"]
    # the smoothed target: 1 - eps + eps / V on the label, eps / V on every other token (as torch)
    target = np.full(log_probs.shape, eps / log_probs.shape[-1])
    np.put_along_axis(target, labels[..., None], 1 - eps + eps / log_probs.shape[-1], -1)
    per_token = -(target * log_probs).sum(-1)
    assert net.loss(features, labels) == pytest.approx((per_token * mask).sum() / mask.sum(), rel=1e-5)


@pytest.mark.parametrize("variant", [(), ("model.pre_layer_norm=true", "model.share_embedding_weights=false")],
                         ids=["post_ln_shared", "pre_ln_unshared"])
def test_logits_and_loss_equal_pytorch_transformer_with_the_same_weights(variant):
    """pytorch/transformer's module names map one to one onto this folder's variables (model.py's
    docstring): its weights copied in give the same logits and loss."""
    torch = pytest.importorskip("torch")
    pt_model, pt_utils = import_beside(os.path.join(zoo.ROOT, "pytorch", "transformer", "run.py"), "model", "utils")
    pt_params = load_params(os.path.join(zoo.ROOT, "pytorch", "transformer", "configs", "params_tiny.yaml"),
                            pt_utils.default_params(), [*NO_DROPOUT, *variant])
    torch.manual_seed(0)
    pt_net = pt_model.Transformer(pt_params["model"], pt_model.max_length(pt_params)).eval()
    net = Net(*variant)
    state = {k: v.numpy() for k, v in pt_net.state_dict().items()}
    with net.graph.as_default():
        for name, var in net.variables.items():
            key = re.sub(r"_layers_(\d+)/", r"_layers.\1.", name[len("transformer/"):]).replace("/", ".")
            key = re.sub(r"\.(kernel|gamma)$", ".weight", key)
            key = re.sub(r"\.beta$", ".bias", key)
            key = key if "." in key else f"{key}.weight"
            value = state.pop(key)
            var.load(value.T if name.endswith("kernel") else value, net.session)
    assert not state  # every torch weight has its variable
    features, labels = random_batch(seed=2)
    with torch.no_grad():
        t = {k: torch.from_numpy(v).long() for k, v in features.items()}
        expected = pt_net(t["input_ids"], t["attention_mask"], t["decoder_input_ids"])
        expected_loss = pt_model.smoothed_loss(expected, torch.from_numpy(labels).long(),
                                               t["decoder_attention_mask"], 0.1)
    np.testing.assert_allclose(net(features), expected.numpy(), rtol=1e-5, atol=1e-5)
    assert net.loss(features, labels) == pytest.approx(float(expected_loss), rel=1e-5)


def test_greedy_decoding_equals_a_step_by_step_reference():
    """model.greedy_decode's while loop against the teacher-forced graph run once per position,
    with the same weights; an </s> ends a sequence (pad after it) and, for all, the loop."""
    net = Net()
    features, _ = random_batch(seed=3)
    start, pad = 1, 0
    with net.graph.as_default():
        eos = v1.placeholder(tf.int32, [])
        generated = model.greedy_decode(net.features, net.p, model.max_length(net.params), start, eos, pad)

    def reference(eos_id):
        decoder_input, out = np.full((B, T), pad, np.int32), np.full((B, T), pad, np.int32)
        decoder_input[:, 0] = start
        done = np.zeros(B, bool)
        for t in range(T):
            token = net({**features, "decoder_input_ids": decoder_input})[:, t].argmax(-1)
            out[:, t] = np.where(done, pad, token)
            done |= token == eos_id
            if done.all() or t + 1 == T:
                break
            decoder_input[:, t + 1] = out[:, t]
        return out

    no_end = reference(-1)
    eos_id = int(no_end[0, 4])  # sequence 0 ends at position 4 (or before, where the token came earlier)
    expected = reference(eos_id)
    assert (expected == pad).any() and not np.array_equal(expected, no_end)
    for eos_value, want in ((-1, no_end), (eos_id, expected)):
        got = net.session.run(generated, {**net.feed(features), eos: eos_value})
        np.testing.assert_array_equal(got, want)


# --- the runner: tiny training on the CPU and the emulator, predict's files ---------------------


run_tiny = tiny_runner(TRANSFORMER, TINY)


def test_the_input_fn_prepares_the_reversal_task_and_yields_shifted_targets(data_dir):
    assert {"tokenizer.json", "meta.json", "train-00000.tfrecord", "eval-00000.tfrecord"} <= set(os.listdir(data_dir))
    assert not [f for f in os.listdir(data_dir) if f.endswith(".h5")]  # this framework's format only
    features, labels = next(iter(data.train_input_fn(params_of(*with_data(data_dir)))))
    decoder_input, labels = features["decoder_input_ids"].numpy(), labels.numpy()
    assert features["input_ids"].shape == labels.shape == (8, 64) and labels.dtype == np.int32
    real = features["decoder_attention_mask"].numpy()[:, 1:] == 1  # where position t + 1 has a real label
    assert (decoder_input[:, 0] == 1).all() and np.array_equal(decoder_input[:, 1:][real], labels[:, :-1][real])


def test_tiny_trains_on_the_cpu_and_the_emulator_alike_and_predicts(tmp_path, data_dir, capsys):
    argv = with_data(data_dir, *NO_DROPOUT, "runconfig.max_steps=3", "runconfig.eval_steps=1")
    run_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    run_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(emulator) == 3 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)

    path = run_tiny(tmp_path / "cpu", "--mode", "predict", *argv)
    with np.load(path) as predictions:
        assert sorted(predictions.files) == ["decoder_attention_mask", "generated_ids", "input_ids", "labels"]
        assert predictions["generated_ids"].shape == predictions["labels"].shape == (8, 64)
    lines = (tmp_path / "cpu" / "predictions.txt").read_text().splitlines()
    assert len(lines) == 8 and all(" -> " in line for line in lines)
    assert re.search(r"greedy decoding: \d+ of 8 examples exactly right", capsys.readouterr().err)

    # the device runs a static number of steps: the decoding loop is refused in one line naming its line
    with pytest.raises(SystemExit) as exit_info:
        run_tiny(tmp_path / "emulator", "--mode", "predict", "--device", "emulator", *argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(error_lines) == 1, err[-2000:]
    assert re.search(r"predicts by generating in a tf\.while_loop \(\S*tf/transformer/model\.py:\d+\)", error_lines[0])


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(TRANSFORMER).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0], err[-2000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


@pytest.mark.parametrize("overrides, fragments", [
    (("model.vocab_size=1000",), ("meta.json", "4,096 tokens", "model.vocab_size is 1,000")),
    (("train_input.source_length=32",), ("meta.json", "source sequences have 64 tokens", "--source_length 32")),
    (("model.num_heads=3",), ("model.hidden_size 64", "model.num_heads 3")),
])
def test_bad_input_is_one_line(tmp_path, capsys, data_dir, overrides, fragments):
    argv = ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train", *with_data(data_dir, *overrides)]
    expect_one_error_line(capsys, argv, *fragments)

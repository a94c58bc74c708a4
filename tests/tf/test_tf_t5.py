"""tf/t5: the relative position buckets against Hugging Face's formula, the variable names,
the causal decoder, the source padding, the loss against a numpy reference, the logits
against Hugging Face's T5ForConditionalGeneration (where torch and transformers are
installed); tiny training on the CPU and the emulator; greedy decoding's files; bad input."""

import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.tf.estimator import ModeKeys
from tests.rms_norm import RMS_EPSILON, rms_case, rms_reference
from tests.tiny_runs import tiny_runner, train_losses, with_data

T5 = os.path.join(zoo.ROOT, "tf", "t5")
TINY = os.path.join(T5, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(T5, "run.py"), "model", "data", "utils")
v1 = tf.compat.v1
B, S, T, V = 3, 10, 6, 4096


def params_of(*overrides):
    return load_params(TINY, utils.default_params(), list(overrides))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Span corruption of the default corpus, prepared by the input_fn itself into an empty data_dir."""
    folder = str(tmp_path_factory.mktemp("t5_data") / "span_64")
    with tf.Graph().as_default():
        data.eval_input_fn(params_of(*with_data(folder)))
    return folder


# --- relative position buckets -------------------------------------------------------------------

def hf_bucket(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Hugging Face's T5Attention._relative_position_bucket for one relative position (key - query),
    line by line, in Python floats."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0) * num_buckets
        relative_position = abs(relative_position)
    else:
        relative_position = -min(relative_position, 0)
    max_exact = num_buckets // 2
    if relative_position < max_exact:
        return relative_buckets + relative_position
    large = max_exact + int(math.log(relative_position / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact))
    return relative_buckets + min(large, num_buckets - 1)


BUCKET_CASES = [(1, 1, True, 32, 128), (7, 7, True, 32, 128), (300, 300, True, 32, 128), (300, 300, False, 32, 128),
                (5, 40, True, 8, 20), (40, 5, False, 16, 64), (130, 130, False, 4, 5)]


@pytest.mark.parametrize("q, k, bidirectional, buckets, distance", BUCKET_CASES)
def test_the_buckets_are_hugging_faces_formula(q, k, bidirectional, buckets, distance):
    got = model.relative_position_buckets(q, k, bidirectional, buckets, distance)
    expected = [[hf_bucket(j - i, bidirectional, buckets, distance) for j in range(k)] for i in range(q)]
    assert got.shape == (q, k) and got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)
    assert got.min() >= 0 and got.max() < buckets


def test_the_buckets_equal_hugging_faces_own():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    for q, k, bidirectional, buckets, distance in BUCKET_CASES:
        relative = torch.arange(k)[None, :] - torch.arange(q)[:, None]
        expected = T5Attention._relative_position_bucket(relative, bidirectional=bidirectional,
                                                         num_buckets=buckets, max_distance=distance)
        np.testing.assert_array_equal(model.relative_position_buckets(q, k, bidirectional, buckets, distance),
                                      expected.numpy())


# --- the network ---------------------------------------------------------------------------------

def random_features(seed=0):
    rng = np.random.default_rng(seed)
    attention_mask = np.ones((B, S), np.int32)
    attention_mask[1, 7:] = 0  # a padded source
    return {"input_ids": rng.integers(2, V, (B, S)).astype(np.int32) * attention_mask,
            "attention_mask": attention_mask,
            "decoder_input_ids": rng.integers(0, V, (B, T)).astype(np.int32)}


class Net:
    """t5_logits in a graph of its own, on placeholders, its variables initialised (seed 0), dropout off."""

    def __init__(self, *overrides):
        self.p = params_of("model.dropout_rate=0.0", *overrides)["model"]
        self.graph = tf.Graph()
        with self.graph.as_default():
            v1.set_random_seed(0)
            self.inputs = {"input_ids": v1.placeholder(tf.int32, [B, S]),
                           "attention_mask": v1.placeholder(tf.int32, [B, S]),
                           "decoder_input_ids": v1.placeholder(tf.int32, [B, T])}
            self.logits = tf.reshape(model.t5_logits(self.inputs, self.p, training=False), [B, T, -1])
            self.variables = {v.op.name: v for v in v1.global_variables()}
            self.session = v1.Session(graph=self.graph)
            self.session.run(v1.global_variables_initializer())

    def __call__(self, features):
        return self.session.run(self.logits, {self.inputs[k]: v for k, v in features.items()})

    def load(self, values: dict):
        with self.graph.as_default():
            for name, value in values.items():
                self.variables[name].load(value, self.session)


def expected_names(layers=2, gated=False):
    ffn = ("wi_0", "wi_1", "wo") if gated else ("wi", "wo")
    names = {"shared/embedding", "encoder/final_layer_norm/weight", "decoder/final_layer_norm/weight"}
    for stack, attentions in (("encoder", ("layer_0/SelfAttention",)),
                              ("decoder", ("layer_0/SelfAttention", "layer_1/EncDecAttention"))):
        names.add(f"{stack}/block_0/layer_0/SelfAttention/relative_attention_bias/embedding")
        for i in range(layers):
            for attention in attentions:
                names |= {f"{stack}/block_{i}/{attention}/{w}/kernel" for w in "qkvo"}
            last = len(attentions)
            names |= {f"{stack}/block_{i}/layer_{j}/layer_norm/weight" for j in range(last + 1)}
            names |= {f"{stack}/block_{i}/layer_{last}/DenseReluDense/{w}/kernel" for w in ffn}
    return names


def test_the_variables_mirror_hugging_faces_tree_and_the_head_is_the_embedding():
    net = Net()
    shapes = {n: v.shape.as_list() for n, v in net.variables.items()}
    assert set(shapes) == expected_names()
    assert shapes["shared/embedding"] == [V, 64]
    assert shapes["encoder/block_0/layer_0/SelfAttention/q/kernel"] == [64, 4 * 16]  # (d_model, heads x d_kv)
    assert shapes["decoder/block_1/layer_1/EncDecAttention/o/kernel"] == [4 * 16, 64]
    assert shapes["decoder/block_0/layer_0/SelfAttention/relative_attention_bias/embedding"] == [32, 4]
    assert shapes["encoder/block_1/layer_1/DenseReluDense/wi/kernel"] == [64, 128]
    features = random_features()
    logits = net(features)
    assert logits.shape == (B, T, V) and np.isfinite(logits).all()
    table = net.session.run(net.variables["shared/embedding"])
    table[7] += 1.0  # the output row of token 7 moves with its input row
    net.load({"shared/embedding": table})
    assert not np.allclose(net(features)[..., 7], logits[..., 7])


def test_the_gated_gelu_form_and_an_untied_head():
    net = Net("model.feed_forward_proj=gated-gelu", "model.tie_word_embeddings=false")
    assert set(net.variables) == expected_names(gated=True) | {"lm_head/kernel"}
    assert np.isfinite(net(random_features())).all()


def test_a_target_position_never_sees_the_ones_after_it():
    net = Net()
    features = random_features()
    before = net(features)
    features["decoder_input_ids"][:, 4:] = (features["decoder_input_ids"][:, 4:] + 1) % V
    after = net(features)
    np.testing.assert_allclose(after[:, :4], before[:, :4], rtol=0, atol=1e-5)
    assert not np.allclose(after[:, 4:], before[:, 4:])


def test_the_source_padding_changes_nothing():
    net = Net()
    features = random_features()
    before = net(features)
    features["input_ids"][1, 7:] = 99  # under attention_mask 0
    after = net(features)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5)
    features["input_ids"][1, 3] = 99  # a real token does change the output
    assert not np.allclose(net(features)[1], before[1], atol=1e-5)


def test_the_relative_bias_is_one_gather_of_a_constant_per_stack():
    net = Net()
    gathers = [op for op in net.graph.get_operations() if op.type in ("GatherV2", "ResourceGather")
               and op.inputs[1].op.type == "Const" and "relative_position_buckets" in op.inputs[1].op.name]
    assert len(gathers) == 2  # one per stack, shared by both layers
    ops = {op.type for op in net.graph.get_operations()}
    assert not ops & {"Log", "Abs", "Minimum", "Range"}  # the buckets are numpy's, not the graph's


def test_the_loss_is_the_masked_mean_of_a_reference_cross_entropy():
    params = params_of("model.dropout_rate=0.0")
    features = random_features()
    labels = np.random.default_rng(1).integers(0, V, (B, T)).astype(np.int32)
    decoder_mask = np.ones((B, T), np.int32)
    decoder_mask[0, 3:] = 0  # a short target
    with tf.Graph().as_default():
        v1.set_random_seed(0)
        placeholders = {k: v1.placeholder(tf.int32, v.shape) for k, v in features.items()}
        placeholders["decoder_attention_mask"] = v1.placeholder(tf.int32, [B, T])
        label_ph = v1.placeholder(tf.int32, [B, T])
        spec = model.model_fn(placeholders, label_ph, ModeKeys.EVAL, params)
        logits = [op for op in v1.get_default_graph().get_operations()
                  if op.type == "SparseSoftmaxCrossEntropyWithLogits"][0].inputs[0]  # (B*T, V)
        _, (token_losses, predictions, _, _) = spec.host_call
        feed = {placeholders[k]: v for k, v in features.items()}
        feed.update({placeholders["decoder_attention_mask"]: decoder_mask, label_ph: labels})
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            loss, losses, predicted, logits = session.run([spec.loss, token_losses, predictions, logits], feed)
    logits = logits.astype(np.float64).reshape(B, T, -1)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    assert loss == pytest.approx((ce * decoder_mask).sum() / decoder_mask.sum(), rel=1e-5)
    np.testing.assert_allclose(losses, ce, rtol=1e-4)
    np.testing.assert_array_equal(predicted, logits.argmax(-1))


def hf_key(tf_name: str) -> str:
    """model.py's docstring's mapping: a TF variable name to Hugging Face's state-dict key."""
    name = re.sub(r"(block|layer)_(\d+)", r"\1.\2", tf_name).replace("/", ".")
    return re.sub(r"\.(kernel|embedding)$", ".weight", name)


@pytest.mark.parametrize("variant", [(), ("model.feed_forward_proj=gated-gelu", "model.tie_word_embeddings=false"),
                                     ("model.layer_norm_epsilon=0.5",)],
                         ids=["v1.0", "gated-untied", "epsilon-0.5"])  # an epsilon as large as the mean squares
def test_logits_equal_hugging_faces_t5_with_its_weights(variant):
    """A random Hugging Face T5ForConditionalGeneration of the tiny sizes, its weights loaded
    into the TF graph by the name mapping: the same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    net = Net(*variant)
    p = net.p
    config = transformers.T5Config(
        vocab_size=p["vocab_size"], d_model=p["d_model"], d_kv=p["d_kv"], d_ff=p["d_ff"], num_layers=p["num_layers"],
        num_decoder_layers=p["num_decoder_layers"], num_heads=p["num_heads"],
        relative_attention_num_buckets=p["relative_attention_num_buckets"],
        relative_attention_max_distance=p["relative_attention_max_distance"], dropout_rate=0.0,
        layer_norm_epsilon=p["layer_norm_epsilon"], feed_forward_proj=p["feed_forward_proj"],
        tie_word_embeddings=p["tie_word_embeddings"], decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(config).eval()
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    values = {}
    for name in net.variables:
        value = state[hf_key(name)]
        values[name] = value.T if name.endswith("/kernel") else value  # torch Linear: (out, in)
    net.load(values)
    features = random_features()
    with torch.no_grad():
        expected = hf(input_ids=torch.from_numpy(features["input_ids"]).long(),
                      attention_mask=torch.from_numpy(features["attention_mask"]).long(),
                      decoder_input_ids=torch.from_numpy(features["decoder_input_ids"]).long()).logits.numpy()
    got = net(features)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got / scale, expected / scale, rtol=0, atol=1e-5)



# --- the RMS norm: epsilon inside the square root ------------------------------------------------


def test_the_rms_norm_adds_epsilon_inside_the_square_root_in_tf_and_on_the_emulator():
    """rms_norm in TF, then captured and run by the emulator: sum(rms(x) * r) and the scale's gradient,
    sum(x_hat * r)."""
    from device.capture import tf as capture_tf
    from device.runtime.program import Program

    x, weight, r = rms_case()
    with tf.Graph().as_default() as graph:
        xs, rs = v1.placeholder(tf.float32, x.shape), v1.placeholder(tf.float32, r.shape)
        y = model.rms_norm(xs, {"layer_norm_epsilon": RMS_EPSILON}, "norm")
        loss = tf.reduce_sum(y * rs)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            v1.global_variables()[0].load(weight, session)
            got = session.run(y, {xs: x})
            ir = capture_tf.capture(graph, inputs=[xs, rs], loss=loss)
            weights = capture_tf.read_weights(session, ir)
    expected = rms_reference(x, weight, RMS_EPSILON)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    emulated, grads = Program(ir, weights, seed=0).gradients([x, r])
    np.testing.assert_allclose(emulated, (expected * r).sum(), rtol=1e-5)
    np.testing.assert_allclose(grads["norm/weight"], (expected / weight * r).sum(axis=(0, 1)), rtol=1e-5)


# --- data, training, predict -----------------------------------------------------------------------

def test_the_input_fn_prepares_span_corruption_in_this_frameworks_format(data_dir):
    assert {"tokenizer.json", "meta.json", "train-00000.tfrecord", "eval-00000.tfrecord"} <= set(os.listdir(data_dir))
    assert not [f for f in os.listdir(data_dir) if f.endswith(".h5")]
    features, labels = next(iter(data.train_input_fn(params_of(*with_data(data_dir)))))
    assert features["input_ids"].shape == (8, 64) and labels.shape == features["decoder_input_ids"].shape == (8, 16)
    decoder_ids, mask = features["decoder_input_ids"].numpy(), features["decoder_attention_mask"].numpy()
    assert (decoder_ids[:, 0] == 0).all()  # the decoder starts from pad
    labels = labels.numpy()
    np.testing.assert_array_equal(decoder_ids[:, 1:][mask[:, 1:] == 1], labels[:, :-1][mask[:, 1:] == 1])
    assert (labels[:, 0] == 4095).all()  # every target starts with <extra_id_0>, the vocab's last id


run_tiny = tiny_runner(T5, TINY)


def test_tiny_trains_evaluates_and_greedy_decodes_on_the_cpu(tmp_path, data_dir):
    run_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3
    metrics = run_tiny(tmp_path, "--mode", "eval", *with_data(data_dir))
    assert set(metrics) >= {"loss", "lm_perplexity", "accuracy"} and 0 < metrics["accuracy"] < 1
    assert metrics["lm_perplexity"] < V  # better than uniform over the vocab
    path = run_tiny(tmp_path, "--mode", "predict", *with_data(data_dir), "runconfig.eval_steps=2")
    with np.load(path) as arrays:
        generated, labels = arrays["generated_ids"], arrays["labels"]
    assert generated.shape == labels.shape == (16, 16) and generated.max() < V
    ended = generated == 1  # after </s>, pad only
    after_end = np.cumsum(ended, axis=1) - ended > 0
    assert (generated[after_end] == 0).all()
    lines = (tmp_path / "predictions.txt").read_text().splitlines()
    assert len(lines) == 16 and all(" -> " in line for line in lines)
    assert "<extra_id_0>" in lines[0]  # the source's sentinels, decoded with the data's tokenizer


def test_greedy_decoding_feeds_back_its_own_tokens():
    """The while loop's ids equal decoding position by position through t5_logits (teacher forcing
    on the generated prefix)."""
    params = params_of("model.dropout_rate=0.0")
    p = params["model"]
    features = random_features()
    with tf.Graph().as_default():
        v1.set_random_seed(0)
        ids = tf.constant(features["input_ids"])
        mask = tf.constant(features["attention_mask"])
        generated = model.greedy_decode(ids, mask, T, p, start_id=0, eos_id=1, pad_id=0)
        prefix = v1.placeholder(tf.int32, [B, T])
        with v1.variable_scope(v1.get_variable_scope(), reuse=True):
            logits = tf.reshape(model.t5_logits({"input_ids": ids, "attention_mask": mask, "decoder_input_ids": prefix},
                                                p, training=False), [B, T, -1])
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            out = session.run(generated)
            decoder_ids, expected, done = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32), np.zeros(B, bool)
            for t in range(T):  # start 0 (pad), then each argmax fed back; pad after </s> (1)
                token = np.where(done, 0, session.run(logits, {prefix: decoder_ids})[:, t].argmax(-1))
                expected[:, t] = token
                if t + 1 < T:
                    decoder_ids[:, t + 1] = token
                done |= token == 1
    np.testing.assert_array_equal(out, expected)


def test_the_emulator_trains_and_evaluates_as_the_cpu(tmp_path, data_dir):
    argv = with_data(data_dir, "model.dropout_rate=0.0", "runconfig.max_steps=3", "runconfig.eval_steps=2")
    run_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    run_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(emulator) == 3 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    on_cpu = run_tiny(tmp_path / "emulator", "--mode", "eval", *argv)
    on_emulator = run_tiny(tmp_path / "emulator", "--mode", "eval", "--device", "emulator", *argv)
    for name in ("loss", "lm_perplexity", "accuracy"):
        assert on_emulator[name] == pytest.approx(on_cpu[name], rel=1e-4), name


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------

def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(T5).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0], err[-2000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


@pytest.mark.parametrize("overrides, fragments", [
    (("model.vocab_size=1000",), ("meta.json", "4,096 tokens", "model.vocab_size is 1,000")),
    (("train_input.target_length=20",), ("meta.json", "target sequences have 16 tokens", "--target_length 20")),
    (("model.relative_attention_num_buckets=2",), ("model.relative_attention_num_buckets 2",)),
    (("model.feed_forward_proj=swish",), ("model.feed_forward_proj", "swish")),
])
def test_bad_input_is_one_line(tmp_path, capsys, data_dir, overrides, fragments):
    argv = ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train",
            *with_data(data_dir, *overrides)]
    expect_one_error_line(capsys, argv, *fragments)

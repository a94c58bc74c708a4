"""tf/gpt2: the variable names, tied head, causal mask and loss against reference computations
(numpy, and pytorch/gpt2's logits through a converted checkpoint where torch is installed);
tiny training on the CPU and the emulator; a compile that initialises no weight; bad input."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.folder import import_beside, load_run_module
from common.data.text.lm import read_lm_meta
from common.data.text.tokenizer import read_gpt2
from common.params import load_params
from common.tf.estimator import ModeKeys
from tests.tiny_runs import tiny_runner, train_losses, with_data

GPT2 = os.path.join(zoo.ROOT, "tf", "gpt2")
CONFIGS = os.path.join(GPT2, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(GPT2, "run.py"), "model", "data", "utils")
v1 = tf.compat.v1
NO_DROPOUT = ("model.dropout_rate=0.0", "model.attention_dropout_rate=0.0", "model.embedding_dropout_rate=0.0")
GPTJ = ("model.position_embedding_type=rotary", "model.rotary_dim=16", "model.use_parallel_attention=true",
        "model.share_embedding_weights=false")


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the input_fn itself, into an empty data_dir (as on a fresh clone)."""
    folder = str(tmp_path_factory.mktemp("gpt2_data") / "msl128")
    with tf.Graph().as_default():
        data.eval_input_fn(params_of(TINY, *with_data(folder)))
    return folder


def random_ids(vocab, B=3, T=12, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (B, T)).astype(np.int32)


class Net:
    """gpt2_logits in a graph of its own, on (B, T) placeholders, with its variables initialised (seed 0)."""

    def __init__(self, *overrides, B=3, T=12):
        self.p = params_of(TINY, *NO_DROPOUT, *overrides)["model"]
        self.graph = tf.Graph()
        with self.graph.as_default():
            v1.set_random_seed(0)
            self.ids = v1.placeholder(tf.int32, [B, T])
            self.logits = tf.reshape(model.gpt2_logits(self.ids, self.p, training=False), [B, T, -1])
            self.variables = {v.op.name: v for v in v1.global_variables()}
            self.session = v1.Session(graph=self.graph)
            self.session.run(v1.global_variables_initializer())

    def __call__(self, ids):
        return self.session.run(self.logits, {self.ids: ids})

    def value(self, name):
        return self.session.run(self.variables[name])


def test_variables_have_the_gpt2_names_and_the_head_is_the_word_embedding():
    from common.gpt2_names import tf_name_to_torch, torch_names

    net = Net()
    shapes = {n: v.shape.as_list() for n, v in net.variables.items()}
    assert sorted(tf_name_to_torch(n)[0] for n in shapes) == sorted(torch_names(2))  # zoo convert maps each one
    assert shapes["transformer/h_0/attn/c_attn/kernel"] == [64, 3 * 64]  # Dense kernel [in, out]: q, k, v
    assert shapes["transformer/wte"] == [4096, 64] and not [n for n in shapes if n.startswith("lm_head")]
    ids = random_ids(4096)
    logits = net(ids)
    assert logits.shape == (3, 12, 4096)
    table = net.value("transformer/wte")
    table[7] += 1.0  # the output row of token 7 moves with its input row
    with net.graph.as_default():
        net.variables["transformer/wte"].load(table, net.session)
    assert not np.allclose(net(ids)[..., 7], logits[..., 7])


def test_the_gptj_form_has_its_own_head_no_position_table_and_one_norm_per_block():
    from common.gpt2_names import tf_name_to_torch, torch_names

    names = set(Net(*GPTJ).variables)
    assert {"lm_head/kernel", "lm_head/bias"} <= names
    assert not any("wpe" in n or "ln_2" in n for n in names)  # the rotary tables are constants, not variables
    expected = set(torch_names(2, parallel=True, tied=False)) - {"transformer.wpe.weight"}  # rotary: no table
    assert sorted(tf_name_to_torch(n)[0] for n in names) == sorted(expected)


@pytest.mark.parametrize("variant", [(), GPTJ], ids=["gpt2", "gptj"])
def test_a_position_never_sees_the_tokens_after_it(variant):
    net = Net(*variant)
    ids = random_ids(4096)
    changed = ids.copy()
    changed[:, 7:] = (changed[:, 7:] + 1) % 4096
    before, after = net(ids), net(changed)
    np.testing.assert_allclose(after[:, :7], before[:, :7], rtol=0, atol=1e-5)
    assert not np.allclose(after[:, 7:], before[:, 7:])


def test_the_causal_mask_is_one_sequence_by_sequence_constant():
    """Broadcast over the batch and the heads: no constant grows with the batch."""
    net = Net(B=5, T=12)
    masks = [op for op in net.graph.get_operations() if op.type == "SelectV2"]
    assert len(masks) == 2 and all(op.inputs[0].shape.as_list() == [12, 12] for op in masks)


def test_the_loss_is_the_masked_mean_of_a_reference_cross_entropy():
    params = params_of(TINY, *NO_DROPOUT)
    ids, labels = random_ids(4096), random_ids(4096, seed=1)
    mask = np.ones_like(ids)
    mask[2, 5:] = 0  # the padded tail of the corpus's last window
    with tf.Graph().as_default():
        v1.set_random_seed(0)
        features = {"input_ids": v1.placeholder(tf.int32, [3, 12]), "attention_mask": v1.placeholder(tf.int32, [3, 12])}
        label_ph = v1.placeholder(tf.int32, [3, 12])
        spec = model.model_fn(features, label_ph, ModeKeys.EVAL, params)
        logits = [op for op in tf.compat.v1.get_default_graph().get_operations()
                  if op.type == "SparseSoftmaxCrossEntropyWithLogits"][0].inputs[0]  # (B*T, V)
        _, (token_losses, predictions, _, _) = spec.host_call
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            loss, losses, predicted, logits = session.run(
                [spec.loss, token_losses, predictions, logits],
                {features["input_ids"]: ids, features["attention_mask"]: mask, label_ph: labels})
    logits = logits.astype(np.float64).reshape(3, 12, -1)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    assert loss == pytest.approx((ce * mask).sum() / mask.sum(), rel=1e-5)
    np.testing.assert_allclose(losses, ce, rtol=1e-4)
    np.testing.assert_array_equal(predicted, logits.argmax(-1))


@pytest.mark.parametrize("variant", [(), GPTJ], ids=["gpt2", "gptj"])
def test_logits_equal_pytorch_gpt2_through_a_converted_checkpoint(variant, tmp_path):
    """pytorch/gpt2's weights, converted by zoo convert (common/convert.py) into a TF checkpoint:
    the same logits (the rotary tables, parallel blocks and untied head included)."""
    torch = pytest.importorskip("torch")
    from common.convert import convert

    pt_model, pt_utils = import_beside(os.path.join(zoo.ROOT, "pytorch", "gpt2", "run.py"), "model", "utils")
    p = load_params(os.path.join(zoo.ROOT, "pytorch", "gpt2", "configs", "params_tiny.yaml"),
                    pt_utils.default_params(), [*NO_DROPOUT, *variant])["model"]
    torch.manual_seed(0)
    pt_net = pt_model.GPT2LMHeadModel(p).eval()
    torch.save(pt_net.state_dict(), tmp_path / "weights.pt")
    convert(str(tmp_path / "weights.pt"), str(tmp_path / "tf" / "model.ckpt-0"))
    ids = random_ids(4096, T=16)
    net = Net(*variant, T=16)
    with net.graph.as_default():
        v1.train.Saver(list(net.variables.values())).restore(net.session, str(tmp_path / "tf" / "model.ckpt-0"))
    with torch.no_grad():
        expected = pt_net(torch.from_numpy(ids).long()).numpy()
    np.testing.assert_allclose(net(ids), expected, rtol=1e-4, atol=1e-4)


def test_the_input_fn_prepares_the_default_corpus_and_yields_the_next_tokens(data_dir):
    assert {"encoder.json", "vocab.bpe", "meta.json", "train-00000.tfrecord", "eval-00000.tfrecord"} <= \
        set(os.listdir(data_dir))
    assert not [f for f in os.listdir(data_dir) if f.endswith(".h5")]  # this framework's format only
    features, labels = next(iter(data.train_input_fn(params_of(TINY, *with_data(data_dir)))))
    ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy()
    assert ids.shape == mask.shape == labels.shape == (8, 128) and labels.dtype == tf.int32
    assert np.array_equal(ids[:, 1:][mask[:, :-1] == 1], labels.numpy()[:, :-1][mask[:, :-1] == 1])


def test_a_split_smaller_than_a_batch_is_repeated_to_fill_one(data_dir):
    batches = list(data.eval_input_fn(params_of(TINY, *with_data(data_dir, "eval_input.batch_size=100"))))
    assert len(batches) == 1 and batches[0][1].shape == (100, 128)  # 54 eval windows, twice


train_tiny = tiny_runner(GPT2, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path, data_dir):
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.2
    metrics = train_tiny(tmp_path, "--mode", "eval", *with_data(data_dir))
    assert set(metrics) >= {"loss", "lm_perplexity", "accuracy"}
    assert 0 < metrics["accuracy"] < 1
    # every eval window is full but the corpus's last: the mean of the batch losses is close to the token mean
    assert metrics["lm_perplexity"] == pytest.approx(np.exp(metrics["loss"]), rel=0.02)
    assert metrics["lm_perplexity"] < 4096  # better than uniform over the vocab
    path = train_tiny(tmp_path, "--mode", "predict", *with_data(data_dir))
    with np.load(path) as predictions:  # each eval window's most likely next tokens
        assert predictions["predictions"].shape == (48, 128) and predictions["predictions"].max() < 4096


def test_a_trained_checkpoint_round_trips_through_hugging_face(tmp_path, data_dir):
    """zoo convert: the checkpoint to a Hugging Face directory (the keys from the params_train.yaml
    beside it, a TF config) and back to a TF checkpoint, bit for bit (safetensors go through torch)."""
    pytest.importorskip("torch")
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    from common.convert import convert
    from common.gpt2_names import read_gpt2_weights

    convert(str(tmp_path), str(tmp_path / "hf"))
    convert(str(tmp_path / "hf"), str(tmp_path / "back" / "model.ckpt-8"))
    trained, back = read_gpt2_weights(str(tmp_path)), read_gpt2_weights(str(tmp_path / "back" / "model.ckpt-8"))
    assert len(trained) == 28 and sorted(back) == sorted(trained)
    assert all(np.array_equal(back[n], trained[n]) for n in trained)


@pytest.mark.parametrize("variant", [(), GPTJ], ids=["gpt2", "gptj"])
def test_the_emulator_trains_and_evaluates_as_the_cpu(tmp_path, data_dir, variant):
    argv = with_data(data_dir, *NO_DROPOUT, *variant, "runconfig.max_steps=3", "runconfig.eval_steps=2")
    train_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    train_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(emulator) == 3 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    if variant:
        return  # one eval comparison is enough
    on_cpu = train_tiny(tmp_path / "emulator", "--mode", "eval", *argv)
    on_emulator = train_tiny(tmp_path / "emulator", "--mode", "eval", "--device", "emulator", *argv)
    for name in ("loss", "lm_perplexity", "accuracy"):
        assert on_emulator[name] == pytest.approx(on_cpu[name], rel=1e-4), name


# --- a compile reads shapes only: no weight is initialised, so a model larger than memory compiles ---


def test_a_compile_initialises_no_weight_or_optimizer_slot(data_dir):
    from common.tf.device_run import capture
    from common.tf.estimator import CerebrasEstimator, RunConfig
    from device.api import compile_graph

    params = params_of(TINY, *with_data(data_dir))
    estimator = CerebrasEstimator(model.model_fn, config=RunConfig.from_params(params, device="cpu"), params=params)
    run = estimator.open_session(data.train_input_fn, ModeKeys.TRAIN, mixed_policy=False, weights=False)
    try:
        with run.built.graph.as_default():
            uninitialised = {n.decode() for n in run.session.run(v1.report_uninitialized_variables())}
            trainable = {v.op.name for v in v1.trainable_variables()}
        assert trainable and trainable <= uninitialised
        assert {f"{n}/Adam" for n in trainable} | {f"{n}/Adam_1" for n in trainable} <= uninitialised
        assert uninitialised == trainable | {f"{n}/Adam" for n in trainable} | {f"{n}/Adam_1" for n in trainable}
        graph_ir = capture(estimator, run)  # the learning rate read at the session's step
    finally:
        run.close()
    result = compile_graph(graph_ir, mode="train", profile_name="wse2", execution_mode="pipelined")
    assert result.cost.samples_per_s > 0 and sum(k.weight_bytes for k in result.kernels) >= 4 * 370_432


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(GPT2).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0], err[-2000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def tiny_argv(tmp_path, *overrides):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train", *overrides]


def test_a_vocab_larger_than_the_embedding_table(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.vocab_size=1000")),
                          os.path.join(data_dir, "meta.json"), "4,096 tokens", "model.vocab_size is 1,000")


def test_a_sequence_longer_than_the_position_embeddings(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.max_position_embeddings=64")),
                          "max_sequence_length 128", "model.max_position_embeddings 64")


def test_data_of_another_sequence_length(tmp_path, capsys, data_dir):
    argv = with_data(data_dir, "train_input.max_sequence_length=64", "eval_input.max_sequence_length=64")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *argv), "meta.json", "128 tokens", "max_sequence_length is 64")


@pytest.mark.parametrize("overrides, fragments", [
    (("model.num_heads=3",), ("model.hidden_size 64", "model.num_heads 3")),
    (("model.position_embedding_type=rotary", "model.rotary_dim=33"), ("model.rotary_dim 33", "head size 32")),
    (("model.rotary_dim=16",), ("model.rotary_dim 16", "rotary positions only", "is learned")),
])
def test_sizes_that_do_not_divide(tmp_path, capsys, data_dir, overrides, fragments):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, *overrides)), *fragments)


# --- predict with a prompt file: greedy decoding -------------------------------------------------

# the first batch of 2 holds prompts of other lengths; the last batch is short
PROMPTS = "The standard library\n\n  \nClasses provide a means of bundling\nA function returns\n"


def reference_completion(checkpoint, ids, steps):
    """Greedy decoding as its definition: ``steps`` times, run the whole sequence (a graph of
    its length, the trained weights restored), append the argmax after its last token."""
    ids = list(ids)
    p = params_of(TINY, *NO_DROPOUT)["model"]
    for _ in range(steps):
        with tf.Graph().as_default(), v1.Session() as session:
            logits = model.gpt2_logits(tf.constant([ids], tf.int32), p, training=False)  # (T, V)
            v1.train.Saver().restore(session, checkpoint)
            ids.append(int(session.run(logits)[-1].argmax()))
    return ids


def test_predict_decodes_each_prompt_greedily_as_the_plain_loop(tmp_path, capsys, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS, encoding="utf-8")
    argv = with_data(data_dir, *NO_DROPOUT, "runconfig.max_steps=2")
    train_tiny(tmp_path / "run", "--mode", "train", *argv)
    train_tiny(tmp_path / "run", "--mode", "predict", *argv, f"predict_input.prompt_file={prompts}",
               "predict_input.max_new_tokens=3", "predict_input.batch_size=2")  # a short last batch
    lines = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert [(r["line"], r["prompt"]) for r in lines] == [(1, "The standard library"), (4, "Classes provide a means of bundling"),
                                                        (5, "A function returns")]
    tokenizer = read_gpt2(os.path.join(data_dir, "encoder.json"), os.path.join(data_dir, "vocab.bpe"))
    eot = read_lm_meta(data_dir)["eot_id"]
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "run"))
    with np.load(tmp_path / "run" / "predictions.npz") as arrays:
        tokens, prompt_length = arrays["tokens"], arrays["prompt_length"]
    for row, length, record in zip(tokens, prompt_length, lines):
        prompt_ids = tokenizer.encode(record["prompt"]).ids
        assert list(row[:length]) == prompt_ids
        expected = reference_completion(checkpoint, prompt_ids, 3)[len(prompt_ids):]
        assert list(row[length:length + 3]) == expected
        new = expected[:expected.index(eot)] if eot in expected else expected
        assert record["completion"] == tokenizer.decode(new)
    # a prompt the positions cannot hold with max_new_tokens after it: one line naming its file and line
    prompts.write_text("short\n" + "word " * 200 + "\n", encoding="utf-8")
    expect_one_error_line(capsys, ["--params", TINY, "--model_dir", str(tmp_path / "run"), "--mode", "predict",
                                   *argv, f"predict_input.prompt_file={prompts}"],
                          f"{prompts}:2", "max_new_tokens 32", "model.max_position_embeddings")
    # generating on the emulator: one line naming the loop, as PyTorch's predict_step
    prompts.write_text("short\n", encoding="utf-8")
    expect_one_error_line(capsys, ["--params", TINY, "--model_dir", str(tmp_path / "run"), "--mode", "predict",
                                   *argv, f"predict_input.prompt_file={prompts}", "--device", "emulator"],
                          "predicts by generating in a tf.while_loop", f"{os.path.join('tf', 'gpt2', 'model.py')}:",
                          "drop --device emulator")

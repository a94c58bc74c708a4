"""tf/llama: the variable names and layouts, the logits against the spec's math in numpy and
(where torch is installed) against transformers' LlamaForCausalLM / MistralForCausalLM with the
weights copied across, for multi-head and grouped-query attention, Llama 3.1's rotary
rescaling and Mistral's sliding window; greedy decoding with the key/value cache against
decoding by rerunning the whole sequence; the emulator's loss and gradients against
TensorFlow's; tiny training on the CPU; config errors in one line."""

import inspect
import json
import math
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # the torch-only env skips this module

from common import zoo  # noqa: E402
from common.data.text.lm import read_lm_meta  # noqa: E402
from common.data.text.tokenizer import read_tokenizer_json  # noqa: E402
from common.folder import import_beside, load_run_module  # noqa: E402
from common.params import load_params  # noqa: E402
from common.summaries import read_scalars  # noqa: E402
from tests.tiny_runs import tiny_runner, with_data

LLAMA = os.path.join(zoo.ROOT, "tf", "llama")
TINY = os.path.join(LLAMA, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(LLAMA, "run.py"), "model", "data", "utils")
v1 = tf.compat.v1

# tiny is hidden 64, 4 heads (head size 16), 2 key/value heads, filter 128, 2 layers
MHA = ("model.num_kv_heads=null",)
GQA = ()
# head size 16: wavelengths 2 pi 10000^(i/8) = 6.3, 19.9, 62.8, 199, ...; with 64 original positions
# (high 64/4 = 16, low 64/1 = 64) the first is kept, the next two interpolated, the rest slowed 8 x
LLAMA3 = ("model.rope_scaling={rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
          "original_max_position_embeddings: 64}", "model.rope_theta=10000.0")
WINDOW = ("model.sliding_window=5",)  # T = 12: the window cuts off most keys
TIED = ("model.share_embedding_weights=true", "model.num_kv_heads=1")
EPSILON = ("model.rms_norm_eps=0.5",)  # beside mean squares of about 1: where epsilon is added shows
VARIANTS = {"mha": MHA, "gqa": GQA, "llama3": LLAMA3, "window": WINDOW, "tied": TIED, "epsilon": EPSILON}


def params_of(*overrides):
    return load_params(TINY, utils.default_params(), list(overrides))


def random_ids(vocab=4096, B=2, T=12, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (B, T)).astype(np.int32)


def spread_weights(variables, seed=0):
    """Weights of unit-scale activations (the init's 0.02 leaves attention near uniform, where a
    wrong rotation or mask hardly shows): kernels N(0, 1/in), the table N(0, 1), norms U(0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    values = {}
    for name, shape in sorted(variables.items()):
        if name.endswith("/weight"):
            values[name] = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("/kernel"):
            values[name] = rng.standard_normal(shape) / math.sqrt(shape[0])
        else:
            values[name] = rng.standard_normal(shape)
    return {n: v.astype(np.float32) for n, v in values.items()}


class Net:
    """llama_logits in a graph of its own on (B, T) placeholders, its variables set to spread_weights."""

    def __init__(self, *overrides, B=2, T=12):
        self.p = params_of(*overrides)["model"]
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.ids = v1.placeholder(tf.int32, [B, T])
            self.logits = tf.reshape(model.llama_logits(self.ids, self.p), [B, T, -1])
            self.variables = {v.op.name: v for v in v1.global_variables()}
            self.weights = spread_weights({n: v.shape.as_list() for n, v in self.variables.items()})
            self.session = v1.Session(graph=self.graph)
            for name, value in self.weights.items():
                self.variables[name].load(value, self.session)

    def __call__(self, ids):
        return self.session.run(self.logits, {self.ids: ids})


# --- the spec's math in numpy (float64), written from the definitions, not from model.py -------------


def reference_frequencies(D, theta, scaling):
    """Each pair's angle per position; Llama 3.1's rescaling element by element, as its reference code."""
    freqs = []
    for i in range(D // 2):
        f = 1.0 / theta ** (2 * i / D)
        if scaling is not None:
            old, low, high, factor = (scaling["original_max_position_embeddings"], scaling["low_freq_factor"],
                                      scaling["high_freq_factor"], scaling["factor"])
            wavelength = 2 * math.pi / f
            if wavelength > old / low:
                f = f / factor
            elif wavelength >= old / high:
                s = (old / wavelength - low) / (high - low)
                f = (1 - s) * f / factor + s * f
        freqs.append(f)
    return np.array(freqs)


def reference_logits(ids, w, p):
    """ids (B, T) -> logits (B, T, V) float64 from the weights by their TF names."""
    w = {n: v.astype(np.float64) for n, v in w.items()}
    B, T = ids.shape
    H, nH = p["hidden_size"], p["num_heads"]
    nKV = p["num_kv_heads"] or nH
    D = H // nH
    eps = p["rms_norm_eps"]

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w[name]

    angles = np.arange(T)[:, None] * reference_frequencies(D, p["rope_theta"], p["rope_scaling"])[None]  # (T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)

    def rope(t):  # (B, T, n, D): dim i turns with dim i + D/2
        a, b = t[..., :D // 2], t[..., D // 2:]
        c, s = cos[None, :, None], sin[None, :, None]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    window = p["sliding_window"]
    allowed = np.array([[j <= i and (window is None or i - j < window) for j in range(T)] for i in range(T)])
    x = w["model/embed_tokens"][ids]  # (B, T, H)
    for layer in range(p["num_hidden_layers"]):
        pre = f"model/layers_{layer}/"
        h = rms(x, pre + "input_layernorm/weight")
        q = rope((h @ w[pre + "self_attn/q_proj/kernel"]).reshape(B, T, nH, D))
        k = rope((h @ w[pre + "self_attn/k_proj/kernel"]).reshape(B, T, nKV, D))
        v = (h @ w[pre + "self_attn/v_proj/kernel"]).reshape(B, T, nKV, D)
        out = np.zeros((B, T, nH, D))
        for head in range(nH):
            kv = head // (nH // nKV)  # the key/value head of this query head's group
            scores = np.einsum("btd,bsd->bts", q[:, :, head], k[:, :, kv]) / math.sqrt(D)
            scores = np.where(allowed[None], scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[:, :, head] = np.einsum("bts,bsd->btd", probs, v[:, :, kv])
        x = x + out.reshape(B, T, nH * D) @ w[pre + "self_attn/o_proj/kernel"]
        h = rms(x, pre + "post_attention_layernorm/weight")
        gate = h @ w[pre + "mlp/gate_proj/kernel"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[pre + "mlp/up_proj/kernel"])) @ w[pre + "mlp/down_proj/kernel"]
    x = rms(x, "model/norm/weight")
    return x @ (w["model/embed_tokens"].T if p["share_embedding_weights"] else w["lm_head/kernel"])


def assert_close(actual, expected, tol=1e-4):
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * float(np.abs(expected).max()))


# --- structure --------------------------------------------------------------------------------------


def test_variables_have_hugging_face_names_and_dense_layouts():
    with tf.Graph().as_default():
        model.llama_logits(v1.placeholder(tf.int32, [2, 12]), params_of()["model"])
        shapes = {v.op.name: v.shape.as_list() for v in v1.global_variables()}
    layer = {"input_layernorm/weight": [64], "post_attention_layernorm/weight": [64],
             "self_attn/q_proj/kernel": [64, 64], "self_attn/k_proj/kernel": [64, 32],  # 2 key/value heads of 16
             "self_attn/v_proj/kernel": [64, 32], "self_attn/o_proj/kernel": [64, 64],
             "mlp/gate_proj/kernel": [64, 128], "mlp/up_proj/kernel": [64, 128], "mlp/down_proj/kernel": [128, 64]}
    expected = {"model/embed_tokens": [4096, 64], "model/norm/weight": [64], "lm_head/kernel": [64, 4096]}
    expected.update({f"model/layers_{i}/{n}": s for i in range(2) for n, s in layer.items()})
    assert shapes == expected
    with tf.Graph().as_default():
        model.llama_logits(v1.placeholder(tf.int32, [2, 12]), params_of(*TIED)["model"])
        assert "lm_head/kernel" not in {v.op.name for v in v1.global_variables()}  # the table is the head


def test_the_masks_and_rotary_tables_are_constants_of_sequence_size():
    """One (T, T) mask for every layer, broadcast over the batch and the heads; no sin or cos in the graph."""
    net = Net(*WINDOW, B=5)
    ops = net.graph.get_operations()
    masks = [op for op in ops if op.type == "SelectV2"]
    assert len(masks) == 2 and all(op.inputs[0].op.type == "Const" and op.inputs[0].shape.as_list() == [12, 12]
                                   for op in masks)
    assert not [op for op in ops if op.type in ("Sin", "Cos")]
    # written from the mask's bytes at once (tf.constant appends a bool array element by element:
    # 25 s of llama2_7b's compile at MSL 4096)
    assert len(masks[0].inputs[0].op.get_attr("value").tensor_content) == 12 * 12


def test_the_loss_metrics_and_input_pipeline_are_tf_gpt2s_copies():
    """Deliberate copies (each folder stands alone): kept equal to tf/gpt2's here."""
    gpt2_model, gpt2_data = import_beside(os.path.join(zoo.ROOT, "tf", "gpt2", "run.py"), "model", "data")
    for mine, theirs, names in ((model, gpt2_model, ("token_losses", "lm_loss", "lm_metrics")),
                                (data, gpt2_data, ("shard_files", "check_lengths", "check_meta", "train_input_fn",
                                                   "eval_input_fn"))):
        for name in names:
            assert inspect.getsource(getattr(mine, name)) == inspect.getsource(getattr(theirs, name)), name


# --- the logits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_logits_equal_a_numpy_reference_of_the_spec(variant):
    net = Net(*variant)
    ids = random_ids()
    assert_close(net(ids), reference_logits(ids, net.weights, net.p))


def test_the_llama3_rescaling_changes_the_logits_and_the_window_is_not_the_causal_mask():
    """The variants above differ from plain rotary positions and a plain causal mask (so each
    comparison tests what it names)."""
    ids = random_ids()
    plain = Net()
    for variant in (LLAMA3, WINDOW):
        p = params_of(*variant)["model"]
        assert np.abs(reference_logits(ids, plain.weights, p) - plain(ids)).max() > 1e-2


def hugging_face_model(p):
    """transformers' LlamaForCausalLM (MistralForCausalLM with a window) of params p, eager attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    rope = {"rope_type": "default", "rope_theta": p["rope_theta"]}
    if p["rope_scaling"] is not None:
        rope = {**p["rope_scaling"], "rope_theta": p["rope_theta"]}
    common = dict(vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["filter_size"],
                  num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_heads"],
                  num_key_value_heads=p["num_kv_heads"] or p["num_heads"],
                  max_position_embeddings=p["max_position_embeddings"], rms_norm_eps=p["rms_norm_eps"],
                  tie_word_embeddings=p["share_embedding_weights"], rope_parameters=rope)
    if p["sliding_window"] is not None:
        config, cls = MistralConfig(sliding_window=p["sliding_window"], **common), MistralForCausalLM
    else:
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    config._attn_implementation = "eager"
    return cls(config).eval()


def hugging_face_name(tf_name):
    """model/layers_0/self_attn/q_proj/kernel -> model.layers.0.self_attn.q_proj.weight."""
    name = tf_name.replace("/layers_", "/layers/").replace("/kernel", "/weight").replace("/", ".")
    return name + ".weight" if name == "model.embed_tokens" else name


@pytest.mark.parametrize("variant", [MHA, GQA, LLAMA3, WINDOW, TIED], ids=["mha", "gqa", "llama3", "mistral", "tied"])
def test_logits_equal_hugging_face_with_the_weights_copied(variant):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    net = Net(*variant)
    hf = hugging_face_model(net.p)
    state = {hugging_face_name(n): torch.from_numpy(v.T.copy() if n.endswith("/kernel") else v)
             for n, v in net.weights.items()}
    if net.p["share_embedding_weights"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = random_ids()
    with torch.no_grad():
        expected = hf(torch.from_numpy(ids).long()).logits.numpy()
    assert_close(net(ids), expected)


@pytest.mark.parametrize("variant", [GQA, WINDOW], ids=["llama", "mistral"])
def test_a_hugging_face_directory_converts_to_a_checkpoint_tf_llama_reads(variant, tmp_path):
    """zoo convert (common/llama_names.py): save_pretrained's directory -> model.ckpt-0, whose
    variables give transformers' logits in tf/llama's graph."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from common.convert import convert

    net = Net(*variant)
    torch.manual_seed(0)
    hf = hugging_face_model(net.p)
    with torch.no_grad():
        for weight in hf.parameters():
            weight.normal_(0.0, 0.3)  # activations of unit scale, as spread_weights
    hf.save_pretrained(tmp_path / "hf")
    convert(str(tmp_path / "hf"), str(tmp_path / "tf" / "model.ckpt-0"))
    with net.graph.as_default():
        v1.train.Saver(list(net.variables.values())).restore(net.session, str(tmp_path / "tf" / "model.ckpt-0"))
    ids = random_ids()
    with torch.no_grad():
        expected = hf(torch.from_numpy(ids).long()).logits.numpy()
    assert_close(net(ids), expected)


# --- greedy decoding with the key/value cache --------------------------------------------------------


def reference_greedy(ids, weights, p, steps):
    """Greedy decoding as its definition: rerun the whole sequence, append its last position's argmax."""
    ids = list(ids)
    for _ in range(steps):
        ids.append(int(reference_logits(np.array([ids]), weights, p)[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("variant", [GQA, ("model.sliding_window=3",)], ids=["gqa", "window"])
def test_cached_decoding_equals_rerunning_the_whole_sequence(variant):
    """Prompts of 2, 5 and 4 tokens, 5 new tokens each: the window of 3 moves past every prompt's start."""
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    p = params_of(*variant)["model"]
    prompts = [[5, 9], [100, 7, 2000, 3, 64], [11, 12, 13, 14]]
    steps, length = 5, 5 + 5
    tokens = np.zeros((3, length), np.int32)
    for row, prompt in zip(tokens, prompts):
        row[:len(prompt)] = prompt
    with tf.Graph().as_default() as graph:
        ids, lengths = v1.placeholder(tf.int32, [3, length]), v1.placeholder(tf.int32, [3])
        decoded = model.greedy_decode(ids, lengths, p, steps)
        variables = {v.op.name: v for v in v1.global_variables()}
        weights = spread_weights({n: v.shape.as_list() for n, v in variables.items()})
        # a step of the loop runs one position per row: its scores are (B, heads, 1 query, L cached keys)
        library = {f.signature.name: f for f in graph.as_graph_def().library.function}
        loop = next(op for op in graph.get_operations() if op.type in ("While", "StatelessWhile"))
        body = function_def_to_graph(library[loop.get_attr("body").name], input_shapes=[t.shape for t in loop.inputs])
        scores = [op.outputs[0].shape.as_list() for op in body.get_operations() if op.type == "BatchMatMulV2"]
        assert scores == [[3, 4, 1, length], [3, 4, 1, 16]] * 2  # the scores, then the context, in 2 layers
        with v1.Session() as session:
            for name, value in weights.items():
                variables[name].load(value, session)
            got = session.run(decoded, {ids: tokens, lengths: [len(x) for x in prompts]})
    for row, prompt in zip(got, prompts):
        assert list(row[:len(prompt) + steps]) == reference_greedy(prompt, weights, p, steps)


# --- the emulator: the first step's loss and gradients -----------------------------------------------


@pytest.mark.parametrize("variant", [LLAMA3 + WINDOW, TIED], ids=["gqa-llama3-window", "tied-mqa"])
def test_the_emulator_gives_tensorflows_loss_and_gradients(variant):
    from device.capture import tf as capture_tf
    from device.runtime.program import Program

    p = params_of(*variant)["model"]
    ids, labels = random_ids(), random_ids(seed=1)
    mask = np.ones_like(ids)
    mask[1, 8:] = 0  # the padded tail of the corpus's last window
    with tf.Graph().as_default() as graph:
        inputs = [v1.placeholder(tf.int32, [2, 12]) for _ in range(3)]
        loss = model.lm_loss(model.token_losses(model.llama_logits(inputs[0], p), inputs[1]), inputs[2])
        variables = v1.trainable_variables()
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(loss, variables)]  # the table's: dense
        weights = spread_weights({v.op.name: v.shape.as_list() for v in variables})
        with v1.Session() as session:
            for v in variables:
                v.load(weights[v.op.name], session)
            feed = dict(zip(inputs, (ids, labels, mask)))
            tf_loss, tf_grads = session.run([loss, grads], feed)
            ir = capture_tf.capture(graph, inputs=inputs, loss=loss)
            ir_weights = capture_tf.read_weights(session, ir)
    emulated_loss, emulated = Program(ir, ir_weights, seed=0).gradients([ids, labels, mask])
    assert emulated_loss == pytest.approx(tf_loss, rel=1e-5)
    assert set(emulated) == {v.op.name for v in variables}
    scale = max(float(np.abs(g).max()) for g in tf_grads)
    for v, g in zip(variables, tf_grads):
        np.testing.assert_allclose(emulated[v.op.name], g, rtol=1e-4, atol=1e-5 * scale, err_msg=v.op.name)


# --- the runner: tiny training, eval and predict on the CPU; bad input -------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the input_fn itself, into an empty data_dir (as on a fresh clone)."""
    folder = str(tmp_path_factory.mktemp("llama_data") / "msl128")
    with tf.Graph().as_default():
        data.eval_input_fn(params_of(*with_data(folder)))
    return folder


def test_the_input_fn_prepares_the_default_corpus_with_its_tokenizer_json(data_dir):
    assert {"tokenizer.json", "encoder.json", "vocab.bpe", "meta.json", "train-00000.tfrecord",
            "eval-00000.tfrecord"} <= set(os.listdir(data_dir))
    assert not [f for f in os.listdir(data_dir) if f.endswith(".h5")]  # this framework's format only
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 4096 and tokenizer.token_to_id("<|endoftext|>") == 0
    features, labels = next(iter(data.train_input_fn(params_of(*with_data(data_dir)))))
    ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy()
    assert ids.shape == mask.shape == labels.shape == (8, 128) and labels.dtype == tf.int32
    assert np.array_equal(ids[:, 1:][mask[:, :-1] == 1], labels.numpy()[:, :-1][mask[:, :-1] == 1])


run_tiny = tiny_runner(LLAMA, TINY)


def test_tiny_trains_evaluates_and_completes_prompts_on_the_cpu(tmp_path, capsys, data_dir):
    run_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = [v for _, v in read_scalars(os.path.join(str(tmp_path), "train"))["loss"]]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.2
    metrics = run_tiny(tmp_path, "--mode", "eval", *with_data(data_dir))
    assert 0 < metrics["accuracy"] < 1 and metrics["lm_perplexity"] < 4096  # better than uniform
    assert metrics["lm_perplexity"] == pytest.approx(np.exp(metrics["loss"]), rel=0.02)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The standard library\n\nA function returns\n", encoding="utf-8")
    run_tiny(tmp_path, "--mode", "predict", *with_data(data_dir), f"predict_input.prompt_file={prompts}",
             "predict_input.max_new_tokens=4")
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [(r["line"], r["prompt"]) for r in lines] == [(1, "The standard library"), (3, "A function returns")]
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
    eot = read_lm_meta(data_dir)["eot_id"]
    with np.load(tmp_path / "predictions.npz") as arrays:
        for row, length, record in zip(arrays["tokens"], arrays["prompt_length"], lines):
            assert list(row[:length]) == tokenizer.encode(record["prompt"]).ids
            new = [int(t) for t in row[length:length + 4]]
            new = new[:new.index(eot)] if eot in new else new
            assert record["completion"] == tokenizer.decode(new)
    # generating on the emulator: one line naming the loop, as tf/gpt2's
    argv = ["--params", TINY, "--model_dir", str(tmp_path), "--mode", "predict", *with_data(data_dir),
            f"predict_input.prompt_file={prompts}", "--device", "emulator"]
    expect_one_error_line(capsys, argv,
                          "predicts by generating in a tf.while_loop", f"{os.path.join('tf', 'llama', 'model.py')}:",
                          "drop --device emulator")


def test_a_trained_checkpoint_round_trips_through_hugging_face(tmp_path, data_dir):
    """zoo convert: tf/llama's model_dir to a Hugging Face directory (the keys from the
    params_train.yaml beside it) and back to a TF checkpoint, bit for bit."""
    pytest.importorskip("torch")
    from common.convert import convert
    from common.llama_names import read_llama_weights

    run_tiny(tmp_path, "--mode", "train", *with_data(data_dir), "runconfig.max_steps=2")
    convert(str(tmp_path), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"], config["intermediate_size"]) == ("llama", 2, 128)
    convert(str(tmp_path / "hf"), str(tmp_path / "back" / "model.ckpt-2"))
    trained, back = read_llama_weights(str(tmp_path)), read_llama_weights(str(tmp_path / "back" / "model.ckpt-2"))
    assert len(trained) == 2 + 2 * 9 + 1 and sorted(back) == sorted(trained)  # embedding, 2 layers, norm, head
    assert trained["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # torch's [out, in]
    assert all(np.array_equal(back[n], trained[n]) for n in trained)


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(LLAMA).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0], err[-2000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def scaling(**changes):
    """A rope_scaling override: the test configs' llama3 keys with ``changes`` (None drops a key)."""
    keys = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, **changes}
    return "model.rope_scaling={" + ", ".join(f"{k}: {v}" for k, v in keys.items() if v is not None) + "}"


@pytest.mark.parametrize("overrides, fragments", [
    (("model.num_heads=3",), ("model.hidden_size 64", "model.num_heads 3")),
    (("model.hidden_size=72", "model.num_heads=8", "model.num_kv_heads=4"), ("head size 9", "even")),
    (("model.num_kv_heads=3",), ("model.num_kv_heads 3", "model.num_heads 4")),
    (("model.sliding_window=0",), ("model.sliding_window",)),
    ((scaling(rope_type="linear"),), ("model.rope_scaling.rope_type 'linear'", "only llama3")),
    ((scaling(beta_fast=32),), ("model.rope_scaling.beta_fast", "not a key")),
    ((scaling(original_max_position_embeddings=None),),
     ("model.rope_scaling.original_max_position_embeddings is missing",)),
    ((scaling(factor="eight"),), ("model.rope_scaling.factor 'eight'", "a number")),
    ((scaling(high_freq_factor=1.0),), ("model.rope_scaling.high_freq_factor 1.0", "low_freq_factor 1.0")),
])
def test_a_config_the_model_cannot_take_is_one_error_line(tmp_path, capsys, data_dir, overrides, fragments):
    argv = ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train",
            *with_data(data_dir, *overrides)]
    expect_one_error_line(capsys, argv, *fragments)

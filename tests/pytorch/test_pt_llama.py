"""pytorch/llama: the logits against Hugging Face's LlamaForCausalLM and MistralForCausalLM given
the same state_dict (multi-head, grouped-query, Llama 3.1's rope scaling, a sliding window,
a tied head), greedy decoding with the key/value cache against decoding without it, the
emulator's first step (loss and gradients) and tiny training against the CPU's, and bad
input."""

import inspect
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")

from common import zoo  # noqa: E402
from common.data.text.lm import read_lm_meta  # noqa: E402
from common.data.text.tokenizer import read_tokenizer_json  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import load_params  # noqa: E402
from common.pytorch.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from tests.tiny_runs import tiny_runner, train_losses, with_data

LLAMA = os.path.join(zoo.ROOT, "pytorch", "llama")
TINY = os.path.join(LLAMA, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(LLAMA, "run.py"), "model", "data", "utils")
gpt2_model = import_beside(os.path.join(zoo.ROOT, "pytorch", "gpt2", "run.py"), "model")
MHA = ("model.num_kv_heads=null",)
# head size 16, theta 5e5: wavelengths 6.3 (kept: below 64 / 4), 33 (smoothed), 168 and more (slowed: above 64)
LLAMA3 = ("model.rope_theta=500000.0", "model.rope_scaling={rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, "
          "high_freq_factor: 4.0, original_max_position_embeddings: 64}")


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: one thread is faster than two on shared cores (the runner sets its own)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def params_of(*overrides):
    return load_params(TINY, utils.default_params(), list(overrides))


def tiny_net(*overrides, seed=0):
    torch.manual_seed(seed)
    return model.LlamaForCausalLM(params_of(*overrides)["model"]).eval()


def random_ids(B=2, T=48, seed=1, vocab=4096):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the network against Hugging Face's ------------------------------------------------------------


def hugging_face(p, mistral_window=None):
    """transformers' LlamaForCausalLM (MistralForCausalLM with a window) of the config ``p``, eager attention."""
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "default", "rope_theta": p["rope_theta"]}
    if p["rope_scaling"] is not None:
        rope = {**dict(p["rope_scaling"]), "rope_theta": p["rope_theta"]}
    common = dict(vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["filter_size"],
                  num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_heads"],
                  num_key_value_heads=p["num_kv_heads"], max_position_embeddings=p["max_position_embeddings"],
                  rms_norm_eps=p["rms_norm_eps"], rope_parameters=rope,
                  tie_word_embeddings=p["share_embedding_weights"],
                  attn_implementation="eager")
    if mistral_window is not None:
        return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=mistral_window, **common))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


def assert_logits_equal_hugging_face(overrides, mistral_window=None, T=48):
    p = params_of(*overrides)["model"]
    net = tiny_net(*overrides)
    hf = hugging_face(p, mistral_window).eval()
    hf.load_state_dict(net.state_dict(), strict=not p["share_embedding_weights"])  # HF's names: no renaming
    ids = random_ids(T=T)
    with torch.no_grad():
        ours = net(ids)
        torch.testing.assert_close(ours, hf(ids).logits, rtol=1e-5, atol=1e-5)
    return net, ours


def test_weights_have_hugging_face_names_and_layouts():
    p = params_of()["model"]
    ours = tiny_net().state_dict()
    theirs = hugging_face(p).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert ours["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)  # 2 kv heads of 16: [out, in]
    assert ours["model.layers.0.mlp.gate_proj.weight"].shape == (128, 64)
    tied = tiny_net("model.share_embedding_weights=true")
    assert "lm_head.weight" not in dict(tied.named_parameters())


@pytest.mark.parametrize("overrides", [(), MHA, ("model.share_embedding_weights=true",)],
                         ids=["gqa", "mha", "tied_head"])
def test_logits_equal_hugging_face_llama(overrides):
    assert_logits_equal_hugging_face(overrides)


def test_logits_equal_hugging_face_llama3_rope_scaling():
    _, scaled = assert_logits_equal_hugging_face(LLAMA3)
    with torch.no_grad():
        plain = tiny_net("model.rope_theta=500000.0")(random_ids())
    assert not torch.allclose(scaled, plain, atol=1e-3)  # the rescaling changed the frequencies
    p = params_of(*LLAMA3)["model"]
    inv_freq = hugging_face(p).model.rotary_emb.inv_freq.numpy()
    tables = model.rope_tables(8, 16, p["rope_theta"], p["rope_scaling"])
    np.testing.assert_allclose(tables[0, 1, :8], np.cos(inv_freq), rtol=1e-6)  # position 1's angles are inv_freq


def test_logits_equal_hugging_face_mistral_with_a_window_shorter_than_the_sequence():
    net, windowed = assert_logits_equal_hugging_face(("model.sliding_window=5",), mistral_window=5)
    with torch.no_grad():
        full = tiny_net()(random_ids())
    torch.testing.assert_close(windowed[:, :5], full[:, :5], rtol=1e-5, atol=1e-5)  # inside the window: no change
    assert not torch.allclose(windowed[:, 5:], full[:, 5:], atol=1e-3)


def test_the_sliding_window_mask_is_hugging_faces():
    mask = model.attention_mask(6, 6, 0, 3, "cpu").int().tolist()
    assert mask == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                    [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]  # i - 3 < j <= i
    # queries 4 and 5 against a cache of 4 positions: the same rows
    assert model.attention_mask(2, 6, 4, 3, "cpu").int().tolist() == mask[4:]


def test_the_loss_and_metrics_are_gpt2s_copies():
    for name in ("token_losses", "lm_loss", "NextTokenAccuracy", "Perplexity"):
        assert inspect.getsource(getattr(model, name)) == inspect.getsource(getattr(gpt2_model, name)), name


# --- greedy decoding with the key/value cache ------------------------------------------------------


def prompt_rows(lengths, width, seed=3):
    tokens = torch.zeros(len(lengths), width, dtype=torch.int64)
    for row, n in enumerate(lengths):
        tokens[row, :n] = random_ids(B=1, T=n, seed=seed + row)[0]
    return tokens, torch.tensor(lengths)


@pytest.mark.parametrize("overrides", [(), ("model.sliding_window=4",)], ids=["gqa", "window"])
def test_decoding_with_the_cache_equals_decoding_without_it(overrides):
    net = tiny_net(*overrides)
    tokens, lengths = prompt_rows([3, 9, 6], width=9 + 12)
    cached = model.greedy_decode(net, tokens, lengths, 12)
    plain = model.greedy_decode(net, tokens, lengths, 12, use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    for row, n in enumerate(lengths.tolist()):  # each row alone, the whole sequence each step: the definition
        ids = tokens[row, :n].tolist()
        with torch.no_grad():
            for _ in range(12):
                ids.append(int(net(torch.tensor([ids]))[0, -1].argmax()))
        assert cached[row, :n + 12].tolist() == ids
        assert not cached[row, n + 12:].any()  # past its new tokens a row keeps its padding


def test_decoding_with_the_cache_runs_one_position_a_step():
    net = tiny_net()
    widths = []
    hook = net.model.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    tokens, lengths = prompt_rows([3, 5], width=5 + 4)
    model.greedy_decode(net, tokens, lengths, 4)
    hook.remove()
    assert widths == [3] + [1] * 5  # every row's prompt at once, then positions 3 .. 7 one at a time


# --- the emulator's first step against torch's -----------------------------------------------------


def test_the_emulators_first_step_loss_and_gradients_are_torchs():
    from common.pytorch.device_run import capture_step
    from device.api import build_program
    from device.capture.torch import weights_of

    params = params_of("model.sliding_window=6", "model.num_hidden_layers=1")  # GQA and a window on the device
    torch.manual_seed(0)
    m = model.model_fn(params, torch.device("cpu"))
    ids, labels = random_ids(B=2, T=16, seed=4), random_ids(B=2, T=16, seed=5)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    batch = (ids, mask, labels)
    graph, _ = capture_step(m, batch, True, params)
    loss, grads = build_program(graph, weights_of(m.model, graph)).gradients([t.numpy() for t in batch])
    m.model.train()
    m.model.zero_grad()
    expected = m(batch)
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    torch_grads = {n: p.grad.numpy() for n, p in m.model.named_parameters()}
    assert set(grads) == set(torch_grads)
    for name, grad in torch_grads.items():
        np.testing.assert_allclose(grads[name], grad, rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_graph_holds_one_mask_and_one_rotary_table_for_every_layer():
    """At MSL 4096 a (T, T) float mask is 64 MiB: one for each of 80 layers would not fit a compile's memory."""
    from common.pytorch.device_run import capture_step

    params = params_of("model.sliding_window=6", "model.num_hidden_layers=3")
    m = model.model_fn(params, torch.device("cpu"))
    batch = (random_ids(B=2, T=12), torch.ones(2, 12, dtype=torch.int64), random_ids(B=2, T=12, seed=2))
    graph, _ = capture_step(m, batch, True, params)
    shapes = [np.shape(c) for c in graph.constants.values()]
    assert shapes.count((12, 12)) == 1  # the additive mask, window included
    assert shapes.count((12, 16)) == 2  # cos and sin: (T, head size)


# --- the folder: data, training on the CPU and the emulator, predict -------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the loader itself (as on a fresh clone), once for the module."""
    folder = tmp_path_factory.mktemp("llama_msl128")
    data.get_eval_dataloader(params_of(f"eval_input.data_dir={folder}"))
    return str(folder)


run_tiny = tiny_runner(LLAMA, TINY)


def test_the_loader_writes_tokenizer_json_beside_the_shards(data_dir):
    assert {"tokenizer.json", "meta.json", "train-00000.h5", "eval-00000.h5"} <= set(os.listdir(data_dir))
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
    assert tokenizer.get_vocab_size() == read_lm_meta(data_dir)["vocab_size"] == 4096
    batch = next(iter(data.get_train_dataloader(params_of(*with_data(data_dir)))))
    assert [tuple(t.shape) for t in batch] == [(8, 128)] * 3 and all(t.dtype == torch.int64 for t in batch)


def test_tiny_trains_on_the_emulator_as_on_the_cpu_and_evaluates(tmp_path, data_dir):
    argv = with_data(data_dir, "runconfig.max_steps=3", "runconfig.eval_steps=2")
    run_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    run_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(cpu) == 3 and cpu[-1] < cpu[0]
    assert emulator[0] == pytest.approx(cpu[0], rel=1e-6, abs=1e-5)
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    metrics = run_tiny(tmp_path / "cpu", "--mode", "eval", *argv)
    assert set(metrics) >= {"loss", "lm_perplexity", "accuracy"} and 0 < metrics["accuracy"] < 1
    assert metrics["lm_perplexity"] == pytest.approx(np.exp(metrics["loss"]), rel=0.02)
    assert metrics["lm_perplexity"] < 4096  # better than uniform over the vocab


def test_predict_writes_the_greedy_completions_of_each_prompt(tmp_path, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The standard library\n\nA function returns\nClasses provide a means of bundling\n",
                       encoding="utf-8")
    argv = with_data(data_dir, "runconfig.max_steps=2")
    run_tiny(tmp_path / "run", "--mode", "train", *argv)
    run_tiny(tmp_path / "run", "--mode", "predict", *argv, f"predict_input.prompt_file={prompts}",
             "predict_input.max_new_tokens=5", "predict_input.batch_size=3")
    lines = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert [(r["line"], r["prompt"]) for r in lines] == [(1, "The standard library"), (3, "A function returns"),
                                                        (4, "Classes provide a means of bundling")]
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
    net = model.LlamaForCausalLM(params_of()["model"])
    net.load_state_dict(load_checkpoint(latest_checkpoint(str(tmp_path / "run")))["model"])
    net.eval()
    eot = read_lm_meta(data_dir)["eot_id"]
    with np.load(tmp_path / "run" / "predictions.npz") as arrays:
        tokens, prompt_length = arrays["tokens"], arrays["prompt_length"]
    for row, length, record in zip(tokens, prompt_length, lines):
        ids = tokenizer.encode(record["prompt"]).ids
        assert list(row[:length]) == ids
        with torch.no_grad():
            for _ in range(5):
                ids.append(int(net(torch.tensor([ids]))[0, -1].argmax()))
        new = ids[length:]
        assert list(row[length:length + 5]) == new
        assert record["completion"] == tokenizer.decode(new[:new.index(eot)] if eot in new else new)


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


@pytest.mark.parametrize("overrides, fragments", [
    (("model.num_kv_heads=3",), ("model.num_kv_heads 3", "does not divide model.num_heads 4")),
    (("model.num_heads=3",), ("model.hidden_size 64", "model.num_heads 3")),
    (("model.num_heads=64", "model.num_kv_heads=null"), ("head size 1", "odd")),
    (("model.rope_scaling={rope_type: yarn, factor: 8.0}",), ("model.rope_scaling.rope_type 'yarn'", "llama3")),
    (("model.rope_scaling={rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
      "original_max_position_embeddings: 32, beta_fast: 32}",), ("model.rope_scaling.beta_fast", "unknown key")),
    (("model.rope_scaling={rope_type: llama3, factor: 8.0}",), ("model.rope_scaling.low_freq_factor None",)),
    (("model.sliding_window=0",), ("sliding_window",)),
])
def test_bad_model_config_is_one_line(tmp_path, capsys, data_dir, overrides, fragments):
    with pytest.raises(SystemExit) as exit_info:
        run_tiny(tmp_path / "model", "--mode", "train", *with_data(data_dir, *overrides))
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]

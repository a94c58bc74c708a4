"""pytorch/gpt2: the network's names, tied head, causal mask and loss against reference
computations (Hugging Face's GPT-2 and GPT-J with the same weights, where transformers is
installed); tiny training on the CPU and the emulator; and bad input."""

import json
import os

import numpy as np
import pytest
import torch

from common import zoo
from common.folder import import_beside, load_run_module
from common.data.text.lm import read_lm_meta
from common.data.text.tokenizer import read_gpt2
from common.params import load_params
from common.pytorch.checkpoint import latest_checkpoint, load_checkpoint
from tests.tiny_runs import tiny_runner, train_losses, with_data

GPT2 = os.path.join(zoo.ROOT, "pytorch", "gpt2")
CONFIGS = os.path.join(GPT2, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(GPT2, "run.py"), "model", "data", "utils")
NO_DROPOUT = ("model.dropout_rate=0.0", "model.attention_dropout_rate=0.0", "model.embedding_dropout_rate=0.0")
GPTJ = ("model.position_embedding_type=rotary", "model.rotary_dim=16", "model.use_parallel_attention=true",
        "model.share_embedding_weights=false")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The default corpus prepared by the loader itself (as on a fresh clone), once for the module."""
    folder = tmp_path_factory.mktemp("gpt2_msl128")
    data.get_eval_dataloader(params_of(TINY, f"eval_input.data_dir={folder}"))
    return str(folder)


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def tiny_net(*overrides):
    torch.manual_seed(0)
    return model.GPT2LMHeadModel(params_of(TINY, *NO_DROPOUT, *overrides)["model"])


def random_ids(vocab, B=3, T=12, seed=0):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def test_weights_have_hugging_face_names_and_the_head_is_the_word_embedding():
    net = tiny_net()
    names = set(net.state_dict())
    block = [f"transformer.h.1.{n}.{w}" for n in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc",
                                                   "mlp.c_proj") for w in ("weight", "bias")]
    assert names == {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                     "transformer.ln_f.bias", *block, *[b.replace("h.1.", "h.0.") for b in block]}
    assert net.transformer.h[0].attn.c_attn.weight.shape == (3 * 64, 64)  # nn.Linear [out, in]: q, k, v
    assert len(list(net.parameters())) == len(names)  # the head adds no parameter
    ids = random_ids(4096)
    logits = net(ids)
    assert logits.shape == (3, 12, 4096)
    table = net.transformer.wte.weight
    with torch.no_grad():
        table[7] += 1.0  # the output row of token 7 moves with its input row
        moved = net(ids)
    assert not torch.allclose(moved[..., 7], logits[..., 7])


def test_the_gptj_form_has_its_own_head_no_position_table_and_one_norm_per_block():
    net = tiny_net(*GPTJ)
    names = set(net.state_dict())
    assert {"lm_head.weight", "lm_head.bias"} <= names
    assert not any("wpe" in n or "ln_2" in n or "rotary" in n for n in names)  # the tables are not saved
    assert net.lm_head.weight is not net.transformer.wte.weight


@pytest.mark.parametrize("variant", [(), GPTJ], ids=["gpt2", "gptj"])
def test_a_position_never_sees_the_tokens_after_it(variant):
    net = tiny_net(*variant)
    ids = random_ids(4096)
    with torch.no_grad():
        before = net(ids)
        changed = ids.clone()
        changed[:, 7:] = (changed[:, 7:] + 1) % 4096
        after = net(changed)
    torch.testing.assert_close(after[:, :7], before[:, :7], rtol=0, atol=1e-5)
    assert not torch.allclose(after[:, 7:], before[:, 7:])


def test_the_loss_is_the_masked_mean_of_a_reference_cross_entropy():
    params = params_of(TINY, *NO_DROPOUT)
    m = model.model_fn(params, torch.device("cpu"))
    ids, labels = random_ids(4096), random_ids(4096, seed=1)
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0  # the padded tail of the corpus's last window
    m.model.eval()
    with torch.no_grad():
        loss, outputs = m((ids, mask, labels))
        logits = m.model(ids).double().numpy()
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_probs, labels.numpy()[..., None], -1)[..., 0]
    assert loss.item() == pytest.approx((ce * mask.numpy()).sum() / mask.numpy().sum(), rel=1e-5)
    np.testing.assert_allclose(outputs["token_losses"].numpy(), ce, rtol=1e-4)
    assert torch.equal(outputs["predictions"], torch.from_numpy(logits.argmax(-1)))
    m.model.train()
    assert isinstance(m((ids, mask, labels)), torch.Tensor)  # training: the loss alone (no argmax in the graph)


def test_logits_equal_hugging_face_gpt2_with_the_same_weights():
    transformers = pytest.importorskip("transformers")
    p = params_of(TINY, *NO_DROPOUT)["model"]
    net = tiny_net()
    config = transformers.GPT2Config(vocab_size=p["vocab_size"], n_positions=p["max_position_embeddings"],
                                     n_embd=p["hidden_size"], n_layer=p["num_hidden_layers"], n_head=p["num_heads"],
                                     n_inner=p["filter_size"], activation_function="gelu_new", resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=p["layer_norm_epsilon"])
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = net.state_dict()
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # HF's Conv1D stores [in, out]
    state = {k: (w.t() if k.endswith(conv1d) else w) for k, w in ours.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to wte in HF too
    ids = random_ids(p["vocab_size"], T=16)
    with torch.no_grad():
        torch.testing.assert_close(net(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_logits_equal_hugging_face_gptj_with_the_same_weights():
    transformers = pytest.importorskip("transformers")
    p = params_of(TINY, *NO_DROPOUT, *GPTJ)["model"]
    net = tiny_net(*GPTJ)
    H = p["hidden_size"]
    config = transformers.GPTJConfig(vocab_size=p["vocab_size"], n_positions=p["max_position_embeddings"], n_embd=H,
                                     n_layer=p["num_hidden_layers"], n_head=p["num_heads"], n_inner=p["filter_size"],
                                     rotary_dim=p["rotary_dim"], activation_function="gelu_new", resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=p["layer_norm_epsilon"],
                                     tie_word_embeddings=False)
    hf = transformers.GPTJForCausalLM(config).eval()
    state = {"transformer.wte.weight": net.transformer.wte.weight, "lm_head.weight": net.lm_head.weight,
             "lm_head.bias": net.lm_head.bias, "transformer.ln_f.weight": net.transformer.ln_f.weight,
             "transformer.ln_f.bias": net.transformer.ln_f.bias}
    with torch.no_grad():
        for i, block in enumerate(net.transformer.h):
            block.attn.c_attn.bias.zero_()  # GPT-J's attention projections have no bias
            block.attn.c_proj.bias.zero_()
            q, k, v = block.attn.c_attn.weight.split(H)
            state.update({f"transformer.h.{i}.attn.q_proj.weight": q, f"transformer.h.{i}.attn.k_proj.weight": k,
                          f"transformer.h.{i}.attn.v_proj.weight": v,
                          f"transformer.h.{i}.attn.out_proj.weight": block.attn.c_proj.weight,
                          f"transformer.h.{i}.ln_1.weight": block.ln_1.weight,
                          f"transformer.h.{i}.ln_1.bias": block.ln_1.bias,
                          f"transformer.h.{i}.mlp.fc_in.weight": block.mlp.c_fc.weight,
                          f"transformer.h.{i}.mlp.fc_in.bias": block.mlp.c_fc.bias,
                          f"transformer.h.{i}.mlp.fc_out.weight": block.mlp.c_proj.weight,
                          f"transformer.h.{i}.mlp.fc_out.bias": block.mlp.c_proj.bias})
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert unexpected == [] and all("embed_positions" in k or "masked_bias" in k or ".bias" in k and "attn" in k
                                    for k in missing), missing
    ids = random_ids(p["vocab_size"], T=16)
    with torch.no_grad():
        torch.testing.assert_close(net(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_the_loader_prepares_the_default_corpus_and_yields_tuples(data_dir):
    assert {"encoder.json", "vocab.bpe", "meta.json", "train-00000.h5", "eval-00000.h5"} <= set(os.listdir(data_dir))
    assert not [f for f in os.listdir(data_dir) if f.endswith(".tfrecord")]  # this framework's format only
    batch = next(iter(data.get_train_dataloader(params_of(TINY, *with_data(data_dir)))))
    assert [tuple(t.shape) for t in batch] == [(8, 128)] * 3 and all(t.dtype == torch.int64 for t in batch)
    ids, mask, labels = batch
    assert torch.equal(ids[:, 1:][mask[:, :-1] == 1], labels[:, :-1][mask[:, :-1] == 1])  # the next token


def test_a_split_smaller_than_a_batch_is_repeated_to_fill_one(data_dir):
    loader = data.get_eval_dataloader(params_of(TINY, *with_data(data_dir, "eval_input.batch_size=100")))
    assert len(loader.dataset) == 2 * 54 and len(list(loader)) == 1


train_tiny = tiny_runner(GPT2, TINY)


def test_tiny_trains_and_evaluates_on_the_cpu(tmp_path, data_dir):
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
    with np.load(path) as predictions:  # each eval window's most likely next tokens and their losses
        assert predictions["predictions"].shape == predictions["token_losses"].shape == (48, 128)
        assert predictions["predictions"].max() < 4096


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


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(GPT2).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]


def tiny_argv(tmp_path, *overrides, mode="train"):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", mode, *overrides]


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


# --- a model larger than this machine's memory compiles from a build without weights ------------


def compiled_kernels(m, params):
    from common.pytorch.device_run import capture_step
    from device.api import compile_graph

    batch = tuple(random_ids(params["model"]["vocab_size"], B=8, T=128, seed=s) for s in range(3))
    graph, _ = capture_step(m, batch, True, params)
    result = compile_graph(graph, mode="train", profile_name="wse2", execution_mode="pipelined")
    return [(k.kind, k.flops_fwd, k.weight_bytes) for k in result.kernels], result.cost.samples_per_s


@pytest.mark.parametrize("variant", [(), GPTJ], ids=["gpt2", "gptj"])
def test_a_model_too_big_for_memory_compiles_as_the_real_one(variant):
    from common.pytorch.device_run import model_for_capture

    params = params_of(TINY, *variant)
    real = model_for_capture(model.model_fn, params, memory=2**40)
    stand_in = model_for_capture(model.model_fn, params, memory=1000)  # "1000 bytes available"
    assert all(p.stride() == (1,) or p.stride()[-1] == 1 for p in real.model.parameters())
    assert all(set(p.stride()) == {0} and p.device.type == "cpu" for p in stand_in.model.parameters())
    if not variant:  # the tied head stays one parameter
        assert len(list(stand_in.model.parameters())) == len(list(real.model.parameters())) == 28
    optimized = [p for g in stand_in.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in stand_in.model.parameters()}
    assert compiled_kernels(stand_in, params) == compiled_kernels(real, params)


def test_a_model_too_big_for_memory_with_a_buffer_is_refused():
    from common.errors import UserError
    from common.pytorch.device_run import model_for_capture

    def with_buffer(params, device):
        m = model.model_fn(params, device)
        m.model.register_buffer("table", torch.ones(3))
        return m

    with pytest.raises(UserError, match=r"weights need .* GiB, more than half .* buffer 'table' would have no value"):
        model_for_capture(with_buffer, params_of(TINY), memory=1000)


# --- predict with a prompt file: greedy decoding -------------------------------------------------

PROMPTS = "The standard library\n\n  \nA function returns\nClasses provide a means of bundling\n"


def reference_completion(net, ids, steps):
    """Greedy decoding as its definition: ``steps`` times, run the whole sequence, append the last argmax."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(net(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_predict_decodes_each_prompt_greedily_as_the_plain_loop(tmp_path, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS, encoding="utf-8")
    argv = with_data(data_dir, *NO_DROPOUT, "runconfig.max_steps=2")
    train_tiny(tmp_path / "run", "--mode", "train", *argv)
    train_tiny(tmp_path / "run", "--mode", "predict", *argv, f"predict_input.prompt_file={prompts}",
               "predict_input.max_new_tokens=6", "predict_input.batch_size=3")  # one batch, prompts of other lengths
    lines = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert [(r["line"], r["prompt"]) for r in lines] == [(1, "The standard library"), (4, "A function returns"),
                                                        (5, "Classes provide a means of bundling")]
    tokenizer = read_gpt2(os.path.join(data_dir, "encoder.json"), os.path.join(data_dir, "vocab.bpe"))
    net = model.GPT2LMHeadModel(params_of(TINY, *NO_DROPOUT)["model"])
    net.load_state_dict(load_checkpoint(latest_checkpoint(str(tmp_path / "run")))["model"])
    net.eval()
    eot = read_lm_meta(data_dir)["eot_id"]
    with np.load(tmp_path / "run" / "predictions.npz") as arrays:
        tokens, prompt_length = arrays["tokens"], arrays["prompt_length"]
    for row, length, record in zip(tokens, prompt_length, lines):
        prompt_ids = tokenizer.encode(record["prompt"]).ids
        assert list(row[:length]) == prompt_ids
        expected = reference_completion(net, prompt_ids, 6)[len(prompt_ids):]
        assert list(row[length:length + 6]) == expected
        new = expected[:expected.index(eot)] if eot in expected else expected
        assert record["completion"] == tokenizer.decode(new)


def test_predict_refuses_a_prompt_the_positions_cannot_hold(tmp_path, capsys, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("short\n" + "word " * 200 + "\n", encoding="utf-8")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir), f"predict_input.prompt_file={prompts}",
                                            mode="predict"),
                          f"{prompts}:2", "max_new_tokens 32", "model.max_position_embeddings")


def test_predict_refuses_a_prompt_file_that_is_not_utf8(tmp_path, capsys, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"fine\nnot \xff utf-8\n")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir), f"predict_input.prompt_file={prompts}",
                                            mode="predict"), f"{prompts}:2", "not UTF-8")


def test_predict_with_prompts_is_refused_on_the_emulator(tmp_path, capsys, data_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The standard library\n", encoding="utf-8")
    expect_one_error_line(capsys, tiny_argv(tmp_path, "--device", "emulator", *with_data(data_dir),
                                            f"predict_input.prompt_file={prompts}", mode="predict"),
                          "predict_step", "drop --device emulator")

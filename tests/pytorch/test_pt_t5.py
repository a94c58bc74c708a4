"""pytorch/t5: the relative position buckets and the logits against Hugging Face's T5, the
masks (causal, source padding) and the loss against reference computations; tiny training
on the CPU and the emulator; greedy decoding against a slow reference loop; and bad input."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common import zoo
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.summaries import read_scalars
from tests.rms_norm import RMS_EPSILON, rms_case, rms_reference
from tests.tiny_runs import tiny_runner, train_losses, with_data

T5_FOLDER = os.path.join(zoo.ROOT, "pytorch", "t5")
TINY = os.path.join(T5_FOLDER, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(T5_FOLDER, "run.py"), "model", "data", "utils")
NO_DROPOUT = ("model.dropout_rate=0.0",)
V = 4096


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Span corruption of the default corpus, prepared by the loader itself (as on a fresh clone)."""
    folder = tmp_path_factory.mktemp("t5_span_64")
    data.get_eval_dataloader(params_of(TINY, f"eval_input.data_dir={folder}"))
    return str(folder)


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def tiny_net(*overrides):
    torch.manual_seed(0)
    params = params_of(TINY, *NO_DROPOUT, *overrides)
    return model.T5(params["model"], *model.lengths(params)).eval()


def random_ids(B=3, T=10, seed=0):
    return torch.randint(2, V, (B, T), generator=torch.Generator().manual_seed(seed))


def padding_mask(B=3, T=10, lengths=(10, 6, 3)):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (16, 9)])
def test_the_buckets_are_hugging_faces(bidirectional, num_buckets, max_distance):
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    Q, K = 300, 300  # distances past max_distance, into the last bucket
    relative = torch.arange(K)[None, :] - torch.arange(Q)[:, None]
    theirs = modeling_t5.T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    ours = model.relative_position_buckets(Q, K, bidirectional, num_buckets, max_distance)
    assert np.array_equal(ours, theirs.numpy())
    assert ours.max() == num_buckets - 1 and ours.min() == 0


def test_names_shapes_and_one_bias_table_per_stack():
    net = tiny_net()
    logits = net(random_ids(), padding_mask(), random_ids(T=8, seed=1))
    assert logits.shape == (3, 8, V)
    shapes = {n: tuple(p.shape) for n, p in net.state_dict().items()}
    assert [n for n, s in shapes.items() if s == (V, 64)] == ["shared.weight"]  # the head is the embedding
    assert [n for n in shapes if "relative_attention_bias" in n] == [
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    assert shapes["encoder.block.1.layer.0.SelfAttention.q.weight"] == (4 * 16, 64)  # heads x d_kv, d_model
    assert shapes["decoder.block.1.layer.1.EncDecAttention.o.weight"] == (64, 4 * 16)
    assert shapes["decoder.block.1.layer.2.DenseReluDense.wi.weight"] == (128, 64)
    assert not any(n.endswith(".bias") for n in shapes)  # no biases anywhere
    gated = tiny_net("model.feed_forward_proj=gated-gelu", "model.tie_word_embeddings=false")
    names = set(gated.state_dict())
    assert {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", "lm_head.weight"} <= names


def test_a_target_position_never_sees_the_tokens_after_it():
    net = tiny_net()
    source, mask, target = random_ids(), padding_mask(), random_ids(seed=1)
    with torch.no_grad():
        before = net(source, mask, target)
        changed = target.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % V
        after = net(source, mask, changed)
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=1e-5)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


def test_padded_source_tokens_change_nothing():
    net = tiny_net()
    source, mask, target = random_ids(), padding_mask(), random_ids(seed=1)
    with torch.no_grad():
        before = net(source, mask, target)
        changed = torch.where(mask.bool(), source, (source + 7) % V)  # only the padding differs
        after = net(changed, mask, target)
        torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
        real = source.clone()
        real[1, 2] = (real[1, 2] + 7) % V  # a real token of example 1 moves its logits alone
        moved = net(real, mask, target)
    assert not torch.allclose(moved[1], before[1])
    torch.testing.assert_close(moved[[0, 2]], before[[0, 2]], rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", [(), ("model.feed_forward_proj=gated-gelu",), ("model.layer_norm_epsilon=0.5",)],
                         ids=["relu", "gated_gelu", "epsilon_0.5"])  # an epsilon as large as the mean squares
def test_the_logits_are_hugging_faces(variant):
    """The same weights in transformers' T5ForConditionalGeneration give the same logits. (Its
    head is always the shared embedding in transformers 5, so the untied head is tested below.)"""
    transformers = pytest.importorskip("transformers")
    net = tiny_net(*variant)
    p = params_of(TINY, *variant)["model"]
    config = transformers.T5Config(**{k: p[k] for k in (
        "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
        "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
        "feed_forward_proj", "tie_word_embeddings")}, dropout_rate=0.0, decoder_start_token_id=0)
    theirs = transformers.T5ForConditionalGeneration(config).eval()
    missing, unexpected = theirs.load_state_dict(net.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                                               "lm_head.weight"}
    source, mask, target = random_ids(T=12), padding_mask(T=12, lengths=(12, 7, 2)), random_ids(T=9, seed=1)
    with torch.no_grad():
        expected = theirs(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        torch.testing.assert_close(net(source, mask, target), expected, rtol=1e-5, atol=1e-5)



# --- the RMS norm: epsilon inside the square root ------------------------------------------------


def test_the_rms_norm_adds_epsilon_inside_the_square_root():
    x, weight, _ = rms_case()
    norm = model.T5LayerNorm(8, RMS_EPSILON)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
        y = norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, rms_reference(x, weight, RMS_EPSILON), rtol=1e-6, atol=0)


def test_the_rms_norm_on_the_emulator_adds_epsilon_inside_the_square_root():
    """The norm as the emulator runs it (captured): sum(rms(x) * r), and the scale's gradient, sum(x_hat * r)."""
    from device.capture.torch import capture, weights_of
    from device.runtime.program import Program

    x, weight, r = rms_case(1)
    norm = model.T5LayerNorm(8, RMS_EPSILON)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
    batch = [torch.from_numpy(x), torch.from_numpy(r)]
    graph = capture(lambda b: (norm(b[0]) * b[1]).sum(), norm, batch)
    loss, grads = Program(graph, weights_of(norm, graph), seed=0).gradients([x, r])
    expected = rms_reference(x, weight, RMS_EPSILON)
    np.testing.assert_allclose(loss, (expected * r).sum(), rtol=1e-5)
    np.testing.assert_allclose(grads["weight"], (expected / weight * r).sum(axis=(0, 1)), rtol=1e-5)


def test_an_untied_head_is_its_own_weight_and_unscaled():
    net = tiny_net("model.tie_word_embeddings=false")
    source, mask, target = random_ids(), padding_mask(), random_ids(T=8, seed=1)
    with torch.no_grad():
        memory, source_mask = net.encode(source, mask)
        hidden = net.decoder(net.shared(target), source_mask, memory)  # (B, T, d)
        torch.testing.assert_close(net.decode(target, memory, source_mask), hidden @ net.lm_head.weight.t())
        torch.testing.assert_close(net(source, mask, target), hidden @ net.lm_head.weight.t())


def test_the_loss_is_the_masked_mean_cross_entropy():
    params = params_of(TINY, *NO_DROPOUT)
    m = model.model_fn(params, torch.device("cpu"))
    source, mask, target, labels = random_ids(), padding_mask(), random_ids(seed=1), random_ids(seed=2)
    target_mask = padding_mask(lengths=(4, 10, 7))
    labels[2, 1] = model.IGNORE  # Hugging Face's ignored label counts in nothing either
    m.model.eval()
    with torch.no_grad():
        loss, outputs = m((source, mask, target, target_mask, labels))
        logits = m.model(source, mask, target)
    log_p = logits.double().log_softmax(-1)
    nll = -log_p.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # (B, T)
    w = target_mask.double() * (labels != -100)
    assert w.sum() == 20
    assert loss.item() == pytest.approx(((nll * w).sum() / w.sum()).item(), rel=1e-5)
    reference = F.cross_entropy(logits[w.bool()], labels[w.bool()])  # torch's mean over the counted tokens
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert torch.equal(outputs["predictions"], logits.argmax(-1))
    m.model.train()
    assert isinstance(m((source, mask, target, target_mask, labels)), torch.Tensor)  # training: the loss alone


def slow_greedy(net, source, mask, start_id, eos_id, length):
    """One example at a time, the decoder over the generated prefix only (no padding): the reference."""
    out = []
    for b in range(source.shape[0]):
        prefix = [start_id]
        for _ in range(length):
            token = int(net(source[b:b + 1], mask[b:b + 1], torch.tensor([prefix]))[0, -1].argmax())
            prefix.append(token)
            if token == eos_id:
                break
        out.append(prefix[1:] + [0] * (length - len(prefix) + 1))
    return torch.tensor(out)


def test_greedy_decoding_equals_a_slow_reference_loop():
    net = tiny_net()
    source, mask = random_ids(B=4), padding_mask(B=4, lengths=(10, 6, 3, 8))
    with torch.no_grad():
        # eos: a token the untrained net emits first for some example, so stopping is exercised
        first = net(source, mask, torch.zeros(4, 1, dtype=torch.long))[:, 0].argmax(-1)
        eos = int(first[1])
        fast = model.greedy_decode(net, source, mask, start_id=0, eos_id=eos, pad_id=0, length=7)
        slow = slow_greedy(net, source, mask, start_id=0, eos_id=eos, length=7)
    assert torch.equal(fast, slow)
    assert fast[1, 0] == eos and (fast[1, 1:] == 0).all()


def test_the_loader_prepares_span_corruption_and_yields_tuples(data_dir):
    assert {"tokenizer.json", "meta.json", "train-00000.h5", "eval-00000.h5"} <= set(os.listdir(data_dir))
    batch = next(iter(data.get_train_dataloader(params_of(TINY, *with_data(data_dir)))))
    assert [tuple(t.shape) for t in batch] == [(8, 64)] * 2 + [(8, 16)] * 3
    assert all(t.dtype == torch.int64 for t in batch)
    input_ids, _, decoder_input_ids, decoder_mask, labels = batch
    assert (decoder_input_ids[:, 0] == 0).all()  # T5 starts the decoder with the pad id
    assert (labels[:, 0] == V - 1).all()  # each target opens with <extra_id_0>, the vocab's last id
    assert ((input_ids == V - 1).sum(1) == 1).all()  # ... which marks the first dropped span in the input
    inner = decoder_mask[:, 1:] == 1
    assert torch.equal(decoder_input_ids[:, 1:][inner], labels[:, :-1][inner])  # the target shifted right


train_tiny = tiny_runner(T5_FOLDER, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path, data_dir):
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5
    argv = with_data(data_dir, "runconfig.eval_steps=2")
    metrics = train_tiny(tmp_path, "--mode", "eval", *argv)
    assert set(metrics) >= {"loss", "lm_perplexity", "accuracy"}
    assert 0 < metrics["accuracy"] < 1 and metrics["lm_perplexity"] < V
    assert metrics["lm_perplexity"] == pytest.approx(np.exp(metrics["loss"]), rel=1e-3)  # eval batches of one size
    path = train_tiny(tmp_path, "--mode", "predict", *argv)
    with np.load(path) as predictions:
        generated, labels = predictions["generated_ids"], predictions["labels"]
        assert generated.shape == labels.shape == (16, 16) and generated.max() < V
    lines = (tmp_path / "predictions.txt").read_text().splitlines()
    assert len(lines) == 16 and all(" -> " in line for line in lines)
    assert all("<extra_id_0>" in line.split(" -> ")[0] for line in lines)  # the sources' sentinels, by name
    exact = read_scalars(str(tmp_path / "predict"))["exact_match"]
    assert exact == [(8, pytest.approx(float(np.mean([l.find("(expected: ") < 0 for l in lines]))))]


def test_the_emulator_trains_and_evaluates_as_the_cpu(tmp_path, data_dir):
    argv = with_data(data_dir, *NO_DROPOUT, "runconfig.max_steps=3", "runconfig.eval_steps=2")
    train_tiny(tmp_path / "cpu", "--mode", "train", *argv)
    train_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", *argv)
    cpu, emulator = train_losses(tmp_path / "cpu"), train_losses(tmp_path / "emulator")
    assert len(emulator) == 3 and emulator[-1] < emulator[0]
    np.testing.assert_allclose(emulator, cpu, rtol=1e-4)
    on_cpu = train_tiny(tmp_path / "emulator", "--mode", "eval", *argv)
    on_emulator = train_tiny(tmp_path / "emulator", "--mode", "eval", "--device", "emulator", *argv)
    for name in ("loss", "lm_perplexity", "accuracy"):
        assert on_emulator[name] == pytest.approx(on_cpu[name], rel=1e-4), name


def test_a_model_too_big_for_memory_compiles_as_the_real_one():
    """The 3B and 11B configs compile from a build without weights (torch's meta device): the
    bucket ids, a numpy constant rather than a buffer, keep their values there."""
    from common.pytorch.device_run import capture_step, model_for_capture
    from device.api import compile_graph

    params = params_of(TINY, *NO_DROPOUT)
    real = model_for_capture(model.model_fn, params, memory=2**40)
    stand_in = model_for_capture(model.model_fn, params, memory=1000)  # "1000 bytes available"
    assert all(set(p.stride()) == {0} for p in stand_in.model.parameters())
    batch = (random_ids(B=8, T=64), padding_mask(B=8, T=64, lengths=(64, 50, 40, 30, 64, 64, 9, 2)),
             random_ids(B=8, T=16, seed=1), padding_mask(B=8, T=16, lengths=(16,) * 8), random_ids(B=8, T=16, seed=2))

    def kernels(m):
        graph, _ = capture_step(m, batch, True, params)
        result = compile_graph(graph, mode="train", profile_name="wse2", execution_mode="pipelined")
        return [(k.kind, k.flops_fwd, k.weight_bytes) for k in result.kernels], result.cost.samples_per_s

    assert kernels(stand_in) == kernels(real)


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(T5_FOLDER).main(argv)
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
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.vocab_size=1000")),
                          os.path.join(data_dir, "meta.json"), "4,096 tokens", "model.vocab_size is 1,000")


def test_data_of_another_target_length(tmp_path, capsys, data_dir):
    argv = with_data(data_dir, "train_input.target_length=32", "eval_input.target_length=32")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *argv), "meta.json", "target sequences have 16 tokens",
                          "--target_length 32")


def test_an_unknown_feed_forward(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.feed_forward_proj=gelu")),
                          "feed_forward_proj", "gelu")


def test_too_few_buckets(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.relative_attention_num_buckets=2")),
                          "model.relative_attention_num_buckets 2")


def test_a_max_distance_within_the_exact_buckets(tmp_path, capsys, data_dir):
    # 32 buckets, max_distance 16: Hugging Face's formula divides by log(16 / 16) = 0 in the decoder
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.relative_attention_max_distance=16")),
                          "model.relative_attention_max_distance 16", "more than half")

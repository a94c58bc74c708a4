"""pytorch/transformer: one shared embedding, the masks (causal, source padding) and the
label-smoothed loss against reference computations; tiny training on the CPU and the
emulator; greedy decoding against a slow reference loop; and bad input."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common import zoo
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.summaries import read_scalars
from tests.tiny_runs import tiny_runner, train_losses, with_data

TRANSFORMER = os.path.join(zoo.ROOT, "pytorch", "transformer")
CONFIGS = os.path.join(TRANSFORMER, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(TRANSFORMER, "run.py"), "model", "data", "utils")
NO_DROPOUT = ("model.dropout_rate=0.0", "model.attention_dropout_rate=0.0", "model.relu_dropout_rate=0.0")
V = 4096


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The reversal task of the default corpus, prepared by the loader itself (as on a fresh clone)."""
    folder = tmp_path_factory.mktemp("reversal_64")
    data.get_eval_dataloader(params_of(TINY, f"eval_input.data_dir={folder}"))
    return str(folder)


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def tiny_net(*overrides):
    torch.manual_seed(0)
    params = params_of(TINY, *NO_DROPOUT, *overrides)
    return model.Transformer(params["model"], model.max_length(params)).eval()


def random_ids(B=3, T=10, seed=0):
    return torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(seed))


def padding_mask(B=3, T=10, lengths=(10, 6, 3)):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)


def test_one_embedding_serves_source_target_and_output():
    net = tiny_net()
    tables = [n for n, p in net.named_parameters() if p.shape == (V, 64)]
    assert tables == ["embedding.weight"]  # the only (V, H) weight: no separate decoder table or output projection
    logits = net(random_ids(), padding_mask(), random_ids(T=8, seed=1))
    assert logits.shape == (3, 8, V)
    names = set(net.state_dict())
    assert "encoder_layers.1.self_attn.q_proj.weight" in names and "decoder_layers.1.cross_attn.v_proj.bias" in names
    assert not any("positions" in n for n in names)  # the sinusoids are a constant, not saved
    unshared = tiny_net("model.share_embedding_weights=false")
    assert {n for n, p in unshared.named_parameters() if p.shape[-1] == 64 and V in p.shape} == {
        "embedding.weight", "decoder_embedding.weight", "output_projection.weight"}


def test_the_positions_are_the_papers_sinusoids():
    table = model.sinusoid_table(50, 64)
    pos, i = 17, 5
    assert table[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 64)), abs=1e-6)
    assert table[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 64)), abs=1e-6)


@pytest.mark.parametrize("pre_layer_norm", [False, True], ids=["post_ln", "pre_ln"])
def test_a_target_position_never_sees_the_tokens_after_it(pre_layer_norm):
    net = tiny_net(f"model.pre_layer_norm={str(pre_layer_norm).lower()}")
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


def test_the_loss_is_the_masked_mean_of_torchs_label_smoothed_cross_entropy():
    params = params_of(TINY, *NO_DROPOUT)
    m = model.model_fn(params, torch.device("cpu"))
    source, mask, target, labels = random_ids(), padding_mask(), random_ids(seed=1), random_ids(seed=2)
    target_mask = padding_mask(lengths=(4, 10, 7))
    m.model.eval()
    with torch.no_grad():
        loss, outputs = m((source, mask, target, target_mask, labels))
        logits = m.model(source, mask, target)
    # the reference: smoothing written out, (1 - eps) * -log p(label) + eps * mean over the vocab of -log p
    log_p = logits.double().log_softmax(-1)
    eps = 0.1
    smoothed = -(1 - eps) * log_p.gather(-1, labels[..., None])[..., 0] - eps * log_p.mean(-1)  # (B, T)
    w = target_mask.double()
    assert loss.item() == pytest.approx(((smoothed * w).sum() / w.sum()).item(), rel=1e-5)
    torch_ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none", label_smoothing=eps)
    torch.testing.assert_close(torch_ce.reshape(3, 10).double(), smoothed, rtol=1e-5, atol=1e-5)
    plain = -log_p.gather(-1, labels[..., None])[..., 0]
    np.testing.assert_allclose(outputs["token_losses"].numpy(), plain.numpy(), rtol=1e-4)
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
        # eos: a token the untrained net emits early for some example, so stopping is exercised
        first = net(source, mask, torch.ones(4, 1, dtype=torch.long))[:, 0].argmax(-1)
        eos = int(first[1])
        fast = model.greedy_decode(net, source, mask, start_id=1, eos_id=eos, pad_id=0, length=7)
        slow = slow_greedy(net, source, mask, start_id=1, eos_id=eos, length=7)
    assert torch.equal(fast, slow)
    assert fast[1, 0] == eos and (fast[1, 1:] == 0).all()


def test_exact_match_counts_the_real_tokens_and_eos():
    labels = np.array([[5, 6, 2, 0], [5, 6, 2, 0]])
    mask = (labels != 0).astype(np.int32)
    generated = np.array([[5, 6, 2, 0], [5, 7, 2, 0]])
    assert model.exact_matches(generated, labels, mask).tolist() == [True, False]


def test_the_loader_prepares_the_reversal_task_and_yields_tuples(data_dir):
    assert {"tokenizer.json", "meta.json", "train-00000.h5", "eval-00000.h5"} <= set(os.listdir(data_dir))
    batch = next(iter(data.get_train_dataloader(params_of(TINY, *with_data(data_dir)))))
    assert [tuple(t.shape) for t in batch] == [(8, 64)] * 5 and all(t.dtype == torch.int64 for t in batch)
    _, _, decoder_input_ids, decoder_mask, labels = batch
    assert (decoder_input_ids[:, 0] == 1).all()  # <s>
    inner = decoder_mask[:, 1:] == 1
    assert torch.equal(decoder_input_ids[:, 1:][inner], labels[:, :-1][inner])  # the target shifted right


train_tiny = tiny_runner(TRANSFORMER, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path, data_dir):
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.2
    argv = with_data(data_dir, "runconfig.eval_steps=2")
    metrics = train_tiny(tmp_path, "--mode", "eval", *argv)
    assert set(metrics) >= {"loss", "lm_perplexity", "accuracy", "sequence_accuracy"}
    assert 0 < metrics["accuracy"] < 1 and metrics["lm_perplexity"] < V
    path = train_tiny(tmp_path, "--mode", "predict", *argv)
    with np.load(path) as predictions:
        generated, labels = predictions["generated_ids"], predictions["labels"]
        assert generated.shape == labels.shape == (16, 64) and generated.max() < V
    lines = (tmp_path / "predictions.txt").read_text().splitlines()
    assert len(lines) == 16 and all(" -> " in line for line in lines)
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


# --- bad input: one line naming what is wrong, a non-zero exit, no traceback -----------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(TRANSFORMER).main(argv)
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


@pytest.mark.parametrize("side", ["source", "target"])
def test_data_of_other_lengths(tmp_path, capsys, data_dir, side):
    argv = with_data(data_dir, f"train_input.{side}_length=32", f"eval_input.{side}_length=32")
    expect_one_error_line(capsys, tiny_argv(tmp_path, *argv), "meta.json", f"{side} sequences have 64 tokens",
                          f"--{side}_length 32")


def test_heads_that_do_not_divide_the_hidden_size(tmp_path, capsys, data_dir):
    expect_one_error_line(capsys, tiny_argv(tmp_path, *with_data(data_dir, "model.num_heads=3")),
                          "model.hidden_size 64", "model.num_heads 3")

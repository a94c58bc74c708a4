"""zoo convert with Hugging Face directories: BERT and GPT-2 into the zoo's PyTorch and TF checkpoints
and back, bit for bit; the converted BERT computes Hugging Face's logits in pytorch/bert and its loss
in tf/bert (--checkpoint_path); GPT-2's layouts against a reference forward; bad input in one line."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # before TensorFlow, in one process
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from common import zoo, zoo_cli  # noqa: E402
from common.convert import convert, load_safetensors  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import load_params  # noqa: E402

HAVE_TF = __import__("importlib.util").util.find_spec("tensorflow") is not None
needs_tf = pytest.mark.skipif(not HAVE_TF, reason="needs TensorFlow")

# tiny sizes; the vocab is the default corpus's WordPiece (3,796), which tf/bert's data needs
BERT = dict(vocab_size=3796, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128, type_vocab_size=2)
GPT2 = dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=0, eos_token_id=0)


def hf_bert(path, seed=0, **changes):
    torch.manual_seed(seed)
    net = transformers.BertForPreTraining(transformers.BertConfig(**{**BERT, **changes})).eval()
    _perturb(net)
    net.save_pretrained(str(path))
    return net


def hf_gpt2(path, seed=0, **changes):
    torch.manual_seed(seed)
    net = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, **changes})).eval()
    _perturb(net)
    net.save_pretrained(str(path))
    return net


def _perturb(net):
    """Every weight random (LayerNorm's ones and the zero biases too), so that no transposition or
    swap of two tensors of one shape goes unseen."""
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)


def hf_tensors(path):
    return load_safetensors(os.path.join(path, "model.safetensors"))[0]


def model_overrides(line: str) -> list[str]:
    """The model keys a conversion from Hugging Face printed (``...; the model: model.a=1 model.b=2``)."""
    return line.split("; the model: ")[1].split()


def params_file(tmp_path, overrides) -> str:
    """A zoo params file holding the model keys (what a model_dir's params_train.yaml holds)."""
    path = tmp_path / "params.yaml"
    lines = ["model:"] + [f"  {o.split('=')[0].removeprefix('model.')}: {o.split('=')[1]}" for o in overrides]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def assert_same_tensors(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


# --- BERT -----------------------------------------------------------------------------------------

def pytorch_bert():
    model, utils = import_beside(os.path.join(zoo.ROOT, "pytorch", "bert", "run.py"), "model", "utils")
    return model, utils


def test_bert_from_hugging_face_gives_its_logits_in_pytorch_bert(tmp_path):
    hf = hf_bert(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "bert.mdl"))
    model, utils = pytorch_bert()
    tiny = os.path.join(zoo.ROOT, "pytorch", "bert", "configs", "params_tiny.yaml")
    params = load_params(tiny, utils.default_params(), model_overrides(line))
    net = model.BertForPretraining(params["model"]).eval()
    state = torch.load(tmp_path / "bert.mdl", weights_only=True)["model"]
    net.load_state_dict(state, strict=True)  # every weight of the zoo's model, nothing else

    g = torch.Generator().manual_seed(1)
    B, T = 3, 20
    input_ids = torch.randint(0, BERT["vocab_size"], (B, T), generator=g)
    segment_ids = torch.randint(0, 2, (B, T), generator=g)
    input_mask = torch.ones(B, T, dtype=torch.int64)
    input_mask[1, 15:] = 0  # padding
    with torch.no_grad():
        theirs = hf(input_ids=input_ids, attention_mask=input_mask, token_type_ids=segment_ids)
        positions = torch.arange(T).expand(B, T)  # every position through the MLM head
        mlm, nsp = net(input_ids, input_mask, segment_ids, positions)
    np.testing.assert_allclose(mlm.numpy(), theirs.prediction_logits.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(nsp.numpy(), theirs.seq_relationship_logits.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("middle", ["bert.mdl", "bert.pt", "bert.safetensors",
                                    pytest.param("tf/model.ckpt-7", marks=needs_tf)])
def test_bert_hugging_face_to_the_zoo_and_back_bit_for_bit(tmp_path, middle):
    hf_bert(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / middle))
    params = params_file(tmp_path, model_overrides(line))
    assert "BertForPreTraining" in convert(str(tmp_path / middle), str(tmp_path / "back"), params=params)
    assert_same_tensors(hf_tensors(tmp_path / "hf"), hf_tensors(tmp_path / "back"))
    original = json.loads((tmp_path / "hf" / "config.json").read_text())
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("architectures", "model_type", "hidden_act", "layer_norm_eps", "hidden_dropout_prob", *BERT):
        assert back[key] == original[key], key
    reread = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "back")).eval()
    assert_same_tensors(reread.state_dict(), transformers.BertForPreTraining.from_pretrained(
        str(tmp_path / "hf")).state_dict())


@needs_tf
def test_bert_tf_checkpoint_has_google_names_and_the_params_beside_it_complete_the_config(tmp_path):
    import tensorflow as tf

    hf_bert(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "run" / "model.ckpt-3"))
    assert line.startswith(f"{tmp_path / 'run' / 'model.ckpt-3'}: TF checkpoint, 46 bert variables")
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "model.ckpt-3"))
    hf = hf_tensors(tmp_path / "hf")
    np.testing.assert_array_equal(reader.get_tensor("bert/encoder/layer_1/intermediate/dense/kernel"),
                                  hf["bert.encoder.layer.1.intermediate.dense.weight"].numpy().T)
    np.testing.assert_array_equal(reader.get_tensor("cls/seq_relationship/output_weights"),
                                  hf["cls.seq_relationship.weight"].numpy())  # Google's [2, H], not transposed
    assert reader.get_tensor("global_step") == 3
    # the runner writes params_train.yaml into model_dir: from there no --params is needed
    os.rename(params_file(tmp_path, model_overrides(line)), tmp_path / "run" / "params_train.yaml")
    convert(str(tmp_path / "run"), str(tmp_path / "back"))
    assert_same_tensors(hf, hf_tensors(tmp_path / "back"))


def evaluate_converted(framework: str, hf_dir, checkpoint: str, tmp_path) -> float:
    """The eval loss of one batch that ``framework``/bert's runner gives from --checkpoint_path
    ``checkpoint``, converted from ``hf_dir`` (the model keys as the conversion printed them)."""
    from common.folder import load_run_module

    line = convert(str(hf_dir), checkpoint)
    folder = os.path.join(zoo.ROOT, framework, "bert")
    data_dir = str(tmp_path / "data")
    metrics = load_run_module(folder).main([
        "--params", os.path.join(folder, "configs", "params_tiny.yaml"), "--model_dir", str(tmp_path / "model"),
        "--mode", "eval", "--checkpoint_path", checkpoint, f"train_input.data_dir={data_dir}",
        f"eval_input.data_dir={data_dir}", "runconfig.eval_steps=1", *model_overrides(line)])
    return metrics["loss"]


def first_eval_batch(tmp_path, framework: str) -> dict:
    """The first 16 eval examples (the runners' eval batch: in file order) of the prepared data, as torch tensors."""
    if framework == "tf":
        from common.data.text.tfrecord import pretraining_dataset

        files = sorted(str(p) for p in (tmp_path / "data").glob("eval-*.tfrecord"))
        batch = {k: v.numpy() for k, v in next(iter(pretraining_dataset(files).batch(16))).items()}
    else:
        from common.data.text.pretraining import read_hdf5

        first = sorted((tmp_path / "data").glob("eval-*.hdf5"))[0]
        batch = {k: v[:16] for k, v in read_hdf5(first).items()}
    return {k: torch.from_numpy(v).long() if v.dtype.kind == "i" else torch.from_numpy(v) for k, v in batch.items()}


@pytest.mark.parametrize("framework", ["pytorch", pytest.param("tf", marks=needs_tf)])
def test_bert_runner_evaluates_the_converted_checkpoint_to_hugging_faces_loss(tmp_path, framework):
    hf = hf_bert(tmp_path / "hf")
    checkpoint = str(tmp_path / "converted" / ("checkpoint_0.mdl" if framework == "pytorch" else "model.ckpt-0"))
    loss = evaluate_converted(framework, tmp_path / "hf", checkpoint, tmp_path)

    batch = first_eval_batch(tmp_path, framework)  # the same batch through Hugging Face's model
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                 token_type_ids=batch["segment_ids"])
    picked = out.prediction_logits[torch.arange(16)[:, None], batch["masked_lm_positions"]]  # (B, P, V)
    ce = torch.nn.functional.cross_entropy(picked.flatten(0, 1), batch["masked_lm_ids"].flatten(), reduction="none")
    weights = batch["masked_lm_weights"].flatten()
    mlm = (ce * weights).sum() / (weights.sum() + 1e-5)  # Google's MLM loss, as tf/bert's
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, batch["next_sentence_labels"][:, 0])
    # float32 sums in another order: 1e-7 apart here; a 0.1 % error in the weights moves it by 3e-5
    np.testing.assert_allclose(loss, float(mlm + nsp), rtol=1e-6)


# --- GPT-2 ----------------------------------------------------------------------------------------

def reference_gpt2_logits(w: dict, input_ids: torch.Tensor, heads: int, eps: float) -> torch.Tensor:
    """GPT-2's forward written here from the zoo's names and nn.Linear layout [out, in]."""
    F = torch.nn.functional
    B, T = input_ids.shape
    x = w["transformer.wte.weight"][input_ids] + w["transformer.wpe.weight"][:T]  # (B, T, H)
    H = x.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    layers = 1 + max(int(n.split(".")[2]) for n in w if n.startswith("transformer.h."))
    for i in range(layers):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (H,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q, k, v = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]).split(H, dim=-1)
        q, k, v = (t.view(B, T, heads, H // heads).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
        scores = (q @ k.transpose(-1, -2) / (H // heads) ** 0.5).masked_fill(~causal, float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H)
        x = x + F.linear(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (H,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (H,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].t()  # the tied head


def test_gpt2_from_hugging_face_has_the_zoo_names_and_layout(tmp_path):
    from common.gpt2_names import torch_names

    hf = hf_gpt2(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "gpt2.mdl"))
    assert model_overrides(line) == ["model.vocab_size=97", "model.hidden_size=32", "model.num_hidden_layers=2",
                                     "model.num_heads=4", "model.filter_size=128", "model.max_position_embeddings=40",
                                     "model.layer_norm_epsilon=1.0e-05", "model.nonlinearity=gelu_new",
                                     "model.initializer_range=0.02", "model.embedding_dropout_rate=0.1",
                                     "model.dropout_rate=0.1", "model.attention_dropout_rate=0.1"]
    zoo_weights = torch.load(tmp_path / "gpt2.mdl", weights_only=True)["model"]
    assert list(zoo_weights) == torch_names(2) and "lm_head.weight" not in zoo_weights  # tied
    theirs = hf_tensors(tmp_path / "hf")
    assert zoo_weights["transformer.h.1.attn.c_attn.weight"].shape == (96, 32)  # Linear [3H, H]; Conv1D [H, 3H]
    assert torch.equal(zoo_weights["transformer.h.1.mlp.c_fc.weight"], theirs["transformer.h.1.mlp.c_fc.weight"].t())
    assert torch.equal(zoo_weights["transformer.wte.weight"], theirs["transformer.wte.weight"])

    input_ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(input_ids=input_ids).logits
    ours = reference_gpt2_logits(zoo_weights, input_ids, heads=4, eps=1e-5)
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("middle", ["gpt2.mdl", "gpt2.safetensors", pytest.param("tf/model.ckpt-2", marks=needs_tf)])
def test_gpt2_hugging_face_to_the_zoo_and_back_bit_for_bit(tmp_path, middle):
    hf_gpt2(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / middle))
    params = params_file(tmp_path, model_overrides(line))
    assert "GPT2LMHeadModel" in convert(str(tmp_path / middle), str(tmp_path / "back"), params=params)
    assert_same_tensors(hf_tensors(tmp_path / "hf"), hf_tensors(tmp_path / "back"))
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["n_head"] == 4 and config["n_inner"] == 128 and config["activation_function"] == "gelu_new"
    back = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "back")).eval()
    input_ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        original = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
        assert torch.equal(back(input_ids=input_ids).logits, original(input_ids=input_ids).logits)


def test_gpt2_saved_from_a_bare_model_with_older_buffers(tmp_path):
    """Checkpoints saved from GPT2Model (names without "transformer.") holding the causal-mask
    buffers older transformers versions stored (attn.bias, attn.masked_bias) read the same."""
    from common.convert import save_safetensors

    hf_gpt2(tmp_path / "hf")
    tensors = hf_tensors(tmp_path / "hf")
    bare = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = torch.ones(1, 1, 40, 40).tril()
        bare[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    save_safetensors(bare, str(tmp_path / "old" / "model.safetensors"), {"format": "pt"})
    convert(str(tmp_path / "hf"), str(tmp_path / "new.mdl"))
    convert(str(tmp_path / "old"), str(tmp_path / "old.mdl"))
    assert_same_tensors(torch.load(tmp_path / "old.mdl", weights_only=True)["model"],
                        torch.load(tmp_path / "new.mdl", weights_only=True)["model"])


@needs_tf
def test_gpt2_tf_checkpoint_has_the_tf_names_and_reads_back(tmp_path):
    import tensorflow as tf

    from common.gpt2_names import read_gpt2_weights, torch_name_to_tf

    hf_gpt2(tmp_path / "hf")
    convert(str(tmp_path / "hf"), str(tmp_path / "gpt2.mdl"))
    convert(str(tmp_path / "gpt2.mdl"), str(tmp_path / "tf" / "model.ckpt-5"))  # PyTorch -> TF
    reader = tf.train.load_checkpoint(str(tmp_path / "tf" / "model.ckpt-5"))
    names = set(reader.get_variable_to_shape_map())
    assert {"transformer/wte", "transformer/wpe", "transformer/h_0/ln_1/gamma", "transformer/h_1/attn/c_attn/kernel",
            "transformer/h_1/mlp/c_proj/bias", "transformer/ln_f/beta", "global_step"} <= names
    hf = hf_tensors(tmp_path / "hf")
    # a Dense kernel [in, out] is Hugging Face's Conv1D weight as it is
    np.testing.assert_array_equal(reader.get_tensor("transformer/h_1/attn/c_attn/kernel"),
                                  hf["transformer.h.1.attn.c_attn.weight"].numpy())
    zoo_weights = torch.load(tmp_path / "gpt2.mdl", weights_only=True)["model"]
    for path in (str(tmp_path / "tf" / "model.ckpt-5"), str(tmp_path / "tf")):
        read = read_gpt2_weights(path)
        assert sorted(read) == sorted(zoo_weights)
        for name, value in read.items():
            np.testing.assert_array_equal(value, zoo_weights[name].numpy(), err_msg=name)
    assert torch_name_to_tf("lm_head.weight") == ("lm_head/kernel", True)
    convert(str(tmp_path / "tf" / "model.ckpt-5"), str(tmp_path / "again.mdl"))  # TF -> PyTorch
    assert_same_tensors(torch.load(tmp_path / "again.mdl", weights_only=True)["model"], zoo_weights)


# --- refusals: one line each ----------------------------------------------------------------------

def one_error_line(capsys, *argv) -> str:
    capsys.readouterr()  # save_pretrained's progress bar, before
    code = zoo_cli.main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_hugging_face_model_of_another_architecture(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=24)
    transformers.RobertaForMaskedLM(config).save_pretrained(str(tmp_path / "roberta"))
    err = one_error_line(capsys, tmp_path / "roberta", tmp_path / "x.mdl")
    assert "model_type 'roberta' (RobertaForMaskedLM); the zoo converts Hugging Face's BERT" in err
    hf_bert(tmp_path / "gelu_new", hidden_act="gelu_new")
    err = one_error_line(capsys, tmp_path / "gelu_new", tmp_path / "x.mdl")
    assert "activation 'gelu_new'; the zoo's bert computes gelu, relu, tanh" in err
    hf_gpt2(tmp_path / "untied", tie_word_embeddings=False)
    assert "tie_word_embeddings False" in one_error_line(capsys, tmp_path / "untied", tmp_path / "x.mdl")
    assert not (tmp_path / "x.mdl").exists()


def test_weights_of_another_size_than_the_config(tmp_path, capsys):
    hf_gpt2(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_embd": 64}))
    err = one_error_line(capsys, tmp_path / "hf", tmp_path / "x.mdl")
    assert "transformer.wte.weight is 97x32, but a gpt2 of hidden_size 64" in err
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    err = one_error_line(capsys, tmp_path / "hf", tmp_path / "x.mdl")
    assert "transformer.h.1.attn.c_attn.bias is not a weight of a 1-layer gpt2 (nor 11 more)" in err

    hf_bert(tmp_path / "bert")
    line = convert(str(tmp_path / "bert"), str(tmp_path / "bert.mdl"))
    overrides = [o if not o.startswith("model.hidden_size=") else "model.hidden_size=64"
                 for o in model_overrides(line)]
    err = one_error_line(capsys, tmp_path / "bert.mdl", tmp_path / "out", "--params", params_file(tmp_path, overrides))
    assert "hidden_size is 32 in the weights but 64 in" in err
    err = one_error_line(capsys, tmp_path / "bert.mdl", tmp_path / "out")
    assert "the number of attention heads is not in the weights: pass --params" in err


def test_what_hugging_faces_gpt2_cannot_hold_and_other_models(tmp_path, capsys):
    from common.hf import write_hf

    hf_gpt2(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "gpt2.mdl"))
    params = params_file(tmp_path, [*model_overrides(line), "model.use_parallel_attention=true"])
    err = one_error_line(capsys, tmp_path / "gpt2.mdl", tmp_path / "out", "--params", params)
    assert "model.use_parallel_attention True: Hugging Face's GPT2LMHeadModel has False only" in err
    with pytest.raises(UserError, match="lacks transformer.h.0.ln_2.weight"):
        weights = {n: t.numpy() for n, t in torch.load(tmp_path / "gpt2.mdl", weights_only=True)["model"].items()
                   if ".ln_2." not in n}
        write_hf(str(tmp_path / "out"), "gpt2", weights, {"vocab_size": 97, "hidden_size": 32, "num_heads": 4,
                                                          "num_hidden_layers": 2, "filter_size": 128,
                                                          "max_position_embeddings": 40})
    torch.save({"fc.weight": torch.zeros(2, 3)}, tmp_path / "mlp.pt")
    err = one_error_line(capsys, tmp_path / "mlp.pt", tmp_path / "tf" / "model.ckpt-1")
    assert "mlp.pt: holds no BERT, GPT-2, T5 or Llama weight" in err and "the zoo does not define the mapping" in err
    err = one_error_line(capsys, tmp_path / "mlp.pt", tmp_path / "hf_out")
    assert "mlp.pt: holds no BERT, GPT-2, T5 or Llama weight" in err


# --- special token ids -----------------------------------------------------------------------------

@pytest.fixture
def transformers_warnings():
    """The warnings transformers logs while the test runs; warning_once forgets what it said before."""
    import logging

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.Logger.warning_once.cache_clear()
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    yield records
    library.removeHandler(handler)


def test_gpt2_to_hugging_face_names_the_zoos_end_of_text_and_loads_without_a_warning(tmp_path,
                                                                                     transformers_warnings):
    hf_gpt2(tmp_path / "hf", vocab_size=4096)  # the zoo's default vocab (pytorch/gpt2's params.yaml)
    line = convert(str(tmp_path / "hf"), str(tmp_path / "gpt2.mdl"))
    params = params_file(tmp_path, model_overrides(line))
    line = convert(str(tmp_path / "gpt2.mdl"), str(tmp_path / "back"), params=params)
    assert "bos_token_id 0, eos_token_id 0, from the zoo's tokenizer" in line
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == 0  # <|endoftext|>, the BPE's only special token
    transformers_warnings.clear()
    back = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "back"))
    assert [r.getMessage() for r in transformers_warnings] == []
    assert back.config.bos_token_id == back.config.eos_token_id == back.generation_config.eos_token_id == 0
    assert back.config.vocab_size == 4096


def test_the_zoos_gpt2_tokenizer_gives_end_of_text_the_id_the_config_names():
    from common.data.text.tokenizer import END_OF_TEXT, train_byte_bpe
    from common.hf import DEFAULT_TOKEN_IDS

    tokenizer = train_byte_bpe([["a few words of text", "and a few more words"]], vocab_size=300)
    assert DEFAULT_TOKEN_IDS["gpt2"] == {"bos_token_id": tokenizer.token_to_id(END_OF_TEXT),
                                         "eos_token_id": tokenizer.token_to_id(END_OF_TEXT)}


def meta_params(tmp_path, meta: dict) -> str:
    """A params file whose train_input.data_dir holds ``meta`` as its meta.json."""
    (tmp_path / "data").mkdir(parents=True)
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    path = tmp_path / "params_train.yaml"
    path.write_text(f"train_input:\n  data_dir: {tmp_path / 'data'}\nmodel:\n  vocab_size: 4096\n")
    return str(path)


def test_special_token_ids_come_from_the_trained_datas_meta_else_the_tokenizers(tmp_path):
    from common.hf import token_ids

    gpt2 = meta_params(tmp_path / "gpt2", {"vocab_size": 4000, "max_seq_length": 128, "eot_id": 7})
    assert token_ids("gpt2", 4096, gpt2) == ({"bos_token_id": 7, "eos_token_id": 7},
                                             str(tmp_path / "gpt2" / "data" / "meta.json"))
    reversal = meta_params(tmp_path / "t5", {"pad_id": 0, "eos_id": 2, "decoder_start_id": 1})  # <pad> <s> </s>
    assert token_ids("t5", 4096, reversal)[0] == {"pad_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 1}
    assert token_ids("gpt2", 4096, None) == ({"bos_token_id": 0, "eos_token_id": 0}, "the zoo's tokenizer")
    assert token_ids("gpt2", 50257, None)[0] == {"bos_token_id": 50256, "eos_token_id": 50256}  # OpenAI's BPE
    assert token_ids("t5", 4096, None)[0] == {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
    assert token_ids("bert", 3796, gpt2)[0] == {"pad_token_id": 0}  # [PAD]; BERT's data keeps no meta ids
    with pytest.raises(UserError, match=r"meta.json: eot_id 7 is outside the model's vocab of 5: not the data"):
        token_ids("gpt2", 5, gpt2)
    (tmp_path / "gpt2" / "data" / "meta.json").write_text('{"vocab_size": 4000}')
    with pytest.raises(UserError, match=r"meta.json: unreadable \(KeyError: 'eot_id'\); the special token ids of"):
        token_ids("gpt2", 4096, gpt2)


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_bert_and_t5_to_hugging_face_name_their_special_ids(tmp_path, family, transformers_warnings):
    from common.hf import read_hf, write_hf

    if family == "bert":
        net = hf_bert(tmp_path / "hf")
    else:
        torch.manual_seed(0)
        net = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=4, decoder_start_token_id=0))
        net.save_pretrained(str(tmp_path / "hf"))
    _, weights, keys = read_hf(str(tmp_path / "hf"))
    line = write_hf(str(tmp_path / "back"), family, weights, keys)
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    wanted = {"bert": {"pad_token_id": 0}, "t5": {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}}
    assert {k: v for k, v in config.items() if k.endswith("_token_id")} == wanted[family]
    assert "from the zoo's tokenizer" in line
    transformers_warnings.clear()
    type(net).from_pretrained(str(tmp_path / "back"))
    assert [r.getMessage() for r in transformers_warnings] == []

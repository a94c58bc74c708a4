"""zoo convert with Hugging Face's T5: a random T5ForConditionalGeneration saved with
save_pretrained converts to pytorch/t5, computes Hugging Face's logits there (1e-5, fp32),
and converts back bit for bit; what does not convert is one line."""

import json
import os

import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from common import zoo  # noqa: E402
from common.convert import convert, load_safetensors  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import load_params, thaw  # noqa: E402

T5_FOLDER = os.path.join(zoo.ROOT, "pytorch", "t5")
model, utils = import_beside(os.path.join(T5_FOLDER, "run.py"), "model", "utils")
# tiny sizes; 3 + 2 blocks, so that the decoder's count is read on its own
T5 = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_decoder_layers=2, num_heads=4,
          relative_attention_num_buckets=16, relative_attention_max_distance=40, decoder_start_token_id=0)


def hf_t5(path, seed=0, **changes):
    torch.manual_seed(seed)
    net = transformers.T5ForConditionalGeneration(transformers.T5Config(**{**T5, **changes})).eval()
    with torch.no_grad():  # every weight random, the norms' ones too, so no swap of two same-shaped tensors hides
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    net.save_pretrained(str(path))
    return net


def hf_tensors(path):
    return load_safetensors(os.path.join(path, "model.safetensors"))[0]


def zoo_net(line: str, checkpoint: str):
    """pytorch/t5 built from the model keys the conversion printed, with the converted weights."""
    overrides = line.split("; the model: ")[1].split()
    params = load_params(os.path.join(T5_FOLDER, "configs", "params_tiny.yaml"), utils.default_params(),
                         [*overrides, "model.dropout_rate=0.0"])
    net = model.T5(params["model"], 16, 16).eval()
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    net.load_state_dict(state)
    return net


@pytest.mark.parametrize("feed_forward_proj", ["relu", "gated-gelu"])
def test_hugging_faces_t5_computes_its_logits_in_pytorch_t5(tmp_path, feed_forward_proj):
    theirs = hf_t5(tmp_path / "hf", feed_forward_proj=feed_forward_proj)
    line = convert(str(tmp_path / "hf"), str(tmp_path / "t5.mdl"))
    assert "model.num_decoder_layers=2" in line and f"model.feed_forward_proj={feed_forward_proj}" in line
    ours = zoo_net(line, str(tmp_path / "t5.mdl"))
    g = torch.Generator().manual_seed(1)
    input_ids, decoder_input_ids = torch.randint(0, 99, (3, 14), generator=g), torch.randint(0, 99, (3, 9), generator=g)
    attention_mask = (torch.arange(14)[None] < torch.tensor([[14], [9], [3]])).long()
    with torch.no_grad():
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask,
                          decoder_input_ids=decoder_input_ids).logits
        torch.testing.assert_close(ours(input_ids, attention_mask, decoder_input_ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("middle", ["t5.mdl", "t5.pt", "t5.safetensors"])
def test_hugging_faces_t5_to_the_zoo_and_back_bit_for_bit(tmp_path, middle):
    hf_t5(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / middle))
    params = tmp_path / "params.yaml"
    params.write_text("model:\n" + "".join(f"  {o.split('=')[0][len('model.'):]}: {o.split('=')[1]}\n"
                                           for o in line.split("; the model: ")[1].split()))
    assert "T5ForConditionalGeneration" in convert(str(tmp_path / middle), str(tmp_path / "back"), params=str(params))
    before, after = hf_tensors(tmp_path / "hf"), hf_tensors(tmp_path / "back")
    assert sorted(before) == sorted(after)  # the shared table once, as save_pretrained stores it
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "t5" and config["num_decoder_layers"] == 2 and config["tie_word_embeddings"]
    again = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "back"))  # Hugging Face reads it
    assert again.config.relative_attention_max_distance == 40


def zoo_run(tmp_path, *overrides):
    """A pytorch/t5 checkpoint with the params_train.yaml the runner writes beside it."""
    params = load_params(os.path.join(T5_FOLDER, "configs", "params_tiny.yaml"), utils.default_params(),
                         ["model.vocab_size=99", *overrides])
    net = model.T5(params["model"], 16, 16)
    torch.save({"model": net.state_dict(), "optimizer": {}, "lr_scheduler": {}, "global_step": 3},
               tmp_path / "checkpoint_3.mdl")
    (tmp_path / "params_train.yaml").write_text(yaml.safe_dump({"model": thaw(params)["model"]}))
    return net


def test_a_pytorch_t5_run_converts_with_the_params_beside_it(tmp_path):
    """The zoo's own checkpoint to Hugging Face: the sizes from the weights, the rest from params_train.yaml."""
    net = zoo_run(tmp_path, "model.relative_attention_max_distance=100")
    convert(str(tmp_path / "checkpoint_3.mdl"), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    sizes = (config["num_layers"], config["num_decoder_layers"], config["relative_attention_max_distance"])
    assert sizes == (2, 2, 100)
    tensors = hf_tensors(tmp_path / "hf")
    assert set(tensors) == set(net.state_dict())
    assert torch.equal(tensors["decoder.block.1.layer.1.EncDecAttention.k.weight"],
                       net.state_dict()["decoder.block.1.layer.1.EncDecAttention.k.weight"])


def expect_one_line(fn, *fragments):
    with pytest.raises(UserError) as error:
        fn()
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_what_does_not_convert_is_one_line(tmp_path):
    hf_t5(tmp_path / "hf")
    config_path = tmp_path / "hf" / "config.json"
    config = json.loads(config_path.read_text())
    # a config that does not match its weights
    config_path.write_text(json.dumps({**config, "d_ff": 64}))
    expect_one_line(lambda: convert(str(tmp_path / "hf"), str(tmp_path / "a.mdl")),
                    "DenseReluDense.wi.weight is 48x32", "d_ff 64", "64x32")
    config_path.write_text(json.dumps({**config, "num_layers": 2}))
    expect_one_line(lambda: convert(str(tmp_path / "hf"), str(tmp_path / "b.mdl")),
                    "encoder.block.2.layer.0.SelfAttention.k.weight is not a weight of a 2 + 2-block relu T5")
    # what the zoo's T5 does not compute
    config_path.write_text(json.dumps({**config, "feed_forward_proj": "gated-silu"}))
    expect_one_line(lambda: convert(str(tmp_path / "hf"), str(tmp_path / "c.mdl")), "feed_forward_proj 'gated-silu'")
    config_path.write_text(json.dumps({**config, "scale_decoder_outputs": False}))
    expect_one_line(lambda: convert(str(tmp_path / "hf"), str(tmp_path / "d.mdl")), "scale_decoder_outputs False")
    # a checkpoint of another architecture
    config_path.write_text(json.dumps({**config, "model_type": "bart", "architectures": ["BartModel"]}))
    expect_one_line(lambda: convert(str(tmp_path / "hf"), str(tmp_path / "e.mdl")), "model_type 'bart'",
                    "T5 (model_type t5)")


def test_an_untied_zoo_head_is_refused_in_one_line(tmp_path):
    zoo_run(tmp_path, "model.tie_word_embeddings=false")
    expect_one_line(lambda: convert(str(tmp_path / "checkpoint_3.mdl"), str(tmp_path / "hf")),
                    "model.tie_word_embeddings false", "transformers 5 ties")


def tf_t5_logits(line: str, prefix: str, input_ids, attention_mask, decoder_input_ids):
    """tf/t5 built from the model keys the conversion printed, its variables restored from ``prefix``."""
    tf = pytest.importorskip("tensorflow")
    tf_model, tf_utils = import_beside(os.path.join(zoo.ROOT, "tf", "t5", "run.py"), "model", "utils")
    overrides = line.split("; the model: ")[1].split()
    p = load_params(os.path.join(zoo.ROOT, "tf", "t5", "configs", "params_tiny.yaml"), tf_utils.default_params(),
                    [*overrides, "model.dropout_rate=0.0"])["model"]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        features = {name: tf.constant(value, tf.int32) for name, value in (
            ("input_ids", input_ids), ("attention_mask", attention_mask), ("decoder_input_ids", decoder_input_ids))}
        logits = tf_model.t5_logits(features, p, training=False)  # (B*T, V)
        tf.compat.v1.train.Saver().restore(session, prefix)
        return session.run(logits).reshape(*decoder_input_ids.shape, -1)


def test_hugging_faces_t5_to_tf_t5_computes_its_logits_and_comes_back_bit_for_bit(tmp_path):
    pytest.importorskip("tensorflow")
    theirs = hf_t5(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "tf" / "model.ckpt-0"))
    assert "TF checkpoint" in line and "t5 variables" in line
    g = torch.Generator().manual_seed(1)
    input_ids, decoder_input_ids = torch.randint(0, 99, (3, 14), generator=g), torch.randint(0, 99, (3, 9), generator=g)
    attention_mask = (torch.arange(14)[None] < torch.tensor([[14], [9], [3]])).long()
    with torch.no_grad():
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask,
                          decoder_input_ids=decoder_input_ids).logits.numpy()
    got = tf_t5_logits(line, str(tmp_path / "tf" / "model.ckpt-0"), input_ids.numpy(), attention_mask.numpy(),
                       decoder_input_ids.numpy())
    scale = abs(expected).max()
    assert abs(got - expected).max() / scale < 1e-5
    params = tmp_path / "params.yaml"
    params.write_text("model:\n" + "".join(f"  {o.split('=')[0][len('model.'):]}: {o.split('=')[1]}\n"
                                           for o in line.split("; the model: ")[1].split()))
    assert "T5ForConditionalGeneration" in convert(str(tmp_path / "tf" / "model.ckpt-0"), str(tmp_path / "back"),
                                                   params=str(params))
    before, after = hf_tensors(tmp_path / "hf"), hf_tensors(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name


def test_the_tf_names_are_tf_t5s_variables_and_map_back():
    from common import t5_names

    tf = pytest.importorskip("tensorflow")
    tf_model, tf_utils = import_beside(os.path.join(zoo.ROOT, "tf", "t5", "run.py"), "model", "utils")
    for variant in ((), ("model.feed_forward_proj=gated-gelu", "model.tie_word_embeddings=false")):
        p = load_params(os.path.join(zoo.ROOT, "tf", "t5", "configs", "params_tiny.yaml"), tf_utils.default_params(),
                        list(variant))["model"]
        with tf.Graph().as_default():
            features = {k: tf.zeros([2, 8], tf.int32) for k in ("input_ids", "attention_mask", "decoder_input_ids")}
            tf_model.t5_logits(features, p, training=False)
            variables = {v.op.name for v in tf.compat.v1.global_variables()}
        names = t5_names.torch_names(p["num_layers"], p["num_decoder_layers"], bool(variant), not variant)
        assert {t5_names.torch_name_to_tf(n)[0] for n in names} == variables
        assert all(t5_names.tf_name_to_torch(t5_names.torch_name_to_tf(n)[0])[0] == n for n in names)
    assert t5_names.tf_name_to_torch("transformer/wte") is None  # a GPT-2 variable

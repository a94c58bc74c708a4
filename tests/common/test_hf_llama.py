"""zoo convert with Hugging Face's LlamaForCausalLM and MistralForCausalLM: into pytorch/llama's
checkpoint (its logits within 1e-5 of Hugging Face's) and back, bit for bit; the TF names of the
twins' contract; what pytorch/llama does not compute, refused in one line."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from common import llama_names, zoo  # noqa: E402
from common.convert import convert, load_safetensors  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import load_params  # noqa: E402
from common.pytorch.checkpoint import load_checkpoint  # noqa: E402

LLAMA = os.path.join(zoo.ROOT, "pytorch", "llama")
model, utils = import_beside(os.path.join(LLAMA, "run.py"), "model", "utils")
SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=40, bos_token_id=0, eos_token_id=0)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def hf_model(path, mistral=False, **changes):
    """A tiny Llama (or Mistral) with every weight random, saved by save_pretrained."""
    torch.manual_seed(0)
    if mistral:
        net = transformers.MistralForCausalLM(transformers.MistralConfig(**{**SIZES, **changes}))
    else:
        net = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SIZES, **changes}))
    with torch.no_grad():
        for p in net.parameters():  # the norms' ones too: no swap of two tensors of one shape goes unseen
            p.add_(torch.randn_like(p) * 0.05)
    net.eval().save_pretrained(str(path))
    return net


def zoo_model(checkpoint, line):
    """pytorch/llama's network from the model keys a conversion printed, with the converted weights."""
    overrides = line.split("; the model: ")[1].split()
    params = load_params(os.path.join(LLAMA, "configs", "params_tiny.yaml"), utils.default_params(), overrides)
    net = model.LlamaForCausalLM(params["model"]).eval()
    net.load_state_dict(load_checkpoint(str(checkpoint))["model"])
    return net, overrides


def params_file(path, overrides):
    """A params file of those model keys (what the runner writes into a model_dir)."""
    lines = [f"  {o.split('=', 1)[0].removeprefix('model.')}: {o.split('=', 1)[1]}" for o in overrides]
    path.write_text(f"base: {os.path.join(LLAMA, 'configs', 'params_tiny.yaml')}\nmodel:\n" + "\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("mistral, changes", [
    (False, {}),
    (False, {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    (True, {"sliding_window": 5, "rope_parameters": LLAMA3}),
], ids=["llama_gqa", "llama_tied_mha", "mistral_window_llama3_rope"])
def test_hugging_face_to_pytorch_llama_and_back_bit_for_bit(tmp_path, mistral, changes):
    hf = hf_model(tmp_path / "hf", mistral, **changes)
    line = convert(str(tmp_path / "hf"), str(tmp_path / "run.mdl"))
    net, overrides = zoo_model(tmp_path / "run.mdl", line)
    ids = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(1))  # longer than the window
    with torch.no_grad():
        torch.testing.assert_close(net(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    params = params_file(tmp_path / "p.yaml", overrides)
    back = convert(str(tmp_path / "run.mdl"), str(tmp_path / "back"), params=params)
    assert ("MistralForCausalLM" if mistral else "LlamaForCausalLM") in back
    theirs, ours = load_safetensors(str(tmp_path / "hf" / "model.safetensors"))[0], \
        load_safetensors(str(tmp_path / "back" / "model.safetensors"))[0]
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert type(reloaded) is type(hf)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, hf(ids).logits)
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["num_key_value_heads"] == hf.config.num_key_value_heads
    assert config["rope_parameters"]["rope_type"] == ("llama3" if "rope_parameters" in changes else "default")


@pytest.mark.parametrize("changes, fragment", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}}, "rope_type 'yarn'"),
    ({"attention_bias": True}, "attention_bias True"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_what_pytorch_llama_does_not_compute_is_refused(tmp_path, changes, fragment):
    hf_model(tmp_path / "hf", **changes)
    with pytest.raises(UserError, match=fragment) as info:
        convert(str(tmp_path / "hf"), str(tmp_path / "run.mdl"))
    assert "\n" not in str(info.value) and not (tmp_path / "run.mdl").exists()


def test_params_that_contradict_the_weights_are_refused(tmp_path):
    hf_model(tmp_path / "hf")
    line = convert(str(tmp_path / "hf"), str(tmp_path / "run.mdl"))
    overrides = [o for o in line.split("; the model: ")[1].split() if not o.startswith("model.num_kv_heads=")]
    params = params_file(tmp_path / "p.yaml", [*overrides, "model.num_kv_heads=4"])
    with pytest.raises(UserError, match="2 key/value heads in the weights .* num_kv_heads 4"):
        convert(str(tmp_path / "run.mdl"), str(tmp_path / "back"), params=params)


def test_the_tf_names_are_the_contracts():
    names = llama_names.torch_names(2)
    assert names[:2] == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]
    assert names[-2:] == ["model.norm.weight", "lm_head.weight"] and len(names) == 2 + 9 * 2 + 1
    assert "lm_head.weight" not in llama_names.torch_names(2, tied=True)
    expected = {"model.embed_tokens.weight": ("model/embed_tokens", False),
                "model.layers.1.self_attn.k_proj.weight": ("model/layers_1/self_attn/k_proj/kernel", True),
                "model.layers.0.post_attention_layernorm.weight": ("model/layers_0/post_attention_layernorm/weight",
                                                                    False),
                "model.layers.1.mlp.down_proj.weight": ("model/layers_1/mlp/down_proj/kernel", True),
                "model.norm.weight": ("model/norm/weight", False), "lm_head.weight": ("lm_head/kernel", True)}
    for torch_name, (tf_name, transpose) in expected.items():
        assert llama_names.torch_name_to_tf(torch_name) == (tf_name, transpose)
        assert llama_names.tf_name_to_torch(tf_name) == (torch_name, transpose)
    with pytest.raises(UserError, match="not a PyTorch Llama weight name"):
        llama_names.torch_name_to_tf("transformer.wte.weight")


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_pytorch_llama_to_a_tf_checkpoint_under_the_contracts_names(tmp_path):
    import numpy as np

    from common.convert import tf_variables

    hf_model(tmp_path / "hf")
    convert(str(tmp_path / "hf"), str(tmp_path / "run.mdl"))
    convert(str(tmp_path / "run.mdl"), str(tmp_path / "tf" / "model.ckpt-3"))
    variables = tf_variables(str(tmp_path / "tf" / "model.ckpt-3"))
    weights = load_checkpoint(str(tmp_path / "run.mdl"))["model"]
    assert {n for n in variables if n != "global_step"} == {llama_names.torch_name_to_tf(n)[0] for n in weights}
    np.testing.assert_array_equal(variables["model/layers_1/self_attn/k_proj/kernel"],
                                  weights["model.layers.1.self_attn.k_proj.weight"].numpy().T)  # [in, out]
    np.testing.assert_array_equal(variables["model/embed_tokens"], weights["model.embed_tokens.weight"].numpy())

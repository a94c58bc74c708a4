"""The Llama family's weight names (pytorch/llama, tf/llama, Hugging Face's LlamaForCausalLM and
MistralForCausalLM), the conversions, and reading a zoo PyTorch checkpoint of it.

pytorch/llama names its weights exactly as Hugging Face's ``LlamaForCausalLM`` (and
``MistralForCausalLM``, the same tree), in the same layouts: a Hugging Face state_dict is the
zoo's as it is. tf/llama keeps the tree with '/' and Dense kernels [in, out]:

    zoo PyTorch / HF  model.layers.{i}.self_attn.q_proj.weight  [heads x D, H]
    zoo TF            model/layers_{i}/self_attn/q_proj/kernel  [H, heads x D]   transposed

and the same for k_proj, v_proj, o_proj and the MLP's gate_proj, up_proj, down_proj; the
embedding table (``model.embed_tokens.weight`` <-> ``model/embed_tokens``) and the RMS norms'
weights (``...input_layernorm.weight`` <-> ``.../input_layernorm/weight``) keep their layout.
``lm_head.weight`` [V, H] (``lm_head/kernel`` [H, V]) exists only when the head is not the
embedding table (``share_embedding_weights: false``, Hugging Face's ``tie_word_embeddings: false``).

- ``tf_name_to_torch(name)`` / ``torch_name_to_tf(name)``: (other name, transpose), or a
  UserError for a name that is not Llama's.
- ``torch_names(num_hidden_layers, tied)``: every zoo PyTorch name of a model, in its order.
- ``read_llama_weights(path)``: the Llama weights of a checkpoint of either framework (a .mdl,
  a state_dict, .safetensors, a TF prefix or a model_dir), as numpy arrays in the zoo PyTorch
  naming and layout; optimizer slots and other tensors skipped.
"""

from __future__ import annotations

import numpy as np

from common.errors import UserError
from common.name_table import NameTable

# One row per tensor: (TF name, torch name, transpose); {i} is the layer
NAMES: tuple[tuple[str, str, bool], ...] = (
    ("model/embed_tokens", "model.embed_tokens.weight", False),  # [vocab, hidden]
    ("model/layers_{i}/input_layernorm/weight", "model.layers.{i}.input_layernorm.weight", False),
    *((f"model/layers_{{i}}/self_attn/{p}/kernel", f"model.layers.{{i}}.self_attn.{p}.weight", True)
      for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("model/layers_{i}/post_attention_layernorm/weight", "model.layers.{i}.post_attention_layernorm.weight", False),
    *((f"model/layers_{{i}}/mlp/{p}/kernel", f"model.layers.{{i}}.mlp.{p}.weight", True)
      for p in ("gate_proj", "up_proj", "down_proj")),
    ("model/norm/weight", "model.norm.weight", False),
    ("lm_head/kernel", "lm_head.weight", True),  # only when the head is not the embedding table
)


# rope_scaling's keys beside rope_type (pytorch/llama's check_sizes; Hugging Face's rope_parameters)
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


TABLE = NameTable(NAMES, "TF Llama variable name (model/..., lm_head/kernel)", "PyTorch Llama weight name (model...., lm_head.weight)")


def tf_name_to_torch(name: str) -> tuple[str, bool]:
    """(zoo PyTorch name, transpose) of a tf/llama variable name."""
    return TABLE.tf_to_torch(name)


def torch_name_to_tf(name: str) -> tuple[str, bool]:
    """(TF name, transpose) of a zoo PyTorch (Hugging Face) Llama weight name."""
    return TABLE.torch_to_tf(name)


def is_torch_name(name: str) -> bool:
    return TABLE.is_torch_name(name)


def torch_names(num_hidden_layers: int, tied: bool = False) -> list[str]:
    """Every zoo PyTorch name of a Llama, in the model's order (``tied``: no lm_head.weight)."""
    templates = [t for _, t, _ in NAMES if not (tied and t == "lm_head.weight")]
    layer = [t for t in templates if "{i}" in t]
    first = templates.index(layer[0])
    return (templates[:first] + [t.replace("{i}", str(i)) for i in range(num_hidden_layers) for t in layer]
            + templates[first + len(layer):])


def num_layers(weights) -> int:
    return 1 + max(int(n.split(".")[2]) for n in weights if n.startswith("model.layers."))


def read_llama_weights(path: str) -> dict[str, np.ndarray]:
    """The Llama weights in the checkpoint ``path`` as {zoo PyTorch name: array in its layout}:
    a zoo PyTorch checkpoint (a .mdl, a state_dict ``.pt`` or ``.safetensors`` of the zoo's names),
    a tf/llama checkpoint prefix (``model.ckpt-N``: its kernels transposed), or a model_dir holding
    either kind (its newest). (A Hugging Face directory is read by common/hf.py.)"""
    from common.bert_names import _checkpoint_of, _torch_tensors

    kind, where = _checkpoint_of(path)
    weights = {}
    if kind == "tf":
        from common.weights_io import tf_variables

        variables = tf_variables(where)
        for name, value in variables.items():
            found = TABLE.tf_match(name)  # Adam's slots (.../kernel/Adam) and the step are not Llama's names
            if found is not None:
                torch_name, transpose = found
                value = np.asarray(value)
                if value.dtype.name in ("float16", "bfloat16", "float64"):  # as the torch side: float32
                    value = value.astype(np.float32)
                weights[torch_name] = value.T if transpose else value
    else:
        variables = _torch_tensors(kind, where)
        for name, value in variables.items():
            name = name.removeprefix("module.").removeprefix("_orig_mod.")  # DataParallel, torch.compile
            if is_torch_name(name):
                if not isinstance(value, np.ndarray):  # safetensors' torch tensors
                    value = value.float().numpy() if value.is_floating_point() else value.numpy()
                weights[name] = value
    if "model.embed_tokens.weight" not in weights:  # a T5's untied lm_head.weight alone is not a Llama
        weights = {}
    if not weights:
        example = f" (it holds {', '.join(sorted(variables)[:3])} ...)" if variables else ""
        raise UserError(f"{where}: holds no Llama weight{example}; Llama's names are model.embed_tokens.weight, "
                        "model.layers.0.self_attn.q_proj.weight, ... (PyTorch) or model/embed_tokens, ... (TF)")
    return weights

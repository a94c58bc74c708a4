"""GPT-2's weight names in both frameworks and in Hugging Face's, the conversions, and reading either checkpoint.

The PyTorch GPT-2 of the zoo names its weights as Hugging Face's ``GPT2LMHeadModel``
(``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight``, ...) but its
projections are ``nn.Linear``s, [out, in]; Hugging Face's are ``Conv1D``s, [in, out]. The
TF GPT-2 names its variables ``transformer/wte``, ``transformer/h_0/attn/c_attn/kernel``
([in, out], as every Dense kernel), ... So:

    zoo PyTorch  transformer.h.{i}.attn.c_attn.weight  [3H, H]   (q, k, v fused, in that order)
    zoo TF       transformer/h_{i}/attn/c_attn/kernel  [H, 3H]   transposed
    Hugging Face transformer.h.{i}.attn.c_attn.weight  [H, 3H]   transposed (Conv1D), same name

and the same for attn.c_proj, mlp.c_fc and mlp.c_proj; embeddings, LayerNorm parameters
and biases keep their layout everywhere. ``lm_head.weight`` [V, H] and ``lm_head.bias``
exist only in a model that does not tie its head to the word embeddings (GPT-J's form);
``ln_2`` is absent from a block with parallel attention (GPT-J's form).

- ``tf_name_to_torch(name)`` / ``torch_name_to_tf(name)``: (other name, transpose), or a
  UserError for a name that is not GPT-2's.
- ``hf_transposed(name)``: whether a zoo PyTorch name's tensor is transposed in Hugging
  Face's file (the Conv1D weights).
- ``torch_names(num_hidden_layers, parallel, tied)``: every zoo PyTorch name of a model.
- ``read_gpt2_weights(path)``: the GPT-2 weights of a checkpoint of either framework (a
  .mdl, a state_dict, .safetensors, a TF prefix or a model_dir), as numpy arrays in the zoo
  PyTorch naming and layout; optimizer slots and other variables skipped.
"""

from __future__ import annotations

import re

import numpy as np

from common.errors import UserError
from common.name_table import NameTable

# --- the table of names -------------------------------------------------------------------
# One row per module: (TF scope, torch scope, kind); kinds as common/bert_names.py:
#   dense       TF <scope>/kernel [in, out] and <scope>/bias;  torch <scope>.weight [out, in] and .bias
#   layer_norm  TF <scope>/gamma and <scope>/beta;             torch <scope>.weight and <scope>.bias
#   tensor      TF <scope>, torch <scope>.weight, same layout
_MODULES = (
    ("transformer/wte", "transformer.wte", "tensor"),  # [vocab, hidden]
    ("transformer/wpe", "transformer.wpe", "tensor"),  # [max_position_embeddings, hidden]
    ("transformer/h_{i}/ln_1", "transformer.h.{i}.ln_1", "layer_norm"),
    ("transformer/h_{i}/attn/c_attn", "transformer.h.{i}.attn.c_attn", "dense"),  # H -> 3H (q, k, v)
    ("transformer/h_{i}/attn/c_proj", "transformer.h.{i}.attn.c_proj", "dense"),  # H -> H
    ("transformer/h_{i}/ln_2", "transformer.h.{i}.ln_2", "layer_norm"),  # absent with parallel attention
    ("transformer/h_{i}/mlp/c_fc", "transformer.h.{i}.mlp.c_fc", "dense"),  # H -> filter_size
    ("transformer/h_{i}/mlp/c_proj", "transformer.h.{i}.mlp.c_proj", "dense"),  # filter_size -> H
    ("transformer/ln_f", "transformer.ln_f", "layer_norm"),
    ("lm_head", "lm_head", "dense"),  # only when the head is not tied to transformer.wte
)

_SUFFIXES = {  # kind -> ((TF suffix, torch suffix, transpose), ...)
    "dense": (("/kernel", ".weight", True), ("/bias", ".bias", False)),
    "layer_norm": (("/gamma", ".weight", False), ("/beta", ".bias", False)),
    "tensor": (("", ".weight", False),),
}

# (TF template, torch template, transpose) for every tensor
NAMES: tuple[tuple[str, str, bool], ...] = tuple(
    (tf_scope + tf_suffix, torch_scope + torch_suffix, transpose)
    for tf_scope, torch_scope, kind in _MODULES
    for tf_suffix, torch_suffix, transpose in _SUFFIXES[kind]
)
# Hugging Face's GPT2LMHeadModel stores these four as Conv1D weights, [in, out]: the zoo's Linear transposed
_CONV1D = re.compile(r"transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


TABLE = NameTable(NAMES, "TF GPT-2 variable name (transformer/..., lm_head/...)", "PyTorch GPT-2 weight name (transformer...., lm_head....)")


def tf_name_to_torch(name: str) -> tuple[str, bool]:
    """(zoo PyTorch name, transpose) of a TF GPT-2 variable name."""
    return TABLE.tf_to_torch(name)


def torch_name_to_tf(name: str) -> tuple[str, bool]:
    """(TF name, transpose) of a zoo PyTorch GPT-2 weight name."""
    return TABLE.torch_to_tf(name)


def is_torch_name(name: str) -> bool:
    return TABLE.is_torch_name(name)


def hf_transposed(name: str) -> bool:
    """Whether the zoo PyTorch weight ``name`` is stored transposed by Hugging Face (a Conv1D weight)."""
    return bool(_CONV1D.fullmatch(name))


def torch_names(num_hidden_layers: int, parallel: bool = False, tied: bool = True) -> list[str]:
    """Every zoo PyTorch name of a GPT-2 (``parallel``: no ln_2; not ``tied``: lm_head.weight and .bias)."""
    templates = [t for _, t, _ in NAMES if not (parallel and ".ln_2." in t or tied and t.startswith("lm_head."))]
    layer = [t for t in templates if "{i}" in t]
    first = templates.index(layer[0])
    return (templates[:first] + [t.replace("{i}", str(i)) for i in range(num_hidden_layers) for t in layer]
            + templates[first + len(layer):])


# --- reading a checkpoint -----------------------------------------------------------------

def _torch_name(name: str) -> str:
    """A torch name as the table spells it: wrappers' prefixes dropped, a bare GPT2Model's
    names under ``transformer.``."""
    for prefix in ("module.", "_orig_mod."):  # DataParallel, torch.compile
        name = name.removeprefix(prefix)
    if name.startswith(("wte.", "wpe.", "h.", "ln_f.")):  # saved from GPT2Model, not GPT2LMHeadModel
        name = "transformer." + name
    return name


def read_gpt2_weights(path: str) -> dict[str, np.ndarray]:
    """The GPT-2 weights in the checkpoint ``path`` as {zoo PyTorch name: array in its layout}.

    ``path`` is a zoo PyTorch checkpoint (``checkpoint_N.mdl``), a state_dict (``.pt``) or
    ``.safetensors`` of the zoo's names, a TF checkpoint prefix (``model.ckpt-N``), or a
    model_dir holding either kind (its newest). Optimizer slots, the step counter, causal
    mask buffers and any other tensor are skipped. (A Hugging Face directory is read by
    common/hf.py, which transposes its Conv1D weights.)
    """
    from common.bert_names import _checkpoint_of, _torch_tensors

    kind, where = _checkpoint_of(path)
    weights: dict[str, np.ndarray] = {}
    if kind == "tf":
        from common.weights_io import tf_variables

        variables = tf_variables(where)
        for name, value in variables.items():
            found = TABLE.tf_match(name)
            if found is not None:
                torch_name, transpose = found
                value = np.asarray(value)
                if value.dtype.name in ("float16", "bfloat16", "float64"):  # as the torch side: float32
                    value = value.astype(np.float32)
                weights[torch_name] = value.T if transpose else value
    else:
        variables = _torch_tensors(kind, where)
        for name, value in variables.items():
            name = _torch_name(name)
            if TABLE.is_torch_name(name):
                weights[name] = value
    if not weights:
        example = f" (it holds {', '.join(sorted(variables)[:3])} ...)" if variables else ""
        raise UserError(f"{where}: holds no GPT-2 weight{example}; GPT-2's names are transformer.wte.weight, "
                        "transformer.h.0.attn.c_attn.weight, ... (PyTorch) or transformer/wte, ... (TF)")
    return weights

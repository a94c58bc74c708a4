"""T5's weight names in the zoo and in Hugging Face's, the shapes, and reading a zoo checkpoint.

The PyTorch T5 of the zoo (pytorch/t5) names its weights as Hugging Face's
``T5ForConditionalGeneration`` and, like it, keeps every projection an ``nn.Linear`` without
bias ([out, in]), so a tensor's name and layout are the same in both:

    shared.weight                                                   [V, d]
    encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight   [buckets, heads]
    encoder.block.{i}.layer.0.SelfAttention.{q,k,v}.weight          [heads d_kv, d]
    encoder.block.{i}.layer.0.SelfAttention.o.weight                [d, heads d_kv]
    encoder.block.{i}.layer.0.layer_norm.weight                     [d]
    encoder.block.{i}.layer.1.DenseReluDense.wi.weight              [d_ff, d]  (gated-gelu: wi_0 and wi_1)
    encoder.block.{i}.layer.1.DenseReluDense.wo.weight              [d, d_ff]
    encoder.block.{i}.layer.1.layer_norm.weight, encoder.final_layer_norm.weight
    decoder.block.{i}.layer.0 (self-attention, its bias table in block 0), layer.1.EncDecAttention
    (cross-attention) and layer.1.layer_norm, layer.2 (the feed-forward), decoder.final_layer_norm
    lm_head.weight                                                  [V, d]  (only with an untied head)

What differs is only what Hugging Face stores twice: ``encoder.embed_tokens.weight`` and
``decoder.embed_tokens.weight`` (the shared table again) and, tied, ``lm_head.weight``; the
zoo stores ``shared.weight`` once. Hugging Face's loader also ignores a cross-attention bias
table (``decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight``, which
older versions saved and never used).

- ``hf_name_to_torch(name)``: the zoo name of a Hugging Face tensor, or None to skip it.
- ``torch_names(num_layers, num_decoder_layers, gated, tied)``: every zoo name of a model.
- ``shapes(keys)``: every weight's shape of a model of those keys (HF T5Config names).
- ``torch_name_to_tf(name)`` / ``tf_name_to_torch(name)``: tf/t5's variable names, which
  mirror the same tree (``encoder/block_0/layer_0/SelfAttention/q/kernel``, the projections'
  kernels [in, out], transposed; ``shared/embedding``, ``.../relative_attention_bias/embedding``,
  the norms' ``.../layer_norm/weight`` as they are).
- ``read_t5_weights(path)``: the T5 weights of a zoo checkpoint of either framework as numpy arrays.
"""

from __future__ import annotations

import re

import numpy as np

from common.errors import UserError

# Hugging Face's names of the shared table that the zoo does not store again
HF_TIED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
HF_UNUSED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)

_ATTENTION = ("q", "k", "v", "o")


def _feed_forward(gated: bool) -> tuple[str, ...]:
    return ("wi_0", "wi_1", "wo") if gated else ("wi", "wo")


def torch_names(num_layers: int, num_decoder_layers: int, gated: bool = False, tied: bool = True) -> list[str]:
    """Every zoo name of a T5, in the model's state_dict order."""
    names = ["shared.weight"]
    for stack, layers in (("encoder", num_layers), ("decoder", num_decoder_layers)):
        for i in range(layers):
            block = f"{stack}.block.{i}.layer"
            names += [f"{block}.0.SelfAttention.{w}.weight" for w in _ATTENTION]
            if i == 0:
                names.append(f"{block}.0.SelfAttention.relative_attention_bias.weight")
            names.append(f"{block}.0.layer_norm.weight")
            ff = 1
            if stack == "decoder":
                names += [f"{block}.1.EncDecAttention.{w}.weight" for w in _ATTENTION]
                names.append(f"{block}.1.layer_norm.weight")
                ff = 2
            names += [f"{block}.{ff}.DenseReluDense.{w}.weight" for w in _feed_forward(gated)]
            names.append(f"{block}.{ff}.layer_norm.weight")
        names.append(f"{stack}.final_layer_norm.weight")
    if not tied:
        names.append("lm_head.weight")
    return names


_NAME = re.compile(
    r"shared\.weight|lm_head\.weight|(encoder|decoder)\.final_layer_norm\.weight"
    r"|(encoder|decoder)\.block\.\d+\.layer\.[0-2]\.(SelfAttention|EncDecAttention)"
    r"\.(q|k|v|o|relative_attention_bias)\.weight"
    r"|(encoder|decoder)\.block\.\d+\.layer\.[0-2]\.DenseReluDense\.(wi|wi_0|wi_1|wo)\.weight"
    r"|(encoder|decoder)\.block\.\d+\.layer\.[0-2]\.layer_norm\.weight")


def is_torch_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


_KERNELS = ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo", "lm_head")  # Linear [out, in] <-> Dense kernel [in, out]
_TABLES = ("shared", "relative_attention_bias")  # an embedding table, the same layout in both


def torch_name_to_tf(name: str) -> tuple[str, bool]:
    """(tf/t5's variable name, transpose) of a zoo T5 name: the module path with ``/``, blocks
    and layers as ``block_{i}`` / ``layer_{j}``, and the projections' ``kernel`` transposed
    (``encoder.block.0.layer.0.SelfAttention.q.weight`` -> ``encoder/block_0/layer_0/SelfAttention/q/kernel``)."""
    if not is_torch_name(name):
        raise UserError(f"{name}: not a T5 weight name (shared.weight, "
                        "encoder.block.0.layer.0.SelfAttention.q.weight, ...)")
    path = re.sub(r"(block|layer)/(\d+)", r"\1_\2", name.removesuffix(".weight").replace(".", "/"))
    module = path.rsplit("/", 1)[-1]
    if module in _KERNELS:
        return path + "/kernel", True
    return path + ("/embedding" if module in _TABLES else "/weight"), False


def tf_name_to_torch(name: str) -> tuple[str, bool] | None:
    """(zoo T5 name, transpose) of a tf/t5 variable name, None for a variable that is not a T5 weight."""
    found = re.fullmatch(r"(.+)/(kernel|embedding|weight)", name)
    if found is None:
        return None
    torch_name = re.sub(r"(block|layer)_(\d+)", r"\1.\2", found[1]).replace("/", ".") + ".weight"
    if not is_torch_name(torch_name) or torch_name_to_tf(torch_name)[0] != name:
        return None
    return torch_name, found[2] == "kernel"


def hf_name_to_torch(name: str) -> str | None:
    """The zoo name of a tensor of Hugging Face's T5ForConditionalGeneration (or its T5Model), None to skip."""
    for prefix in ("module.", "_orig_mod."):  # DataParallel, torch.compile
        name = name.removeprefix(prefix)
    if name in HF_TIED or name in HF_UNUSED:
        return None
    return name if is_torch_name(name) else None


def num_layers(weights, stack: str) -> int:
    found = [int(m.group(1)) for n in weights if (m := re.match(rf"{stack}\.block\.(\d+)\.", n))]
    return 1 + max(found) if found else 0


def shapes(keys: dict) -> dict[str, tuple]:
    """Every weight's shape of a T5 with the model ``keys`` (pytorch/t5's, Hugging Face's T5Config names)."""
    V, d, d_ff = keys["vocab_size"], keys["d_model"], keys["d_ff"]
    inner = keys["num_heads"] * keys["d_kv"]
    rows = {"shared": (V, d), "lm_head": (V, d), "relative_attention_bias": (keys["relative_attention_num_buckets"],
                                                                           keys["num_heads"]),
            "q": (inner, d), "k": (inner, d), "v": (inner, d), "o": (d, inner),
            "wi": (d_ff, d), "wi_0": (d_ff, d), "wi_1": (d_ff, d), "wo": (d, d_ff)}
    out = {}
    for name in torch_names(keys["num_layers"], keys["num_decoder_layers"], keys["feed_forward_proj"] == "gated-gelu",
                            keys["tie_word_embeddings"]):
        part = name.split(".")[-2]
        out[name] = rows.get(part, (d,))  # the norms: (d,)
    return out


def check_weights(weights: dict[str, np.ndarray], keys: dict, source: str) -> None:
    """One line when ``weights`` are not those of a T5 with ``keys``: a shape, a missing or extra tensor."""
    expected = shapes(keys)
    sizes = (f"d_model {keys['d_model']}, d_kv {keys['d_kv']}, num_heads {keys['num_heads']}, d_ff {keys['d_ff']}, "
             f"vocab_size {keys['vocab_size']}")
    for name, shape in expected.items():
        if name in weights and tuple(weights[name].shape) != shape:
            raise UserError(f"{source}: {name} is {'x'.join(map(str, weights[name].shape))}, but a T5 of {sizes} "
                            f"has {'x'.join(map(str, shape))}")
    layers = f"{keys['num_layers']} + {keys['num_decoder_layers']}-block {keys['feed_forward_proj']} T5"
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise UserError(f"{source}: {extra[0]} is not a weight of a {layers}"
                        + (f" (nor {len(extra) - 1} more)" if len(extra) > 1 else ""))
    missing = [n for n in expected if n not in weights]
    if missing:
        raise UserError(f"{source}: lacks {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                                            else "") + f" of a {layers}")


def read_t5_weights(path: str) -> dict[str, np.ndarray]:
    """The T5 weights of a zoo checkpoint of either framework (``checkpoint_N.mdl``, a state_dict
    ``.pt``, ``.safetensors``, a TF prefix ``model.ckpt-N``, or a model_dir holding some) as
    {zoo name: float32 array in pytorch/t5's layout}; optimizer slots and the step counter skipped."""
    from common.bert_names import _checkpoint_of, _torch_tensors

    kind, where = _checkpoint_of(path)
    weights = {}
    if kind == "tf":
        from common.weights_io import tf_variables

        variables = tf_variables(where)
        for name, value in variables.items():
            found = tf_name_to_torch(name)
            if found is not None:
                value = np.asarray(value, np.float32)
                weights[found[0]] = value.T if found[1] else value
    else:
        variables = _torch_tensors(kind, where)
        for name, value in variables.items():
            name = name.removeprefix("module.").removeprefix("_orig_mod.")
            if is_torch_name(name):
                weights[name] = value if isinstance(value, np.ndarray) else value.float().numpy()
    if set(weights) <= {"lm_head.weight"}:  # an untied GPT-2's head alone (GPT-J's form) is no T5
        weights = {}
    if not weights:
        example = f" (it holds {', '.join(sorted(variables)[:3])} ...)" if variables else ""
        raise UserError(f"{where}: holds no T5 weight{example}; T5's names are shared.weight, "
                        "encoder.block.0.layer.0.SelfAttention.q.weight, ...")
    return weights

"""BERT's weight names in both frameworks, the conversion between them, and reading either checkpoint.

The PyTorch BERT of the zoo names its weights as Hugging Face's ``BertForPreTraining`` /
``BertForSequenceClassification`` (``bert.embeddings.word_embeddings.weight``,
``bert.encoder.layer.0.attention.self.query.weight``, ``cls.predictions.bias``,
``classifier.weight``); the TF BERT names its variables as Google's BERT
(``bert/embeddings/word_embeddings``, ``bert/encoder/layer_0/attention/self/query/kernel``,
``cls/predictions/output_bias``, ``output_weights`` as run_classifier.py). So a checkpoint of
either framework, the zoo's own or one published by Google or Hugging Face, loads into
either model.

Layouts: a TF Dense kernel is [in, out] and a torch Linear weight [out, in], so those are
transposed; embeddings, LayerNorm parameters and Google's hand-made ``output_weights``
([out, in] already, as torch) are not.

- ``tf_name_to_torch(name)`` / ``torch_name_to_tf(name)``: (other name, transpose), or a
  UserError for a name that is not BERT's.
- ``read_bert_weights(path)``: the BERT weights of a checkpoint of either framework, as
  numpy arrays in torch naming and layout; optimizer slots and other variables skipped.
  The other framework is imported only when its format is read.
- ``check_compatible(weights, expected_shapes)``: one clear line when a checkpoint is of
  another model size than the model it is loaded into.
"""

from __future__ import annotations

import os
import re

import numpy as np

from common.errors import UserError
from common.name_table import NameTable

# --- the table of names -------------------------------------------------------------------
# One row per module: (TF scope, torch scope, kind). "{i}" is the encoder layer's index.
# The kind says how the module's tensors are named in each framework:
#   dense       TF <scope>/kernel [in, out] and <scope>/bias;  torch <scope>.weight [out, in] and .bias
#   layer_norm  TF <scope>/gamma and <scope>/beta;             torch <scope>.weight and <scope>.bias
#   tensor      the scope is the tensor's full name on both sides, same layout
_MODULES = (
    # embeddings: [vocab, hidden], [max_position_embeddings, hidden], [type_vocab_size, hidden]
    ("bert/embeddings/word_embeddings", "bert.embeddings.word_embeddings.weight", "tensor"),
    ("bert/embeddings/position_embeddings", "bert.embeddings.position_embeddings.weight", "tensor"),
    ("bert/embeddings/token_type_embeddings", "bert.embeddings.token_type_embeddings.weight", "tensor"),
    ("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm", "layer_norm"),
    # encoder layer i (post-LN): self-attention, its output projection, the feed-forward block
    ("bert/encoder/layer_{i}/attention/self/query", "bert.encoder.layer.{i}.attention.self.query", "dense"),
    ("bert/encoder/layer_{i}/attention/self/key", "bert.encoder.layer.{i}.attention.self.key", "dense"),
    ("bert/encoder/layer_{i}/attention/self/value", "bert.encoder.layer.{i}.attention.self.value", "dense"),
    ("bert/encoder/layer_{i}/attention/output/dense", "bert.encoder.layer.{i}.attention.output.dense", "dense"),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm", "bert.encoder.layer.{i}.attention.output.LayerNorm",
     "layer_norm"),
    ("bert/encoder/layer_{i}/intermediate/dense", "bert.encoder.layer.{i}.intermediate.dense", "dense"),
    ("bert/encoder/layer_{i}/output/dense", "bert.encoder.layer.{i}.output.dense", "dense"),
    ("bert/encoder/layer_{i}/output/LayerNorm", "bert.encoder.layer.{i}.output.LayerNorm", "layer_norm"),
    # the pooler: tanh dense on [CLS]
    ("bert/pooler/dense", "bert.pooler.dense", "dense"),
    # MLM head; its output projection is the word embeddings (tied), so only its bias is stored
    ("cls/predictions/transform/dense", "cls.predictions.transform.dense", "dense"),
    ("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm", "layer_norm"),
    ("cls/predictions/output_bias", "cls.predictions.bias", "tensor"),
    # NSP head: Google made it by hand as [2, hidden], the layout of a torch Linear weight
    ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", "tensor"),
    ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias", "tensor"),
    # sequence classifier, as Google's run_classifier.py: [num_classes, hidden], by hand too
    ("output_weights", "classifier.weight", "tensor"),
    ("output_bias", "classifier.bias", "tensor"),
)

_SUFFIXES = {  # kind -> ((TF suffix, torch suffix, transpose), ...)
    "dense": (("/kernel", ".weight", True), ("/bias", ".bias", False)),
    "layer_norm": (("/gamma", ".weight", False), ("/beta", ".bias", False)),
    "tensor": (("", "", False),),
}

# (TF template, torch template, transpose) for every tensor
NAMES: tuple[tuple[str, str, bool], ...] = tuple(
    (tf_scope + tf_suffix, torch_scope + torch_suffix, transpose)
    for tf_scope, torch_scope, kind in _MODULES
    for tf_suffix, torch_suffix, transpose in _SUFFIXES[kind]
)


TABLE = NameTable(NAMES, "TF BERT variable name (bert/..., cls/..., output_weights, output_bias)", "PyTorch BERT weight name (bert...., cls...., classifier....)")


def tf_name_to_torch(name: str) -> tuple[str, bool]:
    """(torch name, transpose) of a Google BERT variable name."""
    return TABLE.tf_to_torch(name)


def torch_name_to_tf(name: str) -> tuple[str, bool]:
    """(TF name, transpose) of a Hugging Face BERT weight name."""
    return TABLE.torch_to_tf(name)


def is_torch_name(name: str) -> bool:
    return TABLE.is_torch_name(name)


def torch_names(num_hidden_layers: int, heads: bool = True, classifier: bool = False) -> list[str]:
    """Every torch name of a BERT with ``num_hidden_layers`` layers: the encoder (embeddings,
    layers, pooler), with ``heads`` the MLM and NSP heads, with ``classifier`` the classifier."""
    templates = [torch for _, torch, _ in NAMES
                 if not (torch.startswith("cls.") and not heads or torch.startswith("classifier.") and not classifier)]
    layer = [t for t in templates if "{i}" in t]
    first = templates.index(layer[0])  # in a state_dict's order: embeddings, layer 0, layer 1, ..., the rest
    return (templates[:first] + [t.replace("{i}", str(i)) for i in range(num_hidden_layers) for t in layer]
            + templates[first + len(layer):])


# --- reading a checkpoint -----------------------------------------------------------------

_MDL = re.compile(r"^checkpoint_(\d+)\.mdl$")
_TORCH_FILES = (".mdl", ".pt", ".pth", ".bin")


def _checkpoint_of(path: str) -> tuple[str, str]:
    """("torch" | "safetensors" | "tf", the file or TF prefix) that ``path`` names."""
    if os.path.isdir(path):
        mdl = sorted((int(m.group(1)), name) for name in os.listdir(path) if (m := _MDL.match(name)))
        if mdl:
            return "torch", os.path.join(path, mdl[-1][1])
        if any(name == "checkpoint" or name.endswith(".index") for name in os.listdir(path)):
            from common.weights_io import tf_checkpoint

            return "tf", tf_checkpoint(path)  # the newest model.ckpt-N
        raise UserError(f"{path}: holds no checkpoint (checkpoint_N.mdl of PyTorch, or model.ckpt-N of TF)")
    if path.endswith(".index") and os.path.isfile(path):
        return "tf", path[:-len(".index")]
    if os.path.isfile(path + ".index"):
        return "tf", path
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such checkpoint (a .mdl file, a TF prefix such as model.ckpt-4, or a model_dir)")
    extension = os.path.splitext(path)[1].lower()
    if extension in _TORCH_FILES:
        return "torch", path
    if extension == ".safetensors":
        return "safetensors", path
    raise UserError(f"{path}: not a checkpoint format BERT reads ({', '.join(_TORCH_FILES)}, .safetensors, "
                    "or a TF checkpoint prefix such as model.ckpt-4)")


def _import_torch(path: str):
    try:
        import torch
    except ImportError:
        raise UserError(f"{path}: reading a PyTorch checkpoint needs torch, which is not installed here "
                        "(pip install -e \".[pytorch]\")") from None
    return torch


def _torch_tensors(kind: str, path: str) -> dict:
    torch = _import_torch(path)
    if kind == "safetensors":
        from common.weights_io import load_safetensors

        return load_safetensors(path)[0]
    if path.lower().endswith(".mdl"):
        from common.pytorch.checkpoint import load_checkpoint

        state = load_checkpoint(path)["model"]  # the zoo's runner keeps the model's state_dict there
    else:
        try:  # a plain state_dict, such as Hugging Face's pytorch_model.bin
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many types for a damaged or foreign file
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise UserError(f"{path}: not a readable PyTorch file ({reason})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: holds no state_dict (names -> tensors)")
    return {name: t.detach().cpu().float().numpy() if t.is_floating_point() else t.detach().cpu().numpy()
            for name, t in state.items()}


def _torch_name(name: str) -> str:
    """A torch name as the table spells it: wrappers' prefixes dropped, a bare BertModel's
    names under ``bert.``, old Hugging Face checkpoints' LayerNorm.gamma/beta as weight/bias."""
    for prefix in ("module.", "_orig_mod."):  # DataParallel, torch.compile
        name = name.removeprefix(prefix)
    if name.startswith(("embeddings.", "encoder.", "pooler.")):  # saved from BertModel, not BertFor...
        name = "bert." + name
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def read_bert_weights(path: str) -> dict[str, np.ndarray]:
    """The BERT weights in the checkpoint ``path`` as {torch name: array in torch layout}.

    ``path`` is a zoo PyTorch checkpoint (``checkpoint_N.mdl``), a state_dict file (``.pt``,
    ``.bin``) or ``.safetensors`` of Hugging Face names, a TF checkpoint prefix
    (``model.ckpt-N``, Google's ``bert_model.ckpt``), or a model_dir holding either kind (its
    newest). Optimizer slots, the step counter and any other non-BERT tensor are skipped, and
    so is the tied MLM decoder weight (it is the word embeddings).
    """
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
        raise UserError(f"{where}: holds no BERT weight{example}; BERT's names are those of Hugging Face "
                        "(bert.embeddings....) or Google (bert/embeddings/...)")
    return weights


# --- is a checkpoint of this model's size? --------------------------------------------------
# What each dimension of a weight is, for a message in the model's own terms: first match wins.
_DIMENSIONS = (
    (re.compile(r".*word_embeddings\.weight"), ("vocab size", "hidden size")),
    (re.compile(r".*position_embeddings\.weight"), ("max_position_embeddings", "hidden size")),
    (re.compile(r".*token_type_embeddings\.weight"), ("type_vocab_size", "hidden size")),
    (re.compile(r".*intermediate\.dense\.weight"), ("filter size", "hidden size")),
    (re.compile(r".*intermediate\.dense\.bias"), ("filter size",)),
    (re.compile(r".*layer\.\d+\.output\.dense\.weight"), ("hidden size", "filter size")),
    (re.compile(r"cls\.predictions\.bias"), ("vocab size",)),
    (re.compile(r"cls\.seq_relationship\.weight"), ("number of NSP classes", "hidden size")),
    (re.compile(r"cls\.seq_relationship\.bias"), ("number of NSP classes",)),
    (re.compile(r"classifier\.weight"), ("number of classes", "hidden size")),
    (re.compile(r"classifier\.bias"), ("number of classes",)),
    (re.compile(r".*"), ("hidden size", "hidden size")),
)
_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.")


def _shape_text(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _num_layers(names) -> int:
    return 1 + max((int(m.group(1)) for n in names if (m := _LAYER.match(n))), default=-1)


def check_compatible(weights: dict[str, np.ndarray], expected_shapes: dict[str, tuple],
                     source: str = "the checkpoint") -> None:
    """Refuse, in one line, ``weights`` (torch names) that do not fit a model whose weights
    have ``expected_shapes`` (torch names): the first weight of another shape, said in the
    model's terms ("the checkpoint has hidden size 128, this model 64"); another number of
    encoder layers; encoder weights (``bert.``) missing from the checkpoint. Heads missing
    from the checkpoint are fine: fine-tuning starts them fresh. Pass the shapes of the
    weights that will be loaded (a fine-tune that starts its classifier fresh leaves
    ``classifier.*`` out, so that a checkpoint of another number of classes still fits)."""
    for name, shape in expected_shapes.items():
        if name not in weights:
            continue
        theirs, ours = tuple(weights[name].shape), tuple(shape)
        if theirs == ours:
            continue
        what = f"{name} is {_shape_text(theirs)} there, {_shape_text(ours)} here"
        meanings = next(dims for pattern, dims in _DIMENSIONS if pattern.fullmatch(name))
        if len(theirs) == len(ours):
            axis = next(a for a in range(len(ours)) if theirs[a] != ours[a])
            meaning = meanings[axis] if axis < len(meanings) else f"dimension {axis}"
            raise UserError(f"{source} has {meaning} {theirs[axis]}, this model {ours[axis]} ({what}); "
                            "use a checkpoint of this model's size, or set the model's size to the checkpoint's")
        raise UserError(f"{source} does not fit this model: {what}")
    theirs, ours = _num_layers(weights), _num_layers(expected_shapes)
    if theirs != ours:
        raise UserError(f"{source} has {theirs} encoder layer{'s' * (theirs != 1)}, this model {ours} "
                        "(num_hidden_layers); use a "
                        "checkpoint of this model's size, or set num_hidden_layers to the checkpoint's")
    missing = [name for name in expected_shapes if name.startswith("bert.") and name not in weights]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise UserError(f"{source} lacks {len(missing)} encoder weight(s) of this model: {shown}")

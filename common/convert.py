"""``zoo convert``: the checkpoint conversions the zoo can do honestly, and a clear no to the rest.

    zoo convert SRC                      list what a checkpoint holds (a .mdl, .pt, .safetensors, or a TF
                                         checkpoint: model.ckpt-N, or a model_dir holding some)
    zoo convert run.mdl weights.safetensors   the model's weights of a PyTorch checkpoint
    zoo convert run.mdl weights.pt            ... as a plain state_dict (model.load_state_dict reads it)
    zoo convert weights.safetensors w.pt      and between the two
    zoo convert weights.pt start.mdl          a weights-only zoo checkpoint: --mode eval/predict
                                              --checkpoint_path start.mdl read it (training also
                                              restores an optimizer state, which it does not hold)
    zoo convert model_dir/model.ckpt-4 w.safetensors   a TF checkpoint's variables, by TF's names

BERT, GPT-2 and T5, whose names map between the frameworks (common/bert_names.py,
common/gpt2_names.py, common/t5_names.py), also convert between PyTorch, TF and Hugging Face directories
(Llama too, common/llama_names.py)
(config.json + model.safetensors, as save_pretrained writes them; common/hf.py):

    zoo convert hf_bert/ run/checkpoint_0.mdl         BertForPreTraining -> pytorch/bert (also .pt, .safetensors)
    zoo convert hf_bert/ tf_run/model.ckpt-0          ... -> tf/bert: a TF checkpoint, written by a v1 Saver
                                                      under Google's names; --checkpoint_path reads it
    zoo convert hf_gpt2/ run/checkpoint_0.mdl         GPT2LMHeadModel -> the zoo's GPT-2 (Conv1D weights
                                                      transposed to Linear's [out, in]); or -> model.ckpt-0
    zoo convert run/checkpoint_8.mdl hf_out/          the zoo's BERT or GPT-2 -> a Hugging Face directory
    zoo convert run/checkpoint_8.mdl tf/model.ckpt-8  PyTorch -> TF (and TF -> .mdl/.pt) for BERT, GPT-2 and T5
    zoo convert hf_t5/ run/checkpoint_0.mdl           T5ForConditionalGeneration -> pytorch/t5 (the same names;
                                                      the tied embed_tokens and lm_head stored once), and back;
                                                      or -> tf/t5's model.ckpt-0 (the same tree, kernels [in, out])
    zoo convert hf_llama/ run/checkpoint_0.mdl        LlamaForCausalLM or MistralForCausalLM -> pytorch/llama (the
                                                      same names and layouts), and back (a Mistral when
                                                      model.sliding_window is set); or -> tf/llama's
                                                      model.ckpt-0 (the same tree, kernels [in, out]), and back

A destination with no extension (or an empty folder) is a Hugging Face directory; one
named *.ckpt or *.ckpt-N a TF checkpoint. Converting from Hugging Face prints the model
keys to set (model.hidden_size=... model.num_heads=...). Converting to Hugging Face takes
the sizes from the weights and the rest of the config (number of heads, epsilon,
activation, dropout) from --params FILE, by default the params_train.yaml the runner wrote
beside the checkpoint, and the special token ids (GPT-2's bos/eos <|endoftext|>, T5's pad, eos
and decoder start, BERT's pad) from the meta.json of its train_input.data_dir, else the zoo's
tokenizers' (common/hf.py token_ids). Refused in one line: a Hugging Face model of another type or a
config the zoo's models do not compute (another activation, relative positions, an untied
GPT-2 head), weights of another size than the config says, a GPT-J-style model (parallel
attention, untied head, rotary positions) to Hugging Face's GPT-2, and PyTorch <-> TF
for any other model (no mapping of names and layouts is defined: a Linear's weight is
(out, in), a Dense kernel (in, out)).

safetensors is read and written by the zoo itself (common/weights_io.py: the format is a
length, a JSON header and the raw little-endian bytes; https://github.com/huggingface/safetensors),
so no package is needed.
"""

from __future__ import annotations

import os
import re
from typing import Any

from common.errors import UserError
from common.io import atomic_open
# the formats' readers and writers, re-exported here where they have always been imported from
from common.weights_io import (  # noqa: F401
    _torch, load_safetensors, save_safetensors, tf_checkpoint, tf_variables,
)

PYTORCH = (".mdl", ".pt", ".pth", ".bin")
SAFETENSORS = (".safetensors",)


def kind_of(path: str, destination: bool = False) -> str:
    """"mdl" (a zoo PyTorch checkpoint), "state_dict", "safetensors", "tf" (a TF checkpoint), "hf" (a
    Hugging Face directory), or raise. A ``destination`` need not exist: a name with no extension (or
    an empty folder) is a Hugging Face directory, *.ckpt or *.ckpt-N a TF checkpoint."""
    from common.hf import is_hf_dir

    if is_hf_dir(path):
        return "hf"
    if destination and os.path.isdir(path) and not os.listdir(path):
        return "hf"
    if os.path.isdir(path) or _tf_prefix(path) or destination and _TF_NAME.search(os.path.basename(path)):
        return "tf"
    ext = os.path.splitext(path)[1].lower()
    if ext in SAFETENSORS:
        return "safetensors"
    if ext in PYTORCH:
        return "mdl" if ext == ".mdl" else "state_dict"
    if destination and not ext and not os.path.exists(path):
        return "hf"
    raise UserError(f"{path}: not a checkpoint the zoo knows (.mdl, .pt/.pth/.bin, .safetensors, a TF "
                    "checkpoint such as model_dir/model.ckpt-4, or a Hugging Face directory with config.json)")


_TF_NAME = re.compile(r"\.ckpt(-\d+)?$")


def _tf_prefix(path: str) -> bool:
    return os.path.isfile(path + ".index") or path.endswith(".index") and os.path.isfile(path)


# --- reading and writing PyTorch weights ----------------------------------------------------

def _load_torch(path: str) -> dict:
    torch = _torch()

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a damaged or foreign file
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{path}: not a readable PyTorch file ({reason})") from None


def read_weights(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The model weights in ``path`` (any PyTorch kind), and what else it says (step, origin)."""
    kind = kind_of(path)
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    if kind == "safetensors":
        return load_safetensors(path)
    torch = _torch()
    state = _load_torch(path)
    if isinstance(state, dict) and "model" in state and "global_step" in state:
        return dict(state["model"]), {"global_step": str(int(state["global_step"]))}
    if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
        return dict(state), {}
    raise UserError(f"{path}: neither a zoo checkpoint (model, optimizer, global_step ...) nor a state_dict "
                    "(names -> tensors)")


def write_weights(weights: dict[str, Any], metadata: dict[str, str], path: str) -> str:
    """Write ``weights`` in the kind ``path``'s extension names; returns a line saying what was written."""
    torch = _torch()

    kind = kind_of(path)
    if kind == "tf":
        raise UserError(f"{path}: a TF checkpoint is written by the model's graph, not converted into: train or "
                        "evaluate the TF model with --checkpoint_path")
    if kind == "safetensors":
        save_safetensors(weights, path, metadata)
        return f"{path}: {len(weights)} tensors (safetensors)"
    if kind == "state_dict":
        with atomic_open(path, "wb") as f:
            torch.save(weights, f)
        return f"{path}: {len(weights)} tensors (a state_dict: model.load_state_dict(torch.load(path)))"
    state = {"model": weights, "optimizer": {}, "lr_scheduler": {}, "global_step": int(metadata.get("global_step", 0))}
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    return (f"{path}: {len(weights)} tensors, a weights-only zoo checkpoint at step {state['global_step']}: "
            "--mode eval or predict with --checkpoint_path read it (training restores an optimizer state too, "
            "which it does not hold)")


# --- the command --------------------------------------------------------------------------

def listing(path: str) -> list[str]:
    kind = kind_of(path)
    if kind == "hf":
        from common import hf

        family, weights, keys = hf.read_hf(path)
        tensors, _ = load_safetensors(os.path.join(path, hf.WEIGHTS))
        count = sum(int(t.numel()) for t in tensors.values())
        lines = [f"{path}: Hugging Face {hf.ARCHITECTURE[family]}, {len(tensors)} tensors, {count:,} values",
                 f"  the zoo's {family}: {hf.key_overrides(family, keys)}"]
        lines += [f"  {name}  {list(t.shape)}  {str(t.dtype).removeprefix('torch.')}" for name, t in tensors.items()]
        return lines
    if kind == "tf":
        prefix = tf_checkpoint(path)
        variables = tf_variables(prefix)
        lines = [f"{prefix}: TF checkpoint, {len(variables)} variables"]
        lines += [f"  {name}  {list(v.shape)}  {v.dtype}" for name, v in variables.items()]
        return lines
    weights, metadata = read_weights(path)
    count = sum(int(t.numel()) for t in weights.values())
    what = {"mdl": "zoo PyTorch checkpoint", "state_dict": "state_dict", "safetensors": "safetensors"}[kind]
    extra = f", step {metadata['global_step']}" if "global_step" in metadata else ""
    lines = [f"{path}: {what}{extra}, {len(weights)} tensors, {count:,} values"]
    lines += [f"  {name}  {list(t.shape)}  {str(t.dtype).removeprefix('torch.')}" for name, t in weights.items()]
    return lines


def convert(src: str, dst: str, params: str | None = None) -> str:
    """Convert ``src`` into ``dst`` (the kinds of ``kind_of``); ``params``: the zoo params file whose
    model keys complete a Hugging Face config (see the module docstring). Returns what was written."""
    source, target = kind_of(src), kind_of(dst, destination=True)
    if os.path.abspath(src) == os.path.abspath(dst):
        raise UserError(f"{dst}: the same file as the source")
    if "hf" in (source, target) or source != target and "tf" in (source, target) and target != "safetensors":
        return _convert_named(src, dst, source, target, params)
    if source == "tf":
        if target == "tf":
            raise UserError("TF to TF: copy the model.ckpt-N files; nothing to convert")
        if target != "safetensors":
            raise UserError(f"{dst}: a TF checkpoint's variables go to .safetensors (by TF's names); a PyTorch "
                            "file would need a mapping of names and layouts (Dense kernel (in, out) vs Linear "
                            "weight (out, in)) that the zoo does not define")
        import numpy as np

        torch = _torch()
        prefix = tf_checkpoint(src)
        arrays = tf_variables(prefix)
        tensors = {name: torch.from_numpy(np.array(value)) for name, value in arrays.items()
                   if getattr(value, "dtype", None) is not None and value.dtype.kind in "fiub"}
        save_safetensors(tensors, dst, {"source": os.path.basename(prefix), "framework": "tf"})
        return f"{dst}: {len(tensors)} variables of {prefix} (safetensors, TF's names and layouts)"
    weights, metadata = read_weights(src)
    return write_weights(weights, metadata, dst)


def _convert_named(src: str, dst: str, source: str, target: str, params: str | None) -> str:
    """BERT, GPT-2 and T5 between PyTorch, TF and Hugging Face, through the zoo's PyTorch names and layout."""
    import numpy as np

    from common import hf

    if source == target:
        raise UserError(f"{dst}: Hugging Face to Hugging Face: copy the folder; nothing to convert")
    keys = None
    if source == "hf":
        family, weights, keys = hf.read_hf(src)
    else:
        try:
            family, weights = hf.read_zoo(src)
        except UserError as e:
            if hf.NEITHER not in str(e) or target == "hf":
                raise
            raise UserError(f"{e}; PyTorch <-> TF of other models: the zoo does not define the mapping of names "
                            "and layouts (a Linear's weight is (out, in), a Dense kernel (in, out))") from None
    if target == "hf":
        params = params or hf.params_beside(src)
        if keys is None:
            keys = hf.keys_for(family, weights, params, src)
        return hf.write_hf(dst, family, weights, keys, params)
    if target == "tf":
        step = re.search(r"-(\d+)$", dst)
        prefix = hf.write_tf_checkpoint(dst, family, weights, int(step.group(1)) if step else 0)
        line = (f"{prefix}: TF checkpoint, {len(weights)} {family} variables by the TF model's names "
                f"(--checkpoint_path reads it)")
    else:
        torch = _torch()
        line = write_weights({n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in weights.items()}, {}, dst)
    return line + (f"; the model: {hf.key_overrides(family, keys)}" if keys is not None else "")

"""Hugging Face model directories (config.json + model.safetensors, as ``save_pretrained`` writes
them) read into and written from the zoo's BERT, GPT-2, T5 and Llama weights, offline, without ``transformers``.

The pivot between every format is a *family* ("bert", "gpt2", "t5" or "llama"), the weights as numpy
arrays in the zoo's PyTorch names and layout (common/bert_names.py, common/gpt2_names.py,
common/t5_names.py, common/llama_names.py), and the zoo's model keys (``hidden_size``, ``num_heads``,
... of the folder's params; T5's are Hugging Face's T5Config names):

- ``read_hf(path)``: a directory of ``BertForPreTraining`` (or another ``model_type: bert``
  model: its BERT weights) or ``GPT2LMHeadModel``; its config.json becomes the zoo keys.
  A config the zoo's models cannot reproduce (another activation, relative positions, an
  untied GPT-2 head, ...) is refused in one line naming the key. ``T5ForConditionalGeneration``
  converts with its head tied to the shared embedding (T5 v1.0's; relu or gated-gelu):
  transformers 5 ties every T5's head, so an untied one (v1.1's) is refused both ways.
  ``LlamaForCausalLM`` and ``MistralForCausalLM`` are pytorch/llama's names and layouts as they
  are; rotary scaling other than Llama 3.1's, biases or another activation are refused.
- ``write_hf(path, family, weights, keys)``: config.json and model.safetensors that
  ``BertForPreTraining.from_pretrained`` / ``GPT2LMHeadModel.from_pretrained`` read. The
  tied output projections (BERT's ``cls.predictions.decoder``, GPT-2's ``lm_head``) are not
  stored, as save_pretrained does not store them. The special token ids (``token_ids``) are
  those of the data the model trained on where its meta.json is there, else the zoo's
  tokenizers' (GPT-2's <|endoftext|> is 0, not the 50256 transformers would assume).
- ``read_zoo(path)``: a zoo checkpoint of either framework, its family told by its names.
- ``write_tf_checkpoint(prefix, family, weights, step)``: a TF checkpoint by the TF models'
  variable names, written by a v1 Saver from variables of those names in a small graph (no
  model code), so that ``--checkpoint_path`` of tf/bert (and tf/gpt2) reads it.
- ``zoo_keys(params_path, family)``: the model keys of a zoo params file, the folder's
  defaults filled in (the number of heads and the epsilon are not in the weights).
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np

from common import bert_names, gpt2_names, llama_names, t5_names
from common.errors import UserError

CONFIG, WEIGHTS = "config.json", "model.safetensors"
FAMILIES = ("bert", "gpt2", "t5", "llama")
ARCHITECTURE = {"bert": "BertForPreTraining", "gpt2": "GPT2LMHeadModel", "t5": "T5ForConditionalGeneration",
                "llama": "LlamaForCausalLM"}
MODEL_TYPES = {"mistral": "llama"}  # another model_type of a family: Mistral is a Llama with a sliding window

# The zoo key <- Hugging Face config key, per family; values copied as they are.
_BERT_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
              "num_heads": "num_attention_heads", "filter_size": "intermediate_size",
              "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
              "layer_norm_epsilon": "layer_norm_eps", "encoder_nonlinearity": "hidden_act",
              "initializer_range": "initializer_range", "dropout_rate": "hidden_dropout_prob",
              "attention_dropout_rate": "attention_probs_dropout_prob"}
_GPT2_KEYS = {"vocab_size": "vocab_size", "hidden_size": "n_embd", "num_hidden_layers": "n_layer",
              "num_heads": "n_head", "filter_size": "n_inner", "max_position_embeddings": "n_positions",
              "layer_norm_epsilon": "layer_norm_epsilon", "nonlinearity": "activation_function",
              "initializer_range": "initializer_range", "embedding_dropout_rate": "embd_pdrop",
              "dropout_rate": "resid_pdrop", "attention_dropout_rate": "attn_pdrop"}
_T5_KEYS = {key: key for key in (  # pytorch/t5's model keys are T5Config's names
    "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
    "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate", "layer_norm_epsilon",
    "feed_forward_proj")}
# pytorch/llama's keys; the rotary and window keys are read and written by _llama_keys_from_config and
# _config_from_keys (Hugging Face keeps the rotary ones in rope_parameters, older configs at the top)
_LLAMA_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
               "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
               "filter_size": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
               "rms_norm_eps": "rms_norm_eps", "initializer_range": "initializer_range",
               "share_embedding_weights": "tie_word_embeddings", "rope_theta": "rope_theta",
               "rope_scaling": "rope_scaling", "sliding_window": "sliding_window"}
KEYS = {"bert": _BERT_KEYS, "gpt2": _GPT2_KEYS, "t5": _T5_KEYS, "llama": _LLAMA_KEYS}
# Activations both sides compute the same way (Hugging Face's "gelu" is the erf form, "gelu_new" the tanh one)
_ACTIVATIONS = {"bert": ("gelu", "relu", "tanh"), "gpt2": ("gelu_new", "gelu", "relu")}
# GPT-2 model keys of the zoo that Hugging Face's GPT2LMHeadModel can only hold at one value
_GPT2_FIXED = {"position_embedding_type": "learned", "use_parallel_attention": False, "share_embedding_weights": True}


def is_hf_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG))


# --- weights: zoo PyTorch layout <-> Hugging Face's ---------------------------------------------

def _hf_to_zoo_name(family: str, name: str) -> tuple[str | None, bool]:
    """(zoo PyTorch name or None to skip, transpose) of a Hugging Face tensor name."""
    if family == "t5":
        return t5_names.hf_name_to_torch(name), False
    if family == "llama":  # Hugging Face's names and layouts are the zoo's
        return (name if llama_names.is_torch_name(name) else None), False
    if family == "bert":
        if name.startswith("cls.predictions.decoder."):  # tied to the word embeddings and cls.predictions.bias
            return None, False
        name = bert_names._torch_name(name)
        return (name if bert_names.is_torch_name(name) else None), False
    name = gpt2_names._torch_name(name)
    if not gpt2_names.is_torch_name(name):
        return None, False  # attn.bias / attn.masked_bias: the causal mask buffers of older versions
    return name, gpt2_names.hf_transposed(name)


def read_hf(path: str) -> tuple[str, dict[str, np.ndarray], dict]:
    """(family, weights in zoo PyTorch names and layout, zoo model keys) of a Hugging Face directory."""
    from common.weights_io import load_safetensors

    config_path, weights_path = os.path.join(path, CONFIG), os.path.join(path, WEIGHTS)
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise UserError(f"{config_path}: not a readable config.json ({e})") from None
    family = MODEL_TYPES.get(config.get("model_type"), config.get("model_type"))
    if family not in FAMILIES:
        arch = ", ".join(config.get("architectures") or []) or "no architecture named"
        raise UserError(f"{config_path}: model_type {config.get('model_type')!r} ({arch}); the zoo converts Hugging "
                        "Face's BERT (model_type bert), GPT-2 (model_type gpt2), T5 (model_type t5) and Llama "
                        "(model_type llama, mistral)")
    keys = _keys_from_config(family, config, config_path)
    if not os.path.isfile(weights_path):
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
        hint = f" (sharded checkpoints such as {others[0]} are not read)" if others else ""
        raise UserError(f"{weights_path}: no such file{hint}; save the model with save_pretrained "
                        "(safetensors, one file)")
    tensors, _ = load_safetensors(weights_path)
    weights = {}
    for name, tensor in tensors.items():
        zoo_name, transpose = _hf_to_zoo_name(family, name)
        if zoo_name is not None:
            array = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
            weights[zoo_name] = np.ascontiguousarray(array.T) if transpose else array
    if not weights:
        raise UserError(f"{weights_path}: holds no {family} weight that the zoo's names cover")
    check_weights(family, weights, keys, weights_path)
    order = _shapes(family, keys)  # the zoo model's state_dict order (safetensors sorts by name)
    return family, {name: weights[name] for name in order if name in weights}, keys


def _keys_from_config(family: str, config: dict, where: str) -> dict:
    if family == "t5":
        return _t5_keys_from_config(config, where)
    if family == "llama":
        return _llama_keys_from_config(config, where)
    keys = {}
    for zoo_key, hf_key in KEYS[family].items():
        if hf_key not in config:
            if family == "gpt2" and hf_key == "n_inner":
                continue  # GPT-2's default: 4 x n_embd, set below
            raise UserError(f"{where}: no {hf_key!r} (a {ARCHITECTURE[family]} config.json has one)")
        keys[zoo_key] = config[hf_key]
    activation = keys.get("encoder_nonlinearity", keys.get("nonlinearity"))
    if activation not in _ACTIVATIONS[family]:
        raise UserError(f"{where}: activation {activation!r}; the zoo's {family} computes "
                        f"{', '.join(_ACTIVATIONS[family])}")
    if family == "bert":
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(f"{where}: position_embedding_type {config['position_embedding_type']!r}; the zoo's "
                            "BERT has absolute (learned) positions only")
        return keys
    if keys.get("filter_size") is None:
        keys["filter_size"] = 4 * keys["hidden_size"]
    refusals = {"tie_word_embeddings": True, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "add_cross_attention": False}
    for key, wanted in refusals.items():
        if config.get(key, wanted) != wanted:
            raise UserError(f"{where}: {key} {config[key]!r}; the zoo's GPT-2 has {key} {wanted!r} only")
    keys.update(_GPT2_FIXED)
    return keys


def _t5_keys_from_config(config: dict, where: str) -> dict:
    config = {"num_decoder_layers": config.get("num_layers"), **config}
    if config["num_decoder_layers"] is None:  # T5Config's default: as many as the encoder
        config["num_decoder_layers"] = config.get("num_layers")
    missing = [k for k in _T5_KEYS.values() if k not in config]
    if missing:
        raise UserError(f"{where}: no {missing[0]!r} (a T5ForConditionalGeneration config.json has one)")
    if config["feed_forward_proj"] not in ("relu", "gated-gelu"):
        raise UserError(f"{where}: feed_forward_proj {config['feed_forward_proj']!r}; the zoo's T5 computes relu "
                        "and gated-gelu")
    if config.get("tie_word_embeddings", True) is not True or config.get("scale_decoder_outputs", True) is not True:
        key = "tie_word_embeddings" if config.get("tie_word_embeddings", True) is not True else "scale_decoder_outputs"
        raise UserError(f"{where}: {key} {config[key]!r} (T5 v1.1's untied head); the zoo converts T5 with the head "
                        "tied to the shared embedding and scaled by d_model^-0.5 only")
    if config.get("is_decoder") or not config.get("is_encoder_decoder", True):
        raise UserError(f"{where}: not an encoder-decoder T5 (is_decoder / is_encoder_decoder); the zoo's T5 has both")
    return {**{k: config[v] for k, v in _T5_KEYS.items()}, **_T5_FIXED}


_T5_FIXED = {"tie_word_embeddings": True}

_LLAMA_ROPE_TYPES = ("default", "llama3")  # what pytorch/llama computes (rope_scaling: null, or llama3's)


def _llama_keys_from_config(config: dict, where: str) -> dict:
    keys = {}
    for zoo_key, hf_key in _LLAMA_KEYS.items():
        if zoo_key in ("rope_theta", "rope_scaling", "sliding_window", "num_kv_heads", "share_embedding_weights",
                       "initializer_range"):
            continue
        if hf_key not in config:
            raise UserError(f"{where}: no {hf_key!r} (a LlamaForCausalLM config.json has one)")
        keys[zoo_key] = config[hf_key]
    keys["num_kv_heads"] = config.get("num_key_value_heads") or keys["num_heads"]
    keys["share_embedding_weights"] = bool(config.get("tie_word_embeddings", False))
    keys["initializer_range"] = float(config.get("initializer_range", 0.02))
    keys["rms_norm_eps"] = float(keys["rms_norm_eps"])
    head_size = keys["hidden_size"] // keys["num_heads"]
    refusals = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": head_size}
    for key, wanted in refusals.items():
        if config.get(key, wanted) not in (wanted, None):
            raise UserError(f"{where}: {key} {config[key]!r}; the zoo's Llama has {key} {wanted!r} only")
    # transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; older configs rope_theta and rope_scaling
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    keys["rope_theta"] = float(rope.pop("rope_theta", config.get("rope_theta", 10000.0)))
    if rope_type not in _LLAMA_ROPE_TYPES:
        raise UserError(f"{where}: rope_type {rope_type!r}; the zoo's Llama computes "
                        f"{', '.join(_LLAMA_ROPE_TYPES)} rotary frequencies")
    keys["rope_scaling"] = {"rope_type": "llama3", **{k: rope[k] for k in llama_names.LLAMA3_KEYS if k in rope}} \
        if rope_type == "llama3" else None
    keys["sliding_window"] = config.get("sliding_window") if config.get("model_type") == "mistral" else None
    return keys


def _config_from_keys(family: str, keys: dict, token_ids: dict) -> dict:
    if family == "llama":
        mistral = keys.get("sliding_window") is not None
        rope = {"rope_type": "default", "rope_theta": float(keys["rope_theta"])}
        if keys.get("rope_scaling"):
            rope = {**keys["rope_scaling"], "rope_theta": float(keys["rope_theta"])}
        config = {"architectures": ["MistralForCausalLM" if mistral else ARCHITECTURE[family]],
                  "model_type": "mistral" if mistral else "llama", "hidden_act": "silu", "attention_bias": False,
                  "mlp_bias": False, "head_dim": keys["hidden_size"] // keys["num_heads"], "rope_parameters": rope,
                  **token_ids}
        config.update({hf_key: keys[zoo_key] for zoo_key, hf_key in _LLAMA_KEYS.items()
                       if zoo_key not in ("rope_theta", "rope_scaling", "sliding_window")})
        config["num_key_value_heads"] = keys["num_kv_heads"] or keys["num_heads"]
        if mistral:
            config["sliding_window"] = keys["sliding_window"]
        return config
    if family == "t5":
        return {"architectures": [ARCHITECTURE[family]], "model_type": family, "is_encoder_decoder": True,
                "tie_word_embeddings": True, **token_ids,
                **{hf_key: keys[zoo_key] for zoo_key, hf_key in _T5_KEYS.items()}}
    config = {"architectures": [ARCHITECTURE[family]], "model_type": family, "tie_word_embeddings": True,
              **token_ids}
    config.update({hf_key: keys[zoo_key] for zoo_key, hf_key in KEYS[family].items()})
    if family == "bert":
        config["position_embedding_type"] = "absolute"
    else:
        config.update({"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                       "reorder_and_upcast_attn": False, "add_cross_attention": False})
    return config


# --- special token ids: what the zoo's data marks text with -----------------------------------

# The ids each family's config names, as the zoo's tokenizers (common/data/text/) give them where
# no data says otherwise. GPT-2's byte-level BPE has one special token, <|endoftext|>, trained in
# first: id 0 (it ends every document and pads the last window; GPT-2 has no BOS of its own and
# starts a text after <|endoftext|>, so bos = eos). T5's span-corruption unigram: <pad> 0, </s> 1,
# the decoder started from <pad>. BERT's WordPiece: [PAD] 0. Without them in config.json,
# transformers falls back to its GPT-2 ids (50256), outside a smaller vocabulary.
DEFAULT_TOKEN_IDS = {"gpt2": {"bos_token_id": 0, "eos_token_id": 0}, "llama": {"bos_token_id": 0, "eos_token_id": 0},
                     "t5": {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},
                     "bert": {"pad_token_id": 0}}
OPENAI_GPT2_VOCAB, OPENAI_END_OF_TEXT = 50257, 50256  # the published GPT-2 BPE's size and its <|endoftext|>
# Hugging Face config key <- the key of the data's meta.json (datasets/prepare_gpt2.py, prepare_seq2seq.py)
_META_TOKEN_IDS = {"gpt2": {"bos_token_id": "eot_id", "eos_token_id": "eot_id"},
                   "llama": {"bos_token_id": "eot_id", "eos_token_id": "eot_id"},  # the same data as gpt2's
                   "t5": {"pad_token_id": "pad_id", "eos_token_id": "eos_id",
                          "decoder_start_token_id": "decoder_start_id"}}


def token_ids(family: str, vocab_size: int, params_path: str | None) -> tuple[dict, str]:
    """(the special token ids for the config, where they come from): the meta.json of the params'
    train_input.data_dir where it is there (the data the model was trained on), else the zoo's
    tokenizer's ids (DEFAULT_TOKEN_IDS); a GPT-2 of the published vocab of 50,257 without its
    data, the published <|endoftext|>, 50256."""
    from common.params import read_params_file

    data_dir = None
    if params_path is not None and family in _META_TOKEN_IDS:
        train_input = read_params_file(params_path)[0].get("train_input")
        data_dir = train_input.get("data_dir") if isinstance(train_input, dict) else None
    meta_path = os.path.join(data_dir, "meta.json") if isinstance(data_dir, str) else None
    if meta_path is not None and os.path.isfile(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            ids = {hf_key: int(meta[key]) for hf_key, key in _META_TOKEN_IDS[family].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{meta_path}: unreadable ({type(e).__name__}: {e}); the special token ids of "
                            f"{params_path}'s data are read from it") from None
        for hf_key, key in _META_TOKEN_IDS[family].items():
            if not 0 <= ids[hf_key] < vocab_size:
                raise UserError(f"{meta_path}: {key} {ids[hf_key]} is outside the model's vocab of {vocab_size:,}: "
                                "not the data this model was trained on")
        return ids, meta_path
    if family == "gpt2" and vocab_size == OPENAI_GPT2_VOCAB:
        return {"bos_token_id": OPENAI_END_OF_TEXT, "eos_token_id": OPENAI_END_OF_TEXT}, \
            "the published GPT-2 vocab's <|endoftext|>"
    return dict(DEFAULT_TOKEN_IDS[family]), "the zoo's tokenizer"


def write_hf(path: str, family: str, weights: dict[str, np.ndarray], keys: dict,
             params_path: str | None = None) -> str:
    """config.json + model.safetensors in the directory ``path`` (made if missing); a line saying what.
    The special token ids come from ``params_path``'s data where it is there (see token_ids)."""
    from common.weights_io import _torch, save_safetensors
    from common.io import atomic_open

    torch = _torch()
    if family == "gpt2":
        for key, wanted in _GPT2_FIXED.items():
            if keys.get(key, wanted) != wanted:
                raise UserError(f"model.{key} {keys[key]!r}: Hugging Face's GPT2LMHeadModel has {wanted!r} only "
                                "(a GPT-J-style model does not convert to it)")
    if family == "t5" and keys.get("tie_word_embeddings", True) is not True:
        raise UserError("model.tie_word_embeddings false: transformers 5 ties every T5's head to the shared "
                        "embedding, so an untied head does not convert to Hugging Face's T5")
    check_weights(family, weights, keys, "the weights")
    ids, ids_from = token_ids(family, int(keys["vocab_size"]), params_path)
    tensors = {}
    for name, array in weights.items():
        transpose = family == "gpt2" and gpt2_names.hf_transposed(name)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(array.T if transpose else array))
    config = _config_from_keys(family, keys, ids)
    architecture = config["architectures"][0]
    os.makedirs(path, exist_ok=True)
    save_safetensors(tensors, os.path.join(path, WEIGHTS), {"format": "pt"})
    with atomic_open(os.path.join(path, CONFIG), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    named = ", ".join(f"{k} {v}" for k, v in ids.items())
    return (f"{path}: {architecture} ({len(tensors)} tensors in {WEIGHTS}, {CONFIG}; {named}, from "
            f"{ids_from}); {architecture}.from_pretrained({path!r}) reads it")


# --- checks: the weights against the model keys --------------------------------------------------

def _shapes(family: str, keys: dict) -> dict[str, tuple]:
    """Every weight's shape (zoo PyTorch layout) of a model with ``keys``."""
    if family == "t5":
        return t5_names.shapes(keys)
    H, F, V, P = keys["hidden_size"], keys["filter_size"], keys["vocab_size"], keys["max_position_embeddings"]
    L = keys["num_hidden_layers"]
    if family == "llama":
        q, kv = H, (keys["num_kv_heads"] or keys["num_heads"]) * (H // keys["num_heads"])  # heads x head size
        rows = {"embed_tokens": (V, H), "q_proj": (q, H), "k_proj": (kv, H), "v_proj": (kv, H), "o_proj": (H, q),
                "gate_proj": (F, H), "up_proj": (F, H), "down_proj": (H, F), "lm_head": (V, H)}
        return {name: next((s for k, s in rows.items() if k in name), (H,))
                for name in llama_names.torch_names(L, tied=bool(keys["share_embedding_weights"]))}
    if family == "bert":
        shapes = {}
        for name in bert_names.torch_names(L, heads=True):
            if name.endswith(("word_embeddings.weight", "predictions.bias")):
                shape = (V, H) if name.endswith(".weight") else (V,)
            elif name.endswith("position_embeddings.weight"):
                shape = (P, H)
            elif name.endswith("token_type_embeddings.weight"):
                shape = (keys["type_vocab_size"], H)
            elif "intermediate.dense" in name:
                shape = (F, H) if name.endswith("weight") else (F,)
            elif re.search(r"layer\.\d+\.output\.dense\.weight$", name):
                shape = (H, F)
            elif "seq_relationship" in name:
                shape = (2, H) if name.endswith("weight") else (2,)
            elif name.endswith("dense.weight") or "self." in name and name.endswith("weight"):
                shape = (H, H)
            else:
                shape = (H,)
            shapes[name] = shape
        return shapes
    shapes = {}
    for name in gpt2_names.torch_names(L, parallel=bool(keys.get("use_parallel_attention")),
                                       tied=keys.get("share_embedding_weights", True)):
        rows = {"wte": (V, H), "wpe": (P, H), "c_attn.weight": (3 * H, H), "c_attn.bias": (3 * H,),
                "attn.c_proj.weight": (H, H), "c_fc.weight": (F, H), "c_fc.bias": (F,),
                "mlp.c_proj.weight": (H, F), "lm_head.weight": (V, H), "lm_head.bias": (V,)}
        shapes[name] = next((s for k, s in rows.items() if k in name), (H,))
    return shapes


def check_weights(family: str, weights: dict[str, np.ndarray], keys: dict, source: str) -> None:
    """One line when ``weights`` are not those of a model with ``keys``: a shape, a missing or extra tensor."""
    if family == "t5":
        return t5_names.check_weights(weights, keys, source)
    if keys["hidden_size"] % keys["num_heads"]:
        raise UserError(f"{source}: hidden size {keys['hidden_size']} is not a multiple of the "
                        f"{keys['num_heads']} heads")
    if family == "llama" and keys["num_heads"] % (keys["num_kv_heads"] or keys["num_heads"]):
        raise UserError(f"{source}: {keys['num_kv_heads']} key/value heads do not divide the {keys['num_heads']} "
                        "heads")
    expected = _shapes(family, keys)
    for name, shape in expected.items():
        if name in weights and tuple(weights[name].shape) != shape:
            got = "x".join(map(str, weights[name].shape))
            raise UserError(f"{source}: {name} is {got}, but a {family} of hidden_size {keys['hidden_size']}, "
                            f"filter_size {keys['filter_size']}, vocab_size {keys['vocab_size']}, "
                            f"max_position_embeddings {keys['max_position_embeddings']} has "
                            f"{'x'.join(map(str, shape))}")
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise UserError(f"{source}: {extra[0]} is not a weight of a {keys['num_hidden_layers']}-layer {family}"
                        + (f" (nor {len(extra) - 1} more)" if len(extra) > 1 else ""))
    required = [n for n in expected if n.startswith(("bert.", "transformer.", "model."))]
    missing = [n for n in required if n not in weights]
    if missing:
        raise UserError(f"{source}: lacks {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                                            else "") + f" of a {keys['num_hidden_layers']}-layer "
                        f"{family}")


# --- the zoo's side -------------------------------------------------------------------------------

def read_zoo(path: str) -> tuple[str, dict[str, np.ndarray]]:
    """(family, weights in zoo PyTorch names and layout) of a zoo checkpoint of either framework."""
    try:
        return "bert", bert_names.read_bert_weights(path)
    except UserError as bert_error:
        if "holds no BERT weight" not in str(bert_error):
            raise
    try:  # before T5 and GPT-2, whose readers take an untied lm_head.weight, a Llama's too
        return "llama", llama_names.read_llama_weights(path)
    except UserError as llama_error:
        if "holds no Llama weight" not in str(llama_error):
            raise
    try:  # before GPT-2, whose names include an untied lm_head.weight as a T5's do
        return "t5", t5_names.read_t5_weights(path)
    except UserError as t5_error:
        if "holds no T5 weight" not in str(t5_error):
            raise
    try:
        return "gpt2", gpt2_names.read_gpt2_weights(path)
    except UserError as gpt2_error:
        if "holds no GPT-2 weight" not in str(gpt2_error):
            raise
    raise UserError(f"{path}: {NEITHER} (the models whose names the zoo maps between frameworks and Hugging Face)")


NEITHER = "holds no BERT, GPT-2, T5 or Llama weight"


def write_tf_checkpoint(prefix: str, family: str, weights: dict[str, np.ndarray], step: int) -> str:
    """The weights under the TF model's names and layout, with a global step, by a v1 Saver."""
    from common.weights_io import _tensorflow

    tf = _tensorflow()
    v1 = tf.compat.v1
    to_tf = {"bert": bert_names.torch_name_to_tf, "gpt2": gpt2_names.torch_name_to_tf,
             "t5": t5_names.torch_name_to_tf, "llama": llama_names.torch_name_to_tf}[family]
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with tf.Graph().as_default():
        feeds = {}
        for name, array in weights.items():
            tf_name, transpose = to_tf(name)
            value = np.ascontiguousarray(array.T if transpose else array)
            # fed at initialisation rather than baked into the graph: a GPT-2 XL's weights pass protobuf's 2 GB
            placeholder = v1.placeholder(tf.as_dtype(value.dtype), value.shape)
            v1.Variable(placeholder, name=tf_name)
            feeds[placeholder] = value
        global_step = v1.train.get_or_create_global_step()
        saver = v1.train.Saver(max_to_keep=None)
        with v1.Session() as session:
            session.run(v1.global_variables_initializer(), feeds)
            session.run(global_step.assign(step))
            written = saver.save(session, prefix, write_meta_graph=False)
    return written


def zoo_keys(params_path: str, family: str) -> dict:
    """The ``model`` section of a zoo params file, with its folder's defaults (pytorch/<family> or
    tf/<family>: the twins share them) filled in where the folder exists."""
    from common import zoo
    from common.params import load_params, read_params_file

    refused = []
    for framework in ("pytorch", "tf"):
        folder = os.path.join(zoo.ROOT, framework, family)
        if os.path.isfile(os.path.join(folder, "utils.py")):
            from common.folder import import_beside

            utils = import_beside(os.path.join(folder, "run.py"), "utils")
            try:
                return dict(load_params(params_path, utils.default_params())["model"])
            except UserError as e:  # the other twin's input key (num_workers / num_parallel_calls): try this one's
                refused.append(e)
    if refused:
        raise refused[0]
    return dict(read_params_file(params_path)[0].get("model") or {})


def params_beside(path: str) -> str | None:
    """The params file the runner wrote into the model_dir of the checkpoint ``path`` (train's first)."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    found = sorted(glob.glob(os.path.join(folder, "params_*.yaml")), key=lambda p: not p.endswith("_train.yaml"))
    return found[0] if found else None


def keys_for(family: str, weights: dict[str, np.ndarray], params_path: str | None, source: str) -> dict:
    """The zoo model keys of ``weights``: sizes from the shapes, the rest (heads, epsilon, activation,
    dropout) from ``params_path``; a size the params name differently from the weights is refused."""
    if params_path is None:
        raise UserError(f"{source}: the number of attention heads is not in the weights: pass --params with the "
                        "params file the model was trained with (a model_dir's params_train.yaml holds it)")
    params = zoo_keys(params_path, family)
    if family == "bert":
        H = weights["bert.embeddings.word_embeddings.weight"].shape[1]
        sizes = {"vocab_size": weights["bert.embeddings.word_embeddings.weight"].shape[0], "hidden_size": H,
                 "max_position_embeddings": weights["bert.embeddings.position_embeddings.weight"].shape[0],
                 "type_vocab_size": weights["bert.embeddings.token_type_embeddings.weight"].shape[0],
                 "filter_size": weights["bert.encoder.layer.0.intermediate.dense.weight"].shape[0],
                 "num_hidden_layers": bert_names._num_layers(weights)}
    elif family == "llama":
        return _llama_keys_for(weights, params, params_path, source)
    elif family == "t5":
        bias = weights["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]  # (buckets, heads)
        sizes = {"vocab_size": weights["shared.weight"].shape[0], "d_model": weights["shared.weight"].shape[1],
                 "d_ff": weights["encoder.block.0.layer.1.DenseReluDense.wo.weight"].shape[1],
                 "num_heads": bias.shape[1], "relative_attention_num_buckets": bias.shape[0],
                 "d_kv": weights["encoder.block.0.layer.0.SelfAttention.q.weight"].shape[0] // bias.shape[1],
                 "num_layers": t5_names.num_layers(weights, "encoder"),
                 "num_decoder_layers": t5_names.num_layers(weights, "decoder"),
                 "feed_forward_proj": "gated-gelu" if "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in weights
                 else "relu"}
    else:
        sizes = {"vocab_size": weights["transformer.wte.weight"].shape[0],
                 "hidden_size": weights["transformer.wte.weight"].shape[1],
                 "max_position_embeddings": weights["transformer.wpe.weight"].shape[0],
                 "filter_size": weights["transformer.h.0.mlp.c_fc.weight"].shape[0],
                 "num_hidden_layers": 1 + max(int(n.split(".")[2]) for n in weights if n.startswith("transformer.h."))}
    keys = {}
    for key in KEYS[family]:
        if key not in params and key not in sizes:
            raise UserError(f"{params_path}: no model.{key}, which the Hugging Face config needs")
        keys[key] = params.get(key, sizes.get(key))
        if key in sizes and key in params and params[key] != sizes[key]:
            raise UserError(f"{source}: {key} is {sizes[key]} in the weights but {params[key]} in {params_path}; "
                            "pass the params of this checkpoint")
        if key in sizes:
            keys[key] = sizes[key] if isinstance(sizes[key], str) else int(sizes[key])  # T5's feed_forward_proj
    if family == "gpt2":
        for key in _GPT2_FIXED:
            keys[key] = params.get(key, _GPT2_FIXED[key])
    if family == "t5":
        keys["tie_word_embeddings"] = "lm_head.weight" not in weights
    return keys


def _llama_keys_for(weights: dict[str, np.ndarray], params: dict, params_path: str, source: str) -> dict:
    """pytorch/llama's keys of ``weights``: the sizes from the shapes, the heads, positions, epsilon,
    rotary and window keys from the params (a number of key/value heads they contradict is refused)."""
    embed = weights["model.embed_tokens.weight"]
    sizes = {"vocab_size": embed.shape[0], "hidden_size": embed.shape[1],
             "filter_size": weights["model.layers.0.mlp.gate_proj.weight"].shape[0],
             "num_hidden_layers": llama_names.num_layers(weights)}
    keys = {}
    for key in _LLAMA_KEYS:
        if key in sizes:
            if key in params and params[key] != sizes[key]:
                raise UserError(f"{source}: {key} is {sizes[key]} in the weights but {params[key]} in {params_path}; "
                                "pass the params of this checkpoint")
            keys[key] = int(sizes[key])
        elif key == "share_embedding_weights":
            keys[key] = "lm_head.weight" not in weights
        elif key not in params:
            raise UserError(f"{params_path}: no model.{key}, which the Hugging Face config needs")
        else:
            keys[key] = params[key]
    head_size = keys["hidden_size"] // keys["num_heads"]
    kv_heads = weights["model.layers.0.self_attn.k_proj.weight"].shape[0] // head_size
    if kv_heads != (keys["num_kv_heads"] or keys["num_heads"]):
        raise UserError(f"{source}: {kv_heads} key/value heads in the weights (k_proj) but num_kv_heads "
                        f"{keys['num_kv_heads']} (num_heads {keys['num_heads']}) in {params_path}; pass the params "
                        "of this checkpoint")
    return keys


def key_overrides(family: str, keys: dict) -> str:
    """The zoo keys as command-line overrides (what to set to build the model of a converted checkpoint)."""
    return " ".join(f"model.{k}={_yaml_scalar(keys[k])}" for k in KEYS[family])


def _yaml_scalar(value) -> str:
    """A value as YAML reads it back: 1e-12 is a string to YAML 1.1, 1.0e-12 a float; None is null,
    a dict JSON without spaces (one word of a command line)."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    text = repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, float) and "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text

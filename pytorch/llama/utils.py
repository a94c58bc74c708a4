"""pytorch/llama's params: its own keys and the common defaults it changes.

The TF Llama (tf/llama/utils.py) has the same keys and the same defaults, but for
the input's num_workers (tf.data's num_parallel_calls there). The model defaults are a
small Llama (4 layers, hidden 128) for the default corpus; configs/ holds the published
sizes (Llama 2 7B, 13B, 70B, Llama 3 8B, Mistral 7B).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed


# A deliberate twin of tf/llama/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(train: bool) -> dict:
    return {
        # the packed examples (datasets/prepare_gpt2.py --tokenizer_json); prepared here from the default corpus if absent
        "data_dir": "./data/llama_msl128",
        "max_sequence_length": 128,
        "batch_size": 16,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "vocab_size": 4096,  # the default corpus's byte-level BPE (tokenizer.json beside the data)
            "hidden_size": 128,
            "num_hidden_layers": 4,
            "num_heads": 4,
            # the key/value heads, each shared by num_heads / num_kv_heads query heads (grouped-query
            # attention, Ainslie et al. 2023); null: num_heads (multi-head attention)
            "num_kv_heads": Typed(None, (int,), range=AT_LEAST_1),
            "filter_size": 384,  # SwiGLU's inner size (Hugging Face's intermediate_size)
            "max_position_embeddings": 128,
            "rms_norm_eps": Typed(1.0e-5, (float,), range=POSITIVE),
            "rope_theta": Typed(10000.0, (float,), range=POSITIVE),  # the rotary base wavelength
            # null, or {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
            # original_max_position_embeddings}: Llama 3.1's rescaling of the rotary frequencies
            "rope_scaling": Typed(None, (dict,)),
            # Mistral: the positions a token attends to, itself included; null: every earlier one
            "sliding_window": Typed(None, (int,), range=AT_LEAST_1),
            "initializer_range": Typed(0.02, (float,), range=POSITIVE),  # std of the weights' normal init
            "share_embedding_weights": False,  # true: the lm head is the token embedding table
        },
        "train_input": _input(train=True),
        "eval_input": _input(train=False),
        # --mode predict: greedy decoding from a prompt file (one prompt per line, UTF-8), tokenized
        # with eval_input.data_dir's tokenizer; completions to model_dir/completions.jsonl. Without
        # a prompt file, predict writes the eval set's next-token argmax and losses.
        "predict_input": {
            "prompt_file": Typed(None, (str,)),
            "max_new_tokens": Typed(32, (int,), range=AT_LEAST_1),
            "batch_size": Typed(8, (int,), range=AT_LEAST_1),
        },
        "optimizer": {
            "optimizer_type": "adamw",
            # linear warm-up over 10 % of the steps, then cosine decay to 0 (gpt2's params.yaml)
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0e-3, "steps": 30},
                {"scheduler": "Cosine", "initial_learning_rate": 1.0e-3, "end_learning_rate": 0.0, "steps": 270},
            ],
            "beta2": 0.95,  # Llama's AdamW betas (0.9, 0.95)
            "epsilon": 1.0e-8,
            "weight_decay": 0.1,  # decoupled (AdamW), none on the RMS norms' weights
            "weight_decay_exclude": ["norm"],
            "max_gradient_norm": 1.0,
        },
        "runconfig": {
            "max_steps": 300,
            "checkpoint_steps": 300,
            "log_steps": 50,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

"""tf/gpt2's params: its own keys and the common defaults it changes.

The PyTorch GPT-2 (pytorch/gpt2/utils.py) has the same keys and the same defaults, but
for the input's num_parallel_calls (DataLoader's num_workers there). The model defaults are GPT-2
small's (Radford et al. 2019; OpenAI's 124M hparams.json: n_vocab 50257, n_ctx 1024,
n_embd 768, n_head 12, n_layer 12).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed

NONLINEARITIES = ("gelu_new", "gelu", "relu")
POSITION_EMBEDDINGS = ("learned", "rotary")


# A deliberate twin of pytorch/gpt2/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(train: bool, batch_size: int) -> dict:
    return {
        # the packed examples (datasets/prepare_gpt2.py); prepared here from the default corpus if absent
        "data_dir": "./data/gpt2_msl1024",
        "max_sequence_length": 1024,
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_parallel_calls": 0,  # of the parse map; 0: tf.data.AUTOTUNE
    }


def default_params() -> dict:
    return {
        "model": {
            "vocab_size": 50257,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_heads": 12,
            "filter_size": 3072,  # the MLP's width (4 x hidden_size in GPT-2)
            "max_position_embeddings": 1024,
            "embedding_dropout_rate": 0.1,
            "dropout_rate": 0.1,  # after each residual branch's output projection
            "attention_dropout_rate": 0.1,
            "layer_norm_epsilon": Typed(1.0e-5, (float,), range=POSITIVE),
            # gelu_new: the tanh approximation, as GPT-2; gelu: the exact (erf) form
            "nonlinearity": Typed("gelu_new", (str,), NONLINEARITIES),
            "initializer_range": Typed(0.02, (float,), range=POSITIVE),  # std of the weights' normal init
            # learned: a table of max_position_embeddings rows (GPT-2); rotary: q and k rotated (GPT-J)
            "position_embedding_type": Typed("learned", (str,), POSITION_EMBEDDINGS),
            "rotary_dim": Typed(None, (int,)),  # rotary only: the rotated dims of each head; null: all of them
            "use_parallel_attention": False,  # GPT-J: x + attn(ln_1(x)) + mlp(ln_1(x))
            "share_embedding_weights": True,  # the lm head is the word embedding table; false: its own, with a bias
        },
        "train_input": _input(train=True, batch_size=512),
        "eval_input": _input(train=False, batch_size=512),
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
            # linear warm-up over 2,000 steps, then cosine decay to 0, as GPT-2/GPT-3-style training
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 2.5e-4, "steps": 2000},
                {"scheduler": "Cosine", "initial_learning_rate": 2.5e-4, "end_learning_rate": 0.0, "steps": 798000},
            ],
            "beta2": 0.999,
            "epsilon": 1.0e-8,
            "weight_decay": 0.01,  # decoupled (AdamW), none on biases and LayerNorm
            "weight_decay_exclude": ["bias", "ln_"],
            "max_gradient_norm": 1.0,
        },
        "runconfig": {
            "max_steps": 800000,
            "checkpoint_steps": 10000,
            "log_steps": 100,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

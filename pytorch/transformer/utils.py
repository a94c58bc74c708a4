"""pytorch/transformer's params: its own keys and the common defaults it changes.

The model defaults are the paper's base model (Vaswani et al. 2017, table 3: d_model 512,
6 + 6 layers, 8 heads, d_ff 2048, P_drop 0.1, label smoothing 0.1; a shared source/target
BPE vocabulary of about 37,000 tokens for WMT 2014 English-German) and its optimizer
(5.3: Adam with beta1 0.9, beta2 0.98, epsilon 1e-9). The TF twin (tf/transformer/utils.py)
has the same keys and defaults, but for the input's num_workers (num_parallel_calls there).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed


def _input(train: bool, batch_size: int) -> dict:
    return {
        # datasets/prepare_seq2seq.py's folder; prepared here (the reversal task of the default corpus) if absent
        "data_dir": "./data/reversal_256",
        "source_length": 256,  # encoder tokens per example (the data's, meta.json)
        "target_length": 256,  # decoder tokens per example
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "vocab_size": 37000,  # one vocabulary for both sides (the data's, meta.json)
            "hidden_size": 512,  # d_model
            "num_heads": 8,
            "filter_size": 2048,  # d_ff: the ReLU feed-forward's width
            "encoder_num_hidden_layers": Typed(6, (int,), range=AT_LEAST_1),
            "decoder_num_hidden_layers": Typed(6, (int,), range=AT_LEAST_1),
            "dropout_rate": 0.1,  # P_drop: on each sublayer's output and on the embedded sums
            "attention_dropout_rate": 0.0,  # on the attention weights (tensor2tensor's transformer_base_v1: 0)
            "relu_dropout_rate": 0.0,  # inside the feed-forward, after the ReLU (tensor2tensor's v1: 0)
            "label_smoothing": 0.1,  # the label gets 1 - 0.1 (+ 0.1 / vocab_size), every other token 0.1 / vocab_size
            "layer_norm_epsilon": Typed(1.0e-6, (float,), range=POSITIVE),  # tensor2tensor's
            "pre_layer_norm": False,  # false: post-LN as the paper; true: pre-LN with a final norm per stack
            "share_embedding_weights": True,  # one table for source, target and output; false: three weights
        },
        "train_input": _input(train=True, batch_size=128),
        "eval_input": _input(train=False, batch_size=128),
        "optimizer": {
            "optimizer_type": "adam",
            # linear warm-up over 4,000 steps (the paper's warmup_steps), then linear decay to 0
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 7.0e-4, "steps": 4000},
                {"scheduler": "Linear", "initial_learning_rate": 7.0e-4, "end_learning_rate": 0.0, "steps": 96000},
            ],
            "beta1": 0.9,
            "beta2": 0.98,
            "epsilon": 1.0e-9,
        },
        "runconfig": {
            "max_steps": 100000,  # the paper's base model
            "checkpoint_steps": 10000,
            "log_steps": 100,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

"""pytorch/t5's params: its own keys and the common defaults it changes.

The TF T5 (tf/t5/utils.py) has the same keys and the same defaults, but for the
input's num_workers (tf.data's num_parallel_calls there). The model keys are Hugging
Face's T5Config names; the defaults are T5 small's (Raffel et al. 2020, section 3.1 and
table 14; Hugging Face's t5-small config: vocab 32,128, d_model 512, 6 + 6 layers, 8 heads
of 64, d_ff 2048, 32 relative position buckets up to a distance of 128), on span
corruption of 512 input tokens (targets up to 114).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed

FEED_FORWARD = ("relu", "gated-gelu")


# A deliberate twin of tf/t5/utils.py (each model folder stands alone when copied).
def _input(train: bool, batch_size: int) -> dict:
    return {
        # datasets/prepare_seq2seq.py --task span_corruption's folder; prepared here from the default corpus if absent
        "data_dir": "./data/t5_span_512",
        "source_length": 512,  # encoder tokens per example (the data's, meta.json)
        "target_length": 114,  # decoder tokens per example: the longest target of 512 corrupted inputs
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "vocab_size": 32128,  # one vocabulary for both sides; the sentinels are its last ids
            "d_model": 512,
            "d_kv": 64,  # each head's size (num_heads x d_kv need not be d_model)
            "d_ff": 2048,
            "num_layers": Typed(6, (int,), range=AT_LEAST_1),  # encoder blocks
            "num_decoder_layers": Typed(6, (int,), range=AT_LEAST_1),
            "num_heads": Typed(8, (int,), range=AT_LEAST_1),
            "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128,
            "dropout_rate": 0.1,  # embeddings, attention weights, inside the feed-forward, each sublayer's output
            "layer_norm_epsilon": Typed(1.0e-6, (float,), range=POSITIVE),
            # relu: T5 v1.0; gated-gelu: T5 v1.1's wo(gelu_tanh(wi_0 x) * wi_1 x)
            "feed_forward_proj": Typed("relu", (str,), FEED_FORWARD),
            "tie_word_embeddings": True,  # the lm head is the shared embedding (output scaled by d_model^-0.5)
        },
        "train_input": _input(train=True, batch_size=128),
        "eval_input": _input(train=False, batch_size=128),
        "optimizer": {
            "optimizer_type": "adam",
            # linear warm-up over 10,000 steps (T5's constant phase), then linear decay to 0
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0e-3, "steps": 10000},
                {"scheduler": "Linear", "initial_learning_rate": 1.0e-3, "end_learning_rate": 0.0, "steps": 514288},
            ],
        },
        "runconfig": {
            "max_steps": 524288,  # T5's 2^19 pretraining steps
            "checkpoint_steps": 10000,
            "log_steps": 100,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

"""tf/bert's params: its own keys and the common defaults it changes.

The same keys and defaults as pytorch/bert (pytorch/bert/utils.py), except that the
input's parallelism is tf.data's ``num_parallel_calls`` where PyTorch has ``num_workers``.
The defaults are BERT-Base's sizes (Devlin et al. 2018, Table 1 and Appendix A.2) and
Google's run_pretraining.py optimizer (AdamW, lr 1e-4, linear warm-up then linear decay,
weight decay 0.01 off LayerNorm and biases, gradients clipped to norm 1.0).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed

TASKS = ("pretraining", "classifier")
NONLINEARITIES = ("gelu", "relu", "tanh")
CLASSIFIER_TASKS = ("corpus_topics", "sst2", "mnli")


# A deliberate twin of pytorch/bert/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(train: bool, batch_size: int) -> dict:
    return {
        # prepared pretraining shards (datasets/prepare_bert.py); prepared here from the default
        # corpus when it holds none. The classifier reads its vocab.txt, and sst2/mnli their TSVs
        "data_dir": "./data/bert_msl128",
        "vocab_file": Typed(None, (str,)),  # None: data_dir/vocab.txt
        "max_sequence_length": 128,
        "max_predictions_per_seq": 20,
        "classifier_task": Typed("corpus_topics", (str,), CLASSIFIER_TASKS),  # model.task classifier only
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_parallel_calls": 0,  # of the parse map; 0: tf.data.AUTOTUNE
    }


def default_params() -> dict:
    return {
        "model": {
            "task": Typed("pretraining", (str,), TASKS),  # pretraining: MLM + NSP heads; classifier: one on [CLS]
            "vocab_size": 30522,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_heads": 12,
            "filter_size": 3072,  # the feed-forward layer's width
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "dropout_rate": 0.1,
            "attention_dropout_rate": 0.1,
            "layer_norm_epsilon": Typed(1.0e-12, (float,), range=POSITIVE),
            "encoder_nonlinearity": Typed("gelu", (str,), NONLINEARITIES),  # gelu: the exact (erf) form
            "initializer_range": Typed(0.02, (float,), range=POSITIVE),  # stddev of the truncated normal init
            "disable_nsp": False,  # pretraining on MLM alone
            "num_classes": Typed(2, (int,), range=AT_LEAST_1),  # classifier only
            # classifier: a pretraining checkpoint of either framework to start the encoder from
            "pretrained_checkpoint": Typed(None, (str,)),
        },
        "train_input": _input(train=True, batch_size=256),
        "eval_input": _input(train=False, batch_size=256),
        "optimizer": {
            "optimizer_type": "adamw",
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0e-4, "steps": 10000},
                {"scheduler": "Linear", "initial_learning_rate": 1.0e-4, "end_learning_rate": 0.0, "steps": 990000},
            ],
            "beta2": 0.999,
            "epsilon": 1.0e-6,
            "weight_decay": 0.01,
            "weight_decay_exclude": ["bias", "LayerNorm"],
            "max_gradient_norm": 1.0,
        },
        "runconfig": {
            "max_steps": 1000000,
            "checkpoint_steps": 10000,
            "log_steps": 100,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

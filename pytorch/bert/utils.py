"""pytorch/bert's params: its own keys and the common defaults it changes.

The TF BERT (tf/bert/utils.py) has the same keys and the same defaults, but for the
input's num_workers (tf.data's num_parallel_calls there). The model defaults are
BERT-Base's (Devlin et al. 2018, Google's bert_config.json of uncased_L-12_H-768_A-12).
"""

from common.params import AT_LEAST_1, POSITIVE, Typed

TASKS = ("pretraining", "classifier")
CLASSIFIER_TASKS = ("corpus_topics", "sst2", "mnli")
NONLINEARITIES = ("gelu", "relu", "tanh")


# A deliberate twin of tf/bert/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(train: bool, batch_size: int) -> dict:
    return {
        # the prepared examples (datasets/prepare_bert.py); prepared here from the default corpus if absent
        "data_dir": "./data/bert_msl128",
        "vocab_file": Typed(None, (str,)),  # None: data_dir/vocab.txt
        "max_sequence_length": 128,
        "max_predictions_per_seq": 20,
        "classifier_task": Typed("corpus_topics", (str,), CLASSIFIER_TASKS),  # model.task classifier only
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "task": Typed("pretraining", (str,), TASKS),  # pretraining: MLM + NSP heads; classifier: fine-tuning
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
            "encoder_nonlinearity": Typed("gelu", (str,), NONLINEARITIES),  # gelu: the exact (erf) form, as Google's BERT
            "initializer_range": Typed(0.02, (float,), range=POSITIVE),  # std of the weights' normal init
            "disable_nsp": False,  # pretraining without the next-sentence head and loss
            "num_classes": Typed(2, (int,), range=AT_LEAST_1),  # classifier only
            # classifier: a pretraining checkpoint of either framework (a .mdl or a TF checkpoint prefix)
            "pretrained_checkpoint": Typed(None, (str,)),
        },
        "train_input": _input(train=True, batch_size=256),
        "eval_input": _input(train=False, batch_size=256),
        "optimizer": {
            "optimizer_type": "adamw",
            # linear warm-up over 10,000 steps, then linear decay to 0 at 1 M steps, as Google's run_pretraining
            "learning_rate": [
                {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0e-4, "steps": 10000},
                {"scheduler": "Linear", "initial_learning_rate": 1.0e-4, "end_learning_rate": 0.0, "steps": 990000},
            ],
            "beta2": 0.999,
            "epsilon": 1.0e-6,
            "weight_decay": 0.01,  # decoupled (AdamW), none on biases and LayerNorm
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

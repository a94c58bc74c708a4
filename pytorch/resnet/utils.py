"""pytorch/resnet's params: its own keys and the common defaults it changes.

The TF resnet (tf/resnet/utils.py) has the same keys and the same defaults, but for the
input's num_workers (tf.data's num_parallel_calls there).
"""

from common.params import AT_LEAST_0, AT_LEAST_1, POSITIVE, UNIT_OPEN, Typed

BLOCKS = ("basic", "bottleneck")
STEMS = ("cifar", "imagenet")
DATASETS = ("digits", "cifar10", "imagefolder")


# A deliberate twin of tf/resnet/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(train: bool, batch_size: int) -> dict:
    keys = {
        # cifar10: holds cifar-10-batches-py/ (or -bin/); imagefolder: train/ and val/ class-per-folder trees
        "data_dir": "./data/cifar10",
        "dataset": Typed("digits", (str,), DATASETS),  # digits: the embedded digits, no download
        "batch_size": batch_size,
        "shuffle": train,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }
    if train:  # augmentation: the train split only
        keys["random_crop_padding"] = Typed(2, (int,), range=AT_LEAST_0)  # pad by this many pixels, crop back; 0: off
        keys["random_flip"] = False  # horizontal flips (off for digits, which a flip does not preserve)
    return keys


def default_params() -> dict:
    return {
        "model": {
            "block": Typed("basic", (str,), BLOCKS),  # basic: two 3x3 convs; bottleneck: 1x1, 3x3, 1x1 (x4)
            "stage_blocks": Typed([1, 1, 1], (list,), range=AT_LEAST_1),  # blocks per stage; a stage after the first halves H and W
            "stage_widths": Typed([16, 32, 64], (list,), range=AT_LEAST_1),  # channels of each stage's 3x3 convs
            "stem": Typed("cifar", (str,), STEMS),  # cifar: 3x3 conv; imagenet: 7x7/2 conv + 3x3/2 max pool
            "stem_width": 16,
            "image_size": 16,  # H = W of the input
            "num_channels": 3,
            "num_classes": 10,
            "batch_norm_decay": Typed(0.9, (float,), range=UNIT_OPEN),  # running = decay * running + (1 - decay) * batch
            "batch_norm_epsilon": Typed(1.0e-5, (float,), range=POSITIVE),
        },
        "train_input": _input(train=True, batch_size=64),
        # 40 divides the 360 embedded test digits and CIFAR-10's 10,000: drop_last drops none
        "eval_input": _input(train=False, batch_size=40),
        # decaying to 0 by the last step, the net settles: the end's figures hold on any CPU
        "optimizer": {"optimizer_type": "momentum", "momentum": 0.9, "weight_decay": 0.0005,
                      "learning_rate": {"scheduler": "Cosine", "initial_learning_rate": 0.05, "alpha": 0.0,
                                        "steps": 300}},
        "runconfig": {
            "max_steps": 300,
            "checkpoint_steps": 150,
            "log_steps": 10,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

"""pytorch/unet's params: its own keys and the common defaults it changes.

The TF unet (tf/unet/utils.py) has the same keys and the same defaults, but for the
input's num_workers (tf.data's num_parallel_calls there).
"""

from common.data.segmentation import DATASETS
from common.params import Typed

UPSAMPLING = ("transposed", "bilinear", "nearest")


# A deliberate twin of tf/unet/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(shuffle: bool, batch_size: int) -> dict:
    return {
        "data_dir": "./data/unet",  # dataset folder: split/images + split/masks; severstal: train.csv + train_images
        "dataset": Typed("digits", (str,), DATASETS),  # digits: canvases of embedded digits, no download
        "digits_per_image": 3,  # dataset digits: digits per canvas
        "digit_size": 8,  # dataset digits: a digit's side in pixels
        "batch_size": batch_size,
        "shuffle": shuffle,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "image_size": [32, 32],  # [height, width] of the input
            "input_channels": 1,
            "num_classes": 11,  # 2: binary, one logit and BCE-with-logits; more: one logit each, cross-entropy
            "filters": [16, 32, 64],  # channels per level, top to bottom; the last is the bottleneck
            "upsampling": Typed("transposed", (str,), UPSAMPLING),  # transposed conv, or an upsample then a conv
        },
        "train_input": _input(shuffle=True, batch_size=16),
        # 40 divides the 120 test canvases of the embedded digits: drop_last drops none
        "eval_input": _input(shuffle=False, batch_size=40),
        "optimizer": {"optimizer_type": "adam", "learning_rate": 0.002},
        "runconfig": {
            "max_steps": 400,
            "checkpoint_steps": 200,
            "log_steps": 50,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }

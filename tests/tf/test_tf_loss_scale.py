"""Dynamic loss scaling across a resume, through tf/mnist's run.py: the scale and the count
of finite steps towards its next doubling (the loss_scale and loss_scale_good_steps
variables, the emulator's good steps) come back from the checkpoint, on the CPU and on the
emulator."""

import pytest
import tensorflow as tf

from common.summaries import read_scalars

# the scale doubles after every 2 finite steps: 8 -> 16 at step 2 -> 32 at step 4; a resume
# at step 3 lands between two doublings, with one finite step counted
DYNAMIC = ("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic", "optimizer.initial_loss_scale=8.0",
           "optimizer.steps_per_increase=2", "runconfig.checkpoint_steps=1", "runconfig.keep_checkpoint_max=5",
           "runconfig.log_steps=1")


def _scale(model_dir, step):
    reader = tf.train.load_checkpoint(str(model_dir / f"model.ckpt-{step}"))
    dtypes = reader.get_variable_to_dtype_map()
    assert (dtypes["loss_scale"], dtypes["loss_scale_good_steps"]) == (tf.float32, tf.int64)
    return float(reader.get_tensor("loss_scale")), int(reader.get_tensor("loss_scale_good_steps"))


@pytest.mark.parametrize("device", [["mixed_precision.dtype=bfloat16"],
                                    ["--device", "emulator", "mixed_precision.dtype=float16"]],
                         ids=["cpu", "emulator"])
def test_a_resumed_run_continues_the_dynamic_loss_scale(tf_mnist, tiny_args, tmp_path, device):
    once, twice = tmp_path / "once", tmp_path / "twice"
    tf_mnist.main(tiny_args(*DYNAMIC, "runconfig.max_steps=4", *device, model_dir=once))
    tf_mnist.main(tiny_args(*DYNAMIC, "runconfig.max_steps=3", *device, model_dir=twice))
    assert _scale(twice, 3) == (16.0, 1)
    tf_mnist.main(tiny_args(*DYNAMIC, "runconfig.max_steps=4", *device, model_dir=twice))
    assert _scale(once, 4) == _scale(twice, 4) == (32.0, 0)
    scales = {d: [v for _, v in read_scalars(str(d / "train"))["loss_scale"]] for d in (once, twice)}
    assert scales[twice] == scales[once]  # the resumed run's log continues the one of steps 1-3

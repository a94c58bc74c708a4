"""tf/unet: the network, its metrics against the PyTorch side's, training on the CPU and the emulator, bad input."""

import os

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.data.segmentation import write_fake_image_mask_folder, write_fake_severstal
from common.folder import import_beside, load_run_module
from common.params import load_params, thaw
from common.summaries import read_scalars
from tests.tiny_runs import tiny_runner

UNET = os.path.join(zoo.ROOT, "tf", "unet")
CONFIGS = os.path.join(UNET, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(UNET, "run.py"), "model", "data", "utils")


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def test_params_yaml_spells_out_the_defaults():
    assert thaw(params_of(os.path.join(CONFIGS, "params.yaml"))) == thaw(load_params(None, utils.default_params()))


@pytest.mark.parametrize("upsampling", ["transposed", "bilinear", "nearest"])
@pytest.mark.parametrize("num_classes, channels", [(2, 1), (11, 11)])
def test_the_network_keeps_the_image_size_and_gives_a_logit_per_class(upsampling, num_classes, channels):
    params = params_of(TINY, f"model.upsampling={upsampling}", f"model.num_classes={num_classes}",
                       "model.filters=[4, 8, 16]")
    with tf.Graph().as_default():
        logits = model.unet(tf.zeros([2, 16, 24, 1]), params)
        kinds = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    assert logits.shape == (2, 16, 24, channels)
    assert ("Conv2DBackpropInput" in kinds) == (upsampling == "transposed")


def test_full_size_config_is_the_ronneberger_unet():
    params = params_of(os.path.join(CONFIGS, "unet_512.yaml"))
    with tf.Graph().as_default():
        model.unet(tf.zeros([1, 512, 512, 1]), params)
        count = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
    assert count == 31_030_593  # as pytorch/unet's: the same network


def test_metrics_agree_with_the_vendor_classes():
    """Dice and mean IoU from the streaming confusion matrix, against common/pytorch/metrics.py's
    numpy formulas (classes absent from labels and predictions do not count)."""
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, 4, (2, 5, 5)) for _ in range(3)]
    predictions = [np.where(rng.uniform(size=(2, 5, 5)) < 0.6, y, rng.integers(0, 3, (2, 5, 5))) for y in labels]
    matrix = np.zeros((5, 5))
    for y, p in zip(labels, predictions):
        np.add.at(matrix, (y.ravel(), p.ravel()), 1)
    tp = np.diag(matrix)
    present = (matrix.sum(0) + matrix.sum(1)) > 0
    sums = (matrix.sum(0) + matrix.sum(1))[present]
    dice = np.mean(2 * tp[present] / sums)
    iou = np.mean(tp[present] / (sums - tp[present]))
    with tf.Graph().as_default():
        y, p = tf.compat.v1.placeholder(tf.int32, [2, 5, 5]), tf.compat.v1.placeholder(tf.int32, [2, 5, 5])
        metrics = model.eval_metrics(y, p, 5)  # class 4 never appears
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            for a, b in zip(labels, predictions):
                session.run([m[1] for m in metrics.values()], {y: a, p: b})
            got = session.run({k: m[0] for k, m in metrics.items()})
    assert got["dice_coefficient"] == pytest.approx(dice, rel=1e-5)
    assert got["mean_iou"] == pytest.approx(iou, rel=1e-5)


def test_data_batches_are_scaled_images_and_class_ids():
    images, masks = next(iter(data.eval_input_fn(params_of())))
    assert images.shape == (40, 32, 32, 1) and images.dtype == tf.float32
    assert 0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1
    assert masks.shape == (40, 32, 32) and masks.dtype == tf.int32 and int(tf.reduce_max(masks)) <= 10


train_tiny = tiny_runner(UNET, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path):
    train_tiny(tmp_path, "--mode", "train")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
    metrics = train_tiny(tmp_path, "--mode", "eval")
    assert set(metrics) >= {"dice_coefficient", "mean_iou", "loss"}
    assert 0 < metrics["mean_iou"] <= metrics["dice_coefficient"] <= 1
    train_tiny(tmp_path, "--mode", "predict")
    assert np.load(tmp_path / "predictions.npz")["classes"].shape == (120, 32, 32)


def test_binary_image_folder_trains_with_bce(tmp_path):
    write_fake_image_mask_folder(str(tmp_path / "data"), "train", 8, (16, 16), ".tif")
    write_fake_image_mask_folder(str(tmp_path / "data"), "test", 4, (16, 16), ".png", seed=1)
    overrides = [f"{s}.{k}" for s in ("train_input", "eval_input")
                 for k in ("dataset=folder", f"data_dir={tmp_path / 'data'}", "batch_size=4")]
    metrics = train_tiny(tmp_path / "model", "--mode", "train_and_eval", "model.num_classes=2",
                         "model.image_size=[16, 16]", "model.upsampling=nearest", *overrides)
    assert 0 < metrics["mean_iou"] <= metrics["dice_coefficient"] <= 1


def test_tiny_trains_and_evaluates_on_the_emulator_as_on_the_cpu(tmp_path):
    train_tiny(tmp_path / "cpu", "--mode", "train", "runconfig.max_steps=3")
    train_tiny(tmp_path / "emulator", "--mode", "train", "--device", "emulator", "runconfig.max_steps=3")
    cpu = [v for _, v in read_scalars(str(tmp_path / "cpu" / "train"))["loss"]]
    emulated = [v for _, v in read_scalars(str(tmp_path / "emulator" / "train"))["loss"]]
    assert emulated == pytest.approx(cpu, rel=1e-4) and emulated[-1] < emulated[0]
    on_cpu = train_tiny(tmp_path / "cpu", "--mode", "eval")
    on_emulator = train_tiny(tmp_path / "emulator", "--mode", "eval", "--device", "emulator")
    for key in ("loss", "dice_coefficient", "mean_iou"):
        assert on_emulator[key] == pytest.approx(on_cpu[key], rel=1e-4), key


def test_full_size_config_validates_with_the_digits_standing_in(tmp_path, capsys):
    load_run_module(UNET).main(["--params", os.path.join(CONFIGS, "unet_512.yaml"), "--validate_only",
                                "--model_dir", str(tmp_path), "train_input.dataset=digits",
                                "train_input.digits_per_image=48"])
    captured = capsys.readouterr()
    assert "validation passed" in captured.out + captured.err


# --- bad input: one line naming the file, a non-zero exit, no traceback -----------------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(UNET).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0]


def folder_argv(tmp_path, root, dataset="folder"):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train",
            f"train_input.dataset={dataset}", f"train_input.data_dir={root}", "model.image_size=[16, 16]",
            "model.num_classes=2", "train_input.batch_size=2"]


def test_an_unreadable_image(tmp_path, capsys):
    write_fake_image_mask_folder(str(tmp_path / "data"), "train", 3, (16, 16), ".tif")
    (tmp_path / "data" / "train" / "images" / "000.tif").write_bytes(b"II*\x00 truncated tiff")
    expect_one_error_line(capsys, folder_argv(tmp_path, tmp_path / "data"), "000.tif", "not a readable image")
    assert not (tmp_path / "model" / "checkpoint").exists()


def test_a_mask_of_another_size(tmp_path, capsys):
    from PIL import Image

    write_fake_image_mask_folder(str(tmp_path / "data"), "train", 3, (16, 16))
    Image.fromarray(np.zeros((8, 16), np.uint8)).save(tmp_path / "data" / "train" / "masks" / "002.png")
    expect_one_error_line(capsys, folder_argv(tmp_path, tmp_path / "data"), "masks/002.png", "the mask is 8x16")


def test_a_bad_run_length_in_the_csv(tmp_path, capsys):
    write_fake_severstal(str(tmp_path / "data"), 5, (16, 16))
    csv = tmp_path / "data" / "train.csv"
    lines = csv.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 1)[0] + ",1 two"
    csv.write_text("\n".join(lines) + "\n")
    expect_one_error_line(capsys, folder_argv(tmp_path, tmp_path / "data", "severstal"), "train.csv:3",
                          "holds 'two', not a whole number")

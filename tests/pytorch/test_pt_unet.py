"""pytorch/unet: the network, its loaders on generated files, training on the CPU and the emulator, bad input."""

import os

import numpy as np
import pytest
import torch

from common import zoo
from common.data.segmentation import write_fake_image_mask_folder, write_fake_severstal
from common.folder import import_beside, load_run_module
from common.params import load_params, thaw
from common.summaries import read_scalars
from tests.tiny_runs import tiny_runner

UNET = os.path.join(zoo.ROOT, "pytorch", "unet")
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
    net = model.UNet(1, num_classes, [4, 8, 16], upsampling)
    assert net(torch.randn(2, 1, 16, 24)).shape == (2, channels, 16, 24)
    ups = [type(m).__name__ for m in net.up.modules()]
    transposed = upsampling == "transposed"
    assert ("ConvTranspose2d" in ups) == transposed and ("Upsample" in ups) != transposed


def test_the_skip_feeds_the_decoder_the_encoders_map():
    # the fuse conv reads [upsampled, skip]: zeroing its weights on the skip's channels changes the logits
    torch.manual_seed(0)
    net = model.UNet(1, 2, [4, 8], "transposed")
    x = torch.randn(1, 1, 8, 8)
    before = net(x)
    with torch.no_grad():
        net.fuse[0][0].weight[:, 4:] = 0
    assert not torch.allclose(before, net(x))


def test_full_size_config_is_the_ronneberger_unet():
    p = params_of(os.path.join(CONFIGS, "unet_512.yaml"))["model"]
    net = model.UNet(p["input_channels"], p["num_classes"], p["filters"], p["upsampling"])
    assert sum(w.numel() for w in net.parameters()) == 31_030_593  # the paper's 31 M, one input channel, one logit
    assert tuple(p["image_size"]) == (512, 512)


def test_data_batches_are_scaled_images_and_class_ids():
    images, masks = next(iter(data.get_eval_dataloader(params_of())))
    assert images.shape == (40, 1, 32, 32) and images.dtype == torch.float32
    assert 0 <= images.min() and images.max() <= 1
    assert masks.shape == (40, 32, 32) and masks.dtype == torch.int64 and masks.max() <= 10


@pytest.mark.parametrize("extension", [".png", ".tif"])
def test_image_mask_folder_through_the_loader(tmp_path, extension):
    write_fake_image_mask_folder(str(tmp_path), "train", 4, (16, 16), extension)
    params = params_of(TINY, "train_input.dataset=folder", f"train_input.data_dir={tmp_path}",
                       "model.image_size=[16, 16]", "model.num_classes=2", "train_input.batch_size=2")
    images, masks = next(iter(data.get_train_dataloader(params)))
    assert images.shape == (2, 1, 16, 16) and set(masks.unique().tolist()) <= {0, 1}


train_tiny = tiny_runner(UNET, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path):
    train_tiny(tmp_path, "--mode", "train")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
    metrics = train_tiny(tmp_path, "--mode", "eval")
    assert set(metrics) >= {"dice_coefficient", "mean_iou", "loss"}
    assert 0 < metrics["mean_iou"] <= metrics["dice_coefficient"] <= 1  # Dice >= IoU, class by class
    train_tiny(tmp_path, "--mode", "predict")
    assert np.load(tmp_path / "predictions.npz")["logits"].shape == (120, 11, 32, 32)


def test_binary_severstal_trains_with_bce(tmp_path):
    write_fake_severstal(str(tmp_path / "data"), 20, (16, 32))
    overrides = [f"{s}.{k}" for s in ("train_input", "eval_input")
                 for k in ("dataset=severstal", f"data_dir={tmp_path / 'data'}", "batch_size=4")]
    metrics = train_tiny(tmp_path / "model", "--mode", "train_and_eval", "model.num_classes=2",
                         "model.image_size=[16, 32]", "model.upsampling=bilinear", *overrides)
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


def test_bilinear_upsampling_on_the_emulator(tmp_path):
    train_tiny(tmp_path, "--mode", "train", "--device", "emulator", "runconfig.max_steps=2",
               "model.upsampling=bilinear", "model.num_classes=2")
    assert len(read_scalars(str(tmp_path / "train"))["loss"]) == 2


def test_full_size_config_compiles_with_the_digits_standing_in(tmp_path, capsys):
    # the README's command validates the full graph; compile (its estimate) is in the README's table
    load_run_module(UNET).main(["--params", os.path.join(CONFIGS, "unet_512.yaml"), "--validate_only",
                                "--model_dir", str(tmp_path), "train_input.dataset=digits",
                                "train_input.digits_per_image=48"])
    assert "validation passed" in capsys.readouterr().out


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


def folder_argv(tmp_path, root):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train",
            "train_input.dataset=folder", f"train_input.data_dir={root}", "model.image_size=[16, 16]",
            "model.num_classes=2", "train_input.batch_size=2"]


def test_an_unreadable_image(tmp_path, capsys):
    write_fake_image_mask_folder(str(tmp_path / "data"), "train", 3, (16, 16))
    (tmp_path / "data" / "train" / "images" / "002.png").write_bytes(b"\x89PNG truncated")
    expect_one_error_line(capsys, folder_argv(tmp_path, tmp_path / "data"), "002.png", "not a readable image")
    assert not (tmp_path / "model" / "checkpoint_4.mdl").exists()


def test_a_mask_of_another_size(tmp_path, capsys):
    from PIL import Image

    write_fake_image_mask_folder(str(tmp_path / "data"), "train", 3, (16, 16))
    Image.fromarray(np.zeros((16, 8), np.uint8)).save(tmp_path / "data" / "train" / "masks" / "001.png")
    expect_one_error_line(capsys, folder_argv(tmp_path, tmp_path / "data"), "masks/001.png", "the mask is 16x8")


def test_a_bad_run_length_in_the_csv(tmp_path, capsys):
    write_fake_severstal(str(tmp_path / "data"), 5, (16, 16))
    csv = tmp_path / "data" / "train.csv"
    lines = csv.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",3 4 5"
    csv.write_text("\n".join(lines) + "\n")
    argv = folder_argv(tmp_path, tmp_path / "data")
    argv[argv.index("train_input.dataset=folder")] = "train_input.dataset=severstal"
    expect_one_error_line(capsys, argv, "train.csv:4", "EncodedPixels has 3 numbers")


def test_an_image_size_the_pools_cannot_halve(tmp_path, capsys):
    expect_one_error_line(capsys, ["--params", TINY, "--model_dir", str(tmp_path), "model.image_size=[32, 30]",
                                  "model.filters=[4, 8, 16]"], "model.image_size [32, 30]", "divide by 2^2")

"""pytorch/resnet: the network against torchvision's, its loaders on generated files, and bad input."""

import os
import pickle

import numpy as np
import pytest
import torch
import torchvision

from common import zoo
from common.data.images import write_bmp, write_fake_cifar10, write_fake_image_folder
from common.folder import import_beside, load_run_module
from common.params import load_params, thaw
from common.summaries import read_scalars
from tests.tiny_runs import tiny_runner

RESNET = os.path.join(zoo.ROOT, "pytorch", "resnet")
CONFIGS = os.path.join(RESNET, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(RESNET, "run.py"), "model", "data", "utils")


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def test_params_yaml_spells_out_the_defaults():
    assert thaw(params_of(os.path.join(CONFIGS, "params.yaml"))) == thaw(load_params(None, utils.default_params()))


@pytest.mark.parametrize("config, reference", [("resnet18_cifar.yaml", None), ("resnet50_imagenet.yaml", "resnet50")])
def test_full_size_networks_have_the_reference_weights(config, reference):
    net = model.ResNet(params_of(os.path.join(CONFIGS, config))["model"])
    count = sum(p.numel() for p in net.parameters())
    if reference:  # torchvision's ResNet-50, an independent build of the same network
        expected = sum(p.numel() for p in getattr(torchvision.models, reference)(num_classes=1000).parameters())
        assert count == expected == 25_557_032
    else:  # the CIFAR ResNet-18 (3x3 stem, no max pool): torchvision's resnet18 less its 7x7 stem, plus a 3x3 one
        tv = torchvision.models.resnet18(num_classes=10)
        expected = sum(p.numel() for p in tv.parameters()) - 64 * 3 * 7 * 7 + 64 * 3 * 3 * 3
        assert count == expected == 11_173_962
    images = torch.randn(2, 3, 32, 32) if reference is None else torch.randn(1, 3, 224, 224)
    net.eval()
    assert net(images).shape == (images.shape[0], 10 if reference is None else 1000)


def test_bottleneck_blocks_expand_by_four_and_halve_the_map():
    p = params_of(TINY, "model.block=bottleneck")["model"]
    net = model.ResNet(p)
    assert [type(b).__name__ for b in net.blocks] == ["Bottleneck"] * 3
    assert net.fc.in_features == 4 * p["stage_widths"][-1]
    x = net.stem(torch.randn(2, 3, 16, 16))
    shapes = []
    for block in net.blocks:
        x = block(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes == [(32, 16, 16), (64, 8, 8), (128, 4, 4)]  # batch-norm maps never below 4x4


def test_augmentation_crops_a_window_of_the_padded_image_and_flips():
    torch.manual_seed(0)
    images = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6) + 1
    out = data.augment(images, padding=2, flip=True)
    assert out.shape == images.shape
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for i in range(2):
        windows = [padded[i, :, y:y + 6, x:x + 6] for y in range(5) for x in range(5)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)
    assert torch.equal(data.augment(images, padding=0, flip=False), images)


def test_eval_data_is_never_augmented():
    params = params_of(TINY, "train_input.random_flip=true", "train_input.random_crop_padding=4")
    loader = data.get_eval_dataloader(params)
    assert loader.dataset.padding == 0 and loader.dataset.flip is False
    first = next(iter(loader))[0]
    assert torch.equal(first, next(iter(loader))[0])  # the same images each time
    assert data.get_train_dataloader(params).dataset.padding == 4


def test_digits_are_16x16x3_normalised(tmp_path):
    images, labels = next(iter(data.get_train_dataloader(params_of())))
    assert images.shape == (32, 3, 16, 16) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert torch.equal(images[:, 0], images[:, 2])  # grey, copied to each channel
    assert -1 < images.mean() < 1


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_cifar10_in_both_formats(tmp_path, kind):
    write_fake_cifar10(tmp_path, per_batch=20, kind=kind)
    params = params_of(os.path.join(CONFIGS, "resnet18_cifar.yaml"), f"train_input.data_dir={tmp_path}",
                       f"eval_input.data_dir={tmp_path}", "train_input.batch_size=8", "eval_input.batch_size=10")
    train, evaluation = data.get_train_dataloader(params), data.get_eval_dataloader(params)
    assert len(train.dataset) == 100 and len(evaluation.dataset) == 20
    images, labels = next(iter(evaluation))
    assert images.shape == (10, 3, 32, 32) and labels.max() <= 9
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") if kind == "python" else \
            open(tmp_path / "cifar-10-batches-bin" / "test_batch.bin", "rb") as f:
        raw = pickle.load(f, encoding="latin1")["labels"][:10] if kind == "python" else \
            list(np.frombuffer(f.read(), np.uint8).reshape(20, -1)[:10, 0])
    assert labels.tolist() == [int(v) for v in raw]  # eval keeps the file's order


def test_python_cifar10_goes_through_torchvision(tmp_path):
    write_fake_cifar10(tmp_path, per_batch=4, kind="python")
    cifar = data.LocalCIFAR10(str(tmp_path), train=False, download=False)
    assert isinstance(cifar, torchvision.datasets.CIFAR10) and cifar.data.shape == (4, 32, 32, 3)


def test_image_folder_through_torchvision(tmp_path):
    for split in ("train", "val"):
        write_fake_image_folder(tmp_path / split, classes=12, per_class=2, size=20, seed=split == "val")
    params = params_of(TINY, "train_input.dataset=imagefolder", "eval_input.dataset=imagefolder",
                       f"train_input.data_dir={tmp_path}", f"eval_input.data_dir={tmp_path}",
                       "model.num_classes=12", "train_input.batch_size=6", "eval_input.batch_size=6")
    loader = data.get_eval_dataloader(params)
    assert loader.dataset.classes == sorted(f"class_{k}" for k in range(12))  # class_10 before class_2
    images, labels = next(iter(loader))
    assert images.shape == (6, 3, 16, 16) and labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert next(iter(data.get_train_dataloader(params)))[0].shape == (6, 3, 16, 16)


train_tiny = tiny_runner(RESNET, TINY)


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path):
    train_tiny(tmp_path, "--mode", "train")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 8 and losses[-1] < losses[0]
    metrics = train_tiny(tmp_path, "--mode", "eval")
    assert set(metrics) >= {"accuracy", "top5_accuracy", "loss"}
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1
    train_tiny(tmp_path, "--mode", "predict")
    predictions = np.load(tmp_path / "predictions.npz")
    assert predictions["logits"].shape == (360, 10)


def test_tiny_trains_and_evaluates_on_the_emulator(tmp_path):
    train_tiny(tmp_path, "--mode", "train", "--device", "emulator", "runconfig.max_steps=3")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 3 and np.isfinite(losses).all()
    metrics = train_tiny(tmp_path, "--mode", "eval", "--device", "emulator", "runconfig.eval_steps=2")
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1


def test_full_size_configs_compile_with_the_digits_standing_in(tmp_path, capsys):
    # the README's compile commands, at a small batch (the estimate scales; the graph is the same)
    load_run_module(RESNET).main(["--params", os.path.join(CONFIGS, "resnet18_cifar.yaml"), "--validate_only",
                                  "--model_dir", str(tmp_path), "train_input.dataset=digits",
                                  "train_input.batch_size=4"])
    assert "validation passed" in capsys.readouterr().out


# --- bad input: one line naming the file, a non-zero exit, no traceback -----------------------------


def expect_one_error_line(capsys, argv, *fragments):
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(RESNET).main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0]


def image_folder_argv(tmp_path, root):
    return ["--params", TINY, "--model_dir", str(tmp_path / "model"), "--mode", "train",
            "train_input.dataset=imagefolder", "eval_input.dataset=imagefolder", f"train_input.data_dir={root}",
            f"eval_input.data_dir={root}", "model.num_classes=3", "train_input.batch_size=4",
            "eval_input.batch_size=4", "train_input.shuffle=false"]


def test_an_unreadable_image(tmp_path, capsys):
    root = tmp_path / "images"
    for split in ("train", "val"):
        write_fake_image_folder(root / split, classes=3, per_class=2)
    bad = root / "train" / "class_0" / "1.bmp"
    bad.write_bytes(b"this is not an image")
    expect_one_error_line(capsys, image_folder_argv(tmp_path, root), str(bad), "not a readable image")


def test_an_empty_class_folder(tmp_path, capsys):
    root = tmp_path / "images"
    for split in ("train", "val"):
        write_fake_image_folder(root / split, classes=3, per_class=2)
    empty = root / "train" / "class_1"
    for f in empty.iterdir():
        f.unlink()
    expect_one_error_line(capsys, image_folder_argv(tmp_path, root), str(empty), "holds no image")


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_a_truncated_cifar_batch(tmp_path, capsys, kind):
    folder = write_fake_cifar10(tmp_path, per_batch=10, kind=kind)
    batch = os.path.join(folder, "data_batch_3" if kind == "python" else "data_batch_3.bin")
    with open(batch, "rb") as f:
        head = f.read()[:5000]
    with open(batch, "wb") as f:
        f.write(head)
    expect_one_error_line(capsys, ["--params", os.path.join(CONFIGS, "resnet18_cifar.yaml"), "--model_dir",
                                   str(tmp_path / "model"), f"train_input.data_dir={tmp_path}",
                                   f"eval_input.data_dir={tmp_path}", "train_input.batch_size=8"],
                          batch, "truncated")


def test_a_bmp_the_writer_makes_reads_back_exactly(tmp_path):
    from PIL import Image

    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3)).astype(np.uint8)
    write_bmp(str(tmp_path / "x.bmp"), image)
    assert np.array_equal(np.asarray(Image.open(tmp_path / "x.bmp").convert("RGB")), image)

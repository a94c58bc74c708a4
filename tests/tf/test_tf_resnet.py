"""tf/resnet: the network's size, its input_fns on generated files, the TFRecords of
datasets/prepare_imagefolder.py, training on the CPU and the emulator, and bad input."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from common import zoo
from common.data.images import write_fake_cifar10, write_fake_image_folder
from common.folder import import_beside, load_run_module
from common.params import load_params, thaw
from common.summaries import read_scalars
from common.tf.estimator import ModeKeys

RESNET = os.path.join(zoo.ROOT, "tf", "resnet")
CONFIGS = os.path.join(RESNET, "configs")
TINY = os.path.join(CONFIGS, "params_tiny.yaml")
PREPARE = os.path.join(zoo.ROOT, "datasets", "prepare_imagefolder.py")
model, data, utils = import_beside(os.path.join(RESNET, "run.py"), "model", "data", "utils")


def params_of(config=TINY, *overrides):
    return load_params(config, utils.default_params(), list(overrides))


def first_batch(dataset):
    return next(iter(dataset))


def test_params_yaml_spells_out_the_defaults():
    assert thaw(params_of(os.path.join(CONFIGS, "params.yaml"))) == thaw(load_params(None, utils.default_params()))


@pytest.mark.parametrize("config, size, weights", [("resnet18_cifar.yaml", 32, 11_173_962),
                                                   ("resnet50_imagenet.yaml", 224, 25_557_032)])
def test_full_size_networks_have_the_reference_weights(config, size, weights):
    # the counts of torchvision's builds (tests/pytorch/test_pt_resnet.py checks them against torchvision)
    graph = tf.Graph()
    with graph.as_default():
        params = params_of(os.path.join(CONFIGS, config))
        logits = model.resnet(tf.compat.v1.placeholder(tf.float32, [1, size, size, 3]), params, training=False)
        assert logits.shape == (1, params["model"]["num_classes"])
        trainable = sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())
    assert trainable == weights


def test_augmentation_crops_a_window_of_the_padded_image_and_flips():
    images = tf.reshape(tf.range(2 * 6 * 6, dtype=tf.float32) + 1, [2, 6, 6, 1])
    out = data.augment(images, 2, True, tf.constant([0, 3], tf.int64)).numpy()
    padded = np.pad(images.numpy(), ((0, 0), (2, 2), (2, 2), (0, 0)))
    for i in range(2):
        windows = [padded[i, y:y + 6, x:x + 6] for y in range(5) for x in range(5)]
        assert any(np.array_equal(out[i], w) or np.array_equal(out[i], w[:, ::-1]) for w in windows)
    assert np.array_equal(data.augment(images, 0, False, tf.constant([0, 0], tf.int64)).numpy(), images.numpy())


def test_digits_train_batches_are_augmented_and_eval_batches_not():
    params = params_of(TINY, "train_input.shuffle=false", "train_input.batch_size=40")
    train_images, train_labels = first_batch(data.train_input_fn(params))
    eval_images, eval_labels = first_batch(data.eval_input_fn(params))
    assert train_images.shape == (40, 16, 16, 3) and eval_images.shape == (40, 16, 16, 3)
    assert train_labels.dtype == tf.int64
    assert np.array_equal(train_images[..., 0], train_images[..., 2])  # grey, copied to each channel
    assert np.array_equal(first_batch(data.eval_input_fn(params))[0], eval_images)  # eval: the same each time
    unaugmented = first_batch(data.train_input_fn(params_of(TINY, "train_input.shuffle=false",
                                                            "train_input.batch_size=40",
                                                            "train_input.random_crop_padding=0")))[0]
    assert not np.array_equal(train_images, unaugmented)


def test_digits_repeat_up_to_224_inside_the_map():
    params = params_of(os.path.join(CONFIGS, "resnet50_imagenet.yaml"), "train_input.dataset=digits",
                       "train_input.batch_size=2", "train_input.random_flip=false")
    images, labels = first_batch(data.train_input_fn(params))
    assert images.shape == (2, 224, 224, 3) and labels.numpy().max() <= 9


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_cifar10_in_both_formats(tmp_path, kind):
    write_fake_cifar10(tmp_path, per_batch=20, kind=kind)
    params = params_of(os.path.join(CONFIGS, "resnet18_cifar.yaml"), f"train_input.data_dir={tmp_path}",
                       f"eval_input.data_dir={tmp_path}", "train_input.batch_size=8", "eval_input.batch_size=10")
    images, labels = first_batch(data.eval_input_fn(params))
    assert images.shape == (10, 32, 32, 3)
    if kind == "python":
        with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as f:
            expected = pickle.load(f, encoding="latin1")["labels"][:10]
    else:
        expected = np.fromfile(tmp_path / "cifar-10-batches-bin" / "test_batch.bin", np.uint8).reshape(20, -1)[:10, 0]
    assert labels.numpy().tolist() == [int(v) for v in expected]  # eval keeps the file's order
    assert first_batch(data.train_input_fn(params))[0].shape == (8, 32, 32, 3)


def prepare(source, out, *extra):
    return subprocess.run([sys.executable, PREPARE, "--source", str(source), "--data_dir", str(out), *extra],
                          capture_output=True, text=True, cwd=zoo.ROOT)


def test_prepared_image_folder_reads_back(tmp_path):
    for split in ("train", "val"):
        write_fake_image_folder(tmp_path / "tree" / split, classes=3, per_class=4, size=20, seed=split == "val")
    done = prepare(tmp_path / "tree", tmp_path / "records", "--shard_size", "5")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "records")) == [
        "classes.txt", "train-00000-of-00003.tfrecord", "train-00001-of-00003.tfrecord",
        "train-00002-of-00003.tfrecord", "val-00000-of-00003.tfrecord", "val-00001-of-00003.tfrecord",
        "val-00002-of-00003.tfrecord"]
    params = params_of(TINY, "train_input.dataset=imagefolder", "eval_input.dataset=imagefolder",
                       f"train_input.data_dir={tmp_path / 'records'}", f"eval_input.data_dir={tmp_path / 'records'}",
                       "model.num_classes=3", "train_input.batch_size=4", "eval_input.batch_size=12")
    images, labels = first_batch(data.eval_input_fn(params))
    assert images.shape == (12, 16, 16, 3) and labels.numpy().tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert first_batch(data.train_input_fn(params))[0].shape == (4, 16, 16, 3)


def tiny(model_dir, *argv):
    return load_run_module(RESNET).main(["--params", TINY, "--model_dir", str(model_dir), *argv])


def test_tiny_trains_evaluates_and_predicts_on_the_cpu(tmp_path):
    tiny(tmp_path, "--mode", "train")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 8 and losses[-1] < losses[0]
    metrics = tiny(tmp_path, "--mode", "eval")
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1
    tiny(tmp_path, "--mode", "predict")
    assert np.load(tmp_path / "predictions.npz")["probabilities"].shape == (360, 10)


def test_tiny_trains_and_evaluates_on_the_emulator(tmp_path):
    tiny(tmp_path, "--mode", "train", "--device", "emulator", "runconfig.max_steps=3")
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert len(losses) == 3 and np.isfinite(losses).all()
    metrics = tiny(tmp_path, "--mode", "eval", "--device", "emulator", "runconfig.eval_steps=2")
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1


# --- bad input: one line naming the file, a non-zero exit, no traceback -----------------------------


def one_error_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0]
    for fragment in fragments:
        assert fragment in lines[0]


def test_prepare_refuses_an_unreadable_image(tmp_path):
    for split in ("train", "val"):
        write_fake_image_folder(tmp_path / "tree" / split, classes=2, per_class=2)
    bad = tmp_path / "tree" / "val" / "class_1" / "0.bmp"
    bad.write_bytes(b"BM but not really an image")
    done = prepare(tmp_path / "tree", tmp_path / "records")
    assert done.returncode == 2
    one_error_line(done.stderr, str(bad), "not an image")
    assert not (tmp_path / "records").exists()  # nothing written


def test_prepare_refuses_an_empty_class_folder(tmp_path):
    for split in ("train", "val"):
        write_fake_image_folder(tmp_path / "tree" / split, classes=2, per_class=2)
    empty = tmp_path / "tree" / "train" / "class_0"
    for f in empty.iterdir():
        f.unlink()
    done = prepare(tmp_path / "tree", tmp_path / "records")
    assert done.returncode == 2
    one_error_line(done.stderr, str(empty), "holds no image")


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_a_truncated_cifar_batch(tmp_path, capsys, kind):
    folder = write_fake_cifar10(tmp_path, per_batch=10, kind=kind)
    batch = os.path.join(folder, "data_batch_3" if kind == "python" else "data_batch_3.bin")
    with open(batch, "rb") as f:
        head = f.read()[:5000]
    with open(batch, "wb") as f:
        f.write(head)
    with pytest.raises(SystemExit) as exit_info:
        load_run_module(RESNET).main(["--params", os.path.join(CONFIGS, "resnet18_cifar.yaml"), "--model_dir",
                                      str(tmp_path / "model"), f"train_input.data_dir={tmp_path}",
                                      f"eval_input.data_dir={tmp_path}", "train_input.batch_size=8"])
    assert exit_info.value.code not in (0, None)
    one_error_line(capsys.readouterr().err, batch, "truncated")


def test_records_missing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        tiny(tmp_path / "model", "train_input.dataset=imagefolder", f"train_input.data_dir={tmp_path}")
    one_error_line(capsys.readouterr().err, str(tmp_path), "prepare_imagefolder.py")

"""Corrupt and hostile files: each is refused with one line naming it, or read whole.

Checkpoints (PyTorch .mdl, TF model.ckpt-N) cut short or with a bit flipped, through
run.py as a user meets them and, for many random flips, through the loader the runner
uses: a flip either stops the load with the file's name or leaves every value as it was.
The data files (IDX, HDF5, TFRecord, PNG) likewise, through their readers. Hostile files:
a .mdl or a CIFAR-10 batch whose pickle would run code, and a params file whose YAML
tags would build objects, are refused without running anything. No prepare command
unpacks an archive (the last test keeps it so).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from common.errors import UserError
from common.folder import import_beside
from tests.reliability.conftest import (ROOT, flip_bit, mnist_argv, needs, one_error_line, run_main,
                                        trials)


class RunsCode:
    """Unpickling this calls os.mkdir(marker): the harmless stand-in for any code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _same(a, b) -> bool:
    """Equal values, tensors and arrays bit for bit, nested dicts and lists alike."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    if hasattr(a, "numpy") and hasattr(a, "dtype"):  # a torch tensor
        import torch

        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _flips(path: Path, read, count: int, seed: int, lo: int = 0, hi: int | None = None) -> int:
    """Flip one bit of ``path`` ``count`` times (a fresh copy each time); returns the flips that
    were lost: read as if whole though different, or refused by anything but one UserError
    naming the file."""
    original = path.read_bytes()
    whole = read(path)
    rng = random.Random(seed)
    damaged_path = path.with_name("damaged_" + path.name)
    lost = 0
    for _ in range(count):
        damaged, _ = flip_bit(original, rng, lo, hi)
        damaged_path.write_bytes(damaged)
        try:
            got = read(damaged_path)
        except UserError as e:
            lost += str(damaged_path) not in str(e) or "\n" in str(e)
            continue
        except Exception:  # noqa: BLE001 - a traceback is a loss
            lost += 1
            continue
        lost += not _same(whole, got)
    return lost


def _cut(path: Path, read) -> int:
    """Cut ``path`` at several lengths; returns the cuts that were lost: read as if whole though
    different (a PNG cut in its end marker, after the pixels, reads whole), or refused by
    anything but one UserError naming the file. (No cut falls between two TFRecord records
    of these files: a file cut there is a shorter file of whole records, which no reader can
    tell, the format holding no count.)"""
    original = path.read_bytes()
    whole = read(path)
    lost = 0
    for length in (0, 1, 16, len(original) // 3 + 5, len(original) // 2 + 3, len(original) - 7):
        cut = path.with_name(f"cut{length}_" + path.name)
        cut.write_bytes(original[:length])
        try:
            lost += not _same(whole, read(cut))
        except UserError as e:
            lost += str(cut) not in str(e)
        except Exception:  # noqa: BLE001
            lost += 1
    return lost


# --- PyTorch checkpoints -------------------------------------------------------------------

@pytest.fixture(scope="module")
def pt_trained(tmp_path_factory, mnist_dir):
    """pytorch/mnist's tiny config trained 4 steps: checkpoint_2.mdl and checkpoint_4.mdl."""
    needs("torch")
    model_dir = tmp_path_factory.mktemp("pt") / "model"
    assert run_main("pytorch", mnist_argv("pytorch", model_dir, mnist_dir)) == 0
    return model_dir


def _tensor_bytes(path: Path) -> tuple[int, int]:
    """Offsets of the stored bytes of the largest entry of a torch.save zip (a weight's data)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.compress_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    start = info.header_offset + 30 + name_len + extra_len
    return start, start + info.compress_size


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_a_damaged_mdl_is_one_line_naming_it(pt_trained, mnist_dir, tmp_path, capsys, ledger, damage):
    bad = tmp_path / "checkpoint_4.mdl"
    data = (pt_trained / "checkpoint_4.mdl").read_bytes()
    if damage == "cut":
        bad.write_bytes(data[:len(data) // 2])
    else:  # a bit of a weight: torch.load alone would read a wrong number without a word
        bad.write_bytes(flip_bit(data, random.Random(0), *_tensor_bytes(pt_trained / "checkpoint_4.mdl"))[0])
    status = run_main("pytorch", mnist_argv("pytorch", tmp_path / "eval", mnist_dir, "--mode", "eval",
                                            "--checkpoint_path", str(bad)))
    line = one_error_line(status, capsys.readouterr().err)
    ledger.record(f"PyTorch .mdl {'cut short' if damage == 'cut' else 'bit flip in a weight'}, via run.py", 1,
                  str(bad) not in line)
    assert line.startswith(f"error: {bad}: not a readable checkpoint (")


def test_random_bit_flips_in_a_mdl_never_load_as_a_good_one(pt_trained, ledger):
    from common.pytorch.checkpoint import load_checkpoint

    path = pt_trained / "checkpoint_4.mdl"
    n = trials(200, 2000)
    lost = _flips(path, load_checkpoint, n, seed=1) + _cut(path, load_checkpoint)
    ledger.record("PyTorch .mdl: a random bit flipped, or cut short (load_checkpoint)", n + 6, lost)
    assert lost == 0


def test_a_mdl_whose_pickle_would_run_code_is_refused(pt_trained, mnist_dir, tmp_path, capsys, ledger):
    import torch

    marker = tmp_path / "code_ran"
    state = torch.load(pt_trained / "checkpoint_4.mdl", weights_only=True)
    state["model"]["extra"] = RunsCode(marker)
    hostile = tmp_path / "model" / "checkpoint_6.mdl"
    hostile.parent.mkdir()
    torch.save(state, hostile)
    for argv in (["--mode", "eval", "--checkpoint_path", str(hostile)],  # named on the command line
                 ["--mode", "train", "--max_steps", "8"]):  # the newest in model_dir, with no other
        status = run_main("pytorch", mnist_argv("pytorch", tmp_path / "model", mnist_dir, *argv))
        line = one_error_line(status, capsys.readouterr().err)
        ledger.record("PyTorch .mdl whose pickle runs code, via run.py", 1, marker.exists() or str(hostile) not in line)
        assert "Python objects beyond tensors" in line and not marker.exists()

    from common.zoo_cli import main as zoo

    assert zoo(["convert", str(hostile)]) == 2  # `zoo convert` reads it the same way
    assert not marker.exists() and str(hostile) in capsys.readouterr().err


# --- TF checkpoints -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf_trained(tmp_path_factory, mnist_dir):
    needs("tensorflow")
    model_dir = tmp_path_factory.mktemp("tf") / "model"
    assert run_main("tf", mnist_argv("tf", model_dir, mnist_dir)) == 0
    return model_dir


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_a_damaged_tf_checkpoint_is_one_line_naming_it(tf_trained, mnist_dir, tmp_path, capsys, ledger, damage):
    copy = tmp_path / "copy"
    shutil.copytree(tf_trained, copy)
    data_file = copy / "model.ckpt-4.data-00000-of-00001"
    data = data_file.read_bytes()
    data_file.write_bytes(data[:len(data) // 2] if damage == "cut" else flip_bit(data, random.Random(0))[0])
    status = run_main("tf", mnist_argv("tf", tmp_path / "eval", mnist_dir, "--mode", "eval",
                                       "--checkpoint_path", str(copy / "model.ckpt-4")))
    line = one_error_line(status, capsys.readouterr().err)
    ledger.record(f"TF checkpoint {'cut short' if damage == 'cut' else 'bit flip'}, via run.py", 1,
                  "model.ckpt-4" not in line)
    assert str(copy / "model.ckpt-4") in line


def test_random_bit_flips_in_a_tf_checkpoint_never_read_as_a_good_one(tf_trained, tmp_path, ledger):
    from common.tf.estimator import checkpoints
    from common.weights_io import tf_variables

    def read(data_path: Path):
        """The variables of the checkpoint whose data file is ``data_path`` (its own copy of the index)."""
        prefix = str(data_path).removesuffix(".data-00000-of-00001")
        shutil.copyfile(tf_trained / "model.ckpt-4.index", prefix + ".index")
        problem = checkpoints.checkpoint_problem(prefix)  # what the runner asks before it restores
        if problem:
            raise UserError(f"{data_path}: {problem}")
        return tf_variables(prefix)

    data = tmp_path / "model.ckpt-4.data-00000-of-00001"
    shutil.copyfile(tf_trained / data.name, data)
    n = trials(30, 300)
    lost = _flips(data, read, n, seed=2)
    ledger.record("TF checkpoint: a random bit flipped in its data (checkpoint_problem)", n, lost)
    assert lost == 0


# --- data files -------------------------------------------------------------------------------

def test_a_cut_idx_file_is_one_line_naming_it_via_run_py(mnist_dir, tmp_path, capsys, ledger):
    data = tmp_path / "data"
    shutil.copytree(mnist_dir, data)
    images = next(data.rglob("train-images-idx3-ubyte*"))
    images.write_bytes(images.read_bytes()[:1000])
    status = run_main("pytorch", mnist_argv("pytorch", tmp_path / "model", data))
    line = one_error_line(status, capsys.readouterr().err)
    ledger.record("IDX file cut short, via run.py", 1, images.name not in line)
    assert images.name in line and not (tmp_path / "model").exists()


def test_idx_headers_flipped_or_cut_are_one_line(tmp_path, ledger):
    from common.data.mnist.idx import read_idx, write_idx

    path = tmp_path / "t10k-images-idx3-ubyte"
    write_idx(path, np.arange(4 * 5 * 5, dtype=np.uint8).reshape(4, 5, 5))
    # IDX has no checksum: a flipped pixel is a different pixel to any reader; its 16-byte header
    # (magic, shape) is what can be checked, against the file's length
    n = trials(100, 1000)
    lost = _flips(path, read_idx, n, seed=3, hi=16) + _cut(path, read_idx)
    ledger.record("IDX header: a bit flipped, or the file cut short", n + 6, lost)
    assert lost == 0


@pytest.mark.parametrize("kind", ["lm", "pretraining"])
def test_hdf5_shards_flipped_or_cut_are_one_line_or_read_whole(tmp_path, ledger, kind):
    needs("h5py")
    rng = np.random.default_rng(0)
    path = tmp_path / f"{kind}.h5"
    if kind == "lm":  # gpt2's shards
        from common.data.text.lm import read_lm_hdf5 as read, write_lm_hdf5

        write_lm_hdf5({"input_ids": rng.integers(0, 99, (8, 16)), "attention_mask": np.ones((8, 16), int),
                       "labels": rng.integers(0, 99, (8, 16))}, path)
    else:  # bert's pretraining shards
        from common.data.text.pretraining import FEATURES, read_hdf5 as read, write_hdf5

        lengths = {"seq": 16, "pred": 4, 1: 1}
        write_hdf5({name: rng.integers(0, 2, (8, lengths[unit])) for name, (_, unit) in FEATURES.items()}, path)
    n = trials(150, 1500)
    lost = _flips(path, read, n, seed=4) + _cut(path, read)
    ledger.record(f"HDF5 ({kind} shard): a bit flipped, or cut short", n + 6, lost)
    assert lost == 0


@pytest.mark.parametrize("kind", ["lm", "pretraining"])
def test_tfrecord_files_flipped_or_cut_are_one_line(tmp_path, ledger, kind):
    needs("tensorflow")
    rng = np.random.default_rng(0)
    path = tmp_path / f"{kind}.tfrecord"
    if kind == "lm":
        from common.data.text import lm, shards

        lm.write_lm_tfrecord({"input_ids": rng.integers(0, 99, (8, 16)), "attention_mask": np.ones((8, 16), int),
                              "labels": rng.integers(0, 99, (8, 16))}, path)

        def read(p):
            lm.check_lm_tfrecord(p)
            return lm.count_lm_tfrecord(p), list(shards.tf_records(p))
    else:
        from common.data.text import tfrecord
        from common.data.text.pretraining import FEATURES

        lengths = {"seq": 16, "pred": 4, 1: 1}
        tfrecord.write_tfrecord({name: rng.integers(0, 2, (8, lengths[unit]))
                                 for name, (_, unit) in FEATURES.items()}, path)

        def read(p):
            tfrecord.check_tfrecord_schema(p)
            return tfrecord.count_tfrecord(p), list(tfrecord._records(p))
    n = trials(100, 1000)
    # every record carries CRC-32Cs of its length and its bytes: any flip is found
    lost = _flips(path, read, n, seed=5) + _cut(path, read)
    ledger.record(f"TFRecord ({kind}): a bit flipped, or cut short", n + 6, lost)
    assert lost == 0


def test_png_flipped_or_cut_is_one_line_or_read_whole(tmp_path, ledger):
    needs("PIL")
    from PIL import Image

    from common.data.segmentation import read_image

    path = tmp_path / "mask.png"
    Image.fromarray((np.random.default_rng(0).random((16, 16)) * 255).astype(np.uint8)).save(path)
    n = trials(100, 1000)
    lost = _flips(path, read_image, n, seed=6) + _cut(path, read_image)  # PNG chunks carry a CRC-32 each
    ledger.record("PNG image: a bit flipped, or cut short", n + 6, lost)
    assert lost == 0


# --- hostile files ------------------------------------------------------------------------

def test_a_cifar10_batch_whose_pickle_would_run_code_is_refused(tmp_path, ledger):
    from common.data.images import read_cifar10, write_fake_cifar10

    folder = Path(write_fake_cifar10(tmp_path, per_batch=4, kind="python"))
    marker = tmp_path / "code_ran"
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"data": RunsCode(marker), "labels": [0, 1, 2, 3]}, f)
    readers = [lambda: read_cifar10(str(tmp_path), "test")]
    if importlib.util.find_spec("torchvision") is not None:  # pytorch/resnet reads it through torchvision
        data = import_beside(str(ROOT / "pytorch" / "resnet" / "run.py"), "data")
        readers.append(lambda: data.LocalCIFAR10(str(tmp_path), train=False, download=False))
    for read in readers:
        with pytest.raises(UserError) as e:
            read()
        ledger.record("CIFAR-10 batch whose pickle runs code", 1, marker.exists())
        assert str(e.value).startswith(f"{folder / 'test_batch'}: its pickle names ") and "mkdir" in str(e.value)
        assert not marker.exists()


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.mkdir", "!!python/object/new:os.mkdir",
                                 "!!python/name:os.mkdir"])
def test_yaml_tags_that_build_objects_are_refused(mnist_dir, tmp_path, capsys, ledger, tag):
    marker = tmp_path / "code_ran"
    params = tmp_path / "params.yaml"
    value = f"{tag} [{marker}]" if "name:" not in tag else f"{tag} ''"
    params.write_text(f"base: {ROOT / 'pytorch' / 'mnist' / 'configs' / 'params_tiny.yaml'}\n"
                      f"model:\n  dropout: {value}\n", encoding="utf-8")
    argv = mnist_argv("pytorch", tmp_path / "model", mnist_dir)
    argv[argv.index("--params") + 1] = str(params)
    line = one_error_line(run_main("pytorch", argv), capsys.readouterr().err)
    ledger.record("params YAML with a python tag, via run.py", 1, marker.exists() or f"{params}:3" not in line)
    assert re.match(rf"error: {re.escape(str(params))}:3: malformed YAML: ", line), line
    assert not marker.exists() and not (tmp_path / "model").exists()


def test_no_prepare_command_unpacks_an_archive():
    """Unpacking an archive needs safe extraction (no ../ or absolute paths, no links); no
    prepare command unpacks one today (the user untars CIFAR-10, datasets/README.md). This
    fails when one starts to, so that its extraction gets such tests."""
    calls = re.compile(r"\b(extractall|extract|unpack_archive)\(|tarfile\.open|zipfile\.ZipFile\(.*['\"]r")
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("common", "datasets") for path in (ROOT / folder).rglob("*.py")
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if calls.search(line)]
    assert found == [], found


def test_a_tfrecord_record_damaged_past_the_first_stops_training_with_one_line(tmp_path, capsys, ledger):
    """The readers check a file's first record before training; one further in is found by
    tf.data's checksum mid-run: one line with the step, the last checkpoint kept."""
    needs("tensorflow")
    import tensorflow as tf

    from common.tf.estimator import EstimatorSpec
    from common.tf.optim import build_train_op
    from common.tf.run import run

    path = tmp_path / "train.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for k in range(16):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[k / 16] * 4)),
                       "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[k % 2]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    data = path.read_bytes()
    record = len(data) // 16
    path.write_bytes(flip_bit(data, random.Random(7), 12 * record + 20, 13 * record - 4)[0])  # the 13th record

    def input_fn(params, mode):
        spec = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}
        parsed = tf.data.TFRecordDataset(str(path)).map(lambda r: tf.io.parse_single_example(r, spec))
        return parsed.map(lambda e: (e["x"], e["y"][0])).batch(2, drop_remainder=True)  # no repeat: 6 whole batches

    def model_fn(features, labels, mode, params):
        import keras

        logits = keras.layers.Dense(2)(features)  # (B, 2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    def default_params():
        return {"optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1},
                "runconfig": {"max_steps": 10, "checkpoint_steps": 2, "log_steps": 1}}

    params = tmp_path / "params.yaml"
    params.write_text("runconfig: {seed: 1}\n")
    try:
        run(model_fn, input_fn, input_fn, default_params, argv=["--params", str(params), "--model_dir",
                                                                 str(tmp_path / "model")])
        status = 0
    except SystemExit as e:
        status = e.code
    line = one_error_line(status, capsys.readouterr().err)
    ledger.record("TFRecord record damaged past the first, mid-training (TF runner)", 1,
                  "at step 7" not in line or "model.ckpt-6" not in line)
    assert line.startswith("error: the training data holds a damaged record at step 7 (corrupted record at "), line
    assert line.endswith(f"the newest checkpoint is kept: {tmp_path / 'model' / 'model.ckpt-6'}"), line

"""The offline MNIST layer: IDX files, prepare_mnist, resolve_mnist, the embedded digits."""

import gzip
import importlib.util
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.data import mnist
from common.data.mnist import (
    MNIST_FILES,
    load_mnist_arrays,
    prepare_mnist,
    read_idx,
    resolve_mnist,
    write_fake_mnist,
    write_idx,
)
from common.errors import UserError

REPO = Path(__file__).resolve().parents[2]
ALL_FILES = MNIST_FILES["train"] + MNIST_FILES["test"]


def idx_header(*shape: int, type_code: int = 0x08) -> bytes:
    return bytes([0, 0, type_code, len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)


def snapshot(folder: Path) -> dict[str, bytes]:
    """relative path -> bytes of every file under folder (empty when it does not exist)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def source_folder(tmp_path: Path, *, gz: bool, dotted: bool = False, n_train: int = 20, n_test: int = 10) -> Path:
    """A folder holding the four files as a user might have them (gzipped or not)."""
    fake = write_fake_mnist(tmp_path / "fake", n_train, n_test, seed=1)
    source = tmp_path / "source"
    source.mkdir()
    for name in ALL_FILES:
        data = (Path(fake.raw_dir) / name).read_bytes()
        target = name.replace("-idx", ".idx") if dotted else name
        if gz:
            (source / f"{target}.gz").write_bytes(gzip.compress(data))
        else:
            (source / target).write_bytes(data)
    return source


# ----------------------------------------------------------------------------- IDX files


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_idx_round_trip(tmp_path, name):
    images = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.arange(5, dtype=np.uint8)
    write_idx(tmp_path / name, images)
    write_idx(tmp_path / ("labels-" + name), labels)
    np.testing.assert_array_equal(read_idx(tmp_path / name), images)
    np.testing.assert_array_equal(read_idx(tmp_path / ("labels-" + name)), labels)
    raw = (tmp_path / name).read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    # The MNIST header byte for byte: magic 0x00000803, then big-endian N, rows, cols.
    assert raw[:16] == bytes.fromhex("00000803" "00000005" "0000001c" "0000001c")
    assert len(raw) == 16 + 5 * 28 * 28
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "labels-" + name])


def test_write_idx_rejects_other_dtypes(tmp_path):
    with pytest.raises(TypeError, match="uint8"):
        write_idx(tmp_path / "x", np.zeros((2, 2), dtype=np.float32))
    assert not any(tmp_path.iterdir())


def test_read_idx_wrong_magic(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(idx_header(2, 2, type_code=0x0D) + bytes(16))
    message = r"train-images-idx3-ubyte: not an IDX file of unsigned bytes: magic 0x00000D02"
    with pytest.raises(UserError, match=message):
        read_idx(path)


def test_read_idx_gzip_data_without_gz_name(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(gzip.compress(idx_header(3) + bytes(3)))
    with pytest.raises(UserError, match="gzip-compressed: name it .gz"):
        read_idx(path)


def test_read_idx_truncated(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(idx_header(60000, 28, 28) + bytes(1000))
    with pytest.raises(UserError) as e:
        read_idx(path)
    assert str(e.value) == f"{path}: truncated IDX file: header promises 47040000 bytes of data, found 1000"


def test_read_idx_truncated_header_and_extra_bytes(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(idx_header(3)[:6])
    with pytest.raises(UserError, match="labels: truncated IDX file: the header needs 8 bytes, found 6"):
        read_idx(path)
    path.write_bytes(idx_header(3) + bytes(5))
    with pytest.raises(UserError, match="labels: IDX file has 2 bytes after the 3 its header promises"):
        read_idx(path)


def test_read_idx_bad_gz(tmp_path):
    plain = tmp_path / "t10k-labels-idx1-ubyte.gz"
    plain.write_bytes(idx_header(3) + bytes(3))
    with pytest.raises(UserError, match=r"t10k-labels-idx1-ubyte.gz: named .gz but not gzip-compressed"):
        read_idx(plain)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(idx_header(1000) + bytes(1000))[:30])
    with pytest.raises(UserError, match=r"cut.gz: corrupt gzip data"):
        read_idx(cut)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nothing-here: no such file"):
        read_idx(tmp_path / "nothing-here")


# ------------------------------------------------------------------------ prepare_mnist


@pytest.mark.parametrize("gz, dotted", [(True, False), (False, False), (True, True)])
def test_prepare_from_folder(tmp_path, gz, dotted):
    source = source_folder(tmp_path, gz=gz, dotted=dotted)
    data_dir = tmp_path / "data"
    prepared = prepare_mnist(str(source), str(data_dir))
    raw = data_dir / "MNIST" / "raw"
    assert [Path(f.path).name for f in prepared] == list(ALL_FILES)
    assert [f.shape for f in prepared] == [(20, 28, 28), (20,), (10, 28, 28), (10,)]
    assert sorted(p.name for p in raw.iterdir()) == sorted(ALL_FILES)  # uncompressed, no temporaries
    fake_raw = tmp_path / "fake" / "MNIST" / "raw"
    for name in ALL_FILES:
        assert (raw / name).read_bytes() == (fake_raw / name).read_bytes()
    assert resolve_mnist(str(data_dir), "mnist").num_train == 20


def test_prepare_from_file_url(tmp_path):
    source = source_folder(tmp_path, gz=True)
    prepared = prepare_mnist(source.as_uri(), str(tmp_path / "data"))
    assert prepared[0].source == source.as_uri() + "/train-images-idx3-ubyte.gz"
    images, labels = load_mnist_arrays(resolve_mnist(str(tmp_path / "data"), "mnist"), "test")
    assert images.shape == (10, 28, 28) and labels.shape == (10,)


def test_prepare_url_without_the_files(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"could not download .*/empty/train-images-idx3-ubyte.gz: .*--source"):
        prepare_mnist(empty.as_uri(), str(tmp_path / "data"))
    assert not (tmp_path / "data").exists()


def test_prepare_names_missing_source_files(tmp_path):
    source = source_folder(tmp_path, gz=False)
    (source / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match=r"no t10k-labels-idx1-ubyte\[.gz\] there"):
        prepare_mnist(str(source), str(tmp_path / "data"))


@pytest.mark.parametrize(
    "bad_fourth, message",
    [
        (idx_header(9) + bytes(9), r"t10k-labels-idx1-ubyte: 9 labels, but .*t10k-images-idx3-ubyte holds 10"),
        (idx_header(10) + bytes([12] * 10), r"t10k-labels-idx1-ubyte: label 12 out of range 0..9"),
        (idx_header(10) + bytes(4), r"t10k-labels-idx1-ubyte: truncated IDX file"),
    ],
)
def test_prepare_validates_before_writing(tmp_path, bad_fourth, message):
    source = source_folder(tmp_path, gz=False)
    (source / "t10k-labels-idx1-ubyte").write_bytes(bad_fourth)
    # A data_dir already holding an older, valid MNIST must come out untouched.
    data_dir = tmp_path / "data"
    write_fake_mnist(data_dir, 30, 10, seed=7)
    (data_dir / "notes.txt").write_text("mine")
    before = snapshot(data_dir)
    with pytest.raises(UserError, match=message):
        prepare_mnist(str(source), str(data_dir))
    assert snapshot(data_dir) == before
    # A fresh data_dir is not even created.
    with pytest.raises(UserError):
        prepare_mnist(str(source), str(tmp_path / "fresh"))
    assert not (tmp_path / "fresh").exists()


def test_prepare_rejects_images_of_another_size(tmp_path):
    source = source_folder(tmp_path, gz=False)
    write_idx(source / "train-images-idx3-ubyte", np.zeros((20, 27, 27), dtype=np.uint8))
    message = r"train-images-idx3-ubyte: expected images of shape \(N, 28, 28\), found \(20, 27, 27\)"
    with pytest.raises(UserError, match=message):
        prepare_mnist(str(source), str(tmp_path / "data"))


def run_prepare_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "datasets/prepare_mnist.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_prepare_script_exit_codes(tmp_path):
    source = source_folder(tmp_path, gz=True)
    done = run_prepare_script("--source", str(source), "--data_dir", str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 5
    assert lines[0] == (
        f"{tmp_path / 'data' / 'MNIST' / 'raw' / 'train-images-idx3-ubyte'}: 20 images of 28x28 "
        f"from {source / 'train-images-idx3-ubyte.gz'}"
    )
    assert lines[-1] == f"MNIST ready (20 train / 10 test): use data_dir {tmp_path / 'data'}"

    failed = run_prepare_script("--source", str(tmp_path / "nowhere"), "--data_dir", str(tmp_path / "other"))
    assert failed.returncode == 2
    assert failed.stdout == ""
    assert failed.stderr.startswith(f"error: MNIST source {tmp_path / 'nowhere'}: no such folder")
    assert len(failed.stderr.splitlines()) == 1
    assert not (tmp_path / "other").exists()


# ------------------------------------------------------------------------ resolve_mnist


def test_resolve_auto_uses_data_dir_holding_mnist(tmp_path, caplog):
    write_fake_mnist(tmp_path, 12, 6, seed=0)
    with caplog.at_level(logging.INFO, logger="common.data.mnist"):
        location = resolve_mnist(str(tmp_path))
    assert (location.root, location.kind, location.num_train, location.num_test) == (str(tmp_path), "mnist", 12, 6)
    assert location.raw_dir == str(tmp_path / "MNIST" / "raw")
    assert caplog.records == []
    # Naming the MNIST/raw folder itself finds the same root torchvision needs.
    assert resolve_mnist(str(tmp_path / "MNIST" / "raw")).root == str(tmp_path)


def test_resolve_auto_falls_back_to_embedded_digits(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="common.data.mnist"):
        location = resolve_mnist(str(tmp_path / "nothing"))
    assert location.kind == "uci_digits"
    assert location.root == str(REPO / "datasets" / "embedded" / "uci_digits")
    [record] = caplog.records
    assert record.getMessage() == (
        f"data: {tmp_path / 'nothing'} holds no MNIST; using the embedded UCI handwritten digits "
        f"(1,437 train / 360 test, 28x28). For full MNIST run: python {REPO / 'datasets' / 'prepare_mnist.py'} "
        f"--source <folder with the four IDX files> --data_dir {tmp_path / 'nothing'}"
    )


def test_the_printed_prepare_command_works_from_another_directory(tmp_path, monkeypatch, caplog):
    """The fallback's advice, run as printed (the source filled in) from a directory that is
    neither the repository nor the run's: it prepares the data_dir the run reads."""
    source = source_folder(tmp_path, gz=True)
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    with caplog.at_level(logging.WARNING, logger="common.data.mnist"):
        assert resolve_mnist("./data/mnist").kind == "uci_digits"
    command = caplog.records[0].getMessage().split("For full MNIST run: ")[1]
    assert command.startswith("python ")
    argv = shlex.split(command.replace("<folder with the four IDX files>", shlex.quote(str(source))))
    argv[0] = sys.executable
    done = subprocess.run(argv, cwd=elsewhere, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert resolve_mnist("./data/mnist").kind == "mnist"
    assert not os.listdir(elsewhere)


def test_resolve_auto_names_an_incomplete_mnist(tmp_path, caplog):
    write_fake_mnist(tmp_path, 4, 4, seed=0)
    (tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte").unlink()
    with caplog.at_level(logging.INFO, logger="common.data.mnist"):
        assert resolve_mnist(str(tmp_path)).kind == "uci_digits"
    assert "holds an incomplete MNIST (no t10k-images-idx3-ubyte" in caplog.text


def test_resolve_explicit_mnist(tmp_path):
    missing = tmp_path / "missing"
    message = rf"data_dir {missing} does not exist .*prepare_mnist.py .*--data_dir {missing}"
    with pytest.raises(UserError, match=message):
        resolve_mnist(str(missing), "mnist")
    write_fake_mnist(tmp_path, 4, 4, seed=0)
    assert resolve_mnist(str(tmp_path), "mnist").kind == "mnist"
    (tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte").unlink()
    message = r"has no .*MNIST/raw/train-labels-idx1-ubyte \(dataset 'mnist'\); prepare"
    with pytest.raises(UserError, match=message):
        resolve_mnist(str(tmp_path), "mnist")


def test_resolve_rejects_a_corrupt_layout(tmp_path):
    write_fake_mnist(tmp_path, 4, 4, seed=0)
    labels = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    write_idx(labels, np.zeros(3, dtype=np.uint8))
    with pytest.raises(UserError, match=r"t10k-labels-idx1-ubyte: shape \(3,\), but .* holds 4 images"):
        resolve_mnist(str(tmp_path))
    labels.write_bytes(gzip.compress(idx_header(4) + bytes(4)))
    with pytest.raises(UserError, match="gzip-compressed"):
        resolve_mnist(str(tmp_path), "mnist")


def test_resolve_uci_digits_and_unknown_names(tmp_path):
    write_fake_mnist(tmp_path, 4, 4, seed=0)
    assert resolve_mnist(str(tmp_path), "uci_digits").kind == "uci_digits"
    with pytest.raises(UserError, match=r"dataset 'fashion' is unknown; valid: auto, mnist, uci_digits"):
        resolve_mnist(str(tmp_path), "fashion")


def test_embedded_digits_missing_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist.embedded, "EMBEDDED_DIGITS_ROOT", tmp_path)
    with pytest.raises(UserError, match=r"the embedded digits are missing: .*pip install -e"):
        resolve_mnist("", "uci_digits")


def test_load_mnist_arrays(tmp_path):
    location = write_fake_mnist(tmp_path, 12, 6, seed=0)
    images, labels = load_mnist_arrays(location, "train")
    assert images.dtype == np.uint8 and images.shape == (12, 28, 28)
    assert labels.dtype == np.int64 and labels.shape == (12,)
    with pytest.raises(UserError, match=r"split 'eval' is unknown; valid: train, test"):
        load_mnist_arrays(location, "eval")


def test_fake_mnist_is_learnable(tmp_path):
    location = write_fake_mnist(tmp_path, 200, 100, seed=3)
    x_train, y_train = load_mnist_arrays(location, "train")
    x_test, y_test = load_mnist_arrays(location, "test")
    assert np.bincount(y_train, minlength=10).tolist() == [20] * 10
    # A nearest-class-mean classifier, a stand-in for a model trained a few steps.
    means = np.stack([x_train[y_train == k].reshape(-1, 784).mean(0) for k in range(10)])  # (10, 784)
    distances = ((x_test.reshape(-1, 1, 784).astype(float) - means) ** 2).sum(-1)  # (100, 10)
    assert (distances.argmin(1) == y_test).mean() == 1.0


# ---------------------------------------------------------------------- embedded digits


def test_embedded_digits_counts_shapes_and_classes():
    location = resolve_mnist("", "uci_digits")
    assert (location.num_train, location.num_test) == (1437, 360)
    counts = {}
    for split, n in (("train", 1437), ("test", 360)):
        images, labels = load_mnist_arrays(location, split)
        assert images.shape == (n, 28, 28) and labels.shape == (n,)
        counts[split] = np.bincount(labels, minlength=10)
        assert len(counts[split]) == 10 and counts[split].min() > 0
        # The 20x20 digit sits in the middle of the 28x28 canvas, a 4-pixel zero border around it.
        assert images[:, :4].max() == 0 and images[:, 24:].max() == 0
        assert images[:, :, :4].max() == 0 and images[:, :, 24:].max() == 0
        assert images.max() == 255
    # Stratified: each class gives its share (within one image) of 360/1797 to the test split.
    per_class = counts["train"] + counts["test"]
    assert per_class.tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert np.all(np.abs(counts["test"] - per_class * 360 / 1797) < 1)


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed")
def test_embedded_digits_match_a_fresh_generation(tmp_path):
    done = subprocess.run(
        [sys.executable, "datasets/make_embedded_digits.py", "--out_dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert snapshot(tmp_path) == snapshot(REPO / "datasets" / "embedded" / "uci_digits")


def test_common_data_imports_no_framework():
    code = "import sys, common.data; print(sorted({'torch', 'tensorflow', 'sklearn'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not (REPO / "datasets" / "__init__.py").exists()
    assert os.path.isdir(REPO / "datasets" / "embedded" / "uci_digits" / "MNIST" / "raw")

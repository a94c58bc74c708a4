"""common/data/segmentation.py: the digit canvases, the image + mask folders and Severstal's CSV."""

import numpy as np
import pytest
from PIL import Image

from common.data import embedded_digits, load_mnist_arrays
from common.data.segmentation import (INK_THRESHOLD, decode_run_length, digit_canvases, encode_run_length,
                                      read_image_mask_folder, read_severstal, write_fake_image_mask_folder,
                                      write_fake_severstal)
from common.errors import UserError


def test_canvases_are_deterministic_and_label_each_digit_by_its_class():
    images, masks, _ = digit_canvases("test", (32, 32), 3, 8, binary=False)
    again, again_masks, _ = digit_canvases("test", (32, 32), 3, 8, binary=False)
    assert np.array_equal(images, again) and np.array_equal(masks, again_masks)
    assert images.shape == (120, 32, 32, 1) and masks.shape == (120, 32, 32)  # 360 test digits, 3 per canvas
    assert set(np.unique(masks)) == set(range(11))
    # every labelled pixel is ink and every ink pixel is labelled: the mask is the ink, coloured by digit
    assert np.array_equal(masks > 0, images[..., 0] >= INK_THRESHOLD)
    # each 8x8 cell holds one digit at most: a single class per cell
    cells = masks.reshape(120, 4, 8, 4, 8).transpose(0, 1, 3, 2, 4).reshape(120, 16, 64)
    for cell in cells.reshape(-1, 64):
        assert len(set(cell[cell > 0])) <= 1
    # each test digit is used exactly once: the classes counted per cell are the test labels' counts
    _, labels = load_mnist_arrays(embedded_digits(), "test")
    per_cell = [cell[cell > 0][0] - 1 for cell in cells.reshape(-1, 64) if (cell > 0).any()]
    assert np.array_equal(np.bincount(per_cell, minlength=10), np.bincount(labels, minlength=10))


def test_binary_canvases_mark_ink_as_one():
    images, masks, _ = digit_canvases("train", (16, 16), 2, 8, binary=True)
    assert set(np.unique(masks)) == {0, 1} and np.array_equal(masks == 1, images[..., 0] >= INK_THRESHOLD)


def test_too_many_digits_for_the_canvas():
    with pytest.raises(UserError, match="5 digits of 8x8 per image do not fit a 16x16 image"):
        digit_canvases("train", (16, 16), 5, 8, binary=False)


def test_run_length_is_column_major_and_one_based():
    # Severstal's convention: pixel 1 is the top left, numbering runs down each column first
    mask = decode_run_length("1 2 7 1", (3, 4), "x")
    assert mask.astype(int).tolist() == [[1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    rng = np.random.default_rng(0)
    for _ in range(5):
        m = rng.uniform(size=(6, 9)) > 0.6
        assert np.array_equal(decode_run_length(encode_run_length(m), m.shape, "x"), m)


@pytest.mark.parametrize("encoded, message", [
    ("1 2 7", "has 3 numbers; it is pairs"),
    ("1 x", "holds 'x', not a whole number"),
    ("11 5", "run start 11 length 5 falls outside the 3x4 image"),
    ("0 1", "run start 0 length 1 falls outside"),
])
def test_bad_run_lengths(encoded, message):
    with pytest.raises(UserError, match=message):
        decode_run_length(encoded, (3, 4), "train.csv:7")


@pytest.mark.parametrize("extension", [".png", ".tif"])
def test_image_mask_folder_reads_pairs(tmp_path, extension):
    write_fake_image_mask_folder(str(tmp_path), "train", 3, (8, 12), extension)
    images, masks, what = read_image_mask_folder(str(tmp_path), "train", (8, 12), 1, 2)
    assert images.shape == (3, 8, 12, 1) and masks.shape == (3, 8, 12) and "3 image/mask pairs" in what
    written = np.asarray(Image.open(tmp_path / "train" / "masks" / f"001{extension}"))
    assert np.array_equal(masks[1], (written > 0).astype(np.uint8))  # binary: any value above 0
    assert images[masks == 1].min() >= 150 > images[masks == 0].max()


def test_image_mask_folder_multi_class_values_are_class_ids(tmp_path):
    (tmp_path / "train" / "images").mkdir(parents=True)
    (tmp_path / "train" / "masks").mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "train" / "images" / "a.png")
    Image.fromarray(np.array([[0, 1, 2, 3]] * 4, np.uint8)).save(tmp_path / "train" / "masks" / "a.png")
    _, masks, _ = read_image_mask_folder(str(tmp_path), "train", (4, 4), 1, 4)
    assert masks[0, 0].tolist() == [0, 1, 2, 3]
    with pytest.raises(UserError, match=r"a.png: mask holds class 3, outside model.num_classes 3"):
        read_image_mask_folder(str(tmp_path), "train", (4, 4), 1, 3)


def test_an_unreadable_image_is_named(tmp_path):
    write_fake_image_mask_folder(str(tmp_path), "train", 2, (8, 8))
    (tmp_path / "train" / "images" / "001.png").write_bytes(b"not a png at all")
    with pytest.raises(UserError, match=r"001.png: not a readable image"):
        read_image_mask_folder(str(tmp_path), "train", (8, 8), 1, 2)


def test_a_mask_of_another_size_than_its_image_is_named(tmp_path):
    write_fake_image_mask_folder(str(tmp_path), "train", 2, (8, 8))
    Image.fromarray(np.zeros((8, 6), np.uint8)).save(tmp_path / "train" / "masks" / "000.png")
    with pytest.raises(UserError, match=r"masks/000.png: the mask is 8x6, its image .*000.png 8x8"):
        read_image_mask_folder(str(tmp_path), "train", (8, 8), 1, 2)


def test_severstal_csv_splits_and_decodes(tmp_path):
    write_fake_severstal(str(tmp_path), 5, (8, 16))
    train_images, train_masks, _ = read_severstal(str(tmp_path), "train", (8, 16), 1, 5)
    test_images, test_masks, _ = read_severstal(str(tmp_path), "test", (8, 16), 1, 5)
    assert len(train_masks) == 4 and len(test_masks) == 1  # 80 % of the images train
    rows = (tmp_path / "train.csv").read_text().splitlines()[1:]
    name, class_id, encoded = rows[4].split(",")
    assert name == "0004.png"
    assert np.array_equal(test_masks[0], decode_run_length(encoded, (8, 16), "x") * int(class_id))
    assert test_images[0][test_masks[0] > 0].min() >= 150
    _, binary, _ = read_severstal(str(tmp_path), "test", (8, 16), 1, 2)
    assert np.array_equal(binary[0], (test_masks[0] > 0).astype(np.uint8))


def test_a_bad_run_length_row_names_the_csv_line(tmp_path):
    write_fake_severstal(str(tmp_path), 3, (8, 16))
    lines = (tmp_path / "train.csv").read_text().splitlines()
    lines[2] = "0001.png,2,5 999"
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"train.csv:3: the run start 5 length 999 falls outside the 8x16 image"):
        read_severstal(str(tmp_path), "train", (8, 16), 1, 5)

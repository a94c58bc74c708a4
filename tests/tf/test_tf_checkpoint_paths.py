"""TF checkpoints found again whatever form model_dir takes: relative or absolute, from
another working directory, by a second train, by eval, by keep_checkpoint_max, and by the
emulator after the CPU (and back).

One 4-step run (checkpoints 2 and 4, model_dir relative to the directory it ran from) is
shared; each test that writes works on a copy of it.
"""

import os
import shutil

import pytest

from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tf", "mnist", "configs", "params_tiny.yaml")


def _argv(mnist_dir, model_dir, *extra):
    return ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={mnist_dir}",
            f"eval_input.data_dir={mnist_dir}", "train_input.dataset=mnist", "eval_input.dataset=mnist",
            # what the tests count on, whatever the tiny config says
            "runconfig.max_steps=4", "runconfig.checkpoint_steps=2", "runconfig.keep_checkpoint_max=2", *extra]


def _loss_steps(model_dir):
    return [step for step, _ in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def _indexes(model_dir):
    return sorted(name for name in os.listdir(model_dir) if name.endswith(".index"))


@pytest.fixture(scope="module")
def trained(tf_mnist, mnist_dir, tmp_path_factory):
    """model.ckpt-2 and -4 in <root>/first/runs/tiny, trained from <root>/first with model_dir runs/tiny."""
    root = tmp_path_factory.mktemp("trained")
    (root / "first").mkdir()
    cwd = os.getcwd()
    os.chdir(root / "first")
    try:
        tf_mnist.main(_argv(mnist_dir, "runs/tiny"))
    finally:
        os.chdir(cwd)
    return root / "first" / "runs" / "tiny"


@pytest.fixture
def copy_of(trained, tmp_path, monkeypatch):
    """The trained model_dir copied to tmp_path/work/runs/tiny, the working directory tmp_path/elsewhere."""
    model_dir = tmp_path / "work" / "runs" / "tiny"
    shutil.copytree(trained, model_dir)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return model_dir


def _as_given(model_dir, form):
    """model_dir as a user gives it: absolute, or relative to the working directory."""
    return str(model_dir) if form == "absolute" else os.path.relpath(model_dir)


def test_the_state_file_names_checkpoints_relative_to_model_dir(trained):
    state = (trained / "checkpoint").read_text()
    assert state.splitlines() == ['model_checkpoint_path: "model.ckpt-4"', 'all_model_checkpoint_paths: "model.ckpt-2"',
                                  'all_model_checkpoint_paths: "model.ckpt-4"']


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_eval_from_another_directory_finds_the_latest(tf_mnist, mnist_dir, copy_of, form):
    metrics = tf_mnist.main(_argv(mnist_dir, _as_given(copy_of, form), "--mode", "eval"))
    assert metrics["global_step"] == 4


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_a_second_train_resumes_and_keep_checkpoint_max_rotates(tf_mnist, mnist_dir, copy_of, form, capsys):
    tf_mnist.main(_argv(mnist_dir, _as_given(copy_of, form), "runconfig.max_steps=6"))
    assert "from step 4 to 6" in capsys.readouterr().err
    assert _loss_steps(copy_of) == [1, 2, 3, 4, 5, 6]  # not 1..4 again over the first run's checkpoints
    assert _indexes(copy_of) == ["model.ckpt-4.index", "model.ckpt-6.index"]  # keep_checkpoint_max: 2
    assert (copy_of / "checkpoint").read_text().splitlines() == [
        'model_checkpoint_path: "model.ckpt-6"', 'all_model_checkpoint_paths: "model.ckpt-4"',
        'all_model_checkpoint_paths: "model.ckpt-6"']


def test_a_state_file_of_the_earlier_writer_is_read(tf_mnist, mnist_dir, copy_of):
    """The writer before this fix named checkpoints "../../model.ckpt-N" for model_dir a/b:
    read as model_dir's own files, resumed from, rotated, and the state file written afresh."""
    (copy_of / "checkpoint").write_text('model_checkpoint_path: "../../model.ckpt-4"\n'
                                        'all_model_checkpoint_paths: "../../model.ckpt-2"\n'
                                        'all_model_checkpoint_paths: "../../model.ckpt-4"\n')
    model_dir = os.path.relpath(copy_of)
    assert tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", "eval"))["global_step"] == 4
    tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=6"))
    assert _loss_steps(copy_of) == [1, 2, 3, 4, 5, 6]
    assert _indexes(copy_of) == ["model.ckpt-4.index", "model.ckpt-6.index"]
    assert ".." not in (copy_of / "checkpoint").read_text()


def test_the_emulator_resumes_from_the_cpu_and_the_cpu_from_the_emulator(tf_mnist, mnist_dir, copy_of, capsys):
    pytest.importorskip("device.api")
    model_dir = os.path.relpath(copy_of)
    tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=6", "--device", "emulator"))
    assert "from step 4 to 6" in capsys.readouterr().err
    tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=8"))
    assert "from step 6 to 8" in capsys.readouterr().err
    assert _loss_steps(copy_of) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _indexes(copy_of) == ["model.ckpt-6.index", "model.ckpt-8.index"]
    metrics = tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", "eval", "--device", "emulator"))
    assert metrics["global_step"] == 8

"""A damaged TF checkpoint (a .data or .index file cut short, an unreadable state file):
train and eval fall back to the newest readable checkpoint with a warning naming the bad
file; with none left, or when --checkpoint_path names the bad one, one error line and
nothing in model_dir touched. Never a silent restart from step 0, never a traceback.

One 4-step run (checkpoints 2 and 4) is shared; each test damages a copy of it.
"""

import glob
import logging
import os
import shutil

import pytest

from common.errors import UserError
from common.summaries import read_scalars
from common.tf.estimator import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tf", "mnist", "configs", "params_tiny.yaml")
DATA_2, INDEX_2 = "model.ckpt-2.data-00000-of-00001", "model.ckpt-2.index"
DATA_4, INDEX_4 = "model.ckpt-4.data-00000-of-00001", "model.ckpt-4.index"


def _argv(mnist_dir, model_dir, *extra):
    return ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={mnist_dir}",
            f"eval_input.data_dir={mnist_dir}", "train_input.dataset=mnist", "eval_input.dataset=mnist",
            # what the tests count on, whatever the tiny config says
            "runconfig.max_steps=4", "runconfig.checkpoint_steps=2", "runconfig.keep_checkpoint_max=2", *extra]


@pytest.fixture(scope="module")
def trained(tf_mnist, mnist_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("trained") / "model"
    tf_mnist.main(_argv(mnist_dir, model_dir))
    return model_dir


@pytest.fixture
def model_dir(trained, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(trained, copy)
    return copy


def _cut_in_half(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _snapshot(folder):
    return {os.path.relpath(os.path.join(d, name), folder): open(os.path.join(d, name), "rb").read()
            for d, _, names in os.walk(folder) for name in names}


def _warnings_naming(err, name):
    return [line for line in err.splitlines() if " WARNING " in line and name in line]


def _one_error_line(exit_info, capsys):
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damaged, damage", [(DATA_4, _cut_in_half), (INDEX_4, _cut_in_half),
                                             (INDEX_4, os.remove), (DATA_4, _flip_a_byte)],
                         ids=["data cut short", "index cut short", "index deleted", "a byte of data flipped"])
def test_eval_falls_back_past_a_damaged_newest_checkpoint(tf_mnist, mnist_dir, model_dir, damaged, damage, capsys):
    damage(model_dir / damaged)
    metrics = tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", "eval"))
    assert metrics["global_step"] == 2
    warnings = _warnings_naming(capsys.readouterr().err, str(model_dir / damaged))
    assert len(warnings) == 1 and f"falling back to {model_dir / 'model.ckpt-2'}" in warnings[0]


def test_train_resumes_from_the_checkpoint_before_a_truncated_newest(tf_mnist, mnist_dir, model_dir, capsys):
    _cut_in_half(model_dir / DATA_4)
    tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=6"))
    err = capsys.readouterr().err
    assert len(_warnings_naming(err, DATA_4)) == 1 and "from step 2 to 6" in err
    assert [step for step, _ in read_scalars(str(model_dir / "train"))["loss"]] == [1, 2, 3, 4, 3, 4, 5, 6]
    # step 4 written afresh over the damaged one, and both kept checkpoints read through
    assert checkpoints.list_checkpoints(str(model_dir)) == [str(model_dir / "model.ckpt-4"),
                                                            str(model_dir / "model.ckpt-6")]
    assert all(checkpoints.checkpoint_problem(p) is None for p in checkpoints.list_checkpoints(str(model_dir)))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_no_readable_checkpoint_left_is_an_error_naming_them(tf_mnist, mnist_dir, model_dir, mode, capsys):
    _cut_in_half(model_dir / DATA_4)
    _cut_in_half(model_dir / INDEX_2)
    before = _snapshot(model_dir)
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", mode, "runconfig.max_steps=6"))
    line = _one_error_line(exit_info, capsys)
    assert "no readable checkpoint" in line and str(model_dir / DATA_4) in line and str(model_dir / INDEX_2) in line
    assert _snapshot(model_dir) == before  # not a fresh start over them


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_damaged_checkpoint_path_is_an_error_not_a_fallback(tf_mnist, mnist_dir, model_dir, tmp_path, mode, capsys):
    _cut_in_half(model_dir / DATA_4)
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(_argv(mnist_dir, tmp_path / "second", "--mode", mode, "--checkpoint_path",
                            str(model_dir / "model.ckpt-4")))
    line = _one_error_line(exit_info, capsys)
    assert f"--checkpoint_path {model_dir / 'model.ckpt-4'}: {model_dir / DATA_4}: corrupt" in line
    assert "(tensor '" in line and "Graph execution error" not in line  # TF's own reason, not its wrapping
    assert not (tmp_path / "second").exists()


def test_an_unreadable_state_file_is_an_error_not_a_fresh_start(tf_mnist, mnist_dir, model_dir, capsys):
    (model_dir / "checkpoint").write_text("model_checkpoint_path: \"model.ckpt-4\n")  # cut mid-line
    before = _snapshot(model_dir)
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=6"))
    assert f"{model_dir / 'checkpoint'}: unreadable checkpoint state file" in _one_error_line(exit_info, capsys)
    assert _snapshot(model_dir) == before


def test_eval_all_skips_a_damaged_checkpoint_with_a_warning(tf_mnist, mnist_dir, model_dir, capsys):
    _cut_in_half(model_dir / DATA_2)
    results = tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", "eval_all"))
    assert [r["global_step"] for r in results] == [4]
    assert len(_warnings_naming(capsys.readouterr().err, DATA_2)) == 1


def test_the_emulator_falls_back_too(tf_mnist, mnist_dir, model_dir, capsys):
    pytest.importorskip("device.api")
    _cut_in_half(model_dir / INDEX_4)
    metrics = tf_mnist.main(_argv(mnist_dir, model_dir, "--mode", "eval", "--device", "emulator"))
    assert metrics["global_step"] == 2
    assert len(_warnings_naming(capsys.readouterr().err, INDEX_4)) == 1


def test_train_resumes_from_the_newest_checkpoint_whose_files_are_there(tf_mnist, mnist_dir, model_dir, capsys):
    for name in glob.glob(str(model_dir / "model.ckpt-4.*")):  # the state file still names step 4
        os.remove(name)
    tf_mnist.main(_argv(mnist_dir, model_dir, "runconfig.max_steps=6"))
    err = capsys.readouterr().err
    assert "from step 2 to 6" in err and len(_warnings_naming(err, INDEX_4)) == 1
    assert checkpoints.list_checkpoints(str(model_dir)) == [str(model_dir / "model.ckpt-4"),
                                                            str(model_dir / "model.ckpt-6")]


def _saved(model_dir, steps):
    """Checkpoints of one small variable at ``steps``, as the runner writes them."""
    import tensorflow as tf
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=[1.0, 2.0])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(v.initializer)
            for step in steps:
                checkpoints.save_checkpoint(saver, session, str(model_dir), step, keep_max=5)
    return [str(model_dir / f"model.ckpt-{step}") for step in steps]


def test_checkpoint_step_is_the_number_after_the_last_dash():
    assert checkpoints.checkpoint_step("/a/b-7/model.ckpt-12") == 12
    assert checkpoints.checkpoint_step("model.ckpt-0") == 0
    assert checkpoints.checkpoint_step("/a/model.ckpt") is None
    assert checkpoints.checkpoint_step("/a/model.ckpt-12.index") is None


class _Error(Exception):
    def __init__(self, message):
        super().__init__("str() of the error, not its message")
        self.message = message


def test_op_error_line_keeps_the_reason_without_tf_wrapping():
    message = ("Graph execution error:\n\nDetected at node 'save/RestoreV2' defined at (most recent call last):\n"
               "  File \"x.py\", line 1, in <module>\nNode: 'save/RestoreV2'\n"
               "{{function_node __inference_f_12}} {{function_node __inner_3}} Unable to read file [Op:RestoreV2]\n"
               "\t [[{{node save/RestoreV2}}]]\n\nOriginal stack trace for 'save/RestoreV2':\n  more")
    assert checkpoints.op_error_line(_Error(message)) == "Unable to read file"
    assert checkpoints.op_error_line(ValueError("no message attribute\nsecond line")) == "no message attribute"
    assert checkpoints.op_error_line(_Error("")) == "str() of the error, not its message"
    # nothing but wrapping before TF's stack trace: the error's type, not a line of the trace
    assert checkpoints.op_error_line(_Error("Graph execution error:\n\nOriginal stack trace for 'x':\n  y")) == "_Error"
    assert checkpoints.op_error_line(ValueError()) == "ValueError"


def test_resolve_checkpoint_takes_a_prefix_any_of_its_files_or_a_folder(tmp_path):
    ckpt_2, ckpt_4 = _saved(tmp_path / "model", [2, 4])
    assert checkpoints.resolve_checkpoint(str(tmp_path / "model")) == ckpt_4
    for suffix in ("", ".index", ".data-00000-of-00001", ".meta"):
        assert checkpoints.resolve_checkpoint(ckpt_2 + suffix) == ckpt_2
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as error:
        checkpoints.resolve_checkpoint(str(tmp_path / "empty"))
    assert str(error.value) == f"--checkpoint_path {tmp_path / 'empty'}: a folder with no checkpoint in it"


def test_readable_checkpoints_skips_a_damaged_one_and_names_every_one_when_none_reads(tmp_path, caplog):
    model_dir = tmp_path / "model"
    ckpt_2, ckpt_4 = _saved(model_dir, [2, 4])
    _cut_in_half(model_dir / INDEX_2)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert checkpoints.readable_checkpoints(str(model_dir)) == [ckpt_4]
    problem_2 = checkpoints.checkpoint_problem(ckpt_2)
    assert problem_2 == (f"{model_dir / INDEX_2}: corrupt or unreadable checkpoint index "
                         f"(not an sstable (bad magic number))")  # TF's reason
    assert [r.getMessage() for r in caplog.records] == [f"{problem_2}; skipped"]
    _cut_in_half(model_dir / INDEX_4)
    with pytest.raises(UserError) as error:
        checkpoints.readable_checkpoints(str(model_dir))
    assert str(error.value) == (
        f"{model_dir}: no readable checkpoint: {problem_2}; {checkpoints.checkpoint_problem(ckpt_4)}. To start "
        f"afresh, move the model.ckpt-* files and the state file 'checkpoint' out of it; or pass --checkpoint_path")


class _FullDisk:
    """A Saver that writes part of step 6's files, then finds the disk full."""

    def save(self, session, prefix, global_step, **kwargs):
        with open(f"{prefix}-{global_step}.data-00000-of-00001", "wb") as f:
            f.write(b"part")
        raise OSError(28, "No space left on device")


def test_a_save_that_fails_removes_its_files_and_names_the_checkpoint_kept(tmp_path):
    import tensorflow as tf
    model_dir = tmp_path / "model"
    _, ckpt_4 = _saved(model_dir, [2, 4])
    before = _snapshot(model_dir)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        with pytest.raises(UserError) as error:
            checkpoints.save_checkpoint(_FullDisk(), session, str(model_dir), 6, keep_max=5)
    assert str(error.value) == (f"{model_dir / 'model.ckpt-6'}: not saved (No space left on device); the newest "
                                f"complete checkpoint is kept: {ckpt_4}")
    assert _snapshot(model_dir) == before
    (tmp_path / "fresh").mkdir()
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        with pytest.raises(UserError) as error:
            checkpoints.save_checkpoint(_FullDisk(), session, str(tmp_path / "fresh"), 1, keep_max=5)
    assert str(error.value) == (f"{tmp_path / 'fresh' / 'model.ckpt-1'}: not saved (No space left on device); the "
                                f"newest complete checkpoint is kept: none (none was written yet)")
    assert os.listdir(tmp_path / "fresh") == []


def test_a_save_writes_the_index_and_data_files_and_the_state_file_only(tmp_path):
    """No .meta graph (the runner rebuilds the graph from the model), and no TF state file of its own."""
    _saved(tmp_path / "model", [3])
    assert sorted(os.listdir(tmp_path / "model")) == ["checkpoint", "model.ckpt-3.data-00000-of-00001",
                                                      "model.ckpt-3.index"]
    assert (tmp_path / "model" / "checkpoint").read_text() == ('model_checkpoint_path: "model.ckpt-3"\n'
                                                               'all_model_checkpoint_paths: "model.ckpt-3"\n')


class _Failing:
    """A Saver whose save raises ``error`` before writing anything."""

    def __init__(self, error):
        self.error = error

    def save(self, session, prefix, global_step, **kwargs):
        raise self.error


def test_a_failed_save_names_tfs_reason_or_the_os_errors_whole_and_the_newest_of_several_kept(tmp_path):
    import tensorflow as tf
    model_dir = tmp_path / "model"
    *_, ckpt_6 = _saved(model_dir, [2, 4, 6])
    before = _snapshot(model_dir)
    wrapped = ("Graph execution error:\n\nDetected at node 'save/SaveV2':\n"
               "{{function_node __inner_1}} model.ckpt-8_temp/part-00000: Disk quota exceeded [Op:SaveV2]\n"
               "\t [[{{node save/SaveV2}}]]")
    for error, reason in ((tf.errors.ResourceExhaustedError(None, None, wrapped),
                           "model.ckpt-8_temp/part-00000: Disk quota exceeded"),
                          (OSError("the volume went away"), "the volume went away"),  # no strerror: its text
                          (OSError(30, "Read-only file system"), "Read-only file system")):
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            with pytest.raises(UserError) as error_info:
                checkpoints.save_checkpoint(_Failing(error), session, str(model_dir), 8, keep_max=5)
        assert str(error_info.value) == (f"{model_dir / 'model.ckpt-8'}: not saved ({reason}); the newest complete "
                                         f"checkpoint is kept: {ckpt_6}")
        assert _snapshot(model_dir) == before


def test_a_failed_save_of_a_step_the_state_file_names_leaves_its_files(tmp_path):
    """A run resumed before its newest checkpoint saves that step again: failing, it must not remove the
    files of the checkpoint that the state file still names."""
    import tensorflow as tf
    model_dir = tmp_path / "model"
    _, ckpt_4 = _saved(model_dir, [2, 4])
    before = _snapshot(model_dir)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        with pytest.raises(UserError) as error_info:
            checkpoints.save_checkpoint(_Failing(OSError(28, "No space left on device")), session, str(model_dir), 4,
                                        keep_max=5)
    assert str(error_info.value) == (f"{ckpt_4}: not saved (No space left on device); the newest complete checkpoint "
                                     f"is kept: {ckpt_4}")
    assert _snapshot(model_dir) == before and checkpoints.checkpoint_problem(ckpt_4) is None


def test_newest_readable_falls_back_with_a_warning_each_and_names_every_one_when_none_reads(tmp_path, caplog):
    model_dir = tmp_path / "model"
    ckpt_2, ckpt_4, ckpt_6 = _saved(model_dir, [2, 4, 6])
    _cut_in_half(model_dir / "model.ckpt-6.index")
    os.remove(model_dir / DATA_4)
    problem_6, problem_4 = checkpoints.checkpoint_problem(ckpt_6), checkpoints.checkpoint_problem(ckpt_4)
    # no single .data file left: the problem names the pattern of the checkpoint's data files, and TF's reason
    assert problem_4 == (f"{ckpt_4}.data-*: corrupt or unreadable checkpoint data (tensor 'v': "
                         f"{model_dir / DATA_4}; No such file or directory)")
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert checkpoints.newest_readable(str(model_dir)) == ckpt_2
    assert [r.getMessage() for r in caplog.records] == [f"{problem_6}; falling back to {ckpt_2}",
                                                        f"{problem_4}; falling back to {ckpt_2}"]
    _cut_in_half(model_dir / INDEX_2)
    with pytest.raises(UserError) as error:
        checkpoints.newest_readable(str(model_dir))
    assert str(error.value) == (
        f"{model_dir}: no readable checkpoint: {problem_6}; {problem_4}; {checkpoints.checkpoint_problem(ckpt_2)}. "
        f"To start afresh, move the model.ckpt-* files and the state file 'checkpoint' out of it; or pass "
        f"--checkpoint_path")


@pytest.mark.parametrize("text", ["", 'all_model_checkpoint_paths: "model.ckpt-2"\n'], ids=["empty", "no latest"])
def test_a_state_file_naming_no_latest_checkpoint_is_unreadable(tmp_path, text):
    """TF raises (not logs) for a state file that parses but names no model_checkpoint_path."""
    model_dir = tmp_path / "model"
    _saved(model_dir, [2])
    (model_dir / "checkpoint").write_text(text)
    with pytest.raises(UserError) as error:
        checkpoints.list_checkpoints(str(model_dir))
    assert str(error.value) == (f"{model_dir / 'checkpoint'}: unreadable checkpoint state file; delete it to start "
                                f"afresh, or pass --checkpoint_path")


def test_read_checkpoint_gives_the_shapes_or_one_error_with_tfs_reason(tmp_path):
    ckpt_2, ckpt_4 = _saved(tmp_path / "model", [2, 4])
    assert checkpoints.read_checkpoint(ckpt_2) == {"v": [2]}
    _cut_in_half(tmp_path / "model" / INDEX_4)
    with pytest.raises(UserError) as error:
        checkpoints.read_checkpoint(ckpt_4)
    assert str(error.value) == f"{ckpt_4}: corrupt or unreadable checkpoint (not an sstable (bad magic number))"


def test_the_state_files_latest_counts_and_an_absolute_name_elsewhere_is_kept(tmp_path):
    """The latest checkpoint is listed last even when all_model_checkpoint_paths leaves it out; a name
    whose files exist where it points (an absolute path into another folder) is taken as it is."""
    model_dir = tmp_path / "model"
    ckpt_2, ckpt_4 = _saved(model_dir, [2, 4])
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-4"\n'
                                          'all_model_checkpoint_paths: "model.ckpt-2"\n')
    assert checkpoints.list_checkpoints(str(model_dir)) == [ckpt_2, ckpt_4]
    assert checkpoints.latest_checkpoint(str(model_dir)) == ckpt_4
    (other,) = _saved(tmp_path / "other", [6])
    (model_dir / "checkpoint").write_text(f'model_checkpoint_path: "{other}"\n'
                                          f'all_model_checkpoint_paths: "model.ckpt-2"\n'
                                          f'all_model_checkpoint_paths: "{other}"\n')
    assert checkpoints.list_checkpoints(str(model_dir)) == [ckpt_2, other]


@pytest.mark.parametrize("gone", ["*", "data-*", "index"], ids=["every file", "the data", "the index"])
def test_listing_and_latest_skip_a_named_checkpoint_whose_files_are_gone(tmp_path, gone):
    from common.convert import listing

    model_dir = tmp_path / "model"
    ckpt_2, ckpt_4 = _saved(model_dir, [2, 4])
    for name in glob.glob(glob.escape(ckpt_4) + "." + gone):
        os.remove(name)
    assert 'model_checkpoint_path: "model.ckpt-4"' in (model_dir / "checkpoint").read_text()  # still named
    assert checkpoints.list_checkpoints(str(model_dir)) == [ckpt_2]
    assert checkpoints.latest_checkpoint(str(model_dir)) == ckpt_2
    assert listing(str(model_dir))[0] == f"{ckpt_2}: TF checkpoint, 1 variables"  # zoo convert model_dir


def test_a_checkpoint_lacking_one_of_its_data_shards_is_not_there(tmp_path):
    (ckpt_2,) = _saved(tmp_path / "model", [2])
    assert checkpoints.files_present(ckpt_2)
    os.rename(f"{ckpt_2}.data-00000-of-00001", f"{ckpt_2}.data-00000-of-00002")  # shard 1 of 2 missing
    assert not checkpoints.files_present(ckpt_2)
    (tmp_path / "model" / "model.ckpt-2.data-00001-of-00002").write_bytes(b"")
    assert checkpoints.files_present(ckpt_2)
    assert not checkpoints.files_present(str(tmp_path / "model" / "model.ckpt-3"))

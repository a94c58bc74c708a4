"""``zoo port migrate``: a folder in the vendor's style (tests/fixtures/vendor_zoo) copied with
only its imports and TF 2.2 names rewritten, each change reported, every other byte kept."""

import hashlib
import os
import subprocess
import sys

import pytest

from common import zoo_cli
from common.port.migrate import REPORT, TF_ESTIMATOR_IMPORT, migrate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR = os.path.join(ROOT, "tests", "fixtures", "vendor_zoo", "fc_tiny")


def _tree(folder):
    """{relative path: sha1} of every file under folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha1(f.read()).hexdigest()
    return out


@pytest.mark.parametrize("framework", ["pytorch", "tf"])
def test_every_line_not_reported_is_byte_identical(framework, tmp_path):
    src = os.path.join(VENDOR, framework)
    before = _tree(src)
    migration = migrate(src, str(tmp_path / "out"))
    assert _tree(src) == before  # SRC untouched
    dest = tmp_path / "out"
    changed = {(c.file, c.line): c for c in migration.changes}
    for rel in before:
        with open(os.path.join(src, rel), "rb") as f:
            old = f.read()
        new = (dest / rel).read_bytes()
        if not rel.endswith(".py"):
            assert new == old, rel
            continue
        old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
        i = 0  # the SRC line a DEST line comes from
        for number, line in enumerate(new_lines, 1):
            change = changed.get((rel, number))
            if change is not None and change.before == "":  # an added line
                assert line.decode().rstrip("\r\n") == change.after
                continue
            if change is not None:
                assert old_lines[i].decode().rstrip("\r\n") == change.before
                assert line.decode().rstrip("\r\n") == change.after
                assert change.src_line == i + 1
            else:
                assert line == old_lines[i], f"{rel}:{number} changed without a report"
            i += 1
        assert i == len(old_lines)
    assert not any("modelzoo" in c.after for c in migration.changes)
    assert (dest / REPORT).read_text() == migration.render()


def test_the_rewrites_of_each_kind(tmp_path):
    pt = migrate(os.path.join(VENDOR, "pytorch"), str(tmp_path / "pt"))
    tf = migrate(os.path.join(VENDOR, "tf"), str(tmp_path / "tf"))
    after = {(c.file, c.before.strip()): c.after.strip() for c in pt.changes + tf.changes}
    assert after[("model.py", "from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel")] == \
        "from common.pytorch.base_model import PyTorchBaseModel"
    assert after[("data.py", "from modelzoo.common.pytorch import cb_model as cm")] == \
        "from common.pytorch import cb_model as cm"
    assert after[("run.py", "from modelzoo.fc_tiny.pytorch.model import MNISTModel")] == "from .model import MNISTModel"
    assert after[("run.py", "from modelzoo.common.tf.run_utils import (")] == "from common.tf.run_utils import ("
    assert after[("model.py", "from tensorflow.keras.mixed_precision.experimental import Policy")] == \
        "from tensorflow.keras.mixed_precision import Policy"
    assert after[("model.py", "dtype = Policy(\"mixed_float16\", loss_scale=None)")] == \
        "dtype = Policy(\"mixed_float16\")"
    assert after[("model.py", "tf.keras.mixed_precision.experimental.set_policy(dtype)")] == \
        "tf.keras.mixed_precision.set_global_policy(dtype)"
    assert after[("data.py", "training = mode == tf.estimator.ModeKeys.TRAIN")] == \
        "training = mode == tf_estimator.ModeKeys.TRAIN"
    added = [c for c in tf.changes if c.before == ""]
    assert {c.file for c in added} == {"data.py", "model.py", "run.py"}
    assert all(c.after == TF_ESTIMATOR_IMPORT for c in added)
    assert after[("utils.py", "from cerebras.pb.stack.full_pb2 import FullConfig")] == \
        "from common.tf.stack_config import FullConfig"  # the vendor compiler's settings, taken and ignored
    assert pt.left + tf.left == []


def test_what_it_cannot_rewrite_is_listed_with_the_reason(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.py").write_text("import tensorflow as tf\n"
                                  "from modelzoo.common.tf.layers.DenseLayer import DenseLayer\n"
                                  "from modelzoo.bert.tf.utils import load\n"
                                  "x = tf.estimator.Estimator\n")
    migration = migrate(str(src), str(tmp_path / "out"))
    assert migration.changes == []
    assert [(x.line, x.why.split(":")[0]) for x in migration.left] == [
        (2, "this zoo has no such module under common/"),
        (3, "a module of another folder of the vendor's zoo (modelzoo.bert.tf.utils)"),
        (4, "tf.estimator is gone from TF 2.16 on, and common.tf.estimator has not this name")]
    assert (tmp_path / "out" / "model.py").read_bytes() == (src / "model.py").read_bytes()


def test_the_command_refuses_an_existing_dest_and_runs_as_a_module(tmp_path, capsys):
    src = os.path.join(VENDOR, "pytorch")
    dest = tmp_path / "out"
    assert zoo_cli.main(["port", "migrate", src, "--out", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "run.py:6: the vendor's common modules are this zoo's common" in out
    assert "+    from common.pytorch.run import run" in out
    listing = sorted(os.listdir(dest))
    assert zoo_cli.main(["port", "migrate", src, "--out", str(dest)]) == 2
    assert capsys.readouterr().err == f"error: {dest} exists: give a new folder to --out (the migration never " \
                                      f"overwrites)\n"
    assert sorted(os.listdir(dest)) == listing
    assert zoo_cli.main(["port", "migrate", src, "--out", os.path.join(src, "copy")]) == 2
    assert "is inside" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-m", "common.port", "migrate", src, "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m" / REPORT).read_text() == (dest / REPORT).read_text().replace(str(dest), str(tmp_path / "m"))


def test_line_endings_and_untouched_bytes_are_kept(tmp_path):
    src = tmp_path / "src"
    (src / "configs").mkdir(parents=True)
    source = (b"import tensorflow as tf\r\n"
              b"from modelzoo.common.tf.estimator.cs_estimator_spec import CSEstimatorSpec\r\n"
              b"MODE = tf.estimator.ModeKeys.EVAL  # caf\xc3\xa9\r\n"
              b"x = 1")
    (src / "model.py").write_bytes(source)
    (src / "configs" / "params.yaml").write_bytes(b"runconfig:\r\n  cs_ip: 1.2.3.4\r\n")
    migration = migrate(str(src), str(tmp_path / "out"))
    assert (tmp_path / "out" / "model.py").read_bytes() == (
        b"import tensorflow as tf\r\n"
        + TF_ESTIMATOR_IMPORT.encode() + b"\r\n"
        b"from common.tf.estimator.cs_estimator_spec import CSEstimatorSpec\r\n"
        b"MODE = tf_estimator.ModeKeys.EVAL  # caf\xc3\xa9\r\n"
        b"x = 1")
    assert [(c.line, c.src_line) for c in migration.changes] == [(2, 1), (3, 2), (4, 3)]
    assert (tmp_path / "out" / "configs" / "params.yaml").read_bytes() == (src / "configs" / "params.yaml").read_bytes()

"""The ``zoo`` command: every subcommand, its --help, and one error line for bad input.

Each test calls ``main(argv)`` in this process. ``zoo compile`` and ``zoo train`` are tested
with the subprocess that runs a folder replaced by a stand-in (what they run for real is
``tox -e compile`` and ``tox -e train``); everything else runs as a user would run it.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from common import zoo, zoo_cli
from common.data import write_fake_mnist

ROOT = zoo.ROOT
GALLERY = os.path.join(ROOT, "tests", "port_gallery")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")


def run(capsys, *argv):
    code = zoo_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_is_the_console_script_of_the_package():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"zoo": "common.zoo_cli:main"}


COMMANDS = [["list"], ["info"], ["new"], ["prepare"], ["compile"], ["train"], ["convert"], ["config"],
            ["config", "check"], ["port"], ["port", "check"], ["completion"], []]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "zoo")
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        zoo_cli.main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: zoo {' '.join(argv)}".rstrip()) and len(out.splitlines()) > 3


def test_no_command_prints_the_commands_and_fails(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "port" in err and "convert" in err


def test_a_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        zoo_cli.main(["lsit"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'lsit'" in err


# --- list, info ---------------------------------------------------------------------------------

def test_list_names_every_folder_with_its_configs(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == zoo_cli.model_names()
    for line in lines:  # every folder has its two standard configs (listed in name order among others)
        configs = line.split("configs: ")[1].split("  ")[0].split(", ")
        assert {"params", "params_tiny"} <= set(configs) and configs == sorted(configs), line
    code, out, _ = run(capsys, "list", "--names", "--framework", "tf")
    assert "tf/mnist" in out.split() and all(name.startswith("tf/") for name in out.split())


def test_info_gives_configs_params_and_the_last_compile_estimate(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "info", "pytorch/mnist")
    assert code == 0
    assert "params_tiny.yaml: train batch 32, max_steps 4, model_dir model_dir/pytorch_mnist_tiny" in out
    assert "model.hidden_sizes = [500, 300]" in out and "estimate    none yet" in out
    # a compile report of the folder under ./model_dir is its last estimate
    report = tmp_path / "model_dir" / "pytorch_mnist_tiny" / "compile" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text('{"num_params": 25818, "execution_mode": "pipelined", "profile": "wse2", '
                      '"performance": {"samples_per_s": 1234.5, "batch_size": 32, "bound_by": "input"}}')
    code, out, _ = run(capsys, "info", "pytorch/mnist")
    assert "size        25,818 parameters" in out
    assert "1,234 samples/s at batch 32, bound by input, pipelined on wse2" in out


def test_info_of_an_unknown_model_is_one_line(capsys):
    code, out, err = run(capsys, "info", "no_such_model")
    assert code == 2 and out == ""
    assert err == f"error: no model 'no_such_model': give one of {', '.join(zoo_cli.model_names())}, or the path " \
                  f"of a folder with a run.py\n"
    assert "tf/mnist, " in err and "pytorch/mnist, " in err


# --- new ------------------------------------------------------------------------------------------

def test_new_copies_a_folder_with_its_names_and_model_dir_adjusted(capsys, tmp_path):
    dest = tmp_path / "my_cnn"
    code, out, _ = run(capsys, "new", "my_cnn", "--from", "pytorch/mnist", "--dest", str(dest))
    assert code == 0 and "model_dir/pytorch_my_cnn" in out
    # byte-code caches of runs of the original are not copied
    assert sorted(os.listdir(dest)) == sorted(n for n in os.listdir(os.path.join(ROOT, "pytorch", "mnist"))
                                              if n != "__pycache__")
    config = (dest / "configs" / "params.yaml").read_text()
    assert "pytorch_mnist" not in config and "model_dir/pytorch_my_cnn" in config
    readme = (dest / "README.md").read_text()
    assert "zoo new my_cnn --from pytorch/mnist" in readme
    original = (Path(ROOT) / "pytorch" / "mnist" / "README.md").read_text()
    assert "98.06 %" in original and "98.06 %" not in readme  # the original's results stay behind (not a path's digits)
    # the copy is a ready folder: its configs load against its own defaults and the reader finds nothing
    code, out, _ = run(capsys, "config", "check", str(dest / "configs" / "params_tiny.yaml"))
    assert code == 0 and "model_dir model_dir/pytorch_my_cnn_tiny" in out
    code, out, _ = run(capsys, "port", "check", str(dest), "--no-capture")
    assert code == 0 and "ready: no findings" in out


def test_new_derives_a_model_dir_a_config_set(capsys, tmp_path):
    source = tmp_path / "vendor"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "vendor_tf"), source)
    with open(source / "configs" / "params.yaml", "a") as f:
        f.write("  model_dir: ./model_dir/vendor\n")  # under runconfig, the file's last section
    code, _, _ = run(capsys, "new", "mine", "--from", str(source), "--dest", str(tmp_path / "mine"))
    assert code == 0
    config = (tmp_path / "mine" / "configs" / "params.yaml").read_text()
    assert "model_dir: ./model_dir/vendor" not in config and "# model_dir: derived, model_dir/tf_mine" in config


@pytest.mark.parametrize("argv, message", [
    (["new", "my net", "--from", "pytorch/mnist"], "use letters, digits and underscores"),
    (["new", "x", "--from", "mnist"], "--from mnist names 2 folders"),
    (["new", "mnist", "--from", "pytorch/mnist"], "already exists"),
])
def test_new_refuses_with_one_line(argv, message, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


# --- prepare --------------------------------------------------------------------------------------

def test_prepare_lists_the_data_sets_and_runs_one(capsys, tmp_path):
    code, out, _ = run(capsys, "prepare")
    assert code == 0 and "\nmnist " in out and "datasets/prepare_mnist.py" in out
    assert out.startswith("bert ") and "datasets/prepare_bert.py" in out
    listed = out.splitlines()[:-1]  # the descriptions start in one column, after the longest name
    assert len({len(line) - len(line.split("  ", 1)[1].lstrip()) for line in listed}) == 1, listed
    source = tmp_path / "source"
    write_fake_mnist(source, n_train=20, n_test=10, seed=0)
    code, out, _ = run(capsys, "prepare", "mnist", "--source", str(source / "MNIST" / "raw"),
                       "--data_dir", str(tmp_path / "data"))
    assert code == 0 and "MNIST ready (20 train / 10 test)" in out
    assert sorted(os.listdir(tmp_path / "data" / "MNIST" / "raw")) == sorted(os.listdir(source / "MNIST" / "raw"))


def test_prepare_bad_input_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "prepare", "imagenet")
    assert code == 2 and err == "error: no data set 'imagenet' to prepare: bert, gpt2, imagefolder, mnist, seq2seq, tfds_mnist, vendor_bert, vendor_bert_classifier, vendor_bert_ner, vendor_bert_qa, vendor_bert_summarization, vendor_gpt2, vendor_t5, vendor_transformer, vendor_unet (datasets/README.md)\n"
    code, _, err = run(capsys, "prepare", "mnist", "--source", str(tmp_path), "--data_dir", str(tmp_path / "d"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


# --- compile, train -------------------------------------------------------------------------------

class _Finished:
    def __init__(self, returncode, stdout=""):
        self.returncode, self.stdout, self.stderr = returncode, stdout, ""


def test_compile_runs_both_stages_of_the_named_folders_and_keeps_the_report(capsys, monkeypatch, tmp_path):
    calls = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(zoo, "run_folder", lambda folder, flags, model_dir: calls.append(
        (os.path.relpath(folder, ROOT), flags, model_dir)) or _Finished(0))
    code, out, _ = run(capsys, "compile", "pytorch/mnist")
    assert code == 0
    assert calls == [("pytorch/mnist", ["--validate_only"], os.path.join("model_dir", "pytorch_mnist_tiny")),
                     ("pytorch/mnist", ["--compile_only"], os.path.join("model_dir", "pytorch_mnist_tiny"))]
    assert "report: model_dir/pytorch_mnist_tiny/compile/report.txt" in out
    assert out.endswith("zoo compile: 1 passed, 0 failed\n")


def test_train_needs_the_loss_to_fall_on_cpu_and_emulator(capsys, monkeypatch):
    logs = iter(["| Train Step=1 Loss=2.3\n| Train Step=2 Loss=2.1", "| Train Step=1 Loss=2.3\n| Train Step=2 Loss=2.4"])
    monkeypatch.setattr(zoo, "run_folder", lambda folder, flags, model_dir: _Finished(0, next(logs)))
    code, out, _ = run(capsys, "train", "mnist", "--framework", "tf")
    assert code == 1
    assert "ok   tf/mnist --mode train --device cpu (0.0s) loss 2.3000 -> 2.1000\n" in out
    assert "FAIL tf/mnist --mode train --device emulator (0.0s) the loss did not fall: [2.3, 2.4]" in out


def test_compile_of_an_unknown_model_is_one_line(capsys):
    code, _, err = run(capsys, "compile", "pytorch/no_such_model")
    assert code == 2 and err.startswith("error: no model 'pytorch/no_such_model'")


def test_python_m_common_zoo_still_works():
    result = subprocess.run([sys.executable, "-m", "common.zoo", "list"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.split() == zoo_cli.model_names()


# --- convert --------------------------------------------------------------------------------------

@needs_torch
def test_convert_between_mdl_safetensors_and_state_dict(capsys, tmp_path):
    import torch

    weights = {"fc.weight": torch.randn(3, 4), "fc.bias": torch.randn(3), "emb": torch.randn(2, 2).bfloat16(),
               "steps": torch.tensor([1, 2], dtype=torch.int64)}
    torch.save({"model": weights, "optimizer": {}, "lr_scheduler": {}, "global_step": 7}, tmp_path / "c.mdl")
    code, out, _ = run(capsys, "convert", str(tmp_path / "c.mdl"))
    assert code == 0 and "zoo PyTorch checkpoint, step 7, 4 tensors, 21 values" in out
    assert "  emb  [2, 2]  bfloat16" in out
    for src, dst in (("c.mdl", "w.safetensors"), ("w.safetensors", "w.pt"), ("w.pt", "back.mdl")):
        code, _, _ = run(capsys, "convert", str(tmp_path / src), str(tmp_path / dst))
        assert code == 0
    back = torch.load(tmp_path / "back.mdl", weights_only=True)
    assert back["global_step"] == 0 and back["optimizer"] == {}
    assert set(back["model"]) == set(weights)
    for name, value in weights.items():
        assert back["model"][name].dtype == value.dtype and torch.equal(back["model"][name], value)


@needs_torch
def test_safetensors_layout_is_the_formats(tmp_path):
    import json
    import struct

    import torch

    from common.convert import save_safetensors

    save_safetensors({"b": torch.tensor([1.0, 2.0]), "a": torch.tensor([[3]], dtype=torch.int32)},
                     str(tmp_path / "x.safetensors"), {"k": "v"})
    data = (tmp_path / "x.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    assert size % 8 == 0
    assert header == {"__metadata__": {"k": "v"},
                      "a": {"dtype": "I32", "shape": [1, 1], "data_offsets": [0, 4]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    assert data[8 + size:] == struct.pack("<i", 3) + struct.pack("<2f", 1.0, 2.0)


@pytest.mark.parametrize("src, dst, message", [
    ("w.pt", "model.ckpt-5", "not a readable PyTorch file"),
    ("w.pt", "out.txt", "not a checkpoint the zoo knows"),
    ("missing.mdl", "out.pt", "missing.mdl: no such file"),
    ("bad.safetensors", "out.pt", "not a readable safetensors file"),
])
def test_convert_refuses_with_one_line(src, dst, message, capsys, tmp_path):
    (tmp_path / "w.pt").write_bytes(b"")
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    if message == "not a readable PyTorch file" and importlib.util.find_spec("torch") is None:
        message = "reading a PyTorch checkpoint needs torch, which is not installed here"
    code, _, err = run(capsys, "convert", str(tmp_path / src), str(tmp_path / dst))
    assert code == 2 and err.count("\n") == 1 and message in err


@pytest.mark.skipif(not (HAVE_TF and HAVE_TORCH), reason="needs TensorFlow and torch")
def test_convert_lists_a_tf_checkpoint_and_writes_its_variables(capsys, tmp_path):
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        kernel = tf.compat.v1.get_variable("dense/kernel", initializer=np.arange(6, dtype=np.float32).reshape(2, 3))
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(session, str(tmp_path / "model.ckpt"), global_step=4)
    del kernel
    code, out, _ = run(capsys, "convert", str(tmp_path / "model.ckpt-4"))
    assert code == 0 and "TF checkpoint, 2 variables" in out and "  dense/kernel  [2, 3]  float32" in out
    code, out, _ = run(capsys, "convert", str(tmp_path), str(tmp_path / "w.safetensors"))
    assert code == 0 and "2 variables" in out
    from common.convert import load_safetensors

    tensors, metadata = load_safetensors(str(tmp_path / "w.safetensors"))
    assert tensors["dense/kernel"].tolist() == [[0, 1, 2], [3, 4, 5]] and metadata["framework"] == "tf"
    code, _, err = run(capsys, "convert", str(tmp_path / "model.ckpt-4"), str(tmp_path / "w.pt"))
    assert code == 2 and "the zoo does not define" in err


# --- config check ---------------------------------------------------------------------------------

def test_config_check_loads_either_defaults_form(capsys):
    code, out, _ = run(capsys, "config", "check", os.path.join(ROOT, "tf", "mnist", "configs", "params_tiny.yaml"))
    assert code == 0 and "loads against tf/mnist's utils.default_params (the zoo's form)" in out
    vendor = os.path.join(ROOT, "tests", "fixtures", "vendor_tf", "configs", "params.yaml")
    code, out, _ = run(capsys, "config", "check", vendor, "--show", "model.filters=4")
    assert code == 0 and "utils.set_defaults (the vendor's form)" in out
    assert "filters: 4" in out and "num_shards: 1" in out  # the override, and what set_defaults filled in


def test_config_check_names_the_key_the_file_and_its_line(capsys):
    bad = os.path.join(GALLERY, "zoo_partial_pytorch", "configs", "params_small.yaml")
    code, out, _ = run(capsys, "config", "check", bad)
    assert code == 1
    assert f"{bad}:4: unknown key 'model.chanels' (did you mean 'model.channels'?)" in out


def test_config_check_bad_input_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "config", "check", str(tmp_path / "none.yaml"))
    assert code == 2 and err == f"error: {tmp_path / 'none.yaml'}: no such params file\n"
    (tmp_path / "p.yaml").write_text("model: {}\n")
    code, _, err = run(capsys, "config", "check", str(tmp_path / "p.yaml"))
    assert code == 2 and "say whose defaults it goes with, --model FOLDER" in err


# --- port check -----------------------------------------------------------------------------------

def test_port_check_exit_statuses(capsys, tmp_path):
    code, out, _ = run(capsys, "port", "check", os.path.join(GALLERY, "zoo_ready_pytorch"), "--no-capture")
    assert code == 0 and out.splitlines()[-1].startswith("ready: no findings")
    code, out, _ = run(capsys, "port", "check", os.path.join(GALLERY, "torch_mnist_example", "main.py"),
                       "--no-capture")
    assert code == 1 and "main.py:91: datasets.MNIST(" in out and "fix: " in out
    (tmp_path / "broken.py").write_text("import torch\ndef f(:\n")
    (tmp_path / "plain.py").write_text("print('hello')\n")
    for path, message in ((tmp_path / "nowhere", "no such file or folder"),
                          (tmp_path / "broken.py", "broken.py:2: cannot parse: invalid syntax"),
                          (tmp_path / "plain.py", "imports neither torch nor tensorflow/keras")):
        code, out, err = run(capsys, "port", "check", str(path))
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err


# --- completion -----------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_bash_completion_completes_commands_options_and_models(capsys, tmp_path):
    code, script, _ = run(capsys, "completion", "bash")
    assert code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "zoo").write_text(f"#!/bin/sh\nexec {sys.executable} -m common.zoo_cli \"$@\"\n")
    (bin_dir / "zoo").chmod(0o755)
    (tmp_path / "zoo.bash").write_text(script)
    probe = "; ".join(f'COMP_WORDS=({words}); COMP_CWORD={cword}; _zoo_complete; echo "${{COMPREPLY[*]}}"'
                      for words, cword in (("zoo po", 1), ("zoo port check --no", 3), ("zoo info pytorch/mn", 2)))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(["bash", "-c", f"source {tmp_path / 'zoo.bash'}; {probe}"], capture_output=True,
                            text=True, env=env)
    assert result.stdout.splitlines() == ["port", "--no-capture", "pytorch/mnist"], result.stderr
    code, script, _ = run(capsys, "completion", "zsh")
    assert script.startswith("autoload -U +X bashcompinit && bashcompinit\n")


def test_config_check_and_info_take_a_folder_that_passes_run_no_defaults(capsys, tmp_path):
    """As the vendor's gpt2: run() is given no default_params_fn, and utils.py has none (or is absent)."""
    folder = tmp_path / "no_defaults"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "vendor_pytorch"), folder)
    (folder / "utils.py").write_text("def get_input_dtype(to_float16):\n    return 'float32'\n")
    config = str(folder / "configs" / "params.yaml")
    code, out, _ = run(capsys, "config", "check", config, "--show", "runconfig.max_steps=3")
    assert code == 0 and f"loads against {folder}'s no defaults function (the file as written)" in out
    assert "max_steps: 3" in out
    (folder / "utils.py").unlink()
    code, out, _ = run(capsys, "info", str(folder))
    assert code == 0 and "defaults    no defaults function (run() is given none: the configs load as" in out
    code, out, _ = run(capsys, "config", "check", config)
    assert code == 0 and f"loads against {folder}'s no defaults function" in out

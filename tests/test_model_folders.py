"""Every model folder has the same skeleton, imports beside its siblings, and works when copied."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from common import zoo
from common.folder import load_run_module

FOLDERS = zoo.model_folders()
HAVE = {"tf": importlib.util.find_spec("tensorflow") is not None,
        "pytorch": importlib.util.find_spec("torch") is not None}


def framework_of(folder):
    return os.path.basename(os.path.dirname(folder))


def test_the_zoo_has_models_of_both_frameworks():
    assert {framework_of(f) for f in FOLDERS} == {"tf", "pytorch"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: os.path.relpath(f, zoo.ROOT))
def test_folder_has_every_file(folder):
    assert zoo.missing_files(folder) == []
    assert not os.path.exists(os.path.join(folder, "__init__.py")), "a model folder is not a package"


def test_every_folder_imports_in_one_process_without_clashes():
    if not all(HAVE.values()):
        pytest.skip("needs both frameworks installed")
    loaded = [load_run_module(f) for f in FOLDERS]
    models = [m.model for m in loaded]
    assert len({m.__name__ for m in models}) == len(models)
    assert len({id(m) for m in models}) == len(models)
    for run_module in loaded:  # each run.py found its own siblings
        assert os.path.dirname(run_module.model.__file__) == os.path.dirname(run_module.__file__)


def test_no_datasets_package_shadows_hugging_face():
    # datasets/ holds preparation scripts and data; a package there would shadow HF `datasets`
    assert not os.path.exists(os.path.join(zoo.ROOT, "datasets", "__init__.py"))


@pytest.mark.parametrize("framework", ["pytorch", "tf"])
def test_a_copied_folder_runs_without_editing_imports(framework, tmp_path):
    if not HAVE[framework]:
        pytest.skip(f"{framework} not installed")
    copy = tmp_path / "elsewhere" / "my_model"
    shutil.copytree(os.path.join(zoo.ROOT, framework, "mnist"), copy)
    result = subprocess.run([sys.executable, str(copy / "run.py"), "--params", str(copy / "configs/params_tiny.yaml"),
                             "--max_steps", "2"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| Train Device=cpu Step=2" in result.stdout + result.stderr
    # no config names a model_dir: the copy's own is derived from its folder and config,
    # so it never resumes or overwrites the original's checkpoints
    assert sorted(os.listdir(tmp_path / "model_dir")) == [f"{framework}_my_model_tiny"]


def test_model_dir_is_derived_from_framework_folder_and_config():
    from common.cli import default_model_dir

    assert default_model_dir("pytorch", "/x/pytorch/mnist", "/x/pytorch/mnist/configs/params.yaml") == \
        os.path.join("model_dir", "pytorch_mnist")
    assert default_model_dir("tf", "/x/tf/mnist", "configs/params_tiny.yaml") == os.path.join("model_dir", "tf_mnist_tiny")
    assert default_model_dir("tf", "/x/tf/mine", "/y/big.yaml") == os.path.join("model_dir", "tf_mine_big")


TWINS = ("mnist", "resnet", "unet", "bert", "gpt2", "t5", "transformer", "llama")  # folders that exist in both frameworks with the same keys and defaults
TWIN_CONFIGS = [("mnist", "params.yaml"), ("mnist", "params_tiny.yaml"),
                ("resnet", "params.yaml"), ("resnet", "params_tiny.yaml"), ("resnet", "resnet18_cifar.yaml"),
                ("resnet", "resnet50_imagenet.yaml"),
                ("unet", "params.yaml"), ("unet", "params_tiny.yaml"), ("unet", "unet_512.yaml")]
TWIN_CONFIGS += [("bert", c) for c in (
    "params.yaml", "params_tiny.yaml", "bert_base_msl128.yaml", "bert_base_msl512.yaml", "bert_large_msl128.yaml",
    "bert_large_msl512.yaml", "classifier.yaml", "classifier_tiny.yaml", "classifier_sst2.yaml", "classifier_mnli.yaml")]
TWIN_CONFIGS += [("gpt2", c) for c in (
    "params.yaml", "params_tiny.yaml", "gpt2_small.yaml", "gpt2_medium.yaml", "gpt2_large.yaml", "gpt2_xl.yaml",
    "gpt3_xl.yaml", "gpt3_6p7b.yaml", "gptj_6b.yaml", "gpt2_small_msl2048.yaml")]
TWIN_CONFIGS += [("t5", c) for c in (
    "params.yaml", "params_tiny.yaml", "t5_small.yaml", "t5_base.yaml", "t5_3b.yaml", "t5_11b.yaml")]
TWIN_CONFIGS += [("llama", c) for c in (
    "params.yaml", "params_tiny.yaml", "llama2_7b.yaml", "llama2_13b.yaml", "llama2_70b.yaml", "llama3_8b.yaml",
    "mistral_7b.yaml")]
TWIN_CONFIGS += [("transformer", c) for c in (
    "params.yaml", "params_tiny.yaml", "transformer_base.yaml", "transformer_large.yaml")]


@pytest.mark.parametrize("name", TWINS)
def test_the_two_frameworks_twins_share_their_defaults(name):
    """pytorch/<name> and tf/<name> are deliberate twins: the same keys and defaults but for the
    input's parallelism (DataLoader num_workers, tf.data num_parallel_calls) and model_dir."""
    from common.folder import import_beside

    def defaults(framework):
        utils = import_beside(os.path.join(zoo.ROOT, framework, name, "utils.py"), "utils")
        params = utils.default_params()
        for section in ("train_input", "eval_input"):
            params[section].pop("num_workers", None)
            params[section].pop("num_parallel_calls", None)
        params["runconfig"].pop("model_dir", None)
        return params

    assert defaults("pytorch") == defaults("tf")


@pytest.mark.parametrize("name, config", TWIN_CONFIGS)
def test_the_twins_configs_agree(name, config):
    """Each config file of the twins gives the same effective params (but for the input's
    parallelism and the derived model_dir), so that their README figures compare."""
    from common.folder import import_beside
    from common.params import load_params, thaw

    def effective(framework):
        utils = import_beside(os.path.join(zoo.ROOT, framework, name, "utils.py"), "utils")
        params = thaw(load_params(os.path.join(zoo.ROOT, framework, name, "configs", config),
                                  utils.default_params(), model_dir=None))
        for section in ("train_input", "eval_input"):
            params[section].pop("num_workers", None)
            params[section].pop("num_parallel_calls", None)
        pretrained = params["model"].get("pretrained_checkpoint")
        if pretrained:  # each side fine-tunes its own pretraining run: model_dir/<framework>_bert
            params["model"]["pretrained_checkpoint"] = pretrained.replace(f"{framework}_", "<framework>_")
        return params

    assert effective("pytorch") == effective("tf")

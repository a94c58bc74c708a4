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


# Code that folders of one framework share without being framework twins: each folder stands
# alone when a user copies it, so these are copies, declared here and kept equal. The first
# folder holds the original; a change to one is made to every folder of its row.
COPIES = [
    ("pytorch", "data.py", ("check_meta", "seq2seq_dataset", "_dataloader"), ("t5", "transformer")),
    ("pytorch", "data.py", ("check_meta", "_dataloader"), ("gpt2", "llama")),
    ("pytorch", "data.py", ("collate",), ("gpt2", "llama", "t5", "transformer")),
    ("pytorch", "data.py", ("check_lengths",), ("bert", "gpt2", "llama")),
    ("pytorch", "model.py", ("lm_loss", "token_losses", "Perplexity", "NextTokenAccuracy"), ("gpt2", "llama")),
    ("tf", "data.py", ("check_meta",), ("t5", "transformer")),
    ("tf", "data.py", ("check_meta", "check_lengths"), ("gpt2", "llama")),
    ("tf", "data.py", ("shard_files",), ("gpt2", "bert", "llama", "t5", "transformer")),
    ("tf", "model.py", ("lm_loss", "token_losses", "lm_metrics", "rows"), ("gpt2", "llama")),
    ("tf", "model.py", ("exact_matches",), ("t5", "transformer")),
    ("tf", "model.py", ("layer_norm",), ("gpt2", "transformer")),
    ("tf", "model.py", ("compute_dtype",), ("gpt2", "bert", "llama", "t5", "transformer")),
    ("tf", "model.py", ("dropout",), ("gpt2", "bert", "t5", "transformer")),
]


def top_level_definitions(path: str) -> dict[str, str]:
    """The source text of each top-level function and class of the file ``path``, by name."""
    import ast

    with open(path, encoding="utf-8") as f:
        source = f.read()
    return {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("framework, filename, names, folders", COPIES,
                         ids=[f"{c[0]}-{'-'.join(c[3])}-{c[1]}" for c in COPIES])
def test_the_declared_copies_stay_equal(framework, filename, names, folders):
    original, *copies = (os.path.join(zoo.ROOT, framework, folder, filename) for folder in folders)
    expected = top_level_definitions(original)
    for copy in copies:
        found = top_level_definitions(copy)
        for name in names:
            assert name in expected and name in found, f"{name} is missing from {original} or {copy}"
            assert found[name] == expected[name], (
                f"{os.path.relpath(copy, zoo.ROOT)}: {name} differs from {os.path.relpath(original, zoo.ROOT)}'s "
                "(a declared copy: tests/test_model_folders.py COPIES; change every copy alike)")

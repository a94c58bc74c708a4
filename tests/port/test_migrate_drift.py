"""``zoo port migrate`` on third-party API drift in the vendor's zoo (R1.6, written for
huggingface_hub 0.0.12, transformers 4.9 and Keras-Preprocessing): the names since removed are
imported from where they are now (common.pytorch.hf_compat, importlib.metadata,
common.keras_text), the vendor's import-time version check loses the two packages its code never
imports, and a library not installed here is listed with its pip command. The fake checkout,
in the shape of the vendor's lines, is written here; so are the expected values of
common.keras_text, worked by hand from Keras-Preprocessing's documented behaviour."""

import importlib.util
import json
import os
import subprocess
import sys

import huggingface_hub
import pytest

from common.errors import UserError
from common.keras_text import Tokenizer, text_to_word_sequence
from common.ngrams import ngrams
from common.optional_module import optional_module
from common.port import migrate as migrate_module
from common.port.migrate import REPORT, migrate
from common.pytorch.hf_compat import HfFolder, Repository

TINY = "modelzoo/transformers/pytorch/tiny"
HUB = "modelzoo/transformers/pytorch/hub"
CHECKOUT = {
    "modelzoo/__init__.py": "",
    "modelzoo/transformers/__init__.py": "",
    "modelzoo/transformers/pytorch/__init__.py": "",
    f"{HUB}/__init__.py": "",
    f"{HUB}/file_utils.py": (
        "import os\n"
        "\n"
        "from huggingface_hub import HfApi, HfFolder, Repository\n"
        "from transformers.utils.versions import importlib_metadata\n"
        "\n"
        "NUMPY = importlib_metadata.version(\"numpy\")\n"
        "\n"
        "\n"
        "def token():\n"
        "    return HfFolder.get_token()\n"
        "\n"
        "\n"
        "def clone(path):\n"
        "    return Repository(path, clone_from=\"user/model\")\n"),
    f"{HUB}/versions_check.py": (
        "from importlib import metadata\n"
        "\n"
        "pkgs_to_check_at_runtime = \"python tqdm regex sacremoses packaging filelock numpy "
        "tokenizers\".split()\n"
        "CHECKED = [p for p in pkgs_to_check_at_runtime if p != \"python\" and metadata.version(p)]\n"),
    "modelzoo/transformers/data_processing/__init__.py": "",
    "modelzoo/transformers/data_processing/Tokenization.py": (
        "from keras_preprocessing.text import Tokenizer\n"
        "from keras_preprocessing.text import text_to_word_sequence as words  # the vendor's utils.py form\n"
        "\n"
        "\n"
        "def vocab(tokens):\n"
        "    tokenizer = Tokenizer(filters='', lower=True)\n"
        "    tokenizer.fit_on_texts(tokens)\n"
        "    return tokenizer\n"),
    f"{TINY}/summaries.py": ("from nltk import ngrams\nimport spacy\ndef f():\n    from nltk import word_tokenize\n"
                             "from nltk import sent_tokenize\n"),
    f"{TINY}/__init__.py": "",
    f"{TINY}/run.py": (
        "import os\n"
        "import sys\n"
        "\n"
        "sys.path.append(os.path.join(os.path.dirname(__file__), \"../../../..\"))\n"
        "from modelzoo.transformers.pytorch.hub.file_utils import NUMPY, clone, token\n"
        "from modelzoo.transformers.pytorch.hub.versions_check import CHECKED\n"
        "from modelzoo.transformers.data_processing.Tokenization import vocab, words\n"
        "\n"
        "if __name__ == \"__main__\":\n"
        "    tokenizer = vocab([\"[CLS]\", \"the\", \"cat\", \"the\"])\n"
        "    print(token(), NUMPY.split('.')[0].isdigit(), CHECKED[-1])\n"
        "    print(tokenizer.word_index, tokenizer.texts_to_sequences([\"The\", \"dog\"]))\n"
        "    print(words(\"A b\\tc\", filters=\"\\t\"))\n"
        "    try:\n"
        "        clone(\"here\")\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, str(e).split(\" is gone\")[0])\n"),
}


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def migrated(tmp_path, monkeypatch):
    _write(tmp_path / "vendor", CHECKOUT)
    # nltk and spacy are not installed in this zoo's environment; say so whatever this machine has
    monkeypatch.setattr(migrate_module, "installed", lambda package: package not in {"nltk", "spacy"})
    out = tmp_path / "out"
    return out, migrate(str(tmp_path / "vendor" / TINY), str(out))


def _change(migration, file, line):
    [change] = [c for c in migration.changes if (c.file, c.line) == (file, line)]
    return change


def test_removed_hub_and_transformers_names_come_from_where_they_are_now(migrated):
    out, migration = migrated
    hub = _change(migration, "vendor_deps/transformers/pytorch/hub/file_utils.py", 3)
    assert hub.after == "from huggingface_hub import HfApi; from common.pytorch.hf_compat import HfFolder, Repository"
    assert "huggingface_hub 1.0 removed HfFolder" in hub.why and "removed Repository" in hub.why
    meta = _change(migration, "vendor_deps/transformers/pytorch/hub/file_utils.py", 4)
    assert meta.after == "from importlib import metadata as importlib_metadata"
    assert "importlib.metadata" in meta.why
    report = (out / REPORT).read_text()
    assert ("vendor_deps/transformers/pytorch/hub/file_utils.py:4: transformers 5 has no importlib_metadata: it is "
            "the standard library's importlib.metadata\n"
            "-    from transformers.utils.versions import importlib_metadata\n"
            "+    from importlib import metadata as importlib_metadata\n") in report


def test_keras_preprocessing_names_come_from_common_keras_text_keeping_alias_and_comment(migrated):
    _, migration = migrated
    rel = "vendor_deps/transformers/data_processing/Tokenization.py"
    assert _change(migration, rel, 1).after == "from common.keras_text import Tokenizer"
    assert _change(migration, rel, 2).after == ("from common.keras_text import text_to_word_sequence as words  "
                                                "# the vendor's utils.py form")


def test_the_version_check_drops_the_packages_the_vendors_code_never_imports(migrated):
    _, migration = migrated
    change = _change(migration, "vendor_deps/transformers/pytorch/hub/versions_check.py", 3)
    assert change.after == 'pkgs_to_check_at_runtime = "python tqdm regex packaging filelock numpy".split()'


def test_a_library_not_installed_here_is_listed_with_its_pip_command(migrated):
    _, migration = migrated
    left = {(x.file, x.line): x.why for x in migration.left}
    rel = "summaries.py"
    assert (rel, 2) not in left and (rel, 5) not in left  # written as optional_module, optional_name (below)
    assert left[(rel, 4)].startswith("nltk is not installed here: pip install nltk ")  # inside a function


def test_a_top_level_import_of_a_library_not_installed_here_imports_and_fails_at_first_use(migrated):
    out, migration = migrated
    change = _change(migration, "summaries.py", 2)
    assert change.after.startswith("from common.optional_module import optional_module; spacy = optional_module("
                                   '"spacy", "pip install spacy, then python -m spacy download')
    namespace = {}
    exec(compile(change.after.replace('"spacy"', '"spacy_absent_here"'), "summaries.py", "exec"), namespace)
    with pytest.raises(UserError, match=r"^spacy_absent_here\.load: spacy_absent_here is not installed here: "
                                        r"pip install spacy"):
        namespace["spacy"].load("en_core_web_sm")
    assert namespace["spacy"].__class__.__name__ == "AbsentModule"


def test_a_top_level_from_import_of_a_library_not_installed_here_imports_and_fails_at_first_call(migrated):
    _, migration = migrated
    change = _change(migration, "summaries.py", 5)
    assert change.after.startswith('from common.optional_module import optional_name; sent_tokenize = optional_name('
                                   '"nltk", "sent_tokenize", "pip install nltk ')
    namespace = {}
    exec(compile(change.after.replace('"nltk", "sent', '"nltk_absent_here", "sent'), "s.py", "exec"), namespace)
    with pytest.raises(UserError, match=r"^nltk_absent_here\.sent_tokenize: nltk_absent_here is not installed "
                                        r"here: pip install nltk "):
        namespace["sent_tokenize"]("A b. C d.")


def test_nltk_ngrams_comes_from_common_ngrams_as_nltk_documents_it(migrated):
    _, migration = migrated
    assert _change(migration, "summaries.py", 1).after == "from common.ngrams import ngrams"
    assert list(ngrams("abcd", 2)) == [("a", "b"), ("b", "c"), ("c", "d")]
    assert list(ngrams([1, 2, 3], 3)) == [(1, 2, 3)] and list(ngrams([1, 2], 3)) == []
    assert list(ngrams([1, 2], 2, pad_left=True, pad_right=True, left_pad_symbol="<s>", right_pad_symbol="</s>")) == [
        ("<s>", 1), (1, 2), (2, "</s>")]


def test_an_import_of_an_installed_library_through_optional_module_is_the_library():
    assert optional_module("json", "pip install nothing") is json


def test_a_name_that_did_not_move_stays_and_an_unknown_keras_preprocessing_name_is_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(migrate_module, "installed", lambda package: package != "keras_preprocessing")
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "m.py").write_text("from keras_preprocessing.text import Tokenizer, one_hot\n")
    migration = migrate(str(tmp_path / "alone"), str(tmp_path / "out"))
    [change] = migration.changes
    assert change.after == "from keras_preprocessing.text import one_hot; from common.keras_text import Tokenizer"
    [left] = migration.left
    assert left.why.startswith("keras_preprocessing is not installed here: pip install keras-preprocessing")


def test_moved_names_imported_across_lines_are_listed(tmp_path):
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "m.py").write_text("import os\nfrom huggingface_hub import (\n    HfApi,\n    HfFolder,\n)\n")
    migration = migrate(str(tmp_path / "alone"), str(tmp_path / "out"))
    assert migration.changes == []
    [left] = migration.left
    assert (left.line, left.text) == (2, "from huggingface_hub import (")
    assert left.why.startswith("names since removed from huggingface_hub, imported across lines")


def test_the_migrated_folder_runs_with_the_names_rewritten(migrated, tmp_path):
    out, _ = migrated
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_TOKEN="hf_fake_token", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(out / "run.py")], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "hf_fake_token True numpy",
        "{'the': 1, '[cls]': 2, 'cat': 3} [[1], []]",
        "['a', 'b', 'c']",
        "UserError huggingface_hub.Repository (a git clone of a Hub repository, which the vendor's push_to_hub "
        "uses)",
    ]


def test_hf_folder_reads_the_hubs_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert HfFolder.get_token() == huggingface_hub.get_token() == "hf_from_env"


def test_making_a_repository_is_one_error_line():
    with pytest.raises(UserError) as e:
        Repository("local_dir", clone_from="user/model")
    assert "\n" not in str(e.value) and "Repository" in str(e.value) and "upload_folder" in str(e.value)


def test_text_to_word_sequence_as_documented():
    # default filters are punctuation (not the apostrophe) and tab and newline, read as the split character
    assert text_to_word_sequence("Hello, World!  it's\tme.") == ["hello", "world", "it's", "me"]
    assert text_to_word_sequence("A-b C", filters="", lower=False) == ["A-b", "C"]
    assert text_to_word_sequence("a,b,,c", filters="", split=",") == ["a", "b", "c"]


def test_tokenizer_indexes_by_count_ties_in_the_order_first_seen():
    tokenizer = Tokenizer()
    tokenizer.fit_on_texts(["The cat sat.", "the cat", "a dog"])
    assert tokenizer.word_index == {"the": 1, "cat": 2, "sat": 3, "a": 4, "dog": 5}
    assert tokenizer.index_word == {1: "the", 2: "cat", 3: "sat", 4: "a", 5: "dog"}
    assert tokenizer.document_count == 3 and tokenizer.word_counts["cat"] == 2
    assert tokenizer.texts_to_sequences(["a cat flew", ["DOG", "the"]]) == [[4, 2], [5, 1]]


def test_tokenizer_oov_token_and_num_words():
    tokenizer = Tokenizer(num_words=3, oov_token="<unk>")
    tokenizer.fit_on_texts(["b a b"])
    assert tokenizer.word_index == {"<unk>": 1, "b": 2, "a": 3}
    # "a" is index 3, not below num_words: it is read as the oov token, as an unknown word is
    assert tokenizer.texts_to_sequences(["b a z"]) == [[2, 1, 1]]
    chars = Tokenizer(char_level=True, lower=False)
    chars.fit_on_texts(["aAb", "b"])
    assert chars.word_index == {"b": 1, "a": 2, "A": 3}


LOADERS = (
    "import torch\n"
    "\n"
    "\n"
    "def loaders(num_workers, prefetch_factor):\n"
    "    data = torch.utils.data.TensorDataset(torch.arange(6.0))\n"
    "    made = [torch.utils.data.DataLoader(\n"
    "        data,\n"
    "        batch_size=2,\n"
    "        num_workers=num_workers,\n"
    "        prefetch_factor=prefetch_factor,\n"
    "    )]\n"
    "    made.append(torch.utils.data.DataLoader(data, batch_size=3, num_workers=num_workers, "
    "prefetch_factor=prefetch_factor if num_workers > 0 else 2))\n"
    "    made.append(torch.utils.data.DataLoader(data, num_workers=num_workers, prefetch_factor=None))\n"
    "    return made\n"
    "\n"
    "\n"
    "def listed(data, num_workers, prefetch_factor):\n"
    "    return torch.utils.data.DataLoader(data, num_workers=num_workers, prefetch_factor=(\n"
    "        prefetch_factor))\n"
    "\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    print([len(list(loader)) for loader in loaders(0, 10)])\n")


def test_a_prefetch_factor_without_workers_becomes_none_as_torch_2_asks(tmp_path):
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "data.py").write_text(LOADERS)
    migration = migrate(str(tmp_path / "alone"), str(tmp_path / "out"))
    rewritten = {c.line: (c.before.strip(), c.after.strip()) for c in migration.changes}
    assert rewritten == {
        10: ("prefetch_factor=prefetch_factor,", "prefetch_factor=prefetch_factor if num_workers > 0 else None,"),
        12: ("made.append(torch.utils.data.DataLoader(data, batch_size=3, num_workers=num_workers, "
             "prefetch_factor=prefetch_factor if num_workers > 0 else 2))",
             "made.append(torch.utils.data.DataLoader(data, batch_size=3, num_workers=num_workers, "
             "prefetch_factor=(prefetch_factor if num_workers > 0 else 2) if num_workers > 0 else None))"),
    }
    assert all("torch 2's DataLoader refuses a prefetch_factor without workers" in c.why for c in migration.changes)
    [left] = migration.left  # None is left as it is; a value written over lines is listed
    assert (left.line, left.text) == (18, "return torch.utils.data.DataLoader(data, num_workers=num_workers, "
                                          "prefetch_factor=(")
    assert left.why.startswith("a DataLoader's prefetch_factor, which torch 2 refuses without workers")
    if importlib.util.find_spec("torch") is None:
        return
    done = subprocess.run([sys.executable, str(tmp_path / "out" / "data.py")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3, 2, 6]"


KERAS2 = "modelzoo/transformers/tf/tiny"
KERAS2_CHECKOUT = {
    "modelzoo/__init__.py": "",
    "modelzoo/common/__init__.py": "",
    "modelzoo/common/tf/__init__.py": "",
    "modelzoo/common/tf/layers/__init__.py": "",
    "modelzoo/common/tf/layers/BaseLayer.py": (
        "import tensorflow as tf\n"
        "\n"
        "\n"
        "class BaseLayer(tf.keras.layers.Layer):\n"
        "    def __init__(self, **kwargs):\n"
        "        super(BaseLayer, self).__init__(**kwargs)\n"
        "        self.dtype_policy = self._dtype_policy\n"
        "        self.variable_dtype = self._dtype_policy.variable_dtype\n"
        "        self.compute_dtype = self._dtype_policy.compute_dtype\n"
        "        self.other_dtype = self._dtype_policy.compute_dtype\n"),
    "modelzoo/transformers/__init__.py": "",
    "modelzoo/transformers/tf/__init__.py": "",
    f"{KERAS2}/__init__.py": "",
    f"{KERAS2}/run.py": (
        "import os\n"
        "import sys\n"
        "\n"
        "import tensorflow as tf  # the vendor's\n"
        "\n"
        "sys.path.append(os.path.join(os.path.dirname(__file__), \"../../../..\"))\n"
        "from modelzoo.common.tf.layers.BaseLayer import BaseLayer\n"
        "\n"
        "if __name__ == \"__main__\":\n"
        "    layer = BaseLayer(name=\"base\")\n"
        "    print(type(layer).__mro__[1].__module__.split('.')[0], layer.compute_dtype, layer.other_dtype)\n"),
    f"{KERAS2}/data.py": "import tensorflow as tf\n",
}


def test_a_folder_carrying_the_vendors_keras_2_library_runs_it_on_tf_keras(tmp_path):
    _write(tmp_path / "vendor", KERAS2_CHECKOUT)
    out = tmp_path / "out"
    migration = migrate(str(tmp_path / "vendor" / KERAS2), str(out))
    assert _change(migration, "run.py", 4).after == \
        'import os; os.environ.setdefault("TF_USE_LEGACY_KERAS", "1"); import tensorflow as tf  # the vendor\'s'
    assert _change(migration, "run.py", 4).why.startswith("the vendor's Keras 2 model library is carried")
    assert not [c for c in migration.changes if c.file == "data.py"]  # a module, not a script: untouched
    base = "vendor_deps/common/tf/layers/BaseLayer.py"
    assert [(c.line, c.after.strip()) for c in migration.changes if c.file == base] == [
        (7, "pass  # Layer.dtype_policy is this already"), (8, "pass  # Layer.variable_dtype is this already"),
        (9, "pass  # Layer.compute_dtype is this already")]  # other_dtype is the layer's own attribute
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("tf_keras") is None:
        return
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")}
    done = subprocess.run([sys.executable, str(out / "run.py")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["tf_keras", "float32", "float32"]


def test_a_folder_without_the_keras_2_library_keeps_tf_keras_as_it_is(tmp_path):
    files = {k: v for k, v in KERAS2_CHECKOUT.items() if "common/tf/layers" not in k}
    files[f"{KERAS2}/run.py"] = "import tensorflow as tf\n\nif __name__ == \"__main__\":\n    print(tf.__version__)\n"
    _write(tmp_path / "vendor", files)
    migration = migrate(str(tmp_path / "vendor" / KERAS2), str(tmp_path / "out"))
    assert not [c for c in migration.changes if "TF_USE_LEGACY_KERAS" in c.after]


def test_the_vendor_compilers_settings_come_from_common_tf_stack_config(tmp_path):
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "utils.py").write_text(
        "try:\n"
        "    from cerebras.pb.stack.autogen_pb2 import AP_ENABLED\n"
        "    from cerebras.pb.stack.full_pb2 import FullConfig\n"
        "    from cerebras.pb.common.tri_state_pb2 import TS_DISABLED, TS_ENABLED\n"
        "    import cerebras.pb.common.cerebras_type_pb2 as cb_types  # the types\n"
        "except ImportError:\n"
        "    pass  # non-cbcore run\n"
        "\n"
        "\n"
        "def custom_config():\n"
        "    config = FullConfig()\n"
        "    config.matching.kernel.inc_pwt_estimate = True\n"
        "    config.matching.autogen_policy = AP_ENABLED\n"
        "    config.placement.fix_existing = TS_DISABLED\n"
        "    config.matching.match_lair.disabled_converters.append(\"UnsortedGatherConverter\")\n"
        "    config.matching.kernel.numerics.layernorm_compute_dtype = cb_types.T_F16\n"
        "    return config\n")
    out = tmp_path / "out"
    migration = migrate(str(tmp_path / "alone"), str(out))
    assert [(c.line, c.after.strip()) for c in migration.changes] == [
        (2, "from common.tf.stack_config import AP_ENABLED"), (3, "from common.tf.stack_config import FullConfig"),
        (4, "from common.tf.stack_config import TS_DISABLED, TS_ENABLED"),
        (5, "from common.tf.stack_config import cerebras_types as cb_types  # the types")]
    assert all(c.why.startswith("the vendor compiler's settings") for c in migration.changes)
    assert migration.left == []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "from out.utils import custom_config; print(sorted(custom_config().settings().items()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([
        ("matching.autogen_policy", "AP_ENABLED"), ("matching.kernel.inc_pwt_estimate", True),
        ("matching.kernel.numerics.layernorm_compute_dtype", "T_F16"),
        ("matching.match_lair.disabled_converters", ["UnsortedGatherConverter"]),
        ("placement.fix_existing", "TS_DISABLED")])


def test_the_vendor_unets_pandas_import_imports_without_pandas(tmp_path, monkeypatch):
    # the vendor's unet/tf/input/__init__.py imports its raw readers, which import pandas at the top: the TFRecords
    # readers beside them must import where pandas is not installed
    _write(tmp_path / "vendor", {"modelzoo/unet/tf/input/dagm.py": "import pandas as pd\n",
                                 "modelzoo/unet/tf/input/__init__.py": "from .dagm import pd\n",
                                 "modelzoo/unet/tf/run.py": "from modelzoo.unet.tf.input import pd\n"})
    monkeypatch.setattr(migrate_module, "installed", lambda package: package != "pandas")
    migration = migrate(str(tmp_path / "vendor" / "modelzoo/unet/tf"), str(tmp_path / "out"))
    change = _change(migration, "input/dagm.py", 1)
    assert change.after == ('from common.optional_module import optional_module; pd = optional_module("pandas", '
                            '"pip install pandas (the vendor\'s unet reads the raw DAGM 2007 and Severstal label '
                            'CSVs with pandas; its TFRecords readers take none)")')


def test_a_keras_conv_given_keras_2_2s_positionals_gets_them_named(tmp_path):
    # the vendor's common/tf/layers/Conv2DLayer.py (its unet's convolutions) passes activation, use_bias, ... by
    # position after dilation_rate; Keras 2.3 put groups there, so activation would be read as groups
    text = ("layer = layers.Conv2D(\n    8,\n    3,\n    (1, 1),\n    'same',\n    None,\n    (1, 1),\n"
            "    'relu',\n    False, 'ones',\n    name='conv',\n)\n")
    new, changes, _ = migrate_module.FileMigration("Conv2DLayer.py", text, set()).run()
    assert [(c.line, c.after) for c in changes] == [(8, "    activation='relu',"),
                                                    (9, "    use_bias=False, kernel_initializer='ones',")]

    def conv2d(filters, kernel_size, strides=(1, 1), padding="valid", data_format=None, dilation_rate=(1, 1),
               groups=1, activation=None, use_bias=True, kernel_initializer="glorot_uniform", **kwargs):  # Keras 2.3+
        return groups, activation, use_bias, kernel_initializer

    namespace = {"layers": type("layers", (), {"Conv2D": staticmethod(conv2d)})}
    exec(compile(new, "Conv2DLayer.py", "exec"), namespace)
    assert namespace["layer"] == (1, "relu", False, "ones")


def test_tfs_internal_keras_layers_come_from_tf_keras():
    # the vendor's unet imports concatenate and Flatten from tensorflow.python.keras, whose layers refuse the
    # tf-keras dtype policy the carried layers pass
    text = "from tensorflow.python.keras.layers import Flatten, concatenate  # merge\n"
    _, changes, _ = migrate_module.FileMigration("UNetModel.py", text, set()).run()
    assert [c.after for c in changes] == ["from tf_keras.layers import Flatten, concatenate  # merge"]

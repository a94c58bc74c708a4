"""``zoo port migrate`` on a folder inside a checkout of the vendor's zoo, nested as the vendor's
transformers folders are (``modelzoo/transformers/pytorch/<model>/`` with an ``input/``
subpackage): its own modules imported relatively at any depth, the checkout's modules it
imports (a sibling module, a common module this zoo has not) carried into ``vendor_deps/``
with theirs, and the migrated folder's ``run.py`` running. The fake checkout is written here."""

import os
import subprocess
import sys

import pytest

from common import zoo_cli
from common.errors import UserError
from common.port.migrate import PACKAGE_LINE, REPORT, migrate, package_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LICENSE = "# Copyright the fake vendor\n"
TINY = "modelzoo/transformers/pytorch/tiny"

CHECKOUT = {
    "modelzoo/__init__.py": LICENSE,
    "modelzoo/common/__init__.py": LICENSE,
    "modelzoo/common/pytorch/__init__.py": LICENSE + "modes = None\n",
    "modelzoo/common/pytorch/run_utils.py": "def run(*args):\n    raise AssertionError('the vendor runner')\n",
    # a package whose __init__ must not come along: only its modules are imported
    "modelzoo/common/pytorch/model_utils/__init__.py": "raise ImportError('the package init ran')\n",
    "modelzoo/common/pytorch/model_utils/init_helper.py": (
        "from modelzoo.common.pytorch.model_utils.consts import (\n"
        "    SCALE,\n"
        ")\n"
        "\n"
        "\n"
        "def make():\n"
        "    return SCALE\n"),
    "modelzoo/common/pytorch/model_utils/consts.py": "SCALE = 5\n",
    "modelzoo/transformers/__init__.py": LICENSE,
    "modelzoo/transformers/pytorch/__init__.py": LICENSE,
    "modelzoo/transformers/pytorch/layer_util.py": (
        "import modelzoo.common.pytorch.model_utils.consts as consts\n"
        "from .extra import TWO\n"
        "\n"
        "\n"
        "def double(x):\n"
        "    return TWO * x + consts.SCALE - consts.SCALE\n"),
    "modelzoo/transformers/pytorch/extra.py": "TWO = 2\n",
    "modelzoo/transformers/pytorch/unused/model.py": "raise AssertionError('never carried')\n",
    f"{TINY}/__init__.py": LICENSE,
    f"{TINY}/run.py": (
        "import os\n"
        "import sys\n"
        "\n"
        "sys.path.append(os.path.join(os.path.dirname(__file__), \"../../../..\"))\n"
        "from modelzoo.transformers.pytorch.tiny.model import build\n"
        "from modelzoo.transformers.pytorch.tiny.input.reader import (\n"
        "    SIZE,\n"
        "    read,\n"
        ")\n"
        "\n"
        "\n"
        "def main():\n"
        "    print('OK', build(), read(), SIZE)\n"
        "\n"
        "\n"
        "if __name__ == \"__main__\":\n"
        "    main()\n"),
    f"{TINY}/model.py": (
        "from modelzoo.transformers.pytorch.layer_util import double\n"
        "from modelzoo.common.pytorch.model_utils.init_helper import make\n"
        "from modelzoo.transformers.pytorch.tiny import utils as tiny_utils\n"
        "\n"
        "\n"
        "def build():\n"
        "    return double(make()) + tiny_utils.ONE\n"
        "\n"
        "\n"
        "def on_the_system():\n"
        "    import cerebras.framework.torch as cbtorch\n"
        "    from modelzoo.transformers.pytorch.absent import nothing\n"
        "    return cbtorch, nothing\n"),
    f"{TINY}/hooks.py": (
        "from modelzoo.common.pytorch.run_utils import run\n"
        "from modelzoo.common.pytorch import cb_model as cm, vendor_only_name\n"),
    f"{TINY}/utils.py": "ONE = 1\n",
    f"{TINY}/configs/params.yaml": "model:\n  hidden: 4\n",
    f"{TINY}/input/__init__.py": LICENSE,
    f"{TINY}/input/reader.py": (
        "from modelzoo.transformers.pytorch.tiny.utils import ONE\n"
        "\n"
        "try:\n"
        "    from cerebras_pytorch import amp\n"
        "except ImportError:\n"
        "    amp = None\n"
        "SIZE = 3\n"
        "\n"
        "\n"
        "def read():\n"
        "    return ONE + 1\n"),
    f"{TINY}/input/scripts/__init__.py": "",
    f"{TINY}/input/scripts/make.py": (
        "import os\n"
        "import sys\n"
        "\n"
        "sys.path.append(os.path.join(os.path.dirname(__file__), \"../../../../../..\"))\n"
        "from modelzoo.transformers.pytorch.tiny.input.reader import read\n"
        "from modelzoo.transformers.pytorch.layer_util import double\n"
        "\n"
        "if __name__ == \"__main__\":\n"
        "    print('MADE', double(read()))\n"),
}


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def checkout(tmp_path):
    _write(tmp_path / "vendor", CHECKOUT)
    return tmp_path / "vendor"


OWN = "the folder's own module, imported relatively"
CARRIED = "a module of the vendor's checkout, carried into vendor_deps/ and imported relatively"
OURS = "the vendor's common modules are this zoo's common"


def test_own_modules_at_any_depth_and_the_checkouts_modules_are_imported_relatively(checkout, tmp_path):
    migration = migrate(str(checkout / TINY), str(tmp_path / "out"))
    assert [(c.file, c.line, c.before, c.after, c.why) for c in migration.changes] == [
        ("hooks.py", 1, "from modelzoo.common.pytorch.run_utils import run", "from common.pytorch.run import run",
         OURS),
        ("hooks.py", 2, "from modelzoo.common.pytorch import cb_model as cm, vendor_only_name",
         "from common.pytorch import cb_model as cm, vendor_only_name", OURS),
        ("model.py", 1, "from modelzoo.transformers.pytorch.layer_util import double",
         "from .vendor_deps.transformers.pytorch.layer_util import double", CARRIED),
        ("model.py", 2, "from modelzoo.common.pytorch.model_utils.init_helper import make",
         "from .vendor_deps.common.pytorch.model_utils.init_helper import make", CARRIED),
        ("model.py", 3, "from modelzoo.transformers.pytorch.tiny import utils as tiny_utils",
         "from . import utils as tiny_utils", OWN),
        ("run.py", 4, "sys.path.append(os.path.join(os.path.dirname(__file__), \"../../../..\"))", PACKAGE_LINE,
         "run as a script, the file imports its folder's modules as one package (common/folder.py), not through "
         "sys.path"),
        ("run.py", 5, "from modelzoo.transformers.pytorch.tiny.model import build", "from .model import build", OWN),
        ("run.py", 6, "from modelzoo.transformers.pytorch.tiny.input.reader import (", "from .input.reader import (",
         OWN),
        ("input/reader.py", 1, "from modelzoo.transformers.pytorch.tiny.utils import ONE", "from ..utils import ONE",
         OWN),
        ("input/scripts/make.py", 4, "sys.path.append(os.path.join(os.path.dirname(__file__), "
         "\"../../../../../..\"))", package_line(("input", "scripts")),
         "run as a script, the file imports its folder's modules as one package (common/folder.py), not through "
         "sys.path"),
        ("input/scripts/make.py", 5, "from modelzoo.transformers.pytorch.tiny.input.reader import read",
         "from ..reader import read", OWN),
        ("input/scripts/make.py", 6, "from modelzoo.transformers.pytorch.layer_util import double",
         "from ...vendor_deps.transformers.pytorch.layer_util import double", CARRIED),
        ("vendor_deps/common/pytorch/model_utils/init_helper.py", 1,
         "from modelzoo.common.pytorch.model_utils.consts import (", "from .consts import (", CARRIED),
        ("vendor_deps/transformers/pytorch/layer_util.py", 1,
         "import modelzoo.common.pytorch.model_utils.consts as consts",
         "from ...common.pytorch.model_utils import consts as consts", CARRIED),
    ]
    assert package_line(("input", "scripts")) == (
        "from common.folder import folder_package; __package__ = folder_package(os.path.join("
        "os.path.dirname(os.path.abspath(__file__)), \"..\", \"..\")) + \".input.scripts\"")
    marker = "a package above "
    assert [(c.file, c.origin, c.by) for c in migration.carried] == [
        ("vendor_deps/__init__.py", "", marker + "vendor_deps/transformers/pytorch/layer_util"),
        ("vendor_deps/common/__init__.py", "", marker + "vendor_deps/common/pytorch/model_utils/init_helper"),
        ("vendor_deps/common/pytorch/__init__.py", "", marker + "vendor_deps/common/pytorch/model_utils/init_helper"),
        ("vendor_deps/common/pytorch/model_utils/__init__.py", "",
         marker + "vendor_deps/common/pytorch/model_utils/init_helper"),
        ("vendor_deps/common/pytorch/model_utils/consts.py", "modelzoo/common/pytorch/model_utils/consts.py",
         "vendor_deps/transformers/pytorch/layer_util.py:1"),  # the first import read (breadth first)
        ("vendor_deps/common/pytorch/model_utils/init_helper.py",
         "modelzoo/common/pytorch/model_utils/init_helper.py", "model.py:2"),
        ("vendor_deps/transformers/__init__.py", "", marker + "vendor_deps/transformers/pytorch/layer_util"),
        ("vendor_deps/transformers/pytorch/__init__.py", "", marker + "vendor_deps/transformers/pytorch/layer_util"),
        ("vendor_deps/transformers/pytorch/extra.py", "modelzoo/transformers/pytorch/extra.py",
         "vendor_deps/transformers/pytorch/layer_util.py:2"),
        ("vendor_deps/transformers/pytorch/layer_util.py", "modelzoo/transformers/pytorch/layer_util.py",
         "model.py:1"),
    ]
    assert [(x.file, x.line, x.why) for x in migration.left] == [
        ("hooks.py", 2, "this zoo's common.pytorch has no vendor_only_name: the vendor's API it names is not "
                        "provided here"),
        ("model.py", 11, "the vendor's system software, not present here: this line must only run on the "
                         "vendor's system"),
        ("model.py", 12, f"no module modelzoo.transformers.pytorch.absent in the vendor's checkout ({checkout}): "
                         f"nothing to carry"),
        ("input/reader.py", 4, "the vendor's system software, not present here: its try's `except ImportError` "
                               "runs instead"),
    ]
    out = tmp_path / "out"
    # carried files are the checkout's, byte for byte but for the reported lines
    assert (out / "vendor_deps/transformers/pytorch/extra.py").read_text() == CHECKOUT[
        "modelzoo/transformers/pytorch/extra.py"]
    assert (out / "vendor_deps/common/pytorch/model_utils/__init__.py").read_text() == ""
    assert (out / "configs/params.yaml").read_text() == CHECKOUT[f"{TINY}/configs/params.yaml"]
    assert not (out / "vendor_deps/transformers/pytorch/unused").exists()
    report = (out / REPORT).read_text()
    assert report == migration.render()
    assert ("vendor_deps/transformers/pytorch/layer_util.py: from modelzoo/transformers/pytorch/layer_util.py, "
            "imported at model.py:1\n") in report
    assert "vendor_deps/common/__init__.py: empty, so that its folder is a package above " in report
    assert ("input/reader.py:1: the folder's own module, imported relatively\n"
            "-    from modelzoo.transformers.pytorch.tiny.utils import ONE\n"
            "+    from ..utils import ONE\n") in report


def test_the_migrated_folder_and_its_nested_script_run(checkout, tmp_path):
    out = tmp_path / "out"
    migrate(str(checkout / TINY), str(out))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(out / "run.py")], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "OK 11 2 3\n", "")
    done = subprocess.run([sys.executable, str(out / "input" / "scripts" / "make.py")], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "MADE 4\n", "")


def test_a_folder_outside_a_checkout_is_migrated_alone(tmp_path):
    files = {k.removeprefix(TINY + "/"): v for k, v in CHECKOUT.items() if k.startswith(TINY + "/")}
    _write(tmp_path / "alone", files)  # no modelzoo package above it
    migration = migrate(str(tmp_path / "alone"), str(tmp_path / "out"))
    assert migration.carried == []
    assert not (tmp_path / "out" / "vendor_deps").exists()
    left = {(x.file, x.line): x.why for x in migration.left}
    assert left[("model.py", 1)].startswith("a module of another folder of the vendor's zoo "
                                            "(modelzoo.transformers.pytorch.layer_util)")
    assert ("model.py", 3) in left  # the vendor's family.fw.module form is the only one known without a checkout


def test_a_carried_module_that_does_not_parse_is_one_line(checkout, tmp_path, capsys):
    broken = checkout / "modelzoo/transformers/pytorch/extra.py"
    broken.write_text("TWO = 2\nprint 'two'\n")
    with pytest.raises(UserError, match=rf"^{broken}:2: not Python 3 \("):
        migrate(str(checkout / TINY), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert zoo_cli.main(["port", "migrate", str(checkout / TINY), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {broken}:2: not Python 3 (") and err.count("\n") == 1


def test_a_dest_that_exists_is_refused(checkout, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert zoo_cli.main(["port", "migrate", str(checkout / TINY), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'out'} exists: give a new folder to --out (the " \
                                      f"migration never overwrites)\n"
    assert os.listdir(tmp_path / "out") == []


def test_a_folder_with_its_own_vendor_deps_is_refused(checkout, tmp_path):
    _write(checkout / TINY, {"vendor_deps/x.py": "X = 1\n"})
    with pytest.raises(UserError, match="has a vendor_deps of its own"):
        migrate(str(checkout / TINY), str(tmp_path / "out"))


@pytest.mark.parametrize("form, after", [
    ("from modelzoo.transformers.pytorch.extra import TWO",
     "from ...vendor_deps.transformers.pytorch.extra import TWO"),
    ("import modelzoo.transformers.pytorch.extra as extra",
     "from ...vendor_deps.transformers.pytorch import extra as extra"),
    ("from modelzoo.transformers.pytorch import extra", "from ...vendor_deps.transformers.pytorch import extra"),
    ("    from modelzoo.transformers.pytorch.tiny.input import reader  # noqa",
     "    from .. import reader  # noqa"),
])
def test_each_import_form_from_a_nested_module(checkout, tmp_path, form, after):
    _write(checkout / TINY, {"input/scripts/form.py": ("def f():\n" if form.startswith(" ") else "") + form + "\n"})
    migration = migrate(str(checkout / TINY), str(tmp_path / "out"))
    change = next(c for c in migration.changes if c.file == "input/scripts/form.py")
    assert (change.before, change.after) == (form, after)
    assert (tmp_path / "out" / "vendor_deps/transformers/pytorch/extra.py").exists()


def test_a_name_ending_in_loss_scale_is_not_keras_mixed_precision(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("def forward(x, mlm_loss_scale=None):\n    return x\n"
                                               "policy = Policy('mixed_float16', loss_scale='dynamic')\n")
    migration = migrate(str(tmp_path / "src"), str(tmp_path / "out"))
    assert [(x.line, x.why.split(":")[0]) for x in migration.left] == [
        (3, "Keras mixed precision has no loss_scale any more")]


def test_the_import_that_carried_a_module_is_named_by_its_line_in_dest(checkout, tmp_path):
    # the tf_estimator import added after `import tensorflow as tf` moves the lines below it down by one
    _write(checkout, {"modelzoo/transformers/pytorch/tf_only.py": "X = 1\n",
                      f"{TINY}/tf_hooks.py": "import tensorflow as tf\n"
                                             "from modelzoo.transformers.pytorch.tf_only import X\n"
                                             "MODE = tf.estimator.ModeKeys.TRAIN\n"})
    migration = migrate(str(checkout / TINY), str(tmp_path / "out"))
    lines = (tmp_path / "out" / "tf_hooks.py").read_text().splitlines()
    assert lines[2] == "from .vendor_deps.transformers.pytorch.tf_only import X"
    carried = {c.file: c.by for c in migration.carried}
    assert carried["vendor_deps/transformers/pytorch/tf_only.py"] == "tf_hooks.py:3"


def test_a_known_vendor_folder_is_told_its_data_command_and_a_first_run(tmp_path, capsys):
    files = {rel.replace(TINY + "/", "modelzoo/transformers/pytorch/bert/fine_tuning/qa/"): text
             for rel, text in CHECKOUT.items()}
    _write(tmp_path / "vendor", files)
    dest = tmp_path / "qa_pt"
    assert zoo_cli.main(["port", "migrate", str(tmp_path / "vendor/modelzoo/transformers/pytorch/bert/fine_tuning/qa"),
                         "--out", str(dest)]) == 0
    out = capsys.readouterr().out
    report = (dest / "MIGRATION.md").read_text()
    steps = report.split("## Next: its data, then a first run at a small size\n\n", 1)[1].splitlines()
    assert steps[0].startswith("    zoo prepare vendor_bert_qa --output_dir data/vendor_bert_qa "
                               "--max_sequence_length 128")
    assert steps[1].startswith(f"    python {dest / 'run.py'} -m train -p {dest / 'configs/bert_base_squad.yaml'} ")
    assert "model.num_hidden_layers=1" in steps[1] and steps[1].endswith("runconfig.max_steps=10")
    assert steps[2].startswith(f"    zoo port vendor-check {tmp_path / 'vendor'} bert/fine_tuning/qa ")
    assert "\n".join(steps[:3]) in out  # printed as written


def test_a_known_vendor_tf_folder_is_told_to_set_its_settings_in_the_params_file(tmp_path):
    files = {rel.replace(TINY + "/", "modelzoo/transformers/tf/gpt2/"): text for rel, text in CHECKOUT.items()}
    _write(tmp_path / "vendor", files)
    dest = tmp_path / "gpt2_tf"
    assert zoo_cli.main(["port", "migrate", str(tmp_path / "vendor/modelzoo/transformers/tf/gpt2"),
                         "--out", str(dest)]) == 0
    report = (dest / "MIGRATION.md").read_text()
    steps = report.split("## Next: its data, then a first run at a small size\n\n", 1)[1].splitlines()
    assert steps[0].startswith("    zoo prepare vendor_gpt2 --output_dir data/vendor_tf_gpt2 --max_seq_length 128 "
                               "--format tfrecords")
    run, settings = steps[1].split("    # after setting in the params file: ")
    assert run == f"    python {dest / 'run.py'} -m train -p {dest / 'configs/params_gpt2_small.yaml'} -o model_dir/gpt2_tf"
    assert "model.num_hidden_layers=2" in settings and settings.endswith("runconfig.max_steps=10")
    assert steps[2].startswith(f"    zoo port vendor-check {tmp_path / 'vendor'} tf/gpt2 ")


def test_another_folder_is_told_no_data_command(checkout, tmp_path):
    migrate(str(checkout / TINY), str(tmp_path / "out"))
    assert "## Next" not in (tmp_path / "out" / "MIGRATION.md").read_text()


def test_a_vendor_folder_with_an_environment_is_told_to_run_with_it(tmp_path):
    files = {rel.replace(TINY + "/", "modelzoo/transformers/tf/t5/"): text for rel, text in CHECKOUT.items()}
    _write(tmp_path / "vendor", files)
    dest = tmp_path / "t5_tf"
    assert zoo_cli.main(["port", "migrate", str(tmp_path / "vendor/modelzoo/transformers/tf/t5"),
                         "--out", str(dest)]) == 0
    steps = (dest / "MIGRATION.md").read_text().split("## Next: its data, then a first run at a small size\n\n",
                                                       1)[1].splitlines()
    assert steps[0].startswith("    zoo prepare vendor_t5 --output_dir data/vendor_tf_t5 --framework tf")
    # its reader's stateful random ops in parallel maps give another order each run without it (FOLDERS)
    assert steps[1].startswith(f"    TF_DETERMINISTIC_OPS=1 python {dest / 'run.py'} -m train ")

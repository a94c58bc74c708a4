"""``zoo port check`` on the gallery (tests/port_gallery): user code written as users write it,
each folder with the findings it must produce (its expected.txt), nothing more, nothing less;
and on the zoo's own folders, which must produce none.

Reading is checked on every item (fast: no framework is imported). Building the model for
the device compiler is checked on a few items of each kind (a plain torch script, an
HF-style module, a model that needs weight streaming, a Keras script, ready zoo folders of
both frameworks), each skipped where its framework is not installed.
"""

import importlib.util
import os

import pytest

from common import zoo
from common.port.check import check, render
from common.port.findings import STAGES

GALLERY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "port_gallery")
ITEMS = sorted(d for d in os.listdir(GALLERY) if os.path.isfile(os.path.join(GALLERY, d, "expected.txt")))
HAVE = {"torch": importlib.util.find_spec("torch") is not None,
        "tf": importlib.util.find_spec("tensorflow") is not None}


def expected(item: str) -> dict[str, tuple[set, str | None]]:
    """{"read": ({(kind, where)}, None), "built": ({...}, profile)} from the item's expected.txt."""
    sections, current = {}, None
    with open(os.path.join(GALLERY, item, "expected.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                words = line.strip("[]").split()
                current = words[0]
                sections[current] = (set(), words[2] if words[1:2] == ["--profile"] else None)
            else:
                kind, where = line.split()
                sections[current][0].add((kind, "" if where == "-" else where))
    return sections


def found(report) -> set:
    return {(f.kind, f.where()) for f in report.findings}


def test_the_gallery_has_at_least_twelve_items_of_both_frameworks_with_ready_folders():
    assert len(ITEMS) >= 12
    assert {"zoo_ready_pytorch", "zoo_ready_tf", "ported_torch_mnist_example", "ported_keras_fit_mnist"} <= set(ITEMS)
    assert any(i.startswith("keras") for i in ITEMS) and any(i.startswith("torch") for i in ITEMS)
    assert {fw for _, fw in BUILT} == {"torch", "tf"}


@pytest.mark.parametrize("item", ITEMS)
def test_reading_finds_exactly_what_the_item_must_produce(item):
    report = check(os.path.join(GALLERY, item), capture=False)
    want, _ = expected(item)["read"]
    assert found(report) == want
    assert report.status == (1 if want else 0)


def framework(item: str) -> str:
    from common.port.check import framework_of, python_files
    from common.port.source import Source

    folder = os.path.join(GALLERY, item)
    return framework_of([Source.read(f, f) for f in python_files(folder)])


# the items built for the compiler: those whose expected.txt has a [built] section
BUILT = [(item, "torch" if framework(item) == "pytorch" else "tf") for item in ITEMS if "built" in expected(item)]


@pytest.mark.parametrize("item, framework", BUILT, ids=[b[0] for b in BUILT])
def test_the_built_model_gives_exactly_what_the_item_must_produce(item, framework):
    if not HAVE[framework]:
        pytest.skip(f"{framework} not installed")
    want, profile = expected(item)["built"]
    report = check(os.path.join(GALLERY, item), capture=True, profile=profile)
    assert found(report) == want, render(report)
    assert report.built, "the model was built and handed to the compiler"
    if not want:
        assert any("compile estimate:" in n.message for n in report.notes)


def test_the_compiler_confirms_the_readers_finding_at_the_users_line():
    if not HAVE["torch"]:
        pytest.skip("torch not installed")
    # the reader flags flat.topk(...) in TopKPool.forward; the built model's capture finds aten.topk there
    report = check(os.path.join(GALLERY, "torch_cifar_topk", "train.py"), capture=True)
    topk = [f for f in report.findings if f.kind == "unsupported_op"]
    assert [(f.by, f.where()) for f in topk] == [("capture", "train.py:26")]
    assert "aten.topk" in topk[0].message and "argmax" in topk[0].fix


def test_what_could_not_be_built_is_said_not_guessed():
    if not HAVE["torch"]:
        pytest.skip("torch not installed")
    # the tagger's vocabulary is filled by its Dataset, which the check does not run
    report = check(os.path.join(GALLERY, "torch_text_tagger"), capture=True)
    assert not report.built
    assert any("vocab is changed by Sentences" in n.message and "not built" in n.message for n in report.notes)


def test_findings_come_in_fix_order_with_a_line_and_a_change_each():
    report = check(os.path.join(GALLERY, "zoo_tf_problems"), capture=False)
    stages = [list(STAGES).index(f.stage) for f in report.findings]
    assert stages == sorted(stages) and len(set(stages)) >= 3
    assert all(f.file and f.line and f.fix for f in report.findings)
    text = render(report)
    assert text.index("Params:") < text.index("Input:") < text.index("Model:")
    assert "model.py:14: tf.compat.v1.summary.scalar" in text and "host_call" in text
    # the contract's pieces go in the workflow's order (model, data, defaults, then the loop), not by line
    plain = check(os.path.join(GALLERY, "torch_mnist_example"), capture=False)
    kinds = [f.kind for f in plain.findings if f.stage == "port"]
    assert kinds == ["no_model_fn", "no_data_fn", "no_defaults", "own_training_loop"]


# --- the zoo's own folders ---------------------------------------------------------------

OWN = zoo.model_folders() + [os.path.join(zoo.ROOT, "tests", "fixtures", name)
                             for name in ("vendor_pytorch", "vendor_tf")]


@pytest.mark.parametrize("folder", OWN, ids=lambda f: os.path.relpath(f, zoo.ROOT))
def test_the_zoos_own_folders_read_clean(folder):
    report = check(folder, capture=False)
    assert report.findings == [], render(report)


@pytest.mark.parametrize("folder", ["pytorch/mnist", "tf/mnist", "tests/fixtures/vendor_pytorch",
                                    "tests/fixtures/vendor_tf"])
def test_the_zoos_own_folders_built_are_ready(folder, tmp_path):
    framework = "tf" if "tf" in os.path.basename(folder) or folder.startswith("tf/") else "torch"
    if not HAVE[framework]:
        pytest.skip(f"{framework} not installed")
    path = os.path.join(zoo.ROOT, folder)
    tiny = os.path.join(path, "configs", "params_tiny.yaml")
    overrides = ()
    if folder.endswith("vendor_pytorch"):  # it reads MNIST from its data_dir, as its tests give it
        from common.data import write_fake_mnist

        write_fake_mnist(tmp_path, n_train=64, n_test=40, seed=0)
        overrides = (f"train_input.data_dir={tmp_path}", f"eval_input.data_dir={tmp_path}")
    report = check(path, capture=True, params=tiny if os.path.exists(tiny) else None, overrides=overrides)
    assert report.findings == [], render(report)
    assert any(n.message.startswith("compile estimate:") for n in report.notes)


def test_one_file_of_a_zoo_folder_checks_the_folder():
    report = check(os.path.join(zoo.ROOT, "pytorch", "mnist", "model.py"), capture=False)
    assert report.target == "pytorch/mnist" or report.target.endswith(os.path.join("pytorch", "mnist"))
    assert report.findings == [] and "the whole folder was checked" in report.notes[0].message


# --- the porting guide -------------------------------------------------------------------

def guide_outputs() -> list[tuple[str, list[str]]]:
    """(PATH, the output lines shown under it) of each ``$ zoo port check PATH`` in docs/porting.md."""
    with open(os.path.join(zoo.ROOT, "docs", "porting.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("    $ zoo port check "):
            block = []
            for following in lines[i + 2:]:
                if following and not following.startswith("    "):
                    break
                block.append(following[4:])
            while block and not block[-1]:
                block.pop()
            found.append((line.split()[-1], block))
    return found


def test_the_guide_shows_what_the_check_says():
    shown = guide_outputs()
    assert len(shown) == 4  # a PyTorch and a Keras script, before and after
    for path, block in shown:
        report = render(check(os.path.join(zoo.ROOT, path), capture=False)).splitlines()
        numbered = [line for line in report if line.lstrip()[:1].isdigit() or line.lstrip().startswith("fix: ")]
        assert [line for line in block if line.lstrip()[:1].isdigit() or line.lstrip().startswith("fix: ")] == numbered
        verdict = "ready: no findings" if not numbered else report[-1]
        assert block[-1] == verdict or block[-1].startswith(verdict), path

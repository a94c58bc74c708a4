"""``zoo port vendor-check``: a fake checkout of the vendor's zoo (written here, shaped like its
layers_api_demo: a PyTorchBaseModel subclass, a DataLoader, a run.py calling run(), a config)
and a fake data command go through migrate, data and the five runs; a folder whose first loss
moves on the emulator, or whose step fails, is a failed row with its error line and exit 1."""

import dataclasses
import importlib.util

import pytest

from common import zoo_cli
from common.port import vendor_check
from common.port.vendor_check import Folder

LICENSE = "# Copyright the fake vendor\n"

MODEL = '''import torch
import torch.nn as nn
import torch.nn.functional as F

from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(4, width)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)  # (B, 3)


class DemoModel(PyTorchBaseModel):
    def __init__(self, params, device=None):
        self.model = Net(params["model"]["width"])
        self.loss_fn = nn.NLLLoss()
        super().__init__(params=params, model=self.model, device=device)

    def __call__(self, data):
        inputs, labels = data
        return self.loss_fn(self.model(inputs), labels)
'''

DATA = '''import os

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def _loader(input_params):
    arrays = np.load(os.path.join(input_params["data_dir"], "points.npz"))
    dataset = TensorDataset(torch.tensor(arrays["x"]), torch.tensor(arrays["y"]))
    return DataLoader(dataset, batch_size=input_params["batch_size"], drop_last=True)


def train_input_dataloader(params):
    return _loader(params["train_input"])


def eval_input_dataloader(params):
    return _loader(params["eval_input"])
'''

RUN = '''import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../../.."))
from modelzoo.common.pytorch.run_utils import run
from modelzoo.transformers.pytorch.demo.data import eval_input_dataloader, train_input_dataloader
from modelzoo.transformers.pytorch.demo.model import DemoModel


def main():
    run(DemoModel, train_input_dataloader, eval_input_dataloader)


if __name__ == "__main__":
    main()
'''

PARAMS = '''train_input:
    data_dir: "./nowhere"
    batch_size: 64
eval_input:
    data_dir: "./nowhere"
    batch_size: 64
model:
    width: 64
    mixed_precision: True
optimizer:
    optimizer_type: "SGD"
    learning_rate: 0.1
runconfig:
    max_steps: 1000
    log_steps: 100
    seed: 1
'''

# the data command: points of three classes, and the vendor-style last line naming data_dir for both inputs
DATA_COMMAND = '''import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out)
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype(np.float32)
np.savez(os.path.join(out, "points.npz"), x=x, y=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1))
print("set in the vendor config (train_input and eval_input):")
print(f"  data_dir={out}")
'''

# a run.py standing in for the runner, for the failures: its loss moves with --device emulator, or a step raises
FAKE_RUN = '''import sys

if "--compile_only" in sys.argv and "{fail}" == "compile":
    print("Traceback (most recent call last):")
    print('  File "run.py", line 9, in <module>')
    print("ValueError: the fake compile refused the graph", flush=True)
    sys.exit(1)
shift = 0.01 if "emulator" in sys.argv and "{fail}" == "emulator" else 0.0
device = "emulator" if "emulator" in sys.argv and "{fail}" != "device" else "cpu"
if "-m" in sys.argv and sys.argv[sys.argv.index("-m") + 1] == "eval":
    print("| Eval Device=cpu Step=10 loss=1.00000")
elif "--validate_only" in sys.argv:
    print("validation passed: 0 error(s)")
elif "--compile_only" in sys.argv:
    print("12:00:00 INFO compile report: here")
else:
    for step in range(1, 11):
        print(f"12:00:00 INFO | Train Device={{device}} Step={{step}} Loss={{1.1 - step / 100 + shift:.5f}} Rate=1.00")
'''


def write_checkout(root, run_py=RUN):
    files = {
        "modelzoo/__init__.py": LICENSE,
        "modelzoo/transformers/__init__.py": LICENSE,
        "modelzoo/transformers/pytorch/__init__.py": LICENSE,
        "modelzoo/transformers/pytorch/demo/__init__.py": LICENSE,
        "modelzoo/transformers/pytorch/demo/model.py": LICENSE + MODEL,
        "modelzoo/transformers/pytorch/demo/data.py": LICENSE + DATA,
        "modelzoo/transformers/pytorch/demo/run.py": LICENSE + run_py,
        "modelzoo/transformers/pytorch/demo/configs/params.yaml": PARAMS,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    command = root / "make_points.py"
    command.write_text(DATA_COMMAND)
    return {"demo": Folder("demo", "configs/params.yaml", ("{python}", str(command), "{out}"),
                           (("model.width=16 model.mixed_precision=false train_input.batch_size=32 eval_input.batch_size=32",
                             "small size, float32"),))}


def _row(out, name="demo"):
    return next(line for line in out.splitlines() if line.startswith(f"| {name} |"))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_a_folder_passes_all_five_steps(tmp_path, capsys):
    folders = write_checkout(tmp_path / "vendor")
    work = tmp_path / "work"
    assert vendor_check.check(str(tmp_path / "vendor"), [], str(work), timeout=300, folders=folders) == 0
    out = capsys.readouterr().out
    cells = [c.strip() for c in _row(out).strip("|").split("|")]
    assert cells[0] == "demo" and int(cells[1]) >= 4  # the imports and the sys.path line rewritten
    assert cells[4:9] == ["ok", cells[5], "ok", "ok", "ok"] and cells[-1] == "passed"
    first, last = (float(v) for v in cells[5].split(" -> "))
    emulator_first, gap = cells[9].split(", gap ")
    assert abs(float(emulator_first) - first) <= 1e-4 and float(gap) <= 1e-4
    assert "First error line" not in out
    assert (work / "vendor_check.md").read_text() in out
    assert (work / "model_dir" / "demo" / "cpu" / "checkpoint_10.mdl").exists()


@pytest.mark.parametrize("fail, step, line", [
    ("emulator", "emulator", "first loss 1.10000 on the emulator, 1.09000 on the cpu: 1.0e-02 apart, over 0.0001"),
    ("compile", "compile", "ValueError: the fake compile refused the graph"),
    ("device", "emulator", "exit status 0 but no '| Train Device=emulator ... Loss=' line in its output"),
])
def test_a_failing_step_is_a_failed_row_with_its_error_line(tmp_path, capsys, fail, step, line):
    folders = write_checkout(tmp_path / "vendor", run_py=FAKE_RUN.format(fail=fail))
    code = vendor_check.check(str(tmp_path / "vendor"), ["demo"], str(tmp_path / "work"), timeout=60,
                              folders=folders)
    out = capsys.readouterr().out
    assert code == 1
    assert _row(out).rstrip().endswith("| failed |")
    assert f"- demo, {step}: {line}" in out.splitlines()
    assert sum(line.startswith("- demo,") for line in out.splitlines()) == 1


def test_a_failed_data_command_is_named_with_its_error_line(tmp_path, capsys):
    folders = write_checkout(tmp_path / "vendor", run_py=FAKE_RUN.format(fail=""))
    (tmp_path / "vendor" / "make_points.py").write_text("import sys\nprint('error: no corpus here')\nsys.exit(2)\n")
    assert vendor_check.check(str(tmp_path / "vendor"), [], str(tmp_path / "work"), folders=folders) == 1
    out = capsys.readouterr().out
    assert "| failed |" in _row(out) and "- demo, data: error: no corpus here" in out


def test_a_folder_without_a_data_command_is_failed_at_data(tmp_path, capsys):
    folders = write_checkout(tmp_path / "vendor", run_py=FAKE_RUN.format(fail=""))
    folders = {"demo": Folder("demo", "configs/params.yaml", (), folders["demo"].overrides)}
    assert vendor_check.check(str(tmp_path / "vendor"), [], str(tmp_path / "work"), folders=folders) == 1
    out = capsys.readouterr().out
    assert _row(out).split("|")[5].strip() == "none"
    assert [line for line in out.splitlines() if line.startswith("- demo,")] == [
        "- demo, data: no zoo prepare writes this folder's data layout yet (FOLDERS has no data command for it)"]


def test_not_a_checkout_is_one_error_line(tmp_path, capsys):
    (tmp_path / "modelzoo").mkdir()
    assert zoo_cli.main(["port", "vendor-check", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"error: {tmp_path}: not a checkout")


def test_an_existing_work_folder_is_refused(tmp_path, capsys):
    write_checkout(tmp_path / "vendor")
    (tmp_path / "work").mkdir()
    assert zoo_cli.main(["port", "vendor-check", str(tmp_path / "vendor"), "--work", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--work" in err and "exists" in err


def test_steps_failing_with_the_same_line_are_one_line():
    row = vendor_check.Row("demo", errors=[("cpu train", "E: a"), ("compile", "E: b"), ("emulator", "E: a")],
                           passed=False)
    assert vendor_check.table([row]).splitlines()[-2:] == ["- demo, cpu train, emulator: E: a",
                                                           "- demo, compile: E: b"]


def test_error_line_is_the_last_error_or_the_tracebacks_last_line():
    assert vendor_check.error_line("a\nerror: one\nb\nerror: two\nc\n") == "error: two"
    trace = 'x\nTraceback (most recent call last):\n  File "a.py", line 1\n    boom()\nKeyError: \'k\'\nlater\n'
    assert vendor_check.error_line(trace) == "KeyError: 'k'"
    assert vendor_check.error_line("starting\nKilled\n") == "Killed"


def test_data_keys_give_a_bare_key_to_both_inputs():
    out = "set in the vendor config:\n  data_dir=/d vocab_file=/v model.vocab_size=7\n"
    assert vendor_check.data_keys(out) == ["train_input.data_dir=/d", "eval_input.data_dir=/d",
                                           "train_input.vocab_file=/v", "eval_input.vocab_file=/v",
                                           "model.vocab_size=7"]


def test_a_folder_whose_losses_cannot_be_compared_is_not_passed_and_says_why(tmp_path, capsys):
    folders = write_checkout(tmp_path / "vendor", run_py=FAKE_RUN.format(fail=""))
    folders = {"demo": dataclasses.replace(folders["demo"], uncomparable="its dropout is fixed on")}
    assert vendor_check.check(str(tmp_path / "vendor"), [], str(tmp_path / "work"), timeout=60,
                              folders=folders) == 1
    out = capsys.readouterr().out
    assert ", not compared |" in _row(out) and _row(out).rstrip().endswith("| failed |")
    assert "- demo, emulator: first loss not compared: its dropout is fixed on" in out.splitlines()


# a TF folder's run.py, as the vendor's: no overrides on its command line, its settings in the params file
# (in the vendor's spellings, which its own defaults read); it fails if an override comes on the command line
FAKE_TF_RUN = '''import sys

import yaml

if any("=" in a for a in sys.argv[1:]):
    print("run.py: error: unrecognized arguments: " + " ".join(a for a in sys.argv[1:] if "=" in a))
    sys.exit(2)
params = yaml.safe_load(open(sys.argv[sys.argv.index("-p") + 1]))
run = params["runconfig"]
if "log_steps" in run or "checkpoint_steps" in run:
    print("error: runconfig: 'save_summary_steps' and 'log_steps' are the same setting; give only one")
    sys.exit(2)
device = "emulator" if "emulator" in sys.argv else "cpu"
if "-m" in sys.argv and sys.argv[sys.argv.index("-m") + 1] == "eval":
    print("| Eval Device=cpu Step=10 loss=1.00000")
elif "--validate_only" in sys.argv:
    print("validation passed: 0 error(s)")
elif "--compile_only" in sys.argv:
    print("12:00:00 INFO compile report: here")
else:
    for step in range(1, run["max_steps"] + 1, run["save_summary_steps"]):
        loss = params["model"]["width"] / 10 - step / 100
        print(f"12:00:00 INFO | Train Device={device} Step={step} Loss={loss:.5f} Rate=1.00 ({params['train_input']['data_dir']})")
'''

TF_PARAMS = '''train_input:
    data_dir: "./nowhere"
eval_input:
    data_dir: "./nowhere"
model:
    width: 64
runconfig:
    max_steps: 1000
    save_summary_steps: 100
    save_checkpoints_steps: 1000
'''


def test_a_tf_folder_gets_its_settings_in_a_params_file_in_the_vendors_spellings(tmp_path, capsys):
    from common.port.vendor_folders import TF_FAMILY

    root = tmp_path / "vendor"
    folders = write_checkout(root)
    for rel, text in {"modelzoo/transformers/tf/__init__.py": LICENSE,
                      "modelzoo/transformers/tf/demo/run.py": LICENSE + FAKE_TF_RUN,
                      "modelzoo/transformers/tf/demo/configs/params.yaml": TF_PARAMS}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    demo = folders["demo"]
    folders = {"tf/demo": dataclasses.replace(demo, path="tf/demo", family=TF_FAMILY,
                                              overrides=(("model.width=16", "small size"),))}
    work = tmp_path / "work"
    assert vendor_check.check(str(root), ["tf/demo"], str(work), timeout=120, folders=folders) == 0
    out = capsys.readouterr().out
    assert _row(out, "tf/demo").rstrip().endswith("| passed |")
    assert "| 1.59000 -> 1.50000 |" in _row(out, "tf/demo")  # width 16, ten steps logged one by one
    written = (work / "logs" / "tf_demo" / "cpu_train.yaml").read_text()
    assert "save_summary_steps: 1\n" in written and "save_checkpoints_steps: 10\n" in written
    assert f"data_dir: {work / 'data' / 'tf_demo'}" in written  # the data command's last line


# a run.py whose emulator run gets another first batch unless FAKE_ORDER=fixed is in its environment, as the
# vendor's TF t5 reader does unless TF_DETERMINISTIC_OPS=1 (its stateful random ops in parallel maps)
FAKE_ENV_RUN = '''import os
import sys

device = "emulator" if "emulator" in sys.argv else "cpu"
shift = 0.01 if device == "emulator" and os.environ.get("FAKE_ORDER") != "fixed" else 0.0
if "-m" in sys.argv and sys.argv[sys.argv.index("-m") + 1] == "eval":
    print("| Eval Device=cpu Step=10 loss=1.00000")
elif "--validate_only" in sys.argv:
    print("validation passed: 0 error(s)")
elif "--compile_only" in sys.argv:
    print("12:00:00 INFO compile report: here")
else:
    for step in range(1, 11):
        print(f"12:00:00 INFO | Train Device={device} Step={step} Loss={1.1 - step / 100 + shift:.5f} Rate=1.00")
'''


@pytest.mark.parametrize("env, result", [((), "failed"), ((("FAKE_ORDER=fixed", "its reader's order"),), "passed")])
def test_a_folders_environment_reaches_every_run_and_its_logs(tmp_path, capsys, env, result):
    folders = write_checkout(tmp_path / "vendor", run_py=FAKE_ENV_RUN)
    folders = {"demo": dataclasses.replace(folders["demo"], env=env)}
    work = tmp_path / "work"
    assert vendor_check.check(str(tmp_path / "vendor"), [], str(work), timeout=60,
                              folders=folders) == (0 if result == "passed" else 1)
    assert _row(capsys.readouterr().out).rstrip().endswith(f"| {result} |")
    logs = sorted((work / "logs" / "demo").glob("*.log"))
    runs = [log for log in logs if log.name != "migrate.log"]
    assert len(runs) == 6  # data and the five steps
    assert all(log.read_text().startswith("FAKE_ORDER=fixed ") == bool(env) for log in runs)


def test_the_vendors_unet_is_named_by_its_path_below_modelzoo_and_runs_as_a_tf_folder():
    from common.port.vendor_folders import FOLDERS

    unet = FOLDERS["unet/tf"]  # below modelzoo/, outside the transformers family
    assert unet.source("/co").split("/")[1:] == ["co", "modelzoo", "unet", "tf"]
    assert unet.framework == "tf"  # its run.py takes no overrides: they go into a params file
    assert FOLDERS["tf/gpt2"].framework == "tf" and FOLDERS["bert"].framework == "pytorch"

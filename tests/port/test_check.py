"""``zoo port check`` on a zoo folder's params, and its exit status when the check itself fails."""

import ast
import os

import pytest

from common import zoo
from common.port import check as port_check
from common.port.findings import CHECK_FAILED
from common.zoo_cli import main

MNIST = os.path.join(zoo.ROOT, "pytorch", "mnist")


def test_an_error_of_the_checks_own_code_is_one_line_and_not_the_findings_status(monkeypatch, capsys):
    def broken(*args, **kwargs):
        return ast.Name("x").func  # the defect a variable taken for a call was

    monkeypatch.setattr(port_check, "check", broken)
    status = main(["port", "check", "--no-capture", MNIST])
    out, err = capsys.readouterr()
    assert status == CHECK_FAILED == 3
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert "AttributeError: 'Name' object has no attribute 'func'" in err and "not a finding about your code" in err
    assert " at common/port/check.py:" in err  # the innermost line of the zoo's own code, not the test's


def copy_with_drop_last_false(folder: str, section: str, dst) -> int:
    """``folder`` copied to ``dst`` with ``section``'s drop_last set false in configs/params.yaml;
    the line it is on."""
    import shutil

    shutil.copytree(os.path.join(zoo.ROOT, folder), dst)
    config = dst / "configs" / "params.yaml"
    lines = config.read_text().splitlines(keepends=True)
    start = lines.index(f"{section}:\n")
    line = next(i for i in range(start, len(lines)) if lines[i].strip() == "drop_last: true")
    lines[line] = lines[line].replace("drop_last: true", "drop_last: false")
    config.write_text("".join(lines))
    return line + 1


@pytest.mark.parametrize("folder, batching", [("pytorch/mnist", "DataLoader("), ("tf/mnist", ".batch(")])
@pytest.mark.parametrize("section", ["train_input", "eval_input"])
def test_drop_last_false_in_a_folders_params_is_a_finding_at_its_line(folder, batching, section, tmp_path):
    line = copy_with_drop_last_false(folder, section, tmp_path / "model")
    report = port_check.check(str(tmp_path / "model"), capture=False)
    assert [(f.kind, f.where()) for f in report.findings] == [("no_drop_last", f"configs/params.yaml:{line}")]
    data = (tmp_path / "model" / "data.py").read_text().splitlines()
    reads = next(i for i, text in enumerate(data, 1) if '=input_params["drop_last"]' in text)
    batched = max(i for i, text in enumerate(data[:reads], 1) if batching in text)  # the call's first line
    assert f"data.py:{batched} batches with it" in report.findings[0].message
    assert report.findings[0].fix == "set it to true" and report.status == 1


SCRIPT_WITH_OPS = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv1d(4, 8, 3, groups=2)
        self.up = nn.ConvTranspose1d(8, 4, 2)
        self.head = nn.Linear(4 * 12, 10)

    def forward(self, x):
        x = torch.cumsum(x, dim=-1) + x.cumsum(-1)
        return self.head(self.up(self.grouped(x)).flatten(1))


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4, 13)
y = torch.randint(0, 10, (64,))
for step in range(3):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def test_ops_both_frontends_lower_are_no_findings_and_a_transposed_1d_conv_is(tmp_path):
    # cumsum and a grouped Conv1d run on the device; a transposed 1-d convolution does not
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_WITH_OPS)
    report = port_check.check(str(script), capture=False)
    unsupported = [f.message for f in report.findings if f.kind == "unsupported_op"]
    assert len(unsupported) == 1 and "nn.ConvTranspose1d(8, 4, 2)" in unsupported[0], unsupported


def test_a_section_a_config_switches_off_with_null_lacks_no_key(tmp_path):
    """Code that reads model.extra.scale behind its own `is not None` check: a config with
    `extra: null` holds nothing to read there (no finding); one whose extra is a mapping without
    scale lacks it (a finding naming that config alone)."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(MNIST, folder)
    utils = folder / "utils.py"
    utils.write_text(utils.read_text().replace('"dropout": 0.2,', '"dropout": 0.2,\n            "extra": None,'))
    model = folder / "model.py"
    model.write_text(model.read_text().replace(
        '        p = params["model"]  # sizes and rates are checked by params (common/params.py NAME_RULES)\n',
        '        p = params["model"]  # sizes and rates are checked by params (common/params.py NAME_RULES)\n'
        '        if p["extra"] is not None:\n            self.scale = p["extra"]["scale"]\n'))
    (folder / "configs" / "scaled.yaml").write_text("base: params.yaml\nmodel:\n  extra: {scale: 2.0}\n")
    report = port_check.check(str(folder), capture=False)
    assert [f for f in report.findings if f.kind == "params_missing"] == []
    (folder / "configs" / "unscaled.yaml").write_text("base: params.yaml\nmodel:\n  extra: {other: 1}\n")
    report = port_check.check(str(folder), capture=False)
    missing = [f for f in report.findings if f.kind == "params_missing"]
    assert len(missing) == 1 and "reads model.extra.scale, which neither configs/unscaled.yaml nor" in \
        missing[0].message

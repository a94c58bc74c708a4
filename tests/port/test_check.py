"""``zoo port check``'s command: what it prints and its exit status when the check itself fails."""

import ast
import os

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

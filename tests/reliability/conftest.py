"""The reliability suite's set-up: how many trials (quick in tox, full with
``RELIABILITY_FULL=1``), the two mnist runners, and the ledger of faults behind the table
in tests/reliability/README.md.

Each test records what it injected: the fault, the trials run and how many of them lost
something (a checkpoint that no longer loads, weights that differ from an uninterrupted
run, a damaged file read as if whole, a traceback instead of one line, a file written
outside model_dir), and a test that measures (memory over a long run) its figures, which
the table shows after the fault. It records before it asserts, so a failure shows in the
table too.
At the end the table is printed; a full run (``RELIABILITY_FULL=1``), or any run with
``RELIABILITY_WRITE_TABLE=1``, also writes its rows into the README between its two
markers (rows it did not run are kept, each with the run it came from).
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import random
import re
from collections import OrderedDict
from pathlib import Path

import pytest

from common.data import write_fake_mnist
from common.folder import load_run_module

ROOT = Path(__file__).resolve().parents[2]
README = Path(__file__).resolve().parent / "README.md"
FULL = os.environ.get("RELIABILITY_FULL") == "1"
BEGIN, END = "<!-- table: written by tests/reliability/conftest.py -->", "<!-- end of table -->"


def trials(quick: int, full: int, slow: bool = False) -> int:
    """The number of trials of a fault: ``quick`` in tox, ``full`` with RELIABILITY_FULL=1;
    for the slow faults (a process per trial), RELIABILITY_TRIALS=n sets it outright."""
    if slow and os.environ.get("RELIABILITY_TRIALS"):
        return int(os.environ["RELIABILITY_TRIALS"])
    return full if FULL else quick


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this environment")


def flip_bit(data: bytes, rng: random.Random, lo: int = 0, hi: int | None = None) -> tuple[bytes, int]:
    """``data`` with one random bit of bytes ``lo..hi`` flipped, and the byte's offset."""
    at = rng.randrange(lo, len(data) if hi is None else hi)
    damaged = bytearray(data)
    damaged[at] ^= 1 << rng.randrange(8)
    return bytes(damaged), at


class Ledger:
    """Fault -> [trials, lost], in the order the tests recorded them, and the figures a test measured."""

    def __init__(self):
        self.rows: OrderedDict[str, list[int]] = OrderedDict()
        self.figures: dict[str, str] = {}

    def record(self, fault: str, trials: int, lost: int, figures: str = "") -> None:
        row = self.rows.setdefault(fault, [0, 0])
        row[0] += trials
        row[1] += lost
        if figures:
            self.figures[fault] = figures

    def table(self, earlier: str = "") -> str:
        """The table of this run's rows; the rows of ``earlier`` (a table this wrote before) that
        this run did not touch are kept, with the run they came from."""
        given = os.environ.get("RELIABILITY_TRIALS")
        run = (f"{'full' if FULL else 'quick'}{f', RELIABILITY_TRIALS={given}' if given else ''}, "
               f"{datetime.date.today().isoformat()}")
        rows = {fault: f"| {fault}{f' (measured: {self.figures[fault]})' if fault in self.figures else ''} "
                       f"| {n:,} | {lost} | {run} |" for fault, (n, lost) in self.rows.items()}
        for line in earlier.splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            fault = re.sub(r" \(measured: .*\)$", "", cells[0])  # without the figures measured
            if len(cells) == 4 and cells[0] not in ("fault", "---") and fault not in rows:
                rows[fault] = line.strip()
        return "\n".join(["| fault | trials | lost | run |", "|---|---:|---:|---|", *rows.values()])


LEDGER = Ledger()


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    return LEDGER


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a reliability test of more than a few seconds")


def pytest_terminal_summary(terminalreporter):
    if not LEDGER.rows:
        return
    terminalreporter.write_sep("-", f"reliability ({'full' if FULL else 'quick'} run)")
    terminalreporter.write_line(LEDGER.table())
    if (FULL or os.environ.get("RELIABILITY_WRITE_TABLE") == "1") and README.exists():
        text = README.read_text(encoding="utf-8")
        found = re.search(re.escape(BEGIN) + "(.*?)" + re.escape(END), text, flags=re.S)
        table = f"{BEGIN}\n{LEDGER.table(found.group(1) if found else '')}\n{END}"
        README.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S),
                          encoding="utf-8")
        terminalreporter.write_line(f"written into {README}")


# --- the two mnist runners, on small generated MNIST files ----------------------------------

@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=320, n_test=64, seed=0)
    return str(folder)


def mnist_argv(framework: str, model_dir, data_dir, *extra) -> list[str]:
    """run.py's argv for ``framework``'s mnist tiny config (4 steps, checkpoints 2 and 4) on ``data_dir``."""
    tiny = ROOT / framework / "mnist" / "configs" / "params_tiny.yaml"
    return ["--params", str(tiny), "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}",
            f"eval_input.data_dir={data_dir}", "train_input.dataset=mnist", "eval_input.dataset=mnist", *extra]


def run_main(framework: str, argv: list[str]) -> int:
    """run.py's main for ``framework``'s mnist in this process; its exit status."""
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    try:
        load_run_module(str(ROOT / framework / "mnist")).main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def one_error_line(status: int, err: str) -> str:
    """The one ``error:`` line of a run that stopped on bad input (exit 2, no traceback)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(errors) == 1, err
    return errors[0]

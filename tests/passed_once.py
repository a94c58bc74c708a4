"""Each test runs once in `tox`: where it needs the least.

`tox` runs the suite three times over: the PyTorch side with TensorFlow absent (env pytorch),
the TF side with torch absent (env tf), then everything with both (env all). A test that
passed where only one framework is installed proves what it proves there; running it again
costs CI half its time and proves nothing more. So:

    pytest ... --record-passed FILE   writes the ids of the tests that passed, under a fingerprint
                                      of the checkout
    pytest ... --skip-passed FILE     runs every test but those FILE lists, if FILE's fingerprint
                                      is this checkout's (may be given more than once)

env pytorch records; env tf skips what passed there (a test that passed with TensorFlow absent
needs no TensorFlow: it is torch's or needs neither) and records the rest; env all skips both
records, so it runs only the tests that need both frameworks, those that failed, and those
outside the two envs' folders.

The fingerprint hashes every file git tracks and every Python file it would track (their
contents, as they are on disk), so a record from another state of the code skips nothing: an
edit between two envs, a stale record of an earlier run, a checkout that is not a git work
tree. The terminal summary says how many tests each record spared, or why it was not used.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

HEADER = "# tests that passed; checkout fingerprint "


def checkout_fingerprint(root: str) -> str | None:
    """A hash of the contents of every file git tracks under ``root``, and of the Python files it would track
    (a new module or test), as they are on disk (None: not a work tree). Other untracked files are left out:
    a test run may leave some behind, and they are data, not code."""
    def listing(*args: str) -> list[bytes]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, check=True).stdout
        return [name for name in out.split(b"\0") if name]

    try:
        names = listing("--cached") + [n for n in listing("--others", "--exclude-standard") if n.endswith(b".py")]
    except (OSError, subprocess.CalledProcessError):
        return None
    digest = hashlib.sha256()
    for name in sorted(set(names)):
        path = os.path.join(root, os.fsdecode(name))
        digest.update(name + b"\0")
        try:
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        except OSError:  # listed by the index but deleted on disk
            digest.update(b"absent")
    return digest.hexdigest()


def read_record(path: str, fingerprint: str | None) -> tuple[set[str], str | None]:
    """The test ids ``path`` lists, or (empty, why it cannot be used)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return set(), f"unreadable ({e.strerror})"
    if not lines or not lines[0].startswith(HEADER):
        return set(), "not a record of passed tests"
    if fingerprint is None:
        return set(), "this checkout is not a git work tree, so the record cannot be matched to it"
    if lines[0][len(HEADER):] != fingerprint:
        return set(), "written for another state of the checkout"
    return {line for line in lines[1:] if line}, None


def add_options(parser: pytest.Parser) -> None:
    parser.addoption("--record-passed", metavar="FILE",
                     help="write the ids of the tests that pass to FILE, under a fingerprint of the checkout")
    parser.addoption("--skip-passed", metavar="FILE", action="append", default=[],
                     help="deselect the tests that FILE (written by --record-passed) lists, if it was written for this "
                          "same checkout; may be given more than once")


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(PassedOnce(config), "passed_once")


class PassedOnce:
    """The pytest plugin: --record-passed writes, --skip-passed deselects."""

    def __init__(self, config: pytest.Config):
        self.record_to = config.getoption("record_passed")
        self.skip_from = config.getoption("skip_passed")
        self.root = str(config.rootpath)
        self.fingerprint = checkout_fingerprint(self.root) if (self.record_to or self.skip_from) else None
        self.outcomes: dict[str, bool] = {}  # test id -> passed every phase so far
        self.called: set[str] = set()
        self.summary: list[str] = []

    # --- recording (envs pytorch and tf) ---------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.record_to:
            return
        ok = report.passed and not hasattr(report, "wasxfail")
        self.outcomes[report.nodeid] = self.outcomes.get(report.nodeid, True) and ok
        if report.when == "call" and ok:
            self.called.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.record_to:
            return
        passed = sorted(n for n in self.called if self.outcomes.get(n))
        os.makedirs(os.path.dirname(os.path.abspath(self.record_to)), exist_ok=True)
        if self.fingerprint is None:
            if os.path.exists(self.record_to):
                os.remove(self.record_to)  # a record of another checkout must not survive
            self.summary.append(f"no record written to {self.record_to}: this checkout is not a git work tree")
            return
        with open(self.record_to + ".tmp", "w", encoding="utf-8") as f:
            f.write(HEADER + self.fingerprint + "\n" + "".join(n + "\n" for n in passed))
        os.replace(self.record_to + ".tmp", self.record_to)
        self.summary.append(f"{len(passed)} passed tests recorded in {self.record_to}")

    # --- skipping (env all) ----------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.skip_from:
            return
        ids: set[str] = set()
        for path in self.skip_from:
            if not os.path.exists(path):
                self.summary.append(f"{path}: no record of passed tests; its tests run")
                continue
            listed, why = read_record(path, self.fingerprint)
            if why:
                self.summary.append(f"{path}: {why}; its tests run again")
                continue
            present = listed & {item.nodeid for item in items}
            self.summary.append(f"{path}: {len(present)} tests passed there, not run again")
            ids |= listed
        keep = [item for item in items if item.nodeid not in ids]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item.nodeid in ids])
            items[:] = keep

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for line in self.summary:
            terminalreporter.write_line(line)

"""What ``zoo port check`` reports: findings in the order a user should fix them, and notes.

A finding is something to change before the code runs on the device, with the file and
line to change and the change to make. A note is what the checker could not determine
(a model it could not build, a shape it could not find) or what it measured (the compile
estimate); notes never change the exit status.

The stages are the porting workflow's steps, in the order their fixes unblock each other:
nothing runs until the folder has the contract's pieces; nothing loads until the params
do; the model's input shapes come from the data; the device compiles only a model whose
every op, dtype and shape it takes; only then is its size worth reading.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGES: dict[str, str] = {
    "port": "Port: the zoo's structure (model.py, data.py, utils.py, configs/params.yaml, run.py)",
    "params": "Params: the config loads against the defaults, and holds every key the code reads",
    "data": "Input: static batch shapes, a repeating training set, data on local disk",
    "model": "Model: ops, dtypes and shapes the device takes, no metrics or summaries in the training graph",
    "compile": "Compile: does it fit the wafer?",
}

# Within a stage, findings go by file and line, but for these kinds, which go first in this
# order: the contract's pieces in the order the porting workflow fills them (model.py, data.py,
# utils.py, configs/params.yaml, run.py), the loop that then goes last.
KIND_ORDER = ("missing_file", "import_failed", "no_model_fn", "missing_function", "signature", "no_base_model",
              "no_data_fn", "no_input_fn", "no_defaults", "no_runner", "own_training_loop")

# exit statuses of `zoo port check` (issue 17): ready, findings to fix, could not read the input, and
# the check itself failed (a defect of the check, not of the user's code: no findings to read into it)
READY, FINDINGS, UNREADABLE, CHECK_FAILED = 0, 1, 2, 3


@dataclass(frozen=True)
class Finding:
    stage: str  # a key of STAGES
    kind: str  # a short name tests and scripts match on: no_drop_last, unsupported_op, ...
    file: str  # as shown to the user: relative to the checked folder
    line: int  # 1-based; 0 when the finding is about a file as a whole
    message: str  # what is wrong, in the user's names
    fix: str  # the change to make
    by: str = "read"  # "read": the static reader; "capture": the device compiler on the built model

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    def sort_key(self) -> tuple:
        rank = KIND_ORDER.index(self.kind) if self.kind in KIND_ORDER else len(KIND_ORDER)
        return (list(STAGES).index(self.stage), rank, self.file, self.line, self.kind)


@dataclass(frozen=True)
class Note:
    file: str
    line: int
    message: str

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else (self.file or "-")


class Unreadable(Exception):
    """The input cannot be read at all (no such path, a syntax error, no framework): exit 2."""


def ordered(findings: list[Finding]) -> list[Finding]:
    """In fix order, a finding the capture confirmed replacing the reader's guess at the same line."""
    by_capture = {(f.stage, f.file, f.line) for f in findings if f.by == "capture"}
    kept, seen = [], set()
    for f in sorted(findings, key=Finding.sort_key):
        key = (f.stage, f.kind, f.file, f.line, f.message)
        if key in seen or (f.by == "read" and f.stage == "model" and (f.stage, f.file, f.line) in by_capture):
            continue
        seen.add(key)
        kept.append(f)
    return kept

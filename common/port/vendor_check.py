"""``zoo port vendor-check CHECKOUT [FOLDER ...] [--work DIR]``: the vendor's transformers zoo, end to end.

For each of the vendor's nine PyTorch transformers folders (R1.6) and the TF ones that run
here so far (``tf/gpt2``; or the ones named), in a work folder (new; a temporary one by default): ``zoo port migrate`` it, run the data command
of FOLDERS for it, then, each in a process of its own with the folder's small overrides
(FOLDERS, each with its reason; a TF folder's run.py takes no overrides, so they go into a
params file written beside its logs for each step): train 10 steps on the CPU, eval, --validate_only,
--compile_only, and train 10 steps with --device emulator. The first loss of the two trainings
must agree within 1e-4 (a float16 loss: within one float16 ulp of it, and the table says so).
Prints one table row a folder and the first error line of each step that failed; exits 0
only if every step of every folder passed. The work folder is kept and named, with the table
in WORK/vendor_check.md (a "running" line there means the check was stopped before its end).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import yaml

from common.errors import UserError
from common.params import ALIASES, parse_override
from common.port import migrate as port_migrate
from common.port.vendor_folders import FAMILY, FOLDERS, Folder  # noqa: F401  (Folder: the table's rows)

STEPS = 10  # training steps on the CPU and on the emulator
EVAL_STEPS = 2
LOSS_TOLERANCE = 1e-4  # first loss, CPU against the emulator
REPORT = "vendor_check.md"



# --- one folder ----------------------------------------------------------------------------------------

_TRAIN_LINE = re.compile(r"\| Train Device=(\S+) Step=(\d+) Loss=(\S+)")
# what each step's output must hold besides exit status 0: the line that shows it did what it was asked
_PROOF = {
    "cpu train": (re.compile(r"\| Train Device=cpu Step="), "'| Train Device=cpu ... Loss=' line"),
    "eval": (re.compile(r"\| Eval Device=cpu "), "'| Eval Device=cpu' line"),
    "validate": (re.compile(r"validation passed"), "'validation passed' line"),
    "compile": (re.compile(r"compile report: "), "'compile report:' line"),
    "emulator": (re.compile(r"\| Train Device=emulator Step="), "'| Train Device=emulator ... Loss=' line"),
}


@dataclass
class Step:
    ok: bool
    cell: str
    error: str = ""  # the first error line, when it failed
    losses: list[float] = field(default_factory=list)


@dataclass
class Row:
    folder: str
    cells: dict[str, str] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (step, its error line)
    passed: bool = True


def error_line(output: str) -> str:
    """The line that says why a run failed: the last ``error:`` line, else the last traceback's exception
    line, else the last line."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.lstrip().startswith("error:")]
    if errors:
        return errors[-1].strip()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            ending = [line for line in lines[i + 1:] if not line.startswith((" ", "\t"))]
            if ending:  # the exception's line: the first after the traceback that is not indented
                return ending[0].strip()
    return lines[-1].strip() if lines else "(no output)"


def _run(argv: list[str], cwd: str, log: str, timeout: float, extra_env: dict[str, str] | None = None
         ) -> tuple[int, str]:
    extra_env = extra_env or {}
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra_env)
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        rc, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or ""
        rc = -1
        output = partial.decode("utf-8", "replace") if isinstance(partial, bytes) else partial
        output += f"\nerror: stopped after {timeout:.0f} s (--timeout)"
    with open(log, "w", encoding="utf-8") as f:
        f.write("".join(f"{k}={v} " for k, v in extra_env.items()) + " ".join(argv) + "\n\n" + output)
    return rc, output


def _losses(output: str) -> list[float]:
    return [float(m.group(3)) for m in _TRAIN_LINE.finditer(output)]


def _f16_ulp(value: float) -> float:
    return float(np.spacing(np.float16(abs(value))))


def check_folder(folder: Folder, checkout: str, work: str, timeout: float) -> Row:
    row = Row(folder.name)
    slug = folder.name.replace("/", "_")
    dest = os.path.join(work, slug)
    logs = os.path.join(work, "logs", slug)
    os.makedirs(logs, exist_ok=True)

    def fail(step: str, line: str) -> None:
        row.passed = False
        row.errors.append((step, line))

    src = folder.source(checkout)
    try:
        migration = port_migrate.migrate(src, dest)
    except UserError as e:
        for column in ("migrate changed (lines)", "carried", "not rewritten"):
            row.cells[column] = "failed"
        fail("migrate", f"error: {e}")
        return row
    with open(os.path.join(logs, "migrate.log"), "w", encoding="utf-8") as f:
        f.write(migration.render())
    row.cells["migrate changed (lines)"] = str(len(migration.changes))
    row.cells["carried"] = str(len(migration.carried))
    row.cells["not rewritten"] = str(len(migration.left))

    data_overrides: list[str] = []
    if folder.data is None:
        row.cells["data"] = "its own"
    elif not folder.data:
        row.cells["data"] = "none"
        fail("data", "no zoo prepare writes this folder's data layout yet (FOLDERS has no data command for it)")
    else:
        out = os.path.join(work, "data", slug)
        argv = [a.format(python=sys.executable, out=out) for a in folder.data]
        rc, output = _run(argv, work, os.path.join(logs, "data.log"), timeout, folder.environment())
        if rc == 0:
            data_overrides = data_keys(output)
            row.cells["data"] = "ok"
        else:
            row.cells["data"] = "failed"
            fail("data", error_line(output))

    run_py = os.path.join(dest, "run.py")
    params = os.path.join(dest, *folder.config.split("/"))
    overrides = folder.override_args() + data_overrides
    model_dirs = os.path.join(work, "model_dir", slug)

    def step(name: str, extra: list[str], model_dir: str, settings: list[str]) -> Step:
        argv = [sys.executable, run_py, *extra, "-p", params, "-o", os.path.join(model_dirs, model_dir),
                *overrides, *settings]
        if folder.framework == "tf":
            written = os.path.join(logs, f"{name.replace(' ', '_')}.yaml")
            write_params(params, [*overrides, *settings], written)
            argv = [sys.executable, run_py, *extra, "-p", written, "-o", os.path.join(model_dirs, model_dir)]
        rc, output = _run(argv, work, os.path.join(logs, f"{name}.log"), timeout, folder.environment())
        losses = _losses(output)
        if rc != 0:
            fail(name, error_line(output))
            return Step(False, "failed", losses=losses)
        proof, what = _PROOF[name]
        if not proof.search(output):
            fail(name, f"exit status 0 but no {what} in its output")
            return Step(False, "failed", losses=losses)
        return Step(True, "ok", losses=losses)

    train_settings = [f"runconfig.max_steps={STEPS}", "runconfig.log_steps=1", f"runconfig.checkpoint_steps={STEPS}"]
    cpu = step("cpu train", ["-m", "train"], "cpu", train_settings)
    row.cells["cpu train"] = f"{cpu.losses[0]:.5f} -> {cpu.losses[-1]:.5f}" if cpu.ok else "failed"
    if cpu.ok:
        row.cells["eval"] = step("eval", ["-m", "eval"], "cpu", [f"runconfig.eval_steps={EVAL_STEPS}"]).cell
    else:
        row.cells["eval"] = "not run (no checkpoint)"
        row.passed = False
    row.cells["validate"] = step("validate", ["-m", "train", "--validate_only"], "validate", train_settings).cell
    row.cells["compile"] = step("compile", ["-m", "train", "--compile_only"], "compile", train_settings).cell
    emu = step("emulator", ["-m", "train", "--device", "emulator"], "emulator", train_settings)
    if not emu.ok:
        row.cells["emulator"] = "failed"
    elif not cpu.ok:
        row.cells["emulator"] = f"{emu.losses[0]:.5f}, no cpu loss"
    elif folder.uncomparable:
        row.cells["emulator"] = f"{emu.losses[0]:.5f}, not compared"
        fail("emulator", f"first loss not compared: {folder.uncomparable}")
    else:
        gap = abs(emu.losses[0] - cpu.losses[0])
        if folder.loss_dtype == "float16":
            ulp = _f16_ulp(cpu.losses[0])
            within = gap <= ulp * (1 + 1e-3)  # the printed losses have 5 decimals
            row.cells["emulator"] = f"{emu.losses[0]:.5f}, gap {gap:.1e} (fp16 ulp {ulp:.1e})"
            limit = f"one float16 ulp ({ulp:.1e}; {folder.loss_dtype_why})"
        else:
            within = gap <= LOSS_TOLERANCE
            row.cells["emulator"] = f"{emu.losses[0]:.5f}, gap {gap:.1e}"
            limit = f"{LOSS_TOLERANCE:g}"
        if not within:
            fail("emulator", f"first loss {emu.losses[0]:.5f} on the emulator, {cpu.losses[0]:.5f} on the cpu: "
                             f"{gap:.1e} apart, over {limit}")
    return row


def write_params(params: str, overrides: list[str], path: str) -> None:
    """``params`` (a YAML file) with ``overrides`` (``section.key=value``) set, written to ``path``: for a
    run.py that takes no overrides (the vendor's TF ones). A key is written in the vendor's spelling where it
    has one (runconfig.log_steps as save_summary_steps: params.ALIASES), which the folder's own defaults read."""
    with open(params, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    vendor = {}
    for spelling, shared in ALIASES.items():
        vendor.setdefault(shared, spelling)
    for text in overrides:
        keys, value = parse_override(text)
        if isinstance(data.get(keys[0]), dict):
            data[keys[0]].pop(keys[-1], None)
        keys = vendor.get(keys, keys)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)


def data_keys(output: str) -> list[str]:
    """The overrides a data command prints on its last line: ``section.key=value`` kept, a bare ``key=value``
    given to train_input and eval_input both (as the vendor's configs repeat the input keys)."""
    lines = [line for line in output.splitlines() if "=" in line]
    if not lines:
        return []
    keys = []
    for token in lines[-1].split():
        if "=" not in token:
            continue
        key = token.split("=", 1)[0]
        keys += [token] if "." in key else [f"train_input.{token}", f"eval_input.{token}"]
    return keys


# --- the table ------------------------------------------------------------------------------------------

COLUMNS = ("folder", "migrate changed (lines)", "carried", "not rewritten", "data", "cpu train (first -> last loss)",
           "eval", "validate", "compile", "emulator (first loss, gap)", "result")
_CELL = {"cpu train (first -> last loss)": "cpu train", "emulator (first loss, gap)": "emulator"}


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [row.folder] + [row.cells.get(_CELL.get(c, c), "not run") for c in COLUMNS[1:-1]]
        cells.append("passed" if row.passed else "failed")
        lines.append("| " + " | ".join(cells) + " |")
    errors = []
    for row in rows:  # the steps of a folder that failed with the same line, on one line
        steps: dict[str, list[str]] = {}
        for step, line in row.errors:
            steps.setdefault(line, []).append(step)
        errors += [f"- {row.folder}, {', '.join(names)}: {line}" for line, names in steps.items()]
    if errors:
        lines += ["", "First error line of each step that failed:", "", *errors]
    return "\n".join(lines) + "\n"


def check(checkout: str, names: list[str], work: str | None, timeout: float = 900.0,
          folders: dict[str, Folder] | None = None) -> int:
    folders = FOLDERS if folders is None else folders
    if not (os.path.isfile(os.path.join(checkout, "modelzoo", "__init__.py"))
            and os.path.isdir(os.path.join(checkout, *FAMILY))):
        raise UserError(f"{checkout}: not a checkout of the vendor's zoo (no modelzoo/__init__.py and "
                        f"modelzoo/transformers/pytorch/ in it): give the folder that holds modelzoo/")
    unknown = [n for n in names if n.strip("/") not in folders]
    if unknown:
        raise UserError(f"no vendor folder {unknown[0]!r} to check: {', '.join(folders)}")
    chosen = [folders[n.strip("/")] for n in names] or list(folders.values())
    if work is None:
        work = tempfile.mkdtemp(prefix="vendor_check_")
    elif os.path.lexists(work):
        raise UserError(f"--work {work} exists: give a new folder (the check never writes into an old one)")
    else:
        os.makedirs(work)
    work = os.path.abspath(work)
    checkout = os.path.abspath(checkout)
    report = os.path.join(work, REPORT)
    with open(report, "w", encoding="utf-8") as f:
        f.write(f"running since {time.strftime('%Y-%m-%d %H:%M:%S')}: this line stays if the check was stopped\n")
    print(f"work folder: {work} (migrated folders, data, model_dir/, logs/ of every step)", flush=True)
    rows = []
    try:
        for folder in chosen:
            t0 = time.perf_counter()
            rows.append(check_folder(folder, checkout, work, timeout))
            print(f"{folder.name}: {'passed' if rows[-1].passed else 'failed'} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    except KeyboardInterrupt:
        print(f"stopped; what was done is in {work}", file=sys.stderr)
        raise
    text = table(rows)
    with open(report, "w", encoding="utf-8") as f:
        f.write(text)
    print()
    print(text, end="")
    print(f"\nthe table is in {report}; each step's command and output in {os.path.join(work, 'logs')}")
    return 0 if all(row.passed for row in rows) else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkout", metavar="CHECKOUT", help="the folder holding the vendor's modelzoo/ (R_1.6.0)")
    parser.add_argument("folders", nargs="*", metavar="FOLDER",
                        help=f"below modelzoo/transformers/pytorch/, or tf/NAME (default: all: {', '.join(FOLDERS)})")
    parser.add_argument("--work", metavar="DIR", help="a new folder for the migrated folders, data and runs "
                                                      "(default: a new temporary one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a step may take (default 900)")


def run(args: argparse.Namespace) -> int:
    return check(args.checkout, args.folders, args.work, args.timeout)

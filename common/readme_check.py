"""Keep the result tables of the READMEs true: rerun each table's command and compare its figures.

    python -m common.readme_check [--update] [README.md ...]     # default: every README of the zoo

A table is checked when the command that gives it stands right above it, as a shell line
of an indented code block (``$`` and the command), then one blank line:

        $ OMP_NUM_THREADS=2 python pytorch/mnist/run.py --mode train_and_eval

    | step | test accuracy (all 360 test images) | test loss | training loss |
    |---|---|---|---|
    | 500 | 97.78 % | 0.129 | 0.00534 |

The command runs from the repository root as written (``NAME=value`` words first set the
environment, ``python`` is this interpreter) with a ``--model_dir`` of its own in a
temporary folder; the figures are read back from the TensorBoard scalars the run wrote
there. The first column is the global step; each other column names what it holds (the
words before a parenthesis): one of COLUMNS. Each figure is compared at the precision it
is printed with, so ``0.129`` asks for the loss rounded to three decimals. ``--update``
writes the measured figures into the tables instead (at the same precision). Exit status:
0 when every figure holds, 1 when one does not (each is listed), 2 for a table that cannot
be checked.

The last digits of a training run depend on the kind of CPU as well as on the number of
threads: the math libraries pick their kernels by the widest vector unit (AVX2, AVX-512),
and these sum in another order. So the command line ends with the machine the figures were
measured on, as a shell comment that ``--update`` writes (``machine()``)::

        $ OMP_NUM_THREADS=2 python pytorch/mnist/run.py --mode train_and_eval  # measured on x86_64 avx512f

A command of minutes says so before the machine (``# long; measured on x86_64 avx512f``):
``--skip_long`` leaves such tables out (the CI's run, to keep within its time; ``tox -e
train`` checks every table).

On that kind of machine every figure must hold at its printed precision, up to the last
float32 bits: two runs there can still part in the last units (math libraries may pick
their kernels by cache size or memory alignment, not only by the vector unit), which moves a
figure only when it lies on a rounding boundary: pytorch/t5's test perplexity is 2232.354
here, printed 2232.4, and one CI run printed 2232.3, 2e-6 of it away. So a figure holds
there when the run's value, moved by at most ``SAME_MACHINE_SLACK`` (1e-5 of itself; below
half the last printed digit of a figure of 5 significant digits), prints as the README does;
the table's summary line then names the figure and the digit this run printed. On another, a
figure holds within what another CPU's rounding moves it by (``FOREIGN_TOLERANCE``: 1.5
points of accuracy, 30 % or 0.02 of a loss), and the summary line says so; a model that
no longer trains still fails there.

Wall times are not in such tables: they depend on the machine, and the READMEs give them
in prose.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from common.errors import UserError
from common.io import atomic_write_text
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# column title -> (the TensorBoard logdir under model_dir, the scalar's tag, the printed scale)
COLUMNS = {
    "test accuracy": ("eval", "accuracy", 100.0),  # printed as a percentage: "97.78 %"
    "test top-5 accuracy": ("eval", "top5_accuracy", 100.0),  # the classifiers' with more than 5 classes (resnet)
    "test loss": ("eval", "loss", 1.0),
    "training loss": ("train", "loss", 1.0),
    "test dice": ("eval", "dice_coefficient", 1.0),  # the segmentation models' (unet)
    "test mean IoU": ("eval", "mean_iou", 1.0),
    "test MLM accuracy": ("eval", "masked_lm_accuracy", 100.0),  # BERT pretraining (pytorch/bert, tf/bert)
    "test NSP accuracy": ("eval", "nsp_accuracy", 100.0),
    "test MLM perplexity": ("eval", "mlm_perplexity", 1.0),
    "test perplexity": ("eval", "lm_perplexity", 1.0),  # GPT-2 (pytorch/gpt2, tf/gpt2): exp of the mean token loss
    "test next-token accuracy": ("eval", "accuracy", 100.0),
    # encoder-decoder models (pytorch/transformer): accuracies over the target tokens, teacher forced
    "test token accuracy": ("eval", "accuracy", 100.0),
    "test sequence accuracy": ("eval", "sequence_accuracy", 100.0),
}
# column kind -> (absolute, relative) difference a figure may show on another kind of CPU
FOREIGN_TOLERANCE = {
    "accuracy": (1.5, 0.0),  # percentage points: 5 of 360 test digits
    "loss": (0.02, 0.3),  # whichever is larger; a training loss of 0.0002 is all rounding
    # Dice, IoU: pytorch/unet's step 400 is mid-way through learning its classes, and the kernels' sum order
    # moves it by up to 0.06 (mean IoU 0.551 on AVX-512 with AMX, 0.491 to 0.518 with AVX2 kernels or 2 threads,
    # 0.498 on an AVX2 EPYC; its README)
    "overlap": (0.07, 0.0),
    "perplexity": (0.5, 0.3),  # exp(loss): in the hundreds early on, where the loss's share moves it most
}
# how far (relative) a figure's value may move on the kind of machine that measured it: the last
# float32 units, which decide a figure only on its rounding boundary (5x the 2e-6 CI once showed)
SAME_MACHINE_SLACK = 1e-5
MARKER = re.compile(r"^    \$ (?P<command>.+?)(?:\s+#\s*(?P<long>long; )?measured on (?P<machine>\S.*?))?\s*$")
FIGURE = re.compile(r"^(?P<number>-?\d+(?:\.(?P<decimals>\d+))?)(?P<percent> %)?$")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_TIMEOUT_S = 1800  # one command; each mnist one takes 20 s to 2 minutes on 2 cores, as loaded


@dataclass
class Figure:
    line: int  # 1-based line in the README
    cell: int  # index of the cell in its row
    step: int
    column: str
    printed: str  # as the README prints it: "97.78 %", "0.129"


@dataclass
class Table:
    path: str
    line: int  # of the marker
    command: str
    figures: list[Figure]
    machine: str | None = None  # the kind of CPU the figures were measured on, where the README says
    long: bool = False  # a run of minutes (``# long; measured on ...``): --skip_long leaves it out


def machine() -> str:
    """The kind of machine that decides the last digits: the architecture, the widest
    vector unit its math libraries dispatch to and whether it has matrix tiles
    ("x86_64 avx512f amx", "x86_64 avx512f", "x86_64 avx2", "aarch64")."""
    arch = platform.machine() or "unknown"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:  # not Linux: the architecture alone
        pass
    for unit in ("avx512f", "avx2", "avx", "sve", "asimd"):
        if unit in flags:
            # a CPU with matrix tiles (AMX) gets other kernels from oneDNN than one with
            # AVX-512 alone: a chaotic run's figures part far between the two
            return f"{arch} {unit} amx" if "amx_tile" in flags else f"{arch} {unit}"
    return arch


def _kind(column: str) -> str:
    for kind in ("accuracy", "loss", "perplexity"):
        if kind in column:
            return kind
    return "overlap"


def holds_elsewhere(figure: "Figure", value: float) -> bool:
    """Whether ``value`` is within what another kind of CPU moves ``figure`` by."""
    absolute, relative = FOREIGN_TOLERANCE[_kind(figure.column)]
    printed = float(FIGURE.match(figure.printed)["number"])
    return abs(value - printed) <= max(absolute, relative * abs(printed))


def holds_here(figure: "Figure", value: float) -> bool:
    """Whether ``value`` prints as ``figure`` does, moved by at most ``SAME_MACHINE_SLACK`` of
    itself (a run's last float32 units on the kind of machine that measured the figure)."""
    match = FIGURE.match(figure.printed)
    half_a_digit = 0.5 * 10.0 ** -len(match["decimals"] or "")
    return abs(value - float(match["number"])) <= half_a_digit + SAME_MACHINE_SLACK * abs(value)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def parse_tables(path: str) -> list[Table]:
    """The checked tables of one README: a ``    $ command`` line, a blank line, a markdown table."""
    lines = open(path, encoding="utf-8").read().splitlines() + ["", ""]  # room to look two lines ahead
    tables = []
    for i, text in enumerate(lines):
        match = MARKER.match(text)
        if not match or lines[i + 1].strip() or not lines[i + 2].startswith("|"):
            continue  # a shell line of a code block that no table follows
        where = f"{path}:{i + 3}"
        header = _cells(lines[i + 2])
        if not lines[i + 3].startswith("|") or not set(lines[i + 3]) <= set("|-: "):
            raise UserError(f"{where}: the table below `{match['command']}` has no |---| line under its header")
        if header[0] != "step":
            raise UserError(f"{where}: the first column of a checked table is 'step', got {header[0]!r}")
        columns = [title.split(" (")[0] for title in header[1:]]
        for title in columns:
            if title not in COLUMNS:
                raise UserError(f"{where}: column {title!r} is not one the check can read; "
                                f"valid: {', '.join(COLUMNS)}")
        figures = []
        row = i + 4
        while row < len(lines) and lines[row].startswith("|"):
            cells = _cells(lines[row])
            if len(cells) != len(header) or not cells[0].isdigit():
                raise UserError(f"{path}:{row + 1}: a row of a checked table is a step and {len(header) - 1} "
                                f"figure(s), got {lines[row]!r}")
            for cell, (column, printed) in enumerate(zip(columns, cells[1:]), start=1):
                if not FIGURE.match(printed) or bool(FIGURE.match(printed)["percent"]) != (COLUMNS[column][2] == 100):
                    raise UserError(f"{path}:{row + 1}: {printed!r} is not a figure of {column!r} "
                                    f"(a number{', then %' if COLUMNS[column][2] == 100 else ''})")
                figures.append(Figure(row + 1, cell, int(cells[0]), column, printed))
            row += 1
        tables.append(Table(path, i + 1, match["command"], figures, match["machine"], bool(match["long"])))
    return tables


def run_command(command: str, model_dir: str) -> None:
    """``command`` from the repository root, writing into ``model_dir``."""
    words = shlex.split(command)
    env = dict(os.environ)
    while words and _ENV_WORD.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words or words[0] != "python":
        raise UserError(f"readme-check command {command!r}: expected [NAME=value ...] python ...")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, *words[1:], "--model_dir", model_dir], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"readme-check command {command!r} ran past {_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UserError(f"readme-check command {command!r} exited with status {done.returncode}:\n{tail}")


def measured(figure: Figure, scalars: dict[str, dict[str, dict[int, float]]]) -> float | None:
    logdir, tag, scale = COLUMNS[figure.column]
    value = scalars.get(logdir, {}).get(tag, {}).get(figure.step)
    return None if value is None else value * scale


def formatted(value: float, printed: str) -> str:
    """``value`` printed as ``printed`` is: the same decimals, the same unit."""
    match = FIGURE.match(printed)
    decimals = len(match["decimals"] or "")
    return f"{value:.{decimals}f}" + (match["percent"] or "")


def check_table(table: Table, exact: bool = False) -> list[tuple[Figure, str | None, bool]]:
    """Run the table's command; (figure, what the run prints, whether the figure holds all the
    same) for each figure the run does not print as the README does (``exact``: none holds, on
    whatever machine measured it)."""
    with tempfile.TemporaryDirectory(prefix="readme_check_") as tmp:
        model_dir = os.path.join(tmp, "model")
        run_command(table.command, model_dir)
        scalars = {}
        for logdir in {spec[0] for spec in COLUMNS.values()}:
            folder = os.path.join(model_dir, logdir)
            if os.path.isdir(folder):
                # a step logged twice (a resumed run) keeps its last value
                scalars[logdir] = {tag: dict(points) for tag, points in read_scalars(folder).items()}
    here = table.machine is None or table.machine == machine()
    differs = []
    for figure in table.figures:
        value = measured(figure, scalars)
        got = None if value is None else formatted(value, figure.printed)
        if got != figure.printed:
            holds = value is not None and not exact and (holds_here(figure, value) if here
                                                          else holds_elsewhere(figure, value))
            differs.append((figure, got, holds))
    return differs


def update(path: str, table: Table, corrections: list[tuple[Figure, str | None]]) -> None:
    """Write the measured figures in, and this machine as the one they were measured on."""
    lines = open(path, encoding="utf-8").read().split("\n")
    lines[table.line - 1] = f"    $ {table.command}  # {'long; ' if table.long else ''}measured on {machine()}"
    for figure, got in corrections:
        if got is None:
            raise UserError(f"{path}:{figure.line}: the run logged no {figure.column} at step {figure.step}")
        cells = lines[figure.line - 1].split("|")
        # cells[0] is the text before the first '|'
        cells[figure.cell + 1] = cells[figure.cell + 1].replace(figure.printed, got, 1)
        lines[figure.line - 1] = "|".join(cells)
    atomic_write_text(path, "\n".join(lines))


def readmes(root: str = ROOT) -> list[str]:
    """README.md of the repository root and of the folders up to two levels below it."""
    found = []
    for depth in ("", "*", os.path.join("*", "*")):
        pattern = os.path.join(root, depth, "README.md")
        found += sorted(p for p in glob.glob(pattern) if not any(part.startswith(".") for part in
                                                                  os.path.relpath(p, root).split(os.sep)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the measured figures into the tables")
    parser.add_argument("--skip_long", action="store_true",
                        help="leave out the tables whose command is marked '# long; measured on ...' (minutes each)")
    parser.add_argument("paths", nargs="*", help="README files (default: every README.md of the zoo)")
    args = parser.parse_args(argv)
    failed = 0
    try:
        for path in args.paths or readmes():
            for table in parse_tables(path):
                if table.long and args.skip_long:
                    print(f"{os.path.relpath(os.path.abspath(path), ROOT)}:{table.line}: skipped (long; "
                          f"--skip_long): {table.command}")
                    continue
                started = time.monotonic()
                differs = check_table(table, exact=args.update)
                seconds = time.monotonic() - started
                inside = os.path.abspath(path).startswith(ROOT + os.sep)
                shown = os.path.relpath(os.path.abspath(path), ROOT) if inside else path
                elsewhere = table.machine is not None and table.machine != machine()
                wrong = [(figure, got) for figure, got, holds in differs if not holds]
                # on the measuring kind of machine, a figure that holds though printed otherwise is on
                # its rounding boundary: said, so that a user who sees the other digit knows why
                boundary = [f"step {figure.step} {figure.column} prints {got} here" for figure, got, holds in differs
                            if holds and not elsewhere]
                for figure, got in wrong:
                    print(f"{shown}:{figure.line}: step {figure.step} {figure.column}: the README says "
                          f"{figure.printed}, `{table.command}` gives {got or 'nothing'}", file=sys.stderr)
                if args.update and (wrong or table.machine != machine()):
                    update(path, table, wrong)
                elif wrong:
                    failed += 1
                note = f" (measured on {table.machine}; this is {machine()}: within another CPU's rounding)" \
                    if elsewhere and not args.update else ""
                if boundary:
                    note += f" ({'; '.join(boundary)}: on its rounding boundary, within the last float32 bits)"
                print(f"{shown}:{table.line}: {len(table.figures) - len(wrong)} of {len(table.figures)} figures "
                      f"hold{note}{' (the others updated)' if wrong and args.update else ''}: {table.command}  "
                      f"[{seconds:.0f} s]")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every model folder of the zoo, discovered (a new folder joins by existing), and a driver
that compiles or trains each one's tiny config: what ``tox -e compile`` and ``tox -e train`` run.

    python -m common.zoo list
    python -m common.zoo compile [--framework tf|pytorch]     # --validate_only then --compile_only
    python -m common.zoo train   [--framework tf|pytorch]     # tiny config on cpu, then on the emulator

Each folder runs in a subprocess of its own, as a user would run it, so that TensorFlow
and torch never share a process here. ``zoo compile`` / ``zoo train`` (common/zoo_cli.py) run
the same stages on folders a user names.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = ("tf", "pytorch")
# what every model folder holds (STYLE.md: one skeleton for every example)
REQUIRED_FILES = ("model.py", "data.py", "utils.py", "configs/params.yaml", "configs/params_tiny.yaml",
                  "run.py", "README.md")


def model_folders(framework: str | None = None, root: str = ROOT) -> list[str]:
    """Folders under tf/ and pytorch/ that hold a run.py, sorted."""
    found = []
    for fw in FRAMEWORKS if framework is None else (framework,):
        base = os.path.join(root, fw)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            folder = os.path.join(base, name)
            if os.path.isfile(os.path.join(folder, "run.py")):
                found.append(folder)
    return found


def missing_files(folder: str) -> list[str]:
    return [f for f in REQUIRED_FILES if not os.path.isfile(os.path.join(folder, f))]


def run_folder(folder: str, flags: list[str], model_dir: str) -> subprocess.CompletedProcess:
    tiny = os.path.join(folder, "configs", "params_tiny.yaml")
    cmd = [sys.executable, os.path.join(folder, "run.py"), "--params", tiny, "--model_dir", model_dir, *flags]
    return subprocess.run(cmd, capture_output=True, text=True)


def losses(output: str) -> list[float]:
    """The losses of the ``| Train ... Loss=...`` log lines, in order."""
    return [float(v) for v in re.findall(r"\| Train .*?Loss=([-+0-9.einfa]+)", output)]


STAGES = {
    "compile": [["--validate_only"], ["--compile_only"]],
    "train": [["--mode", "train", "--device", "cpu"], ["--mode", "train", "--device", "emulator"]],
}


def run_stages(action: str, folders: list[str], keep_reports: bool = False) -> int:
    """Compile or train the tiny config of each folder, one subprocess per stage; 0 when all pass.

    ``keep_reports``: compile into the folder's own model_dir (``model_dir/<framework>_<folder>_tiny``
    under the working directory, as a user's --compile_only run would), so that its report stays
    for ``zoo info``; otherwise every stage runs in a temporary model_dir (tox)."""
    from common.cli import default_model_dir

    failures = 0
    for folder in folders:
        name = os.path.relpath(folder, ROOT) if folder.startswith(ROOT + os.sep) else folder
        if missing_files(folder):
            print(f"FAIL {name}: missing {', '.join(missing_files(folder))}")
            failures += 1
            continue
        with tempfile.TemporaryDirectory(prefix="zoo_") as tmp:
            for i, flags in enumerate(STAGES[action]):
                start = time.perf_counter()  # a model_dir per stage: the emulator run must not resume the cpu one
                model_dir = os.path.join(tmp, f"model_dir_{i}")
                if keep_reports and action == "compile":
                    model_dir = default_model_dir(os.path.basename(os.path.dirname(folder)), folder, "params_tiny")
                result = run_folder(folder, flags, model_dir)
                problem = "" if result.returncode == 0 else f"exit {result.returncode}"
                fell = ""
                if not problem and action == "train":
                    seen = losses(result.stdout + result.stderr)
                    if len(seen) < 2 or not seen[-1] < seen[0]:
                        problem = f"the loss did not fall: {seen}"
                    else:
                        fell = f" loss {seen[0]:.4f} -> {seen[-1]:.4f}"
                status = "FAIL" if problem else "ok  "
                print(f"{status} {name} {' '.join(flags)} ({time.perf_counter() - start:.1f}s){fell} {problem}".rstrip(),
                      flush=True)
                if problem:
                    failures += 1
                    print(result.stdout[-3000:] + result.stderr[-3000:])
                    break
                if keep_reports and "--compile_only" in flags:
                    print(f"     report: {os.path.join(model_dir, 'compile', 'report.txt')}")
    print(f"zoo {action}: {len(folders) - failures} passed, {failures} failed")
    return 1 if failures or not folders else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("list", "compile", "train"))
    parser.add_argument("--framework", choices=FRAMEWORKS)
    args = parser.parse_args(argv)
    folders = model_folders(args.framework)
    if args.action == "list":
        for folder in folders:
            print(os.path.relpath(folder, ROOT))
        return 0
    return run_stages(args.action, folders)


if __name__ == "__main__":
    sys.exit(main())

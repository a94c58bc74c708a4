"""Mutation testing of the emulator, the params and the runners: `tox -e mutation` (slow).

mutmut 3 (https://mutmut.readthedocs.io) changes one operator, constant or call at a time
in the modules of a group and runs the tests that execute the changed function; a mutant
that leaves every one of them green "survived": a behaviour change no test would catch.
tests/MUTATION.md holds the figures, how to read them, and the survivors judged equivalent.

    python tests/mutation.py                    # every group, in the order of GROUPS
    python tests/mutation.py program cost       # some groups
    python tests/mutation.py --rerun program    # the same copy again: only changed functions
                                                # and the survivors are run (after a new test)
    python tests/mutation.py --jobs 1 place     # one mutant at a time (a shared machine)
    python tests/mutation.py pytorch --only 'common.pytorch.base_model.*'
                                                # only the mutants these names or globs match;
                                                # with --rerun, only those of them not killed yet
    python tests/mutation.py --list             # the groups, their modules and tests

Each group runs in its own copy of the working tree, .mutation/<group>/ (mutmut's
mutants/ folder and its cache live there, never in the checkout); inspect a survivor
with `cd .mutation/<group> && mutmut show <name>` (or `mutmut browse`). The exit status
is 1 when a survivor is neither killed nor listed as equivalent in tests/MUTATION.md.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
MUTATION_MD = ROOT / "tests" / "MUTATION.md"

# group: (modules to mutate, the tests that cover them), in priority order. mutmut maps
# each test to the functions it runs once per group, then runs a mutant against only the
# tests of its function, fastest first, until one fails; a survivor runs them all. The
# tests are each module's own (the end-to-end runs of tests/pytorch/test_pt_device.py and
# tests/tf/test_tf_device.py would add minutes per survivor), so that a group takes minutes.
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "precision": (["device/dtypes.py", "common/precision.py"],
                  ["tests/device/test_dtypes.py", "tests/device/test_program.py", "tests/common/test_precision.py",
                   "tests/tf/test_tf_optim.py",
                   "tests/pytorch/test_pt_bad_input.py::test_mixed_precision_dtype_the_cpu_lacks"]),
    "optimizers": (["device/runtime/optimizers.py", "device/optimizer.py", "common/pytorch/optim.py", "common/tf/optim.py"],
                   ["tests/device/test_optimizers.py", "tests/device/test_kernels_tf.py", "tests/device/test_program.py",
                    "tests/pytorch/test_pt_optim.py", "tests/tf/test_tf_optim.py", "tests/pytorch/test_pt_loss_scale.py",
                    "tests/tf/test_tf_loss_scale.py", "tests/tf/test_tf_distribute_graph.py"]),
    "program": (["device/runtime/program.py", "device/runtime/memory.py"],
                ["tests/device/test_program.py", "tests/device/test_dtypes.py", "tests/device/test_memory.py"]),
    "kernels": (["device/ops/*.py"],
                ["tests/device/test_ops.py", "tests/device/test_kernels_numpy.py", "tests/device/test_kernels_tf.py",
                 "tests/device/test_reductions_numpy.py", "tests/device/test_vision_loss_kernels.py"]),
    "cost": (["device/cost.py"], ["tests/device/test_cost.py", "tests/device/test_report.py"]),
    "params": (["common/params.py", "common/errors.py"],
               ["tests/common/test_params.py", "tests/common/test_vendor_params.py", "tests/common/test_cli.py",
                "tests/common/test_errors.py"]),
    "place": (["device/place.py"], ["tests/device/test_place.py", "tests/device/test_cost.py", "tests/device/test_report.py"]),
    # the runners last: other work lands there often
    # the runner's own tests (about 65 s, of tests/pytorch's 2,000+ tests and hours): not the model families'
    # end-to-end runs, nor the tests that train in subprocesses (they map to no function) or compare
    # 50-step mixed-precision losses (35 s); common/pytorch/optim.py is the optimizers group's
    "pytorch": ([f"common/pytorch/{name}.py" for name in ("base_model", "cb_model", "checkpoint", "data_order",
                                                          "device_run", "distributed", "metrics", "run", "runner",
                                                          "utils")],
                [f"tests/pytorch/test_{name}.py" for name in (
                    "pt_runner", "pt_runner_loop", "pt_device_run", "pt_mnist", "pt_bad_input", "pt_checkpoint_fallback", "pt_vendor_metrics",
                    "vendor_fixture", "vendor_migrated", "pt_loss_scale", "pt_distributed", "pt_step_backends",
                    "pt_optim", "pt_device")]
                + ["--deselect=tests/pytorch/test_pt_device.py::test_mixed_precision_losses_within_2e_2",
                   "--deselect=tests/pytorch/test_pt_bad_input.py::test_the_real_entry_point"]
                + [f"--deselect=tests/pytorch/test_pt_distributed.py::test_{name}" for name in (
                    "two_processes_train_as_one_with_twice_the_batch_and_resume_with_one",
                    "a_killed_process_stops_the_others_with_one_line_and_the_run_resumes",
                    "two_processes_evaluate_halves_and_report_the_metrics_of_one",
                    "the_device_refuses_a_data_parallel_launch", "the_tf_strategy_keys_are_refused_in_one_line")]),
    # the TF runner's own tests (170 tests, of tests/tf's 1,700+ and hours): not the model
    # families' end-to-end runs, nor the test that trains in a subprocess (it maps to no function)
    "estimator": (["common/tf/estimator/*.py"],
                  [f"tests/tf/test_{name}.py" for name in (
                      "tf_estimator", "tf_train_loop", "tf_eval_predict", "tf_distribute_graph", "tf_checkpoint_damage",
                      "tf_checkpoint_paths", "tf_loss_scale", "tf_mnist", "tf_step_backends")]
                  + ["--deselect=tests/tf/test_tf_mnist.py::test_tiny_config_runs_without_torch"]),
}

# mutmut's summary line: done/total, then killed, no tests, timeout, suspicious, survived, skipped, type check
_SUMMARY = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)\s+🔇 (\d+)")
# an equivalent mutant in tests/MUTATION.md: | `name` | `the mutated line` | reason |
_EQUIVALENT = re.compile(r"^\|\s*`([^`]+__mutmut_\d+)`\s*\|\s*`([^`]*)`\s*\|")


def _mutmut() -> str:
    found = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or shutil.which("mutmut")
    if not found:
        sys.exit("mutmut is not installed: pip install -e '.[mutation]' (or run tox -e mutation)")
    return found


def _config(modules: list[str], tests: list[str], fresh_imports: bool = False) -> str:
    def toml_list(items):
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    # the whole packages are copied (a mutated module imports its unmutated siblings);
    # only_mutate picks the group's modules; model folders and data travel with the tests
    return "\n".join([
        "", "[tool.mutmut]",
        'source_paths = ["common", "device"]',
        f"only_mutate = {toml_list(modules)}",
        'also_copy = ["pytorch", "tf", "datasets", "benchmarks", "README.md"]',
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore"]',
        # torch and TensorFlow are not fork-safe once they have run: fork every mutant from
        # a server that has only imported them
        'process_isolation = "forkserver"',
        # a mutant that never ends its loop (`while step < last or ...`) is stopped after this many times
        # its tests' seconds of CPU (x 2, + 1 s), not mutmut's 15: a train loop's 50 s of tests made each such
        # mutant cost 25 minutes. 3 leaves a survivor, which runs all its tests, three times its CPU time.
        "timeout_multiplier = 3.0",
        *(['forkserver_warmup = "import"', 'preload_modules_file = "mutation-preload.txt"'] if fresh_imports else []),
        "",
    ])


# a function a module calls when it is imported (device/ops builds its kernels so: _unary_op(np.exp, ...))
# has already run, unmutated, in mutmut's fork server, which imports the tests before it switches a mutant
# on. Such mutants run again in a second pass whose fork server imports only these modules (importing
# TensorFlow there crashes its children), so that each mutant's test process imports the group's modules
# afresh with the mutant on, against every test of the group.
_PRELOAD = ["numpy", "torch"]
_TRACE_IMPORT = r"""
import importlib, json, sys
files, called = set(sys.argv[2:]), set()
def profile(frame, event, arg):
    # functions only (CO_NEWLOCALS): not a module's or a class body's code
    if event == "call" and frame.f_code.co_flags & 2 and frame.f_code.co_filename in files:
        called.add((frame.f_code.co_filename, frame.f_code.co_qualname))
sys.setprofile(profile)
for name in sys.argv[1].split(","):
    importlib.import_module(name)
sys.setprofile(None)
print(json.dumps(sorted(called)))
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _mangled(module: str, qualname: str) -> str | None:
    """mutmut's name of a function (``module.x_f``) or method (``module.xǁClassǁf``); None for what it
    does not mutate (module code, lambdas and comprehensions, nested classes' methods)."""
    parts = qualname.split(".<locals>.")[0].split(".")
    if any(part.startswith("<") for part in parts) or len(parts) > 2:
        return None
    return f"{module}.x_{parts[0]}" if len(parts) == 1 else f"{module}.xǁ{parts[0]}ǁ{parts[1]}"


def _importable(modules: list[str]) -> dict[str, str]:
    """The group's module files (but __main__.py: importing it runs it) -> their module names."""
    paths = sorted({path.resolve() for pattern in modules for path in ROOT.glob(pattern)})
    return {str(path): _module_name(path) for path in paths if path.name != "__main__.py"}


def _collect(workdir: Path, env: dict, tests: list[str], mutant: str) -> subprocess.CompletedProcess:
    """pytest's collection of the group's tests in mutmut's copy, with ``mutant`` on ("": none)."""
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=workdir / "mutants", env=dict(env, MUTANT_UNDER_TEST=mutant), capture_output=True,
                          text=True, timeout=300)


def import_time_functions(modules: list[str]) -> set[str]:
    """mutmut's names of the group's functions that run when the group's modules are imported, found by
    importing them (from this checkout) with a profiler on."""
    names = _importable(modules)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", _TRACE_IMPORT, ",".join(names.values()), *names], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True).stdout
    return {name for file, qualname in json.loads(out.splitlines()[-1])
            if (name := _mangled(names[file], qualname))}


def _map_to_every_test(workdir: Path, env: dict, tests: list[str], functions: set[str]) -> bool:
    """Make mutmut run every test of the group for these functions' mutants (its own map, made while
    the tests ran, gives an import-time call to whichever test happened to run first). The tests are
    collected afresh. True if some are new: mutmut then times them at its next run, and maps them
    to what they call, out of these functions' map."""
    collected = _collect(workdir, env, tests, "").stdout
    stats_path = workdir / "mutants" / "mutmut-stats.json"
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    every = sorted(set(stats["duration_by_test"]) | {line.strip() for line in collected.splitlines() if "::" in line})
    for function in functions:
        stats["tests_by_mangled_function_name"][function] = every
    stats_path.write_text(json.dumps(stats), encoding="utf-8")
    return bool(set(every) - set(stats["duration_by_test"]))


_IMPORT_FAILURES = "import-failures.json"


def _check_imports(workdir: Path, env: dict, modules: list[str], tests: list[str], names: list[str]) -> None:
    """Record the mutants with which the group's modules fail to import, or its tests to be collected,
    with the error's line.

    mutmut's test process reports such a mutant as a timeout (pytest finds none of the tests it was
    given: their modules did not import), but no test can run with it: it is killed.
    """
    imports = "; ".join(f"import {name}" for name in _importable(modules).values())
    record = workdir / _IMPORT_FAILURES
    failures = json.loads(record.read_text(encoding="utf-8")) if record.exists() else {}
    for name in names:
        failures.pop(name, None)
        try:
            done = subprocess.run([sys.executable, "-c", imports], cwd=workdir / "mutants", capture_output=True,
                                  text=True, timeout=300, env=dict(env, MUTANT_UNDER_TEST=name))
            if done.returncode == 0:  # imported: can the tests be collected? (5: no tests)
                done = _collect(workdir, env, tests, name)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode not in (0, 5):
            lines = (done.stdout + done.stderr).strip().splitlines()
            errors = [line for line in lines if line.startswith("ERROR ")] or lines[-1:]
            failures[name] = errors[0] if errors else f"exit status {done.returncode}"
    record.write_text(json.dumps(failures, indent=1, sort_keys=True), encoding="utf-8")


def _copy_tree(target: Path) -> None:
    """The working tree's files (tracked and untracked, not ignored) into ``target``, mtimes kept.

    An unchanged file keeps its mtime, so mutmut's cache keeps its results on a rerun.
    """
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source, dest = ROOT / name, target / name
        if not source.is_file():  # deleted but still tracked
            continue
        if dest.exists() and dest.stat().st_mtime == source.stat().st_mtime:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)


def equivalents() -> dict[str, str]:
    """The mutants tests/MUTATION.md marks equivalent: name -> the mutated line it recorded."""
    if not MUTATION_MD.exists():
        return {}
    found = {}
    for line in MUTATION_MD.read_text(encoding="utf-8").splitlines():
        match = _EQUIVALENT.match(line)
        if match:
            found[match.group(1)] = match.group(2).replace("\\|", "|")  # a | in a table cell is written \|
    return found


def _results(workdir: Path, env: dict, mutmut_only: bool = False) -> dict[str, str]:
    """mutmut's own verdict on every mutant of the group: killed, survived, no tests, timeout, ...; and
    killed for the mutants with which the group's modules fail to import (unless ``mutmut_only``)."""
    out = subprocess.run([_mutmut(), "results", "--all", "true"], cwd=workdir, env=env, capture_output=True,
                         text=True).stdout
    found = {}
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if "__mutmut_" in name:
            found[name] = status
    record = workdir / _IMPORT_FAILURES
    for name in [] if mutmut_only or not record.exists() else json.loads(record.read_text(encoding="utf-8")):
        if found.get(name) == "timeout":  # mutmut's verdict when none of the tests could be collected
            found[name] = "killed"
    return found


def _survivors(workdir: Path, env: dict) -> dict[str, str]:
    """The mutants no test killed (survived, no tests, timeout, ...), with their status."""
    return {name: status for name, status in _results(workdir, env).items() if status != "killed"}


_SOURCES: dict[Path, dict[str, str]] = {}


def _functions(path: Path) -> dict[str, str]:
    """The source of every function (and method) in mutmut's mutated copy of a module, by name."""
    if path not in _SOURCES:
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        # whole lines by the nodes' line numbers: ast.get_source_segment splits the whole text again for
        # each function, minutes for the thousands of functions of a mutated module
        _SOURCES[path] = {node.name: "".join(lines[node.lineno - 1:node.end_lineno])
                          for node in ast.walk(ast.parse(text))
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return _SOURCES[path]


def _mutated_line(workdir: Path, env: dict, name: str) -> str:
    """The first line the mutant changes (what `mutmut show` prints with a +), read from mutants/."""
    module = re.match(r"(.*?)\.(x[_ǁ].*)", name)
    path = workdir / "mutants" / module.group(1).replace(".", "/")
    # a package's own functions (device.ops) live in its __init__.py
    functions = _functions(path / "__init__.py" if path.is_dir() else path.with_name(path.name + ".py"))
    mutant = functions.get(module.group(2), "").splitlines()[1:]
    original = functions.get(re.sub(r"__mutmut_\d+$", "__mutmut_orig", module.group(2)), "").splitlines()[1:]
    added = [line[1:].strip() for line in difflib.unified_diff(original, mutant, lineterm="", n=0)
             if line.startswith("+") and not line.startswith("+++")]
    return added[0] if added else ""


def _names_to_run(only: list[str], results: dict[str, str]) -> list[str]:
    """What to hand `mutmut run` for ``only``'s names or globs: the globs themselves on a fresh copy
    (``results`` empty) or where they match no mutant yet (a module new to the group), else the
    matching mutants not killed yet (mutmut given a name or glob runs it again even when killed)."""
    if not only or not results:
        return list(only)
    names = set()
    for pattern in only:
        matches = [name for name in results if fnmatch.fnmatchcase(name, pattern)]
        names |= {name for name in matches if results[name] != "killed"} if matches else {pattern}
    return sorted(names)


def run_group(group: str, rerun: bool, jobs: int | None = None, only: list[str] | None = None) -> int:
    """Run one group (``jobs`` mutants at a time, default one per core), or only its mutants that
    ``only``'s names or globs match; returns how many survivors are not explained."""
    modules, tests = GROUPS[group]
    workdir = SCRATCH / group
    if not rerun and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    _copy_tree(workdir)
    for pattern in modules:  # a module new to the group: mutmut took its unmutated copy as up to date,
        for path in ROOT.glob(pattern):  # and mapped the tests without it
            copy = workdir / "mutants" / path.relative_to(ROOT)
            if copy.exists() and not copy.with_name(copy.name + ".meta").exists():
                copy.unlink()
                (workdir / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    pyproject = workdir / "pyproject.toml"
    base = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pyproject.write_text(base + _config(modules, tests), encoding="utf-8")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0",
               # the tests of one mutant run on one core: mutmut runs one mutant per core
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               # tests/tf/test_tf_distribute_graph.py sets up two logical CPUs on import, in the process
               # of the tests (elsewhere it runs in a process of its own)
               ZOO_TEST_LOGICAL_CPUS="2")
    env.pop("PYTHONPATH", None)  # the mutated copy must be what the tests import
    print(f"== {group}: mutating {' '.join(modules)}; tests {' '.join(tests)}", flush=True)
    children = ["--max-children", str(jobs)] if jobs else []
    at_import = import_time_functions(modules)
    names = _names_to_run(only or [], _results(workdir, env) if rerun else {})
    if only and not names:
        print(f"== {group}: every mutant {' '.join(only)} matches is killed already")
        return _report(workdir, env, group)
    # the mutants a rerun names one by one go to the second pass only if their function runs at import
    first = [name for name in names if not re.search(r"__mutmut_\d+$", name)
             or name.partition("__mutmut_")[0] not in at_import]
    run, output = None, ""
    if first or not names:
        run = subprocess.run([_mutmut(), "run", *children, *first], cwd=workdir, env=env, capture_output=True,
                             text=True)
        output = run.stdout + run.stderr
    survivors = _survivors(workdir, env) if rerun and not only and run.returncode == 0 else {}
    survivors = [name for name in survivors if name.partition("__mutmut_")[0] not in at_import]
    if survivors:
        # mutmut's first pass kept its verdicts on unchanged code; a new test may kill a survivor
        run = subprocess.run([_mutmut(), "run", *children, *sorted(survivors)], cwd=workdir, env=env,
                             capture_output=True, text=True)
        output = run.stdout + run.stderr
    fresh = _names_to_run(only or ["*"], _results(workdir, env)) if run is None or run.returncode == 0 else []
    fresh = [name for name in fresh if name.partition("__mutmut_")[0] in at_import]
    if fresh:
        functions = sorted({re.sub(r"^x_|^xǁ(\w+)ǁ", lambda m: f"{m.group(1)}." if m.group(1) else "",
                                   name.partition("__mutmut_")[0].rpartition(".")[2]) for name in fresh})
        print(f"== {group}: {len(fresh)} mutants of functions run at import ({', '.join(functions)}) again, "
              f"each test process importing the modules afresh", flush=True)
        if _map_to_every_test(workdir, env, tests, at_import):  # new tests: timed (one mutant), mapped again
            subprocess.run([_mutmut(), "run", *children, fresh[0]], cwd=workdir, env=env, capture_output=True)
            _map_to_every_test(workdir, env, tests, at_import)
        (workdir / "mutation-preload.txt").write_text("\n".join(_PRELOAD) + "\n", encoding="utf-8")
        pyproject.write_text(base + _config(modules, tests, fresh_imports=True), encoding="utf-8")
        try:
            run = subprocess.run([_mutmut(), "run", *children, *fresh], cwd=workdir, env=env,
                                 capture_output=True, text=True)
        finally:
            pyproject.write_text(base + _config(modules, tests), encoding="utf-8")
        output = run.stdout + run.stderr
        results = _results(workdir, env, mutmut_only=True)
        _check_imports(workdir, env, modules, tests, [name for name in fresh if results.get(name) == "timeout"])
        now = _results(workdir, env)
        failed = sum(now[name] == "killed" and results[name] == "timeout" for name in fresh)
        print(f"== {group}: {failed} of them make the modules fail to import or the tests fail to be collected: "
              f"killed (mutmut's summary counts them as timeouts, ⏰)", flush=True)
    summaries = _SUMMARY.findall(output.replace("\r", "\n"))
    if run.returncode != 0 or not summaries:
        print(output[-4000:])
        print(f"== {group}: mutmut failed (exit status {run.returncode})")
        return 1
    done, total, killed, no_tests, timeout, suspicious, survived, skipped = summaries[-1]
    print(f"== {group}: {done}/{total}  🎉 {killed} 🫥 {no_tests}  ⏰ {timeout}  🤔 {suspicious}  🙁 {survived}  "
          f"🔇 {skipped}   (mutmut's last summary line)")
    if done != total and not only:  # interrupted: the mutants not checked yet are listed as "not checked"
        print(f"== {group}: incomplete, {int(total) - int(done)} mutants not checked yet (--rerun {group} resumes)")
    return _report(workdir, env, group)


def _report(workdir: Path, env: dict, group: str) -> int:
    """Per module mutmut's verdicts; the mutants tests/MUTATION.md marks equivalent, and the
    others that no test killed with their mutated line."""
    results = _results(workdir, env)
    known = equivalents()
    per_module: dict[str, list[str]] = {}
    for name in results:
        per_module.setdefault(re.match(r"(.*?)\.x[_ǁ]", name).group(1), []).append(name)
    unexplained = 0
    for module, names in sorted(per_module.items()):
        alive = [n for n in names if results[n] != "killed"]
        marked = [n for n in alive if n in known and known[n] == _mutated_line(workdir, env, n)]
        counts = ", ".join(f"{count} {status}" for status, count in
                           sorted(Counter(results[n] for n in names).items(), key=lambda sc: -sc[1]))
        print(f"   {module}: {len(names)} mutants: {counts}; {len(marked)} of those not killed marked equivalent")
        for name in sorted(set(alive) - set(marked)):
            unexplained += 1
            print(f"     {results[name]}: {name}: {_mutated_line(workdir, env, name)}")
    print(f"== {group}: {unexplained} not explained (cd {workdir.relative_to(ROOT)} && mutmut show NAME)")
    return unexplained


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"groups to run (default all): {', '.join(GROUPS)}")
    parser.add_argument("--rerun", action="store_true",
                        help="keep .mutation/GROUP: rerun the survivors and whatever changed")
    parser.add_argument("--report", action="store_true", help="only print the survivors of the last run")
    parser.add_argument("--list", action="store_true", help="list the groups")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only the mutants this name or glob matches (repeatable), e.g. "
                             "'common.pytorch.base_model.*'; with --rerun, only those not killed yet")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="mutants run at a time (default one per core; 1 on a machine shared with other work)")
    args = parser.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group {unknown[0]!r}; the groups: {', '.join(GROUPS)}")
    if args.only and len(args.groups) != 1:
        parser.error("--only needs one group, the one its mutants belong to")
    if args.list:
        for group, (modules, tests) in GROUPS.items():
            print(f"{group:11s} {' '.join(modules)}\n{'':11s} tests: {' '.join(tests)}")
        return 0
    unexplained = 0
    for group in args.groups or list(GROUPS):
        if args.report:
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            unexplained += _report(SCRATCH / group, env, group)
        else:
            unexplained += run_group(group, args.rerun, args.jobs, args.only)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())

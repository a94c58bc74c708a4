"""Fuzzed command lines and params files (hypothesis): every case ends in clean params or one
error line, never a traceback; through run.py in a process of its own, nothing is written
outside model_dir.

The in-process cases go through what run.py does before it touches anything: the command
line (common/cli.py: parse_command_line), then defaults -> the params file -> overrides ->
validation (effective_params, common/params.py), with mnist's defaults of each framework.
A case that parses must give params that survive their own round trip (written as
params_<mode>.yaml and loaded again, the same params). 100 cases per framework and kind in
tox, 1,000 with RELIABILITY_FULL=1 (hypothesis derandomized: the same cases each run).
Through run.py in its own process: 1 case per framework in tox, 40 in full.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from common.cli import effective_params, parse_command_line  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.folder import import_beside  # noqa: E402
from common.params import COMMON_DEFAULTS, MODES, Typed, load_params, merge_defaults, save_params, thaw  # noqa: E402
from tests.reliability.conftest import FULL, ROOT, trials  # noqa: E402

FRAMEWORKS = ("pytorch", "tf")
CASES = trials(100, 1000)
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])


def folder(framework: str) -> Path:
    return ROOT / framework / "mnist"


def defaults(framework: str):
    return import_beside(str(folder(framework) / "run.py"), "utils").default_params


def key_paths(spec, path=()):
    """Every leaf key path of a defaults spec, e.g. ('model', 'hidden_sizes')."""
    for key, value in spec.items():
        if isinstance(value, dict):
            yield from key_paths(value, path + (key,))
        else:
            yield path + (key,)


KEYS = {fw: sorted(key_paths(merge_defaults(COMMON_DEFAULTS, defaults(fw)()))) for fw in FRAMEWORKS}

# values a user might write, or mistype: numbers at and past every bound, specials, wrong types
scalars = st.one_of(
    st.integers(-3, 3), st.integers(-2**63, 2**63), st.sampled_from([0, 1, -1, 2**31, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 0.999999, 1e-300, -0.0]),
    st.booleans(), st.none(),
    st.sampled_from(["adam", "sgd", "relu", "dynamic", "bfloat16", "mnist", "auto", "", "1e-3", "0x10", "~",
                     "null", "yes", "[1, 2", "{a: 1}", "!!python/name:os.system", "&a", "*a", "%", "é", "\t"]),
    st.text(max_size=12),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def key_text(framework: str):
    """A key path as typed on a command line: a real one, a misspelt one, or junk."""
    real = st.sampled_from(KEYS[framework]).map(".".join)
    misspelt = st.tuples(real, st.sampled_from(["", "s", "_", ".x", "..", " "])).map("".join)
    return st.one_of(real, real, misspelt, st.text(min_size=0, max_size=10))


def override(framework: str):
    as_yaml = values.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
                         .removesuffix("\n...").removesuffix("..."))
    raw = st.one_of(as_yaml, st.text(max_size=10))
    return st.tuples(key_text(framework), raw).map(lambda kv: f"{kv[0]}={kv[1]}") | st.text(max_size=10)


def flags():
    """Some of run.py's flags, with values right and wrong."""
    number = st.one_of(st.integers(-5, 10**12).map(str), st.sampled_from(["", "x", "1.5", "-0", "1e3"]))
    pairs = st.one_of(
        st.tuples(st.just("--mode"), st.one_of(st.sampled_from(MODES), st.text(max_size=6))),
        st.tuples(st.sampled_from(["--max_steps", "--steps", "--eval_steps"]), number),
        st.tuples(st.just("--device"), st.sampled_from(["cpu", "gpu", "emulator", "tpu", ""])),
        st.tuples(st.sampled_from(["--verbose", "--validate_only", "--compile_only", "--bogus", "-x"])),
    )
    return st.lists(pairs, max_size=3).map(lambda ps: [item for p in ps for item in p])


def check_one_line(error: str) -> None:
    assert error and "\n" not in error.strip() and "Traceback" not in error, error


def parse(framework: str, argv: list[str]):
    """run.py's parse, in this process: params, or the one line run.py would print (and its status)."""
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr):
            args = parse_command_line(argv, prog="mnist/run.py")
    except SystemExit as e:
        text = stderr.getvalue() or str(e.code)
        check_one_line(text)
        assert e.code == 2 or isinstance(e.code, str), e.code  # argparse: 2; a message: status 1
        return None, text
    if args.validate_only and args.compile_only:
        pytest.fail("argparse let both --validate_only and --compile_only through")
    try:
        return effective_params(args, defaults(framework), str(folder(framework)), framework), None
    except UserError as e:
        check_one_line(str(e))
        return None, str(e)


def round_trip(framework: str, params, tmp: Path) -> None:
    """Written as params_train.yaml and loaded again: the same params (what a resume reads)."""
    written = save_params(params, str(tmp), "train")
    again = load_params(written, defaults(framework)())
    assert _equal(thaw(again), thaw(params)), (thaw(params), thaw(again))


def _equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b and type(a) is type(b)


@pytest.fixture(scope="module")
def outcomes(ledger):
    counts = {fw: [0, 0] for fw in FRAMEWORKS}  # cases, lost
    yield counts
    for fw, (n, lost) in counts.items():
        if n:
            ledger.record(f"fuzzed command lines and params files ({fw} mnist, in process)", n, lost)


def _case(outcomes, framework, body):
    outcomes[framework][0] += 1
    try:
        body()
    except BaseException:
        outcomes[framework][1] += 1
        raise


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fuzzed_command_lines_parse_or_stop_with_one_line(framework, tmp_path_factory, outcomes):
    @FUZZ
    @given(flags(), st.lists(override(framework), max_size=5))
    def case(flag_args, overrides):
        def body():
            params, _ = parse(framework, [*flag_args, *overrides])
            if params is not None:
                round_trip(framework, params, tmp_path_factory.mktemp("rt"))

        _case(outcomes, framework, body)

    case()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fuzzed_params_files_load_or_stop_with_one_line(framework, tmp_path_factory, outcomes):
    sections = st.dictionaries(st.one_of(st.sampled_from([k[0] for k in KEYS[framework]]), st.text(max_size=6)),
                               st.one_of(st.dictionaries(st.one_of(st.sampled_from([k[-1] for k in KEYS[framework]]),
                                                                   st.text(max_size=6)), values, max_size=4),
                                         values),
                               max_size=4)
    text = st.one_of(sections.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
                     st.text(max_size=80), st.binary(max_size=40).map(lambda b: b.decode("latin-1")))

    @FUZZ
    @given(text, st.booleans())
    def case(content, with_base):
        def body():
            path = tmp_path_factory.mktemp("params") / "params.yaml"
            base = f"base: {folder(framework) / 'configs' / 'params.yaml'}\n" if with_base else ""
            path.write_text(base + content, encoding="utf-8", errors="surrogateescape")
            params, error = parse(framework, ["--params", str(path)])
            if params is not None:
                round_trip(framework, params, path.parent)
            else:
                assert error.startswith(str(path)), error  # the file (and line) at fault

        _case(outcomes, framework, body)

    case()


# --- through run.py, each in a process of its own ----------------------------------------------

def _files(top: Path) -> set[Path]:
    return {p for p in top.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fuzzed_command_lines_through_run_py_write_only_into_model_dir(framework, tmp_path_factory, ledger):
    """Cases whose params stop in process stop the same way as a user meets them, and write
    nothing at all; a case that parses trains 2 steps and writes into its model_dir only."""
    pytest.importorskip({"pytorch": "torch", "tf": "tensorflow"}[framework])
    count = trials(1, 40, slow=True)
    results = []

    @settings(max_examples=count, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate])  # no shrinking: a process per case; the case is shown
    @given(st.lists(override(framework), min_size=1, max_size=3))
    def case(overrides):
        work = tmp_path_factory.mktemp("work")
        argv = ["--model_dir", "md", "train_input.dataset=uci_digits", "eval_input.dataset=uci_digits",
                *overrides, "--max_steps", "2", "runconfig.max_steps=2", "model.hidden_sizes=[8]",
                "train_input.batch_size=8", "eval_input.batch_size=8"]
        in_process, error = parse(framework, argv)
        before = _files(ROOT / framework / "mnist")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run([sys.executable, str(folder(framework) / "run.py"), *argv], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)
        model_dir = work / (in_process["runconfig"]["model_dir"] if in_process is not None else "md")
        outside = [p for p in _files(work) if model_dir.resolve() not in p.resolve().parents]
        lost = bool(outside) or _files(ROOT / framework / "mnist") != before or "Traceback" in done.stderr
        if error is not None:
            lines = [line for line in done.stderr.splitlines() if "error:" in line]
            lost |= done.returncode != 2 or len(lines) != 1 or error not in lines[0] or model_dir.exists()
        else:
            lost |= done.returncode != 0
        results.append(lost)
        assert not lost, (argv, done.returncode, done.stderr[-2000:], outside)

    try:
        case()
    finally:
        ledger.record(f"fuzzed command lines through {framework}/mnist/run.py (own process)", len(results),
                      sum(results))

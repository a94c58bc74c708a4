"""common/readme_check.py: README result tables rerun and compared at their printed precision.

These tests run a stand-in command that writes known scalars. The READMEs' own tables
rerun whole trainings (about a minute for both mnist folders on 2 cores): `tox -e train`
runs them with `python -m common.readme_check`; here each checked table is only parsed.
"""

import os
import platform
import re
import sys
import textwrap

import pytest

from common.errors import UserError
from common.readme_check import ROOT, machine, main, parse_tables, readmes

FAKE_RUN = """\
import argparse, os
from common.summaries import ScalarWriter
parser = argparse.ArgumentParser()
parser.add_argument("--model_dir")
args, _ = parser.parse_known_args()
assert os.environ["PINNED"] == "2"  # NAME=value words of the command reach its environment
train, evaluate = ScalarWriter(os.path.join(args.model_dir, "train")), ScalarWriter(os.path.join(args.model_dir, "eval"))
train.scalars(500, {"loss": 0.0053412})
train.scalars(1000, {"loss": 0.00021})
evaluate.scalars(500, {"accuracy": 352 / 360, "loss": 0.12914, "top5_accuracy": 359 / 360})
evaluate.scalars(1000, {"accuracy": 353 / 360, "loss": 0.13691})
train.close(), evaluate.close()
"""


def readme(tmp_path, rows, header="| step | test accuracy (all 360) | test loss | training loss |", measured=""):
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(f"""\
        # a model

            $ PINNED=2 python {script} --mode train_and_eval{measured}

        {header}
        |---|---|---|---|
        """) + "".join(f"{row}\n" for row in rows) + "\nMore prose.\n")
    return path


def test_figures_that_hold_at_their_printed_precision_pass(tmp_path, capsys):
    path = readme(tmp_path, ["| 500 | 97.78 % | 0.129 | 0.00534 |", "| 1000 | 98.1 % | 0.13691 | 0.0002 |"])
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(re.escape(f"{path}:3: 6 of 6 figures hold: PINNED=2 python {tmp_path / 'fake_run.py'} "
                                  f"--mode train_and_eval  [") + r"\d+ s\]\n", out), out  # the command's wall time


def test_a_figure_that_differs_is_named_with_its_line(tmp_path, capsys):
    path = readme(tmp_path, ["| 500 | 98.06 % | 0.129 | 0.00534 |", "| 700 | 98.06 % | 0.14 | 0.011 |"])
    before = path.read_text()
    assert main([str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    command = f"PINNED=2 python {tmp_path / 'fake_run.py'} --mode train_and_eval"
    assert err == [
        f"{path}:7: step 500 test accuracy: the README says 98.06 %, `{command}` gives 97.78 %",
        f"{path}:8: step 700 test accuracy: the README says 98.06 %, `{command}` gives nothing",
        f"{path}:8: step 700 test loss: the README says 0.14, `{command}` gives nothing",
        f"{path}:8: step 700 training loss: the README says 0.011, `{command}` gives nothing",
    ]
    assert path.read_text() == before  # checking writes nothing


def test_top5_accuracy_is_a_column_of_its_own(tmp_path, capsys):
    header = "| step | test accuracy | test top-5 accuracy (all 360) | training loss |"
    assert main([str(readme(tmp_path, ["| 500 | 97.78 % | 99.72 % | 0.00534 |"], header=header))]) == 0
    assert main([str(readme(tmp_path, ["| 500 | 97.78 % | 97.78 % | 0.00534 |"], header=header))]) == 1
    assert "step 500 test top-5 accuracy: the README says 97.78 %" in capsys.readouterr().err


def test_the_printed_precision_decides(tmp_path):
    # 0.12914 is 0.13 at two decimals, but not 0.130 at three
    assert main([str(readme(tmp_path, ["| 500 | 97.8 % | 0.13 | 0.005 |"]))]) == 0
    assert main([str(readme(tmp_path, ["| 500 | 97.8 % | 0.130 | 0.005 |"]))]) == 1


def test_update_writes_the_measured_figures_in_place(tmp_path):
    path = readme(tmp_path, ["| 500 | 98.06 % | 0.128 | 0.011 |", "| 1000 | 97.50 % | 0.134 | 0.01100 |"])
    assert main(["--update", str(path)]) == 0
    text = path.read_text()
    assert "| 500 | 97.78 % | 0.129 | 0.005 |\n| 1000 | 98.06 % | 0.137 | 0.00021 |\n\nMore prose.\n" in text
    assert main([str(path)]) == 0


def test_update_of_a_figure_the_run_did_not_log_writes_nothing(tmp_path):
    path = readme(tmp_path, ["| 500 | 98.06 % | 0.128 | 0.011 |", "| 700 | 97.50 % | 0.134 | 0.011 |"])
    before = path.read_text()
    assert main(["--update", str(path)]) == 2
    assert path.read_text() == before


def test_a_shell_line_with_no_table_below_is_not_checked(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("Run it:\n\n    $ python run.py --mode train\n\nThen:\n\n| step | a |\n|---|---|\n| 1 | x |\n")
    assert parse_tables(str(path)) == []


@pytest.mark.parametrize("header, message", [
    ("| steps | test accuracy | test loss | training loss |", "the first column of a checked table is 'step', got 'steps'"),
    ("| step | top-3 accuracy | test loss | training loss |", "column 'top-3 accuracy' is not one the check"),
])
def test_a_table_the_check_cannot_read_is_one_line(tmp_path, header, message):
    path = readme(tmp_path, ["| 500 | 97.78 % | 0.129 | 0.00534 |"], header=header)
    with pytest.raises(UserError, match=rf"^{path}:5: {message}"):
        parse_tables(str(path))
    assert main([str(path)]) == 2


def test_a_percentage_must_say_so(tmp_path):
    path = readme(tmp_path, ["| 500 | 97.78 | 0.129 | 0.00534 |"])
    with pytest.raises(UserError, match=rf"^{path}:7: '97.78' is not a figure of 'test accuracy' \(a number, then %\)"):
        parse_tables(str(path))


def test_the_zoo_readmes_checked_tables_parse():
    """What tox -e train reruns: the README of every model folder holds checked tables of its run.py."""
    tables = [(os.path.relpath(t.path, ROOT), t) for path in readmes() for t in parse_tables(path)]
    expected = [os.path.join(fw, model, "README.md") for fw in ("pytorch", "tf")
                for model in ("bert", "gpt2", "llama", "mnist", "resnet", "t5", "transformer", "unet")]
    # the language models' folders are built one framework at a time: each one present has its tables
    expected = [path for path in expected if not any(m in path for m in ("bert", "gpt2", "llama", "t5", "transformer"))
                or os.path.isdir(os.path.join(ROOT, os.path.dirname(path)))]
    assert sorted({path for path, _ in tables}) == sorted(expected)
    for path, table in tables:
        script = table.command.split(" python ")[1].split()[0]
        assert os.path.isfile(os.path.join(ROOT, script)) and os.path.dirname(script) == os.path.dirname(path)
        assert "THREADS=" in table.command  # the figures depend on the thread count: pinned
        assert table.machine, f"{path}:{table.line}: no `# measured on` machine (python -m common.readme_check --update)"
        assert len(table.figures) >= 3


def test_runs_as_a_module():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "common.readme_check", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--update" in done.stdout


def test_the_machine_is_its_architecture_and_widest_vector_unit():
    kind = machine()
    assert kind.split()[0] == platform.machine()
    assert len(kind.split()) <= 3


@pytest.mark.parametrize("flags, kind", [
    ("fpu sse avx avx2 fma", "avx2"),
    ("fpu avx2 avx512f avx512bw", "avx512f"),
    ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "avx512f amx"),
])
def test_a_cpu_with_matrix_tiles_is_another_kind(monkeypatch, flags, kind):
    import builtins
    import io

    real = builtins.open
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n"
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(cpuinfo) if path == "/proc/cpuinfo"
                        else real(path, *a, **k))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert machine() == f"x86_64 {kind}"


def test_on_the_measuring_kind_of_machine_every_figure_holds_exactly(tmp_path, capsys):
    path = readme(tmp_path, ["| 500 | 97.78 % | 0.130 | 0.00534 |"], measured=f"  # measured on {machine()}")
    assert parse_tables(str(path))[0].machine == machine()
    assert parse_tables(str(path))[0].command.endswith("--mode train_and_eval")
    assert main([str(path)]) == 1  # 0.12914 is not 0.130 at three decimals
    assert "step 500 test loss: the README says 0.130" in capsys.readouterr().err


BOUNDARY_RUN = """\
import argparse, os
from common.summaries import ScalarWriter
parser = argparse.ArgumentParser()
parser.add_argument("--model_dir")
args, _ = parser.parse_known_args()
evaluate = ScalarWriter(os.path.join(args.model_dir, "eval"))
evaluate.scalars(8, {"lm_perplexity": 2232.3496, "loss": 7.7101})
evaluate.close()
"""


@pytest.mark.parametrize("perplexity, status", [
    ("2232.3", 0),  # as the run prints it
    ("2232.4", 0),  # 2232.3496 is 2e-6 of itself below 2232.35: a run's last float32 bits decide that digit
    ("2232.2", 1),  # 0.15 off: 7e-5 of it, a change of the result
    ("2232.5", 1),
])
def test_on_the_measuring_kind_of_machine_a_figure_on_its_rounding_boundary_holds_either_way(
        tmp_path, capsys, perplexity, status):
    script = tmp_path / "boundary_run.py"
    script.write_text(BOUNDARY_RUN)
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(f"""\
        # T5

            $ python {script} --mode train_and_eval  # measured on {machine()}

        | step | test perplexity | test loss |
        |---|---|---|
        | 8 | {perplexity} | 7.710 |
        """))
    assert main([str(path)]) == status
    out, err = capsys.readouterr()
    if status:
        assert f"step 8 test perplexity: the README says {perplexity}, " in err
    boundary = " (step 8 test perplexity prints 2232.3 here: on its rounding boundary, within the last float32 bits)"
    assert (f"1 of 2 figures hold: python {script}" in out) if status else \
        (f"2 of 2 figures hold{boundary if perplexity == '2232.4' else ''}: python {script}" in out)
    assert main(["--update", str(path)]) == 0
    assert "| 8 | 2232.3 | 7.710 |" in path.read_text()  # --update writes what this run prints


@pytest.mark.parametrize("row, status", [
    ("| 500 | 97.22 % | 0.150 | 0.02 |", 0),  # within another CPU's rounding: 0.56 points, 0.021, 0.015
    ("| 500 | 95.00 % | 0.129 | 0.00534 |", 1),  # 2.78 points of accuracy
    ("| 500 | 97.78 % | 0.200 | 0.00534 |", 1),  # 0.07 of a test loss of 0.2: above 30 %
    ("| 500 | 97.78 % | 0.129 | 0.03 |", 1),  # 0.025 of a training loss: above 0.02
])
def test_on_another_kind_of_machine_figures_hold_within_its_rounding(tmp_path, capsys, row, status):
    path = readme(tmp_path, [row], measured="  # measured on sparc64 vis3")
    assert main([str(path)]) == status
    out = capsys.readouterr().out
    assert ("measured on sparc64 vis3; this is " + machine()) in out


def test_update_writes_the_machine_it_measured_on(tmp_path):
    path = readme(tmp_path, ["| 500 | 97.22 % | 0.129 | 0.00534 |"], measured="  # measured on sparc64 vis3")
    assert main(["--update", str(path)]) == 0
    text = path.read_text()
    assert f"--mode train_and_eval  # measured on {machine()}\n" in text
    assert "| 500 | 97.78 % | 0.129 | 0.00534 |" in text  # remeasured exactly, not kept as within tolerance
    assert main([str(path)]) == 0


BERT_RUN = """\
import argparse, os
from common.summaries import ScalarWriter
parser = argparse.ArgumentParser()
parser.add_argument("--model_dir")
args, _ = parser.parse_known_args()
evaluate = ScalarWriter(os.path.join(args.model_dir, "eval"))
evaluate.scalars(300, {"masked_lm_accuracy": 0.23456, "nsp_accuracy": 0.6789, "mlm_perplexity": 312.46,
                       "loss": 6.4})
evaluate.close()
"""


def test_bert_pretraining_columns_read_their_scalars(tmp_path):
    script = tmp_path / "bert_run.py"
    script.write_text(BERT_RUN)
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(f"""\
        # BERT

            $ python {script} --mode train_and_eval

        | step | test MLM accuracy (861 sequences) | test NSP accuracy | test MLM perplexity | test loss |
        |---|---|---|---|---|
        | 300 | 1.00 % | 1.0 % | 1.0 | 1.00 |
        """))
    assert main(["--update", str(path)]) == 0
    assert "| 300 | 23.46 % | 67.9 % | 312.5 | 6.40 |" in path.read_text()
    assert main([str(path)]) == 0


GPT2_RUN = """\
import argparse, os
from common.summaries import ScalarWriter
parser = argparse.ArgumentParser()
parser.add_argument("--model_dir")
args, _ = parser.parse_known_args()
evaluate = ScalarWriter(os.path.join(args.model_dir, "eval"))
evaluate.scalars(200, {"accuracy": 0.31234, "lm_perplexity": 87.654, "loss": 4.4734})
evaluate.close()
"""


def test_language_model_columns_read_their_scalars(tmp_path):
    script = tmp_path / "gpt2_run.py"
    script.write_text(GPT2_RUN)
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(f"""\
        # GPT-2

            $ python {script} --mode train_and_eval

        | step | test perplexity | test next-token accuracy | test loss |
        |---|---|---|---|
        | 200 | 1.0 | 1.00 % | 1.000 |
        """))
    assert main(["--update", str(path)]) == 0
    assert "| 200 | 87.7 | 31.23 % | 4.473 |" in path.read_text()
    assert main([str(path)]) == 0


SEQ2SEQ_RUN = """\
import argparse, os
from common.summaries import ScalarWriter
parser = argparse.ArgumentParser()
parser.add_argument("--mode")
parser.add_argument("--model_dir")
args = parser.parse_args()
evaluate = ScalarWriter(os.path.join(args.model_dir, "eval"))
evaluate.scalars(600, {"accuracy": 0.8123, "sequence_accuracy": 0.25, "loss": 1.5})
evaluate.close()
"""


def test_encoder_decoder_columns_read_their_scalars(tmp_path):
    script = tmp_path / "transformer_run.py"
    script.write_text(SEQ2SEQ_RUN)
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(f"""\
        # Transformer

            $ python {script} --mode train_and_eval

        | step | test token accuracy (teacher forced) | test sequence accuracy | test loss |
        |---|---|---|---|
        | 600 | 1.00 % | 1.00 % | 1.000 |
        """))
    assert main(["--update", str(path)]) == 0
    assert "| 600 | 81.23 % | 25.00 % | 1.500 |" in path.read_text()
    assert main([str(path)]) == 0


def test_skip_long_leaves_out_the_tables_marked_long(tmp_path, capsys):
    path = readme(tmp_path, ["| 500 | 12.34 % | 0.129 | 0.00534 |"])  # figures that would not hold
    text = path.read_text()
    path.write_text(text.replace("--mode train_and_eval\n", "--mode train_and_eval  # long; measured on x86_64\n", 1))
    assert main(["--skip_long", str(path)]) == 0
    assert "skipped (long; --skip_long)" in capsys.readouterr().out
    assert main([str(path)]) == 1  # without it, the table is checked (and its figures do not hold)

"""The calibration set (device/calibration.py): every point cited, its figure read from its quote, its
zoo config reproducing its shape in both twins; and the command's table on fake points (nothing is
compiled here: python -m device.calibration does that, minutes a point)."""

import os
import re

import pytest

from device.api import EXECUTION_MODES, HALF_PRECISIONS
from device.calibration import (FRAMEWORKS, PROFILE, PUBLISHED_RUNS, README, ROOT, UNITS, Outcome, PublishedRun,
                                compile_command, main, markdown_table, readme_markers, select, write_readme)
from zoo_base.errors import UserError

SOURCE = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}:\S.*$")  # owner/repo@commit:path
TOTAL = re.compile(r"(\d+) samples? ?(?:\(s\))? in ([\d.]+) seconds")  # TF's "Completed N sample(s) in S seconds"


def fake_point(**changes) -> PublishedRun:
    fields = dict(name="fake", family="Fake-1", framework="pytorch", batch_size=8, max_sequence_length=10,
                  precision="float16", execution_mode="weight_streaming", release="R9.9", published=100.0,
                  unit="samples/s", source="owner/repo@" + "0" * 40 + ":log.md", quote="Rate=100.00 samples/sec",
                  folder="gpt2", config="params_tiny.yaml", overrides=("train_input.batch_size=8",))
    fields.update(changes)
    return PublishedRun(**fields)


@pytest.mark.parametrize("point", PUBLISHED_RUNS, ids=lambda p: p.name)
def test_each_point_is_cited_and_its_figure_is_its_quotes(point):
    assert point.unit in UNITS and point.published > 0
    assert point.framework in FRAMEWORKS
    assert point.execution_mode in EXECUTION_MODES and point.precision in HALF_PRECISIONS
    assert re.fullmatch(r"R\d+\.\d+(\.\d+)?", point.release)
    assert SOURCE.match(point.source) or point.source.startswith("https://"), point.source
    assert point.quote and "\n" not in point.quote
    total = TOTAL.search(point.quote)
    if total:  # TF logs the run's samples and seconds: the figure is their quotient
        assert int(total.group(1)) / float(total.group(2)) == pytest.approx(point.published, abs=0.05)
    else:  # the vendor's PyTorch runner prints it: GlobalRate=<figure> samples/sec
        assert f"GlobalRate={point.published:.2f} samples/sec" in point.quote


def test_the_points_are_named_once():
    names = [point.name for point in PUBLISHED_RUNS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("point", [p for p in PUBLISHED_RUNS if p.folder], ids=lambda p: p.name)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_points_config_reproduces_its_shape(point, framework):
    """The folder's config with the point's overrides gives the published batch, sequence length,
    execution mode and precision, in both twins."""
    from common.folder import import_beside
    from common.params import load_params

    folder = os.path.join(ROOT, framework, point.folder)
    config = os.path.join(folder, "configs", point.config)
    assert os.path.isfile(config), config
    utils = import_beside(os.path.join(folder, "utils.py"), "utils")
    params = load_params(config, utils.default_params(), point.overrides, model_dir=None)
    assert params["train_input"]["batch_size"] == point.batch_size
    assert params["train_input"]["max_sequence_length"] == point.max_sequence_length
    assert params["device"]["execution_mode"] == point.execution_mode
    assert params["mixed_precision"]["enabled"] and params["mixed_precision"]["dtype"] == point.precision


def test_a_point_without_a_folder_has_no_config():
    for point in PUBLISHED_RUNS:
        assert (point.folder is None) == (point.config is None), point.name
        assert point.folder is not None or not point.overrides, point.name


def test_the_compile_command_is_the_folders_run_py_on_one_cs2():
    command = compile_command(fake_point(), "tf", "/tmp/md")
    assert command[1:] == [os.path.join("tf", "gpt2", "run.py"), "--params",
                           os.path.join("tf", "gpt2", "configs", "params_tiny.yaml"), "--compile_only",
                           "--model_dir", "/tmp/md", "train_input.batch_size=8", f"device.profile={PROFILE}"]
    assert PROFILE == "wse2"


def test_the_table_gives_estimate_published_and_their_ratio():
    rows = [(fake_point(), Outcome(samples_per_s=150.0, seconds=12.4, peak_bytes=3 * 2**29)),
            (fake_point(name="slow", published=19.8), Outcome(samples_per_s=12.04, seconds=70.0, peak_bytes=2**30))]
    lines = markdown_table(rows, "pytorch").splitlines()
    assert lines[0].startswith("| point | model | published run |") and "estimate (pytorch, wse2)" in lines[0]
    assert len(lines) == 4
    assert lines[2] == ("| fake | Fake-1 | pytorch R9.9 float16 | 8 | 10 | weight streaming | 150 samples/s "
                        "| 100 samples/s | 1.50 | 12 | 1.5 |")
    assert "| 12.04 samples/s | 19.80 samples/s | 0.61 | 70 | 1.0 |" in lines[3]


def test_the_table_converts_to_tokens_and_shows_a_failed_compile():
    tokens = fake_point(unit="tokens/s", published=1000.0, max_sequence_length=10)
    rows = [(tokens, Outcome(samples_per_s=50.0, seconds=1.0, peak_bytes=2**30)),
            (fake_point(name="broken"), Outcome(seconds=3.0, error="error: a | b does not fit")),
            (fake_point(name="nothing", folder=None, config=None, overrides=()), Outcome(error="no zoo folder"))]
    lines = markdown_table(rows, "tf").splitlines()
    assert "| 500 tokens/s | 1,000 tokens/s | 0.50 |" in lines[2]
    assert "| error: a / b does not fit | 100 samples/s | - | 3 | - |" in lines[3]  # a | would split the row
    assert lines[4].endswith("| no zoo folder | 100 samples/s | - | - | - |")


def test_write_readme_replaces_what_stands_between_the_markers(tmp_path):
    begin, end = readme_markers("tf")
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{begin}\nold table\n{end}\ntail\n")
    write_readme("| new |", "tf", str(readme))
    assert readme.read_text() == f"head\n{begin}\n| new |\n{end}\ntail\n"
    with pytest.raises(UserError, match="pytorch calibration table's markers"):
        write_readme("| new |", "pytorch", str(readme))


def test_the_readme_holds_the_pytorch_table_of_every_point():
    """A point added to the set without rerunning --write-readme leaves the README's table short."""
    with open(README) as f:
        text = f.read()
    begin, end = readme_markers("pytorch")
    assert text.count(begin) == 1 and text.count(end) == 1
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert [line.split("|")[1].strip() for line in table.strip().splitlines()[2:]] == \
        [point.name for point in PUBLISHED_RUNS]


def test_an_unknown_point_is_one_error_line(capsys):
    with pytest.raises(UserError, match="'bert_huge' is no point of the calibration set"):
        select(["bert_huge"])
    assert select([PUBLISHED_RUNS[1].name, PUBLISHED_RUNS[0].name]) == PUBLISHED_RUNS[:2]  # the set's order
    assert main(["--point", "bert_huge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --point 'bert_huge' is no point") and err.count("\n") == 1
    assert main(["--write-readme", "--point", PUBLISHED_RUNS[0].name]) == 2
    assert "drop --point" in capsys.readouterr().err

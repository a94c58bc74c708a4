"""A PyTorch folder as the vendor's zoo holds it (tests/fixtures/vendor_zoo/fc_tiny/pytorch) runs
after one ``zoo port migrate``: its ``run.py`` as migrated, the vendor's flags, on the CPU and
the emulator.

The folder calls the vendor's API the way the vendor's R1.6 fc_mnist does: ``cb_model``'s
streaming questions and ``rendezvous``, ``get_input_dtype``, ``PyTorchBaseModel(params=,
model=, device=)``, ``run(model_fn, train_data_fn, eval_data_fn, set_defaults,
extra_args_parser_fn)``, ``optimizer_type: "SGD"`` with a momentum, ``weight_decay_rate``,
``save_losses`` and ``num_wgt_servers``; its model writes keys into params and calls its
metric inside ``forward``.
"""

import os
import sys

import pytest
import yaml

from common.data import resolve_mnist
from common.folder import load_run_module
from common.port.migrate import migrate
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "tests", "fixtures", "vendor_zoo", "fc_tiny", "pytorch")


def _main(module, argv):
    """The vendor's ``main()`` reads sys.argv."""
    saved = sys.argv
    sys.argv = ["run.py", *argv]
    try:
        return module.main()
    finally:
        sys.argv = saved


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dest = tmp_path_factory.mktemp("migrated") / "fc_tiny"
    migrate(SRC, str(dest))
    return load_run_module(str(dest))


@pytest.fixture(scope="module")
def digits():
    root = resolve_mnist(os.path.join(ROOT, "no_mnist_here"), "auto").root
    return [f"train_input.data_dir={root}", f"eval_input.data_dir={root}"]


def _losses(model_dir):
    return dict(read_scalars(os.path.join(model_dir, "train"))["loss"])


def test_trains_evaluates_validates_compiles_and_trains_on_the_emulator(folder, digits, tmp_path, capsys):
    cpu, emulator = tmp_path / "cpu", tmp_path / "emulator"
    _main(folder, ["-m", "train", "-o", str(cpu), "--cs_ip", "10.0.0.1", "--run_name", "first", *digits])
    err = capsys.readouterr().err
    assert "--cs_ip is ignored: addresses the vendor's system" in err
    assert "training on cpu from step 0 to 50 (float32 compute)" in err
    assert "runconfig.num_wgt_servers is ignored" in err and "runconfig.save_losses is ignored" in err
    saved = yaml.safe_load((cpu / "params_train.yaml").read_text())
    assert saved["optimizer"]["optimizer_type"] == "momentum" and saved["optimizer"]["momentum"] == 0.9
    assert saved["runconfig"]["run_name"] == "first" and saved["runconfig"]["num_wgt_servers"] == 12
    assert saved["model"]["to_float16"] is False  # set_defaults wrote it

    _main(folder, ["-m", "eval", "-o", str(cpu), *digits])
    accuracy = read_scalars(os.path.join(cpu, "eval"))["accuracy"]
    assert accuracy[0][0] == 50 and accuracy[0][1] > 0.5  # the metric called inside forward

    _main(folder, ["-m", "train", "--validate_only", "-o", str(tmp_path / "v"), *digits])
    _main(folder, ["-m", "train", "--compile_only", "-o", str(tmp_path / "c"), *digits])
    report = (tmp_path / "c" / "compile" / "report.txt").read_text()
    assert "samples/s" in report

    _main(folder, ["-m", "train", "--device", "emulator", "-o", str(emulator), *digits])
    on_cpu, on_emulator = _losses(cpu), _losses(emulator)
    assert sorted(on_emulator) == [10, 20, 30, 40, 50]
    assert on_cpu[50] < 0.5 * on_cpu[10]
    assert on_emulator[50] == pytest.approx(on_cpu[50], rel=0.01)


def test_the_vendors_model_mixed_precision_is_bfloat16_on_the_cpu_and_the_emulator(folder, digits, tmp_path, capsys):
    same = ["-m", "train", "--max_steps", "10", "model.mixed_precision=true", *digits]
    _main(folder, [*same, "-o", str(tmp_path / "cpu")])
    _main(folder, [*same, "--device", "emulator", "-o", str(tmp_path / "emulator")])
    err = capsys.readouterr().err
    assert "model.mixed_precision: true is mixed_precision.enabled: true" in err
    assert "training on cpu from step 0 to 10 (bfloat16 compute)" in err
    assert "training on emulator from step 0 to 10 (bfloat16 compute)" in err
    saved = yaml.safe_load((tmp_path / "cpu" / "params_train.yaml").read_text())
    assert saved["mixed_precision"] == {"enabled": True, "dtype": "bfloat16"}
    assert _losses(tmp_path / "emulator")[10] == pytest.approx(_losses(tmp_path / "cpu")[10], rel=0.01)


def test_cb_models_answers_are_one_process_without_a_system(caplog):
    import logging

    import torch

    from common.pytorch import cb_model as cm
    from common.pytorch.utils import get_input_dtype

    answers = {name: getattr(cm, name)() for name in (
        "use_cs", "is_wse_device", "is_master_ordinal", "is_streamer", "is_receiver", "get_streaming_rank",
        "get_ordinal", "num_tasks", "num_receivers", "num_streamers")}
    assert answers == {"use_cs": False, "is_wse_device": False, "is_master_ordinal": True, "is_streamer": True,
                       "is_receiver": True, "get_streaming_rank": 0, "get_ordinal": 0, "num_tasks": 1,
                       "num_receivers": 1, "num_streamers": 1}
    assert cm.rendezvous("tag") is None
    fn = lambda: 1  # noqa: E731
    assert cm.step_closure(fn) is fn

    class Leaf:
        def __init__(self, name):
            self.name = name

        def cpu(self):
            return f"{self.name} on the cpu"

    moved = cm.to_cpu({"a": [Leaf("x"), (Leaf("y"), 3)], "b": "text", "t": torch.ones(1)})
    assert moved["a"] == ["x on the cpu", ("y on the cpu", 3)] and type(moved["a"][1]) is tuple
    assert moved["b"] == "text" and moved["t"].device.type == "cpu"

    with caplog.at_level(logging.INFO, logger="zoo"):
        assert get_input_dtype(False) == torch.float32
        assert not caplog.messages
        assert get_input_dtype(True) == (torch.float16 if torch.cuda.is_available() else torch.float32)
    if not torch.cuda.is_available():
        assert caplog.messages == ["to_float16: the inputs stay float32 without a GPU (16-bit compute: "
                                   "mixed_precision.enabled)"]


def test_get_input_dtype_is_float16_when_asked_with_a_gpu(monkeypatch):
    import torch

    from common.pytorch.utils import get_input_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU stood in for
    assert get_input_dtype(True) == torch.float16 and get_input_dtype(False) == torch.float32

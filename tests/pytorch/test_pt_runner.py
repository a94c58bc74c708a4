"""The shared PyTorch runner, driven through pytorch/mnist's run.py on generated IDX data."""

import contextlib
import functools
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import write_fake_mnist
from common.folder import import_beside, load_run_module
from common.errors import NonFiniteGradient, UserError
from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel, split_result
from common.pytorch import checkpoint as checkpoint_module
from common.pytorch.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from common.pytorch.run import StepWindow
from common.summaries import read_scalars

ROOT = Path(__file__).resolve().parents[2]
MNIST = str(ROOT / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(MNIST, "run.py"), "model", "data", "utils")


def tiny_params(*overrides):
    return load_params(TINY, utils.default_params(), overrides)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=200, n_test=64, seed=0)  # 6 train batches of 32 per epoch, 2 eval
    return str(folder)


def run_mnist(model_dir, data_dir, *extra, mode="train"):
    argv = ["--mode", mode, "--params", TINY, "--model_dir", str(model_dir),
            f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}", *extra]
    return load_run_module(MNIST).main(argv)


def steps_of(scalars, tag):
    return [step for step, _ in scalars[tag]]


def test_train_writes_checkpoints_params_and_summaries(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4]
    saved = load_params(str(tmp_path / "params_train.yaml"), utils.default_params())
    assert saved["runconfig"]["max_steps"] == 4 and saved["train_input"]["data_dir"] == data_dir
    train = read_scalars(str(tmp_path / "train"))
    assert steps_of(train, "loss") == [1, 2, 3, 4]
    assert [v for _, v in train["lr"]] == pytest.approx([0.005] * 4)  # params_tiny.yaml
    assert all(v > 0 for _, v in train["samples_per_sec"])
    assert "loss_scale" not in train
    state = load_checkpoint(str(tmp_path / "checkpoint_4.mdl"))
    assert state["global_step"] == 4 and state["data_order"] == {"epoch": 0, "batch": 4, "global_batch": 32}
    assert {"model", "optimizer", "lr_scheduler", "scaler", "rng"} <= set(state)


def test_eval_latest_or_checkpoint_path(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir)
    latest = run_mnist(tmp_path, data_dir, mode="eval")
    assert set(latest) == {"accuracy", "loss"} and 0.0 <= latest["accuracy"] <= 1.0
    earlier = run_mnist(tmp_path, data_dir, "--checkpoint_path", str(tmp_path / "checkpoint_2.mdl"), mode="eval")
    assert earlier["loss"] != latest["loss"]
    evals = read_scalars(str(tmp_path / "eval"))
    assert steps_of(evals, "accuracy") == [4, 2] and steps_of(evals, "loss") == [4, 2]
    assert (tmp_path / "params_eval.yaml").is_file()


def test_eval_all_evaluates_every_checkpoint_in_step_order(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir, "runconfig.max_steps=6", "runconfig.keep_checkpoint_max=0")
    results = run_mnist(tmp_path, data_dir, mode="eval_all")
    assert list(results) == [2, 4, 6]
    assert steps_of(read_scalars(str(tmp_path / "eval")), "accuracy") == [2, 4, 6]
    # each equals a single eval of that checkpoint
    single = run_mnist(tmp_path, data_dir, "--checkpoint_path", str(tmp_path / "checkpoint_4.mdl"), mode="eval")
    assert single == results[4]


def test_train_and_eval_evaluates_at_each_checkpoint_and_the_end(tmp_path, data_dir):
    final = run_mnist(tmp_path, data_dir, "runconfig.max_steps=7", "runconfig.checkpoint_steps=3",
                      mode="train_and_eval")
    assert steps_of(read_scalars(str(tmp_path / "eval")), "loss") == [3, 6, 7]
    assert [step for step, _ in list_checkpoints(tmp_path)] == [6, 7]
    assert final == run_mnist(tmp_path, data_dir, mode="eval")


def test_predict_writes_outputs_over_the_eval_set(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir)
    path = run_mnist(tmp_path, data_dir, mode="predict")
    with np.load(path) as predictions:
        logits = predictions["logits"]
    assert logits.shape == (64, 10) and np.isfinite(logits).all()
    # the predictions are the ones eval scores
    eval_loader = data.get_eval_dataloader(tiny_params(f"eval_input.data_dir={data_dir}"))
    labels = torch.cat([labels for _, labels in eval_loader]).numpy()  # (64,)
    accuracy = run_mnist(tmp_path, data_dir, mode="eval")["accuracy"]
    assert np.mean(logits.argmax(-1) == labels) == pytest.approx(accuracy)


def test_keep_checkpoint_max(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir, "runconfig.max_steps=10", "runconfig.keep_checkpoint_max=2")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_10.mdl", "checkpoint_8.mdl", "params_train.yaml", "train"]


def test_resume_equals_one_run_bitwise_with_dropout(tmp_path, data_dir):
    """16 steps in one run == 8 + resume 8 (the resume lands mid-epoch: 6 batches per epoch)."""
    common = ("model.dropout=0.3", "runconfig.checkpoint_steps=8", "runconfig.keep_checkpoint_max=0")
    once, twice = tmp_path / "once", tmp_path / "twice"
    run_mnist(once, data_dir, "runconfig.max_steps=16", *common)
    run_mnist(twice, data_dir, "runconfig.max_steps=8", *common)
    assert load_checkpoint(str(twice / "checkpoint_8.mdl"))["data_order"] == {"epoch": 1, "batch": 2, "global_batch": 32}
    run_mnist(twice, data_dir, "runconfig.max_steps=16", *common)

    losses = [read_scalars(str(d / "train"))["loss"] for d in (once, twice)]
    assert losses[0] == losses[1] and len(losses[0]) == 16
    a, b = (load_checkpoint(str(d / "checkpoint_16.mdl")) for d in (once, twice))
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, value in a["optimizer"]["state"].items():
        for field in value:
            assert torch.equal(value[field], b["optimizer"]["state"][key][field])
    assert a["data_order"] == b["data_order"] == {"epoch": 2, "batch": 4, "global_batch": 32}
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def test_resume_from_checkpoint_path_into_a_new_model_dir(tmp_path, data_dir):
    run_mnist(tmp_path / "first", data_dir)
    run_mnist(tmp_path / "second", data_dir, "--checkpoint_path", str(tmp_path / "first" / "checkpoint_4.mdl"),
              "runconfig.steps=2")
    assert [step for step, _ in list_checkpoints(tmp_path / "second")] == [6]
    assert steps_of(read_scalars(str(tmp_path / "second" / "train")), "loss") == [5, 6]


def test_a_crash_during_save_keeps_the_previous_checkpoint(tmp_path, data_dir, monkeypatch):
    run_mnist(tmp_path, data_dir)
    real_save = torch.save

    def crash_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt("killed during save")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash_halfway)
    with pytest.raises(SystemExit) as exit_info:  # as a Ctrl-C ends a run: status 130 (common/cli.py)
        run_mnist(tmp_path, data_dir, "runconfig.max_steps=6")
    assert exit_info.value.code == 130
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)

    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_4.mdl")
    assert load_checkpoint(latest_checkpoint(str(tmp_path)))["global_step"] == 4
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    # a temporary file a real kill would leave behind is not taken for a checkpoint
    (tmp_path / ".checkpoint_6.mdl.x1y2.tmp").write_bytes(b"PK half")
    run_mnist(tmp_path, data_dir, "runconfig.max_steps=6")
    assert load_checkpoint(latest_checkpoint(str(tmp_path)))["global_step"] == 6


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, data_dir, capsys):
    # the learning rate jumps to 1e30 after step 4; the weights blow up and step 6's loss is NaN
    explode = "optimizer.learning_rate={scheduler: PiecewiseConstant, values: [0.001, 1.0e+30], boundaries: [4]}"
    with pytest.raises(SystemExit) as exit_info:
        run_mnist(tmp_path, data_dir, "runconfig.max_steps=10", explode)
    assert exit_info.value.code == 3
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: step 6: the loss is nan")
    assert str(tmp_path / "checkpoint_4.mdl") in error
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4]
    assert load_checkpoint(str(tmp_path / "checkpoint_4.mdl"))["global_step"] == 4


def test_bf16_autocast_with_dynamic_loss_scaling_on_cpu(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir, "mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
              "optimizer.initial_loss_scale=1024")
    train = read_scalars(str(tmp_path / "train"))
    assert all(np.isfinite(v) for _, v in train["loss"])
    assert [v for _, v in train["loss_scale"]] == [1024.0] * 4
    assert load_checkpoint(str(tmp_path / "checkpoint_4.mdl"))["scaler"]["scale"] == 1024.0

    mnist = model.model_fn(tiny_params("mixed_precision.enabled=true"), torch.device("cpu"))
    _, outputs = mnist.eval_step((torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)))
    assert outputs["logits"].dtype == torch.bfloat16


def test_static_loss_scale_gives_the_same_step_as_none():
    """A power-of-two loss scale is exact: the weights after a step are equal bit for bit."""
    batch = (torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 10)
    weights = []
    for factor in (1.0, 1024.0):
        params = tiny_params("mixed_precision.enabled=true", "model.dropout=0.0", "optimizer.optimizer_type=sgd",
                             f"optimizer.loss_scaling_factor={factor}")
        torch.manual_seed(0)
        mnist = model.model_fn(params, torch.device("cpu"))
        assert mnist.loss_scale() == (None if factor == 1.0 else factor)
        mnist.train_step(batch)
        weights.append(mnist.model.state_dict())
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_input_bound_windows_warn_once(caplog):
    window = StepWindow()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        for step in (10, 20, 30):  # the first window is start-up and never warns
            window.add(samples=100, waiting=0.8, total=1.0)
            assert window.end(step) == pytest.approx(100.0)
    warnings = [r.getMessage() for r in caplog.records if "bottleneck" in r.getMessage()]
    assert len(warnings) == 1 and "up to step 20" in warnings[0] and "num_workers" in warnings[0]

    fed = StepWindow()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        for step in (10, 20):
            fed.add(samples=100, waiting=0.1, total=1.0)
            fed.end(step)
    assert len([r for r in caplog.records if "bottleneck" in r.getMessage()]) == 1


def test_a_windows_rate_and_waiting_share_are_its_own_and_an_empty_window_gives_zero(caplog):
    from common.pytorch.runner import INPUT_BOUND_SHARE

    assert INPUT_BOUND_SHARE == 1.2 / 4.0
    window = StepWindow()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert window.end(1) == 0.0  # nothing timed (the first window)
        assert window.end(2) == 0.0  # nothing timed: no share of waiting either, no warning
        window.add(samples=10, waiting=0.2, total=1.0)  # two steps: 30 samples, 1.2 s of 4 s waiting,
        window.add(samples=20, waiting=1.0, total=3.0)  # exactly INPUT_BOUND_SHARE: not input-bound
        assert window.end(3) == 7.5
        for _ in range(2):
            window.add(samples=15, waiting=1.5, total=2.0)
        assert window.end(4) == 7.5
    assert [r.getMessage() for r in caplog.records if r.name == "zoo"] == [
        "input pipeline is the bottleneck: 75% of the step time up to step 4 went to waiting for data; raise "
        "train_input.num_workers, make the dataset's __getitem__ cheaper or prepare the data ahead"]


def test_nothing_to_train_at_max_steps(tmp_path, data_dir):
    run_mnist(tmp_path, data_dir)
    before = sorted(os.listdir(tmp_path))
    assert run_mnist(tmp_path, data_dir) is None
    assert sorted(os.listdir(tmp_path)) == before


def test_the_schedule_drives_the_optimizer_across_a_resume(tmp_path, data_dir):
    schedule = "optimizer.learning_rate={scheduler: PiecewiseConstant, values: [0.01, 0.001], boundaries: [3]}"
    run_mnist(tmp_path, data_dir, schedule, "runconfig.max_steps=2")
    run_mnist(tmp_path, data_dir, schedule, "runconfig.max_steps=5")
    assert [v for _, v in read_scalars(str(tmp_path / "train"))["lr"]] == pytest.approx([0.01] * 3 + [0.001] * 2)
    state = load_checkpoint(str(tmp_path / "checkpoint_5.mdl"))
    assert state["lr_scheduler"]["last_epoch"] == 5
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.001)


def test_worker_processes_give_the_same_batches(tmp_path, data_dir):
    run_mnist(tmp_path / "main", data_dir, "model.dropout=0.0")
    run_mnist(tmp_path / "workers", data_dir, "model.dropout=0.0", "train_input.num_workers=2")
    assert read_scalars(str(tmp_path / "main" / "train"))["loss"] == \
        read_scalars(str(tmp_path / "workers" / "train"))["loss"]


def generating_model_fn(params, device):
    """mnist's model with the predict hooks of a model that generates (runner.py's docstring)."""
    m = model.model_fn(params, device)
    m.predict_step = lambda batch: {"doubled_labels": batch[1].cpu().numpy() * 2}
    m.predictions_done = lambda arrays, model_dir: {"mean_doubled": float(arrays["doubled_labels"].mean())}
    return m


def run_generating(model_dir, data_dir, *extra):
    from common.pytorch.run import run

    argv = ["--mode", "predict", "--params", TINY, "--model_dir", str(model_dir),
            f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}", *extra]
    return run(generating_model_fn, data.get_train_dataloader, data.get_eval_dataloader, utils.default_params, argv=argv)


def test_predict_writes_the_predict_step_of_a_generating_model(tmp_path, data_dir, capsys):
    run_mnist(tmp_path, data_dir)
    path = run_generating(tmp_path, data_dir)
    eval_loader = data.get_eval_dataloader(tiny_params(f"eval_input.data_dir={data_dir}"))
    labels = torch.cat([labels for _, labels in eval_loader]).numpy()  # (64,)
    with np.load(path) as predictions:
        assert list(predictions) == ["doubled_labels"]  # predict_step's arrays, not the eval step's logits
        np.testing.assert_array_equal(predictions["doubled_labels"], labels * 2)
    assert read_scalars(str(tmp_path / "predict"))["mean_doubled"] == [(4, pytest.approx(2 * labels.mean()))]
    with pytest.raises(SystemExit):  # generation runs in torch: the emulator refuses it in one line
        run_generating(tmp_path, data_dir, "--device", "emulator")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--device emulator" in err.strip().splitlines()[-1]


def batches_in_a_list(params):
    """A data function that returns its batches, not a DataLoader."""
    return list(data.get_train_dataloader(params))


@pytest.mark.parametrize("extra", [("--mode", "train"), ("--mode", "eval"), ("--mode", "train", "--compile_only")])
def test_a_data_function_that_returns_no_dataloader_is_refused_in_one_line(tmp_path, data_dir, capsys, extra):
    from common.pytorch.run import run

    model_dir = tmp_path / "model_dir"
    if "eval" in extra:
        run_mnist(model_dir, data_dir)  # a checkpoint to evaluate
    before = sorted(model_dir.rglob("*"))
    argv = ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}",
            f"eval_input.data_dir={data_dir}", *extra]
    with pytest.raises(SystemExit) as exit_info:
        run(model.model_fn, batches_in_a_list, batches_in_a_list, utils.default_params, argv=argv)
    assert exit_info.value.code == 2 and sorted(model_dir.rglob("*")) == before
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"error: batches_in_a_list ({__file__}:{batches_in_a_list.__code__.co_firstlineno}) returned list; the "
        f"runner takes a torch.utils.data.DataLoader (it replays the loader's order to resume exactly)")


def test_a_data_function_bound_by_a_partial_is_named_by_the_function_it_binds():
    from common.pytorch.runner import data_loader

    bound = functools.partial(batches_in_a_list)
    with pytest.raises(UserError) as error:
        data_loader(bound, tiny_params())
    assert str(error.value).startswith(f"batches_in_a_list ({__file__}:{batches_in_a_list.__code__.co_firstlineno}) "
                                       f"returned list; the runner takes a torch.utils.data.")
    loader = data.get_eval_dataloader(tiny_params())
    assert data_loader(lambda params: loader, tiny_params()) is loader


def a_bare_module(params, device):
    """A model_fn that returns the torch module, not a PyTorchBaseModel around it."""
    return torch.nn.Linear(784, 10)


@pytest.mark.parametrize("extra", [("--mode", "train"), ("--mode", "train", "--compile_only"),
                                   ("--mode", "train", "--validate_only")])
def test_a_model_function_that_returns_no_base_model_is_refused_in_one_line(tmp_path, data_dir, capsys, extra):
    from common.pytorch.run import run

    model_dir = tmp_path / "model_dir"
    argv = ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}", *extra]
    with pytest.raises(SystemExit) as exit_info:
        run(a_bare_module, data.get_train_dataloader, data.get_eval_dataloader, utils.default_params, argv=argv)
    assert exit_info.value.code == 2 and not model_dir.exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"error: a_bare_module ({__file__}:{a_bare_module.__code__.co_firstlineno}) returned Linear; the runner takes "
        f"a PyTorchBaseModel (common/pytorch/base_model.py), which wraps the torch module with its optimizer")


# --- base_model.py on its own: a two-weight model --------------------------------------------------

class TwoWeights(PyTorchBaseModel):
    """loss = sum(w * x) for a batch x: the gradient of w is x itself."""

    def __init__(self, params, device=None):
        super().__init__(params, torch.nn.Linear(2, 1, bias=False), device)
        with torch.no_grad():
            self.model.weight.zero_()

    def __call__(self, batch):
        return self.model(batch).sum(), {"out": self.model(batch)}


def two_weights(*overrides):
    return TwoWeights(tiny_params("optimizer.optimizer_type=sgd", "optimizer.learning_rate=1.0", *overrides))


def test_split_result_takes_the_loss_or_the_loss_and_its_outputs():
    loss = torch.tensor(1.0)
    assert split_result(loss) == (loss, {})
    outputs = {"logits": loss}
    got = split_result((loss, outputs))
    assert got == (loss, outputs) and got[1] is not outputs
    for bad, kind in (((loss, [loss]), "(Tensor, list)"), ([loss, outputs], "list"),
                      ((loss, outputs, 1), "(Tensor, dict, int)"), ((1.0, outputs), "(float, dict)"), (1.0, "float")):
        with pytest.raises(UserError) as error:
            split_result(bad)
        assert str(error.value) == (f"a model's __call__ returned {kind}; a model's __call__ returns the loss (a "
                                    f"tensor) or (loss, outputs: a dict of tensors)")


class ListOutputs(TwoWeights):
    def __call__(self, batch):
        return self.model(batch).sum(), [self.model(batch)]


class NoCall(PyTorchBaseModel):
    def __init__(self, params):
        super().__init__(params, torch.nn.Linear(2, 1))


def test_a_model_whose_call_returns_something_else_is_named_with_its_line():
    model = ListOutputs(tiny_params())
    line = ListOutputs.__call__.__code__.co_firstlineno
    for step in (model.train_step, model.eval_step):
        with pytest.raises(UserError) as error:
            step(torch.ones(4, 2))
        assert str(error.value) == (f"ListOutputs.__call__ ({__file__}:{line}) returned (Tensor, list); a model's "
                                    f"__call__ returns the loss (a tensor) or (loss, outputs: a dict of tensors)")
    with pytest.raises(UserError) as error:
        NoCall(tiny_params()).train_step(torch.ones(4, 2))
    assert str(error.value) == (f"NoCall ({__file__}:{NoCall.__init__.__code__.co_firstlineno - 1}) writes no "
                                f"__call__(batch); a model subclasses PyTorchBaseModel and writes __call__, which "
                                f"returns the loss or (loss, outputs)")


def test_gradients_are_clipped_by_norm_or_by_value_not_both():
    batch = torch.tensor([[3.0, -4.0]])  # the gradient: (3, -4), norm 5
    plain = two_weights()
    assert plain.device == torch.device("cpu") and plain.loss_scale() is None
    assert float(plain.train_step(batch)) == 0.0
    assert plain.model.weight.tolist() == [[-3.0, 4.0]]
    by_norm = two_weights("optimizer.max_gradient_norm=1.0")
    by_norm.train_step(batch)
    assert by_norm.model.weight[0].tolist() == pytest.approx([-0.6, 0.8])
    by_value = two_weights("optimizer.max_gradient_value=2.0")
    by_value.train_step(batch)
    assert by_value.model.weight.tolist() == [[-2.0, 2.0]]
    with pytest.raises(UserError) as error:
        two_weights("optimizer.max_gradient_norm=1.0", "optimizer.max_gradient_value=2.0")
    assert str(error.value) == "optimizer: give max_gradient_norm or max_gradient_value, not both"


class SqrtWeights(TwoWeights):
    """loss = sum(sqrt(w)) + sum(w * x): at w = 0 the loss is 0 and the gradient inf."""

    def __call__(self, batch):
        return self.model.weight.sqrt().sum() + self.model(batch).sum()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the step skipped: no optimizer.step()
def test_a_non_finite_gradient_stops_or_is_skipped_and_the_weights_stay():
    bad = torch.tensor([[1.0, 2.0]])
    plain = SqrtWeights(two_weights().params)
    with pytest.raises(NonFiniteGradient) as error:
        plain.train_step(bad)  # a finite loss ...
    assert (error.value.name, error.value.value) == ("weight", float("inf"))
    assert str(error.value) == "the gradient of weight is inf" and plain.model.weight.tolist() == [[0.0, 0.0]]
    # ... a static loss scale skips the step instead, as GradScaler would; the schedule still counts it
    scaled_params = two_weights("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=4.0").params
    skipping = SqrtWeights(scaled_params)
    assert skipping.loss_scale() == 4.0
    skipping.train_step(bad)
    assert skipping.model.weight.tolist() == [[0.0, 0.0]] and skipping.lr_scheduler.state_dict()["last_epoch"] == 1
    scaled = TwoWeights(scaled_params)
    scaled.train_step(torch.tensor([[1.0, float("inf")]]))  # a non-finite loss: not applied either
    assert scaled.model.weight.tolist() == [[0.0, 0.0]] and scaled.lr_scheduler.state_dict()["last_epoch"] == 1
    scaled.train_step(torch.tensor([[1.0, 2.0]]))
    assert scaled.model.weight.tolist() == [[-1.0, -2.0]]  # the scale is divided out of the gradient
    assert scaled._non_finite_gradient() is None
    scaled.model.weight.grad = torch.tensor([[1.0, float("nan")]])
    name, value = scaled._non_finite_gradient()
    assert name == "weight" and np.isnan(value)
    scaled.model.weight.grad = None
    assert scaled._non_finite_gradient() is None


def test_dynamic_loss_scaling_starts_at_its_scale_and_the_state_round_trips():
    dynamic = two_weights("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                          "optimizer.initial_loss_scale=256", "optimizer.steps_per_increase=1")
    assert dynamic.loss_scale() == 256.0 and isinstance(dynamic.loss_scale(), float)
    dynamic.train_step(torch.tensor([[1.0, 2.0]]))
    assert dynamic.loss_scale() == 512.0  # one finite step per increase: doubled
    assert dynamic.model.weight.tolist() == [[-1.0, -2.0]]
    dynamic.train_step(torch.tensor([[1.0, float("inf")]]))  # skipped, the scale halved
    assert dynamic.loss_scale() == 256.0 and dynamic.model.weight.tolist() == [[-1.0, -2.0]]
    state = dynamic.get_state()
    assert state["scaler"]["scale"] == 256.0 and state["lr_scheduler"]["last_epoch"] == 2

    fresh = two_weights("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                        "optimizer.initial_loss_scale=8", "optimizer.steps_per_increase=1")
    fresh.set_state(state, weights_only=True)
    assert fresh.model.weight.tolist() == [[-1.0, -2.0]] and fresh.loss_scale() == 8.0
    assert fresh.lr_scheduler.state_dict()["last_epoch"] == 0
    fresh.set_state(state)
    assert fresh.loss_scale() == 256.0 and fresh.lr_scheduler.state_dict()["last_epoch"] == 2
    fresh.set_state(dict(state, scaler=None))  # a checkpoint written without dynamic scaling: the scale stays
    assert fresh.loss_scale() == 256.0
    assert two_weights().get_state()["scaler"] is None


def test_eval_step_runs_in_eval_mode_without_gradients_and_train_step_switches_back():
    m = two_weights()
    loss, outputs = m.eval_step(torch.tensor([[1.0, 1.0]]))
    assert not m.model.training and not loss.requires_grad and list(outputs) == ["out"]
    m.train_step(torch.tensor([[1.0, 1.0]]))
    assert m.model.training
    assert isinstance(m.autocast(), contextlib.nullcontext)
    bf16 = two_weights("mixed_precision.enabled=true", "model.dropout=0.0")
    with bf16.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the step skipped: no optimizer.step()
def test_dynamic_scaling_skips_a_step_of_a_finite_loss_with_an_inf_gradient_and_unused_weights_stay():
    params = two_weights("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                         "optimizer.initial_loss_scale=256").params
    skipping = SqrtWeights(params)
    skipping.train_step(torch.tensor([[1.0, 2.0]]))  # no NonFiniteGradient: the scaler skips the step
    assert skipping.loss_scale() == 128.0 and skipping.model.weight.tolist() == [[0.0, 0.0]]

    class TwoLayers(PyTorchBaseModel):
        """Even batches train layer a, odd ones layer b."""

        def __init__(self, params):
            super().__init__(params, torch.nn.ModuleDict({"a": torch.nn.Linear(1, 1), "b": torch.nn.Linear(1, 1)}))

        def __call__(self, batch):
            return self.model["a" if batch % 2 == 0 else "b"](torch.ones(1, 1)).sum()

    adam = TwoLayers(tiny_params("optimizer.optimizer_type=adam"))
    adam.train_step(0)
    after_a = [p.clone() for p in adam.model["a"].parameters()]
    adam.train_step(1)  # a's gradients are None, not zero: Adam's momentum does not move it
    assert all(torch.equal(p, q) for p, q in zip(adam.model["a"].parameters(), after_a))
    assert all(p.grad is None for p in adam.model["a"].parameters())

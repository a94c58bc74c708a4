"""The PyTorch Runner's loops with a linear model and, for training, a scripted step: when the
loop logs, saves, warns and stops, each line whole; eval and predict against torch itself."""

import argparse
import logging
import math
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common.errors import NonFiniteGradient, NonFiniteLossError, UserError
from common.interrupt import Interrupted
from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch import checkpoint as checkpoint_module
from common.pytorch import runner as runner_module
from common.pytorch.checkpoint import list_checkpoints, load_checkpoint
from common.pytorch.metrics import Accuracy, Metric
from common.pytorch.runner import FrameworkSteps, Runner
from common.summaries import read_scalars
from tests.log_lines import assert_log, train_line

FEATURES, CLASSES, EXAMPLES = 5, 3, 10


def dataset():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(EXAMPLES, FEATURES, generator=generator)
    return TensorDataset(x, torch.arange(EXAMPLES) % CLASSES)


def loader(params):
    """A run's data function: the dataset in batches of 4."""
    return DataLoader(dataset(), batch_size=4)


class Linear(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, torch.nn.Linear(FEATURES, CLASSES), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}

    def __call__(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits, y), {"logits": logits}


def params_of(model_dir, optimizer="sgd", **runconfig):
    runconfig = {"model_dir": str(model_dir), "max_steps": 5, "log_steps": 2, "checkpoint_steps": 2,
                 "keep_checkpoint_max": 0, **runconfig}
    schedule = {"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 1, "decay_rate": 0.5}
    return load_params(None, {"runconfig": runconfig, "optimizer": {"optimizer_type": optimizer,
                                                                     "learning_rate": schedule}})


class ScriptedTrain(FrameworkSteps):
    """The CPU's steps, but training: the loss of step k (from 1) is k / 4, or what ``script[k]`` does."""

    script: dict = {}
    scale = None

    def __init__(self, runner):
        super().__init__(runner)
        self.trained = []

    def train(self, batch):
        step = len(self.trained) + 1
        self.trained.append(len(batch[0]))
        assert len(self.trained) <= 100, "the loop does not end"  # no test runs more than 10 steps
        torch.rand(1)  # a step draws from the global RNG, as dropout does
        action = self.script.get(step)
        if isinstance(action, BaseException):
            raise action
        if action is not None:
            returned = action(self)
            if returned is not None:
                return returned
        return step / 4

    def loss_scale(self):
        return self.scale


def runner(model_dir, script=None, *, mode="train", scale=None, checkpoint_path=None, model=Linear, batch=4,
           optimizer="sgd", **runconfig):
    steps = type("Steps", (ScriptedTrain,), {"script": script or {}, "scale": scale})
    loader = lambda params: DataLoader(dataset(), batch_size=batch)  # noqa: E731
    args = argparse.Namespace(mode=mode, device="cpu", checkpoint_path=checkpoint_path)
    return Runner(args, params_of(model_dir, optimizer, **runconfig), model, loader, loader, steps)


def zoo_log(caplog):
    """The zoo's records, but the input-bound warning: the scripted steps take no time, so whether the
    waiting for data dominates a window is up to the machine (StepWindow's own test pins it)."""
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "zoo" and not r.getMessage().startswith("input pipeline is the bottleneck")]


def ckpt(model_dir, step):
    return os.path.join(str(model_dir), f"checkpoint_{step}.mdl")


def test_training_logs_every_log_steps_and_at_the_end_and_saves_every_checkpoint_steps(tmp_path, caplog):
    run = runner(tmp_path, scale=4.0)
    with caplog.at_level(logging.INFO, logger="zoo"):
        assert run.execute() is None
    assert run.steps.trained == [4, 4, 2, 4, 4]  # batches of 4 of 10 examples, the order carried on
    assert_log([r for r in zoo_log(caplog) if not r[1].startswith("params:")], [
        ("INFO", "training on cpu from step 0 to 5 (float32 compute)"),
        ("INFO", train_line(2, 0.5, 40)), ("INFO", f"saved {ckpt(tmp_path, 2)}"),
        ("INFO", train_line(4, 1.0, 80)), ("INFO", f"saved {ckpt(tmp_path, 4)}"),
        ("INFO", train_line(5, 1.25, 100)), ("INFO", f"saved {ckpt(tmp_path, 5)}")])
    scalars = read_scalars(str(tmp_path / "train"))
    assert sorted(scalars) == ["loss", "loss_scale", "lr", "samples_per_sec"]
    assert scalars["loss"] == [(2, 0.5), (4, 1.0), (5, 1.25)]
    # the rate each logged step used (TensorBoard keeps float32)
    assert scalars["lr"] == [(2, pytest.approx(0.05)), (4, pytest.approx(0.0125)), (5, pytest.approx(0.00625))]
    assert scalars["loss_scale"] == [(2, 4.0), (4, 4.0), (5, 4.0)]
    assert all(rate > 0 for _, rate in scalars["samples_per_sec"])
    state = load_checkpoint(ckpt(tmp_path, 4))
    assert state["global_step"] == 4 and state["rng"] is not None
    assert state["data_order"] == {"epoch": 1, "batch": 1, "global_batch": 4}  # 3 batches an epoch
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, 4, 5]


def test_checkpoint_steps_0_saves_at_the_end_and_steps_counts_on_from_the_checkpoint(tmp_path, caplog):
    run = runner(tmp_path, checkpoint_steps=0, log_steps=50)
    run.execute()
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [5]
    assert "loss_scale" not in read_scalars(str(tmp_path / "train"))
    more = runner(tmp_path, steps=2)
    with caplog.at_level(logging.INFO, logger="zoo"):
        more.execute()
    assert more.steps.trained == [2, 4] and [s for s, _ in list_checkpoints(str(tmp_path))] == [5, 6, 7]
    assert ("INFO", f"starting from {ckpt(tmp_path, 5)} (step 5)") in zoo_log(caplog)
    assert ("INFO", "training on cpu from step 5 to 7 (float32 compute)") in zoo_log(caplog)
    caplog.clear()
    done = runner(tmp_path, max_steps=7)
    with caplog.at_level(logging.INFO, logger="zoo"):
        assert done.execute() is None
    assert done.steps.trained == [] and ("INFO", "already at step 7 (max_steps 7): nothing to train") in \
        zoo_log(caplog)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_run_reads_its_starting_checkpoint_once(tmp_path, monkeypatch, mode):
    runner(tmp_path, max_steps=2).execute()
    reads = []

    def counted(path):
        reads.append(path)
        return load_checkpoint(path)

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", counted)
    monkeypatch.setattr(runner_module, "load_checkpoint", counted)
    started = runner(tmp_path, mode=mode, max_steps=3)
    assert started.global_step == 2 and reads == [ckpt(tmp_path, 2)]  # a GPT-J checkpoint is 24 GB: not twice


def test_train_and_eval_evaluates_at_each_checkpoint_and_returns_the_last(tmp_path):
    run = runner(tmp_path, mode="train_and_eval", max_steps=4)
    metrics = run.execute()
    evals = read_scalars(str(tmp_path / "eval"))
    assert [step for step, _ in evals["loss"]] == [2, 4]
    assert metrics["loss"] == pytest.approx(evals["loss"][-1][1])
    again = runner(tmp_path, mode="train_and_eval", max_steps=4).execute()  # nothing to train: evaluates
    assert again == pytest.approx(metrics)


def test_a_non_finite_gradient_stops_before_the_step_counts_and_names_the_last_good_checkpoint(tmp_path):
    run = runner(tmp_path, {3: NonFiniteGradient("weight", math.inf)})
    with pytest.raises(NonFiniteLossError) as error:
        run.execute()
    assert str(error.value) == (f"step 3: the gradient of weight is inf; training stopped, the last good "
                                f"checkpoint is {ckpt(tmp_path, 2)}")


@pytest.mark.parametrize("at", [1, 4])
def test_a_non_finite_loss_stops_before_it_is_logged_or_saved(tmp_path, at):
    run = runner(tmp_path, {at: lambda steps: math.nan})
    with pytest.raises(NonFiniteLossError) as error:
        run.execute()
    kept = ckpt(tmp_path, 2) if at == 4 else "none (none was written)"
    assert str(error.value) == f"step {at}: the loss is nan; training stopped, the last good checkpoint is {kept}"
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == ([2] if at == 4 else [])
    assert read_scalars(str(tmp_path / "train")).get("loss", []) == ([(2, 0.5)] if at == 4 else [])


def test_a_weight_that_overflows_is_never_saved(tmp_path):
    def overflow(steps):
        with torch.no_grad():
            steps.model.model.weight[1, 2] = -math.inf

    run = runner(tmp_path, {3: overflow})
    with pytest.raises(NonFiniteLossError) as error:
        run.execute()
    assert str(error.value) == (f"step 4: the weight weight is -inf, not saved; training stopped, the last good "
                                f"checkpoint is {ckpt(tmp_path, 2)}")
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2]


def sigint(steps):
    signal.raise_signal(signal.SIGINT)


def test_a_signal_finishes_the_step_saves_it_and_says_where_to_resume(tmp_path):
    run = runner(tmp_path, {3: sigint})
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert stopped.value.signum == signal.SIGINT and len(run.steps.trained) == 3
    assert str(stopped.value) == (f"interrupted by SIGINT at step 3 of 5; saved {ckpt(tmp_path, 3)}: the same "
                                  f"command resumes from there")
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, 3]


def test_a_signal_at_a_checkpoint_step_saves_once_and_at_the_last_step_ends_the_run(tmp_path):
    run = runner(tmp_path / "a", {4: sigint})
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert str(stopped.value) == (f"interrupted by SIGINT at step 4 of 5; saved {ckpt(tmp_path / 'a', 4)}: the "
                                  f"same command resumes from there")
    last = runner(tmp_path / "b", {5: sigint})
    try:  # the stop came with the last step: the run ends as it would have
        assert last.execute() is None
    except Interrupted as e:  # a KeyboardInterrupt: pytest would take it for a Ctrl-C and stop, not fail the test
        pytest.fail(f"a stop with the last step raised {e!r}")
    assert [step for step, _ in list_checkpoints(str(tmp_path / "b"))] == [2, 4, 5]


def test_a_second_signal_stops_mid_step_and_names_the_newest_checkpoint(tmp_path):
    run = runner(tmp_path, {3: lambda steps: (sigint(steps), sigint(steps))})
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert str(stopped.value) == (f"interrupted by SIGINT at step 2 of 5; saved {ckpt(tmp_path, 2)}: the same "
                                  f"command resumes from there")
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2]


# --- eval and predict: the model's own steps, against torch ------------------------------------

def expected(model_dir, step, examples=EXAMPLES):
    """The loss (mean over examples) and accuracy of the checkpoint of ``step`` over the first examples."""
    model = torch.nn.Linear(FEATURES, CLASSES)
    model.load_state_dict(load_checkpoint(ckpt(model_dir, step))["model"])
    x, y = dataset().tensors
    with torch.no_grad():
        logits = model(x[:examples])
    return (F.cross_entropy(logits, y[:examples]).item(), (logits.argmax(-1) == y[:examples]).float().mean().item(),
            logits.numpy())


def test_eval_is_the_mean_over_examples_of_uneven_batches_and_its_metrics(tmp_path, caplog):
    runner(tmp_path, max_steps=4).execute()
    with caplog.at_level(logging.INFO, logger="zoo"):
        metrics = runner(tmp_path, mode="eval").execute()
    loss, accuracy, _ = expected(tmp_path, 4)
    assert sorted(metrics) == ["accuracy", "loss"]
    assert metrics["loss"] == pytest.approx(loss, rel=1e-6) and metrics["accuracy"] == pytest.approx(accuracy)
    assert zoo_log(caplog)[-1] == (
        "INFO", f"| Eval Device=cpu Step=4 accuracy={metrics['accuracy']:.5f} loss={metrics['loss']:.5f}")
    assert read_scalars(str(tmp_path / "eval"))["loss"] == [(4, pytest.approx(metrics["loss"]))]
    two = runner(tmp_path, mode="eval", eval_steps=2, checkpoint_path=ckpt(tmp_path, 2)).execute()
    loss, accuracy, _ = expected(tmp_path, 2, examples=8)
    assert two["loss"] == pytest.approx(loss, rel=1e-6) and two["accuracy"] == pytest.approx(accuracy)


def test_eval_all_evaluates_each_readable_checkpoint_and_skips_a_damaged_one(tmp_path, caplog):
    runner(tmp_path, max_steps=6).execute()
    with open(ckpt(tmp_path, 4), "r+b") as f:
        f.truncate(100)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        results = runner(tmp_path, mode="eval_all").execute()
    assert list(results) == [2, 6]
    for step in (2, 6):
        assert results[step]["loss"] == pytest.approx(expected(tmp_path, step)[0], rel=1e-6)
    warnings = [message for level, message in zoo_log(caplog) if level == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(ckpt(tmp_path, 4)) and warnings[0].endswith("; skipped")


def test_an_eval_set_without_a_batch_is_one_line(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    empty = runner(tmp_path, mode="eval", batch=16)
    empty.eval_loader = DataLoader(dataset(), batch_size=16, drop_last=True)
    with pytest.raises(UserError) as error:
        empty.execute()
    assert str(error.value) == ("eval data yielded no batches (is the eval set smaller than eval_input.batch_size "
                                "with drop_last?)")


class Finishing(Linear):
    """Linear with its own figures once the predictions are written."""

    def predictions_done(self, arrays, model_dir):
        with open(os.path.join(model_dir, "classes.txt"), "w") as f:  # its own files, beside predictions.npz
            f.write(" ".join(str(c) for c in arrays["logits"].argmax(-1)))
        return {"examples": float(len(arrays["logits"])), "mean_logit": float(arrays["logits"].mean())}


def test_predict_writes_the_outputs_of_the_checkpoint_over_the_eval_set_and_the_models_figures(tmp_path, caplog):
    runner(tmp_path, max_steps=2).execute()
    with caplog.at_level(logging.INFO, logger="zoo"):
        path = runner(tmp_path, mode="predict", model=Finishing).execute()
    assert path == os.path.join(str(tmp_path), "predictions.npz")
    with np.load(path) as saved:
        assert sorted(saved) == ["logits"]
        np.testing.assert_allclose(saved["logits"], expected(tmp_path, 2)[2], rtol=1e-5, atol=1e-6)
        mean = float(saved["logits"].mean())
    assert zoo_log(caplog)[-1] == ("INFO", f"wrote the predictions of step 2 over 10 examples to {path}")
    assert (tmp_path / "classes.txt").read_text() == " ".join(str(c) for c in expected(tmp_path, 2)[2].argmax(-1))
    assert read_scalars(str(tmp_path / "predict")) == {"examples": [(2, 10.0)],
                                                       "mean_logit": [(2, pytest.approx(mean))]}


class LossAlone(Linear):
    def __call__(self, batch):
        return super().__call__(batch)[0]


def test_predict_of_a_model_without_outputs_or_without_batches_is_one_line(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    with pytest.raises(UserError) as error:
        runner(tmp_path, mode="predict", model=LossAlone).execute()
    assert str(error.value) == ("predict: the model's __call__ returned the loss alone; return (loss, {name: "
                                "tensor}) to have outputs to write")
    empty = runner(tmp_path, mode="predict")
    empty.eval_loader = DataLoader(dataset(), batch_size=16, drop_last=True)
    with pytest.raises(UserError) as error:
        empty.execute()
    assert str(error.value) == "eval data yielded no batches to predict on"
    assert not (tmp_path / "predictions.npz").exists()


# --- the runner's pieces and its refusals before anything is written ----------------------------

@pytest.mark.parametrize("key, least", [("log_steps", 1), ("checkpoint_steps", 0), ("keep_checkpoint_max", 0),
                                        ("max_steps", 0), ("steps", 1), ("eval_steps", 1)])
def test_runconfig_counts_are_integers_of_at_least_their_least(key, least):
    from common.pytorch.runner import check_runconfig

    good = {"log_steps": 1, "checkpoint_steps": 0, "keep_checkpoint_max": 0, "max_steps": 0, "steps": None,
            "eval_steps": None}
    check_runconfig({**good, key: least})
    check_runconfig({**good, key: least + 7})
    for bad in (least - 1, True, 2.0, "3"):
        with pytest.raises(UserError) as error:
            check_runconfig({**good, key: bad})
        assert str(error.value) == f"runconfig.{key} must be an integer of at least {least}, got {bad!r}"


def test_the_batch_size_is_the_leading_dimension_of_the_first_tensor_with_one():
    from common.pytorch.runner import batch_size

    assert batch_size(torch.zeros(3, 2)) == 3 and batch_size(np.zeros((5,))) == 5 and batch_size(torch.tensor(1.0)) == 1
    assert batch_size((torch.zeros(4, 2), torch.zeros(4))) == 4
    assert batch_size({"ids": torch.zeros(6, 3), "mask": torch.zeros(6, 3)}) == 6
    assert batch_size([torch.zeros(0, 2), {"x": torch.zeros(2, 9)}]) == 2  # the first that has samples
    assert batch_size({"text": ["a b", "c"], "ids": torch.zeros(2, 4)}) == 2  # collated strings count no samples
    assert batch_size(["text", 7]) == 0 and batch_size([]) == 0


def test_to_device_and_to_numpy_keep_the_batchs_structure():
    from common.pytorch.runner import to_device, to_numpy

    batch = {"pair": (torch.ones(2), [torch.zeros(1), "label"]), "n": 3}
    moved = to_device(batch, torch.device("cpu"))
    assert type(moved["pair"]) is tuple and type(moved["pair"][1]) is list and moved["n"] == 3
    assert torch.equal(moved["pair"][0], torch.ones(2)) and moved["pair"][1][1] == "label"
    meta = to_device(batch, torch.device("meta"))  # a device other than the CPU the tensors are on
    assert meta["pair"][0].device.type == "meta" and meta["pair"][1][0].device.type == "meta"
    arrays = to_numpy({"pair": (torch.ones(2, requires_grad=True), [torch.zeros(1)]), "n": 3})
    assert type(arrays["pair"]) is tuple and type(arrays["pair"][1]) is list and arrays["n"] == 3
    assert isinstance(arrays["pair"][0], np.ndarray) and arrays["pair"][0].tolist() == [1.0, 1.0]


def test_the_first_weight_not_finite_and_its_value_integers_aside():
    from common.pytorch.runner import non_finite_weight

    weights = {"steps": torch.tensor([2**62]), "a": torch.ones(3), "b": torch.tensor([1.0, -math.inf, math.nan]),
               "c": torch.tensor([math.nan])}
    assert non_finite_weight(weights) == ("b", -math.inf)
    assert non_finite_weight({"a": torch.ones(2), "steps": torch.tensor([3])}) is None


def test_the_last_step_is_steps_more_or_max_steps():
    from common.pytorch.runner import last_step

    assert last_step({"steps": None, "max_steps": 9}, 4) == 9 and last_step({"steps": 3, "max_steps": 9}, 4) == 7


def test_the_seed_seeds_torch_numpy_and_python():
    import random

    from common.pytorch.runner import seed_everything

    seed_everything(2**32 + 5)  # numpy's seed is taken modulo 2**32
    first = (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())
    seed_everything(5)
    assert (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()) != first
    np.random.seed(5)
    numpy_5 = np.random.rand(2).tolist()
    seed_everything(2**32 + 5)
    torch_again, numpy_again, python_again = torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()
    assert (torch_again, python_again) == (first[0], first[2]) and numpy_again == first[1] == numpy_5


def test_the_torch_device_is_the_cpu_or_a_gpu_torch_has(monkeypatch):
    from common.pytorch.runner import torch_device

    assert torch_device("cpu") == torch.device("cpu") and torch_device("emulator") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as error:
        torch_device("gpu")
    assert str(error.value) == f"--device gpu: no CUDA device is available to torch {torch.__version__}"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_device("gpu") == torch.device("cuda")


class Generating(Linear):
    def predict_step(self, batch):
        return {"ids": np.zeros((len(batch[0]), 2), np.int64)}


def test_what_a_run_refuses_before_it_writes(tmp_path):
    cases = [
        (dict(mode="eval_all", checkpoint_path="x.mdl"),
         "--checkpoint_path does not go with --mode eval_all, which evaluates every checkpoint in model_dir"),
        (dict(mode="eval_all"), f"{tmp_path}: no checkpoint_<step>.mdl to evaluate; train first"),
        (dict(mode="eval"), f"{tmp_path}: no checkpoint to eval; train first or pass --checkpoint_path"),
        (dict(mode="predict"), f"{tmp_path}: no checkpoint to predict; train first or pass --checkpoint_path")]
    for kwargs, message in cases:
        with pytest.raises(UserError) as error:
            runner(tmp_path, **kwargs)
        assert str(error.value) == message
    emulator = argparse.Namespace(mode="predict", device="emulator", checkpoint_path=None)
    with pytest.raises(UserError) as error:
        Runner(emulator, params_of(tmp_path), Generating, loader, loader)
    assert str(error.value) == ("--mode predict --device emulator: Generating predicts by generating (predict_step), "
                                "which runs on the CPU or a GPU; drop --device emulator")
    bare = lambda params, device: torch.nn.Linear(2, 2)  # noqa: E731 - its line is the message's
    with pytest.raises(UserError) as error:
        runner(tmp_path, model=bare)
    assert str(error.value) == (f"test_what_a_run_refuses_before_it_writes.<locals>.<lambda> ({__file__}:"
                                f"{bare.__code__.co_firstlineno}) returned Linear; the runner "
                                f"takes a PyTorchBaseModel (common/pytorch/base_model.py), which wraps the torch "
                                f"module with its optimizer")
    assert os.listdir(tmp_path) == []


def test_a_run_loads_only_the_data_its_mode_reads(tmp_path):
    loaded = []

    def loader(name):
        return lambda params: loaded.append(name) or DataLoader(dataset(), batch_size=4)

    args = argparse.Namespace(mode="train", device="cpu", checkpoint_path=None)
    Runner(args, params_of(tmp_path), Linear, loader("train"), loader("eval"), ScriptedTrain).execute()
    for mode, expected_loaders in (("train", ["train"]), ("train_and_eval", ["train", "eval"]), ("eval", ["eval"]),
                                   ("eval_all", ["eval"]), ("predict", ["eval"])):
        loaded.clear()
        run = Runner(argparse.Namespace(mode=mode, device="cpu", checkpoint_path=None), params_of(tmp_path), Linear,
                     loader("train"), loader("eval"), ScriptedTrain)
        assert loaded == expected_loaders, mode
        assert (run.train_loader is None) == ("train" not in expected_loaders)
        assert (run.eval_loader is None) == ("eval" not in expected_loaders)


def test_a_restore_for_training_takes_the_rngs_and_data_order_and_for_eval_the_weights_alone(tmp_path):
    runner(tmp_path, max_steps=4).execute()
    state = load_checkpoint(ckpt(tmp_path, 4))
    resumed = runner(tmp_path, max_steps=6)
    assert torch.equal(torch.get_rng_state(), state["rng"]["torch"])  # the RNGs go on as they were
    assert resumed.global_step == 4 and resumed.checkpoint == ckpt(tmp_path, 4)
    assert resumed.data_state == state["data_order"]
    for name, value in resumed.model.model.state_dict().items():
        assert torch.equal(value, state["model"][name])
    evaluating = runner(tmp_path, mode="eval", checkpoint_path=ckpt(tmp_path, 2))
    assert not torch.equal(torch.get_rng_state(), load_checkpoint(ckpt(tmp_path, 2))["rng"]["torch"])  # weights only
    assert evaluating.global_step == 2 and evaluating.data_state is None and evaluating.checkpoint == ckpt(tmp_path, 2)
    for name, value in evaluating.model.model.state_dict().items():
        assert torch.equal(value, load_checkpoint(ckpt(tmp_path, 2))["model"][name])


def test_eval_all_takes_each_checkpoints_weights_alone_whatever_the_optimizer(tmp_path):
    runner(tmp_path, max_steps=4).execute()
    with pytest.raises(UserError, match="does not fit this run"):  # training on would need its SGD state
        runner(tmp_path, max_steps=6, optimizer="adam")
    results = runner(tmp_path, mode="eval_all", optimizer="adam").execute()
    assert list(results) == [2, 4]
    assert results[2]["loss"] == pytest.approx(expected(tmp_path, 2)[0], rel=1e-6)
    assert not torch.equal(torch.get_rng_state(), load_checkpoint(ckpt(tmp_path, 4))["rng"]["torch"])


class Prompted(Linear):
    """A generating model with prompts of its own (as pytorch/gpt2's)."""

    def predict_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(5)), batch_size=2)

    def predict_step(self, batch):
        return {"doubled": (2 * batch[0]).numpy()}


def test_predict_of_a_model_with_prompts_generates_for_every_prompt(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    path = runner(tmp_path, mode="predict", model=Prompted, eval_steps=1).execute()  # eval_steps: the eval set's
    with np.load(path) as saved:
        assert sorted(saved) == ["doubled"] and saved["doubled"].tolist() == [0, 2, 4, 6, 8]


def test_predict_takes_eval_steps_batches_of_the_eval_set_in_the_runs_shuffled_order(tmp_path):
    from common.pytorch.data_order import eval_shard

    runner(tmp_path, max_steps=2).execute()
    shuffled = runner(tmp_path, mode="predict", eval_steps=2, seed=7)
    shuffled.eval_loader = DataLoader(TensorDataset(torch.arange(EXAMPLES)[:, None].float(), torch.arange(EXAMPLES)),
                                      batch_size=4, shuffle=True)

    class Echo(FrameworkSteps):
        def eval(self, batch):
            return 0.0, {"x": batch[0].numpy()}

    shuffled.steps = Echo(shuffled)
    with np.load(shuffled.execute()) as saved:
        order = saved["x"].ravel().tolist()
    expected_order = [float(v) for x, _ in eval_shard(shuffled.eval_loader, 7, 2) for v in x.ravel().tolist()]
    assert order == expected_order and len(order) == 8 and order != sorted(order)


def test_every_batch_goes_to_the_runs_device(tmp_path, monkeypatch):
    from common.pytorch import runner as runner_module

    sent, to_device = [], runner_module.to_device
    monkeypatch.setattr(runner_module, "to_device",
                        lambda batch, device: sent.append(device) or to_device(batch, device))
    run = runner(tmp_path, max_steps=1)
    run.steps = FrameworkSteps(run)  # the model's own train step
    run.execute()
    runner(tmp_path, mode="eval").execute()
    runner(tmp_path, mode="predict", model=Prompted).execute()
    # a step's, the 3 eval batches' and the 3 prompt batches' (each batch, then each of its tensors)
    assert sent == [torch.device("cpu")] * (3 + 3 * 3 + 3 * 2)


class Mixed(Linear):
    """Linear, its outputs in bfloat16 where params ask for mixed precision, and its classes."""

    def __call__(self, batch):
        x, y = batch
        with self.autocast():
            logits = self.model(x)
        return F.cross_entropy(logits.float(), y), {"logits": logits, "classes": logits.argmax(-1)}


def test_outputs_computed_in_bfloat16_come_out_float32_and_integers_stay(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    args = argparse.Namespace(mode="predict", device="cpu", checkpoint_path=None)
    params = load_params(None, {**params_of(tmp_path), "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    run = Runner(args, params, Mixed, loader, loader)
    assert run.model.autocast_dtype == torch.bfloat16
    with np.load(run.execute()) as saved:
        assert saved["logits"].dtype == np.float32 and saved["classes"].dtype == np.int64
        assert saved["classes"].tolist() == saved["logits"].argmax(-1).tolist()


class WithVendorMetric(Linear):
    """Linear holding one of the vendor's metric objects that its __call__ never calls."""

    def __init__(self, params, device):
        from common.pytorch.metrics import AccuracyMetric

        super().__init__(params, device)
        self.accuracy_metric = AccuracyMetric(name="eval/vendor_accuracy")


def test_a_vendor_metric_never_called_is_left_out_with_one_warning(tmp_path, caplog):
    runner(tmp_path, max_steps=4).execute()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        results = runner(tmp_path, mode="eval_all", model=WithVendorMetric).execute()
    assert [sorted(metrics) for metrics in results.values()] == [["accuracy", "loss"]] * 2
    assert [message for level, message in zoo_log(caplog) if level == "WARNING"] == [
        "metric 'eval/vendor_accuracy' (AccuracyMetric) was not called during eval: not reported (is it called in "
        "__call__ when not self.model.training?)"]


class Median(Metric):
    """A metric that is no function of sums: a data-parallel eval cannot add it up."""

    def reset(self):
        self.values = []

    def update(self, outputs, batch):
        self.values.extend(outputs["logits"].max(-1).tolist())

    def result(self):
        return float(np.median(self.values))


class WithMedian(Linear):
    def __init__(self, params, device):
        super().__init__(params, device)
        self.metrics = {"accuracy": Accuracy(output="logits"), "median": Median()}


def test_a_data_parallel_eval_refuses_a_metric_it_cannot_add_up_before_it_evaluates(tmp_path):
    import inspect

    from common.pytorch.distributed import World

    runner(tmp_path, max_steps=2).execute()
    single = runner(tmp_path, mode="eval", model=WithMedian).execute()
    assert sorted(single) == ["accuracy", "loss", "median"]
    run = runner(tmp_path, mode="eval", model=WithMedian)
    run.world = World(0, 2)  # one process of two (a process group of its own is not needed to refuse)
    evaluated = []
    run.steps.eval = lambda batch: evaluated.append(batch)
    with pytest.raises(UserError) as error:
        run.evaluate()
    where = f"{inspect.getsourcefile(Median)}:{inspect.getsourcelines(Median)[1]}"
    assert str(error.value) == (f"{where}: metric Median has no 'summed' (the attributes reset zeroes and update adds "
                                f"to), which a data-parallel eval adds up over the processes; name them, e.g. summed "
                                f"= (\"correct\", \"total\")")
    assert evaluated == []


def test_an_eval_takes_its_batches_in_the_runs_order_and_in_a_data_parallel_run_its_share_summed(tmp_path):
    from common.pytorch.data_order import eval_shard
    from common.pytorch.distributed import World

    runner(tmp_path, max_steps=2).execute()
    shuffled = DataLoader(dataset(), batch_size=2, shuffle=True)
    run = runner(tmp_path, mode="eval", seed=7, eval_steps=4)
    run.eval_loader = shuffled
    seen, evaluate = [], run.steps.eval
    run.steps.eval = lambda batch: seen.append(batch[1].tolist()) or evaluate(batch)
    run.evaluate()
    assert seen == [b[1].tolist() for b in eval_shard(shuffled, 7, 4)] and seen != [[0, 1], [2, 0], [1, 2], [0, 1]]
    seen.clear()
    run.world = World(1, 2)  # process 1 of 2: batches 1 and 3 of the 4, its sums added to the other's
    summed = []

    def sum_across_processes(total_loss, examples):
        summed.append((total_loss, examples))
        return total_loss + 3.0, examples + 4

    run._sum_across_processes = sum_across_processes
    metrics = run.evaluate()
    assert seen == [b[1].tolist() for b in eval_shard(shuffled, 7, 4, World(1, 2))] and len(seen) == 2
    (total, examples), = summed
    assert examples == 4 and metrics["loss"] == pytest.approx((total + 3.0) / 8)


# --- restores and data-parallel training, in this process --------------------------------------

def test_an_eval_restore_takes_neither_the_optimizer_nor_the_schedule(tmp_path):
    train = argparse.Namespace(mode="train", device="cpu", checkpoint_path=None)
    Runner(train, params_of(tmp_path, "momentum", max_steps=2), Linear, loader, loader).execute()
    saved = load_checkpoint(ckpt(tmp_path, 2))
    assert saved["optimizer"]["state"] and saved["lr_scheduler"]["last_epoch"] == 2  # momentum, 2 steps of decay
    fresh = Linear(params_of(tmp_path, "momentum"), "cpu")
    for path in (ckpt(tmp_path, 2), None):  # --checkpoint_path, or model_dir's newest
        evaluating = runner(tmp_path, mode="eval", optimizer="momentum", checkpoint_path=path)
        assert evaluating.checkpoint == ckpt(tmp_path, 2)
        assert evaluating.model.optimizer.state_dict()["state"] == {}
        assert evaluating.model.lr_scheduler.state_dict() == fresh.lr_scheduler.state_dict()


def test_a_checkpoint_whose_weights_fit_but_not_its_optimizer_is_refused_with_torchs_reason(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    state = load_checkpoint(ckpt(tmp_path, 2))
    groups = state["optimizer"]["param_groups"]
    state["optimizer"]["param_groups"] = groups + groups  # the same settings: another group count
    torch.save(state, ckpt(tmp_path, 2))
    with pytest.raises(UserError) as error:
        runner(tmp_path, max_steps=4)
    assert str(error.value) == (f"{ckpt(tmp_path, 2)}: does not fit this model: the weights fit, the rest does "
                                f"not: loaded state dict has a different number of parameter groups (a checkpoint "
                                f"of another model or config?)")


def test_a_resumed_run_stopped_before_its_first_checkpoint_names_the_one_it_started_from(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    run = runner(tmp_path, {1: NonFiniteGradient("weight", math.nan)}, max_steps=6)
    with pytest.raises(NonFiniteLossError) as error:
        run.execute()
    assert str(error.value) == (f"step 3: the gradient of weight is nan; training stopped, the last good "
                                f"checkpoint is {ckpt(tmp_path, 2)}")
    run = runner(tmp_path, {1: lambda steps: (sigint(steps), sigint(steps))}, max_steps=6)
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert str(stopped.value) == (f"interrupted by SIGINT at step 2 of 6, before this run's first checkpoint; the "
                                  f"same command starts again from {ckpt(tmp_path, 2)} (step 2)")
    assert stopped.value.signum == signal.SIGINT


def test_a_run_started_from_checkpoint_path_says_a_rerun_would_start_there_again(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    run = runner(tmp_path, {1: sigint}, max_steps=6, checkpoint_path=ckpt(tmp_path, 2))
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert str(stopped.value) == (f"interrupted by SIGINT at step 3 of 6; saved {ckpt(tmp_path, 3)}: to resume from "
                                  f"it, run the same command without --checkpoint_path (with it, the run starts from "
                                  f"{ckpt(tmp_path, 2)} again)")


def test_a_data_parallel_process_trains_on_its_share_of_each_global_batch(tmp_path, monkeypatch):
    from common.pytorch import runner as runner_module
    from common.pytorch.data_order import epoch_batches
    from common.pytorch.distributed import World

    timed = []

    class Window(runner_module.StepWindow):
        def add(self, samples, waiting, total):
            timed.append((samples, waiting, total))
            super().add(samples, waiting, total)

    monkeypatch.setattr(runner_module, "StepWindow", Window)
    run = runner(tmp_path / "0", max_steps=2, batch=2, seed=3)
    run.world = World(0, 2)  # rank 0 of 2 (its steps need no process group: they are scripted)
    seen, train = [], run.steps.train
    run.steps.train = lambda batch: seen.append(batch[1].tolist()) or train(batch)
    run.execute()
    shares = [b[1].tolist() for b in epoch_batches(run.train_loader, 3, 0, 0, World(0, 2))][:2]
    alone = [b[1].tolist() for b in epoch_batches(run.train_loader, 3, 0)][:2]
    assert seen == shares and seen != alone
    assert load_checkpoint(ckpt(tmp_path / "0", 2))["data_order"] == {"epoch": 0, "batch": 2, "global_batch": 4}
    # the rate counts the global batch; waiting for a batch is part of a step's time, which is seconds here
    assert [samples for samples, _, _ in timed] == [4, 4]
    assert all(0 <= waiting <= total < 60 for _, waiting, total in timed)
    other = runner(tmp_path / "1", max_steps=2, batch=2, seed=3)
    other.world = World(1, 2)  # rank 1 writes nothing: rank 0 saves and logs to TensorBoard for both
    other.execute()
    assert not os.path.exists(tmp_path / "1")


def test_the_steps_of_a_data_parallel_process_train_the_model_in_ddp(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from common.pytorch import runner as runner_module
    from common.pytorch.distributed import SINGLE, World

    wrapped = []
    monkeypatch.setattr(runner_module, "wrap", lambda module, device: wrapped.append((module, device)) or "in ddp")
    cpu = torch.device("cpu")
    alone = Linear(params_of(tmp_path), "cpu")
    module = alone.model
    FrameworkSteps(SimpleNamespace(model=alone, device=cpu, world=SINGLE))
    assert alone.model is module and wrapped == []
    parallel = Linear(params_of(tmp_path), "cpu")
    module = parallel.model
    FrameworkSteps(SimpleNamespace(model=parallel, device=cpu, world=World(1, 2)))
    assert parallel.model == "in ddp" and wrapped == [(module, cpu)]


def test_keys_no_code_reads_are_warned_once_by_the_end_of_the_first_step(tmp_path, caplog):
    from common.params import load_vendor_params

    path = tmp_path / "params.yaml"
    path.write_text(f"model:\n  widht: 3\noptimizer:\n  optimizer_type: sgd\n  learning_rate: 0.1\nrunconfig:\n"
                    f"  model_dir: {tmp_path / 'model'}\n  max_steps: 3\n  log_steps: 1\n")
    params = load_vendor_params(str(path), lambda params: None)  # the vendor's form: its keys are tracked
    steps = type("Steps", (ScriptedTrain,), {"script": {}, "scale": None})
    with caplog.at_level(logging.INFO, logger="zoo"):
        Runner(argparse.Namespace(mode="train", device="cpu", checkpoint_path=None), params, Linear, loader, loader,
               steps).execute()
    logged = [message for _, message in zoo_log(caplog)]
    warned = [i for i, message in enumerate(logged) if "never read" in message]
    assert [logged[i] for i in warned] == [f"{path}:2: 'model.widht' is never read by the model or data code"]
    assert logged[warned[0] + 1].startswith("| Train Device=cpu Step=1 ")  # before the first step's line


class StopsFetching(TensorDataset):
    """The data of a DataLoader whose workers got the terminal's Ctrl-C as well: the ninth example
    read raises the signal, then fails as a worker that quit."""

    def __init__(self):
        super().__init__(*dataset().tensors)
        self.read = 0

    def __getitem__(self, index):
        self.read += 1
        if self.read == 9:
            sigint(None)
            raise RuntimeError("DataLoader worker exited unexpectedly")
        return super().__getitem__(index)


def test_a_signal_that_also_stops_the_data_loader_ends_the_run_as_a_signal_does(tmp_path):
    run = runner(tmp_path)
    run.train_loader = DataLoader(StopsFetching(), batch_size=4)
    with pytest.raises(Interrupted) as stopped:
        run.execute()
    assert str(stopped.value) == (f"interrupted by SIGINT at step 2 of 5; saved {ckpt(tmp_path, 2)}: the same "
                                  f"command resumes from there")


def test_a_run_holds_model_dirs_lock_while_it_runs_and_a_data_parallel_rank_1_takes_none(tmp_path):
    import json

    from common import runlock
    from common.pytorch.distributed import World

    held = []
    run = runner(tmp_path, {1: lambda steps: held.append(json.loads(open(runlock.lock_path(str(tmp_path))).read()))},
                 max_steps=1)
    run.execute()
    assert [(record["pid"], record["mode"]) for record in held] == [(os.getpid(), "train")]
    assert not os.path.exists(runlock.lock_path(str(tmp_path)))  # released at the end
    rank_1 = runner(tmp_path, max_steps=2)
    rank_1.world = World(1, 2)
    other = runlock.RunLock(str(tmp_path), "train")  # rank 0's, for both processes
    other.acquire()
    try:
        rank_1.execute()
    finally:
        other.release()
    assert rank_1.global_step == 2


def test_a_data_parallel_process_runs_on_its_local_ranks_gpu(tmp_path, monkeypatch):
    from common.pytorch.distributed import World

    class Built(Exception):
        pass

    def model_fn(params, device):
        devices.append(device)
        raise Built  # far enough: no GPU to build on here

    devices = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Built):
        Runner(argparse.Namespace(mode="train", device="gpu", checkpoint_path=None), params_of(tmp_path), model_fn,
               loader, loader, world=World(1, 2, 1))
    assert devices == [torch.device("cuda", 1)]


def test_eval_all_with_no_checkpoint_that_reads_names_the_newest_and_writes_nothing(tmp_path):
    runner(tmp_path, max_steps=4).execute()
    for step in (2, 4):
        with open(ckpt(tmp_path, step), "r+b") as f:
            f.truncate(100)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UserError) as error:
        runner(tmp_path, mode="eval_all")
    reason = "not a readable checkpoint (not a torch.save archive: truncated, damaged or another format)"
    assert str(error.value) == (f"{tmp_path}: no checkpoint reads, nothing to evaluate (2 tried; the newest: "
                                f"{ckpt(tmp_path, 4)}: {reason})")
    assert sorted(os.listdir(tmp_path)) == before


class WithVendorLoss(Linear):
    """Linear holding a vendor metric that reports under a key the eval reports already."""

    name = "eval/loss"

    def __init__(self, params, device):
        from common.pytorch.metrics import AccuracyMetric

        super().__init__(params, device)
        self.vendor_metric = AccuracyMetric(name=self.name)


def test_a_vendor_metric_reporting_as_the_loss_or_a_models_metric_is_refused(tmp_path):
    runner(tmp_path, max_steps=2).execute()
    for name in ("eval/loss", "accuracy"):
        model = type("Model", (WithVendorLoss,), {"name": name})
        with pytest.raises(UserError) as error:
            runner(tmp_path, mode="eval", model=model)
        key = name.removeprefix("eval/")
        assert str(error.value) == (f"AccuracyMetric {name!r} reports as {key!r}, which the eval reports "
                                    f"already (the loss or one of the model's metrics); give it another name")


def test_a_data_parallel_eval_adds_up_the_loss_the_examples_and_every_metrics_sums(tmp_path, monkeypatch, caplog):
    from common.pytorch import runner as runner_module
    from common.pytorch.distributed import World

    runner(tmp_path, max_steps=2).execute()
    run = runner(tmp_path, mode="eval", model=WithVendorMetric)
    run.world = World(0, 2)
    accuracy, vendor = run.model.metrics["accuracy"], run.cb_metrics["vendor_accuracy"]
    accuracy.correct, accuracy.total = 2, 5
    vendor.total_correct, vendor.total_weight, vendor._num_updates = 1.0, 4.0, 1
    handed = []

    def sum_across(arrays, world):  # the other process: twice this one's, and one more
        handed.append(([np.asarray(a).tolist() for a in arrays], world))
        return [np.asarray(a) * 2 + 1 for a in arrays]

    monkeypatch.setattr(runner_module, "sum_across", sum_across)
    caplog.clear()  # only the records of the sum below
    with caplog.at_level(logging.INFO, logger="zoo"):
        assert run._sum_across_processes(1.5, 3) == (4.0, 7)
    assert handed == [([1.5, 3, 2, 5, 1.0, 4.0, 1], run.world)]
    assert (accuracy.correct, accuracy.total) == (5, 11) and type(accuracy.correct) is int
    assert (vendor.total_correct, vendor.total_weight, vendor._num_updates) == (3.0, 9.0, 3)
    assert zoo_log(caplog) == [("INFO", "eval over 7 examples, shared by 2 processes")]

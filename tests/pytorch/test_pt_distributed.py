"""Data-parallel training through torchrun (common/pytorch/distributed.py): the data order,
DDP, equivalence with one process, resume with another number of processes, failures."""

import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from common.errors import UserError
from common.pytorch import data_order, distributed
from common.pytorch.data_order import TrainOrder, epoch_batches, eval_shard
from common.pytorch.metrics import Accuracy, MeanIOUMetric, Metric, set_summed_state, summed_state
from common.summaries import read_scalars

REPO = Path(__file__).resolve().parents[2]
MNIST = REPO / "pytorch" / "mnist"
TINY = MNIST / "configs" / "params_tiny.yaml"


def _loader(batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(50)), batch_size=batch_size, shuffle=True, drop_last=True)


# --- the data order -----------------------------------------------------------------------------

def test_processes_slice_the_global_batches_of_one_process():
    single = [b[0].tolist() for b in epoch_batches(_loader(8), seed=3, epoch=1)]
    ranks = [[b[0].tolist() for b in epoch_batches(_loader(4), 3, 1, world=distributed.World(r, 2))] for r in (0, 1)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == 6  # 50 // 8 global batches
    for step, batch in enumerate(single):
        assert ranks[0][step] + ranks[1][step] == batch
    skipped = [b[0].tolist() for b in epoch_batches(_loader(4), 3, 1, skip=2, world=distributed.World(1, 2))]
    assert skipped == ranks[1][2:]


def test_the_replay_keeps_every_setting_of_the_users_loader(monkeypatch):
    """The epoch's batches come from a DataLoader over the drawn order, with the loader's own settings."""
    import warnings

    seen = {}

    class Recorder:
        def __init__(self, dataset, **kwargs):
            seen.update(kwargs, dataset=dataset)

        def __iter__(self):
            return iter(())

    def init(worker):
        return None

    def collate(batch):
        return batch

    dataset = TensorDataset(torch.arange(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, pin_memory=True, timeout=5.0,
                            worker_init_fn=init, multiprocessing_context="spawn", prefetch_factor=3, in_order=False,
                            collate_fn=collate)
    monkeypatch.setattr(data_order, "DataLoader", Recorder)
    list(epoch_batches(loader, 1, 0))
    order, generator = seen.pop("batch_sampler"), seen.pop("generator")
    assert sorted(sum(order, [])) == list(range(8)) and isinstance(generator, torch.Generator)
    assert seen == {"dataset": dataset, "num_workers": 2, "collate_fn": collate, "pin_memory": True, "timeout": 5.0,
                    "worker_init_fn": init, "multiprocessing_context": loader.multiprocessing_context,
                    "prefetch_factor": 3, "pin_memory_device": loader.pin_memory_device, "in_order": False}
    assert loader.multiprocessing_context is not None


def test_a_sampler_without_a_generator_is_left_without_one():
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, shuffle=False)
    assert _batches(epoch_batches(loader, 1, 0)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert not hasattr(loader.sampler, "generator")
    shuffled = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, shuffle=True)
    list(epoch_batches(shuffled, 1, 0))
    assert shuffled.sampler.generator is None  # its own, put back


def test_resuming_with_another_number_of_processes_continues_at_the_same_example(caplog):
    order = TrainOrder(_loader(4), seed=0, state={"epoch": 2, "batch": 3, "global_batch": 8},
                       world=distributed.World(0, 1))
    assert (order.epoch, order.batch, order.global_batch) == (2, 6, 4)
    assert order.state() == {"epoch": 2, "batch": 6, "global_batch": 4}
    order = TrainOrder(_loader(4), seed=0, state={"epoch": 0, "batch": 3, "global_batch": 4},
                       world=distributed.World(0, 2))
    assert order.batch == 1 and "stopped 12 example(s) into epoch 0" in caplog.text
    old = TrainOrder(_loader(4), seed=0, state={"epoch": 1, "batch": 5})  # a checkpoint from before the key
    assert (old.epoch, old.batch) == (1, 5)


def test_an_iterable_dataset_cannot_be_sliced():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    refusal = ("train data: a data-parallel run needs a DataLoader over a map-style dataset with batch_size set (the "
               "processes slice each global batch of its sampler's order); an IterableDataset, a custom batch_sampler "
               "or batch_size=None cannot be sliced")
    with pytest.raises(UserError) as error:
        list(epoch_batches(DataLoader(Stream(), batch_size=2), 0, 0, world=distributed.World(0, 2)))
    assert str(error.value) == refusal
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(8)), batch_size=2, drop_last=True)
    for loader in (DataLoader(TensorDataset(torch.arange(8)), batch_sampler=sampler),
                   DataLoader(TensorDataset(torch.arange(8)), batch_size=None)):
        with pytest.raises(UserError) as error:
            list(epoch_batches(loader, 0, 0, world=distributed.World(0, 2)))
        assert str(error.value) == refusal



def _batches(iterator) -> list:
    return [b[0].tolist() if isinstance(b, list) else b.tolist() for b in iterator]


def test_an_epochs_order_is_fixed_by_seed_and_epoch_alone_and_resumes_mid_epoch():
    loader = _loader(8)
    torch.manual_seed(0)
    rng = torch.get_rng_state()
    full = _batches(epoch_batches(loader, seed=3, epoch=1))
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is left to the model
    torch.manual_seed(1)
    assert _batches(epoch_batches(loader, 3, 1)) == full
    assert all(len(b) == 8 for b in full) and len(set(sum(full, []))) == 48
    assert _batches(epoch_batches(loader, 3, 1, skip=4)) == full[4:]
    assert _batches(epoch_batches(loader, 3, 2)) != full and _batches(epoch_batches(loader, 4, 1)) != full
    # the epoch's generator: seeded from (seed, epoch) as the docstring says, 63 bits
    seed = int.from_bytes(hashlib.blake2b(b"3/1", digest_size=8).digest(), "little") >> 1
    assert data_order.epoch_seed(3, 1) == seed and 2**62 <= max(data_order.epoch_seed(s, 0) for s in range(8)) < 2**63
    assert data_order.epoch_seed(3, 1) != data_order.epoch_seed(1, 3)
    drawn = list(torch.utils.data.RandomSampler(range(50), generator=torch.Generator().manual_seed(seed)))
    assert sum(full, []) == drawn[:48]

    # the loader's own generator is put back; the indices come one at a time without batching
    own = torch.Generator().manual_seed(9)
    unbatched = DataLoader(TensorDataset(torch.arange(6)), batch_size=None, shuffle=True, generator=own)
    order = _batches(epoch_batches(unbatched, 3, 0))
    assert unbatched.sampler.generator is own
    assert sorted(order) == list(range(6)) and _batches(epoch_batches(unbatched, 3, 0, skip=2)) == order[2:]
    assert unbatched.sampler.generator is own


def test_a_sampler_with_set_epoch_gets_the_epoch_and_a_stream_keeps_its_order():
    sampler = torch.utils.data.DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(torch.arange(12)), batch_size=3, sampler=sampler)
    first = _batches(epoch_batches(loader, 0, 5))
    assert sampler.epoch == 5
    sampler.set_epoch(5)
    assert first == [list(b) for b in zip(*[iter(list(sampler))] * 3)]

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(7))

    stream = DataLoader(Stream(), batch_size=2)
    assert _batches(epoch_batches(stream, 0, 0, skip=1)) == [[2, 3], [4, 5], [6]]
    assert _batches(eval_shard(stream, 0)) == [[0, 1], [2, 3], [4, 5], [6]]
    assert _batches(eval_shard(stream, 0, limit=3, world=distributed.World(1, 2))) == [[2, 3]]
    assert _batches(eval_shard(stream, 0, world=distributed.World(0, 3))) == [[0, 1], [6]]


def test_the_replay_keeps_the_loaders_settings():
    def collate(items):
        return {"x": torch.stack([item[0] for item in items]) * 10}

    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, shuffle=True, collate_fn=collate)
    batches = list(epoch_batches(loader, 1, 0))
    assert sorted(sum((b["x"].tolist() for b in batches), [])) == [10 * i for i in range(8)]
    shuffled = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, shuffle=True)
    assert [(b["x"] // 10).tolist() for b in batches] == _batches(epoch_batches(shuffled, 1, 0))
    assert [(b["x"] // 10).tolist() for b in eval_shard(loader, 1)] == _batches(eval_shard(shuffled, 1))


def test_train_order_runs_epoch_after_epoch_and_resumes_where_it_stopped():
    loader = _loader(8)
    order = TrainOrder(loader, seed=2)
    assert order.state() == {"epoch": 0, "batch": 0, "global_batch": 8}
    stream = iter(order)
    seen = [next(stream)[0].tolist() for _ in range(8)]  # 6 batches an epoch
    assert seen == _batches(epoch_batches(loader, 2, 0)) + _batches(epoch_batches(loader, 2, 1))[:2]
    assert order.state() == {"epoch": 1, "batch": 2, "global_batch": 8}
    resumed = iter(TrainOrder(loader, seed=2, state=order.state()))
    assert [next(resumed)[0].tolist() for _ in range(5)] == [next(stream)[0].tolist() for _ in range(5)]
    assert order.state() == {"epoch": 2, "batch": 1, "global_batch": 8}
    assert TrainOrder(_loader(4), 0, world=distributed.World(1, 3)).global_batch == 12
    second = iter(TrainOrder(_loader(4), 3, world=distributed.World(1, 2)))  # process 1 of 2 takes its slices
    assert [next(second)[0].tolist() for _ in range(7)] == (
        _batches(epoch_batches(_loader(4), 3, 0, world=distributed.World(1, 2))) +
        _batches(epoch_batches(_loader(4), 3, 1, world=distributed.World(1, 2)))[:1])
    unbatched = DataLoader(TensorDataset(torch.arange(3)), batch_size=None)
    assert TrainOrder(unbatched, 0).global_batch == 1

    too_small = DataLoader(TensorDataset(torch.arange(3)), batch_size=4, drop_last=True)
    with pytest.raises(UserError) as error:
        next(iter(TrainOrder(too_small, 0)))
    assert str(error.value) == ("train data: an epoch yielded no batches (is the dataset smaller than batch_size "
                                "with drop_last?)")
    # a resume at the very end of an epoch goes on with the next one
    at_end = iter(TrainOrder(loader, 2, state={"epoch": 0, "batch": 6, "global_batch": 8}))
    assert next(at_end)[0].tolist() == _batches(epoch_batches(loader, 2, 1))[0]


def test_resuming_with_another_global_batch_warns_with_the_figures(caplog):
    order = TrainOrder(_loader(4), seed=0, state={"epoch": 3, "batch": 5, "global_batch": 6})
    assert (order.epoch, order.batch) == (3, 7)
    assert caplog.messages == ["data order: the checkpoint stopped 30 example(s) into epoch 3, not a multiple of "
                               "the global batch of 4; resuming at example 28"]
    caplog.clear()
    TrainOrder(_loader(4), seed=0, state={"epoch": 3, "batch": 6, "global_batch": 6})
    assert not caplog.messages


# --- the environment and the wrapper ---------------------------------------------------------------

def test_world_from_torchruns_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.world_from_env() == distributed.SINGLE
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.world_from_env() == distributed.World(3, 4, 1)
    for unset in ("", None):  # LOCAL_RANK unset or empty: 0
        if unset is None:
            monkeypatch.delenv("LOCAL_RANK")
        else:
            monkeypatch.setenv("LOCAL_RANK", unset)
        assert distributed.world_from_env() == distributed.World(3, 4, 0)
    monkeypatch.setenv("WORLD_SIZE", "")
    assert distributed.world_from_env() == distributed.SINGLE
    for size in ("0", "-2"):
        monkeypatch.setenv("WORLD_SIZE", size)
        with pytest.raises(UserError) as error:
            distributed.world_from_env()
        assert str(error.value) == f"environment variable WORLD_SIZE={size}: must be at least 1"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(UserError, match="RANK='4'.*in 0..3: launch it with torchrun"):
        distributed.world_from_env()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(UserError, match="WORLD_SIZE='two': not an integer"):
        distributed.world_from_env()
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "0")
    with pytest.raises(UserError, match="ZOO_DIST_TIMEOUT_S='0'"):
        distributed.timeout_s()


def test_the_wrapper_passes_attributes_and_keeps_one_process_names(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        module = torch.nn.Sequential(torch.nn.Linear(3, 2))
        module.extra = "kept"
        wrapped = distributed.wrap(module, torch.device("cpu"))
        assert wrapped.extra == "kept" and getattr(wrapped, "0") is module[0]  # as self.model.<submodule>
        assert list(wrapped.state_dict()) == ["0.weight", "0.bias"]
        wrapped.load_state_dict({"0.weight": torch.ones(2, 3), "0.bias": torch.zeros(2)})
        assert module[0].weight.sum().item() == 6
        wrapped(torch.ones(1, 3)).sum().backward()  # through DDP's forward: the gradients reach the module
        assert module[0].weight.grad is not None
    finally:
        dist.destroy_process_group()



def test_the_collective_timeout_is_600_s_or_the_environments(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout_s() == 600.0
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "2.5")
    assert distributed.timeout_s() == 2.5
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "0.5")
    assert distributed.timeout_s() == 0.5
    for value in ("0", "-3", "ten", "nan"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, value)
        with pytest.raises(UserError) as error:
            distributed.timeout_s()
        assert str(error.value) == f"environment variable ZOO_DIST_TIMEOUT_S={value!r}: a number of seconds above 0"


def test_a_process_group_of_one_joins_sums_and_leaves(tmp_path, monkeypatch):
    """init() on the CPU (gloo, the timeout from the environment), then the sums over the processes: in a
    group of one process standing for rank 0 of 2, the all-reduce adds nothing and mean_across halves."""
    import torch.distributed as dist

    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(29400 + os.getpid() % 500)),
                        ("RANK", "0"), ("WORLD_SIZE", "1"), (distributed.TIMEOUT_ENV, "30")):
        monkeypatch.setenv(name, value)
    if not torch.cuda.is_available():
        with pytest.raises(UserError) as error:
            distributed.init(distributed.World(0, 2), "gpu")
        assert str(error.value) == f"--device gpu: no CUDA device is available to torch {torch.__version__}"
        assert not dist.is_initialized()
    assert distributed.init(distributed.World(0, 2), "cpu") == torch.device("cpu")
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        two = distributed.World(0, 2)
        arrays = [np.array([[1, 2], [3, 4]], np.int32), np.float32(5.5), np.array([0.25])]
        sums = distributed.sum_across(arrays, two)
        assert [a.dtype for a in sums] == [np.float64] * 3 and [a.shape for a in sums] == [(2, 2), (), (1,)]
        assert [a.tolist() for a in sums] == [[[1, 2], [3, 4]], 5.5, [0.25]]
        assert distributed.sum_across([], two) == [] and distributed.sum_across(arrays, distributed.SINGLE) is arrays
        assert distributed.mean_across(3.0, two) == 1.5 and distributed.mean_across(3.0, distributed.SINGLE) == 3.0
    finally:
        distributed.finish()
    assert not dist.is_initialized()
    distributed.finish()  # nothing to leave: no error


def test_init_on_gpus_takes_the_local_ranks_gpu_and_nccl_and_the_cpu_gloo(monkeypatch):
    """init()'s choices, with torch.cuda and the process group stood in for (no GPU here): the GPU
    LOCAL_RANK names, NCCL, the timeout from the environment; a LOCAL_RANK past the GPUs is refused."""
    import datetime

    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "30")
    assert distributed.init(distributed.World(3, 4, 1), "gpu") == torch.device("cuda", 1)
    assert calls == [("set_device", 1), ("nccl", {"timeout": datetime.timedelta(seconds=30)})]
    calls.clear()
    assert distributed.init(distributed.World(3, 4, 1), "cpu") == torch.device("cpu")
    assert calls == [("gloo", {"timeout": datetime.timedelta(seconds=30)})]
    calls.clear()
    with pytest.raises(UserError) as error:
        distributed.init(distributed.World(2, 4, 2), "gpu")
    assert str(error.value) == ("LOCAL_RANK 2: this machine has 2 GPU(s); start at most that many processes per "
                                "node (--nproc_per_node)")
    assert calls == []


def test_the_wrapper_of_a_gpu_model_names_its_gpu_and_state_dict_arguments_reach_the_module(tmp_path, monkeypatch):
    import warnings

    import torch.distributed as dist

    monkeypatch.setattr(distributed, "ZooDDP", lambda module, device_ids: (module, device_ids))
    module = torch.nn.Sequential(torch.nn.Linear(3, 2))
    assert distributed.wrap(module, torch.device("cuda", 1)) == (module, [1])
    assert distributed.wrap(module, torch.device("cpu")) == (module, None)
    monkeypatch.undo()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped = distributed.wrap(module, torch.device("cpu"))
        assert all(isinstance(v, torch.nn.Parameter) for v in wrapped.state_dict(keep_vars=True).values())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note that positional arguments are deprecated
            assert list(wrapped.state_dict(None, "net.")) == ["net.0.weight", "net.0.bias"]
        result = wrapped.load_state_dict({"0.weight": torch.full((2, 3), 2.0)}, strict=False)
        assert result.missing_keys == ["0.bias"] and module[0].weight.sum().item() == 12
    finally:
        dist.destroy_process_group()


def test_the_sums_over_gpu_processes_go_through_the_gpu_in_float64(tmp_path, monkeypatch):
    """With NCCL the all-reduce takes a CUDA tensor (stood in for here); the sums are float64 from any dtype."""
    import torch.distributed as dist

    moved, reduced = [], []
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(dist, "all_reduce", lambda t: reduced.append(t.dtype))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda t: (moved.append(t.dtype), t)[1])
    two = distributed.World(0, 2)
    assert distributed.mean_across(0.1, two) == 0.05
    sums = distributed.sum_across([np.array([0.1], np.float32), np.float32(3)], two)  # float32 alone stays float32
    assert [s.dtype for s in sums] == [np.float64, np.float64] and sums[0].tolist() == [np.float32(0.1).item()]
    assert moved == reduced == [torch.float64, torch.float64]


def test_the_device_refuses_a_process_of_several():
    distributed.refuse_on_device(distributed.SINGLE, "--device emulator")
    with pytest.raises(UserError) as error:
        distributed.refuse_on_device(distributed.World(1, 3), "--compile_only")
    assert str(error.value) == ("--compile_only runs in one process: the emulated device is one system per run, but "
                                "this is process 1 of 3 (WORLD_SIZE); launch it without torchrun")



@pytest.mark.parametrize("error, stops", [
    (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"), True),
    (RuntimeError("Gloo connectFullMesh failed"), True), (RuntimeError("NCCL error: unhandled system error"), True),
    (RuntimeError("Timed out waiting 600000ms for send operation"), True), (RuntimeError("op timed out"), True),
    (RuntimeError("the gloo backend"), True), (RuntimeError("  Gloo " + "y" * 200 + "\n second line"), True),
    (torch.distributed.DistBackendError("peer reset"), True), (torch.distributed.DistBackendError(" \n"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False)])
def test_a_failed_collective_is_one_line_and_the_group_is_left(monkeypatch, error, stops):
    """run.py's _data_parallel: a collective whose peer is gone or timed out names this process and how to
    resume; any other error keeps its traceback; the group is left either way."""
    from argparse import Namespace

    from common.pytorch import run as run_module

    calls = []
    monkeypatch.setattr(distributed, "init", lambda world, device: calls.append(("init", world, device)))
    monkeypatch.setattr(distributed, "finish", lambda: calls.append(("finish",)))

    class FailingRunner:
        def __init__(self, *args):
            calls.append(("runner", *args[2:5], args[-2].__name__, args[-1]))
            assert args[0] is namespace and args[1] is params

        def execute(self):
            raise error

    monkeypatch.setattr(run_module, "Runner", FailingRunner)
    world = distributed.World(1, 2)
    namespace, params = Namespace(device="cpu"), {"runconfig": {"model_dir": "/m"}}
    with pytest.raises(UserError if stops else RuntimeError) as raised:
        run_module._data_parallel(namespace, params, "model_fn", "train_fn", "eval_fn", world)
    assert calls == [("init", world, "cpu"), ("runner", "model_fn", "train_fn", "eval_fn", "FrameworkSteps", world),
                     ("finish",)]
    if stops:
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        assert str(raised.value) == (f"process 1 of 2: a collective failed ({first}): another process of the run "
                                     f"stopped or cannot be reached; the same command resumes from the newest "
                                     f"checkpoint in /m")
    else:
        assert raised.value is error


def test_a_collective_failure_is_told_by_its_type_or_its_words():
    from common.pytorch.run import _is_collective_failure

    backend_error = getattr(torch.distributed, "DistBackendError", None)
    if backend_error is not None:
        assert _is_collective_failure(backend_error("anything"))
    assert not _is_collective_failure(RuntimeError(""))
    assert not _is_collective_failure(ValueError("a value"))
    long = RuntimeError("Connection closed by peer " + "x" * 300 + "\nsecond line")
    assert _is_collective_failure(long)


# --- whole runs ------------------------------------------------------------------------------------

def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update({"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", distributed.TIMEOUT_ENV: "60"}, **extra)
    return env


def _torchrun(tmp_path, model_dir, *overrides, processes=2, **popen):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
           str(MNIST / "run.py"), "--params", str(TINY), "--model_dir", str(model_dir), *overrides]
    return subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def _single(tmp_path, model_dir, *overrides, **env):
    cmd = [sys.executable, str(MNIST / "run.py"), "--params", str(TINY), "--model_dir", str(model_dir), *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(**env), capture_output=True, text=True, timeout=300)


def _weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_two_processes_train_as_one_with_twice_the_batch_and_resume_with_one(tmp_path):
    two = _torchrun(tmp_path, tmp_path / "two", "train_input.batch_size=16")
    out, err = two.communicate(timeout=300)
    assert two.returncode == 0, err[-3000:]
    one = _single(tmp_path, tmp_path / "one")  # batch 32 (params_tiny)
    assert one.returncode == 0, one.stderr[-3000:]

    losses = {name: [v for _, v in read_scalars(str(tmp_path / name / "train"))["loss"]] for name in ("two", "one")}
    assert len(losses["two"]) == 4
    np.testing.assert_allclose(losses["two"], losses["one"], rtol=1e-5)
    a, b = _weights(tmp_path / "two" / "checkpoint_4.mdl"), _weights(tmp_path / "one" / "checkpoint_4.mdl")
    assert set(a) == set(b)  # the one-process names: no "module." prefix
    for name in a:
        np.testing.assert_allclose(a[name].numpy(), b[name].numpy(), rtol=1e-5, atol=1e-6)
    assert err.count("Step=1 ") == 1  # rank 0 logs; rank 1 does not
    assert sorted(p.name for p in (tmp_path / "two").glob("params_*.yaml")) == ["params_train.yaml"]

    # the two-process checkpoint resumes in one process (batch 32: the same global batch) to step 6,
    # as the one-process run continued there
    resumed = _single(tmp_path, tmp_path / "two", "runconfig.max_steps=6")
    straight = _single(tmp_path, tmp_path / "one", "runconfig.max_steps=6")
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr[-2000:] + straight.stderr[-2000:]
    a, b = _weights(tmp_path / "two" / "checkpoint_6.mdl"), _weights(tmp_path / "one" / "checkpoint_6.mdl")
    for name in a:
        np.testing.assert_allclose(a[name].numpy(), b[name].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flag", ["--device=emulator", "--compile_only"])
def test_the_device_refuses_a_data_parallel_launch(tmp_path, flag):
    result = _single(tmp_path, tmp_path / "m", flag, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "the emulated device is one system per run" in lines[-1]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "m").exists()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def test_a_killed_process_stops_the_others_with_one_line_and_the_run_resumes(tmp_path):
    model_dir = tmp_path / "run"
    run = _torchrun(tmp_path, model_dir, "train_input.batch_size=16", "runconfig.max_steps=100000",
                    "runconfig.checkpoint_steps=20", "runconfig.log_steps=1000")
    deadline = time.time() + 240
    while not list(model_dir.glob("checkpoint_*.mdl")) and time.time() < deadline and run.poll() is None:
        time.sleep(0.5)
    assert list(model_dir.glob("checkpoint_*.mdl")), "no checkpoint before the deadline"
    victims = [c for c in _children(run.pid) if _rank_of(c) == 1]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    started = time.time()
    _, err = run.communicate(timeout=120)
    assert time.time() - started < 90  # no hang
    assert run.returncode != 0
    rank0 = [line for line in err.splitlines() if line.startswith(("error: process 0 of 2", "interrupted by SIGTERM"))]
    assert len(rank0) == 1, err[-3000:]
    newest = max(int(p.stem.split("_")[1]) for p in model_dir.glob("checkpoint_*.mdl"))

    resumed = _torchrun(tmp_path, model_dir, "train_input.batch_size=16", f"runconfig.max_steps={newest + 4}",
                        "runconfig.checkpoint_steps=20", "runconfig.log_steps=1")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"(step {newest})" in err and (model_dir / f"checkpoint_{newest + 4}.mdl").exists()


# --- eval across processes -------------------------------------------------------------------------

def test_the_processes_share_the_eval_batches_of_one_process_each_once():
    loader = DataLoader(TensorDataset(torch.arange(45)), batch_size=4, shuffle=True)  # 12 batches, the last of 1
    single = [b[0].tolist() for b in eval_shard(loader, seed=5)]
    shares = [[b[0].tolist() for b in eval_shard(loader, 5, world=distributed.World(r, 3))] for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]
    assert [shares[i % 3][i // 3] for i in range(12)] == single  # batch i on process i mod 3, whole
    limited = [[b[0].tolist() for b in eval_shard(loader, 5, 5, distributed.World(r, 2))] for r in range(2)]
    assert limited == [[single[0], single[2], single[4]], [single[1], single[3]]]  # eval_steps=5: 3 + 2


def test_metric_sums_come_back_as_their_types_and_a_metric_without_sums_is_refused():
    accuracy = Accuracy()
    accuracy.correct, accuracy.total = 3, 4
    state = summed_state(accuracy)
    set_summed_state(accuracy, {name: np.float64(2 * value) for name, value in state.items()})
    assert (accuracy.correct, accuracy.total) == (6, 8) and type(accuracy.correct) is int
    iou = MeanIOUMetric(num_classes=2)
    iou(labels=torch.tensor([0, 1]), predictions=torch.tensor([0, 0]))
    state = summed_state(iou)
    assert state["_num_updates"] == 1
    set_summed_state(iou, {name: 2 * np.asarray(value, np.float64) for name, value in state.items()})
    assert iou.num_updates == 2 and iou.confusion_matrix.tolist() == [[2, 0], [2, 0]]

    class Median(Metric):
        def reset(self):
            self.values = []

    with pytest.raises(UserError, match=r"test_pt_distributed.py:\d+: metric Median has no 'summed'"):
        summed_state(Median())


def test_the_eval_sums_of_the_processes_are_added_into_every_metric(monkeypatch, caplog):
    """runner.py's sum over the processes, with an all-reduce that stands for two processes of equal shares."""
    import types

    from common.pytorch import runner as runner_module

    reduced = []

    def two_equal_shares(arrays, world):
        reduced.append((len(arrays), world))
        return [2 * np.asarray(a, np.float64) for a in arrays]

    monkeypatch.setattr(runner_module, "sum_across", two_equal_shares)
    accuracy, iou = Accuracy(), MeanIOUMetric(num_classes=2)
    accuracy.correct, accuracy.total = 3, 4
    iou(labels=torch.tensor([0, 1]), predictions=torch.tensor([0, 0]))
    world = distributed.World(1, 2)
    fake = types.SimpleNamespace(model=types.SimpleNamespace(metrics={"accuracy": accuracy}), cb_metrics={"iou": iou},
                                 world=world)
    with caplog.at_level("INFO", logger="zoo"):
        loss, examples = runner_module.Runner._sum_across_processes(fake, 1.25, 4)
    assert (loss, examples) == (2.5, 8) and type(loss) is float and type(examples) is int
    assert reduced == [(2 + 2 + 2, world)]  # loss, examples, accuracy's 2 sums, iou's matrix and calls: one reduce
    assert (accuracy.correct, accuracy.total) == (6, 8) and type(accuracy.total) is int
    assert iou.confusion_matrix.tolist() == [[2, 0], [2, 0]] and iou.num_updates == 2
    assert caplog.messages == ["eval over 8 examples, shared by 2 processes"]



def _eval_scalars(model_dir):
    return read_scalars(str(model_dir / "eval"))


def test_two_processes_evaluate_halves_and_report_the_metrics_of_one(tmp_path):
    trained = _single(tmp_path, tmp_path / "trained", "runconfig.max_steps=2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = str(tmp_path / "trained" / "checkpoint_2.mdl")
    one = _single(tmp_path, tmp_path / "one", "--mode", "eval", "--checkpoint_path", checkpoint)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(tmp_path, tmp_path / "two", "--mode", "eval", "--checkpoint_path", checkpoint)
    _, err = two.communicate(timeout=300)
    assert two.returncode == 0, err[-3000:]
    assert err.count("| Eval ") == 1, err[-3000:]  # rank 0 reports, once
    # the 11 whole batches of 32 of the 360 UCI test digits (eval_input.drop_last), each counted once
    assert "eval over 352 examples, shared by 2 processes" in err
    a, b = _eval_scalars(tmp_path / "two"), _eval_scalars(tmp_path / "one")
    assert set(a) == set(b) == {"loss", "accuracy"}
    for name in a:
        assert [s for s, _ in a[name]] == [s for s, _ in b[name]] == [2]
        np.testing.assert_allclose([v for _, v in a[name]], [v for _, v in b[name]], rtol=1e-6)


def test_the_tf_strategy_keys_are_refused_in_one_line(tmp_path):
    result = _single(tmp_path, tmp_path / "m", "runconfig.train_distribute=mirrored")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: runconfig.train_distribute is the TF runner's")


def test_the_eval_order_is_the_training_order_of_epoch_0_of_its_seed():
    loader = DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True)
    for seed in (3, 4):
        assert _batches(eval_shard(loader, seed)) == _batches(epoch_batches(loader, seed, 0))
    assert _batches(eval_shard(loader, 3)) != _batches(eval_shard(loader, 4))


def test_a_data_parallel_sampler_with_set_epoch_gets_the_epoch():
    sampler = torch.utils.data.DistributedSampler(range(16), num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(torch.arange(16)), batch_size=2, sampler=sampler)
    both = [_batches(epoch_batches(loader, 0, 5, world=distributed.World(r, 2))) for r in (0, 1)]
    assert sampler.epoch == 5
    sampler.set_epoch(5)
    order = list(sampler)
    assert both == [[order[k:k + 2] for k in range(r * 2, 16, 4)] for r in (0, 1)]


def test_the_eval_order_sets_a_samplers_epoch_to_0_and_leaves_the_global_rng_alone():
    sampler = torch.utils.data.DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(torch.arange(12)), batch_size=3, sampler=sampler)
    sampler.set_epoch(7)
    before = torch.get_rng_state()
    order = _batches(eval_shard(loader, 0))
    assert torch.equal(torch.get_rng_state(), before)  # the replay's base seed comes from (seed, 0)
    assert sampler.epoch == 0
    sampler.set_epoch(0)
    assert order == [list(b) for b in zip(*[iter(list(sampler))] * 3)]


# --- run.py's data-parallel branch in this process (torchrun's environment set, the group stood in for)

def _mnist_fns():
    from common.folder import import_beside

    model, data, utils = import_beside(str(MNIST / "run.py"), "model", "data", "utils")
    return model.model_fn, data.get_train_dataloader, data.get_eval_dataloader, utils.default_params


def _run_in_process(tmp_path, *argv, model_dir=True):
    from common.pytorch.run import run

    where = ["--model_dir", str(tmp_path / "m")] if model_dir else []
    return run(*_mnist_fns(), argv=["--params", str(TINY), *where, *argv])


@pytest.mark.parametrize("argv, what", [
    (["--validate_only"], "--validate_only / --compile_only"), (["--compile_only"], "--validate_only / --compile_only"),
    (["--device", "emulator"], "--device emulator")])
def test_a_data_parallel_launch_of_the_device_is_one_line_naming_the_flag_and_the_process(
        tmp_path, monkeypatch, capsys, argv, what):
    for name, value in (("WORLD_SIZE", "3"), ("RANK", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        _run_in_process(tmp_path, "--mode", "train", *argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {what} runs in one process: the emulated device is one system per run, but this is process 2 of "
        f"3 (WORLD_SIZE); launch it without torchrun")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("rank, level", [("0", logging.INFO), ("1", logging.WARNING)])
def test_a_data_parallel_launch_runs_its_mode_in_the_group_and_only_rank_0_logs_the_run(
        tmp_path, monkeypatch, rank, level):
    from common.pytorch import run as run_module

    for name, value in (("WORLD_SIZE", "2"), ("RANK", rank), ("LOCAL_RANK", rank)):
        monkeypatch.setenv(name, value)
    zoo = logging.getLogger("zoo")
    monkeypatch.setattr(zoo, "level", logging.NOTSET)  # restored after the test
    calls = []
    monkeypatch.setattr(run_module, "_data_parallel",
                        lambda args, params, *rest: calls.append((args.mode, params["runconfig"]["max_steps"],
                                                                  rest[:-1], rest[-1])) or "done")
    assert _run_in_process(tmp_path, "--mode", "eval") == "done"
    assert calls == [("eval", 4, _mnist_fns()[:3], distributed.World(int(rank), 2, int(rank)))]  # params_tiny's
    assert (zoo.level, logging.getLogger().level) == (level if rank == "1" else logging.NOTSET, logging.INFO)


def test_the_usage_line_names_the_folders_run_py_and_verbose_logs_debug(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exited:
        _run_in_process(tmp_path, "--help")
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("usage: mnist/run.py ")
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    with pytest.raises(SystemExit):
        _run_in_process(tmp_path, "--mode", "train", "--verbose", "model.nope=1")
    assert root.level == logging.DEBUG
    with pytest.raises(SystemExit):
        _run_in_process(tmp_path, "--mode", "train", "model.nope=1")
    assert root.level == logging.INFO


def test_one_process_runs_its_mode_in_model_dir_of_the_framework_folder_and_config(tmp_path, monkeypatch):
    """Without runconfig.model_dir: model_dir/pytorch_<folder>_<config> (common/cli.py's default_model_dir)."""
    from common.pytorch import run as run_module

    calls = []

    class Recorder:
        def __init__(self, args, params, *rest):
            calls.append((args.mode, params["runconfig"]["model_dir"], rest[:3], rest[3]))

        def execute(self):
            return "done"

    monkeypatch.setattr(run_module, "Runner", Recorder)
    monkeypatch.chdir(tmp_path)
    assert _run_in_process(tmp_path, "--mode", "eval", model_dir=False) == "done"
    assert calls == [("eval", os.path.join("model_dir", "pytorch_mnist_tiny"), _mnist_fns()[:3],
                      run_module.step_backend("cpu"))]


@pytest.mark.parametrize("key", ["train_distribute=mirrored", "num_devices=2"])
def test_the_tf_strategy_keys_are_one_line_in_process(tmp_path, capsys, key):
    with pytest.raises(SystemExit) as exited:
        _run_in_process(tmp_path, "--mode", "train", f"runconfig.{key}")
    assert exited.value.code == 2
    name = key.split("=")[0]
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: runconfig.{name} is the TF runner's (tf.distribute strategies); a PyTorch run trains data parallel "
        f"when launched by torchrun --nproc_per_node N (README)")
    assert not (tmp_path / "m").exists()


def test_a_folders_own_flags_land_in_runconfig_of_the_vendor_form_only_when_given():
    import argparse

    from common.params import TrackedDict, load_params
    from common.pytorch.run import _add_extra_args

    parser = argparse.ArgumentParser()  # with its -h, as a folder may write it
    parser.add_argument("--run_name")
    parser.add_argument("--tag")
    vendor = TrackedDict({"runconfig": {"max_steps": 3}})
    _add_extra_args(vendor, parser.parse_args([]), [parser])
    assert vendor == {"runconfig": {"max_steps": 3}}
    _add_extra_args(vendor, parser.parse_args(["--run_name", "a"]), [parser])
    assert vendor == {"runconfig": {"max_steps": 3, "run_name": "a"}}
    zoo = load_params(str(TINY), _mnist_fns()[3]())
    _add_extra_args(zoo, parser.parse_args([]), [parser])  # nothing given: the zoo's frozen params are fine
    with pytest.raises(UserError) as error:
        _add_extra_args(zoo, parser.parse_args(["--tag", "t"]), [parser])
    assert str(error.value) == ("extra_args_parser_fn: a folder's own flags go into params['runconfig'], which only "
                                "the vendor's form (set_defaults(params)) leaves writable; make them params keys "
                                "instead")

"""Data-parallel training on the TF Estimator (common/tf/estimator/distribute.py): N replicas
with batch B train as one device with batch N x B; refusals are one line.

The whole runs go to a subprocess: the logical CPUs a MirroredStrategy mirrors over can be
set up only before TensorFlow's runtime starts, which this test process has done.
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# runs tf/<folder>'s main(argv) for each argv, in one process (one TensorFlow start)
RUNS = """
import json, sys
from common.folder import load_run_module
module = load_run_module(sys.argv[1])
for argv in json.loads(sys.argv[2]):
    module.main(argv)
"""


def _run_in_new_process(folder: str, *argvs: list[str], cwd: str = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    return subprocess.run([sys.executable, "-c", RUNS, os.path.join(ROOT, "tf", folder), json.dumps(argvs)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _losses(model_dir) -> list[float]:
    return [value for _, value in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def _weights(model_dir, step: int) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(model_dir, f"model.ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("_") and "iterator" not in name.lower()}


def assert_trained_alike(a: dict[str, np.ndarray], b: dict[str, np.ndarray], steps: int = 4, lr: float = 0.005):
    """Two runs' weights after ``steps`` Adam steps of the tiny config (learning rate ``lr``) that differ only in
    how the batch's gradient was summed: all but a few elements within 1e-5, and every one within a thousandth
    of an Adam step per step. Adam divides each gradient by its own running size, so where a gradient is the
    small difference of large per-example terms, the sum order's fp32 noise moves its step by more than 1e-5 of
    the weight (seen: 2 of fc0's 25,088 by 2.2e-6, on an AVX2 machine); a real difference between the runs
    moves many elements, or by a whole step."""
    assert set(a) == set(b)  # the one-device names: the checkpoint restores anywhere
    close = sum(int(np.isclose(a[name], b[name], rtol=1e-5, atol=1e-6).sum()) for name in a)
    total = sum(a[name].size for name in a)
    assert total - close <= total // 1000, f"{total - close} of {total} elements differ by more than 1e-5"
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-3 * lr * steps, err_msg=name)


def test_two_replicas_of_batch_b_train_as_one_device_with_batch_2b(tiny_args, tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    result = _run_in_new_process(
        "mnist",
        tiny_args("--mode", "train", "train_input.batch_size=16", "runconfig.train_distribute=mirrored",
                  "runconfig.num_devices=2", model_dir=two),
        tiny_args("--mode", "train", "train_input.batch_size=32", model_dir=one))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training data parallel on 2 replicas" in result.stderr and "16 examples per replica, 32 per step" \
        in result.stderr
    assert len(_losses(two)) == 4
    np.testing.assert_allclose(_losses(two), _losses(one), rtol=1e-5)  # fp32, Adam
    assert_trained_alike(_weights(two, 4), _weights(one, 4))


def test_resnet_with_batch_norm_trains_on_two_replicas_close_to_one_device(tmp_path):
    """Batch norm normalises each replica's 16 examples by their own statistics (not the 32 of
    the global batch: no cross-replica batch norm, as tf.estimator's MirroredStrategy and DDP
    without SyncBatchNorm), so even the first step's loss, from the same weights, differs a
    little; the curves then drift apart within a few percent over the 8 tiny steps (measured:
    0.5% at step 1, at most 3.6%). The moving statistics follow one replica's batch, not the
    mean over the replicas."""
    tiny = os.path.join(ROOT, "tf", "resnet", "configs", "params_tiny.yaml")
    two, one = tmp_path / "two", tmp_path / "one"
    result = _run_in_new_process(
        "resnet",
        ["--params", tiny, "--model_dir", str(two), "train_input.batch_size=16", "runconfig.train_distribute=mirrored",
         "runconfig.num_devices=2"],
        ["--params", tiny, "--model_dir", str(one), "train_input.batch_size=32"], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = _losses(two), _losses(one)
    assert len(a) == len(b) == 8 and all(np.isfinite(a))
    np.testing.assert_allclose(a[0], b[0], rtol=0.01)  # the same weights: batch norm's statistics alone differ
    np.testing.assert_allclose(a, b, rtol=0.05)
    assert a[-1] < a[0] and b[-1] < b[0]
    assert set(_weights(two, 8)) == set(_weights(one, 8))


@pytest.mark.parametrize("overrides, message", [
    (["runconfig.train_distribute=ring"], "runconfig.train_distribute"),
    (["runconfig.num_devices=2"], "runconfig.num_devices=2 needs runconfig.train_distribute: mirrored"),
    (["runconfig.train_distribute=mirrored"], "on the CPU needs runconfig.num_devices"),
    (["runconfig.train_distribute=mirrored", "runconfig.num_devices=2", "--device=emulator"],
     "the emulated device is one system per run"),
    (["runconfig.train_distribute=mirrored", "runconfig.num_devices=2", "--compile_only"],
     "the device is one system per run and compiles one graph"),
    (["runconfig.train_distribute=multi_worker_mirrored"], "multi_worker_mirrored needs TF_CONFIG"),
    (["runconfig.train_distribute=multi_worker_mirrored", "runconfig.num_devices=2"],
     "runconfig.num_devices=2 is for train_distribute: mirrored"),
])
def test_a_strategy_that_cannot_run_is_one_line(tf_mnist, tiny_args, tmp_path, capsys, monkeypatch, overrides,
                                                message):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(tiny_args("--mode", "train", *overrides))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1], err[-3:]
    assert not (tmp_path / "model").exists()


def test_a_bad_tf_config_is_one_line(tf_mnist, tiny_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}')
    with pytest.raises(SystemExit):
        tf_mnist.main(tiny_args("--mode", "train", "runconfig.train_distribute=multi_worker_mirrored"))
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: TF_CONFIG=") and "with k < the number of workers" in last


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _workers(tiny_args, model_dir, *overrides, **env_extra) -> list[subprocess.Popen]:
    """2 worker processes of a multi_worker_mirrored run of tf/mnist on this machine (gRPC on localhost)."""
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    runs = []
    for index in range(2):
        env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", **env_extra,
               "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}
        argv = tiny_args("--mode", "train", "train_input.batch_size=16",
                         "runconfig.train_distribute=multi_worker_mirrored", *overrides, model_dir=model_dir)
        runs.append(subprocess.Popen([sys.executable, "-c", RUNS, os.path.join(ROOT, "tf", "mnist"), json.dumps([argv])],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return runs


def test_a_killed_worker_stops_the_other_with_one_line_and_the_run_resumes(tiny_args, tmp_path):
    model_dir = tmp_path / "workers"
    runs = _workers(tiny_args, model_dir, "runconfig.max_steps=100000", "runconfig.log_steps=1000",
                    "runconfig.checkpoint_steps=100", ZOO_DIST_TIMEOUT_S="30")
    deadline = time.time() + 300
    while not list(model_dir.glob("model.ckpt-*.index")) and time.time() < deadline and runs[0].poll() is None:
        time.sleep(0.5)
    assert list(model_dir.glob("model.ckpt-*.index")), runs[0].communicate(timeout=60)[1][-3000:]
    runs[1].kill()
    started = time.time()
    _, err = runs[0].communicate(timeout=180)
    runs[1].communicate()
    assert time.time() - started < 120  # no hang
    assert runs[0].returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: worker 0: a step failed (") and "another worker stopped" in last, err[-2000:]
    # the same command resumes from the newest checkpoint
    saved = max(int(p.name.split("-")[1].split(".")[0]) for p in model_dir.glob("model.ckpt-*.index"))
    again = _workers(tiny_args, model_dir, "runconfig.steps=2", "runconfig.log_steps=1",
                     "runconfig.checkpoint_steps=100")
    for run, (_, err) in zip(again, [run.communicate(timeout=600) for run in again]):
        assert run.returncode == 0, err[-3000:]
    assert (model_dir / f"model.ckpt-{saved + 2}.index").exists()
    assert [step for step, _ in read_scalars(str(model_dir / "train"))["loss"]][-2:] == [saved + 1, saved + 2]


def test_two_worker_processes_train_as_one_device_with_twice_the_batch(tiny_args, tmp_path):
    """MultiWorkerMirroredStrategy across 2 processes on this machine (gRPC on localhost), TF_CONFIG as
    tf.estimator's workers had it; worker 0 writes model_dir, worker 1 a folder of its own."""
    runs = _workers(tiny_args, tmp_path / "workers")
    one = _run_in_new_process("mnist", tiny_args("--mode", "train", "train_input.batch_size=32",
                                                 model_dir=tmp_path / "one"))
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-3000:]
    assert one.returncode == 0, one.stderr[-3000:]
    assert "training data parallel on 2 replicas" in outputs[0][1] and "worker 1 of a multi-worker run" in outputs[1][1]
    np.testing.assert_allclose(_losses(tmp_path / "workers"), _losses(tmp_path / "one"), rtol=1e-5)
    assert_trained_alike(_weights(tmp_path / "workers", 4), _weights(tmp_path / "one", 4))
    assert sorted(p.name for p in (tmp_path / "workers").glob("params_*.yaml")) == ["params_train.yaml"]


def test_the_strategy_pieces_pass_on_two_logical_cpus_in_a_process_of_their_own():
    """tests/tf/test_tf_distribute_graph.py sets up its two logical CPUs before TensorFlow starts."""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "ZOO_TEST_LOGICAL_CPUS": "2"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             os.path.join(ROOT, "tests", "tf", "test_tf_distribute_graph.py")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary

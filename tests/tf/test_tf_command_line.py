"""tf/mnist's run.py as a user runs it: a misspelt flag is refused before TensorFlow loads, and a
run's stderr holds the run's own lines, none of TensorFlow's start-up (oneDNN, absl, CUDA)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TF_MNIST = os.path.join(ROOT, "tf", "mnist")

# run.py as `python tf/mnist/run.py ...` runs it, reporting its exit status and whether TensorFlow was imported
RUN_AS_MAIN = ("import runpy, sys\n"
               "sys.argv = sys.argv[1:]\n"
               "try:\n"
               "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
               "except SystemExit as e:\n"
               "    print(e.code, 'tensorflow' in sys.modules)\n")


def test_a_misspelt_mode_is_refused_before_tensorflow_loads():
    done = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, os.path.join("tf", "mnist", "run.py"), "--mode", "trian"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout == "2 False\n", done.stderr
    assert done.stderr == ("tf/mnist/run.py: error: argument -m/--mode: invalid choice: 'trian' (choose from 'train', "
                           "'eval', 'eval_all', 'train_and_eval', 'predict') (see --help)\n")


def test_a_tiny_runs_stderr_holds_no_tensorflow_start_up_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's shell has it
    done = subprocess.run([sys.executable, os.path.join(TF_MNIST, "run.py"), "--params",
                           os.path.join(TF_MNIST, "configs", "params_tiny.yaml"), "--model_dir", str(tmp_path / "m"),
                           "runconfig.max_steps=1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| Train Device=cpu Step=1 Loss=" in done.stderr
    noise = [line for line in done.stderr.splitlines()
             if re.match(r"[IWEF]\d{4} ", line) or re.search(r"oneDNN|absl|cudart|cuda|cpu_feature_guard|rebuild "
                                                              r"TensorFlow", line)]
    assert noise == []

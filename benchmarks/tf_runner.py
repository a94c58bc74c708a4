"""The TF runner's training step against a minimal hand-written Session loop, side by side.

    python benchmarks/tf_runner.py [--steps 300] [--rounds 3]

Both loops drive the same tf/mnist graph (default params: 500/300 MLP, batch 256,
Adam) in the same session, over the same dataset, alternating round by round so that
both see the same machine load. The runner's loop is CerebrasEstimator's own (its
per-step fetches, NaN check, log lines and TensorBoard scalars every log_steps, one
checkpoint at the end of each round, timed apart and reported separately, since saving is
not the step); the hand loop is ``session.run(train_op)``.
Prints the per-step times, their ratio (target: at most 1.10), and the start-up time:
``import tensorflow`` and the graph build (input_fn + model_fn + session + init).
"""

import time

_t0 = time.perf_counter()
import tensorflow as tf  # noqa: E402  (timed: part of the start-up)

IMPORT_SECONDS = time.perf_counter() - _t0

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

from common.folder import import_beside  # noqa: E402
from common.params import load_params  # noqa: E402
from common.tf.estimator import CerebrasEstimator, ModeKeys, RunConfig  # noqa: E402
from common.tf.estimator.cs_estimator import GraphSession  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model, data, utils = import_beside(os.path.join(ROOT, "tf", "mnist", "run.py"), "model", "data", "utils")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps per round and loop")
    parser.add_argument("--rounds", type=int, default=24)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as model_dir:
        params = load_params(os.path.join(ROOT, "tf", "mnist", "configs", "params.yaml"), utils.default_params(),
                             [f"runconfig.model_dir={model_dir}", "runconfig.log_steps=100"])
        estimator = CerebrasEstimator(model.model_fn, config=RunConfig.from_params(params), params=params)
        t = time.perf_counter()
        run = GraphSession(estimator.build(data.train_input_fn, ModeKeys.TRAIN), estimator.config)
        build_seconds = time.perf_counter() - t
        session, train_op = run.session, run.built.train_op

        save_seconds = []
        save = estimator._save

        def timed_save(*save_args):
            t = time.perf_counter()
            path = save(*save_args)
            save_seconds.append(time.perf_counter() - t)
            return path

        estimator._save = timed_save

        for _ in range(20):  # warm up: first runs allocate and tune the input pipeline
            session.run(train_op)
        hand, runner = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            for _ in range(args.steps):
                session.run(train_op)
            hand.append((time.perf_counter() - t) / args.steps)

            step = run.step()
            t = time.perf_counter()
            estimator.train_loop(run, step, step + args.steps, ())
            runner.append((time.perf_counter() - t - save_seconds[-1]) / args.steps)
        run.close()

    # On a shared machine other load comes and goes: each round's ratio compares two loops
    # run back to back, and the median of those ratios is the figure; the best round of each
    # loop (other load only ever slows a round down) is a second view.
    ratios = sorted(r / h for h, r in zip(hand, runner))
    print(f"tf/mnist training step, batch {params['train_input']['batch_size']}, "
          f"{args.rounds} rounds x {args.steps} steps, the two loops alternating")
    print(f"  hand-written Session loop  {min(hand) * 1e3:8.3f} ms/step (best round), "
          f"{statistics.median(hand) * 1e3:.3f} (median)")
    print(f"  CerebrasEstimator loop     {min(runner) * 1e3:8.3f} ms/step (best round), "
          f"{statistics.median(runner) * 1e3:.3f} (median)")
    print(f"  ratio runner / hand        {statistics.median(ratios):8.3f}   median of the per-round ratios "
          f"(quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f}; best rounds "
          f"{min(runner) / min(hand):.3f}); target <= 1.10")
    print(f"  checkpoint save (apart)    {statistics.median(save_seconds) * 1e3:8.1f} ms each, once per round")
    print(f"start-up: import tensorflow {IMPORT_SECONDS:.2f} s, graph build + session {build_seconds:.2f} s")


if __name__ == "__main__":
    main()

"""The shared PyTorch runner, in the order a run uses it.

    run.py          run(model_fn, train_data_fn, eval_data_fn, default_params_fn): the command line,
                    params, and the step backend --device picks
    runner.py       Runner: the five modes' loops, once, around a step backend (FrameworkSteps:
                    torch on the CPU or a GPU)
    base_model.py   PyTorchBaseModel: a model's loss, and its optimizer, schedule, clipping and
                    mixed precision built from params
    optim.py        optimizers and learning-rate schedules from params["optimizer"]
    metrics.py      eval metrics over the whole eval set (numpy: the same on CPU, GPU and emulator)
    data_order.py   batches in an order fixed by (seed, epoch), resumable mid-epoch
    checkpoint.py   model_dir/checkpoint_{step}.mdl, written atomically, loaded safely
    device_run.py   --validate_only, --compile_only, and EmulatorSteps for --device emulator
                    (imported only for them; the device through device/api.py alone)

The vendor's API, for folders written for the vendor's zoo (``zoo port migrate``), answered as
the vendor's zoo answered without its system: the package binds ``cbtorch``, ``modes``, ``amp``,
``name_scope`` and ``AP_DISABLED`` (vendor_api.py); ``cb_model.py`` (the streaming questions),
``utils.py`` (get_params, BufferedShuffleDataset, get_input_dtype) and ``metrics.py`` (the
vendor's metric classes) hold the rest.

TensorFlow is never imported here. Importing the package sets OpenMP's wait policy for torch
(common/threads.py), which only a setting made before torch loads can change.
"""

from common.threads import wait_passively

# OpenMP reads its wait policy once, when torch loads it: here, before any module of the runner imports torch
wait_passively()

# the vendor's names (no torch in them: the wait policy above stays first)
from common.pytorch.vendor_api import AP_DISABLED, amp, cbtorch, modes, name_scope  # noqa: E402

__all__ = ["AP_DISABLED", "amp", "cbtorch", "modes", "name_scope"]

"""The numpy runtime of the device emulator, the last stage of the pipeline.

    memory.py      keeps freed memory in the process, so that each step's temporaries reuse it
    optimizers.py  update rules, gradient clipping and loss scaling, in place on fp32 weights
    program.py     Program: runs an IR graph (forward, gradients, train and eval steps) with
                   the kernels and gradients of the op records (device/ops/)

Rounding to the 16-bit formats is device/dtypes.py's.
"""

from device.runtime.program import Program

__all__ = ["Program"]

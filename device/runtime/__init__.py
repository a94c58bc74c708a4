"""The numpy runtime of the device emulator, the last stage of the pipeline.

    kernels.py     forward kernel and gradient of every IR op (the gradient table)
    precision.py   the 16-bit formats (float16, bfloat16, cb16) on float32 storage
    optimizers.py  update rules, gradient clipping and loss scaling, in place on fp32 weights
    program.py     Program: runs an IR graph (forward, gradients, train and eval steps)
"""

from device.runtime.program import Program

__all__ = ["Program"]

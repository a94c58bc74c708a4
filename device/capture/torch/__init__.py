"""PyTorch frontend: one training step of an ``nn.Module``, lowered to the device IR.

Pipeline:

1. ``torch.export`` traces a small wrapper module whose ``forward(*batch)`` calls the
   user's ``step_fn(batch)`` (non-strict, module in train mode, fake tensors: the module's
   weights, buffers and RNG are not touched).
2. ``run_decompositions`` reaches the core aten op set, except for the ops in
   ``_KEPT_WHOLE`` that lower to fewer, clearer IR nodes when kept whole (``linear`` is
   transpose + matmul + add instead of views around ``addmm``; ``log_softmax`` followed
   by ``nll_loss_forward``, and ``cross_entropy_loss``, are the IR's ``cross_entropy_loss``).
3. Each FX node is lowered by the table ``_LOWERINGS`` (aten op -> handler). A node whose
   inputs are all known at capture time (``arange``, ``full``, a causal mask built from
   a buffer that is never written) is evaluated here with torch and becomes a constant.
   An aten op without a handler, or a variant its handler declines (a transposed
   convolution with groups), becomes an IR node whose ``op`` is the aten name with its
   output values taken from the FX metadata, so that validation reports every unsupported
   op at once.
4. Nodes that reach neither the loss nor an output are dropped, and so are the params,
   state and constants they alone used.

Naming: parameters and state are IR values named by their ``module.state_dict()`` key
(``graph.params[key] == key``); batch inputs are ``batch_0``, ``batch_1``, ... (a tuple or list
batch) or the batch's keys (a dict batch: ``input_ids``, ...; ``batch_tensors``); every other
value is named after the FX node it came from. A tied parameter (one tensor under several
keys, GPT-2's ``head.weight = tok_emb.weight``) is one value, named by its first key as
``named_parameters()`` lists it; a name the module lacks is a validation finding.

Parameters with ``requires_grad`` become ``graph.params``; buffers the step writes
(batch norm's running statistics) and frozen parameters become ``graph.state``; buffers
the step only reads (a registered causal mask) become constants with their value at
capture time.

Known differences from torch, by design of the IR:
- ``scaled_dot_product_attention`` is lowered as softmax(q k^T * scale + mask) v; a row
  fully masked by a boolean mask known at capture time gives NaN here where torch gives
  zeros (fully masked by a boolean mask from the batch: zeros, as torch's safe softmax).

The frontend, one file per concern, in pipeline order:

    export.py       capture: torch.export of the step, decompositions, the ops kept whole, CTC as one op
    step.py         the batch's tensors by input name, the wrapper module export traces, the host's checks
    source.py       the user's line: frames, the call written there, tracing failures in one line
    lowering.py     _Lowering: the walk over the FX graph, the shared lowerings, argument helpers
    table.py        aten op -> handler, one literal (the table a new op is added to)
    elementwise.py  activations.py  linalg.py  layout.py  reductions.py  normalization.py
    vision.py  language.py  losses.py  recurrent.py
                    the handlers, by the families of device/ops/
    rewrites.py     after the lowering: dead nodes pruned, a GELU written out with erf fused
    optimizer.py    a torch.optim optimizer -> OptimizerSpec
    variables.py    weights and state between the module and the emulator (state_dict keys)
"""

from __future__ import annotations

from device.capture.torch.export import capture
from device.capture.torch.optimizer import SUPPORTED_OPTIMIZERS, optimizer_spec
from device.capture.torch.step import batch_tensors
from device.capture.torch.variables import load_state, load_weights, state_of, weights_of

__all__ = ["SUPPORTED_OPTIMIZERS", "batch_tensors", "capture", "load_state", "load_weights", "optimizer_spec",
           "state_of", "weights_of"]

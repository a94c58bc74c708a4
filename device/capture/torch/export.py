"""The capture's entry point: ``torch.export`` of the step, decomposed, lowered and pruned.

``capture`` traces the step (step.py), decomposes it to core aten ops but for the ops in
``_KEPT_WHOLE``, lowers each FX node by the table (table.py, lowering.py), rewrites the
graph (rewrites.py), checks the weight names (variables.py) and reads the optimizer
(optimizer.py). F.ctc_loss is one op of the capture's own while tracing.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch
import torch.fx

from device.capture.torch.lowering import _Lowering
from device.capture.torch.optimizer import optimizer_spec
from device.capture.torch.rewrites import _fuse_erf_gelu, _prune
from device.capture.torch.source import _export_failure
from device.capture.torch.step import _NeedsTheBatch, _Step, batch_tensors
from device.capture.torch.table import _LOWERINGS
from device.capture.torch.variables import _check_names
from device.ir import Graph
from device.optimizer import DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE
from zoo_base.errors import UserError


_aten = torch.ops.aten


# Ops that run_decompositions would break up, kept whole because each has a direct IR
# lowering (the handlers of table.py).
_KEPT_WHOLE = (
    _aten.linear.default,
    _aten.matmul.default,
    _aten.dropout.default,
    _aten.detach.default,  # a stop-gradient: decomposed, it is an alias, which gradients flow through
    _aten.nll_loss_forward.default,
    _aten.scaled_dot_product_attention.default,
    _aten.softplus.default,
    # vision and losses: a loss is one fused record, so findings name the user's loss
    _aten.binary_cross_entropy_with_logits.default,
    _aten.cross_entropy_loss.default,
    _aten.nll_loss2d_forward.default,
    # the pad record's reflect and edge modes (torch decomposes them into indexing)
    _aten.reflection_pad1d.default, _aten.reflection_pad2d.default, _aten.reflection_pad3d.default,
    _aten.replication_pad1d.default, _aten.replication_pad2d.default, _aten.replication_pad3d.default,
    # recurrent layers, unrolled by recurrent.py (torch's decomposition drops their dropout)
    _aten.lstm.input, _aten.gru.input, _aten.rnn_tanh.input, _aten.rnn_relu.input,
)


def capture(step_fn: Callable, module: torch.nn.Module, batch, *, optimizer: torch.optim.Optimizer | None = None,
            precision: str = "float32", max_gradient_norm=None, max_gradient_value=None, loss_scale=None,
            initial_loss_scale=DEFAULT_INITIAL_LOSS_SCALE, steps_per_increase=DEFAULT_STEPS_PER_INCREASE) -> Graph:
    """Capture ``step_fn(batch)`` (the forward pass and loss of ``module``) as a device IR graph.

    ``step_fn(batch)`` returns the scalar loss, or ``(loss, outputs)`` with ``outputs`` a dict
    of tensors (e.g. ``{"logits": ...}``) that become ``graph.outputs``. ``batch`` is a tuple,
    list or dict of tensors (a value may itself be a tuple, list or dict of tensors), passed to
    ``step_fn`` as given; its tensors become ``graph.inputs`` in the order and under the names
    ``batch_tensors`` gives them.

    What the device cannot run (an unsupported op, a float64 model, inputs whose batch
    sizes differ, a non-scalar loss, an unknown precision) comes through to the graph as it
    is, for ``device.passes.validate`` to report all at once; only a step that cannot be
    traced at all raises ``UserError``.
    """
    inputs = batch_tensors(batch)
    tensors = tuple(inputs.values())
    wrapper = _Step(step_fn, module, batch, list(inputs))
    modes = {m: m.training for m in module.modules()}
    module.train()
    try:
        try:
            exported = _export(wrapper, tensors)
        except _NeedsTheBatch:  # an if or assert on the data: its branches are the first batch's
            wrapper.checks.run_eagerly(wrapper, tensors)
            exported = _export(wrapper, tensors)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any tracing failure is the user's step: say so in one line
        raise UserError(_export_failure(e)) from e
    finally:
        for m, training in modes.items():
            m.train(training)
    table = torch.export.default_decompositions()
    for op in _KEPT_WHOLE:
        table.pop(op, None)
    exported = exported.run_decompositions(table)

    graph = Graph(frontend="torch", precision=precision)
    # the output dict's keys, in the order its tensors were flattened into the graph outputs
    output_keys = list(exported.call_spec.out_spec.child(1).context)
    _Lowering(graph, exported, wrapper, _LOWERINGS).run(output_keys)
    _prune(graph)
    _fuse_erf_gelu(graph)
    _check_names(graph, module)
    if optimizer is not None:
        graph.optimizer = optimizer_spec(
            optimizer, module, max_gradient_norm=max_gradient_norm, max_gradient_value=max_gradient_value,
            loss_scale=loss_scale, initial_loss_scale=initial_loss_scale, steps_per_increase=steps_per_increase)
    return graph


@contextlib.contextmanager
def _every_frame():
    """Keep every frame from the traced ``forward`` inwards in node stack traces.

    Export keeps only frames named ``forward`` (and registered anchors), so an op in a helper
    function the user's forward calls (a loss written as a function) would be placed at the
    forward's line; with every frame kept, ``_source_loc`` finds the helper's own line.
    """
    tracer = torch.fx.proxy.TracerBase
    original = getattr(tracer, "_filter_traceback_frames", None)
    if original is None:  # a torch without the hook: export's own frames
        yield
        return

    def every_frame(self, summary):
        forward_only = self._record_forward_stack_traces_only
        self._record_forward_stack_traces_only = False
        try:
            return original(self, summary)
        finally:
            self._record_forward_stack_traces_only = forward_only

    tracer._filter_traceback_frames = every_frame
    try:
        yield
    finally:
        tracer._filter_traceback_frames = original


def _export(wrapper: _Step, batch) -> torch.export.ExportedProgram:
    with _every_frame(), wrapper.checks.tracing(), _ctc_loss_whole(), warnings.catch_warnings():
        # nn.LSTM / GRU / RNN re-assign their list of weights on every call: export warns, but the
        # capture reads those weights by their parameter names
        warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
        return torch.export.export(wrapper, tuple(batch), strict=False)


# ---- audio: CTC kept whole ----

_CTC_REDUCTIONS = ("none", "mean", "sum")


_ctc_loss_function = torch.nn.functional.ctc_loss  # torch's, which the capture's own op runs eagerly


@torch.library.custom_op("zoo_device::ctc_loss", mutates_args=())
def _ctc_loss_op(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                 target_lengths: torch.Tensor, blank: int, reduction: str, zero_infinity: bool) -> torch.Tensor:
    """F.ctc_loss as one op while the capture traces: torch's own has no fake kernel (its alignment
    table's size is read from the target lengths), so export cannot trace it."""
    return _ctc_loss_function(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


@_ctc_loss_op.register_fake
def _ctc_loss_shape(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return log_probs.new_empty((log_probs.shape[1],) if reduction == "none" else ())


@contextlib.contextmanager
def _ctc_loss_whole():
    """F.ctc_loss (which nn.CTCLoss calls) is the capture's one op while tracing; another form (unbatched
    log_probs) is torch's, refused as before."""
    def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
        if log_probs.dim() != 3 or reduction not in _CTC_REDUCTIONS:
            return _ctc_loss_function(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                                      zero_infinity)
        lengths = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.long)
                   for t in (input_lengths, target_lengths)]
        return _ctc_loss_op(log_probs, targets, *lengths, int(blank), reduction, bool(zero_infinity))

    torch.nn.functional.ctc_loss = ctc_loss
    try:
        yield
    finally:
        torch.nn.functional.ctc_loss = _ctc_loss_function

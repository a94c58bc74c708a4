"""The aten op -> handler table: every aten op the PyTorch frontend lowers, in one literal.

A new op is one entry here and its handler in the module of its family (the families of
device/ops/): elementwise.py, activations.py, linalg.py, layout.py, reductions.py,
normalization.py, vision.py, language.py, losses.py, recurrent.py. An aten op that is not
a key here becomes an unsupported node that validation reports at the user's line, with the
suggestion device/capture/refused_torch.py keeps for it (OPS; a form a handler declines: FORMS).
"""

from __future__ import annotations

from typing import Callable

from device.capture.torch.activations import (_bernoulli, _clamp, _dropout, _elu, _gelu, _hardtanh, _leaky_relu,
                                              _softplus)
from device.capture.torch.elementwise import (_comparison, _div, _elementwise, _eq, _floor, _floor_divide, _fmod,
                                              _detach, _identity, _logical_op, _minimum, _pow, _reciprocal, _remainder,
                                              _to_copy, _unary, _where, _xor)
from device.capture.torch.language import _embedding, _gather, _index, _index_select, _sdpa
from device.capture.torch.layout import (_as_strided, _cat, _constant_pad, _copy, _expand, _flip, _index_put,
                                         _mode_pad, _permute, _repeat, _select, _select_scatter, _slice,
                                         _slice_scatter, _split, _stack, _t, _transpose, _unbind, _view)
from device.capture.torch.linalg import _addmm, _einsum, _linear, _matmul
from device.capture.torch.losses import _bce_with_logits, _cross_entropy_loss, _ctc_loss, _nll_loss
from device.capture.torch.normalization import _batch_norm, _group_norm, _layer_norm, _softmax
from device.capture.torch.recurrent import _recurrent
from device.capture.torch.reductions import _all_or_any, _argmax, _cumsum, _max_dim, _reduction, _var_mean, _var_only
from device.capture.torch.vision import _adaptive_avg_pool, _avg_pool, _convolution, _max_pool, _upsample

_LOWERINGS: dict[str, Callable] = {
    # elementwise arithmetic (scalar operands become constants of the result dtype)
    "aten.add.Tensor": _elementwise("add"),
    "aten.add.Scalar": _elementwise("add"),
    "aten.sub.Tensor": _elementwise("sub"),
    "aten.sub.Scalar": _elementwise("sub"),
    "aten.rsub.Scalar": _elementwise("sub", swap=True),
    "aten.rsub.Tensor": _elementwise("sub", swap=True),
    "aten.mul.Tensor": _elementwise("mul"),
    "aten.mul.Scalar": _elementwise("mul"),
    "aten.div.Tensor": _elementwise("div"),
    "aten.div.Scalar": _elementwise("div"),
    "aten.div.Tensor_mode": _div,
    "aten.maximum.default": _elementwise("maximum"),
    "aten.minimum.default": _minimum,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.reciprocal.default": _reciprocal,
    "aten.neg.default": _unary("neg"),
    "aten.exp.default": _unary("exp"),
    "aten.erf.default": _unary("erf"),
    "aten.log.default": _unary("log"),
    "aten.sqrt.default": _unary("sqrt"),
    "aten.rsqrt.default": _unary("rsqrt"),
    "aten.abs.default": _unary("abs"),
    "aten.log1p.default": _unary("log1p"),
    "aten.eq.Tensor": _eq,
    "aten.eq.Scalar": _eq,
    "aten.where.self": _where,
    # identity and casts
    "aten.clone.default": _identity,
    "aten.alias.default": _identity,
    "aten.detach.default": _detach,
    "aten.lift_fresh_copy.default": _identity,
    "aten.contiguous.default": _identity,
    "aten._to_copy.default": _to_copy,
    "aten.to.dtype": _to_copy,
    # comparisons and logic: masks, position buckets
    "aten.ne.Tensor": _comparison("not_equal"),
    "aten.ne.Scalar": _comparison("not_equal"),
    "aten.lt.Tensor": _comparison("less"),
    "aten.lt.Scalar": _comparison("less"),
    "aten.le.Tensor": _comparison("less_equal"),
    "aten.le.Scalar": _comparison("less_equal"),
    "aten.gt.Tensor": _comparison("greater"),
    "aten.gt.Scalar": _comparison("greater"),
    "aten.ge.Tensor": _comparison("greater_equal"),
    "aten.ge.Scalar": _comparison("greater_equal"),
    "aten.logical_not.default": _logical_op("logical_not"),
    "aten.logical_and.default": _logical_op("logical_and"),
    "aten.logical_or.default": _logical_op("logical_or"),
    "aten.bitwise_not.default": _logical_op("logical_not", bitwise=True),  # ~mask
    "aten.bitwise_and.Tensor": _logical_op("logical_and", bitwise=True),
    "aten.bitwise_or.Tensor": _logical_op("logical_or", bitwise=True),
    "aten.logical_xor.default": _xor(bitwise=False),
    "aten.bitwise_xor.Tensor": _xor(bitwise=True),  # mask ^ mask
    # integer arithmetic (exact on int32 / int64) and floor
    "aten.floor.default": _floor,
    "aten.floor_divide.default": _floor_divide,
    "aten.remainder.Scalar": _remainder,
    "aten.remainder.Tensor": _remainder,
    "aten.fmod.Tensor": _fmod,
    "aten.fmod.Scalar": _fmod,
    # activations and dropout
    "aten.relu.default": _unary("relu"),
    "aten.tanh.default": _unary("tanh"),
    "aten.sigmoid.default": _unary("sigmoid"),
    "aten.elu.default": _elu,
    "aten.gelu.default": _gelu,
    "aten.softplus.default": _softplus,
    "aten.leaky_relu.default": _leaky_relu,
    "aten.clamp.default": _clamp,
    "aten.clamp_min.default": _clamp,
    "aten.clamp_max.default": _clamp,
    "aten.clamp.Tensor": _clamp,
    "aten.clamp_min.Tensor": _clamp,
    "aten.clamp_max.Tensor": _clamp,
    "aten.hardtanh.default": _hardtanh,
    "aten.dropout.default": _dropout,
    "aten.native_dropout.default": _dropout,
    "aten.bernoulli.p": _bernoulli,
    # linear algebra
    "aten.linear.default": _linear,
    "aten.matmul.default": _matmul,
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.addmm.default": _addmm,
    "aten.baddbmm.default": _addmm,
    "aten.einsum.default": _einsum,
    # layout: views, transposes, slices, concatenation, tiling, pads
    "aten.view.default": _view,
    "aten.as_strided.default": _as_strided,
    "aten._unsafe_view.default": _view,
    "aten.reshape.default": _view,
    "aten.squeeze.default": _view,
    "aten.squeeze.dim": _view,
    "aten.squeeze.dims": _view,
    "aten.unsqueeze.default": _view,
    "aten.flatten.using_ints": _view,
    "aten.unflatten.int": _view,
    "aten.expand.default": _expand,
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose,
    "aten.t.default": _t,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.split.Tensor": _split,
    "aten.split_with_sizes.default": _split,
    "aten.unbind.int": _unbind,
    "aten.cat.default": _cat,
    "aten.stack.default": _stack,
    "aten.repeat.default": _repeat,
    "aten.flip.default": _flip,
    "aten.constant_pad_nd.default": _constant_pad,
    "aten.reflection_pad1d.default": _mode_pad("reflect"),
    "aten.reflection_pad2d.default": _mode_pad("reflect"),
    "aten.reflection_pad3d.default": _mode_pad("reflect"),
    "aten.replication_pad1d.default": _mode_pad("edge"),
    "aten.replication_pad2d.default": _mode_pad("edge"),
    "aten.replication_pad3d.default": _mode_pad("edge"),
    # slice and element assignment (``shifted[:, 1:] = ids[:, :-1]``: BART's and T5's shifted labels)
    "aten.copy.default": _copy,
    "aten.slice_scatter.default": _slice_scatter,
    "aten.select_scatter.default": _select_scatter,
    "aten.index_put.default": _index_put,
    # reductions (any and all for the host's checks)
    "aten.sum.default": _reduction("reduce_sum"),
    "aten.sum.dim_IntList": _reduction("reduce_sum"),
    "aten.mean.default": _reduction("reduce_mean"),
    "aten.mean.dim": _reduction("reduce_mean"),
    "aten.amax.default": _reduction("reduce_max"),
    "aten.max.default": _reduction("reduce_max"),
    "aten.max.dim": _max_dim,
    "aten.argmax.default": _argmax,
    "aten.var.correction": _var_only,
    "aten.var_mean.correction": _var_mean,
    "aten.cumsum.default": _cumsum,
    "aten.all.default": _all_or_any("all"),
    "aten.all.dim": _all_or_any("all"),
    "aten.all.dims": _all_or_any("all"),
    "aten.any.default": _all_or_any("any"),
    "aten.any.dim": _all_or_any("any"),
    "aten.any.dims": _all_or_any("any"),
    # softmax and normalisation
    "aten._softmax.default": _softmax("softmax"),
    "aten.softmax.int": _softmax("softmax"),
    "aten._log_softmax.default": _softmax("log_softmax"),
    "aten.log_softmax.int": _softmax("log_softmax"),
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_functional.default": _batch_norm,
    "aten.native_group_norm.default": _group_norm,
    # vision (a 1-d convolution is aten.convolution too)
    "aten.convolution.default": _convolution,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.upsample_nearest2d.vec": _upsample("nearest"),
    "aten.upsample_nearest2d.default": _upsample("nearest"),
    "aten.upsample_bilinear2d.vec": _upsample("bilinear"),
    "aten.upsample_bilinear2d.default": _upsample("bilinear"),
    # language and attention: embedding, attention, gathers
    "aten.embedding.default": _embedding,
    "aten.scaled_dot_product_attention.default": _sdpa,
    "aten.gather.default": _gather,
    "aten.index_select.default": _index_select,
    "aten.index.Tensor": _index,
    # losses
    "aten.nll_loss_forward.default": _nll_loss,
    "aten.nll_loss2d_forward.default": _nll_loss,
    "aten.cross_entropy_loss.default": _cross_entropy_loss,
    "aten.binary_cross_entropy_with_logits.default": _bce_with_logits,
    "zoo_device.ctc_loss.default": _ctc_loss,  # F.ctc_loss, the capture's own op while tracing (export.py)
    # recurrent layers (nn.LSTM, nn.GRU, nn.RNN), unrolled (recurrent.py)
    "aten.lstm.input": _recurrent("lstm"),
    "aten.gru.input": _recurrent("gru"),
    "aten.rnn_tanh.input": _recurrent("rnn_tanh"),
    "aten.rnn_relu.input": _recurrent("rnn_relu"),
}

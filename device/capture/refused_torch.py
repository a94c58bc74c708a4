"""The PyTorch frontend's refusals: the aten ops it cannot lower, and what to use instead.

Two tables, keyed by what is refused:

    OPS     aten op (an overload) with no handler in torch/table.py's _LOWERINGS -> suggestion
    FORMS   (aten op, form) -> suggestion, for an op a handler lowers in other forms and
            declines in this one (``self.decline(reason, form=...)``, torch/lowering.py)

The lowering attaches the suggestion to the unsupported node it records (the node's
``suggestion`` attribute), and validation reports it as it stands. The module imports no
framework, so that device.api (and the porting assistant through it) reads it without torch;
tests/device/test_refusal_tables.py keeps OPS out of _LOWERINGS and FORMS within it.
"""

from __future__ import annotations

_DYNAMIC_SHAPES = "data-dependent output shape; the device needs static shapes"
_FFT_ON_HOST = ("complex numbers are not device data: compute the FFT in the input pipeline (the PyTorch "
                "Dataset) and feed real float32 features: the magnitude, or the real and imaginary parts as "
                "channels")
_SORT = "sort in the input pipeline, or use argmax / max if only the extreme is needed"
_NO_SCAN = "a product along an axis: exp(cumsum(log(x))) for positive x, or compute it in the input pipeline"
_PRODUCT = "a product: exp(sum(log(x))) for positive x, or compute it in the input pipeline"
_INT_BITS = ("bit operations on integers: compute them in the input pipeline; on bool masks use "
             "logical and / or / not (&, |, ~ on bool tensors)")
_BRANCH = ("control flow on a tensor's value: the device runs one static graph; compute both branches and "
           "pick with torch.where(cond, a, b), or unroll a loop to a fixed count")
_SPARSE = "sparse tensors are not device data: use dense tensors (to_dense in the input pipeline)"
_SCATTER = "an indexed write: build the result from a one-hot mask (F.one_hot, mul, add, sum)"
_LINALG = "linear algebra beyond matmul: compute it in the input pipeline, or on the host (host_call)"
_SAMPLE = "sampling in the model: draw the samples in the input pipeline and feed them as a batch tensor"
_ON_HOST_READ = "keep the value a tensor; reading it on the host breaks the static graph"
_RESIZE = "nn.Upsample / F.interpolate with mode 'nearest' (whole-number factors) or 'bilinear', align_corners=False"
_MEDIAN = "compute the median on the host, or use mean"

# aten ops the frontend has no handler for -> what to use instead
OPS: dict[str, str] = {
    "aten.sort.default": _SORT,
    "aten.sort.stable": _SORT,
    "aten.argsort.default": _SORT,
    "aten.argsort.stable": _SORT,
    "aten.topk.default": "argmax for top-1, or compute top-k in an eval metric on the host (host_call)",
    "aten.nonzero.default": f"{_DYNAMIC_SHAPES}: multiply by a mask (x * (x != 0)) instead of selecting",
    "aten.index_put_.default": "in-place indexed write: build the result with a one-hot mask (mul, add)",
    "aten._unique2.default": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline",
    "aten.unique_dim.default": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline",
    "aten.median.default": _MEDIAN,
    "aten.median.dim": _MEDIAN,
    "aten.masked_select.default": f"{_DYNAMIC_SHAPES}: multiply by the mask instead of selecting",
    "aten.item.default": _ON_HOST_READ,
    "aten._local_scalar_dense.default": _ON_HOST_READ,
    "aten.scalar_tensor.default": "keep the value a tensor; a number read from the data breaks the static graph",
    "aten._fft_r2c.default": _FFT_ON_HOST,
    "aten._fft_c2c.default": _FFT_ON_HOST,
    "aten._fft_c2r.default": _FFT_ON_HOST,
    "aten.view_as_complex.default": _FFT_ON_HOST,
    # vision: the forms the device lacks, and the nearest form it has
    "aten._upsample_bilinear2d_aa.vec": f"antialias=False: {_RESIZE}",
    "aten._upsample_nearest_exact2d.vec": f"{_RESIZE} (nearest-exact equals nearest for whole-number factors)",
    "aten.upsample_bicubic2d.vec": f"{_RESIZE}, or resize in the input pipeline",
    "aten.adaptive_max_pool2d.default": ("F.max_pool2d with a kernel and stride that divide the input, or "
                                         "nn.AdaptiveAvgPool2d"),
    # the common ops the device lacks
    "aten.cumprod.default": _NO_SCAN,
    "aten.prod.dim_int": _PRODUCT,
    "aten.prod.default": _PRODUCT,
    **{f"aten.{op}.{overload}": _INT_BITS for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                                                       "bitwise_left_shift", "bitwise_right_shift",
                                                       "__lshift__", "__rshift__")
       for overload in ("Tensor", "Scalar", "default")
       if (op, overload) not in (("bitwise_not", "default"), ("bitwise_and", "Tensor"), ("bitwise_or", "Tensor"),
                                 ("bitwise_xor", "Tensor"))},  # those four run on bool masks (FORMS)
    "aten.scatter_reduce.two": _SCATTER,
    "aten.scatter.src": _SCATTER,
    "aten.scatter.value": _SCATTER,
    "aten.scatter_add.default": _SCATTER,
    "aten.index_add.default": _SCATTER,
    "aten.repeat_interleave.Tensor": f"{_DYNAMIC_SHAPES}: repeat by a Python int (x.repeat_interleave(2))",
    "aten.bincount.default": f"{_DYNAMIC_SHAPES}: F.one_hot(x, n).sum(0) with a fixed n",
    "aten.histc.default": "one_hot of the bucket ids, summed, with a fixed number of buckets",
    "aten.multinomial.default": _SAMPLE,
    "aten.bernoulli.default": _SAMPLE,
    "aten.normal.Tensor_Tensor": _SAMPLE,
    "aten.linalg_inv_ex.default": _LINALG,
    "aten._linalg_svd.default": _LINALG,
    "aten._linalg_det.default": _LINALG,
    "aten.linalg_solve_ex.default": _LINALG,
    "aten._to_sparse.default": _SPARSE,
    "aten._to_sparse.sparse_dim": _SPARSE,
    "aten._sparse_sum.dim": _SPARSE,
    "aten._to_dense.default": _SPARSE,
    # torch.cond and torch.while_loop, as torch.export names them
    "cond": _BRANCH,
    "while_loop": _BRANCH,
}

_CROP = "non-negative padding; crop by slicing"
_CONV = "1-d and 2-d convolutions (grouped and depthwise included), and 2-d transposed ones with groups=1"
_UPSAMPLES = ("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default", "aten.upsample_nearest2d.vec",
              "aten.upsample_nearest2d.default")
_PADS = ("aten.constant_pad_nd.default", "aten.reflection_pad1d.default", "aten.reflection_pad2d.default",
         "aten.reflection_pad3d.default", "aten.replication_pad1d.default", "aten.replication_pad2d.default",
         "aten.replication_pad3d.default")

# (aten op, the form a handler declines) -> what to use instead; the op runs in its other forms
FORMS: dict[tuple[str, str], str] = {
    ("aten.convolution.default", "3-d"): _CONV,
    ("aten.convolution.default", "transposed 1-d"): (
        "a 2-d transposed convolution over a height of 1 (nn.ConvTranspose2d with kernel (1, k)), or "
        "upsampling followed by a convolution"),
    ("aten.convolution.default", "transposed groups"): (
        "a transposed convolution with groups=1, or upsampling followed by a grouped convolution"),
    ("aten.convolution.default", "output_padding"): "output_padding below the stride",
    ("aten._adaptive_avg_pool2d.default", "rank"): "an (N, C, H, W) input",
    ("aten.adaptive_avg_pool2d.default", "rank"): "an (N, C, H, W) input",
    **{(op, form): _RESIZE for op in _UPSAMPLES for form in ("align_corners", "scale")},
    **{(op, "factor"): _RESIZE for op in _UPSAMPLES if "nearest" in op},
    **{(op, "crop"): _CROP for op in _PADS},
    ("aten.as_strided.default", "window"): (
        "reshape, permute and slicing for a view, Tensor.unfold for sliding windows (the device runs a strided "
        "view that keeps the elements in order)"),
    ("aten.binary_cross_entropy_with_logits.default", "pos_weight"): (
        "a pos_weight fixed when the step is captured: a constant tensor or a buffer, not computed from the batch"),
    **{("aten.cross_entropy_loss.default", form): (
        "class ids as targets, and class weights fixed when the step is captured; ignore_index and "
        "label_smoothing are supported") for form in ("weight", "probabilities")},
    ("aten.index_put.default", "accumulate"): _SCATTER,
    **{("aten.index_put.default", form): (
        "indexed write at positions from the data: build the result with a one-hot mask (mul, add); "
        "x[mask] = value with one value runs as it is") for form in ("positions", "mask")},
    **{(op, "integers"): _INT_BITS for op in ("aten.bitwise_not.default", "aten.bitwise_and.Tensor",
                                              "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor")},
    ("aten.bernoulli.p", "generator"): "torch.bernoulli without a generator: the device draws from its own",
}


def suggestion(op: str, form: str = "") -> str:
    """What to use instead of ``op`` (in its declined ``form``); "" where the frontend has none."""
    if form:
        return FORMS.get((op, form), "")
    return OPS.get(op) or OPS.get(f"{op.rsplit('.', 1)[0]}.default", "")

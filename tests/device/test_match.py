"""Kernel matching, tested by structure: kernel counts per kind, what each kernel holds, its work."""

from collections import Counter

import numpy as np

from device.graphs import GraphBuilder
from device.passes.match import match
from tests.device.graphs import attention_graph, cnn_graph, mlp_graph


def _kinds(kernels):
    return Counter(k.kind for k in kernels)


def _every_node_once(graph, kernels):
    names = [n for k in kernels for n in k.nodes]
    assert sorted(names) == sorted(n.name for n in graph.nodes)


def test_mlp_is_three_dense_kernels_and_one_loss():
    graph = mlp_graph(batch=8, sizes=(784, 64, 32, 10))
    kernels = match(graph)
    assert [k.kind for k in kernels] == ["dense", "dense", "dense", "softmax_loss"]
    _every_node_once(graph, kernels)
    first = kernels[0]
    assert first.ops == ["matmul", "add", "relu"]
    assert first.params == ["fc0.weight", "fc0.bias"]
    assert first.inputs == ["features"] and first.outputs == kernels[1].inputs
    matmul = 2 * 8 * 784 * 64
    assert first.flops_fwd == matmul + 8 * 64 + 8 * 64  # matmul, bias, relu
    assert first.flops_bwd == 2 * matmul + 8 * 64 + 8 * 64  # backward about 2x for the matmul
    assert first.weight_bytes == 4 * (784 * 64 + 64)
    assert first.activation_bytes == 4 * 8 * 64
    assert kernels[-1].ops == ["sparse_softmax_cross_entropy", "reduce_mean"]
    assert kernels[-1].outputs == [graph.loss]


def test_cnn_kernel_counts_and_fusions():
    graph = cnn_graph(batch=4, image=16, channels=(3, 8, 16))
    kernels = match(graph)
    assert _kinds(kernels) == {"conv": 2, "pool": 2, "layout": 1, "dense": 1, "softmax_loss": 1}
    _every_node_once(graph, kernels)
    conv0, conv1 = [k for k in kernels if k.kind == "conv"]
    assert conv0.ops == ["conv2d", "add", "relu"]
    assert conv1.ops == ["conv2d", "batch_norm", "relu"]
    assert conv1.state == ["bn1.running_mean", "bn1.running_var"]
    assert conv0.flops_fwd - 2 * (4 * 8 * 16 * 16) == 2 * (4 * 8 * 16 * 16) * 3 * 3 * 3  # per output: C_in x 3 x 3
    layout = next(k for k in kernels if k.kind == "layout")
    assert layout.free and layout.flops_fwd == 0 and layout.sram_bytes_fwd == 0


def test_attention_block_is_one_attention_kernel():
    graph = attention_graph(batch=2, seq=8, width=16, heads=2)
    kernels = match(graph)
    kinds = _kinds(kernels)
    assert kinds["attention"] == 1
    assert kinds["dense"] == 5  # q, k, v, output projection, classifier
    assert kinds["layer_norm"] == 1 and kinds["softmax_loss"] == 1
    assert kinds["elementwise"] == 1  # the residual add reads two activations: not fused
    _every_node_once(graph, kernels)
    (attention,) = [k for k in kernels if k.kind == "attention"]
    assert attention.ops == ["matmul", "mul", "softmax", "matmul"]
    assert len(attention.inputs) == 3 and attention.params == []  # q, k^T, v
    scores = 2 * 2 * 8 * 8  # B x H x T x T
    assert attention.flops_fwd == 2 * scores * 8 + scores + 5 * scores + 2 * (2 * 2 * 8 * 8) * 8


def test_einsum_attention_and_einsum_dense():
    b = GraphBuilder()
    x = b.input("x", (2, 4, 6, 8))  # (B, H, T, d)
    w = b.param("w", (8, 8))
    q = b.op("einsum", [x, w], (2, 4, 6, 8), attrs={"equation": "bhtd,de->bhte"})
    s = b.op("einsum", [q, x], (2, 4, 6, 6), attrs={"equation": "bhqd,bhkd->bhqk"})
    p = b.op("softmax", [s], (2, 4, 6, 6), attrs={"axis": -1})
    b.graph.outputs["ctx"] = b.op("einsum", [p, x], (2, 4, 6, 8), attrs={"equation": "bhqk,bhkd->bhqd"})
    kernels = match(b.graph)
    assert [k.kind for k in kernels] == ["dense", "attention"]
    assert kernels[0].flops_fwd == 2 * (2 * 4 * 6 * 8 * 8)
    assert kernels[1].flops_fwd == 2 * (2 * 4 * 6 * 6 * 8) * 2 + 5 * (2 * 4 * 6 * 6)


def test_weight_layout_ops_fold_into_the_kernel_that_uses_the_weight():
    b = GraphBuilder(precision="float16")
    x = b.input("x", (4, 8))
    w = b.param("w", (3, 8))  # torch Linear layout (out, in)
    w16 = b.op("cast", [w], (3, 8), "float16", attrs={"dtype": "float16"})
    w_t = b.op("transpose", [w16], (8, 3), "float16", attrs={"perm": [1, 0]})
    b.graph.outputs["y"] = b.op("matmul", [x, w_t], (4, 3), "float16")
    (kernel,) = match(b.graph)
    assert kernel.kind == "dense"
    assert kernel.ops == ["cast", "transpose", "matmul"] and kernel.params == ["w"]


def test_unary_ops_after_a_kernel_fuse_into_it():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    gamma, beta = b.param("g", (8,)), b.param("b", (8,))
    y = b.op("layer_norm", [x, gamma, beta], (4, 8), attrs={"axes": [-1], "eps": 1e-5})
    y = b.op("tanh", [b.op("dropout", [y], (4, 8), attrs={"rate": 0.1})], (4, 8))
    b.graph.outputs["y"] = y
    (kernel,) = match(b.graph)
    assert kernel.kind == "layer_norm" and kernel.ops == ["layer_norm", "dropout", "tanh"]


def test_log_softmax_with_a_hand_written_nll_is_one_loss_kernel():
    b = GraphBuilder()
    logits = b.input("logits", (4, 10))
    one_hot = b.input("one_hot", (4, 10))
    logp = b.op("log_softmax", [logits], (4, 10), attrs={"axis": -1})
    picked = b.op("reduce_sum", [b.op("mul", [logp, one_hot], (4, 10))], (4,), attrs={"axes": [1], "keepdims": False})
    b.graph.loss = b.op("neg", [b.op("reduce_mean", [picked], (), attrs={"axes": [0], "keepdims": False})], ())
    (kernel,) = match(b.graph)
    assert kernel.kind == "softmax_loss"
    assert kernel.ops == ["log_softmax", "mul", "reduce_sum", "reduce_mean", "neg"]


def test_softmax_for_predictions_is_not_a_loss():
    b = GraphBuilder()
    logits = b.input("logits", (4, 10))
    b.graph.outputs["probs"] = b.op("softmax", [logits], (4, 10), attrs={"axis": -1})
    assert [k.kind for k in match(b.graph)] == ["softmax"]


def test_residual_add_keeps_no_activations_for_the_backward():
    kernels = match(attention_graph())
    residual = next(k for k in kernels if k.kind == "elementwise")
    assert residual.input_bytes > 0 and residual.stash_bytes == 0
    dense = next(k for k in kernels if k.kind == "dense")
    assert dense.stash_bytes == dense.input_bytes


def test_sixteen_bit_compute_halves_activation_bytes_not_weight_bytes():
    fp32 = match(mlp_graph(precision="float32"))[0]
    fp16 = match(mlp_graph(precision="float16"))[0]
    assert fp16.activation_bytes * 2 == fp32.activation_bytes
    assert fp16.weight_bytes == fp32.weight_bytes  # fp32 master weights either way


def test_matching_is_deterministic():
    graph = attention_graph()
    first = [(k.name, k.nodes) for k in match(graph)]
    assert first == [(k.name, k.nodes) for k in match(graph)]
    assert len({name for name, _ in first}) == len(first)


def test_scale_by_constant_keeps_its_input_out_of_the_stash():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    half = b.constant("half", np.float32(0.5))
    b.graph.outputs["y"] = b.op("mul", [x, half], (4, 8))
    (kernel,) = match(b.graph)
    assert kernel.kind == "elementwise" and kernel.stash_bytes == 0


def test_a_square_written_as_x_times_x_keeps_x_like_square_does():
    """x * x (torch's x.pow(2)) and square(x) (TF's) are the same math: both backwards read x, so
    both kernels stash it. Once the x * x kernel saw "no other input", took it for a scale by a
    weight and stashed nothing: T5's RMS norms then needed 3 GiB less SRAM in PyTorch than in TF."""
    def stash(op, inputs):
        b = GraphBuilder()
        x = b.input("x", (4, 8))
        b.graph.outputs["y"] = b.op(op, [x] * inputs, (4, 8))
        (kernel,) = match(b.graph)
        return kernel.stash_bytes
    assert stash("mul", 2) == stash("square", 1) == 4 * 4 * 8
    assert stash("div", 2) == 4 * 4 * 8  # x / x: the denominator's gradient reads it


def test_a_hand_written_erf_gelu_validates_and_fuses_into_its_dense_kernel():
    """0.5 * x * (1 + erf(x / sqrt 2)) after a dense layer: every op has a record, so the
    validator passes it, and matching must then find a kernel for each (erf was once valid
    yet matched as "unsupported": the two stages read different op lists)."""
    from device.passes.validate import validate

    b = GraphBuilder()
    x = b.input("x", (4, 8))
    labels = b.input("labels", (4,), "int32")
    h = b.dense(x, 8, name="fc")
    scaled = b.op("div", [h, b.constant("sqrt2", np.float32(np.sqrt(2.0)))], (4, 8))
    gate = b.op("add", [b.op("erf", [scaled], (4, 8)), b.constant("one", np.float32(1.0))], (4, 8))
    gelu = b.op("mul", [b.op("mul", [h, b.constant("half", np.float32(0.5))], (4, 8)), gate], (4, 8))
    b.graph.outputs["logits"] = gelu
    b.cross_entropy(gelu, labels)
    assert validate(b.graph, mode="train", profile=None).ok
    kernels = match(b.graph)
    _every_node_once(b.graph, kernels)
    assert "unsupported" not in _kinds(kernels)
    erf_kernel = next(k for k in kernels if "erf" in k.ops)
    assert erf_kernel.kind in ("dense", "elementwise") and erf_kernel.flops_fwd > 0


def _conv_batch_norm_graph(read_statistics: bool):
    """conv2d then a batch norm with torch's three outputs (y, running mean, running var)."""
    b = GraphBuilder()
    x = b.input("images", (2, 3, 8, 8))
    w = b.param("conv.weight", (4, 3, 3, 3))
    gamma, beta = b.param("bn.weight", (4,)), b.param("bn.bias", (4,))
    mean, var = b.state("bn.running_mean", (4,)), b.state("bn.running_var", (4,))
    y = b.op("conv2d", [x, w], (2, 4, 8, 8), attrs={"strides": [1, 1], "padding": [[1, 1], [1, 1]],
                                                    "dilations": [1, 1], "layout": "NCHW", "weight_layout": "OIHW"})
    outs = [b.graph.add_value(name, shape, "float32") for name, shape in
            (("bn", (2, 4, 8, 8)), ("bn.new_mean", (4,)), ("bn.new_var", (4,)))]
    b.graph.add_node("batch_norm", [y, gamma, beta, mean, var], outs, {"axis": 1, "eps": 1e-5, "momentum": 0.1})
    y = b.op("relu", [outs[0]], (2, 4, 8, 8))
    if read_statistics:  # something reads the new running mean: it must leave the batch norm's kernel
        y = b.op("add", [y, outs[1]], (2, 4, 8, 8))
    y = b.op("reduce_mean", [y], (2, 4), attrs={"axis": [2, 3], "keepdims": False})
    b.cross_entropy(b.dense(y, 3, name="fc"), b.input("labels", (2,), "int32"))
    return b.graph


def test_a_batch_norm_whose_running_statistics_no_node_reads_fuses_into_its_conv():
    # torch's batch norm returns its running statistics (written back to state), TF's only y:
    # the same network must give the same kernels in both
    kernels = match(_conv_batch_norm_graph(read_statistics=False))
    conv = next(k for k in kernels if k.kind == "conv")
    assert conv.ops == ["conv2d", "batch_norm", "relu"] and "batch_norm" not in _kinds(kernels)
    assert conv.state == ["bn.running_mean", "bn.running_var"]
    read = match(_conv_batch_norm_graph(read_statistics=True))
    assert [k.ops for k in read if k.kind == "conv"] == [["conv2d"]] and _kinds(read)["batch_norm"] == 1

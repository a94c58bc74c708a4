"""The standard small IR graphs the compiler tests count kernels on: an MLP, a CNN, an attention block.

Built with device/graphs.py's GraphBuilder (no framework needed).
"""

from __future__ import annotations

from device.graphs import GraphBuilder, attention_block, default_optimizer
from device.ir import Graph


def mlp_graph(batch: int = 8, sizes=(784, 64, 32, 10), optimizer_kind: str = "adam",
              precision: str = "float32") -> Graph:
    """Dense layers with relu between them, softmax cross entropy on the last."""
    b = GraphBuilder(precision=precision)
    x = b.input("features", (batch, sizes[0]))
    labels = b.input("labels", (batch,), "int32")
    for i, n_out in enumerate(sizes[1:]):
        last = i == len(sizes) - 2
        x = b.dense(x, n_out, None if last else "relu", name=f"fc{i}")
    b.graph.outputs["logits"] = x
    b.cross_entropy(x, labels)
    b.graph.optimizer = default_optimizer(optimizer_kind)
    return b.graph


def cnn_graph(batch: int = 4, image: int = 16, channels=(3, 8, 16), classes: int = 10,
              optimizer_kind: str = "momentum") -> Graph:
    """conv+bias+relu, max pool, conv+batch_norm+relu, avg pool, flatten, dense, loss (NCHW)."""
    b = GraphBuilder()
    x = b.input("images", (batch, channels[0], image, image))
    labels = b.input("labels", (batch,), "int32")
    conv = {"strides": [1, 1], "padding": [[1, 1], [1, 1]], "dilations": [1, 1], "layout": "NCHW",
            "weight_layout": "OIHW"}
    pool = {"kernel": [2, 2], "strides": [2, 2], "padding": [[0, 0], [0, 0]], "layout": "NCHW"}
    c0, c1, c2 = channels
    size = image

    w0 = b.param("conv0.weight", (c1, c0, 3, 3))
    b0 = b.param("conv0.bias", (c1, 1, 1))
    y = b.op("conv2d", [x, w0], (batch, c1, size, size), attrs=conv)
    y = b.op("relu", [b.op("add", [y, b0], (batch, c1, size, size))], (batch, c1, size, size))
    size //= 2
    y = b.op("max_pool2d", [y], (batch, c1, size, size), attrs=pool)

    w1 = b.param("conv1.weight", (c2, c1, 3, 3))
    gamma, beta = b.param("bn1.weight", (c2,)), b.param("bn1.bias", (c2,))
    mean, var = b.state("bn1.running_mean", (c2,)), b.state("bn1.running_var", (c2,))
    y = b.op("conv2d", [y, w1], (batch, c2, size, size), attrs=conv)
    y = b.op("batch_norm", [y, gamma, beta, mean, var], (batch, c2, size, size),
             attrs={"axis": 1, "eps": 1e-5, "momentum": 0.1})
    y = b.op("relu", [y], (batch, c2, size, size))
    size //= 2
    y = b.op("avg_pool2d", [y], (batch, c2, size, size), attrs=pool)

    y = b.op("reshape", [y], (batch, c2 * size * size), attrs={"shape": [batch, c2 * size * size]})
    logits = b.dense(y, classes, name="fc")
    b.graph.outputs["logits"] = logits
    b.cross_entropy(logits, labels)
    b.graph.optimizer = default_optimizer(optimizer_kind)
    return b.graph


def attention_graph(batch: int = 2, seq: int = 8, width: int = 16, heads: int = 2, classes: int = 4,
                    precision: str = "float32") -> Graph:
    """One attention block, mean over the sequence, a dense classifier and the loss."""
    b = GraphBuilder(precision=precision)
    x = b.input("x", (batch, seq, width))
    labels = b.input("labels", (batch,), "int32")
    h = attention_block(b, x, heads)
    pooled = b.op("reduce_mean", [h], (batch, width), attrs={"axes": [1], "keepdims": False})
    logits = b.dense(pooled, classes, name="classifier")
    b.graph.outputs["logits"] = logits
    b.cross_entropy(logits, labels)
    b.graph.optimizer = default_optimizer("adamw")
    return b.graph

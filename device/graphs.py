"""IR graphs built by hand, without a framework: the calibration model and the tests' graphs.

``GraphBuilder`` adds one op per call, with the output shape given by the caller (no
shape inference: the graphs are small and their shapes are the point). Each node gets
a source location ``<file>:<line>`` with a fresh line, so reports can be checked for
pointing at the right place. ``attention_block`` and ``layer_norm`` are the layers
device/calibration.py builds BERT-Large from; the tests' standard small models
(tests/device/graphs.py) are built from the same pieces.

Attribute conventions used here: conv2d/pool ``padding`` is a list of (before, after)
pairs per spatial axis; layouts are torch's (NCHW, OIHW).
"""

from __future__ import annotations

import numpy as np

from device.ir import Graph, SourceLoc
from device.optimizer import OptimizerSpec


class GraphBuilder:
    def __init__(self, frontend: str = "torch", file: str = "model.py", precision: str = "float32"):
        self.graph = Graph(frontend=frontend, precision=precision)
        self.file = file
        self.line = 10

    def input(self, name: str, shape, dtype: str = "float32") -> str:
        self.graph.add_value(name, shape, dtype)
        self.graph.inputs.append(name)
        return name

    def param(self, name: str, shape, dtype: str = "float32") -> str:
        self.graph.add_value(name, shape, dtype)
        self.graph.params[name] = name
        return name

    def state(self, name: str, shape, dtype: str = "float32") -> str:
        self.graph.add_value(name, shape, dtype)
        self.graph.state[name] = name
        return name

    def constant(self, name: str, array) -> str:
        array = np.asarray(array)
        self.graph.add_value(name, array.shape, str(array.dtype))
        self.graph.constants[name] = array
        return name

    def op(self, op: str, inputs: list[str], shape, dtype: str = "float32", attrs=None, *,
           framework_op: str | None = None, line: int | None = None) -> str:
        """Add one node with one output of ``shape``; returns the output's name."""
        self.line = line if line is not None else self.line + 1
        out = self.graph.add_value(f"v{len(self.graph.values)}", shape, dtype)
        loc = SourceLoc(framework_op or f"aten.{op}.default", self.file, self.line)
        self.graph.add_node(op, inputs, [out], attrs, loc)
        return out

    # -- layers built from ops ------------------------------------------------------

    def dense(self, x: str, n_out: int, activation: str | None = None, name: str = "dense") -> str:
        """x @ W + b (+ activation), over the last axis of x."""
        shape = self.graph.values[x].shape
        w = self.param(f"{name}.weight", (shape[-1], n_out))
        b = self.param(f"{name}.bias", (n_out,))
        out_shape = (*shape[:-1], n_out)
        y = self.op("add", [self.op("matmul", [x, w], out_shape), b], out_shape)
        return self.op(activation, [y], out_shape) if activation else y

    def cross_entropy(self, logits: str, labels: str) -> str:
        """Mean sparse softmax cross entropy; sets the graph's loss."""
        n = self.graph.values[logits].shape[0]
        per_example = self.op("sparse_softmax_cross_entropy", [logits, labels], (n,))
        loss = self.op("reduce_mean", [per_example], (), attrs={"axes": [0], "keepdims": False})
        self.graph.loss = loss
        return loss


def default_optimizer(kind: str = "adam", semantics: str = "torch") -> OptimizerSpec:
    """The optimizer settings the hand-built graphs train with."""
    hyper = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8} if kind.startswith("adam") else {"lr": 0.1}
    if kind == "momentum":
        hyper["momentum"] = 0.9
    return OptimizerSpec(kind=kind, semantics=semantics, hyper=hyper)


def attention_block(b: GraphBuilder, x: str, heads: int, name: str = "attn", mask: str | None = None,
                    dropout: float = 0.0, eps: float = 1e-5) -> str:
    """Self-attention with q, k, v and output projections, residual and layer norm: (B, T, C) -> (B, T, C).

    mask: an additive bias broadcast over the scores (B, 1, 1, T); dropout (BERT's places):
    on the attention probabilities and on the output projection.
    """
    batch, seq, width = b.graph.values[x].shape
    d = width // heads

    def split_heads(t: str) -> str:  # (B, T, C) -> (B, H, T, d)
        t = b.op("reshape", [t], (batch, seq, heads, d), attrs={"shape": [batch, seq, heads, d]})
        return b.op("transpose", [t], (batch, heads, seq, d), attrs={"perm": [0, 2, 1, 3]})

    q = split_heads(b.dense(x, width, name=f"{name}.q"))
    k = split_heads(b.dense(x, width, name=f"{name}.k"))
    v = split_heads(b.dense(x, width, name=f"{name}.v"))
    k_t = b.op("transpose", [k], (batch, heads, d, seq), attrs={"perm": [0, 1, 3, 2]})  # (B, H, d, T)
    scores = b.op("matmul", [q, k_t], (batch, heads, seq, seq))  # (B, H, T, T)
    scale = b.constant(f"{name}.scale", np.float32(1.0 / np.sqrt(d)))
    scores = b.op("mul", [scores, scale], (batch, heads, seq, seq))
    if mask is not None:
        scores = b.op("add", [scores, mask], (batch, heads, seq, seq))
    probs = b.op("softmax", [scores], (batch, heads, seq, seq), attrs={"axis": -1})
    if dropout:
        probs = b.op("dropout", [probs], (batch, heads, seq, seq), attrs={"rate": dropout})
    ctx = b.op("matmul", [probs, v], (batch, heads, seq, d))  # (B, H, T, d)
    ctx = b.op("transpose", [ctx], (batch, seq, heads, d), attrs={"perm": [0, 2, 1, 3]})
    ctx = b.op("reshape", [ctx], (batch, seq, width), attrs={"shape": [batch, seq, width]})
    out = b.dense(ctx, width, name=f"{name}.out")
    if dropout:
        out = b.op("dropout", [out], (batch, seq, width), attrs={"rate": dropout})
    out = b.op("add", [x, out], (batch, seq, width))  # residual
    return layer_norm(b, out, f"{name}.ln", eps)


def layer_norm(b: GraphBuilder, x: str, name: str, eps: float = 1e-5) -> str:
    """Layer norm over the last axis with its gamma and beta."""
    width = b.graph.values[x].shape[-1]
    gamma, beta = b.param(f"{name}.weight", (width,)), b.param(f"{name}.bias", (width,))
    return b.op("layer_norm", [x, gamma, beta], b.graph.values[x].shape, attrs={"axes": [-1], "eps": eps})

"""Graph rewrites after the lowering: nodes that reach neither the loss nor an output are
dropped (``_prune``), and a GELU written out with erf becomes one ``gelu`` node (``_fuse_erf_gelu``).
"""

from __future__ import annotations

import math

import numpy as np

from device.ir import Graph


def _prune(graph: Graph) -> None:
    """Drop nodes that reach neither the loss nor an output, then unused params/state/constants."""
    live = {graph.loss, *graph.outputs.values(), *(n.outputs[0] for n in graph.nodes if n.op == "host_check")}
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    used = live | set(graph.inputs) | {out for node in graph.nodes for out in node.outputs}
    graph.params = {k: v for k, v in graph.params.items() if k in used}
    graph.state = {k: v for k, v in graph.state.items() if k in used}
    graph.constants = {k: v for k, v in graph.constants.items() if k in used}
    graph.values = {k: v for k, v in graph.values.items() if k in used}


def _fuse_erf_gelu(graph: Graph) -> None:
    """A GELU written out with erf, x * 0.5 * (1 + erf(x / sqrt(2))) in any order of its
    factors (BERT's own ``gelu``), becomes the one ``gelu`` node nn.GELU gives: the
    activation step of its dense kernel, as TensorFlow's pattern makes it."""
    consumers = graph.consumers()
    producers = graph.producers()

    def scalar(value: str, expected: float) -> bool:
        c = graph.constants.get(value)
        return c is not None and np.size(c) == 1 and math.isclose(float(np.asarray(c).reshape(())), expected,
                                                                  rel_tol=1e-6)

    def only_use(value: str):
        users = consumers.get(value, [])
        return users[0] if len(users) == 1 and value not in graph.outputs.values() and value != graph.loss else None

    def other(node, value):
        rest = [v for v in node.inputs if v != value]
        return rest[0] if len(node.inputs) == 2 and len(rest) == 1 else None

    removed: set[str] = set()
    for erf in [n for n in graph.nodes if n.op == "erf"]:
        scaled = producers.get(erf.inputs[0])  # x / sqrt(2) or x * (1 / sqrt(2))
        if scaled is None or only_use(scaled.outputs[0]) is not erf or len(scaled.inputs) != 2:
            continue
        x, c = scaled.inputs
        if not ((scaled.op == "div" and scalar(c, math.sqrt(2.0)))
                or (scaled.op == "mul" and (scalar(c, 1 / math.sqrt(2.0)) or scalar(x, 1 / math.sqrt(2.0))))):
            continue
        if scaled.op == "mul" and scalar(x, 1 / math.sqrt(2.0)):
            x = c
        one = only_use(erf.outputs[0])  # 1 + erf(...)
        if one is None or one.op != "add" or not scalar(other(one, erf.outputs[0]) or "", 1.0):
            continue
        chain = [scaled, erf, one]
        outer = only_use(one.outputs[0])
        if outer is None or outer.op != "mul":
            continue
        factor = other(outer, one.outputs[0])
        half = producers.get(factor) if factor else None
        if factor == x:  # x * (1 + erf) then * 0.5
            last = only_use(outer.outputs[0])
            if last is None or last.op != "mul" or not scalar(other(last, outer.outputs[0]) or "", 0.5):
                continue
            chain += [outer, last]
        elif scalar(factor or "", 0.5):  # 0.5 * (1 + erf) then * x
            last = only_use(outer.outputs[0])
            if last is None or last.op != "mul" or other(last, outer.outputs[0]) != x:
                continue
            chain += [outer, last]
        elif (half is not None and half.op == "mul" and only_use(factor) is outer and x in half.inputs
              and scalar(other(half, x) or "", 0.5)):  # (0.5 * x) * (1 + erf)
            chain += [half, outer]
        else:
            continue
        last = chain[-1]
        last.op, last.inputs, last.attrs = "gelu", [x], {"approximate": "none"}
        removed |= {n.name for n in chain[:-1]}
    if removed:
        graph.nodes = [n for n in graph.nodes if n.name not in removed]
        _prune(graph)

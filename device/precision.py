"""Which nodes of a mixed-precision graph compute in float32 because the model's values are float32.

Under mixed precision every kernel's floating inputs and outputs are rounded to the 16-bit
format (device/runtime/program.py), except the loss. One more kind of value stays float32:
a tensor the model computes from the batch's integers and booleans alone, such as the
additive attention mask transformers builds from ``attention_mask`` and fills with
``torch.finfo(float32).min``. No weight or activation reaches it, torch computes it in
float32 under ``torch.autocast`` (no op of autocast's 16-bit list touches it), and it is
written for float32: rounded to bfloat16 that fill is -inf (IEEE rounding past the largest
finite value, dtypes.py), and a query that every key masks (a left-padded row) would take
the softmax of -inf everywhere, NaN, where torch gives a finite number.

So, as torch's type promotion does under autocast (bfloat16 + float32 -> float32):

- a node whose every input is a constant or computed from the batch's integers and
  booleans, and whose output is a float32 tensor (not a scalar: torch's scalars and 0-d
  tensors do not promote), computes in float32 and its output stays float32;
- a node that reads such a value computes in float32 too, and so on downstream;
- up to the next matmul or conv (autocast's 16-bit ops), which rounds its inputs to the
  16-bit format as every matmul does. A value the IR types as 16-bit (the model's own cast)
  also ends the float32 run.

Constants the capture folded (tables, an sdpa causal mask) are not such values: they are
rounded as before. The cost model counts the kernels these nodes anchor at float32's rate
and their values at 4 bytes (passes/match.py).
"""

from __future__ import annotations

import math

from device.dtypes import FLOATS
from device.ir import Graph
from device.ops import OPS

# op categories of the 16-bit compute that torch.autocast lowers (matmul, linear, conv): they
# round their inputs to the 16-bit format and end a float32 run
SIXTEEN_BIT_CATEGORIES = ("matmul", "conv")


def float32_nodes(graph: Graph) -> set[str]:
    """The names of the nodes that compute in float32 in a mixed-precision graph (the loss aside);
    none in a float32 graph."""
    if graph.precision == "float32":
        return set()
    free = set(graph.constants) | {v for v in graph.inputs if graph.values[v].dtype not in FLOATS}
    wide: set[str] = set()  # values held in float32
    nodes: set[str] = set()
    for node in graph.nodes:
        if all(v in free for v in node.inputs):
            free.update(node.outputs)
            outputs = [v for v in node.outputs if graph.values[v].dtype == "float32"
                       and math.prod(d or 0 for d in graph.values[v].shape) > 1]
        elif node.op in OPS and OPS[node.op].category in SIXTEEN_BIT_CATEGORIES:
            continue
        elif any(v in wide for v in node.inputs):
            outputs = [v for v in node.outputs if graph.values[v].dtype == "float32"]
        else:
            continue
        if outputs:
            nodes.add(node.name)
            wide.update(outputs)
    return nodes

"""Kernel matching: group the IR nodes into the kernels of the device's kernel library.

The rules are the table ``RULES``, tried in order at each node not yet taken, in
topological order. A rule starts at an anchor op and extends along a chain: each step
takes the one consumer of the chain's current value if that consumer's op is in the
step's set (and its other inputs are of the allowed sort). What a kernel fuses never
leaves its rectangle of PEs; what it does not fuse crosses the fabric to the next one.

Layout ops that only reshape or cast a weight (``transpose(W)``, ``cast(W, float16)``)
are folded into the kernel that uses the weight: on the device a weight is laid out
once, where it lives.

Each kernel carries its forward and backward work for the captured batch: flops (the
living definition of each op is device/runtime/kernels.py; the counts here are the
usual ones: 2*M*N*K for a matmul, per output for a convolution, per element for
elementwise ops, backward about 2x forward for contractions) and SRAM bytes (what the
kernel reads and writes in PE memory, for the cost model's roofline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from device.ir import Graph, Node
from device.profiles import PRECISION_BYTES

ACTIVATIONS = frozenset({"relu", "tanh", "sigmoid", "elu", "selu", "gelu"})
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "maximum", "neg", "exp", "log", "sqrt", "rsqrt", "square",
                         "dropout", "equal"}) | ACTIVATIONS
LAYOUT = frozenset({"reshape", "transpose", "identity", "cast", "concat", "slice", "broadcast_to"})
REDUCTIONS = frozenset({"reduce_sum", "reduce_mean", "reduce_max", "argmax"})
CONTRACTIONS = frozenset({"matmul", "einsum", "conv2d"})
MATMULS = frozenset({"matmul", "einsum"})

# ops whose backward does not read their activation inputs (linear in them): a kernel keeps
# no copy of such an input for the backward pass. Dropout keeps only a 1-bit mask (not counted).
LINEAR_OPS = frozenset({"add", "sub", "neg", "identity", "dropout", "reduce_sum", "reduce_mean", "equal",
                        "argmax"}) | LAYOUT

# kinds that take no PEs: they only change how data is laid out between kernels
FREE_KINDS = frozenset({"layout"})

# fp32 partial sums: the device accumulates in fp32 (wafer-facts.md, number formats)
ACCUMULATOR_BYTES = 4

# forward flops per output element for the ops that are not contractions: one per
# elementary operation of the op's numpy definition
FLOPS_PER_ELEMENT = {
    "softmax": 5, "log_softmax": 5,  # max, subtract, exp, sum, divide (or log)
    "layer_norm": 8, "batch_norm": 8,  # mean, subtract, square, mean, rsqrt, scale, gamma, beta
    "gelu": 8, "elu": 3, "selu": 4, "sigmoid": 4, "tanh": 4,  # short polynomial / exp evaluations
    "dropout": 2,  # compare a random number, scale
    "sparse_softmax_cross_entropy": 5,  # per logit: the softmax, then one log per row
}

# backward work (flops and bytes) over forward work, per op; default 1 (one pass over
# the same elements). Contractions compute two products: d(input) and d(weight).
BACKWARD_RATIO = {"matmul": 2.0, "einsum": 2.0, "conv2d": 2.0, "argmax": 0.0, "equal": 0.0}


@dataclass(frozen=True)
class Step:
    ops: frozenset[str]
    optional: bool = True
    repeat: bool = False  # take a run of such ops
    other_inputs: str = "any"  # "weights": the step's other inputs must be weights or constants


@dataclass(frozen=True)
class Rule:
    kind: str
    anchor: frozenset[str]
    steps: tuple[Step, ...] = ()
    anchor_weights: bool | None = None  # True: the anchor must read a weight; False: must not; None: either
    needs_reduction: bool = False  # the chain must reduce (a loss ends in a scalar)


def _one(*ops: str, **kw) -> Step:
    return Step(frozenset(ops), optional=False, **kw)


def _opt(ops, **kw) -> Step:
    return Step(frozenset(ops), optional=True, **kw)


RULES: tuple[Rule, ...] = (
    # attention: scores = q @ k^T (matmul or einsum of two activations), optionally scaled
    # and masked, softmax over the keys, optional dropout, then @ v; the T x T scores stay inside
    Rule("attention", MATMULS, (_opt({"mul", "div"}), _opt({"add"}), _one("softmax"), _opt({"dropout"}),
                                _one("matmul", "einsum")), anchor_weights=False),
    # dense: x @ W (+ bias) (+ activation) (+ dropout)
    Rule("dense", MATMULS, (_opt({"add"}, other_inputs="weights"), _opt(ACTIVATIONS), _opt({"dropout"})),
         anchor_weights=True),
    # a product of two activations outside an attention pattern
    Rule("matmul", MATMULS, anchor_weights=False),
    # conv: conv2d (+ bias add) (+ batch_norm) (+ activation)
    Rule("conv", frozenset({"conv2d"}), (_opt({"add"}, other_inputs="weights"), _opt({"batch_norm"}),
                                         _opt(ACTIVATIONS))),
    # pooling
    Rule("pool", frozenset({"max_pool2d", "avg_pool2d"})),
    # layer norm (+ dropout)
    Rule("layer_norm", frozenset({"layer_norm"}), (_opt({"dropout"}),)),
    # batch norm not after a convolution (+ activation)
    Rule("batch_norm", frozenset({"batch_norm"}), (_opt(ACTIVATIONS),)),
    # embedding lookup (+ dropout)
    Rule("embedding", frozenset({"embedding"}), (_opt({"dropout"}),)),
    # softmax cross entropy (+ mean or sum over the batch) (+ a constant scale)
    Rule("softmax_loss", frozenset({"sparse_softmax_cross_entropy"}),
         (_opt({"reduce_mean", "reduce_sum"}), _opt({"mul", "div"}, other_inputs="weights"))),
    # (log_)softmax followed by a hand-written negative log likelihood down to the loss
    Rule("softmax_loss", frozenset({"log_softmax", "softmax"}),
         (_one(*(ELEMENTWISE | {"reduce_sum", "reduce_mean"}), repeat=True),), needs_reduction=True),
    # a softmax on its own (predictions)
    Rule("softmax", frozenset({"softmax", "log_softmax"})),
    # reductions and argmax
    Rule("reduce", REDUCTIONS),
    # shape-only ops: free, they change only how data is routed between kernels
    Rule("layout", LAYOUT),
    # remaining elementwise ops: a chain of them, each feeding only the next
    Rule("elementwise", ELEMENTWISE, (_opt(ELEMENTWISE, repeat=True),)),
)

# kinds into which a left-over run of unary elementwise ops is fused, when the run reads
# only that kernel's output: the ops then run on the producer's PEs as it writes
FUSE_INTO = frozenset({"dense", "conv", "matmul", "attention", "layer_norm", "batch_norm", "pool", "embedding"})


@dataclass
class Kernel:
    """One library kernel: a group of IR nodes that runs on one rectangle of PEs.

    Work and bytes are for the captured batch (``batch`` samples), forward and backward.
    """

    name: str
    kind: str
    nodes: list[str]  # IR node names, in topological order
    ops: list[str]
    params: list[str]  # trainable IR values the kernel reads
    state: list[str]  # non-trainable variables (batch-norm statistics)
    inputs: list[str]  # activation values from outside the kernel (graph inputs, other kernels)
    outputs: list[str]  # values used outside the kernel (other kernels, loss, outputs)
    batch: int
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    sram_bytes_fwd: float = 0.0
    sram_bytes_bwd: float = 0.0
    weight_bytes: int = 0  # fp32 master weights
    state_bytes: int = 0
    input_bytes: int = 0  # activations in, for the batch, in the compute format
    stash_bytes: int = 0  # the part of input_bytes the backward pass reads (kept from forward to backward)
    activation_bytes: int = 0  # activations out, for the batch, in the compute format
    loc: str = ""  # where the anchor node came from: "file:line (framework op)"

    @property
    def free(self) -> bool:
        return self.kind in FREE_KINDS

    def flops(self, training: bool) -> float:
        return self.flops_fwd + (self.flops_bwd if training else 0.0)

    def sram_bytes(self, training: bool) -> float:
        return self.sram_bytes_fwd + (self.sram_bytes_bwd if training else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def batch_size(graph: Graph) -> int:
    """The leading dimension of the first batch input (1 if there is none)."""
    for name in graph.inputs:
        shape = graph.values[name].shape
        if shape and isinstance(shape[0], int):
            return shape[0]
    return 1


def match(graph: Graph) -> list[Kernel]:
    """Group ``graph``'s nodes into kernels (every node lands in exactly one)."""
    return _Matcher(graph).run()


@dataclass
class _Matcher:
    graph: Graph
    taken: dict[str, int] = field(default_factory=dict)  # node name -> kernel index
    groups: list[tuple[str, list[Node]]] = field(default_factory=list)

    def __post_init__(self):
        self.producers = self.graph.producers()
        self.consumers = self.graph.consumers()
        self.weights = set(self.graph.params) | set(self.graph.state) | set(self.graph.constants)
        self.sinks = {self.graph.loss, *self.graph.outputs.values()} - {None}
        self._weight_memo: dict[str, bool] = {}
        self._order = {n.name: i for i, n in enumerate(self.graph.nodes)}

    def run(self) -> list[Kernel]:
        # a layout op on a weight waits for the kernel that uses the weight
        for node in self.graph.nodes:
            if node.name not in self.taken and not self._is_weight_prologue(node):
                self._claim_by_rules(node)
        for node in self.graph.nodes:  # weight layouts nobody absorbed (e.g. a weight used twice)
            if node.name not in self.taken:
                self._claim_by_rules(node)
        self._fuse_unary_runs()
        kernels = []
        per_kind: dict[str, int] = {}
        for kind, nodes in self.groups:
            if nodes:
                kernels.append(self._kernel(f"{kind}_{per_kind.get(kind, 0)}", kind, nodes))
                per_kind[kind] = per_kind.get(kind, 0) + 1
        return kernels

    # -- weights ------------------------------------------------------------------

    def _weight_derived(self, value: str) -> bool:
        """True if ``value`` is a weight/constant, or a layout op of weights only."""
        if value in self.weights:
            return True
        if value not in self._weight_memo:
            node = self.producers.get(value)
            self._weight_memo[value] = (node is not None and node.op in LAYOUT and bool(node.inputs)
                                        and all(self._weight_derived(v) for v in node.inputs))
        return self._weight_memo[value]

    def _is_weight_prologue(self, node: Node) -> bool:
        return node.op in LAYOUT and all(self._weight_derived(v) for v in node.outputs)

    def _prologue(self, value: str, kernel_nodes: set[str]) -> list[Node]:
        """The untaken layout nodes that turn weights into ``value``, if only ``kernel_nodes`` use them."""
        node = self.producers.get(value)
        if node is None or value in self.weights or node.name in self.taken or not self._weight_derived(value):
            return []
        users = {c.name for out in node.outputs for c in self.consumers.get(out, [])}
        if not users <= kernel_nodes:
            return []
        chain = [node]
        for v in node.inputs:
            chain = self._prologue(v, kernel_nodes | {node.name}) + chain
        return chain

    def _topological(self, nodes: list[Node]) -> list[Node]:
        unique = {n.name: n for n in nodes}
        return sorted(unique.values(), key=lambda n: self._order[n.name])

    # -- rules --------------------------------------------------------------------

    def _claim_by_rules(self, node: Node) -> None:
        for rule in RULES:
            if node.op not in rule.anchor:
                continue
            if rule.anchor_weights is not None:
                reads_weight = any(self._weight_derived(v) for v in node.inputs)
                if reads_weight != rule.anchor_weights:
                    continue
            chain = self._extend(node, rule)
            if chain is not None:
                self._take(rule.kind, chain)
                return
        self._take("unsupported", [node])  # an op outside device.ir.OPS (validation reports it)

    def _extend(self, anchor: Node, rule: Rule) -> list[Node] | None:
        chain = [anchor]
        for step in rule.steps:
            taken = 0
            while taken == 0 or step.repeat:
                follower = self._follower(chain, step)
                if follower is None:
                    break
                chain.append(follower)
                taken += 1
            if taken == 0 and not step.optional:
                return None
        if rule.needs_reduction and not any(n.op in REDUCTIONS for n in chain):
            return None
        return chain

    def _follower(self, chain: list[Node], step: Step) -> Node | None:
        """The one consumer of the chain's value, if the step may take it."""
        if not chain[-1].outputs:
            return None
        value = chain[-1].outputs[0]
        users = self.consumers.get(value, [])
        if len(users) != 1:
            return None
        node = users[0]
        if node.name in self.taken or node.op not in step.ops or len(node.outputs) != 1:
            return None
        others = [v for v in node.inputs if v != value]
        if step.other_inputs == "weights" and not all(self._weight_derived(v) for v in others):
            return None
        return node

    def _take(self, kind: str, chain: list[Node]) -> None:
        names = {n.name for n in chain}
        prologue = []
        for node in chain:
            for v in node.inputs:
                prologue += [p for p in self._prologue(v, names) if p.name not in names]
                names |= {p.name for p in prologue}
        index = len(self.groups)
        nodes = self._topological(prologue + chain)
        for n in nodes:
            self.taken[n.name] = index
        self.groups.append((kind, nodes))

    def _fuse_unary_runs(self) -> None:
        """Fold an elementwise kernel into its producer when it reads only that kernel's output."""
        for index, (kind, nodes) in enumerate(self.groups):
            if kind != "elementwise" or not nodes:
                continue
            names = {n.name for n in nodes}
            outside = {v for n in nodes for v in n.inputs
                       if not self._weight_derived(v) and getattr(self.producers.get(v), "name", None) not in names}
            if len(outside) != 1:
                continue
            (value,) = outside
            producer = self.producers.get(value)
            if producer is None or value in self.sinks:
                continue
            target = self.taken[producer.name]
            users = {c.name for c in self.consumers.get(value, [])}
            if self.groups[target][0] not in FUSE_INTO or not users <= names:
                continue
            target_kind, target_nodes = self.groups[target]
            self.groups[target] = (target_kind, self._topological(target_nodes + nodes))
            self.groups[index] = (kind, [])
            for n in nodes:
                self.taken[n.name] = target

    # -- kernel figures -------------------------------------------------------------

    def _backward_reads(self, node: Node, value: str) -> bool:
        """Does ``node``'s backward pass read its input ``value``?"""
        if node.op in LINEAR_OPS:
            return False
        others = [v for v in node.inputs if v != value]
        if node.op == "mul" or (node.op == "div" and node.inputs[0] == value):  # scaling by a weight or constant
            return not all(self._weight_derived(v) for v in others)
        return True

    def _kernel(self, name: str, kind: str, nodes: list[Node]) -> Kernel:
        graph = self.graph
        names = {n.name for n in nodes}
        produced = {v for n in nodes for v in n.outputs}
        read = list(dict.fromkeys(v for n in nodes for v in n.inputs))
        params = [v for v in read if v in graph.params]
        state = [v for v in read if v in graph.state]
        inputs = [v for v in read if v not in produced and v not in self.weights]
        outputs = [v for v in dict.fromkeys(v for n in nodes for v in n.outputs)
                   if v in self.sinks or any(c.name not in names for c in self.consumers.get(v, []))]
        elem = PRECISION_BYTES.get(graph.precision, 4)
        kernel = Kernel(
            name=name, kind=kind, nodes=[n.name for n in nodes], ops=[n.op for n in nodes],
            params=params, state=state, inputs=inputs, outputs=outputs, batch=batch_size(graph),
            weight_bytes=4 * sum(_numel(graph, v) for v in params),  # fp32 master weights (wafer-facts.md)
            state_bytes=4 * sum(_numel(graph, v) for v in state),
            input_bytes=sum(_bytes(graph, v, elem) for v in inputs),
            stash_bytes=sum(_bytes(graph, v, elem) for v in inputs
                            if any(v in n.inputs and self._backward_reads(n, v) for n in nodes)),
            activation_bytes=sum(_bytes(graph, v, elem) for v in outputs),
            loc=str(_anchor(nodes).loc),
        )
        if kind in FREE_KINDS:
            return kernel
        for node in nodes:
            flops, sram = _node_work(graph, node, elem, self.weights)
            ratio = BACKWARD_RATIO.get(node.op, 1.0)
            kernel.flops_fwd += flops
            kernel.sram_bytes_fwd += sram
            if node.op == "embedding":  # backward: scatter-add each output row into the table's fp32 gradient
                out = _numel(graph, node.outputs[0])
                kernel.flops_bwd += out
                kernel.sram_bytes_bwd += out * (elem + 2 * ACCUMULATOR_BYTES)
            else:
                kernel.flops_bwd += ratio * flops
                kernel.sram_bytes_bwd += ratio * sram
        return kernel


def _anchor(nodes: list[Node]) -> Node:
    """The node a kernel is named after: its first non-layout node."""
    return next((n for n in nodes if n.op not in LAYOUT), nodes[0])


def _numel(graph: Graph, value: str) -> int:
    return math.prod(d or 0 for d in graph.values[value].shape)


def _bytes(graph: Graph, value: str, float_bytes: int) -> int:
    """Bytes of a value on the device: floats in the compute format, others at their size."""
    dtype = graph.values[value].dtype
    size = {"int64": 8, "int32": 4, "bool": 1}.get(dtype, float_bytes)
    return _numel(graph, value) * size


def _node_work(graph: Graph, node: Node, elem: int, weights: set[str]) -> tuple[float, float]:
    """Forward (flops, SRAM bytes) of one node for the captured batch."""
    op = node.op
    out = _numel(graph, node.outputs[0]) if node.outputs else 0
    if op in LAYOUT:
        return 0.0, 0.0
    if op in CONTRACTIONS:
        macs = _macs(graph, node)
        # each multiply-accumulate reads an operand and a partial sum and writes the
        # partial sum back: the 2 reads + 1 write per cycle of wafer-facts.md, with fp32 partial sums
        return 2.0 * macs, macs * (elem + 2 * ACCUMULATOR_BYTES)
    # everything else streams its operands through once: read the inputs, write the output
    in_elems = sum(_numel(graph, v) for v in node.inputs)
    moved = (in_elems + out) * elem
    if op == "embedding":
        return 0.0, 2.0 * out * elem  # read the selected rows, write them
    if op in ("max_pool2d", "avg_pool2d"):
        kh, kw = _pair(node.attrs.get("kernel", 1))
        return float(out * kh * kw), moved
    if op in REDUCTIONS:
        return float(_numel(graph, node.inputs[0])), moved
    if op == "sparse_softmax_cross_entropy":
        return float(FLOPS_PER_ELEMENT[op] * _numel(graph, node.inputs[0])), moved
    return float(FLOPS_PER_ELEMENT.get(op, 1) * out), moved


def _pair(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def _macs(graph: Graph, node: Node) -> float:
    """Multiply-accumulates of a matmul, einsum or conv2d."""
    out_shape = graph.values[node.outputs[0]].shape
    if node.op == "matmul":  # (..., M, K) @ (..., K, N) -> (..., M, N)
        k = graph.values[node.inputs[0]].shape[-1]
        return float(math.prod(out_shape) * k)
    if node.op == "conv2d":  # per output element: C_in x kh x kw
        w = graph.values[node.inputs[1]].shape
        if node.attrs.get("weight_layout", "OIHW") == "HWIO":
            kh, kw, cin = w[0], w[1], w[2]
        else:
            cin, kh, kw = w[1], w[2], w[3]
        return float(math.prod(out_shape) * cin * kh * kw)
    return float(_einsum_macs(node.attrs["equation"], [graph.values[v].shape for v in node.inputs]))


def _einsum_macs(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """Product of the sizes of all index letters: outputs times the contracted indices."""
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes):
        if "..." in term:
            left, right = term.split("...")
            for letter, size in zip(left, shape):
                sizes[letter] = size
            for letter, size in zip(right, shape[len(shape) - len(right):]):
                sizes[letter] = size
            ellipsis = shape[len(left):len(shape) - len(right)]
            sizes["..."] = max(sizes.get("...", 1), math.prod(ellipsis))
        else:
            for letter, size in zip(term, shape):
                sizes[letter] = size
    return math.prod(sizes.values())

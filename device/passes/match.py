"""Kernel matching: group the IR nodes into the kernels of the device's kernel library.

The rules are the table ``RULES``, tried in order at each node not yet taken, in
topological order. A rule starts at an anchor op and extends along a chain: each step
takes the one consumer of the chain's current value if that consumer's op is in the
step's set (and its other inputs are of the allowed sort). What a kernel fuses never
leaves its rectangle of PEs; what it does not fuse crosses the fabric to the next one.
Attention chains are found before the walk and kept for their anchor, so that an
elementwise chain building a padding mask from the batch cannot take the mask's step.

Layout ops that only reshape or cast a weight (``transpose(W)``, ``cast(W, float16)``)
are folded into the kernel that uses the weight: on the device a weight is laid out
once, where it lives.

Each kernel carries its forward and backward work for the captured batch, the sum of
its nodes' work as each op's record gives it (device/ops/: flops and SRAM bytes, the
bytes the kernel reads and writes in PE memory, for the cost model's roofline).
Which rules see an op is its record's category; the rules below name single ops only
where a pattern needs that op (the scale of attention scores is a mul or a div).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from device.dtypes import BYTES, HALF_PRECISIONS, INTEGERS
from device.ir import Graph, Node
from device.ops import OPS, ops_in
from device.ops.record import Work, per_element
from device.precision import float32_nodes

ACTIVATIONS = ops_in("activation")
ELEMENTWISE = ops_in("elementwise", "activation")
LAYOUT = ops_in("layout")
REDUCTIONS = ops_in("reduction")
MATMULS = ops_in("matmul")
CONVS = ops_in("conv")
POOLS = ops_in("pool")
SOFTMAXES = ops_in("softmax")
LAYER_NORMS = ops_in("layer_norm")
BATCH_NORMS = ops_in("batch_norm")
EMBEDDINGS = ops_in("embedding")
LOSSES = ops_in("loss")

# kinds that take no PEs: they only change how data is laid out between kernels
FREE_KINDS = frozenset({"layout"})


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
    # and masked (an additive mask, then a boolean one), softmax over the keys, optional
    # dropout, then @ v; the T x T scores stay inside
    Rule("attention", MATMULS, (_opt({"mul", "div"}), _opt({"add"}), _opt({"where"}), _one("softmax"),
                                _opt({"dropout"}), _one(*MATMULS)), anchor_weights=False),
    # dense: x @ W (+ bias) (+ activation) (+ dropout)
    Rule("dense", MATMULS, (_opt({"add"}, other_inputs="weights"), _opt(ACTIVATIONS), _opt({"dropout"})),
         anchor_weights=True),
    # a product of two activations outside an attention pattern
    Rule("matmul", MATMULS, anchor_weights=False),
    # conv: conv2d (+ bias add) (+ batch_norm) (+ activation)
    Rule("conv", CONVS, (_opt({"add"}, other_inputs="weights"), _opt(BATCH_NORMS), _opt(ACTIVATIONS))),
    # pooling
    Rule("pool", POOLS),
    # layer norm (+ dropout)
    Rule("layer_norm", LAYER_NORMS, (_opt({"dropout"}),)),
    # batch norm not after a convolution (+ activation)
    Rule("batch_norm", BATCH_NORMS, (_opt(ACTIVATIONS),)),
    # embedding lookup (+ dropout)
    Rule("embedding", EMBEDDINGS, (_opt({"dropout"}),)),
    # softmax cross entropy (+ mean or sum over the batch) (+ a constant scale)
    Rule("softmax_loss", LOSSES, (_opt({"reduce_mean", "reduce_sum"}), _opt({"mul", "div"}, other_inputs="weights"))),
    # (log_)softmax followed by a hand-written negative log likelihood down to the loss
    Rule("softmax_loss", SOFTMAXES, (_one(*(ELEMENTWISE | {"reduce_sum", "reduce_mean"}), repeat=True),),
         needs_reduction=True),
    # a softmax on its own (predictions)
    Rule("softmax", SOFTMAXES),
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
    # the 16-bit format the kernel computes in when the graph is float32 but the model casts the
    # anchor's inputs itself (torch.autocast in its forward, a cast before a matmul); "float32" in a
    # mixed-precision graph when the anchor computes the model's float32 tensors (device/precision.py);
    # "": the graph's
    precision: str = ""

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
    reserved: dict[str, list[Node]] = field(default_factory=dict)  # anchor name -> its attention chain
    reserved_nodes: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.producers = self.graph.producers()
        self.consumers = self.graph.consumers()
        self.weights = set(self.graph.params) | set(self.graph.state) | set(self.graph.constants)
        self.sinks = {self.graph.loss, *self.graph.outputs.values()} - {None}
        self._weight_memo: dict[str, bool] = {}
        self._order = {n.name: i for i, n in enumerate(self.graph.nodes)}
        # a mixed-precision graph's float32 tensors (masks from the batch's integers): device/precision.py
        self.float32 = float32_nodes(self.graph)
        self.float32_values = {v for n in self.graph.nodes if n.name in self.float32 for v in n.outputs}

    def run(self) -> list[Kernel]:
        # attention chains are found first and reserved: a padding mask computed from the
        # batch is an elementwise chain earlier in the graph, which would otherwise take the
        # mask's add or where; each is taken when the walk reaches its anchor
        for node in self.graph.nodes:
            if node.op in RULES[0].anchor and not any(self._weight_derived(v) for v in node.inputs):
                chain = self._extend(node, RULES[0])
                if chain is not None and not any(n.name in self.reserved_nodes for n in chain):
                    self.reserved[node.name] = chain
                    self.reserved_nodes |= {n.name for n in chain}
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
        if node.name in self.reserved:
            self._take(RULES[0].kind, self.reserved.pop(node.name))
            return
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
        self._take("unsupported", [node])  # an op without a record (validation reports it)

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
        if node.name in self.taken or node.op not in step.ops:
            return None
        # a second output (torch's batch norm returns its running statistics, written back
        # to state) joins the chain only if no node reads it: the kernel then updates the
        # state where it lives, as a TF batch norm with one output does
        if any(self.consumers.get(out) or out in self.sinks for out in node.outputs[1:]):
            return None
        if node.name in self.reserved_nodes:  # part of an attention chain
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
        """Does ``node``'s backward pass read its input ``value``? (its record says)

        Asked per position that ``value`` fills, the other positions' values as they are: x * x is
        an activation times an activation (its backward reads x), not x times nothing."""
        record = OPS.get(node.op)
        if record is None:  # an unsupported op: assume it reads everything
            return True
        return any(record.backward_reads(i, all(self._weight_derived(v) for j, v in enumerate(node.inputs) if j != i))
                   for i, v in enumerate(node.inputs) if v == value)

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
        elem = BYTES.get(graph.precision, 4)

        def size(v: str) -> int:  # bytes of a value: the model's float32 tensors at 4 bytes
            return _bytes(graph, v, 4 if v in self.float32_values else elem)

        anchor = _anchor(nodes)
        kernel = Kernel(
            name=name, kind=kind, nodes=[n.name for n in nodes], ops=[n.op for n in nodes],
            params=params, state=state, inputs=inputs, outputs=outputs, batch=batch_size(graph),
            weight_bytes=4 * sum(_numel(graph, v) for v in params),  # fp32 master weights (wafer-facts.md)
            state_bytes=4 * sum(_numel(graph, v) for v in state),
            input_bytes=sum(size(v) for v in inputs),
            stash_bytes=sum(size(v) for v in inputs
                            if any(v in n.inputs and self._backward_reads(n, v) for n in nodes)),
            activation_bytes=sum(size(v) for v in outputs),
            loc=str(anchor.loc),
            precision="float32" if anchor.name in self.float32 else _own_half_precision(graph, anchor),
        )
        if kind in FREE_KINDS:
            return kernel
        for node in nodes:
            record = OPS.get(node.op)
            work = _work(graph, node, elem)
            # an op without a record (validation reports it) counts as one flop per element
            flops, sram = record.cost(work) if record is not None else per_element(1)(work)
            kernel.flops_fwd += flops
            kernel.sram_bytes_fwd += sram
            if record is not None and record.backward_cost is not None:
                flops, sram = record.backward_cost(work)
                kernel.flops_bwd += flops
                kernel.sram_bytes_bwd += sram
            else:
                ratio = record.backward_ratio if record is not None else 1.0
                kernel.flops_bwd += ratio * flops
                kernel.sram_bytes_bwd += ratio * sram
        return kernel


def _own_half_precision(graph: Graph, anchor: Node) -> str:
    """The 16-bit format of every floating input of ``anchor`` in a float32 graph (the model's
    own casts), or "" (the graph's precision applies)."""
    if graph.precision != "float32":
        return ""
    floats = {graph.values[v].dtype for v in anchor.inputs if graph.values[v].dtype not in (*INTEGERS, "bool")}
    return floats.pop() if len(floats) == 1 and next(iter(floats)) in HALF_PRECISIONS else ""


def _anchor(nodes: list[Node]) -> Node:
    """The node a kernel is named after: its first non-layout node."""
    return next((n for n in nodes if n.op not in LAYOUT), nodes[0])


def _numel(graph: Graph, value: str) -> int:
    return math.prod(d or 0 for d in graph.values[value].shape)


def _bytes(graph: Graph, value: str, float_bytes: int) -> int:
    """Bytes of a value on the device: floats in the compute format, others at their size."""
    dtype = graph.values[value].dtype
    # integers and bools at their size; floats (and dtypes validation rejects) in the compute format
    # (a 16-bit value of a float32 graph, the model's own cast, at its 2 bytes)
    size = BYTES[dtype] if dtype in (*INTEGERS, "bool", *HALF_PRECISIONS) else float_bytes
    return _numel(graph, value) * size


def _work(graph: Graph, node: Node, elem: int) -> Work:
    """What the op's cost rule reads of ``node``: its shapes for the captured batch."""
    return Work([graph.values[v].shape for v in node.inputs], [graph.values[v].shape for v in node.outputs],
                node.attrs, elem)

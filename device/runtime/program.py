"""Execute a device IR graph with the numpy kernels: forward, gradients, training steps.

``Program(graph, weights)`` compiles the graph once into a flat plan (each node's kernel,
the slots of its inputs and outputs, what to round and which gradients to compute) and
then runs it on batches:

    forward(batch, training)  ->  {"loss": scalar, **graph.outputs}
    gradients(batch)          ->  (loss, {framework name: gradient})
    train_step(batch, lr)     ->  loss; forward, backward, loss scaling, clipping, update
    eval_step(batch)          ->  forward(batch, training=False)

Gradients are reverse mode over the node list with each op record's gradient
(device/ops/); a value used by several nodes sums their gradients.

Weights are fp32 master copies keyed by framework name (the values of ``graph.params``);
state (batch-norm running statistics) by the values of ``graph.state``. A forward pass
in training mode updates the state, as a framework model in train mode does.

Mixed precision (``graph.precision`` float16, bfloat16 or cb16), as the device computes
(/work/shared/reference/wafer-facts.md): weights stay fp32; every kernel's floating
inputs and outputs are rounded to the 16-bit format at the kernel boundary, and so are
the gradients entering and leaving its backward, while the arithmetic inside a kernel is
float32 (fp32 accumulation). The loss computation (an op whose record is a loss, such
as sparse_softmax_cross_entropy, what follows it, and the node that yields the loss) and
the optimizer stay in fp32; state inputs (running statistics) are not rounded. So do the
model's float32 tensors (masks computed from the batch's integers, what reads them up to the
next matmul: device/precision.py), as under torch.autocast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from device.dtypes import EMULATOR_STORAGE, FLOATS, HALF_PRECISIONS, PRECISIONS, round_to
from device.ir import Graph, Node
from device.ops import OPS
from device.ops.record import Backward, Forward, KernelContext
from device.precision import float32_nodes
from device.runtime.memory import keep_freed_memory
from device.runtime.optimizers import Optimizer
from zoo_base.errors import UserError

# a batch array may be converted within its kind: any float to float, any integer to integer
_ACCEPTED_KINDS = {"f": "f", "i": "iu", "b": "b"}


def _constant(value) -> np.ndarray:
    array = np.asarray(value)
    if np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float32)  # compute stays float32 (float64 would promote)
    return array


@dataclass
class _Step:
    """One node of the plan, resolved to slots in the value table."""

    index: int  # position in the plan (and in the list of saved tensors)
    node: Node
    forward: Forward
    backward: Backward | None
    attrs: dict
    inputs: tuple[int, ...]  # slots in the value table
    outputs: tuple[int, ...]
    state_updates: tuple[tuple[int, str], ...]  # (kernel output index, state framework name)
    compute16: bool  # inputs, outputs and gradients rounded to the 16-bit format
    round_inputs: tuple[int, ...]  # input positions not rounded yet (weights, fp32 values)
    round_outputs: tuple[int, ...]  # output positions of floating values (not running statistics)
    # outputs the IR types 16-bit that round_outputs does not round to their format (a model's own .half() in a
    # float32 graph, a 16-bit value of the loss): rounded to it, with their gradients, as the framework holds them
    typed_outputs: tuple[tuple[int, str], ...] = ()
    needs: tuple[bool, ...] = ()  # per input: does anything upstream want its gradient
    differentiate: bool = False  # is this node on a path from a parameter to the loss


class Program:
    """A compiled training (or eval) step of ``graph`` on numpy, with its own weights."""

    def __init__(self, graph: Graph, weights: dict[str, np.ndarray],
                 state: dict[str, np.ndarray] | None = None, seed: int = 0):
        self.graph = graph
        if graph.precision not in PRECISIONS:
            raise UserError(f"graph precision {graph.precision!r} is not one of {', '.join(PRECISIONS)}")
        self._format = graph.precision
        for node in graph.nodes:
            if node.op not in OPS:
                raise UserError(f"{node.loc}: op {node.op!r} has no kernel on the device")
        names = list(graph.values) + [c for c in graph.constants if c not in graph.values]
        self._slot = {name: i for i, name in enumerate(names)}

        # fp32 master copies, never aliases of the caller's arrays
        self._weights = self._load("weights", weights, graph.params, required=True)
        self._state = self._load("state", state if state is not None else self._default_state(), graph.state,
                                 required=True)
        self._fixed = ([(self._slot[v], self._weights, fw) for v, fw in graph.params.items()]
                       + [(self._slot[v], self._state, fw) for v, fw in graph.state.items()])
        self._constants = [(self._slot[name], _constant(value)) for name, value in graph.constants.items()]
        self._input_slots = [self._slot[name] for name in graph.inputs]
        self._param_slots = [(fw, self._slot[v]) for v, fw in graph.params.items()]

        self._loss_slot = None
        if graph.loss is not None:
            loss_shape = graph.values[graph.loss].shape
            if math.prod(d or 0 for d in loss_shape) != 1:
                raise UserError(f"the loss {graph.loss!r} must be a scalar, its shape is {loss_shape}")
            self._loss_slot = self._slot[graph.loss]
        self._plan = self._compile()
        self._backward_plan = [step for step in reversed(self._plan) if step.differentiate]
        self._rng = np.random.default_rng(seed)
        self.optimizer = Optimizer(graph.optimizer, self._weights) if graph.optimizer else None
        keep_freed_memory()  # the kernels' temporaries reuse freed memory, step after step

    # ------------------------------------------------------------------ compilation

    def _default_state(self) -> dict[str, np.ndarray]:
        """Fresh state: what each op's record says a fresh layer starts at (batch norm's running
        mean 0 and variance 1, as the frameworks), zero elsewhere."""
        state = {fw: np.zeros(self.graph.values[v].shape, np.float32) for v, fw in self.graph.state.items()}
        for node in self.graph.nodes:
            for index, fill in OPS[node.op].fresh_state.items():
                if fill and node.inputs[index] in self.graph.state:
                    state[self.graph.state[node.inputs[index]]][...] = fill
        return state

    def _load(self, what: str, arrays: dict[str, np.ndarray], names: dict[str, str], required: bool):
        """Copy framework-named arrays into fp32 (or the IR's) dtype, checking names and shapes."""
        by_framework = {fw: value for value, fw in names.items()}
        unknown = sorted(set(arrays) - set(by_framework))
        if unknown:
            known = sorted(by_framework)
            raise UserError(f"{what}: {unknown[0]!r} is not a name of this graph (its names: "
                            f"{', '.join(known[:6]) or 'none'}{', ...' if len(known) > 6 else ''})")
        loaded = {}
        for fw, value_name in by_framework.items():
            if fw not in arrays:
                if required:
                    raise UserError(f"{what}: {fw!r} is missing")
                continue
            value = self.graph.values[value_name]
            array = np.asarray(arrays[fw])
            if array.shape != tuple(value.shape):
                raise UserError(f"{what}: {fw!r} has shape {array.shape}, the graph expects {tuple(value.shape)}")
            loaded[fw] = np.array(array, dtype=EMULATOR_STORAGE[value.dtype], copy=True, order="C")
        return loaded

    def _compile(self) -> list[_Step]:
        graph = self.graph
        mixed = self._format in HALF_PRECISIONS
        producers = graph.producers()
        in_loss: set[str] = set()  # nodes of the loss computation (fp32)
        float32 = float32_nodes(graph)  # the model's float32 tensors and what reads them
        rounded: set[str] = set()  # values already held in the 16-bit format
        plan = []
        for index, node in enumerate(graph.nodes):
            record = OPS[node.op]
            if (record.loss or graph.loss in node.outputs
                    or any(producers[i].name in in_loss for i in node.inputs if i in producers)):
                in_loss.add(node.name)
            compute16 = mixed and node.name not in in_loss and node.name not in float32
            floating = [graph.values[v].dtype in FLOATS if v in graph.values else
                        np.issubdtype(np.asarray(graph.constants[v]).dtype, np.floating) for v in node.inputs]
            round_inputs = tuple(i for i, v in enumerate(node.inputs)
                                 if compute16 and floating[i] and v not in rounded and v not in graph.state)
            state_outputs = {out for out, _ in record.state_updates}  # running statistics stay fp32
            round_outputs = tuple(j for j, v in enumerate(node.outputs)
                                  if compute16 and graph.values[v].dtype in FLOATS and j not in state_outputs)
            rounded.update(node.outputs[j] for j in round_outputs)
            typed_outputs = tuple((j, graph.values[v].dtype) for j, v in enumerate(node.outputs)
                                  if graph.values[v].dtype in HALF_PRECISIONS
                                  and not (j in round_outputs and graph.values[v].dtype == self._format))
            state_updates = tuple((out, graph.state[node.inputs[inp]]) for out, inp in record.state_updates
                                  if node.inputs[inp] in graph.state)
            plan.append(_Step(index, node, record.forward, record.backward, node.attrs,
                              tuple(self._slot[v] for v in node.inputs), tuple(self._slot[v] for v in node.outputs),
                              state_updates, compute16, round_inputs, round_outputs, typed_outputs=typed_outputs))
        self._mark_gradients(plan)
        return plan

    def _mark_gradients(self, plan: list[_Step]) -> None:
        """Which nodes the backward pass visits and which input gradients each must give."""
        if self._loss_slot is None:
            return
        # values that depend on a parameter through differentiable kernels
        requires = {self._slot[v] for v in self.graph.params}
        for step in plan:
            if step.backward is not None and any(i in requires for i in step.inputs):
                requires.update(step.outputs)
        # values the loss depends on
        reaches = {self._loss_slot}
        for step in reversed(plan):
            if any(o in reaches for o in step.outputs):
                reaches.update(step.inputs)
        wanted = requires & reaches
        for step in plan:
            step.differentiate = step.backward is not None and any(o in wanted for o in step.outputs)
            step.needs = tuple(i in wanted for i in step.inputs)

    # --------------------------------------------------------------------- running

    def _round(self, x: np.ndarray) -> np.ndarray:
        return round_to(x, self._format)

    def _check_batch(self, batch) -> list[np.ndarray]:
        if len(batch) != len(self.graph.inputs):
            raise UserError(f"the batch has {len(batch)} arrays, the graph takes {len(self.graph.inputs)} "
                            f"({', '.join(self.graph.inputs)})")
        checked = []
        for name, array in zip(self.graph.inputs, batch):
            value = self.graph.values[name]
            array = np.asarray(array)
            if array.ndim != len(value.shape) or any(d not in (None, n) for d, n in zip(value.shape, array.shape)):
                raise UserError(f"batch input {name!r}: expected shape {tuple(value.shape)}, given {array.shape}")
            target = EMULATOR_STORAGE[value.dtype]
            if array.dtype.kind not in _ACCEPTED_KINDS[np.dtype(target).kind]:
                raise UserError(f"batch input {name!r}: expected {value.dtype} values, given {array.dtype}")
            checked.append(array.astype(target, copy=False))
        return checked

    def _forward(self, batch, training: bool):
        """Run the plan; returns the value table, what each kernel saved and state updates."""
        env: list = [None] * len(self._slot)
        for slot, source, name in self._fixed:
            env[slot] = source[name]
        for slot, array in self._constants:
            env[slot] = array
        for slot, array in zip(self._input_slots, self._check_batch(batch)):
            env[slot] = array
        ctx = KernelContext(training=training, rng=self._rng)
        saved: list = [None] * len(self._plan)
        updates = {}
        # overflow and NaN are checked where they matter (the loss, loss scaling), so
        # numpy's warnings on the way there are noise
        with np.errstate(all="ignore"):
            self._run_plan(env, saved, updates, ctx)
        return env, saved, updates

    def _run_plan(self, env, saved, updates, ctx):
        for k, step in enumerate(self._plan):
            inputs = [env[i] for i in step.inputs]
            for i in step.round_inputs:
                inputs[i] = self._round(inputs[i])
            try:
                outputs, saved[k] = step.forward(inputs, step.attrs, ctx)
            except UserError as error:
                raise UserError(f"{step.node.loc}: {error}") from None
            for j in step.round_outputs:
                outputs[j] = self._round(outputs[j])
            for j, fmt in step.typed_outputs:
                outputs[j] = round_to(outputs[j], fmt)
            for slot, output in zip(step.outputs, outputs):
                env[slot] = output
            if ctx.training:
                for out, name in step.state_updates:
                    updates[name] = outputs[out]

    def _backward(self, env, saved, seed: float) -> dict[str, np.ndarray]:
        """Reverse mode from the loss (its gradient is ``seed``, the loss scale)."""
        grads: list = [None] * len(self._slot)
        grads[self._loss_slot] = np.full(np.shape(env[self._loss_slot]), seed, dtype=np.float32)
        with np.errstate(all="ignore"):  # an overflow shows as inf, which loss scaling handles
            self._run_backward(grads, saved)
        return {fw: grads[slot] for fw, slot in self._param_slots if grads[slot] is not None}

    def _run_backward(self, grads, saved):
        for step in self._backward_plan:
            upstream = [grads[o] for o in step.outputs]
            if all(g is None for g in upstream):
                continue
            if step.compute16:
                upstream = [None if g is None else self._round(g) for g in upstream]
            for j, fmt in step.typed_outputs:
                if upstream[j] is not None:
                    upstream[j] = round_to(upstream[j], fmt)
            downstream = step.backward(saved[step.index], upstream, step.attrs, step.needs)
            saved[step.index] = None  # free activations as soon as they are used
            for slot, need, g in zip(step.inputs, step.needs, downstream):
                if not need or g is None:
                    continue
                if step.compute16:
                    g = self._round(g)
                # a value used by several nodes: sum (never in place, g may be shared)
                grads[slot] = g if grads[slot] is None else grads[slot] + g

    def _loss_of(self, env) -> float:
        """The loss as a float: a scalar, or a one-element array (shape (1,) or (1, 1))."""
        return float(np.reshape(env[self._loss_slot], ()))

    def _require_loss(self, what: str):
        if self._loss_slot is None:
            raise UserError(f"{what} needs a loss, and the graph has none")

    # ------------------------------------------------------------------ public API

    def forward(self, batch: list[np.ndarray], training: bool) -> dict[str, np.ndarray]:
        env, _, updates = self._forward(batch, training)
        self._state.update(updates)
        result = {name: np.array(env[self._slot[value]]) for name, value in self.graph.outputs.items()}
        if self._loss_slot is not None:
            result["loss"] = np.asarray(env[self._loss_slot], dtype=np.float32).reshape(())
        return result

    def values(self, batch: list[np.ndarray], training: bool) -> dict[str, np.ndarray]:
        """Every value of a forward pass by its IR name (inputs, weights, each node's outputs), as the
        kernels computed them; the state is left as it was (numerics tools: tests/gallery/forward_error.py)."""
        env, _, _ = self._forward(batch, training)
        return {name: env[slot] for name, slot in self._slot.items() if env[slot] is not None}

    def eval_step(self, batch: list[np.ndarray]) -> dict[str, np.ndarray]:
        return self.forward(batch, training=False)

    def gradients(self, batch: list[np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and d loss / d weight for the weights the loss depends on (training mode).

        A weight the loss does not depend on has no entry, as torch leaves its .grad None.
        """
        self._require_loss("gradients")
        env, saved, updates = self._forward(batch, training=True)
        self._state.update(updates)
        grads = self._backward(env, saved, 1.0)
        return self._loss_of(env), {fw: np.array(g, dtype=np.float32) for fw, g in grads.items()}

    def train_step(self, batch: list[np.ndarray], lr: float) -> float:
        """One optimizer step at learning rate ``lr``; returns the loss of this batch.

        A non-finite loss is returned without touching weights, state or optimizer (the
        runner stops the run); with loss scaling, a non-finite gradient skips the update
        and lowers the scale (see device/runtime/optimizers.py), without it raises
        NonFiniteGradient before any weight or state changes.
        """
        self._require_loss("train_step")
        if self.optimizer is None:
            raise UserError("train_step needs an optimizer, and the graph has none")
        env, saved, updates = self._forward(batch, training=True)
        loss = self._loss_of(env)
        if not math.isfinite(loss):
            return loss
        grads = self._backward(env, saved, self.optimizer.loss_scale)
        self.optimizer.apply_gradients(self._weights, grads, lr)
        self._state.update(updates)
        return loss

    # ------------------------------------------------------- weights, state, optimizer

    def get_weights(self) -> dict[str, np.ndarray]:
        return {fw: w.copy() for fw, w in self._weights.items()}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Overwrite some or all weights (copied in place: the optimizer keeps its slots)."""
        for fw, array in self._load("weights", weights, self.graph.params, required=False).items():
            np.copyto(self._weights[fw], array)

    def get_state(self) -> dict[str, np.ndarray]:
        return {fw: s.copy() for fw, s in self._state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._state.update(self._load("state", state, self.graph.state, required=False))

    def get_optimizer_state(self) -> dict:
        """Per framework name {"m", "v"} or {"momentum"}; "step"; "loss_scale" (copies)."""
        if self.optimizer is None:
            raise UserError("the graph has no optimizer, so there is no optimizer state")
        return self.optimizer.state_dict()

    def set_optimizer_state(self, state: dict) -> None:
        if self.optimizer is None:
            raise UserError("the graph has no optimizer, so there is no optimizer state to set")
        self.optimizer.load_state_dict(state)

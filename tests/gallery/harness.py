"""One run of a gallery entry, per library: validate, compile, then train on the emulator next to
the framework, measuring how far apart the two are and how far the framework is from itself.

What is compared (fp32):

    loss_err    the first step's loss, relative
    grad_err    every gradient of that step: max |emulator - framework| / max |framework|, per
                weight, the worst weight
    steps_err   the loss of each of STEPS optimizer steps (SGD with momentum), relative, the worst
    mixed_err   the first step's loss in mixed precision (bfloat16 compute) against the framework's
                fp32; mixed_steps_err the worst of the STEPS steps
    framework_mixed_err   the framework's own mixed precision (Keras' "mixed_bfloat16" policy,
                torch.autocast on the CPU in bfloat16), the same weights and batch, against its fp32:
                how far bfloat16 itself moves this model's loss; mixed_to_framework the emulator's
                bfloat16 first loss against the framework's bfloat16 one

and beside them the noise floor: the same quantities between two framework runs that differ
only in the order of the examples in each batch (reversed), so in the order of their sums: the
same function, rounded otherwise. In every run of a torch entry (the quick one over its first
step) and in the full run of a Keras one, a second floor, exact_floor: how far the framework's fp32 gradients are from its float64 ones (the same
weights and batch; torch's model.double() under float64.Float64Only, which keeps in float64 what a
model casts to float32, as transformers' CTC loss and RMSNorms do; Keras' "float64" policy), the
worst of its three fp32 runs
(the batch as is, reversed, and on one thread: the same kernels, their sums split otherwise), and exact_err, the emulator's gradients against those float64 ones;
the same for the first loss and the STEPS losses (exact_loss_floor, exact_steps_floor; the
framework's STEPS steps run in float64 too). Where the model is ill-conditioned both fp32 runs are
far from the exact values while close to each other, and the reversed batch understates what fp32
can do. Where an activation sits within fp32's error of a kink (ReLU6 at 0) the side it lands on is
the sum order's: torch's own channels_last run of torchvision's MobileNetV2 is 5.4e-2 from float64,
as the emulator, its NCHW run 7.3e-3; channels_last is not a floor here, its batch norm is 10x less
accurate than NCHW's and it puts ResNet-18's at 2.2e-1 (tests/gallery/README.md). Deep networks
with batch norm over small maps (every ImageNet model at 32x32 or 64x64) amplify such differences
(device/README.md, "How close"); the floor says how much of a gap is the framework's own.

Timings are wall-clock on this machine; samples/s are the compile's estimates for wse2 and wse3.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import numpy as np

from device.api import compile_graph, validate_graph
from device.errors import DeviceCompileError
from device.runtime.program import Program
from tests.gallery.registry import Entry

STEPS = 3
LR = 0.001
MOMENTUM = 0.9
PROFILES = ("wse2", "wse3")


@dataclass
class Result:
    entry: Entry
    ops: int = 0  # IR nodes captured
    op_kinds: int = 0  # distinct IR ops among them
    unsupported: list[str] = field(default_factory=list)  # one line per refusal (op: message)
    validate_s: float = 0.0  # capture and validation
    compile_s: float = 0.0  # match, place, cost, for the first profile
    samples_per_s: dict[str, str] = field(default_factory=dict)  # profile -> "12.3k (pipelined)"
    eager_step_s: float = 0.0
    emulator_step_s: float = 0.0
    loss_err: float = 0.0
    grad_err: float = 0.0
    grad_worst: str = ""  # the weight with grad_err
    steps_err: float | None = None  # None: the first step only (the quick run)
    grad_floor: float = 0.0
    loss_floor: float = 0.0  # the first step's loss, framework against framework (batch reversed)
    steps_floor: float = 0.0
    mixed_err: float | None = None  # the first step's loss in mixed precision, relative to fp32's
    mixed_steps_err: float | None = None  # the worst of STEPS steps
    framework_mixed_err: float | None = None  # the framework's own bfloat16 first loss, relative to its fp32
    mixed_to_framework: float | None = None  # the emulator's bfloat16 first loss, relative to the framework's
    exact_floor: float | None = None  # the framework's fp32 first-step gradients against its float64 ones (grad_gap),
    # the worst of its three runs (the batch as is, reversed, on one thread)
    exact_err: float | None = None  # the emulator's against the framework's float64 ones
    exact_worst: str = ""  # the weight with exact_floor
    # the same for the losses (the framework's STEPS steps run in float64 too): its fp32 first loss and
    # worst step against its float64 ones, and the emulator's
    exact_loss_floor: float | None = None
    exact_loss_err: float | None = None
    exact_steps_floor: float | None = None
    exact_steps_err: float | None = None
    losses: list[float] = field(default_factory=list)  # the framework's, per step

    @property
    def ratio(self) -> float:
        return self.emulator_step_s / self.eager_step_s if self.eager_step_s else float("nan")


def batches(entry: Entry, layout: str, count: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(images, labels) per step: class ids (N,) or per-pixel class ids (N, H, W)."""
    rng = np.random.default_rng(seed)
    n, s = entry.batch, entry.size
    shape = (n, 3, s, s) if layout == "NCHW" else (n, s, s, 3)
    label_shape = (n, s, s) if entry.task == "segment" else (n,)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, entry.classes, label_shape))
            for _ in range(count)]


def relative(got: float, expected: float) -> float:
    return abs(got - expected) / max(abs(expected), 1e-30)


# A weight whose gradient is this much smaller than the model's largest is measured against that
# floor instead: the shift of a batch norm that another batch norm follows (MobileNet's projection
# blocks) has a gradient of exactly zero in exact arithmetic, so what both sides hold is rounding
# (MobileNetV3-small's features.1.block.2.1.bias: 1e-6 of the largest on either side, apart by 2e-8)
SMALLEST_SCALE = 1e-2


def grad_gap(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> tuple[float, str]:
    """The worst weight's max |got - expected| / max |expected| (a weight without gradient on one side: inf)."""
    worst, name = 0.0, ""
    largest = max(float(np.max(np.abs(ref))) for ref in expected.values())
    for key, ref in expected.items():
        if key not in got:
            return float("inf"), f"{key} (no gradient)"
        scale = max(float(np.max(np.abs(ref))), SMALLEST_SCALE * largest) or 1.0
        gap = float(np.max(np.abs(got[key] - ref))) / scale
        if not np.isfinite(gap):  # NaN would compare as no gap at all
            return float("inf"), f"{key} (not finite)"
        if gap > worst:
            worst, name = gap, key
    return worst, name


def _exact(result: Result, fp32_grads: tuple[dict[str, np.ndarray], ...], other_losses: tuple[list[float], ...],
           grads: dict[str, np.ndarray], loss0: float, steps: list[float], exact_grads: dict[str, np.ndarray],
           exact_losses: list[float]) -> None:
    """The float64 floors: the framework's fp32 first-step gradients (``fp32_grads``: its runs with the
    batch as is, reversed, and on one thread; the worst counts) and losses (result.losses and
    ``other_losses``), and the emulator's (``grads``, ``loss0``, ``steps``), against the framework's
    float64 run (the same weights and batches)."""
    result.exact_floor, result.exact_worst = max(grad_gap(g, exact_grads) for g in fp32_grads)
    runs = (result.losses, *other_losses)
    result.exact_loss_floor = max(relative(run[0], exact_losses[0]) for run in runs)
    result.exact_loss_err = relative(loss0, exact_losses[0])
    result.exact_steps_floor = max(relative(a, b) for run in runs for a, b in zip(run, exact_losses))
    result.exact_steps_err = max(relative(a, b) for a, b in zip(steps, exact_losses))
    result.exact_err, _ = grad_gap(grads, exact_grads)


def _validate(result: Result, graph) -> bool:
    report = validate_graph(graph, mode="train", profile_name=PROFILES[0])
    result.ops = len(graph.nodes)
    result.op_kinds = len({n.op for n in graph.nodes})
    result.unsupported = [f"{f.framework_op or f.kind}: {f.message}" for f in report.errors]
    return report.ok


def _compile(result: Result, graph) -> None:
    for profile in PROFILES:
        start = time.perf_counter()
        for mode in ("pipelined", "weight_streaming"):  # the first that fits
            try:
                compiled = compile_graph(graph, mode="train", profile_name=profile, execution_mode=mode)
            except DeviceCompileError:
                continue
            result.samples_per_s[profile] = f"{compiled.cost.samples_per_s:,.0f} ({mode.replace('_', ' ')})"
            break
        else:
            result.samples_per_s[profile] = "does not fit"
        if profile == PROFILES[0]:
            result.compile_s = time.perf_counter() - start


def _mixed(result: Result, losses: list[float], framework_losses: list[float]) -> None:
    """``losses``: the emulator's in bfloat16; ``framework_losses``: the framework's own in bfloat16."""
    result.mixed_err = relative(losses[0], result.losses[0])
    result.mixed_steps_err = max(relative(a, b) for a, b in zip(losses, result.losses))
    result.framework_mixed_err = relative(framework_losses[0], result.losses[0])
    result.mixed_to_framework = relative(losses[0], framework_losses[0])


def _steps_on(program: Program, data) -> tuple[list[float], float]:
    losses, start = [], time.perf_counter()
    for batch in data:
        losses.append(program.train_step(list(batch), LR))
    return losses, (time.perf_counter() - start) / len(data)


# ------------------------------------------------------------------------------ PyTorch


def _torch_batches_and_loss(entry: Entry, count: int):
    """(batches of tensors, model -> step -> loss): images and cross entropy, or for transformers the
    keyword arguments of the entry's inputs and the model's own loss."""
    import torch
    import torch.nn.functional as F

    if entry.inputs is not None:
        arrays = entry.inputs(count)
        keys = list(arrays[0])
        return ([tuple(torch.from_numpy(b[k]) for k in keys) for b in arrays],
                lambda m: lambda batch: m(**dict(zip(keys, batch))).loss)
    data = [tuple(torch.from_numpy(a) for a in b) for b in batches(entry, "NCHW", count)]
    if entry.task == "segment":
        return data, lambda m: lambda batch: F.cross_entropy(m(batch[0])["out"], batch[1])
    return data, lambda m: lambda batch: F.cross_entropy(m(batch[0]), batch[1])


def run_torch(entry: Entry, full: bool = True) -> Result:
    """Validate, compile, the first step against torch; with ``full``, STEPS steps and mixed precision too."""
    import torch

    from device.capture.torch import capture, state_of, weights_of
    from tests.gallery.float64 import Float64Only

    result = Result(entry)
    torch.manual_seed(0)
    model = entry.build(False)
    twins = {k: copy.deepcopy(model) for k in ("floor", "one", "mixed", "autocast", "exact")}  # the same initial weights
    data, step_of = _torch_batches_and_loss(entry, STEPS if full else 1)

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)

    start = time.perf_counter()
    optimizer = sgd(model)
    graph = capture(step_of(model), model, data[0], optimizer=optimizer)
    ok = _validate(result, graph)
    result.validate_s = time.perf_counter() - start
    if not ok:
        return result
    _compile(result, graph)
    numpy_data = [[t.numpy() for t in b] for b in data]
    # copies: the framework's steps below write into its tensors, which the arrays may share
    initial_weights = {k: v.copy() for k, v in weights_of(model, graph).items()}
    initial_state = {k: v.copy() for k, v in state_of(model, graph).items()}

    # the first step: loss and every gradient
    program = Program(graph, initial_weights, initial_state, seed=0)
    start = time.perf_counter()
    loss, grads = program.gradients(numpy_data[0])
    result.emulator_step_s = time.perf_counter() - start

    def framework_run(m, reverse: bool, autocast: bool = False, double: bool = False):
        """(losses, first-step gradients by name, seconds per step) of the SGD steps; ``reverse``: each
        batch's examples in reverse order (the same sums, added in another order); ``autocast``: in
        torch's own mixed precision (bfloat16 on the CPU); ``double``: ``m`` is in float64, so are the inputs."""
        step, opt, losses, first, start = step_of(m), sgd(m), [], None, time.perf_counter()
        for batch in data:
            if double:
                batch = [t.double() if t.is_floating_point() else t for t in batch]
            opt.zero_grad()
            # float64: also where the model asks for float32 (transformers' CTC log_softmax, Llama's RMSNorm)
            with (Float64Only() if double else contextlib.nullcontext()), \
                    torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                value = step([t.flip(0) for t in batch] if reverse else batch)
            value.backward()
            if first is None:
                first = {k: p.grad.numpy().copy() for k, p in m.named_parameters() if p.grad is not None}
            opt.step()
            losses.append(value.item())
        return losses, first, (time.perf_counter() - start) / len(data)

    result.losses, expected_grads, eager_s = framework_run(model, False)
    floor_losses, floor_grads, floor_s = framework_run(twins["floor"], True)
    result.eager_step_s = min(eager_s, floor_s)  # the first run pays torch's one-time set-up
    result.loss_err = relative(loss, result.losses[0])
    result.grad_err, result.grad_worst = grad_gap(grads, expected_grads)
    result.grad_floor, _ = grad_gap(floor_grads, expected_grads)
    result.loss_floor = relative(floor_losses[0], result.losses[0])
    result.steps_floor = max(relative(a, b) for a, b in zip(floor_losses, result.losses))

    if full:
        program = Program(graph, initial_weights, initial_state, seed=0)
        got, result.emulator_step_s = _steps_on(program, numpy_data)
        result.steps_err = max(relative(a, b) for a, b in zip(got, result.losses))

    # the float64 floors, over the steps run: all STEPS in the full run, the first step in the quick one (whose
    # judgement of the first step's gradients is then the full run's: a sum order that an AVX2 and an AVX-512
    # machine split otherwise moves a gradient by more than the reversed batch shows)
    exact_losses, exact_grads, _ = framework_run(twins["exact"].double(), False, double=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # another sum order of the same kernels
    try:
        one_losses, one_grads, _ = framework_run(twins["one"], False)
    finally:
        torch.set_num_threads(threads)
    _exact(result, (expected_grads, floor_grads, one_grads), (floor_losses, one_losses), grads, loss,
           got if full else [loss], exact_grads, exact_losses)

    if full and entry.mixed:
        mixed = twins["mixed"]
        graph16 = capture(step_of(mixed), mixed, data[0], optimizer=sgd(mixed), precision="bfloat16")
        program16 = Program(graph16, weights_of(mixed, graph16), state_of(mixed, graph16), seed=0)
        _mixed(result, _steps_on(program16, numpy_data)[0], framework_run(twins["autocast"], False, True)[0])
    return result


def validate_torch_defaults(entry: Entry) -> list[str]:
    """The refusals of the model as the library builds it (dropout and stochastic depth on)."""
    import torch

    from device.capture.torch import capture

    torch.manual_seed(0)
    model = entry.build(True)
    data, step_of = _torch_batches_and_loss(entry, 1)
    graph = capture(step_of(model), model, list(data[0]))
    result = Result(entry)
    _validate(result, graph)
    return result.unsupported


# --------------------------------------------------------------------------- TensorFlow


def _keras_graph(entry: Entry, dropout: bool, policy: str = "float32"):
    """A TF1 graph as the Estimator runner builds one from a model_fn: (graph, x, y, loss, train_op,
    [(variable, gradient)], initializer); ``policy``: Keras' dtype policy while the model is built
    ("mixed_bfloat16": its own mixed precision, the logits cast back to float32 for the loss;
    "float64": the exact gradients' stand-in, the loss in float64 too)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, (entry.batch, entry.size, entry.size, 3))
        y = v1.placeholder(tf.int32, (entry.batch,))
        tf.keras.mixed_precision.set_global_policy(policy)
        try:
            logits = tf.cast(entry.build(dropout)(x, training=True), tf.float64 if policy == "float64" else tf.float32)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        variables = v1.trainable_variables()
        grads = tf.gradients(loss, variables)
        optimizer = v1.train.MomentumOptimizer(LR, MOMENTUM)
        train_op = optimizer.apply_gradients(list(zip(grads, variables)), v1.train.get_or_create_global_step())
        init = v1.global_variables_initializer()
    return graph, x, y, loss, train_op, list(zip(variables, grads)), init


def run_keras(entry: Entry, full: bool = True) -> Result:
    """Validate, compile, the first step against TF; with ``full``, STEPS steps and mixed precision too."""
    import tensorflow as tf

    from device.capture import tf as capture_tf
    from device.capture.tf.tensors import variable_name

    v1 = tf.compat.v1
    result = Result(entry)
    start = time.perf_counter()
    tf_graph, x, y, loss, train_op, grads_of, init = _keras_graph(entry, dropout=False)
    graph = capture_tf.capture(tf_graph, inputs=[x, y], loss=loss, train_op=train_op)
    ok = _validate(result, graph)
    result.validate_s = time.perf_counter() - start
    if not ok:
        return result
    _compile(result, graph)
    data = batches(entry, "NHWC", STEPS if full else 1)
    grad_names = {variable_name(v): g for v, g in grads_of if g is not None}

    with v1.Session(graph=tf_graph) as sess:
        sess.run(init)
        with tf_graph.as_default():  # one op that puts every variable back to its initial value
            every = v1.global_variables()
            initial = sess.run(every)
            restore = tf.group(*[v.assign(value) for v, value in zip(every, initial)])
            initial_by_name = {v.name: value for v, value in zip(every, initial)}
        weights, state = capture_tf.read_weights(sess, graph), capture_tf.read_state(sess, graph)

        start = time.perf_counter()
        loss0, grads = Program(graph, weights, state, seed=0).gradients(list(data[0]))
        result.emulator_step_s = time.perf_counter() - start

        def framework_run(reverse: bool):
            sess.run(restore)
            losses, grads_first, start = [], None, time.perf_counter()
            for images, labels in data:
                feed = {x: images[::-1], y: labels[::-1]} if reverse else {x: images, y: labels}
                if grads_first is None:
                    grads_first = dict(zip(grad_names, sess.run(list(grad_names.values()), feed)))
                losses.append(float(sess.run([loss, train_op], feed)[0]))
            return losses, grads_first, (time.perf_counter() - start) / len(data)

        framework_run(False)  # a first run builds and optimises TF's kernels: not timed
        result.losses, expected_grads, eager_s = framework_run(False)
        floor_losses, floor_grads, floor_s = framework_run(True)
        result.eager_step_s = min(eager_s, floor_s)
    result.loss_err = relative(loss0, result.losses[0])
    result.grad_err, result.grad_worst = grad_gap(grads, expected_grads)
    result.grad_floor, _ = grad_gap(floor_grads, expected_grads)
    result.loss_floor = relative(floor_losses[0], result.losses[0])
    result.steps_floor = max(relative(a, b) for a, b in zip(floor_losses, result.losses))

    if full:
        got, result.emulator_step_s = _steps_on(Program(graph, weights, state, seed=0), data)
        result.steps_err = max(relative(a, b) for a, b in zip(got, result.losses))
        exact_losses, exact_grads = _keras_run(entry, data, initial_by_name, "float64")
        one_losses, one_grads = _keras_run(entry, data, initial_by_name, "float32", threads=1)
        _exact(result, (expected_grads, floor_grads, one_grads), (floor_losses, one_losses), grads, loss0, got,
               exact_grads, exact_losses)
    if full and entry.mixed:
        graph16 = capture_tf.capture(tf_graph, inputs=[x, y], loss=loss, train_op=train_op, precision="bfloat16")
        _mixed(result, _steps_on(Program(graph16, weights, state, seed=0), data)[0],
               _keras_mixed_losses(entry, data, initial_by_name))
    return result


def _keras_under(entry: Entry, policy: str, initial_by_name: dict[str, np.ndarray], threads: int = 0):
    """The entry built under Keras' dtype ``policy``, in a session that holds the fp32 run's initial values
    (by variable name) and runs its ops on ``threads`` threads (0: TF's choice):
    (session, x, y, loss, train_op, [(variable, gradient)])."""
    import tensorflow as tf

    v1 = tf.compat.v1
    tf_graph, x, y, loss, train_op, grads_of, init = _keras_graph(entry, dropout=False, policy=policy)
    config = v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    sess = v1.Session(graph=tf_graph, config=config)
    sess.run(init)
    with tf_graph.as_default():
        every = v1.global_variables()
        missing = [v.name for v in every if v.name not in initial_by_name]
        if missing:  # the two builds must hold the same variables
            raise ValueError(f"{entry.id}: the {policy} build has variables the fp32 one has not: {missing[:3]}")
        values = [v1.placeholder(v.dtype.base_dtype, v.shape) for v in every]
        sess.run([v.assign(value) for v, value in zip(every, values)],
                 {value: initial_by_name[v.name] for v, value in zip(every, values)})
    return sess, x, y, loss, train_op, grads_of


def _keras_mixed_losses(entry: Entry, data, initial_by_name: dict[str, np.ndarray]) -> list[float]:
    """The losses of the SGD steps in Keras' own mixed precision ("mixed_bfloat16": bfloat16 compute,
    float32 variables), from the fp32 run's initial values on the same batches."""
    sess, x, y, loss, train_op, _ = _keras_under(entry, "mixed_bfloat16", initial_by_name)
    with sess:
        return [float(sess.run([loss, train_op], {x: images, y: labels})[0]) for images, labels in data]


def _keras_run(entry: Entry, data, initial_by_name: dict[str, np.ndarray], policy: str, threads: int = 0):
    """The SGD steps under Keras' dtype ``policy`` ("float64": the exact run's stand-in) on ``threads`` threads,
    from the fp32 run's initial values on the same batches: (losses, the first step's gradients by variable
    name as the capture names them)."""
    from device.capture.tf.tensors import variable_name

    sess, x, y, loss, train_op, grads_of = _keras_under(entry, policy, initial_by_name, threads)
    with sess:
        named = {variable_name(v): g for v, g in grads_of if g is not None}
        first = dict(zip(named, sess.run(list(named.values()), {x: data[0][0], y: data[0][1]})))
        losses = [float(sess.run([loss, train_op], {x: images, y: labels})[0]) for images, labels in data]
        return losses, first


def validate_keras_defaults(entry: Entry) -> list[str]:
    from device.capture import tf as capture_tf

    tf_graph, x, y, loss, train_op, _, _ = _keras_graph(entry, dropout=True)
    result = Result(entry)
    _validate(result, capture_tf.capture(tf_graph, inputs=[x, y], loss=loss, train_op=train_op))
    return result.unsupported


RUNNERS = {"torchvision": run_torch, "keras": run_keras, "transformers": run_torch}
DEFAULTS = {"torchvision": validate_torch_defaults, "keras": validate_keras_defaults,
            "transformers": validate_torch_defaults}

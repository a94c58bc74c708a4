"""python -m tests.gallery.forward_error ENTRY: per layer, how far the emulator's fp32 forward is from
the framework's float64 forward, beside how far the framework's own fp32 forward is from it.

The first training step of a torchvision or Keras gallery entry (the weights and batch of harness.py),
every convolution, batch norm and ReLU6 output (all activations of the layer, all examples):

    fw max, fw rms     the framework's fp32 layer output against its float64 one: max |fp32 - fp64| /
                       max |fp64|, and rms(fp32 - fp64) / rms(fp64)
    emu max, emu rms   the same for the emulator's fp32 value of that layer

The layers are paired by kind and order (the n-th convolution of the framework with the emulator's
n-th conv2d node, and so on), their shapes checked. An emulator whose errors stay within a small
factor of the framework's, layer by layer, computes the forward as accurately as fp32 does; the last
line gives the worst ratio of the two rms errors over the layers, and each side's geometric mean.
One library per process (torch first where both are installed).
"""

from __future__ import annotations

import copy
import math
import sys

import numpy as np

# the framework's layer kinds and the IR ops they lower to (ReLU6: clamp to [0, 6])
KINDS = {"conv": ("conv2d",), "batch_norm": ("batch_norm",), "relu6": ("clamp",)}


def errors(got: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """(max |got - exact| / max |exact|, rms(got - exact) / rms(exact)), in float64."""
    diff = got.astype(np.float64) - exact
    scale_max = float(np.max(np.abs(exact))) or 1.0
    scale_rms = math.sqrt(float(np.mean(exact * exact))) or 1.0
    return float(np.max(np.abs(diff))) / scale_max, math.sqrt(float(np.mean(diff * diff))) / scale_rms


def emulator_layers(program, batch) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The emulator's fp32 output of every node of KINDS, per kind in plan order: (node name, value)."""
    values = program.values(batch, training=True)
    layers = {kind: [] for kind in KINDS}
    for node in program.graph.nodes:
        for kind, ops in KINDS.items():
            if node.op in ops:
                layers[kind].append((node.name, values[node.outputs[0]]))
    return layers


def pair(framework: dict, emulator: dict) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """(kind, layer name, framework fp32, framework float64, emulator fp32) in the framework's order."""
    rows = []
    for kind in KINDS:
        ours, theirs = emulator[kind], framework[kind]
        if len(ours) != len(theirs):
            raise SystemExit(f"error: {len(theirs)} {kind} layers in the framework, {len(ours)} in the emulator's graph")
        for (name, fp32, fp64), (_, emu) in zip(theirs, ours):
            if emu.shape != fp32.shape:
                raise SystemExit(f"error: {kind} {name}: the framework's output is {fp32.shape}, "
                                 f"the emulator's {emu.shape}")
            rows.append((kind, name, fp32, fp64, emu))
    return rows


def torch_layers(entry):
    """(framework layers per kind: [(module name, fp32 output, float64 output)], emulator layers per kind)."""
    import torch
    import torch.nn.functional as F

    from device.capture.torch import capture, state_of, weights_of
    from device.runtime.program import Program
    from tests.gallery.harness import batches

    torch.manual_seed(0)
    model = entry.build(False)
    exact = copy.deepcopy(model).double()
    images, labels = (torch.from_numpy(a) for a in batches(entry, "NCHW", 1)[0])
    graph = capture(lambda batch: F.cross_entropy(model(batch[0]), batch[1]), model, (images, labels),
                    optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    program = Program(graph, {k: v.copy() for k, v in weights_of(model, graph).items()},
                      {k: v.copy() for k, v in state_of(model, graph).items()}, seed=0)
    emulator = emulator_layers(program, [images.numpy(), labels.numpy()])

    types = {"conv": torch.nn.Conv2d, "batch_norm": torch.nn.BatchNorm2d, "relu6": torch.nn.ReLU6}

    def outputs(m, x):
        seen = {kind: [] for kind in KINDS}
        hooks = [module.register_forward_hook(lambda mod, args, out, kind=kind, name=name:
                                              seen[kind].append((name, out.detach().numpy().copy())))
                 for name, module in m.named_modules() for kind, t in types.items() if isinstance(module, t)]
        with torch.no_grad():
            m(x)
        for hook in hooks:
            hook.remove()
        return seen

    fp32, fp64 = outputs(model, images), outputs(exact, images.double())
    framework = {kind: [(name, a, b) for (name, a), (_, b) in zip(fp32[kind], fp64[kind])] for kind in KINDS}
    return framework, emulator


def keras_layers(entry):
    """As torch_layers, for a Keras entry (NHWC): the layer outputs of the TF1 graph harness.py builds."""
    import tensorflow as tf

    from device.capture import tf as capture_tf
    from tests.gallery.harness import _keras_graph, _keras_under, batches
    from device.runtime.program import Program

    v1 = tf.compat.v1
    images, labels = batches(entry, "NHWC", 1)[0]
    tf_graph, x, y, loss, train_op, _, init = _keras_graph(entry, dropout=False)
    graph = capture_tf.capture(tf_graph, inputs=[x, y], loss=loss, train_op=train_op)
    def kind_of(op) -> str | None:
        """Keras 3 builds batch norm from TF ops, x * (gamma * rsqrt(var + eps)) + (beta - mean * ...): its
        output is the AddV2 ``<layer>/batchnorm/add_1``."""
        if op.name.startswith("gradients"):
            return None
        if op.type in ("Conv2D", "DepthwiseConv2dNative"):
            return "conv"
        if op.type == "AddV2" and op.name.endswith("/batchnorm/add_1"):
            return "batch_norm"
        return "relu6" if op.type == "Relu6" else None

    def layer_tensors(g):
        """Per kind, in graph order: (layer name, the op's output) of the forward layers of KINDS."""
        found = {kind: [] for kind in KINDS}
        for op in g.get_operations():
            if kind_of(op):
                found[kind_of(op)].append((op.name.split("/")[1], op.outputs[0]))
        return found

    with v1.Session(graph=tf_graph) as sess:
        sess.run(init)
        with tf_graph.as_default():
            every = v1.global_variables()
            initial_by_name = {v.name: value for v, value in zip(every, sess.run(every))}
        weights, state = capture_tf.read_weights(sess, graph), capture_tf.read_state(sess, graph)
        found = layer_tensors(tf_graph)
        fp32 = {kind: [(name, value) for (name, _), value in
                       zip(found[kind], sess.run([t for _, t in found[kind]], {x: images, y: labels}))]
                for kind in KINDS}
    emulator = emulator_layers(Program(graph, weights, state, seed=0), [images, labels])
    sess64, x64, y64, *_ = _keras_under(entry, "float64", initial_by_name)
    with sess64:
        found64 = layer_tensors(sess64.graph)
        fp64 = {kind: sess64.run([t for _, t in found64[kind]], {x64: images, y64: labels}) for kind in KINDS}
    framework = {kind: [(name, a, b) for (name, a), b in zip(fp32[kind], fp64[kind])] for kind in KINDS}
    return framework, emulator


def main(names: list[str]) -> int:
    from tests.gallery.registry import ENTRIES

    if len(names) != 1 or names[0] not in ENTRIES or ENTRIES[names[0]].library not in ("torchvision", "keras"):
        choices = ", ".join(k for k, e in ENTRIES.items() if e.library in ("torchvision", "keras"))
        print(f"error: give one torchvision or Keras gallery entry (one of {choices})", file=sys.stderr)
        return 2
    entry = ENTRIES[names[0]]
    if entry.library == "torchvision":
        import torch  # noqa: F401  (before anything that imports tensorflow)
        framework, emulator = torch_layers(entry)
    else:
        framework, emulator = keras_layers(entry)
    print(f"{entry.id}: per layer, fp32 output against the framework's float64 (max, rms relative)")
    print(f"{'layer':<48} {'fw max':>8} {'emu max':>8} {'fw rms':>8} {'emu rms':>8} {'ratio':>6}")
    ratios, fw_logs, emu_logs = [], [], []
    for kind, name, fp32, fp64, emu in pair(framework, emulator):
        fw_max, fw_rms = errors(fp32, fp64)
        emu_max, emu_rms = errors(emu, fp64)
        ratio = emu_rms / max(fw_rms, 1e-30)
        ratios.append((ratio, name))
        fw_logs.append(math.log(max(fw_rms, 1e-30)))
        emu_logs.append(math.log(max(emu_rms, 1e-30)))
        print(f"{kind + ' ' + name:<48} {fw_max:8.1e} {emu_max:8.1e} {fw_rms:8.1e} {emu_rms:8.1e} {ratio:6.2f}")
    worst, worst_name = max(ratios)
    print(f"{len(ratios)} layers; rms error geometric mean: framework {math.exp(np.mean(fw_logs)):.1e}, "
          f"emulator {math.exp(np.mean(emu_logs)):.1e}; worst emulator / framework rms {worst:.2f} ({worst_name}); "
          f"median {float(np.median([r for r, _ in ratios])):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Parity per family block, vision: a ResNet basic block and a bottleneck block with batch norm,
and a UNet down/up block with a transposed convolution, an upsample and a BCE loss, each
written in PyTorch and in Keras (a TF1 graph, as the TF runner builds one).

Each validates and compiles for the device, then trains 5 Adam steps on the emulator
next to the framework: the fp32 loss within 1e-4 relative of the framework's at every
step, and within 2e-2 in mixed precision (bfloat16). Feature maps stay at 4x4 or larger:
batch norm over 1x1 or 2x2 maps is chaotic in fp32 (device/README.md, "How close").
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # torch before tensorflow in one process
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError:
    torch = None
try:
    import tensorflow as tf
except ImportError:
    tf = None

from device.api import compile_graph, validate_graph  # noqa: E402
from device.runtime.program import Program  # noqa: E402

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_tf = pytest.mark.skipif(tf is None, reason="tensorflow is not installed")

STEPS = 5
LR = 1e-3
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
CLASSES = 5


def classification_batches(seed: int, layout: str):
    """(images (4, 3, 8, 8) or (4, 8, 8, 3), class ids) for each step."""
    rng = np.random.default_rng(seed)
    shape = (4, 3, 8, 8) if layout == "NCHW" else (4, 8, 8, 3)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, CLASSES, 4)) for _ in range(STEPS)]


def segmentation_batches(seed: int, layout: str):
    """(images (2, 3, 8, 8) or (2, 8, 8, 3), binary masks of the same layout with one channel)."""
    rng = np.random.default_rng(seed)
    image, mask = ((2, 3, 8, 8), (2, 1, 8, 8)) if layout == "NCHW" else ((2, 8, 8, 3), (2, 8, 8, 1))
    return [(rng.standard_normal(image).astype(np.float32), (rng.uniform(size=mask) > 0.5).astype(np.float32))
            for _ in range(STEPS)]


def check_device_stages(graph, tmp_path, kinds: set[str]):
    report = validate_graph(graph, mode="train", profile_name="small")
    assert report.ok, report.to_text()
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    assert kinds <= {k.kind for k in result.kernels}


def assert_close_per_step(got: list[float], expected: list[float], precision: str):
    for step, (a, b) in enumerate(zip(got, expected)):
        assert a == pytest.approx(b, rel=TOLERANCE[precision]), f"step {step}: {got} vs {expected}"
    assert len(got) == len(expected) == STEPS


# --------------------------------------------------------------------------- PyTorch

if torch is not None:
    class TorchBasicBlock(nn.Module):
        """Stem conv, then ResNet's basic block: conv-bn-relu-conv-bn plus the identity."""

        def __init__(self, width: int = 8):
            super().__init__()
            self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
            self.bn0 = nn.BatchNorm2d(width)
            self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(width, CLASSES)

        def forward(self, x):  # (N, 3, 8, 8)
            x = F.relu(self.bn0(self.stem(x)))  # (N, C, 8, 8)
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            x = F.relu(x + y)
            return self.fc(self.pool(x).flatten(1))  # (N, classes)

    class TorchBottleneck(nn.Module):
        """ResNet's bottleneck block, 1x1 -> 3x3 (stride 2) -> 1x1, with a projection shortcut."""

        def __init__(self, width: int = 4, expansion: int = 4):
            super().__init__()
            out = width * expansion
            self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn0 = nn.BatchNorm2d(8)
            self.conv1 = nn.Conv2d(8, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.project = nn.Conv2d(8, out, 1, stride=2, bias=False)
            self.bn_project = nn.BatchNorm2d(out)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(out, CLASSES)

        def forward(self, x):  # (N, 3, 8, 8)
            x = F.relu(self.bn0(self.stem(x)))  # (N, 8, 8, 8)
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)))  # (N, 4, 4, 4)
            y = self.bn3(self.conv3(y))  # (N, 16, 4, 4)
            x = F.relu(y + self.bn_project(self.project(x)))
            return self.fc(self.pool(x).flatten(1))

    class TorchUNetBlock(nn.Module):
        """One UNet level: down (conv, max pool, conv), up by a transposed conv and by a bilinear
        upsample, the skip concatenated, a 1x1 head to mask logits."""

        def __init__(self):
            super().__init__()
            self.down1 = nn.Conv2d(3, 4, 3, padding=1)
            self.down2 = nn.Conv2d(4, 8, 3, padding=1)
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.upsample = nn.Upsample(scale_factor=2, mode="bilinear")
            self.side = nn.Conv2d(8, 4, 1)
            self.fuse = nn.Conv2d(8, 4, 3, padding=1)
            self.head = nn.Conv2d(4, 1, 1)

        def forward(self, x):  # (N, 3, 8, 8)
            skip = F.relu(self.down1(x))  # (N, 4, 8, 8)
            deep = F.relu(self.down2(F.max_pool2d(skip, 2)))  # (N, 8, 4, 4)
            up = self.up(deep) + self.side(self.upsample(deep))  # (N, 4, 8, 8)
            y = F.relu(self.fuse(torch.cat([up, skip], dim=1)))  # (N, 4, 8, 8)
            return self.head(y)  # (N, 1, 8, 8) mask logits

    def torch_classify(model):
        return lambda batch: F.cross_entropy(model(batch[0]), batch[1])

    def torch_segment(model):
        return lambda batch: nn.BCEWithLogitsLoss()(model(batch[0]), batch[1])


TORCH_BLOCKS = {
    "resnet-basic": ("TorchBasicBlock", "torch_classify", classification_batches, {"conv", "dense", "softmax_loss"}),
    "resnet-bottleneck": ("TorchBottleneck", "torch_classify", classification_batches, {"conv", "softmax_loss"}),
    "unet": ("TorchUNetBlock", "torch_segment", segmentation_batches, {"conv", "pool", "softmax_loss"}),
}


@needs_torch
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("block", list(TORCH_BLOCKS))
def test_torch_block_trains_like_torch(block, precision, tmp_path):
    from device.capture.torch import capture, state_of, weights_of

    model_name, step_name, make_batches, kinds = TORCH_BLOCKS[block]
    torch.manual_seed(0)
    model = globals()[model_name]()
    step = globals()[step_name](model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    batches = [[torch.from_numpy(a) for a in batch] for batch in make_batches(1, "NCHW")]
    graph = capture(step, model, batches[0], optimizer=optimizer, precision=precision)
    check_device_stages(graph, tmp_path, kinds)
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    got, expected = [], []
    for batch in batches:
        got.append(program.train_step([t.numpy() for t in batch], LR))
        optimizer.zero_grad()
        loss = step(batch)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    assert_close_per_step(got, expected, precision)


# ------------------------------------------------------------------------- TensorFlow


def tf_basic_block(x, labels, width: int = 8):  # x: (N, 8, 8, 3)
    layers = tf.keras.layers
    h = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(x),
                                                  training=True))
    y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(h),
                                                  training=True))
    y = layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(y), training=True)
    h = layers.ReLU()(h + y)
    logits = layers.Dense(CLASSES)(layers.GlobalAveragePooling2D()(h))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def tf_bottleneck(x, labels, width: int = 4, expansion: int = 4):  # x: (N, 8, 8, 3)
    layers = tf.keras.layers

    def conv_bn(h, filters, kernel, strides=1, relu=True):
        h = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False)(h)
        h = layers.BatchNormalization()(h, training=True)
        return layers.ReLU()(h) if relu else h

    h = conv_bn(x, 8, 3)  # (N, 8, 8, 8)
    y = conv_bn(conv_bn(h, width, 1), width, 3, strides=2)  # (N, 4, 4, 4)
    y = conv_bn(y, width * expansion, 1, relu=False)  # (N, 4, 4, 16)
    h = layers.ReLU()(y + conv_bn(h, width * expansion, 1, strides=2, relu=False))
    logits = layers.Dense(CLASSES)(layers.GlobalAveragePooling2D()(h))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def tf_unet_block(x, masks):  # x: (N, 8, 8, 3), masks: (N, 8, 8, 1)
    layers = tf.keras.layers
    skip = layers.Conv2D(4, 3, padding="same", activation="relu")(x)  # (N, 8, 8, 4)
    deep = layers.Conv2D(8, 3, padding="same", activation="relu")(layers.MaxPooling2D(2)(skip))  # (N, 4, 4, 8)
    up = layers.Conv2DTranspose(4, 2, strides=2)(deep)
    up = up + layers.Conv2D(4, 1)(layers.UpSampling2D(2, interpolation="bilinear")(deep))  # (N, 8, 8, 4)
    y = layers.Conv2D(4, 3, padding="same", activation="relu")(layers.Concatenate()([up, skip]))
    logits = layers.Conv2D(1, 1)(y)  # (N, 8, 8, 1)
    return tf.keras.losses.BinaryCrossentropy(from_logits=True)(masks, logits)


TF_BLOCKS = {
    "resnet-basic": (tf_basic_block, classification_batches, {"conv", "softmax_loss"}),
    "resnet-bottleneck": (tf_bottleneck, classification_batches, {"conv", "softmax_loss"}),
    "unet": (tf_unet_block, segmentation_batches, {"conv", "pool", "softmax_loss"}),
}


@needs_tf
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("block", list(TF_BLOCKS))
def test_keras_block_trains_like_tf(block, precision, tmp_path):
    from device.capture import tf as capture_tf

    v1 = tf.compat.v1
    model_fn, make_batches, kinds = TF_BLOCKS[block]
    batches = make_batches(2, "NHWC")
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph_tf = tf.Graph()
    with graph_tf.as_default():
        x = v1.placeholder(tf.float32, batches[0][0].shape)
        y = v1.placeholder(tf.float32 if block == "unet" else tf.int32, batches[0][1].shape)
        loss = model_fn(x, y)
        train_op = v1.train.AdamOptimizer(LR).minimize(loss, v1.train.get_or_create_global_step())
        session = v1.Session(graph=graph_tf)
        session.run(v1.global_variables_initializer())
    with session:
        graph = capture_tf.capture(graph_tf, inputs=[x, y], loss=loss, train_op=train_op, precision=precision)
        check_device_stages(graph, tmp_path, kinds)
        program = Program(graph, capture_tf.read_weights(session, graph), capture_tf.read_state(session, graph))
        got, expected = [], []
        for images, labels in batches:
            got.append(program.train_step([images, labels], LR))
            expected.append(float(session.run([loss, train_op], {x: images, y: labels})[0]))
    assert_close_per_step(got, expected, precision)

"""The gallery: models as users build them from the libraries, at tiny sizes, one entry each.

An entry names the model as its library does, says how to build it (random weights, a few
classes, the smallest input the architecture takes or a small one), what batch it trains
on and with which loss. The harness (tests/gallery/harness.py) runs every entry the same
way per library; the tests (tests/gallery/test_gallery.py) and the table command
(``python -m tests.gallery``) read this one list. A library is a group of entries and one
runner in the harness: transformers models join as another group.

Dropout and stochastic depth are turned off in the builders: the emulator draws its masks
from its own generator, so with them on no two runs could be compared number for number.
The table (python -m tests.gallery) validates each model with them on as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

CLASSES = 5
SEGMENT_CLASSES = 3


@dataclass(frozen=True)
class Entry:
    name: str  # as the library names it: torchvision.models.<name>, keras.applications.<name>
    library: str  # "torchvision", "keras" or "transformers"
    build: Callable[[bool], Any]  # (dropout on?) -> the model with random weights
    size: int  # input height and width (torchvision: 64, so that the last maps are 2x2, not 1x1)
    task: str = "classify"  # classify: (N, classes) logits; segment: (N, classes, H, W) logits under "out"
    batch: int = 4
    quick: bool = False  # in the default test run (tox); the rest run in tox -e gallery
    mixed: bool = False  # also trained in mixed precision (bfloat16) against the framework's fp32
    # a gap to the framework that is known and not yet fixed, with what was measured: its test is an
    # expected failure (strict: it fails once the gap closes, so that this is removed)
    known_gap: str = ""
    # transformers: count -> the keyword arguments of each step's call, arrays (the model's own loss);
    # None: images and class ids of ``size`` (harness.batches)
    inputs: Callable[[int], list[dict[str, Any]]] | None = None

    @property
    def id(self) -> str:
        return f"{self.library}.{self.name}"

    @property
    def classes(self) -> int:
        return SEGMENT_CLASSES if self.task == "segment" else CLASSES


# --------------------------------------------------------------------------- torchvision


def _torchvision(name: str, **off) -> Callable[[bool], Any]:
    """torchvision.models.<name>(weights=None, num_classes=CLASSES); ``off``: the keyword
    arguments that turn its dropout and stochastic depth off."""
    def build(dropout: bool):
        import torchvision
        return getattr(torchvision.models, name)(weights=None, num_classes=CLASSES, **({} if dropout else off))
    return build


def _torchvision_segmentation(name: str, **off) -> Callable[[bool], Any]:
    def build(dropout: bool):
        import torchvision
        model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None,
                                                              num_classes=SEGMENT_CLASSES)
        if not dropout:  # the heads' dropout has no constructor argument
            import torch
            for module in model.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.0
        return model
    return build


def _googlenet(dropout: bool):
    """torchvision.models.googlenet without its auxiliary classifiers (they feed only its training loss
    when asked for): its max pools are ceil_mode=True, at 64x64 rounding up 32 -> 16 where floor gives 15."""
    import torchvision
    return torchvision.models.googlenet(weights=None, num_classes=CLASSES, aux_logits=False, init_weights=True,
                                        **({} if dropout else {"dropout": 0.0}))


TORCHVISION = [
    Entry("resnet18", "torchvision", _torchvision("resnet18"), 64, quick=True, mixed=True),
    Entry("mobilenet_v2", "torchvision", _torchvision("mobilenet_v2", dropout=0.0), 64, mixed=True),
    Entry("resnet50", "torchvision", _torchvision("resnet50"), 64),
    Entry("mobilenet_v3_small", "torchvision", _torchvision("mobilenet_v3_small", dropout=0.0), 64, mixed=True),
    Entry("efficientnet_b0", "torchvision",
          _torchvision("efficientnet_b0", dropout=0.0, stochastic_depth_prob=0.0), 64, mixed=True),
    Entry("convnext_tiny", "torchvision", _torchvision("convnext_tiny", stochastic_depth_prob=0.0), 64),
    Entry("vgg11_bn", "torchvision", _torchvision("vgg11_bn", dropout=0.0), 64),
    Entry("densenet121", "torchvision", _torchvision("densenet121"), 64),
    Entry("lraspp_mobilenet_v3_large", "torchvision", _torchvision_segmentation("lraspp_mobilenet_v3_large"), 64,
          task="segment"),
    Entry("fcn_resnet50", "torchvision", _torchvision_segmentation("fcn_resnet50"), 64, task="segment"),
    Entry("googlenet", "torchvision", _googlenet, 64),
]


# --------------------------------------------------------------------------------- keras


def keras_entry(name: str, size: int, **flags) -> Entry:
    """keras.applications.<name>(weights=None, classes=CLASSES) on (size, size, 3), logits out."""
    def build(dropout: bool):
        import tensorflow as tf
        model = getattr(tf.keras.applications, name)(weights=None, classes=CLASSES, input_shape=(size, size, 3),
                                                     classifier_activation=None)
        if not dropout:  # keras.applications take no dropout argument
            for layer in model.layers:
                if isinstance(layer, tf.keras.layers.Dropout):
                    layer.rate = 0.0
        return model
    return Entry(name, "keras", build, size, **flags)


# 64x64 where the smallest input the model takes (32x32) would leave batch norm 1x1 maps; VGG16 has
# no batch norm; Xception takes 71x71 at least (its last maps are 3x3)
KERAS = [
    keras_entry("MobileNetV2", 64, mixed=True),
    keras_entry("VGG16", 32, quick=True),
    keras_entry("ResNet50", 64, mixed=True),
    keras_entry("EfficientNetB0", 64, mixed=True),
    keras_entry("DenseNet121", 64),
    keras_entry("Xception", 71),
]

# ------------------------------------------------------------------------- transformers


def _transformers(module, name: str) -> Callable[[bool], Any]:
    """The tiny model ``name`` of ``module`` (transformers_encoders or transformers_decoders, whose configs
    set every dropout to 0); with ``dropout``, its nn.Dropout modules at transformers' default rate, 0.1."""
    def build(dropout: bool):
        model = module.MODELS[name].build()
        if dropout:
            import torch
            for layer in model.modules():
                if isinstance(layer, torch.nn.Dropout):
                    layer.p = 0.1
        return model
    return build


def _transformers_entries() -> list[Entry]:
    """Every model of transformers_encoders.py, transformers_decoders.py and transformers_audio.py, its quick
    flag (and known gap) as there; size 0: the inputs are the module's ``batches`` (token rows of 8, 5 and 3 under a mask;
    ViT 8x8; raw audio of 400 samples)."""
    from tests.gallery import transformers_audio, transformers_decoders, transformers_encoders

    return [Entry(name, "transformers", _transformers(module, name), 0, batch=3, quick=model.quick, mixed=True,
                  known_gap=getattr(model, "known_gap", ""),
                  inputs=lambda count, module=module, model=model: module.batches(model, count))
            for module in (transformers_encoders, transformers_decoders, transformers_audio)
            for name, model in module.MODELS.items()]


TRANSFORMERS = _transformers_entries()

ENTRIES: dict[str, Entry] = {e.id: e for e in TORCHVISION + KERAS + TRANSFORMERS}
# the modules each library needs (an entry with one missing is skipped)
LIBRARY_MODULES = {"torchvision": ("torchvision",), "keras": ("tensorflow",),
                   "transformers": ("transformers", "torch")}

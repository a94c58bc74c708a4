"""Each frontend's table of what it cannot lower (device/capture/refused_torch.py, refused_tf.py),
and the suggestion reaching the user's finding from there.

- OPS names only ops the frontend has no rule for, FORMS only ops it lowers in other forms
  (a lowering added without its refusal removed, as cumsum's and grouped convolution's once
  were, fails here), and every form the handlers decline or refuse is one FORMS keys.
- device/passes/ names no framework op: the suggestions come from the frontends.
- A refused op and a refused form each reach validation's Finding with their own suggestion,
  through capture and validate_graph as the runners call them.
- device.api.refused_op answers from the tables, and the porting assistant asks it.

The source checks need no framework; the rest import torch or TF where they are installed.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from device.api import refused_op
from device.capture import refused_tf, refused_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sources(folder: str) -> dict[str, str]:
    found = {}
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, folder, name)) as f:
                found[name] = f.read()
    return found


def _strings(source: str) -> list[str]:
    """The string constants of a module, its docstrings left out."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_passes_name_no_framework_op():
    tf_ops = set(refused_tf.OPS) | set(refused_tf.CALLS) | {op for op, _ in refused_tf.FORMS}
    torch_ops = set(refused_torch.OPS) | {op for op, _ in refused_torch.FORMS}
    found = {}
    for name, source in _sources(os.path.join("device", "passes")).items():
        named = [s for s in _strings(source) if re.search(r"\baten\.", s) or s in tf_ops or s in torch_ops]
        if named:
            found[name] = named
    assert found == {}


def _forms_refused(folder: str) -> set[str]:
    """The ``form=`` of every ``self.decline(...)`` (torch) and ``CannotMap(...)`` (TF) in the folder."""
    forms = set()
    for source in _sources(folder).values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("self.decline", "CannotMap"):
                forms.update(k.value.value for k in node.keywords if k.arg == "form")
    return forms


@pytest.mark.parametrize("table, folder", [(refused_torch, "torch"), (refused_tf, "tf")])
def test_every_form_the_handlers_refuse_has_a_suggestion_and_every_suggestion_a_form(table, folder):
    assert _forms_refused(os.path.join("device", "capture", folder)) == {form for _, form in table.FORMS}


def test_the_api_answers_from_the_frontends_tables():
    assert refused_op("torch", "aten.sort.default") == refused_torch.OPS["aten.sort.default"]
    assert refused_op("torch", "aten.sort.stable") == refused_torch.OPS["aten.sort.stable"]
    assert refused_op("tf", "TopKV2") == refused_tf.OPS["TopKV2"]
    assert refused_op("tf", "MirrorPad", "paddings") == refused_tf.FORMS[("MirrorPad", "paddings")]
    assert refused_op("tf", "MirrorPad") is None  # lowered in its other forms
    assert refused_op("torch", "aten.cumsum.default") is None  # lowered
    with pytest.raises(ValueError, match="jax"):
        refused_op("jax", "sort")


def test_the_porting_assistant_asks_the_device(monkeypatch):
    """A call the torch frontend stops refusing is no finding of zoo port check's either."""
    from common.port import static

    assert static.refused_op is refused_op  # the device's answer, not a copy
    assert all(refused_op("tf" if name.startswith("tensorflow.") else "torch", op)
               for name, op in static.UNSUPPORTED_CALLS.items()), "a listed call maps to an op no frontend refuses"
    assert all(refused_op("torch", "aten.convolution.default", form)
               for _, _, form in static.UNSUPPORTED_LAYERS.values())


# ---- PyTorch ----------------------------------------------------------------------------------


def test_torch_refuses_only_what_it_does_not_lower():
    pytest.importorskip("torch")
    from device.capture.torch.table import _LOWERINGS

    assert sorted(set(refused_torch.OPS) & set(_LOWERINGS)) == []
    assert sorted({op for op, _ in refused_torch.FORMS} - set(_LOWERINGS)) == []


def test_a_refused_torch_op_and_a_declined_form_reach_the_finding_with_their_own_suggestion():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from device.api import capture_torch, validate_graph

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, 2, 3, 3))

        def forward(self, x, img):
            up = F.conv_transpose2d(img, self.w, groups=2)  # a form the convolution handler declines
            return torch.sort(x, dim=1).values.mean() + up.mean()  # an op no handler lowers

    model = Model()
    graph = capture_torch(lambda b: model(*b), model, (torch.randn(2, 8), torch.randn(2, 4, 6, 6)))
    report = validate_graph(graph, mode="train", profile_name="tiny")
    found = {f.framework_op: f.suggestion for f in report.errors if f.kind == "unsupported_op"}
    assert found == {
        "aten.convolution.default": refused_torch.FORMS[("aten.convolution.default", "transposed groups")],
        "aten.sort.default": refused_torch.OPS["aten.sort.default"],
    }


# ---- TensorFlow -------------------------------------------------------------------------------


def test_tf_refuses_only_what_it_does_not_lower():
    pytest.importorskip("tensorflow")
    from device.capture.tf.loops import LOOP_OPS
    from device.capture.tf.patterns import PATTERNS
    from device.capture.tf.table import MAPPINGS

    lowered = set(MAPPINGS) | set(PATTERNS) | set(LOOP_OPS)
    assert sorted(set(refused_tf.OPS) & lowered) == []
    assert sorted({op for op, _ in refused_tf.FORMS} - lowered) == []


def test_a_refused_mirror_pad_and_a_refused_tf_op_reach_the_finding_with_their_own_suggestion():
    tf = pytest.importorskip("tensorflow")
    from device.api import capture_tf, validate_graph

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, (2, 6, 6, 4), name="x")
        ids = v1.placeholder(tf.int32, (2, 8), name="ids")
        width = tf.reduce_max(ids) % 2  # paddings computed from the batch: the refused form
        padded = tf.pad(x, [[0, 0], [width, width], [1, 1], [0, 0]], mode="REFLECT")
        w = v1.get_variable("w", (4,), initializer=v1.ones_initializer())
        top = tf.math.top_k(tf.reshape(x * w, (2, -1)), 3).values  # an op type no rule lowers
        loss = tf.reduce_mean(padded) + tf.reduce_mean(top)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        ir = capture_tf(graph, inputs=[x, ids], loss=loss, train_op=train_op)
    report = validate_graph(ir, mode="train", profile_name="tiny")
    found = {f.framework_op: (f.call, f.suggestion) for f in report.errors if f.kind == "unsupported_op"}
    assert found == {
        "MirrorPad": ("tf.pad(mode='REFLECT')", refused_tf.FORMS[("MirrorPad", "paddings")]),
        "TopKV2": ("tf.math.top_k / tf.sort / tf.argsort", refused_tf.OPS["TopKV2"]),
    }

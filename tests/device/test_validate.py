"""Validation reports every problem at once, each at the user's file and line."""

import json

import numpy as np
import pytest

from device.capture import refused_tf, refused_torch
from device.graphs import GraphBuilder
from device.ir import SourceLoc
from device.passes.validate import DEFAULT_SUGGESTION, validate
from device.profiles import get_profile
from tests.device.graphs import mlp_graph

TINY = get_profile("tiny")


def _errors(report, kind):
    return [f for f in report.errors if f.kind == kind]


def test_mlp_is_valid_for_training():
    report = validate(mlp_graph(precision="float16"), mode="train", profile=TINY)
    assert report.ok
    assert report.errors == [] and report.warnings == []
    assert report.summary().startswith("validation passed")


def test_float32_compute_is_a_warning_not_an_error():
    report = validate(mlp_graph(precision="float32"), mode="train", profile=TINY)
    assert report.ok
    assert [f.kind for f in report.warnings] == ["precision"]


def test_two_unsupported_ops_are_both_reported_with_file_and_line():
    b = GraphBuilder(file="train.py")
    x = b.input("x", (4, 8))
    # the suggestions the torch frontend attaches to the nodes it refuses
    y = b.op("sort", [x], (4, 8), framework_op="aten.sort.default", line=12,
             attrs={"suggestion": refused_torch.OPS["aten.sort.default"]})
    z = b.op("nonzero", [y], (4, 8), framework_op="aten.nonzero.default", line=17,
             attrs={"suggestion": refused_torch.OPS["aten.nonzero.default"]})
    b.graph.loss = b.op("reduce_mean", [z], (), attrs={"axes": [0, 1], "keepdims": False})
    b.param("w", (8,))
    report = validate(b.graph, mode="train", profile=TINY)
    unsupported = _errors(report, "unsupported_op")
    assert [(f.file, f.line, f.framework_op) for f in unsupported] == [
        ("train.py", 12, "aten.sort.default"), ("train.py", 17, "aten.nonzero.default")]
    assert unsupported[0].suggestion == refused_torch.OPS["aten.sort.default"]
    assert "mask" in unsupported[1].suggestion
    lines = report.to_text().splitlines()
    assert lines[0].startswith("train.py:12: aten.sort.default: op 'sort' is not supported on the device "
                               "(use instead: ")
    assert lines[1].startswith("train.py:17: aten.nonzero.default: ")
    assert not report.ok


def test_a_supported_op_in_an_unsupported_form_says_why():
    b = GraphBuilder(file="model.py")
    x = b.input("x", (2, 4, 8, 8))
    y = b.op("aten.convolution.default", [x], (2, 4, 8, 8), framework_op="aten.convolution.default", line=9,
             attrs={"reason": "groups=2: only groups=1 convolutions have a device kernel"})
    b.graph.loss = b.op("reduce_mean", [y], (), attrs={"axes": [0, 1, 2, 3], "keepdims": False})
    (finding,) = _errors(validate(b.graph, mode="train", profile=TINY), "unsupported_op")
    assert finding.message.endswith(": groups=2: only groups=1 convolutions have a device kernel")


@pytest.mark.parametrize("table, framework_op, expected", [
    (refused_tf, "StringToHashBucketFast", "input pipeline"),
    (refused_tf, "PyFunc", "host_call"),
    (refused_tf, "TopKV2", "argmax"),
    (refused_torch, "aten.topk.default", "argmax"),
    (refused_torch, "aten._unique2.default", "unique"),
    (refused_torch, "aten.index_put_.default", "one-hot"),
    (refused_torch, "aten.median.default", "median"),
    (refused_tf, "Where", "tf.where(cond, x, y)"),
])
def test_suggestions_name_what_to_use_instead(table, framework_op, expected):
    """The suggestion on the node (the frontend's, from its table) is the finding's; validate adds none."""
    b = GraphBuilder(frontend="tf")
    x = b.input("x", (4, 8))
    b.graph.outputs["y"] = b.op("custom", [x], (4, 8), framework_op=framework_op,
                                attrs={"suggestion": table.suggestion(framework_op)})
    report = validate(b.graph, mode="predict", profile=TINY)
    (finding,) = _errors(report, "unsupported_op")
    assert expected in finding.suggestion


def test_a_node_without_a_suggestion_gets_the_default_whatever_its_framework_op():
    b = GraphBuilder(frontend="tf")
    x = b.input("x", (4, 8))
    y = b.op("custom", [x], (4, 8), framework_op="MyCustomOp", line=3)
    b.graph.outputs["y"] = b.op("sort", [y], (4, 8), framework_op="TopKV2", line=4)  # not attached: not looked up
    report = validate(b.graph, mode="predict", profile=TINY)
    assert [f.suggestion for f in _errors(report, "unsupported_op")] == [DEFAULT_SUGGESTION] * 2


def test_dynamic_batch_is_reported_once_and_points_at_drop_remainder():
    b = GraphBuilder()
    x = b.input("features", (None, 16))
    labels = b.input("labels", (None,), "int32")
    h = b.dense(x, 8, "relu", name="fc0")  # every later shape is dynamic too
    logits = b.op("matmul", [h, b.param("fc1.weight", (8, 3))], (None, 3))
    per_example = b.op("sparse_softmax_cross_entropy", [logits, labels], (None,))
    b.graph.loss = b.op("reduce_mean", [per_example], ())
    report = validate(b.graph, mode="train", profile=TINY)
    dynamic = _errors(report, "dynamic_shape")
    assert [f.message.split()[1] for f in dynamic] == ["'features'", "'labels'"]
    for f in dynamic:
        assert "drop_remainder=True" in f.message and "drop_last=True" in f.message
    assert dynamic[0].line == 11  # the first op that reads the input


def test_data_dependent_shape_is_reported_at_the_op_that_makes_it():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.op("reshape", [x], (None,), attrs={"shape": [-1]}, line=30)
    b.graph.outputs["y"] = b.op("relu", [y], (None,))
    (finding,) = _errors(validate(b.graph, mode="predict", profile=TINY), "dynamic_shape")
    assert finding.line == 30 and "dynamic shape (None)" in finding.message


def test_float64_is_rejected_where_it_enters_with_float32_suggested():
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float64")
    y = b.op("relu", [x], (4, 8), "float64")
    b.graph.outputs["y"] = b.op("exp", [y], (4, 8), "float64")
    report = validate(b.graph, mode="predict", profile=TINY)
    (finding,) = _errors(report, "dtype")  # not one per downstream value
    assert "float64" in finding.message and "float32" in finding.suggestion


def test_a_framework_dtype_the_ir_lacks_is_the_users_finding_not_a_frontend_bug():
    """complex64 from an FFT: the op, its line and the dtype, with what to do instead, once."""
    b = GraphBuilder(file="model.py")
    x = b.input("x", (4, 8))
    spectrum = b.op("aten._fft_r2c.default", [x], (4, 5), "complex64", framework_op="aten._fft_r2c.default", line=21,
                    attrs={"suggestion": refused_torch.OPS["aten._fft_r2c.default"]})
    scaled = b.op("mul", [spectrum, b.constant("two", np.complex64(2))], (4, 5), "complex64", line=22)
    b.graph.outputs["y"] = b.op("aten.abs.default", [scaled], (4, 5), line=23)
    report = validate(b.graph, mode="predict", profile=TINY)
    # the constant typed to match the complex operand is not where the dtype came in
    (finding,) = _errors(report, "dtype")
    assert (finding.file, finding.line, finding.framework_op) == ("model.py", 21, "aten._fft_r2c.default")
    assert "has dtype complex64, which the device does not support" in finding.message
    assert "frontend bug" not in report.to_text()
    assert "FFT in the input pipeline" in finding.suggestion
    assert "FFT in the input pipeline" in _errors(report, "unsupported_op")[0].suggestion


@pytest.mark.parametrize("dtype, suggested", [("uint8", "int32"), ("int16", "int32"), ("string", "one of float32")])
def test_other_dtypes_name_the_dtype_and_a_replacement(dtype, suggested):
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    b.graph.outputs["y"] = b.op("cast", [x], (4, 8), dtype, attrs={"dtype": dtype}, line=14)
    (finding,) = _errors(validate(b.graph, mode="predict", profile=TINY), "dtype")
    assert finding.line == 14 and f"output 'v1' has dtype {dtype}," in finding.message
    assert suggested in finding.suggestion


def test_a_float64_constant_of_the_users_is_reported_as_a_constant():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    scale = b.op("cast", [b.constant("scale", np.float64(0.5))], (), "float32", attrs={"dtype": "float32"}, line=30)
    b.graph.outputs["y"] = b.op("mul", [x, scale], (4, 8))
    (finding,) = _errors(validate(b.graph, mode="predict", profile=TINY), "dtype")
    assert finding.line == 30 and finding.message.startswith("constant 'scale' has dtype float64")


def test_train_and_eval_is_not_allowed():
    report = validate(mlp_graph(), mode="train_and_eval", profile=TINY)
    (finding,) = _errors(report, "mode")
    assert "one static graph per run" in finding.message
    assert "--mode train, then --mode eval" in finding.message


def test_unknown_mode_is_reported():
    (finding,) = _errors(validate(mlp_graph(), mode="fit", profile=TINY), "mode")
    assert "'fit'" in finding.message and "train" in finding.message


def test_training_needs_a_loss_eval_needs_outputs():
    graph = mlp_graph()
    graph.loss = None
    assert _errors(validate(graph, mode="train", profile=TINY), "loss")
    assert validate(graph, mode="eval", profile=TINY).ok  # the logits are an output
    graph.outputs.clear()
    assert _errors(validate(graph, mode="eval", profile=TINY), "outputs")


def test_frontend_issues_are_reported_and_not_duplicated():
    graph = mlp_graph()
    loc = SourceLoc("Print", "model.py", 40)
    graph.issues.append({"kind": "unsupported_op", "message": "tf.Print has no device kernel", "loc": loc,
                         "suggestion": refused_tf.OPS["Print"]})
    graph.issues.append({"kind": "metric_in_train", "message": "a metric in the training graph",
                         "loc": {"framework_op": "Mean", "file": "model.py", "line": 41}})
    x = graph.inputs[0]
    graph.add_value("printed", graph.values[x].shape, "float32")
    graph.add_node("print", [x], ["printed"], {"suggestion": refused_tf.OPS["Print"]}, loc=loc)  # also a node
    report = validate(graph, mode="train", profile=TINY)
    assert [(f.kind, f.line) for f in report.errors] == [("unsupported_op", 40), ("metric_in_train", 41)]
    assert "tf.Print" in report.errors[0].suggestion


def test_every_problem_at_once_and_the_report_is_json():
    b = GraphBuilder()
    x = b.input("x", (None, 8), "float64")
    y = b.op("sort", [x], (None, 8), "float64", framework_op="aten.sort.default")
    b.op("matmul", [y], (None, 8), "float64")  # one input short: malformed
    report = validate(b.graph, mode="train_and_eval", profile=TINY)
    kinds = {f.kind for f in report.errors}
    assert kinds == {"unsupported_op", "malformed", "dynamic_shape", "dtype", "mode"}
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and len(data["errors"]) == len(report.errors)


def test_weights_larger_than_the_wafer_warn_about_weight_streaming():
    report = validate(mlp_graph(sizes=(784, 4096, 4096, 10), precision="float16"), mode="train", profile=TINY)
    assert report.ok
    (finding,) = report.warnings
    assert finding.kind == "memory" and "weight_streaming" in finding.suggestion

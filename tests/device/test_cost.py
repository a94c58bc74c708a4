"""The cost model's arithmetic, and its calibration against the one published figure."""

import re
from collections import Counter
from pathlib import Path

import pytest

from device.calibration import OBSERVED_SAMPLES_PER_S, bert_large_graph, predict
from device.cost import estimate
from device.passes.match import match
from device.place import place
from device.profiles import get_profile
from device.graphs import GraphBuilder, default_optimizer as optimizer
from tests.device.graphs import cnn_graph, mlp_graph

DEVICE_README = Path(__file__).resolve().parents[2] / "device" / "README.md"


def _estimate(graph, profile_name="small", mode="pipelined", training=True):
    profile = get_profile(profile_name)
    kernels = match(graph)
    placement = place(kernels, profile, mode, graph.optimizer, training=training, precision=graph.precision)
    return kernels, placement, estimate(graph, kernels, placement, profile, training=training)


def test_kernel_roofline_is_the_plain_formula():
    graph = mlp_graph(precision="float16")
    kernels, placement, cost = _estimate(graph)
    profile = get_profile("small")
    k, c, rect = kernels[0], cost.kernels[0], placement.get("dense_0")
    assert c.pes == rect.pes
    assert c.compute_s == pytest.approx(k.flops(True) / (rect.pes * 8 * 0.975e9))  # fp16: 8 flops/cycle/PE
    assert c.sram_s == pytest.approx(k.sram_bytes(True) / (rect.pes * 24 * 0.975e9))  # 24 B/cycle/PE
    links = 2 * (rect.w + rect.h)
    assert c.fabric_s == pytest.approx(2 * (k.input_bytes + k.activation_bytes) / (links * 4 * 0.975e9))
    assert c.time_s == max(c.compute_s, c.sram_s, c.fabric_s)
    assert c.bound_by == "memory"  # SRAM: fp16 operand + fp32 partial sum read and written, 10 B per multiply-add
    assert profile.peak_flops("float16") == cost.peak_flops


def test_a_kernel_whose_activations_outrun_its_links_is_bound_by_the_fabric():
    """An embedding does next to no arithmetic and sends (B, T, C) activations out of a small
    rectangle: its boundary links are its limit and, as the slowest stage, the pipeline's."""
    b = GraphBuilder()
    ids, labels = b.input("ids", (32, 64), "int32"), b.input("labels", (32 * 64,), "int32")
    x = b.op("embedding", [b.param("emb", (500, 64)), ids], (32, 64, 64))
    x = b.op("reshape", [x], (32 * 64, 64), attrs={"shape": [32 * 64, 64]})
    b.cross_entropy(b.dense(x, 10, name="head"), labels)
    b.graph.optimizer = optimizer("sgd")
    kernels, placement, cost = _estimate(b.graph)
    k, c, rect = kernels[0], cost.kernels[0], placement.get("embedding_0")
    links = 2 * (rect.w + rect.h)
    assert c.fabric_s == pytest.approx(2 * (k.input_bytes + k.activation_bytes) / (links * 4 * 0.975e9))
    assert c.bound_by == "fabric" and c.time_s == c.fabric_s > max(c.compute_s, c.sram_s)
    assert cost.compute_samples_per_s == pytest.approx(32 / c.fabric_s)
    assert cost.bound_by == "fabric"


def test_pipelined_throughput_is_set_by_the_slowest_kernel():
    graph = mlp_graph(batch=16)
    _, _, cost = _estimate(graph)
    slowest = max(k.time_s for k in cost.kernels)
    assert cost.compute_samples_per_s == pytest.approx(16 / slowest)
    assert cost.transmission_samples_per_s == pytest.approx(1.2e12 / 8 / (784 * 4 + 4))  # float32 pixels, int32 label
    assert cost.samples_per_s == min(cost.compute_samples_per_s, cost.transmission_samples_per_s)
    assert 0 < cost.active_pes_pct <= 100 and 0 < cost.compute_utilisation_pct <= 100


def test_pipelined_bound_is_the_slowest_kernels_or_the_input():
    _, _, cost = _estimate(mlp_graph(batch=16, precision="float16"), "tiny")
    slowest = max(cost.kernels, key=lambda k: k.time_s)
    assert cost.compute_samples_per_s < cost.transmission_samples_per_s  # a fabric of 1,024 PEs is the limit
    assert cost.bound_by == cost.compute_bound_by == slowest.bound_by == "memory"
    assert cost.iteration_by_bound == {"memory": pytest.approx(slowest.time_s)}
    _, _, cost = _estimate(mlp_graph(batch=16), "wse2")  # 3,140 bytes per sample outrun the whole wafer
    assert cost.transmission_samples_per_s < cost.compute_samples_per_s
    assert cost.bound_by == "input" and cost.compute_bound_by == "memory"


def test_weight_streaming_sums_layers_and_adds_a_bubble():
    graph = mlp_graph(sizes=(784, 2048, 2048, 10))
    kernels, _, cost = _estimate(graph, "tiny", "weight_streaming")
    assert cost.iteration_s == pytest.approx(sum(k.time_s for k in cost.kernels) + cost.bubble_s)
    assert cost.bubble_s == pytest.approx((kernels[0].weight_bytes + kernels[-1].weight_bytes) / 150e9)
    big = cost.kernels[1]  # 2048 x 2048, batch 8: streaming the weights dominates
    assert big.bound_by == "weight streaming"
    assert big.stream_s == pytest.approx(3 * kernels[1].weight_bytes / 150e9)  # in, in again, gradients out
    assert cost.active_pes_pct == 100


def test_weight_streaming_is_bound_by_what_takes_most_of_the_iteration():
    """Not "compute" because compute samples/s beat transmission: the kernels' own bounds, summed."""
    _, _, cost = _estimate(mlp_graph(sizes=(784, 2048, 2048, 10)), "tiny", "weight_streaming")
    by_bound = cost.iteration_by_bound
    assert sum(by_bound.values()) == pytest.approx(cost.iteration_s)
    streamed = sum(k.time_s for k in cost.kernels if k.bound_by == "weight streaming") + cost.bubble_s
    assert by_bound["weight streaming"] == pytest.approx(streamed)
    assert cost.compute_samples_per_s < cost.transmission_samples_per_s
    assert cost.bound_by == "weight streaming" == next(iter(by_bound))
    data = cost.to_dict()
    assert data["bound_by"] == data["compute_bound_by"] == "weight streaming"


def test_eval_is_cheaper_than_training_and_fp16_than_fp32():
    graph = cnn_graph()
    _, _, train = _estimate(graph, training=True)
    _, _, evaluate = _estimate(graph, training=False)
    assert evaluate.flops_per_sample < train.flops_per_sample
    assert evaluate.compute_samples_per_s > train.compute_samples_per_s
    _, _, fp32 = _estimate(mlp_graph(precision="float32"))
    _, _, fp16 = _estimate(mlp_graph(precision="float16"))
    assert fp16.compute_samples_per_s > fp32.compute_samples_per_s


def test_the_report_dict_is_labelled_an_estimate():
    _, _, cost = _estimate(mlp_graph())
    data = cost.to_dict()
    assert data["estimate"] is True
    assert {"samples_per_s", "compute_samples_per_s", "transmission_samples_per_s", "active_pes_pct",
            "compute_utilisation_pct"} <= set(data)
    assert [k["name"] for k in data["kernels"]] == ["dense_0", "dense_1", "dense_2", "softmax_loss_0"]


def test_bert_large_graph_structure():
    graph = bert_large_graph()
    assert 330e6 < graph.num_params() < 345e6  # BERT-Large: ~335M with the tied decoder
    kinds = Counter(k.kind for k in match(graph))
    assert kinds["attention"] == 24
    assert kinds["dense"] == 24 * 6 + 2  # q, k, v, out, ffn in, ffn out per layer; MLM transform, decoder
    assert kinds["layer_norm"] == 2 * 24 + 2 and kinds["softmax_loss"] == 1


def test_bert_large_calibration_is_the_figure_the_readme_states():
    """device/README.md states the prediction and its ratio to the observed ~6,400 samples/s;
    a change of the cost model that moves them must update the README in the same commit."""
    readme = DEVICE_README.read_text(encoding="utf-8")
    stated = re.search(r"predicted at about ([\d,]+) samples/s.*?a ratio of (\d+\.\d+)", readme, re.S)
    assert stated, "device/README.md no longer states the calibration figure"
    samples, ratio = int(stated.group(1).replace(",", "")), stated.group(2)
    cost = predict("wse2", "pipelined").cost
    assert f"{cost.samples_per_s / OBSERVED_SAMPLES_PER_S:.{len(ratio) - 2}f}" == ratio
    assert round(cost.samples_per_s, -2) == samples  # "about 9,100": to the hundred
    # wafer-facts.md: a model within 2x of the observation is credible; 1-2 PF/s effective
    effective = cost.flops_per_sample * cost.samples_per_s
    assert 0.5e15 < effective < 4e15
    # 98 of its 272 working kernels are bound by their rectangle's links (the layer norms,
    # the residual adds and the word embedding); the slowest, which sets the pace, by SRAM
    bounds = Counter(k.bound_by for k in cost.kernels if k.bound_by != "free")
    assert bounds == {"memory": 171, "fabric": 98, "compute": 3}
    assert cost.bound_by == "memory"


def test_every_kernel_row_carries_its_own_work_and_bytes():
    """The per-kernel rows of the report (what `zoo report` prints) hold the training figures of
    each kernel; a free (layout) kernel holds its bytes, no PEs and no time."""
    graph = cnn_graph()
    kernels, placement, cost = _estimate(graph, training=True)
    kinds = set()
    for k, c in zip(kernels, cost.kernels):
        kinds.add(k.kind)
        assert (c.name, c.kind) == (k.name, k.kind)
        assert (c.flops, c.sram_bytes) == (k.flops(True), k.sram_bytes(True))
        assert c.fabric_bytes == 2 * (k.input_bytes + k.activation_bytes)
        assert c.stream_bytes == 0.0  # pipelined: weights stay on the fabric
        if k.free:
            assert (c.pes, c.compute_s, c.sram_s, c.fabric_s, c.stream_s, c.time_s, c.bound_by) == (
                0, 0.0, 0.0, 0.0, 0.0, 0.0, "free")
        else:
            assert c.pes == placement.get(k.name).pes > 0 and c.bound_by != "free"
    assert "layout" in kinds
    data = cost.to_dict()
    assert (data["profile"], data["precision"], data["training"], data["batch_size"]) == ("small", "float32",
                                                                                        True, 4)
    assert data["iteration_by_bound"] == cost.iteration_by_bound and data["iteration_by_bound"]
    assert data["compute_utilisation_pct"] == cost.compute_utilisation_pct > 0
    assert data["kernels"][4] == {**cost.kernels[4].__dict__}


def test_float32_computes_at_the_float32_rate():
    """fp32 graphs: 4 flops per cycle per PE in every row and in the peak (16-bit: 8)."""
    kernels, placement, cost = _estimate(mlp_graph(precision="float32"))
    profile = get_profile("small")
    assert cost.precision == "float32" and cost.peak_flops == profile.pes * 4 * 0.975e9
    for k, c in zip(kernels, cost.kernels):
        assert c.compute_s == pytest.approx(k.flops(True) / (placement.get(k.name).pes * 4 * 0.975e9))


def test_a_kernel_on_a_single_pe_is_costed():
    """One PE is a (slow) rectangle, not a free kernel."""
    import dataclasses

    graph = mlp_graph()
    profile = get_profile("small")
    kernels = match(graph)
    placement = place(kernels, profile, "pipelined", graph.optimizer, training=True, precision=graph.precision)
    placement.kernels[0] = dataclasses.replace(placement.kernels[0], w=1, h=1)
    row = estimate(graph, kernels, placement, profile, training=True).kernels[0]
    assert row.pes == 1 and row.bound_by != "free"
    assert row.compute_s == pytest.approx(kernels[0].flops(True) / (4 * 0.975e9))


def test_weight_streaming_eval_streams_the_weights_once_and_its_bubble_is_the_first_layers():
    """Forward only: 1x the weights per kernel, and no gradients to wait for at the boundary;
    training: 3x, and the bubble adds the last kernel's gradients (a graph ending in a dense)."""
    b = GraphBuilder()
    y = b.dense(b.dense(b.input("x", (8, 512)), 512, "relu", name="a"), 256, name="b")
    b.graph.outputs["y"] = y
    b.graph.optimizer = optimizer("sgd")
    kernels, _, evaluate = _estimate(b.graph, "tiny", "weight_streaming", training=False)
    first, last = kernels[0].weight_bytes, kernels[-1].weight_bytes
    assert [c.stream_bytes for c in evaluate.kernels] == [first, last]
    assert evaluate.bubble_s == first / get_profile("tiny").external_link_bytes_s  # exactly: no gradient bytes
    _, _, train = _estimate(b.graph, "tiny", "weight_streaming", training=True)
    assert [c.stream_bytes for c in train.kernels] == [3 * first, 3 * last]
    assert train.bubble_s == pytest.approx((first + last) / 150e9)


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_a_graph_of_layout_only_takes_no_time(mode):
    """Nothing but a reshape: no kernel works, so compute is unbounded and the input link is the limit."""
    b = GraphBuilder(precision="float16")
    b.graph.outputs["y"] = b.op("reshape", [b.input("x", (4, 6), "float16")], (4, 2, 3), "float16",
                                attrs={"shape": [4, 2, 3]})
    _, _, cost = _estimate(b.graph, mode=mode, training=False)
    assert (cost.iteration_s, cost.bubble_s) == (0.0, 0.0)
    assert cost.compute_samples_per_s == float("inf")
    assert cost.input_bytes_per_sample == 6 * 2  # float16: 2 bytes an element
    assert cost.samples_per_s == cost.transmission_samples_per_s == 1.2e12 / 8 / 12
    assert cost.iteration_by_bound == {} and cost.compute_utilisation_pct == 0.0 and cost.bound_by == "input"


def test_a_graph_without_inputs_is_not_bound_by_the_input_link():
    """No bytes to feed: transmission is unbounded and the compute sets the estimate."""
    b = GraphBuilder()
    b.graph.outputs["y"] = b.op("relu", [b.param("w", (4, 4))], (4, 4))
    _, _, cost = _estimate(b.graph, training=False)
    assert cost.input_bytes_per_sample == 0 and cost.transmission_samples_per_s == float("inf")
    assert cost.samples_per_s == cost.compute_samples_per_s < float("inf")
    assert cost.bound_by != "input"

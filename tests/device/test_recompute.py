"""Weight streaming with activation checkpointing: where one pass cannot keep every activation, only
the checkpoints at layer boundaries are kept and each layer's forward runs again in the backward
(device/place.py, device/cost.py). Figures from first principles on a stack of float32 matmul layers
on the tiny profile (32 x 32 PEs of 48 KiB: 48 MiB of SRAM)."""

import re

import pytest

from device.api import compile_graph, render_report
from device.errors import DeviceCompileError
from device.graphs import GraphBuilder, default_optimizer
from device.profiles import get_profile

HIDDEN, FFN, VOCAB = 64, 256, 16
MIB = 2**20


def stack_graph(batch: int, seq: int, layers: int):
    """``layers`` residual layers x + (x @ W1) @ W2 of (batch, seq, HIDDEN) float32, then a VOCAB-word head
    and softmax cross entropy. A layer's backward keeps x (seq x 64 x 4 bytes a sample) and x @ W1 (seq x
    256 x 4); the residual stream between layers (seq x 64 x 4) is the narrow point."""
    b = GraphBuilder(file="stack.py")
    x = b.input("x", (batch, seq, HIDDEN))
    labels = b.input("labels", (batch * seq,), "int32")
    for i in range(layers):
        h = b.op("matmul", [x, b.param(f"l{i}.w1", (HIDDEN, FFN))], (batch, seq, FFN))
        y = b.op("matmul", [h, b.param(f"l{i}.w2", (FFN, HIDDEN))], (batch, seq, HIDDEN))
        x = b.op("add", [x, y], (batch, seq, HIDDEN))
    x = b.op("reshape", [x], (batch * seq, HIDDEN), attrs={"shape": [batch * seq, HIDDEN]})
    b.cross_entropy(b.op("matmul", [x, b.param("head", (HIDDEN, VOCAB))], (batch * seq, VOCAB)), labels)
    b.graph.optimizer = default_optimizer("adam")
    return b.graph


def _compile(graph, **kwargs):
    return compile_graph(graph, mode="train", profile_name="tiny", execution_mode="weight_streaming", **kwargs)


def test_a_model_whose_activations_do_not_fit_compiles_keeping_checkpoints(tmp_path):
    seq, layers = 8192, 8
    result = _compile(stack_graph(2, seq, layers), out_dir=tmp_path)
    placement = result.placement
    layer_stash = seq * (HIDDEN + FFN) * 4  # 10 MiB a sample
    head_stash = seq * HIDDEN * 4
    loss_stash = seq * VOCAB * 4 + seq * 4  # logits and labels
    assert placement.full_activation_bytes_per_sample == layers * layer_stash + head_stash + loss_stash  # 82.5 MiB
    assert placement.full_activation_bytes_per_sample > get_profile("tiny").sram_bytes
    # checkpoints: the residual stream after each of the first 7 layers, and the labels, which every
    # cut crosses (counted once); the narrow point before the loss is not worth its bytes
    assert placement.recompute and placement.layers == layers
    assert placement.checkpoint_bytes_per_sample == (layers - 1) * seq * HIDDEN * 4 + seq * 4
    # the largest segment: the last layer, the head and the loss
    inner = layer_stash + head_stash + loss_stash
    assert placement.activation_bytes_per_sample == placement.checkpoint_bytes_per_sample + inner
    assert (placement.micro_batch, placement.micro_batches) == (1, 2)
    assert all(r.activation_bytes == placement.activation_bytes_per_sample for r in placement.kernels if r.pes)
    report = (tmp_path / "report.txt").read_text()
    line = next(line for line in report.splitlines() if line.strip().startswith("activations "))
    assert "recomputed in the backward" in line and "checkpoints at 7 layer boundaries, 14.0 MiB a sample" in line
    assert f"{inner / MIB:.1f} MiB, against 82.5 MiB to keep them all" in line
    assert result.cost.recompute and result.cost.to_dict()["recompute"] is True


def test_activations_are_kept_where_the_batch_fits_one_pass():
    result = _compile(stack_graph(2, 1024, 2))
    assert result.placement.micro_batches == 1 and not result.placement.recompute and not result.cost.recompute
    assert "activations               kept, not recomputed" in render_report(result)


def test_the_step_time_includes_the_recomputed_forward():
    batch, seq, layers = 16, 1024, 8
    rows = batch * seq
    profile = get_profile("tiny")
    per_second = profile.pes * profile.flops_per_cycle("float32") * profile.clock_hz
    recomputed = _compile(stack_graph(batch, seq, layers))
    # 10.3 MiB a sample kept whole: 4 fit a pass; keeping checkpoints: 8 a pass
    assert recomputed.placement.recompute and recomputed.placement.micro_batch == 8
    kept = _compile(stack_graph(batch, seq, layers), micro_batch_size=4)
    assert not kept.placement.recompute
    forward_s = 0.0
    for cost_r, cost_k, kernel in zip(recomputed.cost.kernels, kept.cost.kernels, recomputed.kernels):
        if kernel.kind != "dense":
            continue
        # (rows x k) @ (k x n): 2 rows k n flops forward, twice that backward (input and weight
        # gradients), and with recompute the forward once more
        k, n = {0: (HIDDEN, FFN), 1: (FFN, HIDDEN)}[int(kernel.name.split("_")[1]) % 2]
        if kernel.name == "dense_16":  # the head
            k, n = HIDDEN, VOCAB
        forward = 2 * rows * k * n
        assert cost_k.compute_s == pytest.approx(3 * forward / per_second, rel=1e-12)
        assert cost_r.compute_s == pytest.approx(4 * forward / per_second, rel=1e-12)
        assert cost_r.recompute_flops == forward and cost_r.bound_by == "compute"
        forward_s += forward / per_second
    assert forward_s == pytest.approx((16 * 2 * rows * HIDDEN * FFN + 2 * rows * HIDDEN * VOCAB) / per_second)
    # the residual additions are bound by the fabric: forward, two inputs and one output of (rows, 64)
    # float32 cross the 2 x (32 + 32) links at the rectangle's edge, once more for the recompute
    additions_s = layers * 3 * rows * HIDDEN * 4 / (2 * (32 + 32) * profile.link_bytes_s)
    # the step: every forward once more; the loss's few microseconds besides (the two runs' passes
    # stream 4 MiB of weights in all, a few microseconds, under the compute)
    extra = recomputed.cost.iteration_s - kept.cost.iteration_s
    assert forward_s + additions_s <= extra <= 1.001 * (forward_s + additions_s)


def test_a_model_whose_checkpoints_do_not_fit_is_refused_with_the_figures():
    seq, layers = 8192, 64
    with pytest.raises(DeviceCompileError) as info:
        _compile(stack_graph(2, seq, layers))
    message = str(info.value)
    assert "\n" not in message
    found = re.search(r"the activations of one sample need ([\d,]+) bytes .* the checkpoints of (\d+) layers, ([\d,]+) "
                      r"bytes .*, and the largest layer's inner activations, ([\d,]+) bytes .*; keeping every "
                      r"activation would need ([\d,]+) bytes", message)
    assert found, message
    need, segments, checkpoints, inner, full = (int(g.replace(",", "")) for g in found.groups())
    layer_stash, residual = seq * (HIDDEN + FFN) * 4, seq * HIDDEN * 4
    assert full == layers * layer_stash + residual + seq * VOCAB * 4 + seq * 4
    # checkpoints: the residual stream at each boundary and the labels; a segment: whole layers
    # (the last with the head and the loss)
    assert checkpoints == (segments - 1) * residual + seq * 4 and need == checkpoints + inner
    assert inner % layer_stash in (0, residual + seq * VOCAB * 4 + seq * 4)
    # the fewest bytes: s segments need s - 1 checkpoints and one segment of at least layers / s layers
    tail = residual + seq * VOCAB * 4 + seq * 4
    fewest = min((s - 1) * residual + seq * 4 + -(-layers // s) * layer_stash for s in range(1, layers + 1))
    assert fewest <= need <= fewest + tail
    assert fewest > get_profile("tiny").sram_bytes  # so no choice of checkpoints fits one sample
    assert "50,331,648 bytes (48.0 MiB) are available on tiny" in message


def test_a_chosen_micro_batch_beyond_the_checkpoints_is_refused_with_the_figures():
    # 1.8 MiB of checkpoints and 1.5 MiB of the largest layer a sample: 14 fit beside the 128 KiB tile
    with pytest.raises(DeviceCompileError, match=r"device.micro_batch_size 16: .*recomputing each layer's "
                                                 r"activations in the backward: the checkpoints of 8 layers.*"
                                                 r"the largest that fits is 14"):
        _compile(stack_graph(16, 1024, 8), micro_batch_size=16)


def test_a_system_whose_share_of_the_batch_fits_whole_recomputes_nothing():
    # batch 16: 4 samples a pass fit keeping every activation, 8 keeping checkpoints
    recomputed = _compile(stack_graph(16, 1024, 8))
    kept = _compile(stack_graph(16, 1024, 8), micro_batch_size=4)
    assert recomputed.placement.recompute and recomputed.placement.kept_micro_batch == 4
    rows = {row["systems"]: row for row in recomputed.cost.systems}
    plain = {row["systems"]: row for row in kept.cost.systems}
    # on 4 systems each runs 4 samples in one pass, as the compile that keeps every activation does
    assert rows[4]["micro_batches"] == 1 and rows[4]["iteration_s"] == pytest.approx(plain[4]["iteration_s"], rel=1e-12)
    # on 2, each runs 8: one pass recomputing against two keeping them
    assert (rows[2]["micro_batches"], plain[2]["micro_batches"]) == (1, 2)
    assert rows[2]["iteration_s"] != pytest.approx(plain[2]["iteration_s"], rel=1e-3)

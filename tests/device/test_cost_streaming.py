"""Weight streaming with micro-batches: the estimate of a GPT-J-shaped graph, its bounds, the
external memory and the multi-system table, and the refusals of device.micro_batch_size."""

import math
import re
import xml.etree.ElementTree as ET

import pytest

from common.params import load_params
from device.api import compile_graph
from device.errors import DeviceCompileError
from device.graphs import GraphBuilder, attention_block, default_optimizer, layer_norm
from tests.device.graphs import mlp_graph
from zoo_base.errors import UserError

SEQ = 2048


def gptj_graph(batch: int, layers: int = 28, hidden: int = 4096, heads: int = 16, ffn: int = 16384,
               vocab: int = 50400):
    """GPT-J 6B's shapes (28 layers of 4096, MSL 2048, an untied 50,400-word head), float16 with adamw:
    attention and MLP side by side on one layer norm, as GPT-J has them (the attention block here adds
    a residual and a layer norm of its own: the same work to within a few per mille). No mask: the
    causal mask changes no shape."""
    b = GraphBuilder(file="gptj.py", precision="float16")
    ids = b.input("input_ids", (batch, SEQ), "int32")
    labels = b.input("labels", (batch * SEQ,), "int32")
    act = (batch, SEQ, hidden)
    x = b.op("embedding", [b.param("wte", (vocab, hidden)), ids], act)
    for i in range(layers):
        h = layer_norm(b, x, f"h{i}.ln")
        a = attention_block(b, h, heads, name=f"h{i}.attn")
        m = b.dense(b.dense(h, ffn, activation="gelu", name=f"h{i}.fc_in"), hidden, name=f"h{i}.fc_out")
        x = b.op("add", [x, b.op("add", [a, m], act)], act)
    x = layer_norm(b, x, "ln_f")
    x = b.op("reshape", [x], (batch * SEQ, hidden), attrs={"shape": [batch * SEQ, hidden]})
    b.cross_entropy(b.dense(x, vocab, name="lm_head"), labels)
    b.graph.optimizer = default_optimizer("adamw")
    return b.graph


def _compile(graph, **kwargs):
    return compile_graph(graph, mode="train", profile_name="wse3", execution_mode="weight_streaming", **kwargs)


@pytest.fixture(scope="module")
def gptj():
    return _compile(gptj_graph(64))


def test_gptj_compiles_at_batch_64_in_micro_batches(gptj, tmp_path):
    graph, cost = gptj.graph, gptj.cost
    assert 6.0e9 < graph.num_params() < 6.2e9
    micro, passes = cost.micro_batch_size, cost.micro_batches
    assert 1 <= micro < 64 and passes == math.ceil(64 / micro) >= 2
    # as few passes as the largest micro-batch that fits allows, as even as whole samples allow: one more
    # sample than the largest would not fit beside the largest tile
    with pytest.raises(DeviceCompileError, match="device.micro_batch_size 64: .* the largest that fits is") as info:
        _compile(gptj_graph(64), micro_batch_size=64)
    fits = int(str(info.value).rsplit(" ", 1)[1])
    assert passes == math.ceil(64 / fits) and micro == math.ceil(64 / passes)
    # a 2048-token sample keeps 6.3 GiB of activations: the micro-batch's would not fit, their
    # checkpoints at the layer boundaries and one layer's do (recomputed in the backward)
    assert gptj.placement.recompute and cost.recompute
    assert micro * gptj.placement.full_activation_bytes_per_sample > gptj.profile.sram_bytes
    assert micro * gptj.placement.activation_bytes_per_sample <= gptj.profile.sram_bytes
    rows = [r for r in gptj.placement.kernels if r.pes]
    assert all(r.memory_bytes <= gptj.profile.sram_bytes and r.inflight == micro for r in rows)
    # per system: samples/s and tokens/s of 2048-token samples
    assert cost.tokens_per_sample == SEQ and cost.tokens_per_s == pytest.approx(cost.samples_per_s * SEQ)
    # the external store: fp32 weights, adamw's two slots and the gradient accumulators
    weights = 4 * graph.num_params()
    assert cost.external_memory == {"weights": weights, "optimizer": 2 * weights, "gradients": weights}


def test_each_kernel_is_bound_by_the_larger_of_its_compute_and_its_weight_transfer(gptj):
    cost = gptj.cost
    working = [k for k in cost.kernels if k.bound_by != "free"]
    for k in working:
        assert k.passes == cost.micro_batches
        seconds = {"compute": k.compute_s, "memory": k.sram_s, "fabric": k.fabric_s, "weight streaming": k.stream_s}
        assert k.bound_by == max(seconds, key=seconds.get)
        # summed over the passes, max(work share, weights) each: the bound's seconds, up to the last,
        # shorter pass
        assert seconds[k.bound_by] * (1 - 1e-9) <= k.time_s <= seconds[k.bound_by] * (1 + 1 / (cost.micro_batches - 1))
    # the estimate is bound by what takes most of the iteration
    by_bound = cost.iteration_by_bound
    assert sum(by_bound.values()) == pytest.approx(cost.iteration_s)
    assert cost.bound_by == next(iter(by_bound))


def test_samples_per_s_is_flat_in_the_batch_once_micro_batched(gptj):
    micro = gptj.cost.micro_batch_size
    one_pass = _compile(gptj_graph(micro)).cost
    assert one_pass.micro_batches == 1
    big = gptj.cost  # batch 64: several passes
    # linear in the batch would be 64 / micro times more; micro-batched it stays within the bubble's share
    assert big.samples_per_s == pytest.approx(one_pass.samples_per_s, rel=0.1)
    assert big.samples_per_s < 1.5 * one_pass.samples_per_s < 64 / micro * one_pass.samples_per_s


def test_the_multi_system_table_is_monotone_and_below_linear(gptj):
    table = gptj.cost.systems
    assert [row["systems"] for row in table] == [1, 2, 4, 8, 16]
    assert table[0]["samples_per_s"] == pytest.approx(gptj.cost.samples_per_s)
    rates = [row["samples_per_s"] for row in table]
    assert all(a < b for a, b in zip(rates, rates[1:]))  # more systems, more samples/s
    for row in table[1:]:
        assert row["samples_per_s"] < row["systems"] * rates[0]  # never linear: the bubble grows with the tree
        assert row["batch_per_system"] == math.ceil(64 / row["systems"])
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * SEQ)


def test_the_report_gives_the_micro_batch_the_external_memory_and_the_systems(tmp_path):
    result = compile_graph(mlp_graph(batch=8192, sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                           execution_mode="weight_streaming", out_dir=tmp_path)
    cost = result.cost
    text = (tmp_path / "report.txt").read_text()
    assert (f"micro-batch               {cost.micro_batch_size:,} samples x {cost.micro_batches:,} passes per batch "
            "of 8,192") in text
    assert f"{cost.micro_batches} micro-batch passes of up to {cost.micro_batch_size} samples" in text  # the why
    assert "External memory" in text and f"({sum(cost.external_memory.values()):,} bytes)" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Systems (weight streaming"))
    assert [line.split()[0] for line in lines[start + 2:start + 7]] == ["1", "2", "4", "8", "16"]
    assert "tokens/s" not in lines[1]  # no token input: no tokens/s
    # the plot: a bar per number of systems, as tall as its samples/s
    bars = [e for e in ET.parse(tmp_path / "systems.svg").getroot().iter("{http://www.w3.org/2000/svg}rect")
            if e.get("class") == "systems"]
    heights = [float(e.get("height")) for e in bars]
    rates = [row["samples_per_s"] for row in cost.systems]
    assert len(bars) == 5 and [h / heights[0] for h in heights] == pytest.approx([r / rates[0] for r in rates],
                                                                                 abs=1e-2)


def test_pipelined_reports_no_micro_batch_and_no_systems():
    cost = compile_graph(mlp_graph(), mode="train", profile_name="tiny").cost
    assert cost.micro_batches == 0 and cost.systems == [] and cost.external_memory == {}


def test_a_chosen_micro_batch_is_used_and_the_last_pass_takes_the_rest():
    graph = mlp_graph(batch=64, sizes=(784, 2048, 2048, 10))
    cost = compile_graph(graph, mode="train", profile_name="tiny", execution_mode="weight_streaming",
                         micro_batch_size=24).cost
    assert (cost.micro_batch_size, cost.micro_batches) == (24, 3)  # 24 + 24 + 16
    whole = compile_graph(mlp_graph(batch=64, sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                          execution_mode="weight_streaming").cost
    assert whole.micro_batches == 1 and whole.samples_per_s > cost.samples_per_s  # fewer passes, fewer transfers


@pytest.mark.parametrize("value, message", [
    (0, "device.micro_batch_size must be a whole number of samples >= 1 or null (the largest that fits), got 0"),
    (2.5, "device.micro_batch_size must be a whole number of samples >= 1 or null (the largest that fits), got 2.5"),
    (100, "device.micro_batch_size 100 is larger than the batch of 64; use at most 64, or leave it unset (null) "
          "to take the largest that fits (64)"),
])
def test_bad_micro_batch_sizes_are_one_line(value, message):
    graph = mlp_graph(batch=64, sizes=(784, 2048, 2048, 10))
    with pytest.raises(UserError) as info:
        compile_graph(graph, mode="train", profile_name="tiny", execution_mode="weight_streaming",
                      micro_batch_size=value)
    assert str(info.value) == message


def test_a_micro_batch_in_pipelined_mode_is_refused():
    with pytest.raises(UserError) as info:
        compile_graph(mlp_graph(), mode="train", profile_name="tiny", micro_batch_size=4)
    assert str(info.value) == ("device.micro_batch_size 4 applies to device.execution_mode=weight_streaming only; "
                               "this compile is pipelined (set it to null)")


@pytest.mark.parametrize("value", ["0", "-2", "big", "2.5"])
def test_the_params_key_refuses_bad_values_in_one_line(value, tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("device:\n  execution_mode: weight_streaming\n")
    with pytest.raises(UserError) as info:
        load_params(str(path), {}, [f"device.micro_batch_size={value}"])
    assert "device.micro_batch_size" in str(info.value) and "\n" not in str(info.value)
    assert load_params(str(path), {}, ["device.micro_batch_size=8"])["device"]["micro_batch_size"] == 8


def test_each_system_rows_iteration_is_its_passes_plus_a_bubble_per_tree_level(tmp_path):
    """Every row of the multi-system table from the formula of device/README.md, worked here from its
    inputs: ceil(batch / N) samples per system in passes of at most the micro-batch, per kernel and pass
    the larger of its work on the pass's samples and its weights' transfer (training: 3x the fp32 weight
    bytes), plus the bubble (the first kernel's weights and the last one's gradients over the external
    link) once and once more per level of the tree (ceil(log2 N): 0, 1, 2, 3, 4 levels)."""
    result = compile_graph(mlp_graph(batch=64, sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                           execution_mode="weight_streaming", micro_batch_size=24, out_dir=tmp_path)
    cost, link = result.cost, result.profile.external_link_bytes_s
    working = [(k, c) for k, c in zip(result.kernels, cost.kernels) if c.bound_by != "free"]
    bubble = (working[0][0].weight_bytes + working[-1][0].weight_bytes) / link
    assert cost.bubble_s == pytest.approx(bubble, rel=1e-12)
    tree_levels = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4}
    # the passes per system: 64 = 24 + 24 + 16; 32 = 24 + 8; then one pass of 16, 8, 4
    passes = {1: [24, 24, 16], 2: [24, 8], 4: [16], 8: [8], 16: [4]}
    lines = (tmp_path / "report.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Systems (weight streaming"))
    one = None
    for row, line in zip(cost.systems, lines[start + 2:start + 7]):
        n = row["systems"]
        iteration = bubble * (1 + tree_levels[n])
        for k, c in working:
            work_per_sample = max(c.compute_s, c.sram_s, c.fabric_s) / 64
            iteration += sum(max(work_per_sample * m, 3 * k.weight_bytes / link) for m in passes[n])
        samples = min(64 / iteration, n * cost.transmission_samples_per_s)
        one = one or samples
        assert (row["batch_per_system"], row["micro_batches"]) == (sum(passes[n]), len(passes[n]))
        assert row["iteration_s"] == pytest.approx(iteration, rel=1e-12)
        assert row["samples_per_s"] == pytest.approx(samples, rel=1e-12)
        # the report's row: systems, batch per system, micro-batches, iteration, samples/s, tokens/s, speed-up
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[:3] == [str(n), str(sum(passes[n])), str(len(passes[n]))]
        assert (cells[4], cells[6]) == (f"{samples:,.1f}", f"{samples / one:.2f}x")
    # the tree's four levels are a quarter of the 16-system row's iteration: a level more or less shows
    assert 4 * bubble > 0.2 * cost.systems[-1]["iteration_s"]


def test_an_eval_compile_keeps_only_the_weights_in_external_memory(tmp_path):
    """Forward only: no gradients accumulate and the optimizer never runs, so the store holds the fp32
    weights alone, though the graph names adam; training adds adam's two slots and the accumulators."""
    sizes = (784, 2048, 2048, 10)
    weights = 4 * sum(a * b + b for a, b in zip(sizes, sizes[1:]))  # fp32 kernels and biases
    for mode, expected in [("eval", weights), ("train", weights + 2 * weights + weights)]:
        result = compile_graph(mlp_graph(batch=64, sizes=sizes, optimizer_kind="adam"), mode=mode,
                               profile_name="tiny", execution_mode="weight_streaming", out_dir=tmp_path / mode)
        memory = result.cost.external_memory
        assert memory["weights"] == weights and sum(memory.values()) == expected, mode
        lines = (tmp_path / mode / "report.txt").read_text().splitlines()
        at = next(i for i, x in enumerate(lines) if x.startswith("External memory"))
        assert lines[at + 1].startswith(f"  {expected / 2**20:.1f} MiB ({expected:,} bytes): weights ")
        assert ("optimizer" in lines[at + 1], "gradients" in lines[at + 1]) == ((mode == "train",) * 2)
        assert ("runs the optimizer" in lines[at]) == (mode == "train")
        # nor does the rest of the text speak of gradients in eval (the bubble, the micro-batches, the
        # bubble's legend), but for the per-kernel memory table's column
        told = [x.split()[0] for i, x in enumerate(lines) if "gradient" in x and i != at + 1]
        assert told == (["iteration", "micro-batch", "kernel"] if mode == "train" else ["kernel"])
        legend = "weights and gradients on the external link" if mode == "train" else "s, weights on the external"
        assert legend in (tmp_path / mode / "placement.svg").read_text()

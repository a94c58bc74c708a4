"""Profiles and placement: invariants of the rectangles and their memory."""

import itertools
import math

import pytest

from common.errors import UserError
from device.errors import DeviceCompileError
from device.optimizer import OptimizerSpec
from device.passes.match import Kernel, match
from device.cost import roofline
from device.place import _b, _pack, _water_fill, optimizer_slots, place
from device.profiles import PROFILES, get_profile
from tests.device.graphs import attention_graph, cnn_graph, mlp_graph

BIG_MLP = dict(sizes=(784, 2048, 2048, 10))  # ~5.8M params: with Adam, ~93 MB > tiny's 48 MiB


def test_unknown_profile_names_the_valid_ones():
    with pytest.raises(UserError) as info:
        get_profile("wse9")
    assert str(info.value) == "unknown device profile 'wse9'; valid profiles: small, tiny, wse1, wse2, wse3"


@pytest.mark.parametrize("name", ["wse1", "wse2", "wse3"])
def test_per_pe_figures_reproduce_the_published_totals(name):
    # wafer-facts.md: the per-PE numbers are derived from the table, so they must add back up to it
    p = PROFILES[name]
    assert p.marketed_pes * p.sram_bytes_per_pe == pytest.approx(p.sram_total_bytes, rel=0.10)
    assert p.marketed_pes * p.sram_bytes_per_cycle * p.clock_hz == pytest.approx(p.memory_bandwidth_bytes_s, rel=0.10)
    fabric_bits = p.marketed_pes * p.fabric_links * p.fabric_word_bytes * 8 * 2 * p.clock_hz  # both directions
    assert fabric_bits == pytest.approx(p.fabric_bandwidth_bits_s, rel=0.10)
    assert 0.85e9 <= p.clock_hz <= 1.1e9 and p.system_io_bits_s == 1.2e12


def test_test_profiles_share_the_per_pe_figures():
    wse2 = PROFILES["wse2"]
    for name, side in (("tiny", 32), ("small", 128)):
        p = PROFILES[name]
        assert (p.width, p.height) == (side, side)
        for field in ("sram_bytes_per_pe", "clock_hz", "flops_per_cycle_fp16", "flops_per_cycle_fp32",
                      "sram_bytes_per_cycle", "fabric_words_per_cycle_per_link"):
            assert getattr(p, field) == getattr(wse2, field)


def _check_invariants(placement, kernels, profile):
    placed = [r for r in placement.kernels if r.pes]
    by_name = {r.name: r for r in placement.kernels}
    assert set(by_name) == {k.name for k in kernels}  # every kernel has a row
    for k in kernels:
        assert (by_name[k.name].pes == 0) == k.free  # exactly the working kernels get PEs
    for r in placed:
        assert 0 <= r.x and 0 <= r.y and r.x + r.w <= profile.width and r.y + r.h <= profile.height
        assert r.memory_bytes <= r.pes * profile.sram_bytes_per_pe  # its memory fits its rectangle
    for a, b in itertools.combinations(placed, 2):
        overlap = a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h
        assert not overlap, (a.name, b.name)
    assert placement.active_pes == sum(r.pes for r in placed) <= profile.pes


@pytest.mark.parametrize("graph_fn", [mlp_graph, cnn_graph, attention_graph])
@pytest.mark.parametrize("profile_name", ["tiny", "small"])
def test_pipelined_placement_invariants(graph_fn, profile_name):
    graph = graph_fn()
    kernels = match(graph)
    profile = get_profile(profile_name)
    placement = place(kernels, profile, "pipelined", graph.optimizer, precision=graph.precision)
    _check_invariants(placement, kernels, profile)


def test_bert_sized_memory_floors_still_pack_on_wse2():
    from device.calibration import bert_large_graph

    graph = bert_large_graph(batch=64, layers=2)
    kernels = match(graph)
    placement = place(kernels, get_profile("wse2"), "pipelined", graph.optimizer, precision=graph.precision)
    _check_invariants(placement, kernels, get_profile("wse2"))


def test_more_work_gets_more_pes():
    graph = mlp_graph(sizes=(784, 256, 32, 10))
    placement = place(match(graph), get_profile("small"), "pipelined", graph.optimizer)
    pes = [placement.get(name).pes for name in ("dense_0", "dense_1", "dense_2")]
    assert pes[0] > pes[1] > pes[2]


def test_a_small_model_does_not_spread_past_its_parallelism():
    """A kernel gets at most one PE per multiply-add of a sample: on the whole wafer a small MLP
    leaves PEs idle rather than giving a PE less than one operation per sample."""
    graph = mlp_graph()
    kernels = match(graph)
    placement = place(kernels, get_profile("wse2"), "pipelined", graph.optimizer)
    for k in kernels:
        if not k.free:
            assert placement.get(k.name).pes <= max(1, k.flops_fwd // k.batch // 2) + placement.get(k.name).w
    assert placement.active_pes < 0.5 * get_profile("wse2").pes


@pytest.mark.parametrize("kind, slots", [("sgd", 0), ("momentum", 1), ("adam", 2), ("adamw", 2)])
def test_optimizer_state_slots(kind, slots):
    graph = mlp_graph(optimizer_kind=kind)
    placement = place(match(graph), get_profile("small"), "pipelined", graph.optimizer)
    row = placement.get("dense_0")
    assert row.weight_bytes == row.gradient_bytes == 4 * (784 * 64 + 64)
    assert row.optimizer_bytes == slots * row.weight_bytes


def test_eval_keeps_weights_only_and_two_samples():
    graph = mlp_graph(optimizer_kind="adam")
    placement = place(match(graph), get_profile("small"), "pipelined", graph.optimizer, training=False)
    row = placement.get("dense_0")
    assert row.gradient_bytes == row.optimizer_bytes == 0 and row.inflight == 2


def test_in_flight_samples_shrink_along_the_pipeline():
    graph = mlp_graph(batch=64)
    placement = place(match(graph), get_profile("small"), "pipelined", graph.optimizer)
    inflight = [r.inflight for r in placement.kernels]
    assert inflight == [7, 5, 3, 1]  # 2 * (S - 1 - i) + 1 with S = 4 kernels
    kernels = match(graph)
    assert placement.kernels[0].activation_bytes == 7 * kernels[0].stash_bytes // 64


def test_too_large_for_pipelined_names_the_kernel_and_the_bytes_and_suggests_streaming():
    graph = mlp_graph(**BIG_MLP)
    with pytest.raises(DeviceCompileError) as info:
        place(match(graph), get_profile("tiny"), "pipelined", graph.optimizer)
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert "'dense_1'" in message  # 2048 x 2048: the largest
    # fp32 weights, gradients, 2 Adam slots + 5 samples in flight of its (batch 8) 2048-wide fp32 input
    assert f"needs {16 * (2048 * 2048 + 2048) + 5 * 2048 * 4:,} bytes" in message
    assert f"{32 * 32 * 48 * 1024:,} bytes" in message  # what tiny has
    assert "device.execution_mode=weight_streaming" in message
    assert "\n" not in message


def test_too_large_for_pipelined_places_in_weight_streaming():
    graph = mlp_graph(**BIG_MLP)
    kernels = match(graph)
    profile = get_profile("tiny")
    placement = place(kernels, profile, "weight_streaming", graph.optimizer)
    for row in placement.kernels:
        assert (row.x, row.y, row.w, row.h) == (0, 0, 32, 32)  # one layer at a time, the whole fabric
        assert row.optimizer_bytes == 0  # the external store runs the optimizer
        assert row.memory_bytes <= profile.sram_bytes
    assert placement.active_pes == profile.pes


def test_weight_streaming_splits_a_batch_whose_activations_do_not_fit_into_micro_batches():
    graph = mlp_graph(batch=8192, sizes=(784, 2048, 2048, 10))
    kernels = match(graph)
    profile = get_profile("tiny")
    placement = place(kernels, profile, "weight_streaming", graph.optimizer)
    per_sample = sum(k.stash_bytes for k in kernels if not k.free) / 8192
    micro, passes = placement.micro_batch, placement.micro_batches
    assert 1 < passes == -(-8192 // micro) and micro < 8192  # as few passes as fit, as even as they can be
    for row in placement.kernels:
        if row.pes:
            assert row.inflight == micro and row.memory_bytes <= profile.sram_bytes
    # the largest that fits: as many passes with one sample more each would not fit beside the largest tile
    tile = max(r.weight_bytes + r.gradient_bytes + r.state_bytes for r in placement.kernels if r.pes)
    assert tile + math.ceil(-(-8192 // (passes - 1)) * per_sample) > profile.sram_bytes


def test_weight_streaming_refuses_a_sample_whose_activations_do_not_fit():
    graph = mlp_graph(batch=4, sizes=(8_000_000, 2, 10))  # 32 MB of input per sample beside 24 MiB of tile
    with pytest.raises(DeviceCompileError, match="the activations of one sample need .* on tiny; shorten") as info:
        place(match(graph), get_profile("tiny"), "weight_streaming", graph.optimizer)
    assert "\n" not in str(info.value)


def test_unknown_execution_mode():
    with pytest.raises(UserError, match="unknown device.execution_mode 'fast'"):
        place(match(mlp_graph()), get_profile("tiny"), "fast")


def test_placement_is_deterministic():
    graph = cnn_graph()
    a = place(match(graph), get_profile("tiny"), "pipelined", graph.optimizer)
    b = place(match(graph), get_profile("tiny"), "pipelined", graph.optimizer)
    assert a.to_dict() == b.to_dict()


def _kernel(name, kind="dense", batch=8, **figures):
    """A kernel with the figures given and nothing else (placement reads only these)."""
    return Kernel(name, kind, [name], [kind], [], [], [], [], batch, loc=f"model.py:{len(name)}", **figures)


@pytest.mark.parametrize("optimizer, expected", [
    (None, ("sgd", 0)), ("sgd", ("sgd", 0)), ("momentum", ("momentum", 1)), ("adam", ("adam", 2)),
    ("adamw", ("adamw", 2)), (OptimizerSpec("sgd", "torch"), ("sgd", 0)),
    (OptimizerSpec("sgd", "torch", {"momentum": 0.0}), ("sgd", 0)),
    (OptimizerSpec("sgd", "torch", {"momentum": 0.9}), ("momentum", 1)),
    (OptimizerSpec("adam", "tf", {"momentum": 0.9}), ("adam", 2)),  # momentum matters to sgd only
])
def test_optimizer_slots_per_optimizer(optimizer, expected):
    assert optimizer_slots(optimizer) == expected


@pytest.mark.parametrize("optimizer", ["lamb", OptimizerSpec("lamb", "torch")])
def test_unknown_optimizer_names_the_valid_ones(optimizer):
    with pytest.raises(UserError) as info:
        optimizer_slots(optimizer)
    assert str(info.value) == "unknown optimizer 'lamb'; valid optimizers: sgd, momentum, adam, adamw"


def test_bytes_read_as_bytes_and_mebibytes():
    assert _b(3 * 2**20 + 2**19 + 7.9) == "3,670,023 bytes (3.5 MiB)"


def test_placement_to_dict_holds_every_field_as_the_report_shows_it():
    graph = mlp_graph()
    profile = get_profile("tiny")
    placement = place(match(graph), profile, "weight_streaming", graph.optimizer)
    data = placement.to_dict()
    assert {k: v for k, v in data.items() if k != "kernels"} == {
        "mode": "weight_streaming", "profile": "tiny", "width": 32, "height": 32,
        "sram_bytes_per_pe": profile.sram_bytes_per_pe, "optimizer": "adam", "training": True,
        "active_pes": 1024, "fabric_pes": 1024, "micro_batch": 8, "micro_batches": 1,
        "recompute": False, "activation_bytes_per_sample": placement.full_activation_bytes_per_sample,
        "full_activation_bytes_per_sample": placement.full_activation_bytes_per_sample,
        "checkpoint_bytes_per_sample": 0, "layers": 0, "kept_micro_batch": 8}
    assert [row["name"] for row in data["kernels"]] == [r.name for r in placement.kernels]
    for row, r in zip(data["kernels"], placement.kernels):
        assert row == {"name": r.name, "kind": r.kind, "x": r.x, "y": r.y, "w": r.w, "h": r.h,
                       "weight_bytes": r.weight_bytes, "gradient_bytes": r.gradient_bytes,
                       "optimizer_bytes": r.optimizer_bytes, "state_bytes": r.state_bytes,
                       "activation_bytes": r.activation_bytes, "inflight": r.inflight,
                       "pes": r.w * r.h, "memory_bytes": r.memory_bytes, "memory_per_pe": r.memory_per_pe}
    first = data["kernels"][0]
    assert first["pes"] == 1024 and first["memory_bytes"] == (
        first["weight_bytes"] + first["gradient_bytes"] + first["state_bytes"] + first["activation_bytes"])
    assert first["memory_per_pe"] == first["memory_bytes"] / 1024


def test_water_fill_shares_the_area_by_work_between_floors_and_caps():
    # lam = 17.5: the first kernel stays at its floor, the second at its cap, the third takes the rest
    assert _water_fill([5, 1, 1], [5, 8, 100], [1, 1, 1], 30.5) == [5, 8, 17]
    assert _water_fill([1, 1], [100, 100], [1, 3], 40.5) == [10, 30]  # areas in proportion to the work
    assert _water_fill([1], [100], [1], 10.5) == [10]  # one kernel takes all it can
    assert _water_fill([1, 2], [100, 100], [0.25, 0.75], 8.5) == [2, 6]  # work summing to 1
    assert _water_fill([1, 1], [100, 100], [0, 1], 10.5) == [1, 9]  # a kernel without work keeps its floor
    assert _water_fill([1], [100], [1], 10) == [10]  # areas that add up to the total exactly


def test_water_fill_keeps_the_floors_when_there_is_no_room_or_no_work():
    assert _water_fill([3, 4], [10, 10], [1, 1], 7) == [3, 4]  # the floors take the whole total
    assert _water_fill([3, 4], [10, 10], [1, 1], 6) == [3, 4]
    assert _water_fill([3, 4], [10, 10], [0, 0], 100) == [3, 4]  # no work to share by


def test_water_fill_cap_holds_a_kernel_of_much_work():
    assert _water_fill([1, 1], [4, 100], [100, 1], 20.5) == [4, 16]


def test_pack_fills_columns_in_a_snake_and_gives_a_large_kernel_full_columns():
    # the first column holds 6 (a second kernel would pass 2 x 4); the second, 4 + 4, bottom-up;
    # 10 > 2 x 4 gets a block of 3 full-height columns
    assert _pack([6, 4, 4, 10], 2, 10, 4) == [(0, 0, 2, 3), (2, 2, 2, 2), (2, 0, 2, 2), (4, 0, 3, 4)]
    assert _pack([6, 4, 4, 10], 2, 7, 4) == [(0, 0, 2, 3), (2, 2, 2, 2), (2, 0, 2, 2), (4, 0, 3, 4)]
    assert _pack([6, 4, 4, 10], 2, 6, 4) is None  # the block passes the right edge
    assert _pack([6, 4, 4, 10], 2, 3, 4) is None  # the second column passes it
    assert _pack([10, 2], 2, 4, 4) == [(0, 0, 3, 4), (3, 2, 1, 2)]  # the column after a block fills bottom-up


def test_pack_puts_at_most_a_column_height_of_kernels_in_a_column():
    assert _pack([1] * 5, 4, 3, 2) == [(0, 0, 1, 1), (0, 1, 1, 1), (1, 1, 1, 1), (1, 0, 1, 1), (2, 0, 1, 1)]
    assert _pack([1] * 5, 4, 2, 2) is None


def test_pack_widens_a_column_until_its_kernels_stack_in_whole_rows():
    # 11 PEs in a column of height 4: 3 wide would need 2 + 2 + 1 = 5 rows, 4 wide 5 too, 5 wide 3
    assert _pack([5, 5, 1], 4, 5, 4) == [(0, 0, 5, 1), (0, 1, 5, 1), (0, 2, 5, 1)]
    assert _pack([5, 5, 1], 4, 4, 4) is None


def test_pack_of_an_exact_column_and_block():
    assert _pack([4, 4], 1, 2, 4) == [(0, 0, 1, 4), (1, 0, 1, 4)]  # a column of exactly column x height
    assert _pack([9], 2, 3, 4) == [(0, 0, 3, 3)]  # 9 > 8: 3 columns of 3 rows
    assert _pack([], 2, 3, 4) == []


def test_pack_keeps_a_column_as_narrow_as_keeps_each_kernels_rows():
    # kept columns of 4: 5 PEs take 2 rows at 4 wide, and 2 rows hold them at 3 wide too (a 4th PE
    # across would stay idle); narrowed, the same kernel stands in one column of 5 rows
    assert _pack([5, 3], 4, 32, 32, narrow=False) == [(0, 0, 3, 2), (0, 2, 3, 1)]
    assert _pack([2], 4, 32, 32, narrow=False) == [(0, 0, 2, 1)]  # no wider than its largest kernel
    assert _pack([5, 3], 4, 32, 32) == [(0, 0, 1, 5), (0, 5, 1, 3)]


def test_too_large_message_in_full():
    sram = get_profile("tiny").sram_bytes_per_pe
    kernels = [_kernel("small", weight_bytes=sram), _kernel("big", weight_bytes=600 * sram),
               _kernel("mid", weight_bytes=500 * sram)]
    with pytest.raises(DeviceCompileError) as info:
        place(kernels, get_profile("tiny"), "pipelined", "sgd", training=False)
    need = 1101 * sram
    assert str(info.value) == (
        f"the model does not fit the tiny fabric in pipelined mode: its kernels need {need:,} bytes "
        f"({need / 2**20:.1f} MiB) of SRAM (fp32 weights, gradients, none state, in-flight activations), "
        f"50,331,648 bytes (48.0 MiB) are available (32 x 32 PEs x {sram:,} bytes); the largest kernel 'big' "
        f"(dense, model.py:3) needs {600 * sram:,} bytes (28.1 MiB); "
        "stream the weights instead: device.execution_mode=weight_streaming")


def test_kernels_whose_memory_fits_but_cannot_be_packed():
    # 31 kernels of 33 PEs each: 1,023 of tiny's 1,024 PEs, but no packing in whole rectangles wastes
    # less than one PE; the eleventh holds one byte more, so it is the largest
    sram = get_profile("tiny").sram_bytes_per_pe
    kernels = [_kernel(f"k{i}", weight_bytes=33 * sram - (i != 10)) for i in range(31)]
    with pytest.raises(DeviceCompileError) as info:
        place(kernels, get_profile("tiny"), "pipelined", training=False)
    message = str(info.value)
    assert message.startswith("the model cannot be packed onto the tiny fabric in pipelined mode: its kernels "
                              f"need {31 * 33 * sram - 30:,} bytes")
    assert f"the largest kernel 'k10' (dense, model.py:3) needs {33 * sram:,} bytes" in message
    assert "(fp32 weights, gradients, none state, in-flight activations)" in message
    del kernels[26:]  # 26 kernels of 33 PEs pack (in columns of 6: 5 kernels of 6 x 6 a column)
    _check_invariants(place(kernels, get_profile("tiny"), "pipelined", training=False), kernels, get_profile("tiny"))


def _streaming_kernels(batch=10):
    """Two working kernels and a free one; 'a' holds more weights than a tile: 6,000,000 bytes of
    stash per sample beside a's 24 MiB tile (weights in, gradients out) leave room for 4 samples on tiny."""
    return [_kernel("a", batch=batch, weight_bytes=20_000_000, stash_bytes=20_000_000 // 10 * batch,
                    input_bytes=800, activation_bytes=400),
            _kernel("f", kind="layout", batch=batch),
            _kernel("b", batch=batch, weight_bytes=1000, state_bytes=96, stash_bytes=40_000_000 // 10 * batch,
                    input_bytes=2400, activation_bytes=16000)]


def test_weight_streaming_rows_in_full():
    placement = place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", "adam")
    half_tile = 50_331_648 // 4  # the tile is half the SRAM, weights in and gradients out a half each
    a, f, b = (placement.get(n) for n in "afb")
    assert (placement.micro_batch, placement.micro_batches) == (4, 3)  # 10 = 4 + 4 + 2
    assert (a.w, a.h, a.weight_bytes, a.gradient_bytes, a.optimizer_bytes, a.state_bytes) == (
        32, 32, half_tile, half_tile, 0, 0)
    assert (b.w, b.h, b.weight_bytes, b.gradient_bytes, b.optimizer_bytes, b.state_bytes) == (32, 32, 1000, 1000, 0, 96)
    assert isinstance(a.weight_bytes, int) and isinstance(a.gradient_bytes, int)  # whole bytes in report.json
    assert a.activation_bytes == b.activation_bytes == 4 * 6_000_000 and a.inflight == b.inflight == 4
    assert (f.w, f.h, f.memory_bytes, f.inflight) == (0, 0, 0, 0)
    assert placement.active_pes == 1024 and placement.optimizer == "adam"


def test_weight_streaming_micro_batch_size_given():
    placement = place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", micro_batch_size=3)
    assert (placement.micro_batch, placement.micro_batches) == (3, 4)
    assert placement.get("b").activation_bytes == 18_000_000 and placement.get("b").inflight == 3
    placement = place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", micro_batch_size=4)
    assert (placement.micro_batch, placement.micro_batches) == (4, 3)


@pytest.mark.parametrize("micro, batch, message", [
    (5, 10, "device.micro_batch_size 5: the activations of a micro-batch of 5 need 30,000,000 bytes (28.6 MiB) of "
            "SRAM next to the weight tile of 'a' (25,165,824 bytes (24.0 MiB)), 50,331,648 bytes (48.0 MiB) are "
            "available on tiny; the largest that fits is 4"),
    (11, 10, "device.micro_batch_size 11 is larger than the batch of 10; use at most 10, or leave it unset (null) to "
             "take the largest that fits (4)"),
    (2, 50, "device.micro_batch_size 2: the activations of a micro-batch of 2 need 60,000,000 bytes (57.2 MiB) of "
            "SRAM next to the weight tile of 'a' (25,165,824 bytes (24.0 MiB)), 50,331,648 bytes (48.0 MiB) are "
            "available on tiny; not even one sample fits"),
    (60, 50, "device.micro_batch_size 60 is larger than the batch of 50; use at most 50, or leave it unset (null) to "
             "take the largest that fits (1)"),
])
def test_weight_streaming_refuses_a_micro_batch_size_that_does_not_fit(micro, batch, message):
    # batch 50: 30,000,000 bytes of stash per sample, more than the room beside the tile
    kernels = _streaming_kernels(batch)
    if batch == 50:
        for k in kernels:
            k.stash_bytes *= 5
    with pytest.raises(DeviceCompileError) as info:
        place(kernels, get_profile("tiny"), "weight_streaming", micro_batch_size=micro)
    assert str(info.value) == message


def test_weight_streaming_forward_only_holds_the_largest_kernels_activations():
    placement = place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", "adam", training=False)
    a, b = placement.get("a"), placement.get("b")
    assert a.gradient_bytes == b.gradient_bytes == 0 and placement.optimizer == "none"
    assert a.weight_bytes == 50_331_648 // 4 and b.weight_bytes == 1000
    # b's 2,400 in and 16,000 out for 10 samples: 1,840 bytes a sample, the whole batch fits
    assert (placement.micro_batch, placement.micro_batches) == (10, 1)
    assert a.activation_bytes == b.activation_bytes == 18_400 and a.inflight == 10


def test_weight_streaming_without_activations_takes_the_whole_batch():
    kernels = [_kernel("a", batch=6, weight_bytes=100), _kernel("b", batch=6, weight_bytes=50_000_000)]
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (6, 1)
    assert placement.get("a").activation_bytes == 0 and placement.get("b").inflight == 6


def test_a_graph_of_layout_kernels_only_places_nothing():
    kernels = [_kernel("r", kind="layout"), _kernel("t", kind="layout")]
    for mode in ("pipelined", "weight_streaming"):
        placement = place(kernels, get_profile("tiny"), mode)
        assert [(r.name, r.pes, r.memory_bytes) for r in placement.kernels] == [("r", 0, 0), ("t", 0, 0)]
        assert placement.active_pes == 0 and (placement.micro_batch, placement.micro_batches) == (0, 0)



@pytest.mark.parametrize("value", [True, 2.5, "4", 0, -1])
def test_micro_batch_size_must_be_a_whole_number(value):
    with pytest.raises(UserError) as info:
        place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", micro_batch_size=value)
    assert str(info.value) == ("device.micro_batch_size must be a whole number of samples >= 1 or null (the largest "
                               f"that fits), got {value!r}")


def test_micro_batch_size_applies_to_weight_streaming_only():
    with pytest.raises(UserError) as info:
        place(_streaming_kernels(), get_profile("tiny"), micro_batch_size=1)
    assert str(info.value) == ("device.micro_batch_size 1 applies to device.execution_mode=weight_streaming only; "
                               "this compile is pipelined (set it to null)")
    placement = place(_streaming_kernels(), get_profile("tiny"), "weight_streaming", micro_batch_size=1)
    assert (placement.micro_batch, placement.micro_batches) == (1, 10)


def test_weight_streaming_room_for_exactly_one_or_a_few_samples():
    # a's tile and state leave room for 3 bytes: 3 samples of 1 byte, 1 sample of 3
    sram = get_profile("tiny").sram_bytes
    kernels = [_kernel("a", batch=8, weight_bytes=sram, state_bytes=sram // 2 - 3, stash_bytes=8)]
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (3, 3)
    kernels[0].stash_bytes = 24
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (1, 8)
    with pytest.raises(DeviceCompileError, match="the largest that fits is 1$"):
        place(kernels, get_profile("tiny"), "weight_streaming", micro_batch_size=2)
    kernels = [_kernel("a", batch=6, weight_bytes=100)]  # one kernel, no activations: the whole batch
    placement = place(kernels, get_profile("tiny"), "weight_streaming", micro_batch_size=6)
    assert (placement.micro_batch, placement.micro_batches) == (6, 1)
    assert isinstance(placement.get("a").weight_bytes, int) and isinstance(placement.get("a").gradient_bytes, int)


def test_weight_streaming_counts_an_exact_fit_in_whole_bytes():
    # 29 bytes of stash for 7 samples beside a tile that leaves 29 bytes: the whole batch fits
    # exactly (in floats 29 // (29 / 7) is 6.0, and 7 * (29 / 7) is 29.000000000000004)
    sram = get_profile("tiny").sram_bytes
    kernels = [_kernel("a", batch=7, weight_bytes=sram, state_bytes=sram // 2 - 29, stash_bytes=29)]
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (7, 1)
    assert placement.get("a").activation_bytes == 29 and placement.get("a").memory_bytes == sram
    placement = place(kernels, get_profile("tiny"), "weight_streaming", micro_batch_size=7)
    assert (placement.micro_batch, placement.micro_batches) == (7, 1)
    kernels[0].stash_bytes = 30  # one byte more: 6 samples (180 / 7 = 25.7 bytes) fit, 7 do not
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (4, 2)
    assert placement.get("a").activation_bytes == 18  # 4 * 30 / 7 = 17.1, whole bytes up


def test_weight_streaming_of_one_sample():
    kernels = [_kernel("a", batch=1, weight_bytes=100, stash_bytes=1000)]
    placement = place(kernels, get_profile("tiny"), "weight_streaming")
    assert (placement.micro_batch, placement.micro_batches) == (1, 1)
    assert placement.get("a").activation_bytes == 1000


def test_weight_streaming_refuses_a_batch_of_one_sample_that_does_not_fit():
    # a batch of one: the sample's activations are the whole stash (48 MiB beside a tile of 200 bytes)
    sram = get_profile("tiny").sram_bytes
    kernels = [_kernel("a", batch=1, weight_bytes=100, stash_bytes=sram)]
    with pytest.raises(DeviceCompileError) as info:
        place(kernels, get_profile("tiny"), "weight_streaming")
    assert str(info.value) == (
        "in weight streaming the activations of one sample need 50,331,648 bytes (48.0 MiB) of SRAM next to the "
        "weight tile of 'a' (200 bytes (0.0 MiB)), 50,331,648 bytes (48.0 MiB) are available on tiny; shorten the "
        "sequence or the image, or use a profile with more SRAM")
    with pytest.raises(DeviceCompileError) as info:
        place(kernels, get_profile("tiny"), "weight_streaming", micro_batch_size=1)
    assert str(info.value).startswith("device.micro_batch_size 1: the activations of a micro-batch of 1 need "
                                      "50,331,648 bytes (48.0 MiB) of SRAM")
    assert str(info.value).endswith("not even one sample fits")


def test_unknown_execution_mode_names_the_valid_ones():
    with pytest.raises(UserError) as info:
        place(_streaming_kernels(), get_profile("tiny"), "fast")
    assert str(info.value) == "unknown device.execution_mode 'fast'; valid modes: pipelined, weight_streaming"


def _work_kernels():
    """'a' computes (its backward twice its forward), 'b' reads SRAM: in float32 training a has 3/2 of
    b's work; in float16 (twice the rate) or forward only, less than b's."""
    return [_kernel("a", flops_fwd=1e6, flops_bwd=2e6),
            _kernel("r", kind="layout"),
            _kernel("b", flops_fwd=16_000, sram_bytes_fwd=24 * 0.5e6)]


def test_pipelined_areas_follow_the_work_of_the_precision_and_the_mode():
    profile = get_profile("tiny")
    default = place(_work_kernels(), profile)  # pipelined, float32, training
    assert default.mode == "pipelined" and default.optimizer == "sgd" and default.training is True
    assert default.get("a").pes > 1.4 * default.get("b").pes
    half = place(_work_kernels(), profile, precision="float16")
    assert half.get("a").pes < half.get("b").pes
    forward = place(_work_kernels(), profile, training=False)
    assert forward.get("a").pes < forward.get("b").pes and forward.optimizer == "none"
    for placement in (default, forward):
        assert (lambda r: (r.x, r.y, r.w, r.h, r.memory_bytes))(placement.get("r")) == (0, 0, 0, 0, 0)
        _check_invariants(placement, _work_kernels(), profile)


def test_pipelined_kernel_without_work_or_memory_gets_one_pe():
    placement = place([_kernel("a"), _kernel("b", flops_fwd=1e6)], get_profile("tiny"))
    assert placement.get("a").pes == 1 and placement.get("b").pes > 1


def test_pipelined_rows_of_a_small_batch():
    kernels = [_kernel(n, batch=3, weight_bytes=100, stash_bytes=10) for n in "abcd"]
    placement = place(kernels, get_profile("tiny"), optimizer="momentum")
    assert [r.inflight for r in placement.kernels] == [3, 3, 3, 1]  # at most the batch
    assert [r.activation_bytes for r in placement.kernels] == [10, 10, 10, 4]  # ceil(1 * 10 / 3)
    assert [r.optimizer_bytes for r in placement.kernels] == [100] * 4
    kernels = [_kernel("a", batch=1, stash_bytes=10)]
    assert place(kernels, get_profile("tiny"), training=False).get("a").activation_bytes == 10


def test_pipelined_floors_that_take_the_whole_fabric_still_pack():
    # 32 kernels of 32 PEs of memory each: every PE of tiny, a full column each
    sram = get_profile("tiny").sram_bytes_per_pe
    kernels = [_kernel(f"k{i}", weight_bytes=32 * sram) for i in range(32)]
    placement = place(kernels, get_profile("tiny"), training=False)
    assert [(r.x, r.w, r.h) for r in placement.kernels] == [(i, 1, 32) for i in range(32)]


def test_pipelined_tries_wider_columns_when_narrow_ones_do_not_pack():
    # 40 kernels of 17 PEs: one a column of width 1 would need 40 columns; in columns of 2, three each
    sram = get_profile("tiny").sram_bytes_per_pe
    kernels = [_kernel(f"k{i}", weight_bytes=17 * sram) for i in range(40)]
    placement = place(kernels, get_profile("tiny"), training=False)
    _check_invariants(placement, kernels, get_profile("tiny"))
    assert placement.active_pes >= 40 * 17



def test_pipelined_tries_the_column_as_wide_as_the_fabric():
    # b only moves bytes (no work: the water fill leaves it 1 PE); stacked in one column as wide as
    # the fabric it gets a whole row, 2 x (32 + 1) boundary links, where narrower columns leave it
    # a 1 x 1 PE and 4 links; a has 992 PEs either way
    kernels = [_kernel("a", flops_fwd=1e6, flops_bwd=1e6), _kernel("b", input_bytes=500_000)]
    placement = place(kernels, get_profile("tiny"))
    assert [(r.x, r.y, r.w, r.h) for r in placement.kernels] == [(0, 0, 32, 31), (0, 31, 32, 1)]


def test_pipelined_compares_column_widths_by_the_work_of_the_mode():
    # b's backward is two thirds of its work: in training it is the slowest kernel on the 1 x 11
    # PEs narrow columns leave it, and the fabric-wide column's row of 32 is faster; judged by its
    # forward alone, a would be the slowest in both (992 PEs) and the narrow layout would stay
    kernels = [_kernel("a", flops_fwd=5e8), _kernel("b", flops_fwd=2e6, flops_bwd=4e6)]
    placement = place(kernels, get_profile("tiny"))
    assert [(r.x, r.y, r.w, r.h) for r in placement.kernels] == [(0, 0, 32, 31), (0, 31, 32, 1)]


def test_pipelined_compares_column_widths_at_the_rate_of_the_precision():
    # in float32 the compute of a is the slowest, and narrower columns give it a block of 29 x 32 PEs against
    # the fabric-wide column's 32 x 28; at the float16 rate (twice float32's) c's SRAM traffic on
    # 3 PEs would look the slowest, and the fabric-wide column, a row of 32 for c, would win
    kernels = [_kernel("a", flops_fwd=5e8, flops_bwd=5e8), _kernel("b", flops_fwd=2e7, flops_bwd=8e7),
               _kernel("c", flops_fwd=1000, sram_bytes_fwd=2e7)]
    placement = place(kernels, get_profile("tiny"))
    assert [(r.x, r.y, r.w, r.h) for r in placement.kernels] == [(0, 0, 29, 32), (29, 1, 3, 31), (29, 0, 3, 1)]


def test_pipelined_kernel_of_one_sample_spreads_to_one_pe_per_multiply_add():
    placement = place([_kernel("a", batch=1, flops_fwd=20)], get_profile("tiny"))
    a = placement.get("a")  # 20 flops: 10 multiply-adds, in whole rows of its rectangle's width
    assert a.pes >= 10 and a.pes - a.w < 10


def _slowest(placement, kernels, profile):
    return max(max(roofline(k, r.w, r.h, profile, "float32", True).values())
               for k, r in ((k, placement.get(k.name)) for k in kernels))


def test_pipelined_taller_fabric_is_never_slower_for_fabric_bound_kernels():
    # A model far smaller than the fabric: every kernel at one PE per multiply-add, all in one column.
    # Narrowed to its kernels, that column was as narrow as the fabric is tall allows: 59 PEs on
    # wse2's 996 rows, 50 on wse3's 1,172, so each fabric-bound kernel had fewer boundary links on
    # the larger wafer (a tiny BERT: 141.7 M samples/s on wse2, 121.1 M on wse3). wse3's fabric holds
    # wse2's (762 x 1172 against 757 x 996), so whatever packs on wse2 packs there too.
    kernels = [_kernel(f"k{i}", batch=3, flops_fwd=3 * 2 * area, input_bytes=20_000, activation_bytes=20_000,
                       stash_bytes=1_000) for i, area in enumerate([128, 512, 2112, 64, 5248, 4160, 1536] * 6)]
    times = {}
    for name in ("wse2", "wse3"):
        profile = get_profile(name)
        placement = place(kernels, profile, training=True)
        _check_invariants(placement, kernels, profile)
        times[name] = _slowest(placement, kernels, profile)
    assert times["wse3"] <= times["wse2"]


def test_pipelined_fabric_bound_kernel_keeps_its_time_whatever_its_work_share():
    # The twins of T5 (params config) differ in one kernel: PyTorch's loss has 20 % more FLOPs than
    # TF's (the frameworks lower cross entropy to other ops), both fabric-bound. Sized by work share
    # and packed into columns narrowed to their kernels, the two losses got rectangles of other shapes
    # and the estimates parted by 1.5x (2,898,954 against 1,933,108 samples/s on wse2); here by 4.2x.
    def model(loss_flops):
        body = [_kernel(f"k{i}", batch=32, flops_fwd=32 * 2 * area, input_bytes=2_000_000,
                        activation_bytes=2_000_000, stash_bytes=1_000)
                for i, area in enumerate([64, 2048, 16384, 64, 2048, 16384, 16384, 8192, 16384, 40000, 2048,
                                          16384, 40000, 512])]
        loss = _kernel("loss", "softmax_loss", batch=32, flops_fwd=loss_flops, input_bytes=16_000_000,
                       activation_bytes=4, stash_bytes=1_000)
        return body[:6] + [loss] + body[6:]

    profile = get_profile("wse2")
    times = [_slowest(place(kernels, profile, training=True), kernels, profile)
             for kernels in (model(25_000_000), model(21_000_000))]
    assert times[0] == pytest.approx(times[1], rel=0.05)

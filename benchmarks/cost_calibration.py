"""Calibration of the device cost model: BERT-Large on wse2, pipelined, against the published figure.

    python benchmarks/cost_calibration.py

Prints the predicted samples/s (an estimate of device/cost.py, from the hand-built graph
of device/calibration.py alone), the observed ~6,400 samples/s of
/work/shared/reference/wafer-facts.md, and the ratio predicted/observed. A cost model
within a factor of 2 of the observation is credible (wafer-facts.md).
"""

from device.calibration import OBSERVED_SAMPLES_PER_S, predict


def main() -> None:
    result = predict("wse2", "pipelined")
    cost = result.cost
    ratio = cost.samples_per_s / OBSERVED_SAMPLES_PER_S
    slowest = max(cost.kernels, key=lambda k: k.time_s)
    print("BERT-Large, seq 128, batch 1024, training, wse2, layer-pipelined")
    print(f"  parameters               {result.graph.num_params():,}")
    print(f"  kernels                  {sum(not k.free for k in result.kernels)} placed "
          f"(+{sum(k.free for k in result.kernels)} free layout)")
    print(f"  predicted samples/s      {cost.samples_per_s:,.0f}   (estimate)")
    print(f"  observed samples/s       {OBSERVED_SAMPLES_PER_S:,.0f}   (wafer-facts.md)")
    print(f"  ratio predicted/observed {ratio:.2f}")
    print(f"  effective PF/s           {cost.flops_per_sample * cost.samples_per_s / 1e15:.2f}")
    print(f"  active PEs               {cost.active_pes_pct:.1f} %")
    print(f"  compute utilisation      {cost.compute_utilisation_pct:.1f} %")
    print(f"  slowest kernel           {slowest.name} ({slowest.kind}), bound by {slowest.bound_by}")
    used = sum(k.memory_bytes for k in result.placement.kernels)
    print(f"  SRAM used                {used / 1e9:.1f} GB of {result.profile.sram_bytes / 1e9:.1f} GB")


if __name__ == "__main__":
    main()

"""How a decode step runs its transformer blocks' matrix products (no torch needed to name them).

- "separate": the feed-forward's w1 and w3 as two products, as LlamaGen runs them;
- "fused": w1 and w3 as one product over one buffer (llamagen_gpt.FeedForward.fuse_gate_up), the
  default on CUDA: the same numbers, one launch fewer a layer, twice the column tiles for the GPU's
  multiprocessors (on a CPU the demo's eager step was about 3% slower fused: `separate` there);
- "skinny": fused, and every block product of a step's few rows (≤ 16) through specrt's Triton
  kernel (skinny_matmul), which also splits the inner dimension: for CUDA, where it is measured
  against cuBLAS before it becomes a default.
"""
from typing import Optional

STEP_MATMULS = ("separate", "fused", "skinny")


def step_matmuls_for(device_type: str, chosen: Optional[str] = None) -> str:
    """`chosen`, or the default for a device type ("cuda", "cpu", ...): fused on CUDA, else separate."""
    if chosen is not None:
        return chosen
    return "fused" if device_type == "cuda" else "separate"

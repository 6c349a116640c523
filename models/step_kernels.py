"""How a decode step runs its transformer blocks' matrix products and attention (no torch needed
to name the choices).

Matrix products (STEP_MATMULS):

- "separate": each layer its own product, as the checkpoints' own code runs them;
- "fused": the products that read one input as one product over one buffer (fused_linears: a
  SwiGLU's gate and up; the unified-vocabulary LM's q, k and v too), the default on CUDA: the
  same numbers, fewer launches, more column tiles for the GPU's multiprocessors (on a CPU the
  demo's eager step was about 3% slower fused: `separate` there);
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


# Attention over the static KV cache (STEP_ATTENTION):
# - "sdpa": torch's scaled_dot_product_attention (cuDNN's fused kernel on an H100), the default;
# - "triton": a step's few query rows (≤ 16 a key head) through specrt's split-cache Triton kernel
#   (window_attention): for CUDA, measured against sdpa before it becomes a default.
STEP_ATTENTION = ("sdpa", "triton")
DEFAULT_STEP_ATTENTION = "sdpa"

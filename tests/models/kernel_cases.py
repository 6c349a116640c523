"""The cases specrt's Triton kernels are checked on (the interpreted run and the tests share them)."""
from specrt.models.skinny_matmul import LaunchPlan, launch_plan

# skinny matmul: (rows, columns, K, plan): ragged columns and K, one and several splits, the 16-row tile full
SHAPES = [
    (2, 100, 300, LaunchPlan(32, 64, 3)),
    (16, 64, 128, LaunchPlan(16, 32, 2)),
    (5, 70, 200, LaunchPlan(64, 128, 1)),
    (1, 48, 1000, launch_plan(48, 1000, multiprocessors=4)),
]

# window attention: (batch rows B, heads H, key heads Hkv, window W, cache columns S, head dim D, splits):
# one-token steps, GQA, a window of 8 and one that fills the 16-row tile, a head dim that is not a
# power of two, splits that end early
ATTENTION_CASES = [
    (2, 4, 4, 1, 300, 64, 3),
    (1, 8, 2, 2, 130, 32, 2),
    (2, 2, 1, 8, 70, 64, 1),
    (2, 3, 3, 16, 70, 64, 1),
    (1, 4, 4, 3, 200, 48, 4),
]

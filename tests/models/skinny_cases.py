"""The shapes the skinny-row kernel is checked on (the interpreted run and its test share them)."""
from specrt.models.skinny_matmul import LaunchPlan, launch_plan

# (rows, columns, K, plan): ragged columns and K, one and several splits, the 16-row tile full
SHAPES = [
    (2, 100, 300, LaunchPlan(32, 64, 3)),
    (16, 64, 128, LaunchPlan(16, 32, 2)),
    (5, 70, 200, LaunchPlan(64, 128, 1)),
    (1, 48, 1000, launch_plan(48, 1000, multiprocessors=4)),
]

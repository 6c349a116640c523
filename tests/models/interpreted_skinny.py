"""Runs the skinny-row Triton kernel under TRITON_INTERPRET=1 and prints what it computed, as JSON.

Why a process of its own: Triton reads TRITON_INTERPRET when triton.language is imported, and a
test process that compiled anything with torch.compile has imported it already. Usage:
`TRITON_INTERPRET=1 python tests/models/interpreted_skinny.py`; the cases are skinny_cases.SHAPES, plus one run with a planted bug (each split's K range cut
short by one block)."""
from __future__ import annotations

import json
import os
import sys


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1: this runs the kernel in Triton's interpreter")
    import torch

    from specrt.models.skinny_matmul import LaunchPlan, reference_partials, triton_partials
    from skinny_cases import SHAPES  # beside this file

    results = []
    for rows, columns, depth, plan in SHAPES:
        generator = torch.Generator().manual_seed(rows * columns + depth)
        x = torch.randn(rows, depth, generator=generator).half()
        weight = torch.randn(columns, depth, generator=generator).half()
        planes = triton_partials(x, weight, plan)
        results.append({
            "shape": list(planes.shape), "dtype": str(planes.dtype),
            "planes_error": (planes - reference_partials(x, weight, plan)).abs().max().item(),
            "sum_error": (planes.sum(0) - x.float() @ weight.float().T).abs().max().item(),
        })
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(1)).half()
    weight = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)).half()
    plan = LaunchPlan(32, 64, 2)
    right = (triton_partials(x, weight, plan).sum(0) - x.float() @ weight.float().T).abs().max().item()
    LaunchPlan.chunk = lambda self, k: -(-k // self.splits) - self.block_k  # the planted bug
    planted = (triton_partials(x, weight, plan).sum(0) - x.float() @ weight.float().T).abs().max().item()
    print(json.dumps({"cases": results, "planted": {"right_error": right, "planted_error": planted}}))


if __name__ == "__main__":
    main()

"""LlamaGen's 2D rotary position embedding, as real cos/sin tables.

LlamaGen stores the table as (cos, sin) pairs and rotates interleaved pairs
(x[2k], x[2k+1]). We keep the same numbers but split them into two real tables gathered by
absolute sequence position, because complex tensors do not export to ONNX and a gather by
`positions` is what lets a Jacobi window or a tree node get the right 2D position.
"""
import torch


def rope_2d_tables(grid_size: int, head_dim: int, cond_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (cos, sin), each float32 [cond_len + grid_size**2, head_dim // 2].

    Rows 0..cond_len-1 are all zero (cos = sin = 0), so q and k of condition tokens are
    exactly zero, as in LlamaGen. Row cond_len + i*grid + j holds raster cell (i, j): the
    first head_dim//4 pairs rotate by i·f, the last head_dim//4 by j·f, with
    f_m = 1 / base^(2m / (head_dim/2)).
    """
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {head_dim}")
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2, dtype=torch.float32)[: half // 2] / half))
    angles_1d = torch.arange(grid_size, dtype=torch.float32)[:, None] * freqs[None, :]  # [grid, head_dim//4]
    rows = angles_1d[:, None, :].expand(grid_size, grid_size, -1)
    cols = angles_1d[None, :, :].expand(grid_size, grid_size, -1)
    angles = torch.cat([rows, cols], dim=-1).reshape(grid_size * grid_size, half)
    zeros = torch.zeros(cond_len, half, dtype=torch.float32)
    return torch.cat([zeros, torch.cos(angles)]), torch.cat([zeros, torch.sin(angles)])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [B, T, H, D] by angles whose cos/sin are [B, T, D//2].

    Computed in float32 and cast back, as LlamaGen does.
    """
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x_even, x_odd = xf[..., 0], xf[..., 1]
    c = cos[:, :, None, :]
    s = sin[:, :, None, :]
    rotated = torch.stack([x_even * c - x_odd * s, x_odd * c + x_even * s], dim=-1)
    return rotated.flatten(-2).type_as(x)

"""The shared noise table: every Gaussian vector of neuroevolution (a fresh network, a GA mutation,
an ES perturbation) is a slice of one fixed block of standard-normal numbers, found by its seed.

OpenAI's ES (Salimans et al. 2017) and Uber's deep GA (Such et al. 2017) draw their noise this way.
Drawing a Nature CNN's 1.7M normals takes 10-30 ms of a CPU core, once per individual; a slice
takes nothing, and with a copy of the table on the accelerator an individual is made there by one
kernel (its parent plus sigma times the slice), with no parameters copied from the host. The table
is drawn once per process on the CPU from a fixed seed and copied to each device that asks for it,
so a vector is the same wherever it is made. A seed's slice starts at a hash of the seed, spread
uniformly over the table; the table holds at least `SPREAD` vectors' worth of numbers.
"""

from __future__ import annotations

import threading

import torch

TABLE_SEED = 20171218
"""The seed of the table's draw (fixed: a vector depends only on its own seed)."""
MIN_SIZE = 1 << 22
"""The smallest table, in float32 numbers (16 MiB)."""
SPREAD = 16
"""The table holds at least this many times the vector's length (a power of two above it)."""

_lock = threading.Lock()
_tables: dict[tuple[int, torch.device], torch.Tensor] = {}


def table_size(dim: int) -> int:
    """The length of the table that vectors of `dim` numbers are cut from."""
    if dim < 1:
        raise ValueError(f"noise vectors need at least one number, got dim={dim}")
    return max(MIN_SIZE, 1 << (SPREAD * dim - 1).bit_length())


def table(size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The table of `size` standard normals (float32) on `device`: drawn on the CPU once per
    process, copied once per device (thread-safe; the caller must not write into it)."""
    device = torch.device(device)
    with _lock:
        cpu = _tables.get((size, torch.device("cpu")))
        if cpu is None:
            gen = torch.Generator().manual_seed(TABLE_SEED)
            cpu = _tables[(size, torch.device("cpu"))] = torch.randn(size, generator=gen)
        if (size, device) not in _tables:
            _tables[(size, device)] = cpu.to(device)
        return _tables[(size, device)]


def offset(seed: int, dim: int) -> int:
    """Where the vector of `seed` starts in `table(table_size(dim))`: a hash of the seed
    (splitmix64's finalizer), so nearby seeds give unrelated slices."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z % (table_size(dim) - dim + 1)


def noise(seed: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The standard-normal vector (float32, `dim` numbers) of `seed` on `device`: a view into
    the table, read-only (write into a copy or an `out=` tensor)."""
    start = offset(seed, dim)
    return table(table_size(dim), device)[start : start + dim]

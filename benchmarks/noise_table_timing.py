"""Milliseconds to make one Nature-CNN individual (1.7M parameters, one torch thread): a GA child
(`parent + sigma * noise`) and a fresh network (N(0, 1/fan_in) weights), each with its noise
drawn for it (what onebox did before the shared noise table) and as a slice of the table
(`onebox.nn.noise`), alternated over two rounds of 16; then the time to draw the table itself.

    python benchmarks/noise_table_timing.py
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from gymnasium import spaces

from onebox.evo.core import perturbed
from onebox.nn import noise
from onebox.nn.population import PopulationNet

torch.set_num_threads(1)
net = PopulationNet("cnn", spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), 1)
dim = net.num_params
center, out = net.init_params(0), torch.empty(dim)


def drawn_child(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    torch.randn(dim, generator=gen, out=out).mul_(0.002).add_(center)


def table_child(seed: int) -> None:
    perturbed(center, 0.002, seed, out)


def drawn_fresh(seed: int) -> None:
    gen, off = torch.Generator().manual_seed(seed), 0
    for lay in net.layers:
        fan_in = math.prod(lay.weight[1:]) if lay.kind == "conv" else lay.weight[0]
        n, nb = math.prod(lay.weight), math.prod(lay.bias)
        torch.randn(n, generator=gen, out=out[off : off + n]).div_(math.sqrt(fan_in))
        out[off + n : off + n + nb] = 0
        off += n + nb


def table_fresh(seed: int) -> None:
    net.init_params(seed)


makers = {"child, drawn": drawn_child, "child, table": table_child,
          "fresh, drawn": drawn_fresh, "fresh, table": table_fresh}  # fmt: skip
for rnd in range(2):
    for name, make in makers.items():
        t = time.perf_counter()
        for s in range(16):
            make(1000 * rnd + s)
        print(f"round {rnd + 1}, {name}: {(time.perf_counter() - t) / 16 * 1e3:.2f} ms")
noise._tables.clear()
t = time.perf_counter()
noise.table(noise.table_size(dim))
print(f"drawing the table of {noise.table_size(dim):,} numbers: {time.perf_counter() - t:.2f} s")

"""The shared noise table: a seed's vector is fixed, standard normal, independent of other seeds'
and the same on every device; fresh networks and ES/GA/ARS individuals are made from it on the
evaluator's device."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from onebox.evo.core import perturbed
from onebox.evo.es import ES, ESParams
from onebox.evo.ga import GA, GAParams
from onebox.evo.rs import ARS, RSParams
from onebox.nn import noise as table
from onebox.nn.population import PopulationNet

MINATAR = spaces.Box(0, 1, (10, 10, 4), np.bool_)


def test_a_seeds_vector_is_its_slice_of_the_table() -> None:
    dim = 1000
    size = table.table_size(dim)
    assert size == table.MIN_SIZE and table.table_size(1_700_000) == 1 << 25
    start = table.offset(7, dim)
    assert 0 <= start <= size - dim
    torch.testing.assert_close(table.noise(7, dim), table.table(size)[start : start + dim])
    assert torch.equal(table.noise(7, dim), table.noise(7, dim))
    assert not torch.equal(table.noise(7, dim), table.noise(8, dim))
    with pytest.raises(ValueError, match="at least one number"):
        table.table_size(0)


def test_vectors_are_standard_normal_and_unrelated_even_for_adjacent_seeds() -> None:
    """Seeds 0..N-1 (as fresh networks use): their vectors' entries have mean 0 and variance 1,
    and entry j of one seed is uncorrelated with entry j of the next (adjacent slices would give
    shifted copies)."""
    n, dim = 4000, 16
    x = torch.stack([table.noise(s, dim) for s in range(n)]).double()
    se = 1 / math.sqrt(n * dim)  # standard error of the mean of n * dim standard normals
    assert abs(x.mean().item()) < 4 * se
    assert abs(x.var().item() - 1) < 4 * math.sqrt(2) * se
    corr = (x[:-1] * x[1:]).mean().item()  # E[x_s,j x_s+1,j] = 0 for independent vectors
    assert abs(corr) < 4 * se
    starts = np.array([table.offset(s, dim) for s in range(n)])
    assert len(set(starts)) == n  # distinct starts, spread over the table
    assert starts.min() < table.MIN_SIZE / 100 and starts.max() > table.MIN_SIZE * 0.99


def test_fresh_networks_have_each_layers_scale() -> None:
    net = PopulationNet("minatar", MINATAR, spaces.Discrete(6), 1)
    flat = net.init_params(3)
    assert flat.dtype == torch.float32 and flat.shape == (net.num_params,)
    torch.testing.assert_close(flat, net.init_params(3))
    net.set_slots(slice(0, 1), flat.reshape(1, -1))
    for lay, w, b in zip(net.layers, net.weights, net.biases, strict=True):
        fan_in = math.prod(lay.weight[1:]) if lay.kind == "conv" else lay.weight[0]
        assert torch.count_nonzero(b) == 0
        std = w.std().item() * math.sqrt(fan_in)
        assert abs(std - 1) < 5 / math.sqrt(w.numel())  # 1/sqrt(fan_in) within 5 standard errors


def test_perturbed_is_the_center_plus_scaled_noise() -> None:
    center = torch.randn(5000)
    out = torch.empty(5000)
    perturbed(center, 0.02, 11, out)
    torch.testing.assert_close(out, center + 0.02 * table.noise(11, 5000))
    before = table.noise(11, 5000).clone()
    perturbed(out, -0.5, 11, out)  # in place, and the table is left as it was
    assert torch.equal(table.noise(11, 5000), before)


def test_ars_linear_policy_starts_at_zero_and_es_at_a_fresh_network() -> None:
    net = PopulationNet(
        "mlp", spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), 1, hidden=()
    )
    rs = RSParams(population=8, sigma=0.05, lr=0.05, top_directions=2, episodes=1,
                  center_episodes=0, obs_norm=False, mode="ars")  # fmt: skip
    assert torch.count_nonzero(ARS(net.num_params, net.init_params, rs, 0, linear=True).theta) == 0
    es_params = ESParams(population=8, sigma=0.05, lr=0.05, weight_decay=0.0, episodes=1,
                         center_episodes=0, obs_norm=False)  # fmt: skip
    es = ES(net.num_params, net.init_params, es_params, 0)
    assert torch.count_nonzero(es.theta) > 0


cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@needs_cuda
def test_cuda_individuals_equal_the_cpus() -> None:
    """The table is copied, not redrawn, on the GPU: the same fresh networks, children and ES
    members as on the CPU (products are exact; sums within float32 rounding)."""
    net = PopulationNet("minatar", MINATAR, spaces.Discrete(6), 1)
    assert torch.equal(net.init_params(5, "cuda").cpu(), net.init_params(5))
    ga_params = GAParams(population=4, truncation=2, sigma=0.02, episodes=1, elite_candidates=0,
                         elite_episodes=1)  # fmt: skip
    cpu = GA(net.num_params, net.init_params, ga_params, seed=0)
    gpu = GA(net.num_params, lambda s: net.init_params(s, "cuda"), ga_params, seed=0, device="cuda")
    genome = (1, 2, 3)
    gpu.cache = {(1, 2): gpu.weights((1, 2))}
    cpu.cache = {(1, 2): cpu.weights((1, 2))}
    torch.testing.assert_close(gpu.weights(genome).cpu(), cpu.weights(genome))
    assert gpu.weights(genome).device.type == "cuda"

"""V-trace against hand-computed references: explicit numbers for a 3-step trajectory (no ending,
a termination, a truncation), the paper's sum definition on random arrays, and the on-policy case
reducing to GAE's returns."""

from __future__ import annotations

import math

import pytest
import torch

from onebox.algos.vtrace import vtrace
from onebox.sampling import gae

VALUES = torch.tensor([[1.0], [2.0], [3.0]])
BOOTSTRAP = torch.tensor([4.0])
# pi/mu = 2, 0.5, 1: rho_bar = c_bar = 1 clips the first to 1.
LOG_RHOS = torch.tensor([[math.log(2.0)], [math.log(0.5)], [0.0]])


def run(rewards: list[float], ends: list[bool]):
    return vtrace(LOG_RHOS, torch.tensor(rewards).view(3, 1), VALUES,
                  torch.tensor(ends).view(3, 1), BOOTSTRAP, gamma=0.9)  # fmt: skip


def test_no_ending_by_hand() -> None:
    # rhos = cs = [1, .5, 1]; deltas = [1*(1 + .9*2 - 1), .5*(0 + .9*3 - 2), 1*(2 + .9*4 - 3)]
    #                                = [1.8, .35, 2.6]
    # v - V: t2 = 2.6; t1 = .35 + .9*.5*2.6 = 1.52; t0 = 1.8 + .9*1*1.52 = 3.168
    out = run([1.0, 0.0, 2.0], [False, False, False])
    assert out.vs.flatten().tolist() == pytest.approx([4.168, 3.52, 5.6])
    # advantages: rho_t (r_t + .9 v_{t+1} - V_t) = [1 + .9*3.52 - 1, .5*(.9*5.6 - 2), 2 + 3.6 - 3]
    assert out.advantages.flatten().tolist() == pytest.approx([3.168, 1.52, 2.6])
    assert out.rhos.flatten().tolist() == pytest.approx([1.0, 0.5, 1.0])


def test_termination_cuts_the_trace_by_hand() -> None:
    # The episode terminates after step 1: gamma_1 = 0, so step 1 sees no future.
    # deltas = [1.8, .5*(0 - 2) = -1, 2.6]; v - V: t2 = 2.6, t1 = -1, t0 = 1.8 + .9*(-1) = .9
    out = run([1.0, 0.0, 2.0], [False, True, False])
    assert out.vs.flatten().tolist() == pytest.approx([1.9, 1.0, 5.6])
    assert out.advantages.flatten().tolist() == pytest.approx([0.9, -1.0, 2.6])


def test_truncation_bootstraps_from_the_final_observation_by_hand() -> None:
    # Truncated after step 1 with V(final obs) = 5: the sampler stores r_1 = 0 + .9*5 = 4.5.
    # deltas = [1.8, .5*(4.5 - 2) = 1.25, 2.6]; v - V: t1 = 1.25, t0 = 1.8 + .9*1.25 = 2.925
    out = run([1.0, 4.5, 2.0], [False, True, False])
    assert out.vs.flatten().tolist() == pytest.approx([3.925, 3.25, 5.6])
    assert out.advantages.flatten().tolist() == pytest.approx([2.925, 1.25, 2.6])


def reference(log_rhos, rewards, values, ends, bootstrap, gamma, rho_bar, c_bar, lam):
    """The paper's definition, summed term by term in plain Python (no recursion):
    v_s = V_s + sum_{t >= s} (prod_{s <= i < t} gamma_i c_i) delta_t."""
    T, N = len(rewards), len(rewards[0])
    vs = [[0.0] * N for _ in range(T)]
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        ratio = [math.exp(log_rhos[t][n]) for t in range(T)]
        disc = [gamma * (0.0 if ends[t][n] else 1.0) for t in range(T)]
        vals = [values[t][n] for t in range(T)] + [bootstrap[n]]
        delta = [min(rho_bar, ratio[t]) * (rewards[t][n] + disc[t] * vals[t + 1] - vals[t])
                 for t in range(T)]  # fmt: skip
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * delta[t]
                weight *= disc[t] * lam * min(c_bar, ratio[t])
            vs[s][n] = vals[s] + total
        for s in range(T):
            next_v = vs[s + 1][n] if s + 1 < T else bootstrap[n]
            adv[s][n] = min(rho_bar, ratio[s]) * (rewards[s][n] + disc[s] * next_v - vals[s])
    return vs, adv


@pytest.mark.parametrize(("rho_bar", "c_bar", "lam"), [(1.0, 1.0, 1.0), (1.5, 0.8, 0.9)])
def test_random_arrays_match_the_sum_definition(rho_bar: float, c_bar: float, lam: float) -> None:
    g = torch.Generator().manual_seed(0)
    T, N = 7, 4
    log_rhos = torch.randn(T, N, generator=g, dtype=torch.float64)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    ends = torch.rand(T, N, generator=g) < 0.25
    bootstrap = torch.randn(N, generator=g, dtype=torch.float64)
    out = vtrace(log_rhos, rewards, values, ends, bootstrap, 0.95, rho_bar, c_bar, lam)
    ref_vs, ref_adv = reference(log_rhos.tolist(), rewards.tolist(), values.tolist(),
                                ends.tolist(), bootstrap.tolist(), 0.95, rho_bar, c_bar, lam)  # fmt: skip
    assert torch.allclose(out.vs, torch.tensor(ref_vs, dtype=out.vs.dtype), atol=1e-5)
    assert torch.allclose(out.advantages, torch.tensor(ref_adv, dtype=out.vs.dtype), atol=1e-5)


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_on_policy_targets_are_gae_returns(lam: float) -> None:
    g = torch.Generator().manual_seed(1)
    T, N = 6, 3
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    ends = torch.rand(T, N, generator=g) < 0.3
    bootstrap = torch.randn(N, generator=g)
    out = vtrace(torch.zeros(T, N), rewards, values, ends, bootstrap, 0.99, lam=lam)
    advantages, returns = gae(rewards, values, ends, bootstrap, 0.99, lam)
    assert torch.allclose(out.vs, returns, atol=1e-5)
    if lam == 1.0:  # n-step returns: the advantages are GAE(1)'s too
        assert torch.allclose(out.advantages, advantages, atol=1e-5)


def test_bad_shapes_and_parameters_raise() -> None:
    z = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="values has shape"):
        vtrace(z, z, torch.zeros(3, 1), z.bool(), torch.zeros(2), 0.9)
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(z, z, z, z.bool(), torch.zeros(3), 0.9)
    with pytest.raises(ValueError, match="rho_bar"):
        vtrace(z, z, z, z.bool(), torch.zeros(2), 0.9, rho_bar=0.0)

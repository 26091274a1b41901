"""V-trace (Espeholt et al. 2018, IMPALA): off-policy value targets and policy-gradient
advantages for trajectories taken by a behaviour policy mu and learned by a target policy pi.

With rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)), c_t = lambda * min(c_bar, pi/mu) and
delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), the targets follow the recursion

    v_t = V(x_t) + delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})),   v_T = V(x_T) (the bootstrap)

and the policy gradient uses the advantage min(pg_rho_bar, pi/mu) (r_t + gamma_t v_{t+1} - V(x_t)).
`gamma_t = gamma * (1 - end_t)`: an episode that ended at step t does not bootstrap from the next
episode's first observation. The learner's transform has already made a truncated step's reward
r + gamma * V(final observation) (`onebox.sampling.bootstrapped_rewards`), so ends cut both kinds
of endings.

On-policy (pi = mu, rho_bar, c_bar >= 1) the targets are the lambda-returns, and with lambda = 1
the advantages equal GAE(lambda = 1)'s, i.e. n-step returns minus values.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTrace(NamedTuple):
    """V-trace outputs, all (T, N)."""

    vs: torch.Tensor
    """Value targets v_t."""
    advantages: torch.Tensor
    """Policy-gradient advantages rho_t (r_t + gamma_t v_{t+1} - V(x_t))."""
    rhos: torch.Tensor
    """The clipped importance weights min(rho_bar, pi/mu) used in the targets."""


@torch.no_grad()
def vtrace(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    ends: torch.Tensor,
    bootstrap_value: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
    pg_rho_bar: float | None = None,
) -> VTrace:
    """V-trace targets and advantages over T steps of N envs.

    Args:
        log_rhos: log pi(a_t|x_t) - log mu(a_t|x_t), (T, N).
        rewards: r_t, (T, N).
        values: V(x_t) under the current value function, (T, N).
        ends: whether the episode ended after step t, (T, N) bool.
        bootstrap_value: V(x_T), the observation after the last step, (N,).
        gamma: discount in [0, 1].
        rho_bar: clip of the importance weights in the targets' deltas (> 0).
        c_bar: clip of the trace-cutting weights c_t (> 0; c_bar <= rho_bar as in the paper).
        lam: lambda in [0, 1], scaling the traces as in Retrace / TD(lambda).
        pg_rho_bar: clip of the policy-gradient importance weights (default rho_bar).
    """
    shape = rewards.shape
    if rewards.dim() != 2:
        raise ValueError(f"vtrace takes (T, N) tensors, got rewards of shape {tuple(shape)}")
    for name, x in (("log_rhos", log_rhos), ("values", values), ("ends", ends)):
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, rewards {tuple(shape)}")
    if bootstrap_value.shape != shape[1:]:
        raise ValueError(
            f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected ({shape[1]},)"
        )
    if rho_bar <= 0 or c_bar <= 0 or not 0 <= lam <= 1 or not 0 <= gamma <= 1:
        raise ValueError(
            f"need rho_bar > 0, c_bar > 0, lam and gamma in [0, 1]; got rho_bar={rho_bar}, "
            f"c_bar={c_bar}, lam={lam}, gamma={gamma}"
        )
    ratios = log_rhos.float().exp()
    rhos = ratios.clamp(max=rho_bar)
    cs = lam * ratios.clamp(max=c_bar)
    discounts = gamma * (1.0 - ends.float())
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], 0)
    deltas = rhos * (rewards + discounts * next_values - values)
    diffs = torch.zeros_like(rewards)  # v_t - V(x_t)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        diffs[t] = acc
    vs = values + diffs
    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], 0)
    pg_rhos = ratios.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
    advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTrace(vs, advantages, rhos)

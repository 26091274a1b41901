"""The sampler and GAE: sync and double-buffered rollouts agree, bootstrapping, episode stats."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import onebox.envs
from onebox.sampling import EpisodeTracker, Rollout, Sampler, gae


class PolePolicy(torch.nn.Module):
    """Push toward the side the pole leans; value = a fixed constant. Deterministic."""

    def __init__(self, value: float = 2.0) -> None:
        super().__init__()
        self.v = value

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action = (obs[:, 2] > 0).long()
        return action, torch.zeros(len(obs)), self.value(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((len(obs),), self.v)


def _pool(num_envs: int, env: str = "CartPole-v1", seed: int = 3, **kwargs: object):
    return onebox.envs.make(env, num_envs, num_threads=2, seed=seed, autoreset_mode="SameStep",
                            **kwargs)  # fmt: skip


@contextlib.contextmanager
def _pools(num_envs: int, double: bool, env: str = "CartPole-v1", **kwargs: object):
    """One pool of `num_envs` envs, or (double) two halves, env i seeded 3 + i as in one."""
    pools = onebox.envs.make_splits(2 if double else 1, env, num_envs, 2, 3,
                                    autoreset_mode="SameStep", **kwargs)  # fmt: skip
    try:
        yield pools if double else pools[0]
    finally:
        for pool in pools:
            pool.close()


def test_splits_are_one_pools_envs_and_bad_splits_are_refused() -> None:
    with _pool(6) as one, _pools(6, True) as halves:
        whole, _ = one.reset(seed=3)
        parts = [pool.reset(seed=3 + 3 * k)[0] for k, pool in enumerate(halves)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    for splits in (0, 4):
        with pytest.raises(ValueError, match=f"6 envs cannot be split into {splits} pools"):
            onebox.envs.make_splits(splits, "CartPole-v1", 6)


def _collect(double: bool, steps: int = 40, env: str = "CartPole-v1", policy=None, **kwargs):
    with _pools(6, double, env, **kwargs) as envs:
        sampler = Sampler(envs, policy or PolePolicy(), steps)
        sampler.reset(seed=3)
        out = []
        for _ in range(3):
            r = sampler.collect()
            out.append({k: getattr(r, k).clone().numpy() for k in ("obs", "actions", "rewards")})
            out[-1]["rewards"] = r.bootstrapped_rewards(0.9).numpy()
            out[-1]["ends"] = r.ends.numpy().copy()
            out[-1]["next_obs"] = r.next_obs.numpy().copy()
        returns, lengths = sampler.episodes.pop()
    merged = {k: np.concatenate([o[k] for o in out]) for k in out[0]}
    merged["returns"], merged["lengths"] = np.array(returns), np.array(lengths)
    return merged


def test_double_buffered_equals_sync_for_a_deterministic_policy() -> None:
    sync, double = _collect(False), _collect(True)
    for key in ("obs", "actions", "rewards", "ends", "next_obs", "returns", "lengths"):
        np.testing.assert_array_equal(sync[key], double[key], err_msg=key)
    assert sync["ends"].any()  # episodes ended inside the rollouts


class ColumnPolicy(torch.nn.Module):
    """Atari: an action from the frame's pixels (deterministic); value = their mean."""

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action = obs[:, -1, 40:44, :].float().sum((1, 2)).long() % 6
        return action, torch.zeros(len(obs)), self.value(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float().mean((1, 2, 3))


def test_double_buffered_atari_equals_sync() -> None:
    """ALE's engine cannot hold an env back while others step (each recv's envs must all be
    sent before the next), so the halves are two pools taking turns: no env can drift ahead
    of another (with one pool returning the first half to finish, envs that reset slowly fell
    behind for good, and a whole rollout behind the run failed)."""
    pytest.importorskip("ale_py")
    kwargs = dict(env="Pong-v5", policy=ColumnPolicy(), steps=16, max_num_frames_per_episode=120)
    sync, double = _collect(False, **kwargs), _collect(True, **kwargs)
    for key in ("obs", "actions", "rewards", "ends", "next_obs", "returns", "lengths"):
        np.testing.assert_array_equal(sync[key], double[key], err_msg=key)
    assert sync["ends"].sum() >= 6 and len(set(sync["actions"].flatten().tolist())) > 1


def test_rollout_matches_stepping_the_pool_by_hand() -> None:
    steps = 30
    with _pool(4) as envs:
        sampler = Sampler(envs, PolePolicy(), steps)
        sampler.reset(seed=11)
        r = sampler.collect()
    with _pool(4) as envs:
        obs, _ = envs.reset(seed=11)
        for t in range(steps):
            np.testing.assert_array_equal(r.obs[t].numpy(), obs)
            action = (obs[:, 2] > 0).astype(np.int64)
            np.testing.assert_array_equal(r.actions[t].numpy(), action)
            obs, reward, term, trunc, _ = envs.step(action)
            np.testing.assert_array_equal(r.rewards[t].numpy(), reward)
            np.testing.assert_array_equal(r.ends[t].numpy(), term | trunc)
        np.testing.assert_array_equal(r.next_obs.numpy(), obs)


def test_truncated_steps_bootstrap_from_the_final_observation() -> None:
    with _pool(2, max_episode_steps=5) as envs:
        sampler = Sampler(envs, PolePolicy(value=2.0), 12)
        sampler.reset(seed=0)
        r = sampler.collect()
    # The balancing policy never drops the pole in 5 steps: every 5th step is a truncation.
    ends = r.ends.numpy()
    assert ends[4].all() and ends[9].all() and ends.sum() == 4
    assert r.truncated.numpy().sum() == 4 and not r.terminated.numpy().any()
    expected = np.where(ends, 1.0 + 0.5 * 2.0, 1.0)
    np.testing.assert_allclose(r.bootstrapped_rewards(0.5).numpy(), expected)
    np.testing.assert_array_equal(r.rewards.numpy(), 1.0)  # the record keeps the env's rewards
    returns, lengths = sampler.episodes.pop()
    assert returns == [5.0] * 4 and lengths == [5] * 4  # the env's own rewards, not bootstrapped


def test_sampler_rejects_pools_it_cannot_use() -> None:
    with onebox.envs.make("CartPole-v1", 4) as envs, pytest.raises(ValueError, match="SameStep"):
        Sampler(envs, PolePolicy(), 8)
    with _pool(4, batch_size=2) as envs, pytest.raises(ValueError, match="batch_size = num_envs"):
        Sampler(envs, PolePolicy(), 8)
    with _pool(4) as a, _pool(2) as b, pytest.raises(ValueError, match=r"one size, got \[4, 2\]"):
        Sampler([a, b], PolePolicy(), 8)
    with pytest.raises(ValueError, match="needs an env pool"):
        Sampler([], PolePolicy(), 8)
    with _pool(4) as envs, pytest.raises(RuntimeError, match="reset"):
        Sampler(envs, PolePolicy(), 8).collect()


def test_episode_tracker_prefers_the_pools_own_scores() -> None:
    tracker = EpisodeTracker(3)
    ends = np.array([False, True, False])
    tracker.update(np.arange(3), np.ones(3), ends, {})
    assert tracker.pop() == ([1.0], [1])
    info = {
        "episode_return": np.array([0.0, 21.0, 0.0]),
        "episode_length": np.array([0, 800, 0]),
        "_episode_return": np.array([False, True, False]),
        "_episode_length": np.array([False, True, False]),
    }
    tracker.update(np.arange(3), np.ones(3), ends, info)
    assert tracker.pop() == ([21.0], [800])


def test_gae_against_hand_computed_values() -> None:
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [1.0], [0.2]])
    ends = torch.tensor([[False], [True], [False]])
    next_value = torch.tensor([3.0])
    g, lam = 0.9, 0.8
    # t=2: delta = 2 + 0.9*3 - 0.2 = 4.5; A2 = 4.5
    # t=1: episode ends: delta = 0 - 1 = -1; A1 = -1
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4; A0 = 1.4 + 0.9*0.8*(-1) = 0.68
    adv, ret = gae(rewards, values, ends, next_value, g, lam)
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.68, -1.0, 4.5], rtol=1e-6)
    np.testing.assert_allclose(ret.numpy(), (adv + values).numpy())


def test_gae_of_a_rollout_bootstraps_truncation_once_and_not_termination() -> None:
    """The learners' transform: rewards bootstrapped where an episode was truncated (not where it
    terminated, even if also truncated), then GAE cut at every end."""
    rollout = Rollout(
        obs=torch.zeros(4, 2, 1), actions=torch.zeros(4, 2, dtype=torch.long),
        rewards=torch.tensor([[1.0, 0.0]] * 4),
        terminated=torch.tensor([[False, False], [False, True], [True, False], [False, False]]),
        truncated=torch.tensor([[False, False], [True, True], [False, False], [False, False]]),
        outputs={"logprobs": torch.zeros(4, 2),
                 "values": torch.tensor([[2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [5.0, 0.0]])},
        final={"values": torch.tensor([[0.0, 0.0], [10.0, 100.0], [0.0, 0.0], [0.0, 0.0]])},
        next_obs=torch.zeros(2, 1), next={"values": torch.tensor([6.0, 8.0])},
    )  # fmt: skip
    g, lam = 0.5, 0.5
    rewards = rollout.bootstrapped_rewards(g)
    # env 0: truncated at t=1 (r = 1 + 0.5 * 10 = 6), terminated at t=2.
    #   t=3: 1 + 0.5*6 - 5 = -1;  t=2 (end): 1 - 4 = -3;  t=1 (end): 6 - 3 = 3;
    #   t=0: delta = 1 + 0.5*3 - 2 = 0.5, A0 = 0.5 + 0.25*3 = 1.25
    # env 1: terminated and truncated at t=1: no bootstrap (its final value 100 is ignored).
    #   t=3: 0 + 0.5*8 = 4;  t=2: 0, A2 = 0.25*4 = 1;  t=1 (end): 0;  t=0: 0 + 0.25*0 = 0
    np.testing.assert_array_equal(rewards.numpy(), [[1, 0], [6, 0], [1, 0], [1, 0]])
    adv, ret = gae(rewards, rollout.values, rollout.ends, rollout.next_value, g, lam)
    np.testing.assert_allclose(adv.numpy(), [[1.25, 0.0], [3.0, 0.0], [-3.0, 1.0], [-1.0, 4.0]])
    np.testing.assert_allclose(ret.numpy(), [[3.25, 0.0], [6.0, 0.0], [1.0, 1.0], [4.0, 4.0]])


State = tuple[torch.Tensor, torch.Tensor]


class CountingPolicy:
    """A deterministic recurrent policy: its state `h` counts the episode's observations so far
    (`c` sums the cart positions); it pushes toward the pole's lean, but away from it at counts
    3 and 4 of every 5 (so some episodes fail before their 25-step limit); its value is the
    count."""

    recurrent = True

    def initial_state(self, envs: int, device: object = None) -> State:
        zeros = torch.zeros(envs, 1)
        return zeros, zeros.clone()

    def unroll(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State
    ) -> tuple[None, torch.Tensor, State]:
        h, c = state
        values = []
        for t in range(len(obs)):
            if starts is not None:
                keep = (~starts[t]).float().unsqueeze(1)
                h, c = h * keep, c * keep
            h, c = h + 1, c + obs[t][:, :1]
            values.append(h[:, 0])
        return None, torch.cat(values), (h, c)

    def step(
        self, obs: torch.Tensor, starts: torch.Tensor | None, state: State
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, State]:
        _, value, state = self.unroll(obs[None], None if starts is None else starts[None], state)
        action = ((obs[:, 2] > 0) ^ (state[0][:, 0] % 5 > 2)).long()
        return action, torch.zeros(len(obs)), value, state


RECURRENT_KEYS = ("obs", "actions", "values", "rewards", "ends", "starts", "next_obs", "next_value")


def _collect_recurrent(double: bool, steps: int = 20, rollouts: int = 4) -> list[dict]:
    with _pools(6, double, max_episode_steps=25) as envs:
        sampler = Sampler(envs, CountingPolicy(), steps)
        sampler.reset(seed=5)
        out = []
        for _ in range(rollouts):
            r = sampler.collect()
            got = {k: getattr(r, k).clone() for k in RECURRENT_KEYS}
            got["rewards"] = r.bootstrapped_rewards(0.9)
            got["h"], got["c"] = r.state[0].clone(), r.state[1].clone()
            out.append(got)
    return out


def test_recurrent_state_is_carried_by_env_in_both_modes() -> None:
    sync, double = _collect_recurrent(False), _collect_recurrent(True)
    for k, (a, b) in enumerate(zip(sync, double, strict=True)):
        for key in (*RECURRENT_KEYS, "h", "c"):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{key} {k}")
    policy = CountingPolicy()
    for k, r in enumerate(sync):
        # starts: every env begins an episode at reset, then wherever the previous step ended one.
        first = torch.ones(6, dtype=torch.bool) if k == 0 else sync[k - 1]["ends"][-1]
        assert torch.equal(r["starts"][0], first)
        assert torch.equal(r["starts"][1:], r["ends"][:-1])
        # Replaying the rollout from its stored state gives the values it stored (the counts),
        # and one step more the bootstrap value of the observation after it.
        obs = torch.cat([r["obs"], r["next_obs"][None]])
        starts = torch.cat([r["starts"], r["ends"][-1:]])
        _, values, _ = policy.unroll(obs, starts, (r["h"], r["c"]))
        torch.testing.assert_close(values, torch.cat([r["values"].flatten(), r["next_value"]]))
    assert sync[1]["h"].sum() > 0  # states were carried over from the previous rollout
    rewards = torch.cat([r["rewards"] for r in sync])
    ends = torch.cat([r["ends"] for r in sync])
    # A truncated episode (25 steps) bootstraps from V(final obs) with its state after step 25:
    # the count 26, so its last reward is 1 + 0.9 * 26. Terminated ones keep their reward 1.
    truncated = rewards != 1.0
    torch.testing.assert_close(rewards[truncated], torch.full_like(rewards[truncated], 24.4))
    assert truncated.any() and (ends & ~truncated).any()
    assert not (truncated & ~ends).any()

"""Actors of the actor-learner loop: unrolls record what happened (terminated and truncated
apart, with the bootstrap input of truncated episodes), the learner bootstraps truncation once,
recurrent unrolls carry their start state, the process actors' shared-memory ring hands over
only complete unrolls, oldest first, and their shared weights are read whole."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces

from onebox.algos.impala import bootstrap_truncated, stack
from onebox.nn.networks import ActorCritic
from onebox.sampling import Rollout
from onebox.sampling.actor_client import InferResult
from onebox.sampling.actors import ACTOR_SECTIONS, ActorSpec, SharedTiming, UnrollRing, collect
from onebox.sampling.policies import ACTOR_CRITIC_OUTPUTS, LocalPolicy, SharedWeights, Weights

GAMMA = 0.9


def spec(**kw) -> ActorSpec:
    base = dict(env="CartPole-v1", num_envs=3, num_threads=1, env_options={"max_episode_steps": 4},
                unroll=6, outputs=ACTOR_CRITIC_OUTPUTS, lstm=None)  # fmt: skip
    return ActorSpec(**{**base, **kw})


def run_collect(s: ActorSpec, infer, unrolls: int = 2) -> list[dict]:
    out: list[dict] = []
    pools = s.make_pools(seed=3)
    space = pools[0].single_observation_space
    arrays = s.arrays(space.shape, space.dtype)

    def buffers():
        if len(out) == unrolls:
            return None
        out.append({name: np.zeros(shape, dtype) for name, shape, dtype in arrays})
        return out[-1]

    def publish(returns, lengths):
        out[-1]["episodes"] = (returns, lengths)

    try:
        collect(s, infer, pools, 3, buffers, publish)
    finally:
        for pool in pools:
            pool.close()
    return out


def obs_policy(ids, obs, starts):
    """CartPole actions and values that depend on each env's observation alone (not on its
    batch): push the way the pole leans away from, so some episodes end before the cap."""
    actions = (obs[:, 2] + 0.1 * obs[:, 1] < 0).astype(np.int64)
    outputs = {"logprobs": np.zeros(len(obs), np.float32),
               "values": obs.sum(1).astype(np.float32)}  # fmt: skip
    return InferResult(actions, outputs, 1)


@pytest.mark.parametrize("options", [{"max_episode_steps": 10},
                                     {"max_episode_steps": 10, "backend": "process"}],
                         ids=["native", "process"])  # fmt: skip
def test_split_pools_record_the_same_unrolls_as_one_pool(options) -> None:
    # Each env's steps depend on its own observations: splitting the actor's envs into pools
    # that take turns (the process backend's recv returns them in the order they finish)
    # changes nothing in the unrolls, truncations and their bootstrap inputs included.
    one, two, three = (run_collect(spec(num_envs=6, env_options=options, splits=k), obs_policy, 3)
                       for k in (1, 2, 3))  # fmt: skip
    assert any((u["truncated"] & ~u["terminated"]).any() for u in one)  # both kinds of end
    assert any(u["terminated"].any() for u in one)
    for a, b, c in zip(one, two, three, strict=True):
        for key in a:
            if key == "episodes":
                episodes = [sorted(zip(*u[key], strict=True)) for u in (a, b, c)]
                assert episodes[0] == episodes[1] == episodes[2]
            else:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
                np.testing.assert_array_equal(a[key], c[key], err_msg=key)


def test_truncated_rewards_are_bootstrapped_once_in_the_learner_from_the_final_observation():
    calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def infer(ids, obs, starts):  # alternate actions (CartPole survives 4 steps); V = sum(obs)
        calls.append((ids.copy(), obs.copy(), starts.copy()))
        actions = np.full(len(ids), len(calls) % 2, np.int64)
        outputs = {"logprobs": np.full(len(ids), -0.5, np.float32),
                   "values": obs.sum(1).astype(np.float32)}  # fmt: skip
        return InferResult(actions, outputs, 7)

    u1, u2 = run_collect(spec(), infer)
    # Steps 0..3 form episode 1 (truncated at step 3), steps 4..5 start episode 2.
    assert u1["starts"][:, 0].tolist() == [True, False, False, False, True, False]
    assert u1["truncated"][:, 0].tolist() == [False, False, False, True, False, False]
    assert not u1["terminated"].any()
    assert u2["starts"][:, 0].tolist() == [False, False, True, False, False, False]
    # Requests: steps 0-3, then the final observations of the 3 truncated episodes (no start
    # flags: a recurrent policy values them from the episodes' own states), then step 4.
    ids, final_obs, starts = calls[4]
    assert ids.tolist() == [0, 1, 2] and not starts.any() and calls[5][2].all()
    np.testing.assert_array_equal(u1["final_obs"][3], final_obs)
    np.testing.assert_array_equal(u1["final_obs"][:3], u1["obs"][1:4])  # else the next obs
    np.testing.assert_allclose(u1["final.values"][3], final_obs.sum(1), rtol=1e-6)
    assert not u1["final.values"][[0, 1, 2, 4, 5]].any()
    # The actor bootstraps nothing: the rewards are the env's.
    assert np.array_equal(u1["rewards"], np.ones((6, 3)))
    # The learner's transform bootstraps the truncated step, once: hand-computed.
    unroll = Rollout.from_arrays(u1, *u1["episodes"])
    batch = bootstrap_truncated(stack([unroll], torch.device("cpu")), GAMMA)
    rewards = batch["rewards"].numpy()
    np.testing.assert_allclose(rewards[3], 1.0 + GAMMA * final_obs.sum(1), rtol=1e-6)
    assert np.array_equal(rewards[[0, 1, 2, 4, 5]], np.ones((5, 3)))
    assert batch["ends"][:, 0].tolist() == [False, False, False, True, False, False]
    assert u1["episodes"] == ([4.0, 4.0, 4.0], [4, 4, 4])  # the true returns, not bootstrapped
    assert (u1["versions"] == 7).all() and (u1["out.logprobs"] == -0.5).all()
    # next_obs of unroll 1 is the first observation of unroll 2.
    assert np.array_equal(u1["next_obs"], u2["obs"][0])


def test_terminated_steps_are_not_bootstrapped() -> None:
    t, n = 2, 1
    arrays = {
        "obs": np.zeros((t, n, 4), np.float32), "actions": np.zeros((t, n), np.int64),
        "rewards": np.ones((t, n), np.float32), "terminated": np.array([[True], [True]]),
        "truncated": np.array([[False], [True]]), "starts": np.zeros((t, n), np.bool_),
        "versions": np.zeros((t, n), np.int64), "final_obs": np.zeros((t, n, 4), np.float32),
        "next_obs": np.zeros((n, 4), np.float32), "out.logprobs": np.zeros((t, n), np.float32),
        "out.values": np.zeros((t, n), np.float32), "final.logprobs": np.zeros((t, n), np.float32),
        "final.values": np.full((t, n), 5.0, np.float32),
    }  # fmt: skip
    batch = bootstrap_truncated(stack([Rollout.from_arrays(arrays, [], [])], "cpu"), GAMMA)
    assert batch["rewards"][:, 0].tolist() == [1.0, 1.0]  # terminated (and truncated): no value
    assert batch["ends"].all()


def test_local_policy_records_start_states_and_resets_them() -> None:
    torch.manual_seed(0)
    s = spec(lstm=8, env_options={"max_episode_steps": 4})
    net = ActorCritic(spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2), lstm=8)
    local = LocalPolicy(Weights(net, 3), copy.deepcopy(net), lstm=8)
    u1, u2 = run_collect(s, local)
    # The first unroll starts every env from zeros; the second from the state the first reached.
    assert np.array_equal(u1["h"], np.zeros((3, 8))) and np.array_equal(u1["c"], np.zeros((3, 8)))
    obs = torch.as_tensor(u1["obs"])
    starts = torch.as_tensor(u1["starts"])
    _, _, (h, _) = net.unroll(obs, starts, net.initial_state(3))
    np.testing.assert_allclose(u2["h"], h.detach().numpy(), atol=1e-6)
    # Replaying unroll 2 from its recorded state gives the behaviour log-probs.
    d, _, _ = net.unroll(torch.as_tensor(u2["obs"]), torch.as_tensor(u2["starts"]),
                         (torch.as_tensor(u2["h"]), torch.as_tensor(u2["c"])))  # fmt: skip
    logprobs = d.log_prob(torch.as_tensor(u2["actions"]).flatten()).view(6, 3)
    np.testing.assert_allclose(logprobs.detach().numpy(), u2["out.logprobs"], atol=1e-5)


def test_ring_hands_over_complete_unrolls_oldest_first() -> None:
    s = spec(num_envs=2, unroll=3)
    layout = UnrollRing.plan(s, (4,), np.float32, slots=3)
    arrived, freed = threading.Semaphore(0), threading.Semaphore(0)
    ring = UnrollRing(layout, arrived, freed)
    actor_side = UnrollRing(layout, arrived, freed, name=ring.block.name)
    try:
        assert ring.take() == []
        k1 = actor_side.acquire()
        actor_side.slot(k1)["obs"][:] = 1.0
        actor_side.publish(k1, [10.0], [5])
        k2 = actor_side.acquire()
        assert k2 != k1
        actor_side.slot(k2)["obs"][:] = 2.0  # written, never published (the actor died)
        k3 = next(k for k in range(3) if k not in (k1, k2))
        actor_side.slot(k3)["obs"][:] = 3.0
        actor_side.publish(k3, [], [])
        assert arrived.acquire(blocking=False) and arrived.acquire(blocking=False)  # 2 woken
        assert not arrived.acquire(blocking=False)
        got = ring.take()
        assert freed.acquire(blocking=False) and freed.acquire(blocking=False)  # 2 freed
        assert [float(u.obs.max()) for u in got] == [1.0, 3.0]
        assert got[0].returns == [10.0] and got[0].lengths == [5] and got[1].returns == []
        assert ring.take() == []  # freed, not handed over twice
        actor_side.a["flags"][:] = 1  # every slot full: the actor would wait for the learner...
        assert actor_side.a["owner"][0] == os.getpid()  # (the learner's side made the ring)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        ring.a["owner"][0] = gone.pid  # ...but a learner killed can free no slot: no hang
        got_slot: list[int | None] = []
        waiter = threading.Thread(target=lambda: got_slot.append(actor_side.acquire()), daemon=True)
        waiter.start()
        waiter.join(timeout=10)
        assert got_slot == [None]
        ring.a["owner"][0] = os.getpid()
        ring.a["stop"][0] = 1
        assert actor_side.acquire() is None  # ...nor once the learner stopped
    finally:
        actor_side.a = {}
        actor_side.block.close()
        ring.a = {}
        ring.block.close(unlink=True)


def test_shared_weights_are_read_whole_and_copied_only_when_newer() -> None:
    torch.manual_seed(0)
    net = ActorCritic(spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2), lstm=8)
    learner_side = SharedWeights.create(net, 3)
    actor_side = SharedWeights(learner_side.block.layout, name=learner_side.block.name)
    try:
        version, state = actor_side.latest
        assert version == 3 and state.keys() == net.state_dict().keys()
        for k, v in net.state_dict().items():
            assert torch.equal(state[k], v), k
        assert actor_side.latest[1] is state  # same version: no copy
        # A policy on the shared weights acts with them.
        local = LocalPolicy(actor_side, copy.deepcopy(net).requires_grad_(False), lstm=8)
        assert local(np.arange(2), np.zeros((2, 4), np.float32), np.ones(2, bool)).version == 3
        # A reader that meets a publish under way (the count odd, the new version written
        # already: the publish's last store is the count's) waits for the whole of it.
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
        learner_side.a["seq"][0] += 1
        for k, v in net.state_dict().items():
            learner_side.a[f"w.{k}"][...] = v.numpy()
        learner_side.a["version"][0] = 4
        got: list = []
        reader = threading.Thread(target=lambda: got.append(actor_side.latest))
        reader.start()
        time.sleep(0.05)
        assert reader.is_alive() and not got
        learner_side.a["seq"][0] += 1
        reader.join(timeout=5)
        version, state = got[0]
        assert version == 4
        for k, v in net.state_dict().items():
            assert torch.equal(state[k], v), k
    finally:
        actor_side.close()
        learner_side.close(unlink=True)


def test_a_process_actors_time_is_shared_as_it_is_spent() -> None:
    # The learner reads a process actor's seconds per section from shared memory while the
    # actor runs (not only when an unroll is published), a section still open included: an
    # actor waiting for the learner through a whole log interval waited in that interval.
    shared = np.zeros(SharedTiming.SIZE)
    timing = SharedTiming(shared)
    with timing("env"):
        time.sleep(0.01)
    assert SharedTiming.read(shared) == {"env": timing.totals()["env"], "inference": 0.0,
                                         "blocked": 0.0}  # fmt: skip
    with timing("blocked"):
        time.sleep(0.02)
        waited = SharedTiming.read(shared)["blocked"]
        assert 0.02 <= waited <= timing.totals_so_far()["blocked"]
    assert SharedTiming.read(shared)["blocked"] == timing.totals()["blocked"] >= waited
    with timing("elsewhere"):  # not an actor section: kept to the actor
        assert SharedTiming.read(shared) == {k: timing.totals().get(k, 0.0)
                                             for k in ACTOR_SECTIONS}  # fmt: skip

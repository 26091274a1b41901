"""`onebox bench envs` loops step the envs with its random action batches in turn, across calls
too: slow envs (MuJoCo) are timed one call at a time, and a loop that restarted its batches at
every call would step them with one constant action per env (other dynamics, other speed)."""

from __future__ import annotations

import numpy as np

import onebox.envs
from onebox.bench import loops

ENV = "Pendulum-v1"
N = 4
CALLS = loops.ACTION_BATCHES + 3  # past the last batch: back to the first


def reference_states(task: loops.Task) -> list[np.ndarray]:
    """Env states after stepping batch 0, 1, 2, ... in turn, one per call."""
    pool = onebox.envs.make(ENV, N, num_threads=1, seed=task.seed)
    pool.reset(seed=task.seed)
    batches = task.actions(pool.single_action_space, N)
    for k in range(CALLS):
        pool.step(batches[k % len(batches)])
    states = [pool.get_state(i) for i in range(N)]
    pool.close()
    return states


def test_sync_loop_cycles_through_batches_across_calls() -> None:
    task = loops.Task(ENV, N, 1, seed=3)
    pool = onebox.envs.make(ENV, N, num_threads=1, seed=3)
    loop = loops.sync_loop(pool, task, N)
    for _ in range(CALLS):
        loop.run(1)
    for i, state in enumerate(reference_states(task)):
        np.testing.assert_array_equal(pool.get_state(i), state, err_msg=f"env {i}")
    loop.close()


def test_async_loop_cycles_through_batches_across_calls() -> None:
    """With batch_size = num_envs on one thread, each recv returns envs 0..N-1 in order, so the
    async loop's k-th send is batch k for every env, as in the sync reference."""
    task = loops.Task(ENV, N, 1, seed=3)
    pool = onebox.envs.make(ENV, N, batch_size=N, num_threads=1, seed=3)
    loop = loops.async_loop(pool, task, N)
    for _ in range(CALLS):
        loop.run(1)
    pool.recv()  # the last send's results (the states are those after it either way)
    for i, state in enumerate(reference_states(task)):
        np.testing.assert_array_equal(pool.get_state(i), state, err_msg=f"env {i}")
    loop.close()

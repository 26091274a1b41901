"""The channel: the one seam between actors and a learner.

Actors hand every unroll (`onebox.sampling.Rollout`) to `channel.put(actor, unroll, stop)`;
the learner takes batches with `channel.take(check)`. The actors do not know which channel they
feed; a learner picks one:

- `FifoChannel` (IMPALA, APPO): a bounded first-in-first-out queue of unrolls; a batch is the next
  `batch_unrolls` unrolls. Its bound keeps the policy lag small: a full queue blocks the actors.
- `ReplayChannel` (Ape-X): a prioritized replay table. Its adder computes each transition's
  initial priority, |n-step TD error| from the Q-values the actor's inference returned, and
  inserts the steps (the table computes the n-step returns); a batch is a sample. `put` queues
  the unroll and the learner's thread inserts it at its next `take` (see `_TableChannel` for
  why). With `samples_per_insert` it is also a rate limiter (as Reverb's): once the learner has
  started, actors wait while the transitions they put since then are more than one unroll each
  ahead of those the learner has sampled divided by it.
- `SequenceChannel` (R2D2): the same over a `SequenceReplay` table of overlapping sequences, each
  with the recurrent state the actor's network had at its start (the policy's `h` and `c`
  outputs, which the actors record at every step); new sequences get the largest priority seen.

Both count the env steps and finished episodes that arrived (`progress()`), which the loop logs.
`put` only needs the unroll and the actor's id, so an actor could run anywhere that can reach it.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from onebox.replay import ReplayBatch, ReplayBuffer, SequenceBatch, SequenceReplay
from onebox.sampling.rollout import Rollout

Check = Callable[[], bool]
"""Called while `take` waits: raises if an actor failed, True to give up waiting (Ctrl-C)."""


class FifoChannel:
    """A bounded queue of unrolls; `take` gives the next `batch_unrolls` of them, oldest first."""

    def __init__(self, capacity: int, batch_unrolls: int) -> None:
        self.queue: queue.Queue[Rollout] = queue.Queue(maxsize=capacity)
        self.batch_unrolls = batch_unrolls
        self._steps, self._returns, self._lengths = 0, [], []  # type: ignore[var-annotated]

    def put(self, actor: int, unroll: Rollout, stop: threading.Event) -> None:
        """Queue `unroll`, waiting for room until `stop` is set."""
        while not stop.is_set():
            try:
                self.queue.put(unroll, timeout=0.1)
                return
            except queue.Full:
                continue

    def take(self, check: Check) -> list[Rollout] | None:
        """The next `batch_unrolls` unrolls (None if `check()` gave up waiting)."""
        batch: list[Rollout] = []
        while len(batch) < self.batch_unrolls:
            try:
                batch.append(self.queue.get(timeout=1.0))
            except queue.Empty:
                if check():
                    return None
        self._steps += sum(u.env_steps for u in batch)
        self._returns += [r for u in batch for r in u.returns]
        self._lengths += [x for u in batch for x in u.lengths]
        return batch

    def progress(self) -> tuple[int, list[float], list[int]]:
        """Env steps and finished episodes (returns, lengths) taken since the last call."""
        out = (self._steps, self._returns, self._lengths)
        self._steps, self._returns, self._lengths = 0, [], []
        return out


def nstep_td_errors(
    q: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final_q: np.ndarray,
    steps: int,
    n_step: int,
    gamma: float,
) -> np.ndarray:
    """|G_t - Q(s_t, a_t)| for the first `steps` rows of a (W, N) stretch of env steps, with G_t
    the n-step return the replay table will store, bootstrapped with max_a Q at the observation
    it ends on: `q[t + 1]`, or `final_q[t]` where the episode was truncated at t, or nothing where
    it terminated. Needs W >= steps + n_step (Q of step t + n_step is the bootstrap)."""
    ends = np.logical_or(terminated, truncated)
    boot = np.where(truncated & ~terminated, final_q.max(-1), 0.0)
    boot[:-1] = np.where(ends[:-1], boot[:-1], q[1:].max(-1))
    n_envs = rewards.shape[1]
    g = np.zeros((steps, n_envs))
    alive = np.ones((steps, n_envs), np.bool_)
    for k in range(n_step):
        i = np.arange(steps) + k
        g += alive * gamma**k * rewards[i]
        last = alive & (ends[i] | (k == n_step - 1))
        g += last * gamma ** (k + 1) * boot[i]
        alive &= ~ends[i]
    taken = np.take_along_axis(q[:steps], actions[:steps, :, None], -1)[..., 0]
    return np.abs(g - taken)


class _TableChannel:
    """What the replay channels share: the table and its lock, the rate limiter, the unrolls put
    and not yet inserted, the arrival counts, sampling, saving and priority updates.

    `put` only queues an unroll (after the rate limiter's wait); the learner's own thread inserts
    the queued ones at its next `take`. In one process the GIL runs one thread's Python at a
    time anyway, and an inserting thread beside the learner would also take the GIL at each of
    the learner's torch calls, which then waits for it to be handed back: measured on Ape-X,
    CartPole, that cost the learner a third of its updates."""

    def __init__(self, buffer: Any, envs_per_actor: int, learning_starts: int, batch_size: int,
                 samples_per_insert: float | None, slack: int, steps_per_sample: int) -> None:  # fmt: skip
        self.buffer, self.n = buffer, envs_per_actor
        self.learning_starts, self.batch_size = max(learning_starts, batch_size), batch_size
        self.samples_per_insert, self.slack = samples_per_insert, slack
        self.steps_per_sample = steps_per_sample
        self.lock = threading.Lock()
        self._room = threading.Condition(self.lock)
        """Notified when the learner's samples let waiting actors insert again."""
        self._steps, self._returns, self._lengths = 0, [], []  # type: ignore[var-annotated]
        self._queued: list[tuple[int, Rollout]] = []
        """(actor, unroll) put and not yet inserted, oldest first."""
        self.inserted, self.sampled = 0, 0
        """Env steps put (queued or in the table), and drawn from it (samples x
        `steps_per_sample`)."""
        self.started: int | None = None
        """`inserted` when the learner took its first batch (None before)."""

    def _ahead(self) -> bool:
        """Whether the actors are too far ahead of the learner: with `samples_per_insert`, once
        the learner has started, more steps inserted than its samples allow."""
        if self.samples_per_insert is None or self.started is None:
            return False
        allowed = self.started + self.sampled / self.samples_per_insert + self.slack
        return self.inserted > allowed

    def put(self, actor: int, unroll: Rollout, stop: threading.Event) -> None:
        """Queue the actor's unroll for the table (the learner's thread inserts it at its next
        `take`); with `samples_per_insert`, first wait (until `stop` is set) while the actors
        are too far ahead of the learner (which they never are before it starts)."""
        with self._room:  # sleep until a sample makes room (no polling: the learner's cores)
            while self._ahead() and not stop.is_set():
                self._room.wait(0.05)
            self.inserted += unroll.env_steps
            self._steps += unroll.env_steps
            self._returns += unroll.returns
            self._lengths += unroll.lengths
            self._queued.append((actor, unroll))

    def _insert(self, actor: int, unroll: Rollout) -> None:
        """Add an actor's unroll to the table (called with the lock held)."""
        raise NotImplementedError

    def insert_queued(self) -> None:
        """Insert the unrolls put so far (on the learner's thread: `take` and `save` do it first)."""
        with self.lock:
            queued, self._queued = self._queued, []
            for actor, unroll in queued:
                self._insert(actor, unroll)

    def take(self, check: Check) -> ReplayBatch | SequenceBatch | None:
        """A prioritized sample (transitions or sequences), once the table holds
        `learning_starts` items (None if `check()` gave up waiting); the unrolls queued since the
        last call are inserted first."""
        self.insert_queued()
        while len(self.buffer) < self.learning_starts:
            if check():
                return None
            threading.Event().wait(0.05)
            self.insert_queued()
        with self.lock:
            self.started = self.inserted if self.started is None else self.started
            self.sampled += self.batch_size * self.steps_per_sample
            if not self._ahead():
                self._room.notify_all()
            return self.buffer.sample(self.batch_size)

    def save(self, path: Path) -> None:
        """Save the table, the queued unrolls inserted first; steps not yet in it (held or
        staged) are not saved."""
        self.insert_queued()
        with self.lock:
            self.buffer.save(path)

    def resume_from(self, path: Path) -> None:
        """Load a saved table for a resumed run (the table's `resume_from`)."""
        with self.lock:
            self.buffer.resume_from(path)
            self.inserted = len(self.buffer) * self.steps_per_sample

    @property
    def prioritized(self) -> bool:
        """Whether the table samples by priority (both channels' tables do)."""
        return self.buffer.prioritized

    def update_priorities(self, indices: np.ndarray, td: Any) -> None:
        """New priorities of sampled items, from the learner's TD errors."""
        with self.lock:
            self.buffer.update_priorities(indices, td)

    def progress(self) -> tuple[int, list[float], list[int]]:
        """Env steps and finished episodes (returns, lengths) put since the last call."""
        with self.lock:
            out = (self._steps, self._returns, self._lengths)
            self._steps, self._returns, self._lengths = 0, [], []
        return out


class ReplayChannel(_TableChannel):
    """A prioritized replay table fed by actors (Ape-X). `put` holds back each actor's latest
    unroll until the next one arrives, since the n-step priorities of its last steps need the
    next unroll's rewards and Q-values (an actor's last unroll when the run ends is dropped).
    Where a restarted actor's envs begin new episodes, the held unroll's episodes end truncated
    (bootstrapped from their last observations), so no n-step return joins two lives."""

    def __init__(self, buffer: ReplayBuffer, envs_per_actor: int, learning_starts: int,
                 batch_size: int, samples_per_insert: float | None = None,
                 slack: int = 0) -> None:  # fmt: skip
        super().__init__(buffer, envs_per_actor, learning_starts, batch_size, samples_per_insert,
                         slack, steps_per_sample=1)  # fmt: skip
        self.n_step, self.gamma = buffer.config["n_step"], buffer.gamma
        self._held: dict[int, Rollout] = {}

    def _insert(self, actor: int, unroll: Rollout) -> None:
        """Insert the actor's previous unroll with its initial priorities; hold this one."""
        held, self._held[actor] = self._held.get(actor), unroll
        if held is None:
            return
        t_len = held.actions.shape[0]
        # A restarted process actor's first unroll starts new episodes in envs whose episodes
        # its dead predecessor left running: those episodes were cut after its last unroll.
        cut = unroll.starts[0] & ~held.ends[-1]
        if cut.any():  # on a copy: the arrays of an unroll from a Ray actor host are read-only
            truncated = held.truncated.copy()
            truncated[-1] |= cut
            held = dataclasses.replace(held, truncated=truncated)

        def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.concatenate([a, b[: self.n_step]])

        td = nstep_td_errors(
            cat(held.outputs["q"], unroll.outputs["q"]), held.actions,
            cat(held.rewards, unroll.rewards), cat(held.terminated, unroll.terminated),
            cat(held.truncated, unroll.truncated), cat(held.final["q"], unroll.final["q"]),
            t_len, self.n_step, self.gamma,
        )  # fmt: skip
        td[t_len - self.n_step :, cut] = np.nan  # no Q at a cut's final obs: the max priority
        envs = np.arange(actor * self.n, (actor + 1) * self.n)
        self.buffer.add_steps(held.obs, held.actions, held.rewards, held.terminated,
                              held.truncated, held.final_obs, priorities=td, envs=envs)  # fmt: skip


class SequenceChannel(_TableChannel):
    """A prioritized table of sequences fed by actors (R2D2): `put` adds each step of the unroll
    with the state (h, c) the policy reported for it; a batch is a sample of sequences. The rate
    limiter counts a sampled sequence as the `seq_len - overlap` steps it adds to the table."""

    def __init__(self, buffer: SequenceReplay, envs_per_actor: int, learning_starts: int,
                 batch_size: int, samples_per_insert: float | None = None,
                 slack: int = 0) -> None:  # fmt: skip
        super().__init__(buffer, envs_per_actor, learning_starts, batch_size, samples_per_insert,
                         slack, steps_per_sample=buffer.stride)  # fmt: skip

    def _insert(self, actor: int, unroll: Rollout) -> None:
        """Add the unroll's steps to the actor's envs' rows of the table."""
        envs = np.arange(actor * self.n, (actor + 1) * self.n)
        h, c = unroll.outputs["h"], unroll.outputs["c"]
        # A restarted actor's (or Ray host's) envs begin new episodes where its predecessor left
        # theirs running: those are cut, their open steps dropped.
        if unroll.starts[0].any():
            self.buffer.drop_open(envs[unroll.starts[0]])
        for t in range(unroll.actions.shape[0]):
            self.buffer.add(unroll.obs[t], unroll.actions[t], unroll.rewards[t],
                            unroll.terminated[t], unroll.truncated[t], unroll.final_obs[t],
                            (h[t], c[t]), envs=envs)  # fmt: skip

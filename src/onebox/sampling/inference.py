"""A central inference server (SEED RL): actors step envs, one thread batches everyone's inference.

Actors submit batches of observations tagged with their actor id and env ids. The server thread
merges waiting requests into one batch of up to `max_batch` envs, or fewer once `timeout_ms` have
passed since the oldest waiting request arrived, runs the policy once on the device, and hands
each request its rows of the policy's named outputs (`actions`, plus whatever the learner records:
log-probabilities and values for IMPALA, Q-values for Ape-X) and the weights' version. The server
only batches: it knows nothing of what the outputs mean. The policy sees each row's actor and env
id, so it can act differently per actor (Ape-X's per-actor epsilon).

Two kinds of actors:

- thread actors in the learner's process call `server.infer(actor_id, env_ids, obs)` (blocking)
  or `server.submit(...)` then `.wait()`;
- process actors, started by `server.spawn(actor_id, target, num_envs)`, run `target(client)` in
  a worker process (typically owning an env pool) and call `client.infer(obs)` through a
  shared-memory slot (`onebox.sampling.actor_client`: the actor's side and the protocol). A
  `Supervisor` (`onebox.supervisor`) starts, watches, restarts and stops the processes: the
  server thread only waits on their pipes and sentinels with everything else, and asks it to
  `revive` one that died (its requests and recurrent state are dropped; a crash is restarted,
  up to `max_restarts` times, then it is the actor's failure; a clean exit is its end).

With `lstm=H` the policy is recurrent: the server keeps an (h, c) pair of size H for every
(actor, env), resets it when the actor flags that env's episode as ended (`dones`: this
observation starts a new episode) or when the actor restarts (`reset_actor`, or a process actor's
death), in an `EnvStates` per actor (an actor-side `onebox.sampling.policies.LocalPolicy` keeps
its envs' states in one the same way), and calls `policy_fn(obs, actor_ids, env_ids, (h, c))
-> (outputs, (h, c))`: the rows' states before the step in, after it out. Without it,
`policy_fn(obs, actor_ids, env_ids) -> outputs` (`PolicyFn` says what each is).

The learner changes the weights in place inside `with server.updating(): ...`, which excludes
concurrent inference and then increments `server.version` (on CUDA the server runs on its own
stream, `onebox.nn.accel.SideStream`, so its inference overlaps the learner's passes on the GPU,
and the update is ordered against it on the GPU); every result carries the version that
produced it, so samples record their behaviour version and the learner can log policy lag.
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from typing import Any

import cloudpickle
import numpy as np
import torch
from gymnasium import spaces

from onebox.envs.shm import Block
from onebox.nn.accel import SideStream, Staging, inherit_torch_threads, to_host
from onebox.run.timing import TimeSplit
from onebox.sampling.actor_client import (
    DONE,
    REQUEST,
    InferResult,
    OutputSpec,
    Pending,
    actor_main,
    answer_error,
    slot_layout,
)
from onebox.sampling.env_states import EnvStates
from onebox.supervisor import FROM_WORKER, TO_WORKER, RestartLimitError, Supervisor, Worker

CALL_SECTIONS = ("gather", "policy", "device", "answer")
"""A policy call's parts: joining the requests onto the device; the policy (on a GPU: queuing
its work), after any weight update of the learner in progress; waiting for its outputs to reach
the host; handing each request its rows."""

PolicyFn = Callable[..., Any]
"""The policy, called once per batch: `policy_fn(obs, actor_ids, env_ids) -> outputs`, or with an
LSTM `policy_fn(obs, actor_ids, env_ids, (h, c)) -> (outputs, (h, c))`. `obs` is the batch of
observations on the device, the ids int64 tensors (one per row); `outputs` a dict of tensors with
a leading batch axis, "actions" and the server's declared `outputs`. With an LSTM, (h, c) in are
the rows' states before the step, each of shape (rows, `lstm`), zeros where an episode starts, and
(h, c) out the states after it, which the server keeps for the rows' next step."""


class _Request:
    __slots__ = ("actor", "dones", "env_ids", "gen", "obs", "pending", "proc", "t")

    def __init__(
        self,
        actor: int,
        env_ids: np.ndarray,
        obs: np.ndarray,
        dones: np.ndarray | None,
        pending: Pending | None = None,
        proc: _ProcActor | None = None,
    ) -> None:
        self.actor, self.env_ids, self.obs, self.dones = actor, env_ids, obs, dones
        self.t = time.perf_counter()
        self.pending, self.proc = pending, proc
        self.gen = proc.gen if proc is not None else 0


class _ProcActor(Worker):
    """A process actor's supervised slot: its shared-memory block, its target and arguments, the
    generation of its current process, and how it ended for good."""

    def __init__(self, actor_id: int, num_envs: int, block: Block, target: bytes, args: tuple):
        super().__init__(actor_id)
        self.actor_id, self.num_envs, self.block = actor_id, num_envs, block
        self.args = (target, block.name, block.layout, actor_id, args)
        """`actor_main`'s arguments before the pipe ends."""
        self.gen = 0
        self.finished = threading.Event()
        self.failure: str | None = None

    @property
    def req(self) -> Any:
        """The server's end of the request pipe."""
        return self.conns[0]

    @property
    def resp(self) -> Any:
        """The server's end of the response pipe."""
        return self.conns[1]


class InferenceServer:
    """Batches the inference requests of many actors onto one policy on one device.

    Args:
        policy_fn: the policy (see `PolicyFn`); called from the server thread under no_grad.
        obs_space: one env's observation space (a Box).
        act_space: one env's action space (Discrete or Box).
        outputs: the policy's outputs besides "actions" (see `OutputSpec`).
        max_batch: the most envs in one policy call; one request may not exceed it.
        timeout_ms: how long the oldest waiting request may wait for others to join its batch.
        device: where observations go and the policy runs.
        lstm: the LSTM's hidden size if the policy is recurrent (state kept per actor and env).
        pad_batches: pad each call's batch with rows of zeros (actor and env ids 0) to the next
            power of two, at most `max_batch`, and drop their outputs: a compiled policy
            (`--compile`) then sees a few batch sizes, each one CUDA graph, not every size from
            1 to `max_batch`. Feed-forward policies only.
        max_restarts: how often one process actor may be restarted after dying.
        context: multiprocessing start method for process actors (see `onebox.supervisor`).
        refresh: called at each policy call, in the server thread, before the policy, with the
            weights' lock held: `refresh(version)` brings the policy's weights up to date (a
            server in another process than its learner reloads what the learner published)
            and returns their version, which becomes `version`.
    """

    def __init__(
        self,
        policy_fn: PolicyFn,
        obs_space: spaces.Space,
        act_space: spaces.Space,
        max_batch: int = 1024,
        timeout_ms: float = 0.0,
        device: torch.device | str = "cpu",
        lstm: int | None = None,
        max_restarts: int = 3,
        context: str = "forkserver",
        *,
        outputs: OutputSpec | None = None,
        pad_batches: bool = False,
        refresh: Callable[[int], int] | None = None,
    ) -> None:
        if not isinstance(obs_space, spaces.Box):
            raise TypeError(f"the inference server takes Box observations, got {obs_space}")
        if isinstance(act_space, spaces.Discrete):
            self._act_shape, self._act_dtype = (), np.dtype(np.int64)
        elif isinstance(act_space, spaces.Box):
            self._act_shape, self._act_dtype = tuple(act_space.shape), np.dtype(np.float32)
        else:
            raise TypeError(f"the inference server takes Discrete or Box actions, got {act_space}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        if lstm is not None and lstm < 1:
            raise ValueError(f"lstm is the LSTM hidden size (>= 1) or None, got {lstm}")
        if pad_batches and lstm is not None:
            raise ValueError("pad_batches is for feed-forward policies: padded rows have no state")
        self._pad = (
            np.zeros((max_batch, *obs_space.shape), obs_space.dtype) if pad_batches else None
        )
        """`pad_batches`' rows of zeros, or None."""
        self.policy_fn, self.refresh = policy_fn, refresh
        self.outputs: OutputSpec = {
            k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in (outputs or {}).items()
        }
        if "actions" in self.outputs:
            raise ValueError('outputs names the policy\'s outputs besides "actions"')
        self.obs_space, self.act_space = obs_space, act_space
        self.max_batch, self.timeout = int(max_batch), timeout_ms / 1000.0
        self.device = torch.device(device)
        self.lstm, self.max_restarts = lstm, max_restarts
        self.version = 0
        """Incremented by every `updating()` block: the weights' version."""
        self.calls = 0
        """Policy calls made (one per merged batch)."""
        self.requests = 0
        """Requests answered."""
        self.env_steps = 0
        """Env observations answered."""
        self.request_seconds = 0.0
        """Seconds the answered requests spent in the server, summed: from arriving (submitted,
        or read from a process actor) to their answer."""
        self.split = TimeSplit(CALL_SECTIONS, cpu=True)
        """The seconds in policy calls by their parts (`CALL_SECTIONS`): wall seconds, and the
        server thread's CPU seconds."""
        self._sup = Supervisor(context, actor_main, pipes=(FROM_WORKER, TO_WORKER),
                               name="onebox-actor", max_restarts=max_restarts)  # fmt: skip
        if context == "forkserver":
            self._sup.ctx.set_forkserver_preload(["onebox.sampling.inference"])
        self._weights = threading.Lock()
        self._stream = SideStream(self.device)  # CUDA: inference on its own stream
        self._staging = Staging(self.device)  # CUDA: pinned buffers, non-blocking copies
        self._inbox: collections.deque[_Request] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._procs: dict[int, _ProcActor] = {}
        self._new: list[_ProcActor] = []  # spawned, not yet watched by the server thread
        self._states: dict[int, EnvStates] = {}
        self._resets: set[int] = set()  # actors whose recurrent state to drop
        self._closed = False
        self.error: str | None = None
        """The last error the policy raised (it was passed to the requests of that batch)."""
        self._thread = threading.Thread(target=self._serve, name="onebox-inference", daemon=True)
        self._thread.start()

    # ---- thread actors -----------------------------------------------------------------------

    def submit(
        self,
        actor_id: int,
        env_ids: Any,
        obs: np.ndarray,
        dones: np.ndarray | None = None,
    ) -> Pending:
        """Queue a request (obs must not change until it is answered); returns its `Pending`."""
        if self._closed:
            raise RuntimeError("the inference server is closed")
        obs = np.asarray(obs)
        env_ids = np.asarray(env_ids, np.int64).reshape(-1)
        n = len(env_ids)
        if obs.shape != (n, *self.obs_space.shape):
            raise ValueError(
                f"obs must have shape {(n, *self.obs_space.shape)} for {n} env ids, got {obs.shape}"
            )
        if n > self.max_batch:
            raise ValueError(f"a request of {n} envs exceeds max_batch={self.max_batch}")
        if n and env_ids.min() < 0:
            raise ValueError("env ids must be >= 0")
        if dones is not None:
            dones = np.asarray(dones, np.bool_).reshape(-1)
            if len(dones) != n:
                raise ValueError(f"dones must have one flag per env id ({n}), got {len(dones)}")
        pending = Pending()
        with self._inbox_lock:
            self._inbox.append(_Request(int(actor_id), env_ids, obs, dones, pending))
        os.write(self._wake_w, b"\0")
        return pending

    def infer(
        self,
        actor_id: int,
        env_ids: Any,
        obs: np.ndarray,
        dones: np.ndarray | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Actions for envs `env_ids` of actor `actor_id` at observations `obs` (blocking).

        `dones[i]` says env i's episode ended, so `obs[i]` starts a new one (its recurrent
        state is reset first)."""
        return self.submit(actor_id, env_ids, obs, dones).wait(timeout)

    def reset_actor(self, actor_id: int) -> None:
        """Drop actor `actor_id`'s recurrent state (it restarted), before its next request."""
        with self._inbox_lock:
            self._resets.add(int(actor_id))
        os.write(self._wake_w, b"\0")

    def counters(self) -> dict[str, Any]:
        """The counters a learner charts (`calls`, `env_steps`, `requests`, `request_seconds`),
        the seconds in policy calls by their parts (`split`: wall seconds, `split_cpu`: the
        server thread's CPU seconds, by `CALL_SECTIONS`) and `servers`, the server threads
        these count (1; several server processes sum theirs)."""
        return {"calls": self.calls, "env_steps": self.env_steps, "requests": self.requests,
                "request_seconds": self.request_seconds, "split": self.split.totals(),
                "split_cpu": self.split.cpu_totals(), "servers": 1}  # fmt: skip

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """Hold off inference while the learner changes the weights; then bump `version`."""
        with self._weights, self._stream.exclusive():
            yield
            self.version += 1

    # ---- process actors ----------------------------------------------------------------------

    @property
    def context(self) -> Any:
        """The multiprocessing context the process actors start in: a lock or semaphore they
        are handed in `spawn`'s `args` must come from it."""
        return self._sup.ctx

    def spawn(
        self, actor_id: int, target: Callable[..., Any], num_envs: int, args: tuple = ()
    ) -> None:
        """Start a process actor running `target(client, *args)` (`client`: an `ActorClient`
        for up to `num_envs` envs). It is restarted if it dies, not if `target` returns."""
        if self._closed:
            raise RuntimeError("the inference server is closed")
        if not callable(target):
            raise TypeError(f"target must be callable, got {target!r}")
        if not 1 <= num_envs <= self.max_batch:
            raise ValueError(f"num_envs must be in 1..max_batch={self.max_batch}, got {num_envs}")
        if actor_id in self._procs:
            raise ValueError(f"actor {actor_id} already has a process")
        resource_tracker.ensure_running()  # shared by the children: the parent's unlink counts
        layout = slot_layout(num_envs, self.obs_space, self._act_shape, self._act_dtype,
                              self.outputs, self.lstm)  # fmt: skip
        p = _ProcActor(int(actor_id), num_envs, Block(layout), cloudpickle.dumps(target), args)
        self._sup.add(p, *p.args)
        with self._inbox_lock:
            self._procs[p.actor_id] = p
            self._new.append(p)
            self._resets.add(p.actor_id)
        os.write(self._wake_w, b"\0")

    def join(self, actor_id: int, timeout: float | None = None) -> None:
        """Wait for process actor `actor_id`'s target to return; raise if it failed for good."""
        p = self._procs[actor_id]
        if not p.finished.wait(timeout):
            raise TimeoutError(f"actor {actor_id} did not finish within {timeout} s")
        if p.failure is not None:
            raise RuntimeError(p.failure)

    def failure(self, actor_id: int) -> str | None:
        """Why process actor `actor_id` is gone for good (it died after `max_restarts`
        restarts), or None while it runs or after its target returned."""
        return self._procs[actor_id].failure

    def restarts(self, actor_id: int) -> int:
        """How often process actor `actor_id` was restarted."""
        return self._procs[actor_id].restarts

    def pid(self, actor_id: int) -> int:
        """The pid of process actor `actor_id`'s current process."""
        return int(self._procs[actor_id].pid)  # type: ignore[arg-type]

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the server thread and the process actors; fail what is still waiting."""
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"\0")
        self._thread.join()
        self._sup.shutdown(timeout=2, hang_up=True)  # actors stop when their pipes close
        for p in self._procs.values():
            p.block.close(unlink=True)
            p.finished.set()
        with self._inbox_lock:
            for r in self._inbox:
                if r.pending is not None:
                    r.pending._finish(None, "the inference server was closed")
            self._inbox.clear()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> InferenceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the server thread -------------------------------------------------------------------

    def _serve(self) -> None:
        inherit_torch_threads()
        self._stream.enter()
        waiting: list[_Request] = []
        count = 0
        while not self._closed:
            if waiting:
                left = waiting[0].t + self.timeout - time.perf_counter()
                events = self._sel.select(max(left, 0.0))
            else:
                events = self._sel.select()
            for key, _ in events:
                data = key.data
                if data is None:
                    os.read(self._wake_r, 1 << 16)
                    count += self._take_inbox(waiting)
                elif data[0] == "req":
                    r = self._read_request(data[1])
                    if r is not None:
                        waiting.append(r)
                        count += len(r.env_ids)
                else:
                    count -= self._died(data[1], waiting)
            while waiting and (
                count >= self.max_batch or time.perf_counter() >= waiting[0].t + self.timeout
            ):
                k, n = 0, 0
                while k < len(waiting) and n + len(waiting[k].env_ids) <= self.max_batch:
                    n += len(waiting[k].env_ids)
                    k += 1
                batch, waiting = waiting[:k], waiting[k:]
                count -= n
                self._run(batch, n)
        for r in waiting:
            if r.pending is not None:
                r.pending._finish(None, "the inference server was closed")

    def _take_inbox(self, waiting: list[_Request]) -> int:
        with self._inbox_lock:
            taken = list(self._inbox)
            self._inbox.clear()
            for actor in self._resets:
                self._states.pop(actor, None)
            self._resets.clear()
            new, self._new = self._new, []
        for p in new:
            self._register(p)
        waiting += taken
        return sum(len(r.env_ids) for r in taken)

    def _register(self, p: _ProcActor) -> None:
        self._sel.register(p.req, selectors.EVENT_READ, ("req", p))
        self._sel.register(p.sentinel, selectors.EVENT_READ, ("dead", p))

    def _read_request(self, p: _ProcActor) -> _Request | None:
        try:
            byte = os.read(p.req.fileno(), 1)
        except OSError:
            byte = b""
        if byte != REQUEST:  # the process is gone; its sentinel will say so
            self._sel.unregister(p.req)
            return None
        a = p.block.arrays
        n = int(a["n"][0])
        if not 0 <= n <= p.num_envs:
            answer_error(p.resp, f"a request of {n} envs, but the slot holds {p.num_envs}")
            return None
        return _Request(p.actor_id, a["env_ids"][:n], a["obs"][:n], a["dones"][:n], None, p)

    def _died(self, p: _ProcActor, waiting: list[_Request]) -> int:
        """Process actor p exited: drop its requests and state; the supervisor restarts it if
        it crashed (a clean exit, or a crash past its restarts, ends it)."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(p.req)
        self._sel.unregister(p.sentinel)
        dropped = sum(len(r.env_ids) for r in waiting if r.proc is p)
        waiting[:] = [r for r in waiting if r.proc is not p]
        self._states.pop(p.actor_id, None)
        if self._closed:  # close() stops them all
            return dropped
        p.block.arrays["n"][0] = 0
        try:
            ended = self._sup.revive(p, *p.args)
        except RestartLimitError as e:
            p.failure = f"actor {p.actor_id} is gone for good: {e}"
            p.finished.set()
            return dropped
        if ended.clean:
            p.finished.set()
        else:
            p.gen += 1
            self._register(p)
        return dropped

    def _run(self, batch: list[_Request], n: int) -> None:
        """One policy call for the requests of `batch` (n envs in all); answer each."""
        try:
            self._call(batch, n)
        finally:
            t1 = time.perf_counter()
            self.request_seconds += sum(t1 - r.t for r in batch)

    @torch.no_grad()
    def _call(self, batch: list[_Request], n: int) -> None:
        # On CUDA the requests are joined straight into pinned buffers and these three copies
        # queued: the host waits once, for the outputs (`to_host`).
        split = self.split
        with split("gather"):
            x, actor_ids, env_ids = self._gather(batch, n)
            rows, state0 = self._states_before(batch) if self.lstm is not None else (None, {})
        try:
            with split("policy"), self._weights:
                if self.refresh is not None:
                    self.version = self.refresh(self.version)
                version = self.version
                if rows is None:
                    out, state1 = self.policy_fn(x, actor_ids, env_ids), None
                else:
                    state = (state0["state.h"], state0["state.c"])
                    out, state1 = self.policy_fn(x, actor_ids, env_ids, state)
            with split("device"):
                outputs = self._host_outputs(out, n, state0)
        except Exception as e:
            self.error = f"the policy failed in the inference server: {type(e).__name__}: {e}"
            for r in batch:
                if r.pending is not None:
                    r.pending._finish(None, self.error)
                elif r.proc is not None and r.gen == r.proc.gen:
                    answer_error(r.proc.resp, self.error)
            return
        self.calls += 1
        self.requests += len(batch)
        self.env_steps += n
        with split("answer"):
            if rows is not None:
                start = 0
                for states, ids in rows:
                    end = start + len(ids)
                    states.after(ids, (state1[0][start:end], state1[1][start:end]))
                    start = end
            self._answer(batch, outputs, version)

    def _gather(self, batch: list[_Request], n: int) -> tuple[torch.Tensor, ...]:
        """The requests' observations, actor ids and env ids, joined on the device (with
        `pad_batches`, rows of zeros up to the next power of two)."""
        obs = [r.obs for r in batch]
        actors = [np.full(len(r.env_ids), r.actor) for r in batch]
        envs = [r.env_ids for r in batch]
        extra = min(self.max_batch, 1 << (n - 1).bit_length()) - n if self._pad is not None else 0
        if extra:
            obs.append(self._pad[:extra])
            actors.append(np.zeros(extra, np.int64))
            envs.append(np.zeros(extra, np.int64))
        return (self._staging.concat(obs), self._staging.concat(actors, np.int64),
                self._staging.concat(envs, np.int64))  # fmt: skip

    def _states_before(
        self, batch: list[_Request]
    ) -> tuple[list[tuple[EnvStates, Any]], dict[str, torch.Tensor]]:
        """With an LSTM: each request's `EnvStates` and rows in it, and the joined state before
        the step ("state.h", "state.c"; reset where `dones` says an episode starts)."""
        rows, h0, c0 = [], [], []
        for r in batch:
            states = self._states.get(r.actor)
            if states is None:
                states = self._states[r.actor] = EnvStates(self.lstm, self.device)
            ids, (h, c) = states.before(r.env_ids, r.dones)
            rows.append((states, ids))
            h0.append(h)
            c0.append(c)
        return rows, {"state.h": torch.cat(h0), "state.c": torch.cat(c0)}

    def _answer(self, batch: list[_Request], outputs: dict[str, np.ndarray], version: int) -> None:
        """Hand each request of `batch` its rows of `outputs` (host arrays, in batch order)."""
        actions = outputs.pop("actions")
        h0, c0 = outputs.pop("state.h", None), outputs.pop("state.c", None)
        start = 0
        for r in batch:
            end = start + len(r.env_ids)
            if r.pending is not None:
                state = (h0[start:end], c0[start:end]) if h0 is not None else None
                mine = {k: v[start:end] for k, v in outputs.items()}
                r.pending._finish(InferResult(actions[start:end], mine, version, state))
            elif r.proc is not None and r.gen == r.proc.gen:
                a = r.proc.block.arrays
                a["actions"][: end - start] = actions[start:end]
                for k, v in outputs.items():
                    a[f"out.{k}"][: end - start] = v[start:end]
                a["version"][0] = version
                if h0 is not None:
                    a["h"][: end - start], a["c"][: end - start] = h0[start:end], c0[start:end]
                with contextlib.suppress(OSError):
                    os.write(r.proc.resp.fileno(), DONE)
            start = end

    def _host_outputs(
        self, out: Any, n: int, extra: dict[str, torch.Tensor]
    ) -> dict[str, np.ndarray]:
        """The policy's outputs, and the tensors of `extra`, as numpy arrays on the host (one
        wait for the device); ValueError unless the outputs have the declared keys, shapes and
        dtypes."""
        want = {"actions": (self._act_shape, self._act_dtype), **self.outputs}
        if not isinstance(out, dict) or set(out) != set(want):
            got = sorted(out) if isinstance(out, dict) else type(out).__name__
            raise ValueError(f"policy_fn must return a dict with keys {sorted(want)}, got {got}")
        arrays = to_host({**{k: v[:n] for k, v in out.items()}, **extra})  # not padded rows
        for k, (shape, dtype) in want.items():
            arrays[k] = np.asarray(arrays[k], dtype)
            if arrays[k].shape != (n, *shape):
                raise ValueError(
                    f"policy_fn returned {k} of shape {arrays[k].shape} for {n} observations; "
                    f"expected {(n, *shape)}"
                )
        return arrays

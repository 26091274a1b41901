"""The inference server in a process of its own (Sample Factory's policy worker).

In the learner's process the server thread shares one GIL with the learner's thread and the
unroll collector: every torch call the server makes releases the GIL and then waits to take it
back, so its policy calls stretch when the learner's Python runs. `ServerProcess` runs the same
`InferenceServer` in a child process instead, and the process actors as that process's children,
talking to it through their shared-memory slots as before; nothing in the learner's process
serves requests.

- The policy: the learner's network and policy function, pickled together at the start (the
  network lands on the same device in the child), so the child serves the same function of the
  same weights. The learner publishes its weights into shared memory (`SharedWeights`, every
  `--sync-every` updates); at each policy call the server loads them if their version moved
  (`InferenceServer(refresh=...)`) and answers with that version, so the policy lag the learner
  logs includes the wait for the next publish.
- The actors: their spawn arguments (their unroll rings, whose semaphores a process can only
  hand to the processes it starts) go to the child when it starts, so every `spawn` comes
  before `start`. The child's server restarts a crashed actor as it would in the learner's
  process, up to `max_restarts`.
- The learner's side asks the child, through a command pipe, for the server's counters (for
  the charts), each actor's failure and restarts, and to close. A child that dies (it is never
  restarted) makes the next question raise with how it ended and its last words; a learner that
  dies leaves the child an end of file, on which it closes its server and actors.
- Several server processes (`processes`, `--server-processes`; Sample Factory's policy workers
  per policy): process k serves actors k, k + n, k + 2n, ... (in the order they were spawned),
  each with its own server and its own batches, for where one server's host work per call,
  not the device, bounds the actors. Their counters are summed (`servers` says how many).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import torch
from gymnasium import spaces

from onebox.sampling.inference import InferenceServer
from onebox.sampling.policies import SharedWeights
from onebox.supervisor import FROM_WORKER, TO_WORKER, Supervisor, Worker


def _serve(payload: bytes, spaces_: tuple[Any, Any], options: dict[str, Any],
           weights: tuple[Any, str], actors: list[tuple[int, bytes, int, tuple]],
           torch_threads: int, tf32: bool, commands: Any, replies: Any) -> None:  # fmt: skip
    """The server process: the policy, reloaded from `weights` when the learner publishes, an
    `InferenceServer` with the process actors, then the learner's commands until "close" or
    an end of file."""
    torch.set_num_threads(torch_threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    net, policy = cloudpickle.loads(payload)
    for module in net.modules():  # unpickled, an LSTM's weights lie apart: one chunk for cuDNN
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    shared = SharedWeights(*weights)

    def refresh(version: int) -> int:
        if int(shared.a["version"][0]) == version:
            return version
        latest, state = shared.latest
        net.load_state_dict(state)
        return latest

    server = InferenceServer(policy, *spaces_, **options, refresh=refresh)
    try:
        for actor_id, target, num_envs, args in actors:
            server.spawn(actor_id, cloudpickle.loads(target), num_envs, args)
        replies.send(("ready", None))
        answers: dict[str, Callable[..., Any]] = {
            "counters": server.counters,
            "status": lambda: [(server.failure(a), server.restarts(a)) for a, *_ in actors],
            "pid": server.pid,
        }
        while True:
            try:
                name, args = commands.recv()
            except EOFError:  # the learner is gone
                break
            if name == "close":
                break
            try:
                replies.send(("ok", answers[name](*args)))
            except Exception as e:  # the learner raises it
                replies.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        server.close()
        shared.close()


class ServerProcess:
    """An `InferenceServer` for process actors, run in a process of its own (see the module
    docstring); the learner's side of it, with the server's interface as the actor-learner loop
    and `ProcessActors` use it: `spawn` (before `start`), `updating`, `version`, `counters`,
    `failure`, `restarts`, `pid`, `close`.

    Args:
        net: the learner's network, whose weights `policy_fn` reads.
        policy_fn: the policy (see `onebox.sampling.inference.PolicyFn`), a function of `net`;
            it and `net` are pickled together (cloudpickle), so it must not hold what cannot
            be (an open file, a lock).
        weights: where the learner publishes `net`'s weights (the loop does, every
            `--sync-every` updates, with `version`).
        obs_space, act_space, outputs, max_batch, timeout_ms, device, lstm, pad_batches,
        max_restarts: as for `InferenceServer`.
        processes: server processes, each serving every `processes`-th actor (see the module
            docstring); at most the number of actors spawned.
        context: the start method of the server's process (and of its actors' processes).
    """

    def __init__(
        self,
        net: torch.nn.Module,
        policy_fn: Any,
        weights: SharedWeights,
        obs_space: spaces.Space,
        act_space: spaces.Space,
        *,
        processes: int = 1,
        context: str = "forkserver",
        **options: Any,
    ) -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
        self.processes = processes
        self.obs_space, self.act_space = obs_space, act_space
        self.version = 0
        """The learner's weight updates (as `InferenceServer.version`); a published version."""
        try:
            self._payload = cloudpickle.dumps((net, policy_fn))
        except Exception as e:
            raise TypeError(
                f"the inference server's process needs the learner's network and policy, "
                f"pickled, and they do not pickle ({type(e).__name__}: {e}): let the policy "
                f"close over the network and what it acts with, not over a lock, a file or the "
                f"learner; or drop --server-process"
            ) from e
        self._options = {**options, "context": context}
        self._weights = (weights.block.layout, weights.block.name)
        self._actors: list[tuple[int, bytes, int, tuple]] = []
        """(actor id, its cloudpickled target, envs, arguments) of each `spawn`."""
        # Not restarted (their deaths end the run); not daemonic: they start the actors.
        self._sup = Supervisor(context, _serve, pipes=(TO_WORKER, FROM_WORKER),
                               name="onebox-inference", max_restarts=0, daemon=False)  # fmt: skip
        self._workers: list[Worker] = []
        self._lock = threading.Lock()

    @property
    def context(self) -> Any:
        """The multiprocessing context of the server's process: the actors' semaphores must
        come from it."""
        return self._sup.ctx

    def spawn(
        self, actor_id: int, target: Callable[..., Any], num_envs: int, args: tuple = ()
    ) -> None:
        """A process actor the server's process will start (see `InferenceServer.spawn`)."""
        if self._workers:
            raise RuntimeError("spawn every process actor before ServerProcess.start()")
        if any(a == actor_id for a, *_ in self._actors):
            raise ValueError(f"actor {actor_id} already has a process")
        if not callable(target):
            raise TypeError(f"target must be callable, got {target!r}")
        self._actors.append((int(actor_id), cloudpickle.dumps(target), int(num_envs), args))

    def start(self) -> None:
        """Start the server processes (and through them the actors); return once they serve."""
        if self._workers:
            raise RuntimeError("the server process has started already")
        if self.processes > len(self._actors):
            raise ValueError(
                f"{self.processes} server processes for {len(self._actors)} process actor(s) "
                "would leave a server with none to serve: use at most one per actor"
            )
        tf32 = torch.backends.cuda.matmul.allow_tf32
        for k in range(self.processes):
            self._workers.append(self._sup.add(
                Worker(k), self._payload, (self.obs_space, self.act_space), self._options,
                self._weights, self._actors[k :: self.processes], self.torch_threads, tf32,
            ))  # fmt: skip
        for k in range(self.processes):
            self._reply(k)

    @property
    def torch_threads(self) -> int:
        """The server process's torch threads: the learner's on a GPU (where they only launch
        work); 1 on the CPU, where its forward passes and the learner's compute at once (on 2
        cores, two teams of 2 threads halved APPO's rate on Pong; one thread each matched the
        server in the learner's process, docs/benchmarks.md)."""
        device = torch.device(self._options.get("device", "cpu"))
        return torch.get_num_threads() if device.type == "cuda" else 1

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """The learner changes the weights (the server reads them once published); then bump
        `version`."""
        yield
        self.version += 1

    def counters(self) -> dict[str, Any]:
        """The servers' counters (see `InferenceServer.counters`), summed over the processes;
        `servers` is how many."""
        total: dict[str, Any] = {}
        for k in range(self.processes):
            for name, value in self._ask(k, "counters").items():
                if isinstance(value, dict):
                    into = total.setdefault(name, {})
                    for part, seconds in value.items():
                        into[part] = into.get(part, 0.0) + seconds
                else:
                    total[name] = total.get(name, 0) + value
        return total

    def failure(self, actor_id: int) -> str | None:
        """Why process actor `actor_id` is gone for good, or None."""
        k, i = self._owner(actor_id)
        return self._ask(k, "status")[i][0]

    def restarts(self, actor_id: int) -> int:
        """How often process actor `actor_id` was restarted."""
        k, i = self._owner(actor_id)
        return self._ask(k, "status")[i][1]

    def pid(self, actor_id: int) -> int:
        """The pid of process actor `actor_id`'s current process."""
        return self._ask(self._owner(actor_id)[0], "pid", actor_id)

    @property
    def server_pids(self) -> list[int | None]:
        """The pids of the server processes (none before `start`)."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop the server processes, which stop their actors; safe to call twice."""
        for w in self._workers:
            if w.running:
                with contextlib.suppress(OSError, ValueError):
                    w.conns[0].send(("close", ()))
        self._sup.shutdown(timeout=10)

    def _owner(self, actor_id: int) -> tuple[int, int]:
        """(the server process of process actor `actor_id`, its index among that one's)."""
        for j, (a, *_) in enumerate(self._actors):
            if a == actor_id:
                return j % self.processes, j // self.processes
        raise KeyError(f"no process actor {actor_id}")

    def _ask(self, k: int, name: str, *args: Any) -> Any:
        if not self._workers:
            raise RuntimeError("the server process has not started: call start() first")
        with self._lock:
            with contextlib.suppress(OSError, ValueError):  # it died: `_reply` says how
                self._workers[k].conns[0].send((name, args))
            return self._reply(k)

    def _reply(self, k: int) -> Any:
        worker = self._workers[k]
        conn = worker.conns[1]
        if self._sup.readable(worker, conn):
            with contextlib.suppress(EOFError, OSError):
                status, value = conn.recv()
                if status == "error":
                    raise RuntimeError(f"the inference server process: {value}")
                return value
        ended = self._sup.reap(worker)
        which = f" {k + 1} of {self.processes}" if self.processes > 1 else ""
        raise RuntimeError(f"the inference server process{which} {ended.describe()}")

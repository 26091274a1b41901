"""What an actor gets from the inference server (`InferResult`), a thread actor's request waiting
for it (`Pending`), and a process actor's side of it.

A process actor has one preallocated shared-memory slot (`slot_layout`): it writes its
observations, env ids and done flags there and one `REQUEST` byte to its request pipe; the server
writes the actions and the policy's other outputs back and answers one `DONE` byte on the response
pipe (or `ERROR` followed by a message). Nothing is pickled per step. `actor_main` is the process's
entry point (run by the server's `Supervisor`): it attaches to the slot and runs the actor's
target with an `ActorClient`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces

from onebox.envs.process_worker import read_msg, write_msg
from onebox.envs.shm import Block, Layout

OutputSpec = dict[str, tuple[tuple[int, ...], Any]]
"""The policy's outputs besides "actions": name -> (shape of one row, dtype)."""

REQUEST, DONE, ERROR = b"R", b"D", b"E"
"""The one-byte messages: a request is in the slot; its answer is; the policy failed."""


@dataclasses.dataclass
class InferResult:
    """The server's answer to one request, one row per env of the request."""

    actions: np.ndarray
    """The actions to take."""
    outputs: dict[str, np.ndarray]
    """The policy's other named outputs (e.g. `logprobs` and `values`, or `q`); also readable as
    attributes (`result.values`)."""
    version: int
    """`server.version` of the weights that chose the actions (the behaviour version)."""
    state: tuple[np.ndarray, np.ndarray] | None = None
    """With an LSTM: the (h, c) the policy started from for these envs (after resets)."""

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["outputs"][name]
        except KeyError:
            raise AttributeError(f"the policy has no output {name!r}") from None


class Pending:
    """A submitted request; `wait()` returns its `InferResult` or raises the server's error."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: InferResult | None = None
        self._error: str | None = None

    def _finish(self, result: InferResult | None, error: str | None = None) -> None:
        self._result, self._error = result, error
        self._event.set()

    def done(self) -> bool:
        """Whether the answer is in."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> InferResult:
        """Block until the answer is in (at most `timeout` seconds: then TimeoutError)."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"no answer from the inference server within {timeout} s")
        if self._error is not None:
            raise RuntimeError(self._error)
        assert self._result is not None
        return self._result


def slot_layout(
    num_envs: int,
    obs_space: spaces.Box,
    act_shape: tuple[int, ...],
    act_dtype: np.dtype,
    outputs: OutputSpec,
    lstm: int | None,
) -> Layout:
    """The arrays of one process actor's slot, for requests of up to `num_envs` envs."""
    state = [("h", (num_envs, lstm), np.float32), ("c", (num_envs, lstm), np.float32)]
    return Layout.plan(
        (state if lstm is not None else [])
        + [
            ("obs", (num_envs, *obs_space.shape), obs_space.dtype),
            ("env_ids", (num_envs,), np.int64),
            ("dones", (num_envs,), np.bool_),
            ("n", (1,), np.int64),
            ("actions", (num_envs, *act_shape), act_dtype),
            ("version", (1,), np.int64),
        ]
        + [(f"out.{k}", (num_envs, *shape), dtype) for k, (shape, dtype) in outputs.items()]
    )


def answer_error(resp: Any, message: str) -> None:
    """The server's side: tell the actor at the other end of `resp` that its request failed (an
    actor already gone hears nothing)."""
    with contextlib.suppress(OSError):
        os.write(resp.fileno(), ERROR)
        write_msg(resp.fileno(), ERROR + message.encode())


class ActorClient:
    """A process actor's handle on the server: `infer` through its shared-memory slot."""

    def __init__(self, actor_id: int, block: Block, req: Any, resp: Any) -> None:
        self.actor_id = actor_id
        """This actor's id."""
        self.num_envs = len(block.arrays["env_ids"])
        """The most envs one request may hold."""
        self._block, self._req, self._resp = block, req, resp
        self._all = np.arange(self.num_envs, dtype=np.int64)

    def infer(
        self, obs: np.ndarray, env_ids: Any = None, dones: np.ndarray | None = None
    ) -> InferResult:
        """Actions for envs `env_ids` (default: 0..len(obs)-1) at `obs`; `dones` as in
        `InferenceServer.infer`. Blocks until the server answers."""
        a = self._block.arrays
        n = len(obs)
        if n > self.num_envs:
            raise ValueError(f"a request of {n} envs exceeds this actor's slot of {self.num_envs}")
        a["obs"][:n] = obs
        a["env_ids"][:n] = self._all[:n] if env_ids is None else env_ids
        a["dones"][:n] = False if dones is None else dones
        a["n"][0] = n
        os.write(self._req.fileno(), REQUEST)
        reply = os.read(self._resp.fileno(), 1)
        if reply == ERROR:
            raise RuntimeError(read_msg(self._resp.fileno())[1:].decode(errors="replace"))
        if reply != DONE:
            raise EOFError("the inference server went away")
        outputs = {k[4:]: v[:n].copy() for k, v in a.items() if k.startswith("out.")}
        return InferResult(
            a["actions"][:n].copy(),
            outputs,
            int(a["version"][0]),
            (a["h"][:n].copy(), a["c"][:n].copy()) if "h" in a else None,
        )


def actor_main(
    target: bytes, block_name: str, layout: Layout, actor_id: int, args: tuple, req: Any, resp: Any
) -> None:
    """A process actor: attach to its slot and run the (cloudpickled) target."""
    block = Block(layout, name=block_name)
    try:
        cloudpickle.loads(target)(ActorClient(actor_id, block, req, resp), *args)
    except (EOFError, BrokenPipeError):  # the server closed: nothing left to do
        pass
    finally:
        block.close()

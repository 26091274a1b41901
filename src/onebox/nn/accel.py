"""The accelerator path in one place: host-to-device transfer, precision, compilation.

- `Staging`: observations (and rewards, flags) go from the env pool's host arrays to the device.
  On CUDA each array is first copied into a pinned (page-locked) host buffer, then sent with a
  non-blocking copy, so the host never waits for the transfer; a ring of buffers per shape and
  dtype, each reused only once its last copy is done (a CUDA event). On the CPU nothing is pinned
  or copied: the tensor shares the array's memory, as `torch.as_tensor` does. Arrays keep their
  dtype: uint8 images travel as uint8 (4x less traffic than float32) and are scaled on the device
  by `scale_images`.
- `Accel`: a run's device, precision and compile choice (`AccelFields`, the config fields every
  learner shares). `autocast()` is bfloat16 autocast for `--precision bf16` (weights, optimizer
  state and losses stay float32; the networks hand out float32 outputs), `policy(net)` the
  sampler's view of an `ActorCritic` under that precision, with its fixed-shape forward compiled
  by `torch.compile` for `--compile` (mode "reduce-overhead", i.e. CUDA graphs, on CUDA), and
  `setup()` turns on TF32 matrix products on CUDA for float32 runs.
- `to_host`: a policy call's output tensors as numpy arrays with one wait for the device (on CUDA
  every copy is queued, then the stream synchronized once) rather than one per tensor.
- `resolve_device`: a `--device` value as a torch device ("auto": CUDA where there is a GPU), or
  a ValueError saying what is wrong with it.
- `SideStream`: a CUDA stream of high priority for a thread that runs inference beside a learner
  on the same GPU (the inference server), ordered against the learner's weight updates on the GPU
  itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import torch

Precision = Literal["float32", "bf16"]


@dataclasses.dataclass
class AccelFields:
    """The config fields of the accelerator path, shared by every learner's config."""

    precision: Precision = "float32"
    """Compute precision of inference and of the learner's forward and backward passes: `bf16`
    runs them under bfloat16 autocast (weights, optimizer state and losses stay float32)."""
    compile: bool = False
    """Compile the policy's fixed-shape inference call with torch.compile (on CUDA in
    "reduce-overhead" mode, which replays it as a CUDA graph); feed-forward nets only. The first
    calls are slow while it compiles."""


def resolve_device(device: str) -> torch.device:
    """ "auto" -> CUDA when available, else CPU; anything else as torch reads it (ValueError for
    a name torch does not know, or CUDA where there is none)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available; use --device cpu")
    return dev


def check_accel(config: Any, compiles: bool = True) -> None:
    """Raise ValueError on accelerator fields a run cannot use (before anything is written);
    `compiles`: whether the learner's policy has a forward to compile (actor-critics do)."""
    if config.precision not in ("float32", "bf16"):
        raise ValueError(f"--precision must be float32 or bf16, got {config.precision!r}")
    if config.compile and not compiles:
        raise ValueError("--compile applies to the actor-critic learners (ppo, a2c, impala, appo)")
    if config.compile and getattr(config, "lstm", None) is not None:
        raise ValueError("--compile compiles feed-forward nets only; drop it or --lstm")


def inherit_torch_threads() -> None:
    """Give the calling thread the process's torch thread count (`torch.set_num_threads`).
    Call it first in every thread that runs torch besides the main one.

    torch sets MKL's thread count, and OpenMP's, per thread: a thread started later multiplies
    matrices with MKL's default, every core, and the idle OpenMP workers of its team spin on the
    cores the learner and the envs need (Ape-X's CartPole learner on 2 cores ran at half its rate
    beside its inference server's thread)."""
    n = torch.get_num_threads()  # its lazy per-thread init already applies the process's count
    torch.set_num_threads(n)  # and this MKL's, which matrix products read directly


def scale_images(x: torch.Tensor) -> torch.Tensor:
    """uint8 images to float32 in [0, 1], on whatever device `x` is (x / 255 as x * (1/255))."""
    return x.float() * (1.0 / 255.0)


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of numpy's `dtype` (worked out once per dtype, not per call)."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


class Staging:
    """Host arrays to tensors on `device`: through pinned buffers and non-blocking copies on
    CUDA (`pinned` is True), as the array's own memory on the CPU (nothing copied).

    Arrays are batches (a leading axis); those of one row shape and dtype share a ring of `RING`
    pinned buffers, each as long as the longest batch it has held, so batches of any length
    (a double-buffered sampler's) cost no new pinned memory. An array of `host_array` (a slot
    group's observations) is pinned already and copied from where it is; `concat` joins batches
    straight into a pinned buffer (the inference server's requests: one host copy, not two)."""

    RING = 3
    """Pinned buffers per row shape and dtype: a buffer is reused 3 transfers later."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        """Whether arrays go through pinned buffers (CUDA only; never for a CPU device)."""
        self._rings: dict[tuple[tuple[int, ...], torch.dtype], list[list[Any]]] = {}
        self._turn: dict[tuple[tuple[int, ...], torch.dtype], int] = {}

    def __call__(self, array: np.ndarray | torch.Tensor) -> torch.Tensor:
        """`array` (a batch) as a tensor on the device, same dtype and shape. On CUDA the copy is
        queued and the call returns at once; the result is valid for work queued after it."""
        if not self.pinned:
            return torch.as_tensor(array, device=self.device)
        host = torch.as_tensor(array)
        if host.ndim == 0:
            raise ValueError("Staging takes batches (arrays with a leading axis)")
        if host.is_pinned():  # a `host_array`: copied from where it is
            return host.to(self.device, non_blocking=True)
        buffer, done = self._buffer(host.shape, host.dtype)
        buffer.copy_(host)
        return self._send(buffer, done)

    def concat(self, parts: list[np.ndarray], dtype: Any = None) -> torch.Tensor:
        """`np.concatenate(parts, dtype=dtype)` (batches of one row shape; `dtype` default: the
        first's) as a tensor on the device, as `__call__` gives it; on CUDA the batches are
        joined straight into a pinned buffer, with no host array of the whole in between."""
        dtype = np.dtype(dtype if dtype is not None else parts[0].dtype)
        if not self.pinned:
            joined = np.concatenate(parts, dtype=dtype) if len(parts) > 1 else parts[0]
            return torch.as_tensor(np.asarray(joined, dtype), device=self.device)
        shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
        buffer, done = self._buffer(shape, _torch_dtype(dtype))
        np.concatenate(parts, out=buffer.numpy(), casting="same_kind")
        return self._send(buffer, done)

    def _buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
        """The next pinned buffer of the ring of `shape`'s rows and `dtype`, cut to `shape`
        (free: its copy of `RING` transfers ago is done), and the event that marks its use."""
        key = (tuple(shape[1:]), dtype)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = [[None, torch.cuda.Event()] for _ in range(self.RING)]
        k = self._turn.get(key, 0)
        self._turn[key] = (k + 1) % self.RING
        slot = ring[k]
        slot[1].synchronize()  # its previous copy (RING transfers ago) is done
        if slot[0] is None or slot[0].shape[0] < shape[0]:
            slot[0] = torch.empty(shape, dtype=dtype).pin_memory()
        return slot[0][: shape[0]], slot[1]

    def _send(self, buffer: torch.Tensor, done: Any) -> torch.Tensor:
        """`buffer` copied to the device without waiting; `done` marks when the copy is."""
        out = buffer.to(self.device, non_blocking=True)
        done.record()
        return out

    def host_array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A zeroed numpy array for batches that are written on the host and then sent: on CUDA
        in pinned memory, which `__call__` copies to the device directly, with no staging copy
        (write it again only once work queued after that copy has been waited for, e.g. by
        fetching actions computed from it); on the CPU a plain array."""
        array = np.zeros(shape, dtype)
        return torch.from_numpy(array).pin_memory().numpy() if self.pinned else array


def to_host(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """`tensors` as numpy arrays on the host. On CUDA each is copied non-blocking (into pinned
    memory) and the calling thread's stream is synchronized once for all of them, where a
    `.cpu()` each would wait for the device once per tensor; on the CPU nothing is copied."""
    devices = {t.device for t in tensors.values() if t.device.type == "cuda"}
    if not devices:
        return {k: t.detach().cpu().numpy() for k, t in tensors.items()}
    host = {k: t.detach().to("cpu", non_blocking=True) for k, t in tensors.items()}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return {k: t.numpy() for k, t in host.items()}


class SideStream:
    """A CUDA stream for inference running in its own thread beside a learner on one GPU.

    The stream has a higher priority than the learner's (`PRIORITY`): where both have work
    queued, the GPU starts the inference's blocks first, so actors waiting for actions do not
    wait behind a backward pass. `enter()` makes it the calling thread's current stream (call it
    in that thread). The
    learner's weight updates go inside `exclusive()`: the learner's stream first waits for the
    inference queued so far, and inference queued afterwards waits for the update, both on the
    GPU (no host synchronization). On a CPU device everything is a no-op."""

    PRIORITY = -1
    """The stream's priority (lower is higher; the learner's default stream is 0)."""

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        self.stream = (
            torch.cuda.Stream(device, priority=self.PRIORITY) if device.type == "cuda" else None
        )

    def enter(self) -> None:
        """Make this the calling thread's current CUDA stream."""
        if self.stream is not None:
            torch.cuda.set_stream(self.stream)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Order the work queued inside against the inference stream's, both ways."""
        if self.stream is None:
            yield
            return
        main = torch.cuda.current_stream(self.stream.device)
        main.wait_stream(self.stream)
        yield
        self.stream.wait_stream(main)


class Accel:
    """A run's accelerator choices: device, precision, compilation (see the module docstring)."""

    def __init__(
        self, device: torch.device | str, precision: Precision = "float32", compile: bool = False
    ) -> None:
        if precision not in ("float32", "bf16"):
            raise ValueError(f"--precision must be float32 or bf16, got {precision!r}")
        self.device = torch.device(device)
        self.precision: Precision = precision
        self.compile = bool(compile)

    @classmethod
    def of(cls, config: Any, device: torch.device) -> Accel:
        """The accelerator choices of a learner's config (its `AccelFields`)."""
        return cls(device, config.precision, config.compile)

    def setup(self) -> None:
        """Process-wide settings for this device: TF32 matrix products and convolutions on CUDA
        (float32 runs; 10-bit mantissas in the products, float32 accumulation)."""
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bfloat16 autocast on this device for `bf16`; nothing for float32."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def compiled(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` compiled by torch.compile when `compile` is on (else `fn` itself)."""
        if not self.compile:
            return fn
        mode = "reduce-overhead" if self.device.type == "cuda" else "default"
        return torch.compile(fn, mode=mode)

    def policy(self, net: Any) -> Any:
        """The sampler's policy for an `ActorCritic`: the net itself for a plain float32 run,
        else a `FastPolicy` (autocast, compiled forward)."""
        if self.precision == "float32" and not self.compile:
            return net
        if self.compile and (getattr(net, "recurrent", False) or not hasattr(net, "outputs")):
            raise ValueError("--compile compiles feed-forward actor-critics only")
        return FastPolicy(net, self)


class FastPolicy:
    """An `ActorCritic` acting under a run's precision, its forward (`net.outputs`) compiled when
    asked; the sampler's `act`/`value` (and a recurrent net's `step`/`unroll`)."""

    def __init__(self, net: Any, accel: Accel) -> None:
        self.net, self.accel = net, accel
        self.recurrent = bool(getattr(net, "recurrent", False))
        # an ActorCritic's forward, compiled if asked; other policies (PQN's) act as they are
        self._outputs = accel.compiled(net.outputs) if hasattr(net, "outputs") else None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its net and choices, compiled again where it is loaded (a compiled
        function does not pickle): an inference server in its own process serves a copy."""
        return (FastPolicy, (self.net, self.accel))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with self.accel.autocast():
            if self._outputs is None:
                return self.net.act(obs)
            out, value = self._outputs(obs)
        action, logprob = self.net.sample(out)
        return action, logprob, value.clone()  # a CUDA graph's outputs are overwritten later

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        with self.accel.autocast():
            if self._outputs is None:
                return self.net.value(obs)
            return self._outputs(obs)[1].clone()

    def initial_state(self, envs: int, device: torch.device) -> Any:
        return self.net.initial_state(envs, device)

    @torch.no_grad()
    def step(self, obs: torch.Tensor, starts: Any, state: Any) -> Any:
        with self.accel.autocast():
            return self.net.step(obs, starts, state)

    @torch.no_grad()
    def unroll(self, obs: torch.Tensor, starts: Any, state: Any) -> Any:
        with self.accel.autocast():
            return self.net.unroll(obs, starts, state)

"""Populations of networks: many individuals of one architecture, evaluated in batched calls.

A `PopulationNet` holds `num_slots` networks as stacked parameters (each layer's weights are one
tensor with a leading slot axis). `forward(obs, slots)` runs row k of `obs` through the network in
slot `slots[k]` with a few batched calls per layer (`torch.baddbmm` for dense layers, one grouped
`conv2d` per conv layer), never a Python loop over individuals. An individual's parameters travel as
one flat float32 vector (`num_params` long); `set_slots` / `get_slots` convert.

Architectures: `"mlp"` (tanh hidden layers) for vector observations, `"cnn"` (the Nature DQN conv
stack, conv 32x8x8/4, 64x4x4/2, 64x3x3/1, fc 512, ReLU, inputs scaled by 1/255) for uint8 images
shaped (C, H, W), and `"minatar"` (the MinAtar paper's network: conv 16x3x3/1, fc 128, ReLU) for
MinAtar's bool grids shaped (H, W, C), made float channels-first inside, unscaled. Discrete
actions are the argmax of the outputs; continuous actions squash the outputs with tanh into the
action bounds.

`dtype` sets the parameters' and the computation's precision: "bfloat16" or "float16" halve the
memory the stacked parameters take and the bandwidth the forward pass needs, which bounds the
dense layers (each network reads all its weights for one observation). Meant for GPUs; both run
on the CPU where torch has the kernels (checked at construction), bfloat16 often faster than
float32 there and float16 often much slower (`onebox bench evolve --dtype` measures it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces

from onebox.nn.noise import noise

Arch = Literal["mlp", "cnn", "minatar"]
DType = Literal["float32", "bfloat16", "float16"]
ConvImpl = Literal["auto", "grouped", "im2col"]
Slots = slice | torch.Tensor

NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""(channels, kernel, stride) of the Nature DQN conv layers."""

MINATAR_CONVS = ((16, 3, 1),)
"""(channels, kernel, stride) of the MinAtar network's conv layer."""

DENSE_WIDTH_STEP = 8
"""Dense layers are stored and computed with their outputs padded to a multiple of this many
(zeros). torch's CPU batched matmul (one row per network) computes a network whose output width
is not a multiple of 8 (Pong's 6 actions from 512 units, MinAtar Seaquest's 6 from 128)
differently by its position in the batch, so its actions could depend on the slot it plays in;
padded, every network's outputs are the same bits in any batch and at any position (measured on
a 2-core AMD EPYC for widths 1 to 512 and 1 and 2 threads; tests/test_evo.py)."""


@dataclass(frozen=True)
class Layer:
    """One layer of an individual: its weight and bias shapes (without the slot axis)."""

    kind: Literal["dense", "conv"]
    weight: tuple[int, ...]
    bias: tuple[int, ...]
    stride: int = 1


def _layers(arch: Arch, obs_shape: tuple[int, ...], hidden: tuple[int, ...], out: int) -> list:
    if arch == "mlp":
        if len(obs_shape) != 1:
            raise ValueError(
                f"the mlp takes flat observations, got shape {obs_shape}; use arch='cnn' for images"
            )
        sizes = (obs_shape[0], *hidden, out)
        return [Layer("dense", (a, b), (b,)) for a, b in itertools.pairwise(sizes)]
    if arch in ("cnn", "minatar"):
        if len(obs_shape) != 3:
            layout = "(C, H, W) images" if arch == "cnn" else "(H, W, C) grids"
            raise ValueError(f"the {arch} takes {layout}, got observation shape {obs_shape}")
        c, h, w = obs_shape if arch == "cnn" else (obs_shape[2], *obs_shape[:2])
        layers = []
        for channels, k, s in NATURE_CONVS if arch == "cnn" else MINATAR_CONVS:
            if h < k or w < k:
                raise ValueError(f"observation {obs_shape} is too small for the {arch} network")
            layers.append(Layer("conv", (channels, c, k, k), (channels,), s))
            c, h, w = channels, (h - k) // s + 1, (w - k) // s + 1
        flat = c * h * w
        if len(hidden) != 1:
            raise ValueError(f"the {arch} takes one hidden size (its fc layer), got {hidden}")
        fc = hidden[0]
        layers += [Layer("dense", (flat, fc), (fc,)), Layer("dense", (fc, out), (out,))]
        return layers
    raise ValueError(f"arch must be 'mlp', 'cnn' or 'minatar', got {arch!r}")


OBS_CLIP = 5.0
"""Normalized observations are clipped to [-OBS_CLIP, OBS_CLIP] before the mlp."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""`dtype` names -> torch dtypes."""


def default_arch(observation_space: spaces.Space) -> Arch:
    """The architecture for an observation space: "minatar" for bool (H, W, C) grids, "cnn" for
    other (C, H, W) images, else "mlp"."""
    if len(getattr(observation_space, "shape", None) or ()) != 3:
        return "mlp"
    return "minatar" if getattr(observation_space, "dtype", None) == np.bool_ else "cnn"


class PopulationNet:
    """`num_slots` networks of one architecture, stored as stacked parameters.

    Args:
        arch: "mlp", "cnn" or "minatar".
        observation_space: a Box of floats (mlp), of uint8 (C, H, W) images (cnn) or of bool
            (H, W, C) grids (minatar).
        action_space: Discrete (argmax of outputs) or Box (tanh squashed into the bounds).
        num_slots: individuals held at once.
        hidden: mlp hidden sizes (default (64, 64); () for a linear policy); for the cnn and
            minatar, `(fc,)` (default (512,) and (128,)).
        device: torch device.
        dtype: parameter and compute precision, "float32", "bfloat16" or "float16" (a dtype
            torch cannot run these layers in on `device` raises `ValueError`).
        conv: how a conv layer runs its n individuals: "grouped" (one `conv2d` with a group
            per individual), "im2col" (`unfold`, then one `baddbmm` of every individual's
            weights with its own patches) or "auto": im2col for bfloat16 and float16 on CUDA,
            grouped otherwise. Both compute the same outputs; "auto" picks the faster as
            measured for 125 Nature CNNs on an H200 (grouped 1.1 ms a call in float32 against
            im2col's 3.8 ms; in bfloat16 grouped 6.2-7.8 ms against 3.7 ms: cuDNN's grouped
            kernels are slow in bfloat16) and on a CPU (grouped 1.2-1.6x faster).
    """

    def __init__(
        self,
        arch: Arch,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        num_slots: int,
        *,
        hidden: tuple[int, ...] | None = None,
        device: str | torch.device = "cpu",
        dtype: DType = "float32",
        conv: ConvImpl = "auto",
    ) -> None:
        if not isinstance(observation_space, spaces.Box):
            raise TypeError(f"observations must be a Box space, got {observation_space}")
        if isinstance(action_space, spaces.Discrete):
            self.discrete, out = True, int(action_space.n)
            self.action_shape: tuple[int, ...] = ()
        elif isinstance(action_space, spaces.Box):
            self.discrete, out = False, int(np.prod(action_space.shape))
            self.action_shape = tuple(action_space.shape)
        else:
            raise TypeError(f"actions must be Discrete or Box, got {action_space}")
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots must be a positive integer, got {num_slots!r}")
        if hidden is None:
            hidden = {"cnn": (512,), "minatar": (128,)}.get(arch, (64, 64))
        if any(not isinstance(h, int) or h <= 0 for h in hidden):
            raise ValueError(f"hidden sizes must be positive integers, got {hidden!r}")
        self.arch = arch
        self.obs_shape = tuple(observation_space.shape)
        self.num_slots = num_slots
        self.device = torch.device(device)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype]
        if conv not in ("auto", "grouped", "im2col"):
            raise ValueError(f"conv must be 'auto', 'grouped' or 'im2col', got {conv!r}")
        self.conv: ConvImpl = self.conv_for(self.device, dtype) if conv == "auto" else conv
        self.layers: list[Layer] = _layers(arch, self.obs_shape, tuple(hidden), out)
        self.num_params = sum(math.prod(lay.weight) + math.prod(lay.bias) for lay in self.layers)
        scales = []
        for lay in self.layers:  # 1/sqrt(fan_in) on a layer's weights, 0 on its biases
            fan_in = math.prod(lay.weight[1:]) if lay.kind == "conv" else lay.weight[0]
            scales += [torch.full((math.prod(lay.weight),), fan_in**-0.5), torch.zeros(lay.bias)]
        self._init_scales = {torch.device("cpu"): torch.cat(scales)}
        """Per device: each parameter's standard deviation in a fresh individual."""
        # Dense layers are stored with their outputs padded to a multiple of DENSE_WIDTH_STEP
        # (zeros that nothing writes); `weights` and `biases` are the layers' own views of that.
        self._pads = [-lay.weight[-1] % DENSE_WIDTH_STEP if lay.kind == "dense" else 0
                      for lay in self.layers]  # fmt: skip
        self._stored_weights = [
            torch.zeros(
                (num_slots, *lay.weight[:-1], lay.weight[-1] + pad),
                device=self.device,
                dtype=self.dtype,
            )
            for lay, pad in zip(self.layers, self._pads, strict=True)
        ]
        stored_biases = [
            torch.zeros((num_slots, lay.bias[0] + pad), device=self.device, dtype=self.dtype)
            for lay, pad in zip(self.layers, self._pads, strict=True)
        ]
        self.weights = [w[..., : w.shape[-1] - pad]
                        for w, pad in zip(self._stored_weights, self._pads, strict=True)]  # fmt: skip
        self.biases = [b[:, : b.shape[1] - pad]
                       for b, pad in zip(stored_biases, self._pads, strict=True)]  # fmt: skip
        self._bias3 = [b.unsqueeze(1) for b in stored_biases]  # (slots, 1, out) for baddbmm
        self._tensors = [t for pair in zip(self.weights, self.biases, strict=True) for t in pair]
        self._sizes = [math.prod(t.shape[1:]) for t in self._tensors]
        self.obs_mean: torch.Tensor | None = None
        self.obs_std: torch.Tensor | None = None
        if not self.discrete:
            low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)
            high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)
            self._act_mid = ((high + low) / 2).to(self.device)
            self._act_half = ((high - low) / 2).to(self.device)
        if self.dtype != torch.float32:
            try:  # one forward on zeros: does torch have every kernel in this dtype here?
                self.forward(torch.zeros((1, *self.obs_shape)), slice(0, 1))
            except (RuntimeError, NotImplementedError) as e:
                raise ValueError(
                    f"dtype={dtype!r} does not run on {self.device} with this torch ({e}); "
                    "use float32 (or bfloat16)"
                ) from e

    @staticmethod
    def conv_for(device: torch.device, dtype: DType) -> ConvImpl:
        """What `conv="auto"` picks: im2col for bfloat16 and float16 on CUDA, else grouped."""
        return "im2col" if device.type == "cuda" and dtype != "float32" else "grouped"

    # ---- parameters ---------------------------------------------------------------------------

    def init_params(self, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """A fresh individual from `seed`: weights N(0, 1/fan_in), zero biases (float32, on
        `device`): the noise table's vector of `seed` (`onebox.nn.noise`) times each weight's
        scale, one kernel wherever it is made."""
        device = torch.device(device)
        if device not in self._init_scales:
            self._init_scales[device] = self._init_scales[torch.device("cpu")].to(device)
        return torch.mul(noise(seed, self.num_params, device), self._init_scales[device])

    def set_slots(self, slots: Slots, flat: torch.Tensor) -> None:
        """Load flat parameter vectors `flat` (n, num_params) into slots `slots` (n of them)."""
        flat = torch.as_tensor(flat)
        if flat.ndim != 2 or flat.shape[1] != self.num_params:
            raise ValueError(
                f"parameters must have shape (n, {self.num_params}), got {tuple(flat.shape)}"
            )
        flat = flat.to(self.device, self.dtype, non_blocking=True)
        for t, part in zip(self._tensors, torch.split(flat, self._sizes, dim=1), strict=True):
            t[slots] = part.reshape(-1, *t.shape[1:])

    def move_slots(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy the networks in slots `src` into slots `dst` (disjoint index tensors)."""
        for t in self._tensors:
            t[dst] = t[src]

    def get_slots(self, slots: Slots) -> torch.Tensor:
        """The flat parameter vectors (n, num_params) of `slots`, as float32 on the CPU."""
        return torch.cat([t[slots].flatten(1) for t in self._tensors], dim=1).float().cpu()

    def set_obs_norm(self, mean: np.ndarray | None, std: np.ndarray | None) -> None:
        """Normalize observations as clip((obs - mean) / std, -OBS_CLIP, OBS_CLIP) (mlp)."""
        if mean is None or std is None:
            self.obs_mean = self.obs_std = None
            return
        if np.shape(mean) != self.obs_shape or np.shape(std) != self.obs_shape:
            raise ValueError(f"obs mean and std must have shape {self.obs_shape}")
        self.obs_mean = torch.as_tensor(mean, dtype=torch.float32, device=self.device)
        self.obs_std = torch.as_tensor(std, dtype=torch.float32, device=self.device)

    # ---- forward ------------------------------------------------------------------------------

    def forward(self, obs: torch.Tensor | np.ndarray, slots: Slots) -> torch.Tensor:
        """Outputs (n, out) of slot `slots[k]`'s network on `obs[k]`; `slots` a slice or indices.

        A slice of slots reads the stacked parameters in place; an index tensor gathers them.
        (No autograd: the parameters never require gradients.)
        """
        x = torch.as_tensor(obs, device=self.device)
        n = x.shape[0]
        if isinstance(slots, slice):
            if len(range(*slots.indices(self.num_slots))) != n:
                raise ValueError(f"got {n} observations for slots {slots}")
        else:
            slots = torch.as_tensor(slots, device=self.device)
            if slots.shape != (n,):
                raise ValueError(f"got {n} observations for {tuple(slots.shape)} slots")
        if x.shape[1:] != self.obs_shape:
            raise ValueError(f"observations must have shape (n, {self.obs_shape}), got {x.shape}")
        if self.arch == "cnn":
            x = x.to(self.dtype) / 255.0
        elif self.arch == "minatar":
            x = x.permute(0, 3, 1, 2).to(self.dtype)
        else:
            if self.obs_mean is not None:
                x = ((x.float() - self.obs_mean) / self.obs_std).clamp_(-OBS_CLIP, OBS_CLIP)
            x = x.to(self.dtype)
        last = len(self.layers) - 1
        for k, lay in enumerate(self.layers):
            w = self._stored_weights[k][slots]
            if lay.kind == "dense":
                if x.ndim != 3:
                    x = x.reshape(n, 1, -1)
                x = torch.baddbmm(self._bias3[k][slots], x, w)
                if self._pads[k]:
                    x = x[..., : lay.weight[-1]]
                if k < last:
                    x = torch.tanh_(x) if self.arch == "mlp" else torch.relu_(x)
            else:
                x = torch.relu_(self._conv(x, w, self.biases[k][slots], lay.stride))
        return x.reshape(n, -1).float()

    def _conv(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride: int) -> torch.Tensor:
        """Individual k's conv (weights w[k], bias b[k]) on its own input x[k], for every k."""
        n, out, k = w.shape[0], w.shape[1], w.shape[-1]
        if self.conv == "grouped" and n == 1:
            # A single group is a plain convolution, which oneDNN rounds differently from its
            # grouped kernels: computed as two groups, a lone network's outputs are the same bits
            # as in any batch, so its actions (and fitness) do not depend on who runs beside it.
            two = [t.expand(2, *t.shape[1:]) for t in (x, w, b)]
            return self._conv(*two, stride)[:1]
        if self.conv == "grouped":
            y = F.conv2d(x.reshape(1, -1, *x.shape[2:]), w.reshape(n * out, *w.shape[2:]),
                         b.reshape(-1), stride=stride, groups=n)  # fmt: skip
            return y.reshape(n, out, *y.shape[2:])
        h, wd = ((d - k) // stride + 1 for d in x.shape[2:])
        patches = F.unfold(x, k, stride=stride)  # (n, in * k * k, h * wd), in w's (in, k, k) order
        return torch.baddbmm(b.unsqueeze(2), w.reshape(n, out, -1), patches).reshape(n, out, h, wd)

    def act(self, obs: torch.Tensor | np.ndarray, slots: Slots) -> np.ndarray:
        """Actions (numpy) of slot `slots[k]`'s network on `obs[k]`."""
        out = self.forward(obs, slots)
        if self.discrete:
            return out.argmax(dim=1).cpu().numpy()
        a = torch.tanh(out) * self._act_half + self._act_mid
        return a.cpu().numpy().reshape(len(a), *self.action_shape)

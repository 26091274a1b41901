"""The accelerator path (`onebox.nn.accel`) on the CPU: uint8 scaling, staging (never pinned on a
CPU), bfloat16 autocast and torch.compile against float32 eager, the options through a
learner; and, marked `cuda` (left out without a GPU), the same on CUDA against the CPU: every
network's outputs, and a short run of each learner on CUDA resumed on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from onebox import cli, run
from onebox.algos import ppo
from onebox.nn.accel import Accel, FastPolicy, SideStream, Staging, scale_images, to_host
from onebox.nn.networks import ActorCritic
from onebox.nn.population import PopulationNet
from onebox.nn.q_networks import QNetwork, RecurrentQNetwork, SquashedGaussianActor

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

IMAGES = spaces.Box(0, 255, (4, 84, 84), np.uint8)
VECTORS = spaces.Box(-np.inf, np.inf, (4,), np.float32)


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 4, 84, 84), dtype=np.uint8)


def cnn_net(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(IMAGES, spaces.Discrete(6)).eval()


# ---- on the CPU ---------------------------------------------------------------------------------


def test_uint8_scaling_on_the_device_equals_host_scaling_exactly() -> None:
    obs = np.arange(256, dtype=np.uint8).reshape(1, 256).repeat(3, 0)
    host = obs.astype(np.float32) * np.float32(1.0 / 255.0)
    device = scale_images(Staging("cpu")(obs))
    assert device.dtype == torch.float32
    np.testing.assert_array_equal(device.numpy(), host)
    assert device[0, 255] == 1.0 and device[0, 0] == 0.0


def test_cpu_staging_never_pins_and_keeps_dtype() -> None:
    staging = Staging(torch.device("cpu"))
    assert not staging.pinned
    obs = images(2)
    out = staging(obs)
    assert out.dtype == torch.uint8 and out.device.type == "cpu"  # uint8 travels as uint8
    assert np.shares_memory(out.numpy(), obs)  # no copy at all on the CPU
    assert not staging._rings  # no pinned buffer was made
    assert Staging(torch.device("cuda")).pinned  # the choice alone: no GPU needed for it
    host = staging.host_array((3, 4), np.uint8)
    assert host.shape == (3, 4) and host.dtype == np.uint8 and not host.any()
    assert np.shares_memory(staging(host[:2]).numpy(), host)
    # Requests joined: one request is its own memory, several one array, in the dtype asked.
    assert np.shares_memory(staging.concat([obs]).numpy(), obs)
    joined = staging.concat([obs, images(3, seed=1)])
    np.testing.assert_array_equal(joined.numpy(), np.concatenate([obs, images(3, seed=1)]))
    ids = staging.concat([np.arange(2, dtype=np.int32), np.arange(3, dtype=np.int32)], np.int64)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 1, 0, 1, 2]


def test_to_host_on_the_cpu_shares_memory_and_keeps_dtypes() -> None:
    out = {"actions": torch.arange(5), "values": torch.linspace(0, 1, 5)}
    host = to_host(out)
    assert host["actions"].dtype == np.int64 and host["values"].dtype == np.float32
    assert np.shares_memory(host["values"], out["values"].numpy())  # nothing copied
    np.testing.assert_array_equal(host["actions"], np.arange(5))


def test_side_stream_is_a_no_op_on_the_cpu() -> None:
    side = SideStream("cpu")
    assert side.stream is None
    side.enter()
    with side.exclusive():
        pass


def test_bf16_autocast_matches_float32() -> None:
    net = cnn_net()
    obs = torch.from_numpy(images(32))
    logits32, value32 = net.outputs(obs)
    with Accel("cpu", "bf16").autocast():
        logits16, value16 = net.outputs(obs)
    assert logits16.dtype == value16.dtype == torch.float32  # outputs stay float32
    assert not torch.equal(value16, value32)  # it did compute in bfloat16
    torch.testing.assert_close(value16, value32, atol=0.02, rtol=0.02)
    torch.testing.assert_close(logits16, logits32, atol=2e-3, rtol=0.02)
    fast = Accel("cpu", "bf16").policy(net)
    assert isinstance(fast, FastPolicy)
    torch.testing.assert_close(fast.value(obs), value32, atol=0.02, rtol=0.02)
    action, logprob, value = fast.act(obs)
    assert action.shape == logprob.shape == value.shape == (32,)


@pytest.mark.slow  # torch.compile's first call takes tens of seconds on a small CPU
def test_compiled_inference_matches_eager() -> None:
    torch.manual_seed(0)
    net = ActorCritic(VECTORS, spaces.Discrete(2)).eval()
    obs = torch.randn(8, 4)
    fast = Accel("cpu", compile=True).policy(net)
    torch.testing.assert_close(fast.value(obs), net.value(obs))
    torch.manual_seed(1)
    action, logprob, value = fast.act(obs)
    torch.manual_seed(1)
    want = net.act(obs)
    torch.testing.assert_close((action, logprob, value), want)


def test_plain_float32_run_uses_the_net_itself() -> None:
    net = cnn_net()
    assert Accel("cpu").policy(net) is net


def test_bad_accel_options_are_rejected_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="feed-forward"):
        ppo.resolve(ppo.Config(env="CartPole-v1", compile=True, lstm=16, runs_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="precision"):
        ppo.resolve(ppo.Config(env="CartPole-v1", precision="fp8", runs_dir=str(tmp_path)))  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


def test_ppo_trains_in_bf16_from_the_command_line(tmp_path: Path) -> None:
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--total-steps", "1024",
                     "--precision", "bf16", "--runs-dir", str(tmp_path), "--name", "r"]) == 0  # fmt: skip
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert config["precision"] == "bf16" and config["compile"] is False
    assert run.load_checkpoint(tmp_path / "r")["global_step"] == 1024


# ---- on CUDA (marked `cuda`: `python -m pytest -m cuda` on a machine with a GPU) ------------------


@cuda
@needs_cuda
def test_atari_on_cuda_leaves_the_cpu_cores_to_the_envs() -> None:
    c = ppo.resolve(ppo.Config(env="Pong-v5", device="cuda"))
    assert c.torch_threads == 1  # the physical cores on a CPU: idle OpenMP threads would spin


@cuda
@needs_cuda
def test_cuda_staging_pins_and_equals_the_host() -> None:
    staging = Staging("cuda")
    assert staging.pinned
    lengths = (16, 3, 20, 7)  # a period prime to the ring's: each buffer holds every length
    for k in range(len(lengths) * Staging.RING):  # the ring wraps: buffers reused, grown, shared
        obs = images(lengths[k % len(lengths)], seed=k)
        out = staging(obs)
        assert out.device.type == "cuda" and out.dtype == torch.uint8
        np.testing.assert_array_equal(out.cpu().numpy(), obs)
    (ring,) = staging._rings.values()  # one ring for every batch length
    assert all(buf.is_pinned() and len(buf) == 20 for buf, _ in ring)
    host = obs.astype(np.float32) * np.float32(1.0 / 255.0)
    np.testing.assert_array_equal(scale_images(out).cpu().numpy(), host)
    # A host array of its own is pinned and sent from where it is, not through the ring.
    pinned = staging.host_array((6, 4, 84, 84), np.uint8)
    assert torch.from_numpy(pinned).is_pinned() and not pinned.any()
    pinned[:] = images(6, seed=99)
    turn = dict(staging._turn)
    out = staging(pinned[:5])
    np.testing.assert_array_equal(out.cpu().numpy(), pinned[:5])
    assert staging._turn == turn  # no ring buffer taken
    # Requests joined straight into the ring's pinned buffers, each batch as it was given.
    for k in range(2 * Staging.RING):
        parts = [images(n, seed=10 * k + n) for n in (1 + k % 3, 5, 2)]
        out = staging.concat(parts)
        np.testing.assert_array_equal(out.cpu().numpy(), np.concatenate(parts))
    ids = staging.concat([np.full(3, 7), np.arange(4, dtype=np.int32)], np.int64)
    assert ids.dtype == torch.int64 and ids.cpu().tolist() == [7, 7, 7, 0, 1, 2, 3]


@cuda
@needs_cuda
def test_cuda_side_stream_outranks_the_learners() -> None:
    side = SideStream("cuda")
    assert side.stream is not None
    assert side.stream.priority < torch.cuda.default_stream().priority


@cuda
@needs_cuda
def test_cuda_to_host_fetches_every_output_after_one_wait() -> None:
    x = torch.randn(4096, 512, device="cuda")
    y = x @ x.T  # queued work the fetch must wait for
    out = {"actions": y.argmax(1), "values": y.max(1).values, "state": x[:, :3]}
    host = to_host(out)
    for k, v in out.items():
        want = v.cpu().numpy()
        assert host[k].dtype == want.dtype
        np.testing.assert_array_equal(host[k], want)


@cuda
@needs_cuda
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_cuda_networks_match_the_cpu(precision: str) -> None:
    tol = {"float32": 1e-2, "bf16": 5e-2}[precision]  # float32 on CUDA uses TF32 products
    accel = Accel("cuda", precision)  # type: ignore[arg-type]
    accel.setup()
    obs = torch.from_numpy(images(64))
    net = cnn_net()
    want = net.outputs(obs)
    with accel.autocast():
        got = net.to("cuda").outputs(obs.cuda())
    torch.testing.assert_close([g.cpu() for g in got], list(want), atol=tol, rtol=tol)
    torch.manual_seed(0)
    q = QNetwork(IMAGES, spaces.Discrete(6), dueling=True)
    want_q = q(obs)
    with accel.autocast():
        got_q = q.to("cuda")(obs.cuda())
    torch.testing.assert_close(got_q.cpu(), want_q, atol=tol, rtol=tol)
    torch.manual_seed(0)
    rq = RecurrentQNetwork(IMAGES, spaces.Discrete(6))  # R2D2's: 5 steps of 4 envs
    seq = obs[:20].view(5, 4, *obs.shape[1:])
    state = (torch.randn(4, rq.size), torch.randn(4, rq.size))
    want_rq = rq.unroll(seq, state)
    with accel.autocast():
        got_rq = rq.to("cuda").unroll(seq.cuda(), (state[0].cuda(), state[1].cuda()))
    torch.testing.assert_close(
        [got_rq[0].float().cpu(), *(h.float().cpu() for h in got_rq[1])],
        [want_rq[0], *want_rq[1]], atol=tol, rtol=tol,
    )  # fmt: skip
    torch.manual_seed(0)
    ac = ActorCritic(IMAGES, spaces.Discrete(6), lstm=64)  # IMPALA's and APPO's --lstm
    starts = torch.zeros(5, 4, dtype=torch.bool)
    starts[2, 1] = True
    state_ac = (torch.randn(4, 64), torch.randn(4, 64))
    d, v, (h, c) = ac.unroll(seq, starts, state_ac)
    with accel.autocast():
        got_d, got_v, got_s = ac.to("cuda").unroll(
            seq.cuda(), starts.cuda(), (state_ac[0].cuda(), state_ac[1].cuda())
        )
    torch.testing.assert_close(
        [got_d.logits.float().cpu(), got_v.float().cpu(), *(x.float().cpu() for x in got_s)],
        [d.logits, v, h, c], atol=tol, rtol=tol,
    )  # fmt: skip
    box = spaces.Box(-2.0, 2.0, (3,), np.float32)
    actor = SquashedGaussianActor(spaces.Box(-np.inf, np.inf, (11,), np.float32), box)
    x = torch.randn(64, 11)
    want_a = actor(x)
    with accel.autocast():
        got_a = actor.to("cuda")(x.cuda())
    torch.testing.assert_close([g.float().cpu() for g in got_a], list(want_a), atol=tol, rtol=tol)


@cuda
@needs_cuda
def test_cuda_population_bf16_matches_cpu_float32() -> None:
    act = spaces.Discrete(6)
    cpu = PopulationNet("cnn", IMAGES, act, 8)
    gpu = PopulationNet("cnn", IMAGES, act, 8, device="cuda", dtype="bfloat16")
    params = torch.stack([cpu.init_params(s) for s in range(8)])
    cpu.set_slots(slice(0, 8), params)
    gpu.set_slots(slice(0, 8), params)
    obs = torch.from_numpy(images(8))
    want = cpu.forward(obs, slice(0, 8))
    got = gpu.forward(Staging("cuda")(obs), slice(0, 8)).cpu()
    torch.testing.assert_close(got, want, atol=0.05 * float(want.abs().max()), rtol=0.05)


@cuda
@needs_cuda
def test_cuda_compiled_graph_inference_matches_eager() -> None:
    net = cnn_net().to("cuda")
    obs = Staging("cuda")(images(64))
    fast = Accel("cuda", compile=True).policy(net)
    for _ in range(3):  # compile, record the CUDA graph, replay it
        value = fast.value(obs)
    torch.testing.assert_close(value, net.value(obs), atol=1e-2, rtol=1e-2)


LEARNERS = {
    "ppo": ["--env", "CartPole-v1", "--total-steps", "2048"],
    "a2c": ["--env", "CartPole-v1", "--total-steps", "2000"],
    "impala": ["--env", "CartPole-v1", "--total-steps", "1600", "--actors", "2"],
    "appo": ["--env", "CartPole-v1", "--total-steps", "1600", "--actors", "2"],
    "dqn": ["--env", "CartPole-v1", "--total-steps", "2000", "--learning-starts", "500"],
    "pqn": ["--env", "CartPole-v1", "--total-steps", "2048"],
    "sac": ["--env", "Pendulum-v1", "--total-steps", "600", "--learning-starts", "300"],
    "apex": ["--env", "CartPole-v1", "--total-steps", "3000", "--learning-starts", "500"],
    "r2d2": ["--env", "CartPole-v1", "--total-steps", "3000", "--learning-starts", "20"],
}
"""A short run of each learner that uses a GPU (a3c is CPU-only Hogwild)."""


@cuda
@needs_cuda
@pytest.mark.parametrize("algo", sorted(LEARNERS))
def test_cuda_run_completes_and_resumes_on_the_cpu(tmp_path: Path, algo: str) -> None:
    args = ["train", algo, *LEARNERS[algo], "--device", "cuda", "--runs-dir", str(tmp_path),
            "--name", "r", "--checkpoint-minutes", "0"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(args) == 0
    compacted = [w for w in caught if "single contiguous chunk" in str(w.message)]
    assert not compacted, "an LSTM's weights are compacted at every call: flatten_parameters()"
    run_dir = tmp_path / "r"
    steps = run.load_checkpoint(run_dir)["global_step"]
    assert steps > 0
    stored = json.loads((run_dir / "config.json").read_text())
    stored["config"]["device"] = "cpu"  # a hand edit, checked again on resume
    stored["config"]["total_steps"] = 2 * stored["config"]["total_steps"]
    (run_dir / "config.json").write_text(json.dumps(stored))
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert run.load_checkpoint(run_dir)["global_step"] > steps
    assert cli.main(["eval", str(run_dir), "--episodes", "1"]) == 0


@cuda
@needs_cuda
def test_cuda_appo_with_a_compiled_server_completes(tmp_path: Path) -> None:
    # Its server pads each call to a power of two, so the compiled policy replays a few CUDA
    # graphs, whatever the sizes of the requests that wait.
    args = ["train", "appo", *LEARNERS["appo"], "--device", "cuda", "--compile",
            "--runs-dir", str(tmp_path), "--name", "c"]  # fmt: skip
    assert cli.main(args) == 0
    assert run.load_checkpoint(tmp_path / "c")["global_step"] > 0


@cuda
@needs_cuda
@pytest.mark.parametrize(
    ("algo", "compiled", "servers"),
    [("appo", False, 1), ("appo", True, 1), ("appo", False, 2), ("apex", False, 1),
     ("r2d2", False, 1)],
)  # fmt: skip
def test_cuda_learners_with_their_server_in_a_process_of_its_own_complete(
    tmp_path: Path, algo: str, compiled: bool, servers: int
) -> None:
    # The learner's network and policy (compiled again there; Ape-X's with its CUDA random
    # generator; R2D2's LSTM flattened again) pickled onto the same GPU in the server's
    # process (or in each of two, with a CUDA context each), which reloads the weights the
    # learner publishes.
    args = ["train", algo, *LEARNERS[algo], "--device", "cuda", "--process-actors",
            "--server-process", "--server-processes", str(servers), "--runs-dir",
            str(tmp_path), "--name", "s", *(["--compile"] if compiled else [])]  # fmt: skip
    assert cli.main(args) == 0
    run_dir = tmp_path / "s"
    assert run.load_checkpoint(run_dir)["global_step"] > 0
    served = [line for line in (run_dir / "metrics.csv").open()
              if ",charts/inference_on_core," in line]  # fmt: skip
    assert served  # the server's process answered the learner's questions


@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 or not Path("/proc/self/task").is_dir(),
    reason="needs 2 cores (MKL's default team) and Linux's /proc",
)
def test_the_inference_server_thread_keeps_torch_to_the_process_thread_count() -> None:
    """After `torch.set_num_threads(1)`, the server's thread (started later) runs its policy on
    one thread too: without `inherit_torch_threads` its matrix products start an OpenMP team
    whose idle worker spins beside the learner (an extra thread in the process)."""
    script = """
import os, numpy as np, torch
from gymnasium import spaces
from onebox.algos import apex
from onebox.sampling.inference import InferenceServer
torch.set_num_threads(1)
obs_space, act_space = spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)
config = apex.resolve(apex.Config(actors=1, device="cpu"))
learner = apex.ApeX(config, obs_space, act_space, torch.device("cpu"))
before = len(os.listdir("/proc/self/task"))
with InferenceServer(learner.policy, obs_space, act_space, outputs=learner.outputs) as server:
    for _ in range(200):
        server.infer(0, np.arange(64), np.zeros((64, 4), np.float32))
    print(len(os.listdir("/proc/self/task")) - before)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) == 1  # the server's own thread, and no OpenMP worker

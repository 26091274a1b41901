"""Bad input to the native env pools raises a clear Python exception: never a crash, hang or deadlock.

Every check asserts the exception type and a fragment of a message that tells the user what to fix,
and most then check that the pool is still usable: a rejected call must not leave half-done state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

import onebox.envs
from onebox.envs import NativeEnvPool

ENV = "CartPole-v1"
MANY = 8192  # enough CartPole envs that the engine hands the work to its worker threads

pytestmark = pytest.mark.timeout(30)


@contextlib.contextmanager
def opened(num_envs: int = 4, **kwargs) -> Iterator[NativeEnvPool]:
    """A pool, reset (a step before the first reset raises)."""
    pool = onebox.envs.make(ENV, num_envs, **kwargs)
    pool.reset()
    try:
        yield pool
    finally:
        pool.close()


def zeros(n: int) -> np.ndarray:
    return np.zeros(n, np.int64)


def assert_usable(pool: NativeEnvPool) -> None:
    """The pool has nothing in flight and still steps, sync and async."""
    assert pool._engine.pending == 0
    n, b = pool.num_envs, pool.batch_size
    obs, *_ = pool.step(zeros(n))
    assert obs.shape == (n, 4)
    pool.send(zeros(n))
    for _ in range(n // b):
        pool.recv()
    if n % b:
        pool.reset()
    assert pool._engine.pending == 0


# ---- making a pool ----------------------------------------------------------------------------


def test_unknown_env_id_suggests_close_matches():
    with pytest.raises(ValueError, match=r"unknown env id 'CartPol-v1'.*Did you mean.*CartPole-v1"):
        onebox.envs.make("CartPol-v1", 2)
    with pytest.raises(ValueError, match=r"cartpole-v1"):
        onebox.envs.make("cartpole-v1", 2)
    with pytest.raises(ValueError, match=r"unknown env id 'NoSuchEnv-v0'"):
        onebox.envs.make("NoSuchEnv-v0", 2)
    with pytest.raises(ValueError, match=r"'CartPol-v1' is not a native env.*CartPole-v1"):
        NativeEnvPool("CartPol-v1", 2)


def test_env_id_must_be_a_string():
    with pytest.raises(TypeError, match="env_id must be a string"):
        onebox.envs.make(None, 2)


def test_unknown_env_option():
    with pytest.raises(TypeError, match=r"CartPole-v1 has no option 'foo'.*sutton_barto_reward"):
        onebox.envs.make(ENV, 2, foo=1)
    with pytest.raises(TypeError, match=r"no option 'sutton_barto_rewad'.*Did you mean"):
        onebox.envs.make(ENV, 2, sutton_barto_rewad=True)


@pytest.mark.parametrize("value", [1, "yes", 1.0, None])
def test_wrongly_typed_env_option(value):
    with pytest.raises(TypeError, match=r"CartPole-v1 option 'sutton_barto_reward' takes a bool"):
        onebox.envs.make(ENV, 2, sutton_barto_reward=value)


def test_wrongly_typed_env_option_message_shows_the_value_passed():
    # "takes a bool, got True" for an input of 1 would be confusing: show what the user passed.
    with pytest.raises(TypeError, match=r"takes a bool, got 1$"):
        onebox.envs.make(ENV, 2, sutton_barto_reward=1)


@pytest.mark.parametrize("num_envs", [0, -3, 2.0, "4", None, True])
def test_bad_num_envs(num_envs):
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        onebox.envs.make(ENV, num_envs)


@pytest.mark.parametrize("batch_size", [0, -1, 5, 100])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match=r"batch_size must be between 1 and num_envs=4"):
        onebox.envs.make(ENV, 4, batch_size=batch_size)
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        onebox.envs.make(ENV, 4, batch_size=2.0)


@pytest.mark.parametrize("num_threads", [0, -2])
def test_bad_num_threads(num_threads):
    with pytest.raises(ValueError, match=r"num_threads must be >= 1"):
        onebox.envs.make(ENV, 4, num_threads=num_threads)
    with pytest.raises(ValueError, match="num_threads must be an integer"):
        onebox.envs.make(ENV, 4, num_threads=1.5)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", None])
def test_bad_constructor_seed(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        onebox.envs.make(ENV, 2, seed=seed)


def test_too_large_constructor_seed():
    # reset() rejects seeds >= 2**64 with a clear message; make() must too, not fail in the bindings.
    with pytest.raises(ValueError, match="seed"):
        onebox.envs.make(ENV, 2, seed=2**64)


def test_bad_max_episode_steps_and_autoreset_mode():
    with pytest.raises(ValueError, match="max_episode_steps must be a non-negative integer"):
        onebox.envs.make(ENV, 2, max_episode_steps=-1)
    with pytest.raises(ValueError, match="max_episode_steps must be a non-negative integer"):
        onebox.envs.make(ENV, 2, max_episode_steps=2.5)
    with pytest.raises(ValueError, match="autoreset_mode must be 'NextStep', 'SameStep' or 'Disa"):
        onebox.envs.make(ENV, 2, autoreset_mode="Never")


# ---- reset seeds and options ------------------------------------------------------------------


def test_bad_reset_seeds():
    with opened(4) as pool:
        with pytest.raises(ValueError, match=r"seeds must be in \[0, 2\*\*64\)"):
            pool.reset(seed=-1)
        with pytest.raises(ValueError, match=r"seeds must be in \[0, 2\*\*64\)"):
            pool.reset(seed=[0, 1, -2, 3])
        with pytest.raises(ValueError, match=r"seeds must be in \[0, 2\*\*64\)"):
            pool.reset(seed=2**64 - 2)  # env 3 would get 2**64 + 1
        with pytest.raises(ValueError, match="got 3 seeds for 4 envs"):
            pool.reset(seed=[1, 2, 3])
        with pytest.raises(ValueError, match="got 5 seeds for 4 envs"):
            pool.async_reset(seed=np.arange(5))
        with pytest.raises(TypeError, match="seed must be None, an int or a sequence of ints"):
            pool.reset(seed=1.5)
        with pytest.raises(ValueError, match="native envs take no reset options other than"):
            pool.reset(options={"low": 0.1})
        assert_usable(pool)


def test_string_seed_is_not_a_sequence_of_seeds():
    # A str is a Sequence: "12" must not silently become the seeds [1, 2].
    with opened(2) as pool, pytest.raises(TypeError, match="seed"):
        pool.reset(seed="12")


def test_non_integer_seeds_in_a_list():
    # Gymnasium rejects non-integer seeds; truncating 0.5 to 0 would hide a bug in the caller.
    with opened(2) as pool, pytest.raises(TypeError, match="seed"):
        pool.reset(seed=[0.5, 1.5])


# ---- actions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (5,), (4, 1), (1,), (), (0,)])
def test_actions_of_the_wrong_shape(shape):
    with opened(4) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"actions must have shape \(4,\)"):
            pool.step(np.zeros(shape, np.int64))
        assert_usable(pool)


def test_actions_of_the_wrong_dtype():
    with opened(4) as pool:
        pool.reset(seed=0)
        with pytest.raises(TypeError, match="discrete actions must be integers, got dtype float"):
            pool.step(np.zeros(4, np.float32))
        with pytest.raises(TypeError, match="discrete actions must be integers, got dtype float64"):
            pool.step([0.0, 1.0, 1.0, 0.0])
        with pytest.raises(TypeError, match="discrete actions must be integers"):
            pool.step(np.array(["0", "1", "0", "1"]))
        with pytest.raises(TypeError, match="discrete actions must be integers"):
            pool.step([None] * 4)
        with pytest.raises(TypeError, match="discrete actions must be integers"):
            pool.send(np.ones(2, np.float64), [0, 1])
        assert_usable(pool)


@pytest.mark.parametrize("bad", [2, -1, 2**40, np.iinfo(np.int64).min])
def test_actions_out_of_range(bad):
    with opened(4, batch_size=2) as pool:
        pool.reset(seed=0)
        actions = np.array([0, 1, bad, 0], np.int64)
        with pytest.raises(ValueError, match=rf"action {bad} for env 2 is out of range.*0\.\.1"):
            pool.step(actions)
        with pytest.raises(ValueError, match=rf"action {bad} for env 3 is out of range"):
            pool.send(np.array([1, bad]), [1, 3])
        assert pool._engine.pending == 0  # the rejected send left nothing in flight
        assert_usable(pool)


def test_unsigned_actions_that_wrap_are_rejected():
    with opened(2) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match="out of range"):
            pool.step(np.array([0, 2**64 - 1], np.uint64))


# ---- env ids in send --------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[0, 4], [-1], [7, 1], [2**31 - 1]])
def test_env_ids_out_of_range(ids):
    with opened(4, batch_size=2) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match=r"env id -?\d+ is out of range \[0, 4\)"):
            pool.send(zeros(len(ids)), ids)
        assert_usable(pool)


@pytest.mark.parametrize("ids", [[2**32], [2**32 + 1, 2], [-(2**32) + 3]])
def test_env_ids_that_overflow_int32_are_rejected(ids):
    # These must not wrap around to valid ids (2**32 would silently become env 0).
    with opened(4, batch_size=1) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match="out of range"):
            pool.send(zeros(len(ids)), ids)
        assert pool._engine.pending == 0


def test_bad_env_id_arrays():
    with opened(4, batch_size=2) as pool:
        pool.reset(seed=0)
        with pytest.raises(ValueError, match="env id 1 appears twice in one send"):
            pool.send(zeros(3), [1, 2, 1])
        with pytest.raises(TypeError, match="env_ids must be integers"):
            pool.send(zeros(2), [0.0, 1.0])
        with pytest.raises(ValueError, match="env_ids must be one-dimensional"):
            pool.send(zeros(1), [[0]])
        with pytest.raises(ValueError, match="send\\(\\) needs at least one env id"):
            pool.send(zeros(0), np.array([], np.int32))
        with pytest.raises(ValueError, match=r"actions must have shape \(2,\)"):
            pool.send(zeros(3), [0, 1])
        assert pool._engine.pending == 0
        assert_usable(pool)


def test_send_to_an_env_already_in_flight():
    with opened(4, batch_size=2) as pool:
        pool.reset(seed=0)
        pool.send(zeros(1), [1])
        with pytest.raises(ValueError, match="env id 1 was already sent and not yet received"):
            pool.send(zeros(2), [2, 1])
        # The rejected send did not put env 2 in flight: it can be sent now.
        assert pool._engine.pending == 1
        pool.send(zeros(1), [2])
        assert sorted(pool.recv()[4]["env_id"].tolist()) == [1, 2]
        pool.async_reset(seed=0)  # every env is in flight after async_reset
        with pytest.raises(ValueError, match="env id 3 was already sent"):
            pool.send(zeros(1), [3])
        pool.recv()
        pool.recv()
        assert_usable(pool)


# ---- recv / step with the wrong things pending ------------------------------------------------


def test_recv_with_nothing_pending():
    with opened(4, batch_size=2) as pool:
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            pool.recv()
        pool.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            pool.recv()
        pool.async_reset(seed=0)
        pool.recv()
        pool.recv()
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            pool.recv()
        assert_usable(pool)


@pytest.mark.parametrize(("num_envs", "batch_size", "sent"), [(4, 3, 2), (MANY, 1024, 1000)])
def test_recv_with_fewer_than_batch_size_pending_raises_instead_of_hanging(
    num_envs, batch_size, sent
):
    with opened(num_envs, batch_size=batch_size, num_threads=2) as pool:
        pool.reset(seed=0)
        pool.send(zeros(sent), np.arange(sent))
        with pytest.raises(RuntimeError, match=rf"{sent} envs are pending but batch_size is"):
            pool.recv()
        pool.send(zeros(batch_size - sent), np.arange(sent, batch_size))
        assert len(pool.recv()[4]["env_id"]) == batch_size
        with pytest.raises(RuntimeError, match=r"recv\(\) with nothing pending"):
            pool.recv()


@pytest.mark.parametrize("num_envs", [4, MANY])
def test_step_while_async_envs_are_pending(num_envs):
    with opened(num_envs, batch_size=num_envs // 2, num_threads=2) as pool:
        pool.async_reset(seed=0)
        with pytest.raises(RuntimeError, match=rf"{num_envs} envs have async steps pending"):
            pool.step(zeros(num_envs))
        pool.recv()
        with pytest.raises(RuntimeError, match=rf"{num_envs // 2} envs have async steps pending"):
            pool.step(zeros(num_envs))
        pool.recv()
        pool.step(zeros(num_envs))


# ---- after close ------------------------------------------------------------------------------


@pytest.mark.parametrize("pending", [False, True])
def test_every_call_after_close_raises(pending):
    pool = onebox.envs.make(ENV, 4, batch_size=2)
    pool.reset(seed=0)
    if pending:
        pool.send(zeros(2), [0, 1])
    pool.close()
    calls = {
        "step": lambda: pool.step(zeros(4)),
        "reset": lambda: pool.reset(seed=0),
        "send": lambda: pool.send(zeros(2), [2, 3]),
        "recv": pool.recv,
        "async_reset": pool.async_reset,
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="the env pool is closed"):
            call()
        assert pool.closed, name
    pool.close()  # a second close is a no-op


# ---- state access (debugging helpers) ---------------------------------------------------------


def test_get_and_set_state_check_their_arguments():
    with opened(4) as pool:
        pool.reset(seed=0)
        for env_id in (4, -1):
            with pytest.raises(IndexError):
                pool.get_state(env_id)
            with pytest.raises(IndexError):
                pool.set_state(env_id, [0.0] * 4)
        with pytest.raises(ValueError, match="CartPole state has 4 values"):
            pool.set_state(0, [0.0] * 3)
        assert_usable(pool)


# ---- continuous actions -----------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_nan_continuous_actions_are_rejected(env_id):
    if env_id not in onebox.envs.list_envs():
        pytest.skip(f"{env_id} is not a native env yet")
    with contextlib.closing(onebox.envs.make(env_id, 3, batch_size=1)) as pool:
        shape = pool.single_action_space.shape
        pool.reset(seed=0)
        good = np.zeros((3, *shape), np.float32)
        bad = good.copy()
        bad[1].flat[0] = np.nan
        with pytest.raises(ValueError, match=r"action for env 1 contains NaN"):
            pool.step(bad)
        with pytest.raises(ValueError, match="NaN"):
            pool.step(bad.astype(np.float64))
        with pytest.raises(ValueError, match=r"action for env 2 contains NaN"):
            pool.send(bad[:2], [0, 2])
        assert pool._engine.pending == 0
        with pytest.raises(TypeError, match="continuous actions must be numbers"):
            pool.step(np.full((3, *shape), "a"))
        with pytest.raises(ValueError, match="actions must have shape"):
            pool.step(np.zeros((3, *shape, 2), np.float32))
        # Finite values outside the bounds are clipped by the env, not rejected.
        obs, *_ = pool.step(np.full((3, *shape), 1e6, np.float32))
        assert np.isfinite(obs).all()
        pool.send(good[:1], [0])
        pool.recv()

"""Population-based training: the decisions (who copies whom, how hyperparameters move), the
in-memory copies on real trainers, the run (lineage, logs, resume, eval) and bad input."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

import onebox.envs
from onebox import cli, registry, run
from onebox.algos import driver, ppo
from onebox.algos.trainer import POSITIVE, UNIT, Bounds, EnvSeeds, Range
from onebox.nn.networks import ActorCritic
from onebox.nn.stacked import StackedPolicy
from onebox.pbt import configs
from onebox.pbt import run as pbt_run
from onebox.pbt.explore import Explore, draw, mutation_space, pairs
from onebox.pbt.plots import ancestry
from onebox.pbt.population import Population, state_hash
from onebox.pbt.shared import SharedEnvs
from onebox.sampling import EpisodeTracker

# ---- ranges and decisions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r", "bounds", "message"),
    [
        (Range(0.1, 0.01, "log"), POSITIVE, "low < high"),
        (Range(0.1, 0.1), POSITIVE, "low < high"),
        (Range(0.0, 0.1, "log"), Bounds(), "above 0"),
        (Range(0.9, 1.0, "complement"), UNIT, "below 1"),
        (Range(0.5, 2.0), UNIT, "must be in [0, 1]"),
        (Range(0.0, 0.1), POSITIVE, "must be in (0, inf)"),
    ],
)
def test_a_bad_range_is_refused(r: Range, bounds: Bounds, message: str) -> None:
    with pytest.raises(ValueError) as info:
        r.check("x", bounds)
    assert message in str(info.value)


@pytest.mark.parametrize("scale", ["linear", "log", "complement"])
def test_draws_and_perturbations_stay_in_the_range(scale: str) -> None:
    r = Range(0.01, 0.5, scale)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    draws = np.array([r.sample(rng) for _ in range(2000)])
    assert draws.min() >= 0.01 and draws.max() <= 0.5
    middle = {
        "linear": 0.255,
        "log": math.sqrt(0.01 * 0.5),
        "complement": 1 - math.sqrt(0.99 * 0.5),
    }
    assert (
        abs(np.median(draws) - middle[scale]) < 0.05 * (0.5 - 0.01) + 0.01
    )  # uniform on its scale
    up, down = (0.01, 0.5) if scale == "complement" else (0.5, 0.01)  # 1 - x moves by the factor
    assert r.perturb(0.4, 2.0) == up and r.perturb(0.45, 0.01) == down  # kept in the range
    moved = 1 - 0.8 * 1.2 if scale == "complement" else 0.2 * 1.2
    assert math.isclose(r.perturb(0.2, 1.2), moved)


def test_explore_moves_every_hyperparameter_within_its_range() -> None:
    space = {
        "lr": Range(1e-4, 1e-2, "log"),
        "clip": Range(0.1, 0.3),
        "gamma": Range(0.9, 0.99, "complement"),
    }
    rng = np.random.default_rng(1)
    explore = Explore(0.25, (0.8, 1.2))
    values = {"lr": 1e-2, "clip": 0.1, "gamma": 0.99, "fixed": 7.0}  # at the ends of the ranges
    for _ in range(200):
        new = explore(values, space, rng)
        assert new["fixed"] == 7.0
        for name, r in space.items():
            assert new[name] != values[name] and r.low <= new[name] <= r.high
        values = new
    with pytest.raises(ValueError, match="never move"):
        Explore(0.25, (1.0,))
    with pytest.raises(ValueError, match="positive"):
        Explore(0.25, (0.8, -1.2))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Explore(1.5)


def test_truncation_copies_the_top_into_the_bottom_and_never_a_member_into_itself() -> None:
    rng = np.random.default_rng(0)
    scores = [5.0, 1.0, 9.0, 3.0, None, 7.0, 2.0, 8.0, 6.0]
    for _ in range(50):
        chosen = pairs(scores, "truncation", 0.25, rng)
        assert sorted(c for c, _ in chosen) == [1, 6]  # the bottom quarter of the 8 ranked
        assert {p for _, p in chosen} <= {2, 7}  # copy from the top quarter
    assert pairs([1.0, 2.0], "truncation", 0.5, rng) == [(0, 1)]
    assert pairs([1.0, None], "truncation", 0.5, rng) == []  # one ranked member: no round
    assert pairs(scores, "none", 0.25, rng) == []
    for _ in range(50):
        for child, parent in pairs(scores, "tournament", 0.25, rng):
            assert child != parent and scores[parent] > scores[child]  # type: ignore[operator]


def test_decisions_repeat_from_the_same_seed() -> None:
    space = {"lr": Range(1e-4, 1e-2, "log"), "clip": Range(0.1, 0.3)}
    scores = [float(x) for x in range(8)]

    def decisions(seed: int) -> list[Any]:
        rng = np.random.default_rng(seed)
        values = draw(space, rng)
        out = [values]
        for selection in ("truncation", "tournament"):
            out.append(pairs(scores, selection, 0.25, rng))  # type: ignore[arg-type]
            out.append(Explore()(values, space, rng))
        return out

    assert decisions(3) == decisions(3) and decisions(3) != decisions(4)


# ---- the mutation space --------------------------------------------------------------------------

PPO = configs.PPO(env="CartPole-v1")


def space(*specs: str, live: tuple[str, ...] | None = None) -> dict[str, Range]:
    from onebox.algos.ppo import PPO as Learner

    fields = [f.name for f in dataclasses.fields(PPO)]
    return mutation_space("ppo", Learner.search, Learner.tunable,
                          live if live is not None else list(Learner.tunable), fields, specs)  # fmt: skip


def test_the_mutation_space_defaults_to_the_declared_ranges_and_can_be_narrowed() -> None:
    from onebox.algos.ppo import PPO as Learner

    assert space() == dict(Learner.search)
    narrowed = space("learning_rate=1e-4:1e-3", "ent_coef")
    assert narrowed == {
        "learning_rate": Range(1e-4, 1e-3, "log"),
        "ent_coef": Learner.search["ent_coef"],
    }
    assert "max_grad_norm" not in space(live=("learning_rate",))  # a clip left unset: no range


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lerning_rate", "ppo has no hyperparameter 'lerning_rate'; it mutates learning_rate"),
        ("num_envs=2:8", "num_envs is fixed when ppo's trainer is built"),
        ("learning_rate=1e-2:1e-4", "low < high"),
        ("learning_rate=1e-3:1e-3", "low < high"),
        ("gamma=0.9:1.5", "must be in [0, 1]"),
        ("learning_rate=3", "NAME=LOW:HIGH"),
    ],
)
def test_a_bad_mutation_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        space(spec)
    assert message in str(info.value)


def test_every_population_learner_declares_ranges_among_its_tunables() -> None:
    """The ranges a population mutates are hyperparameters the learner reads live (each of
    which tests/test_trainers.py sets and sees reach the next update)."""
    for name, entry in registry.POPULATIONS.items():
        config = cli._load(entry.config)()
        learner = configs.learner_module(config).Trainer.make_learner
        assert learner.search and set(learner.search) <= set(learner.tunable), name
        for hp, r in learner.search.items():
            r.check(hp, learner.tunable[hp])
        assert registry.LEARNERS[name].config.startswith(type(config).__mro__[2].__module__)
    assert set(registry.POPULATIONS) | set(registry.NO_POPULATION) == set(registry.LEARNERS)


# ---- copies between real trainers -----------------------------------------------------------------

SMALL = dict(env="CartPole-v1", num_envs=2, num_steps=64, torch_threads=1, num_threads=1,
             total_steps=6144, ready=1024, population=4, device="cpu")  # fmt: skip


def population(config: Any, selection: str = "truncation") -> Population:
    config = pbt_run.resolve(dataclasses.replace(config, selection=selection))
    module, seeds = configs.learner_module(config), EnvSeeds(config.seed)
    members = [driver.make_trainer(module, configs.member_config(config, i), seeds)
               for i in range(config.population)]  # fmt: skip
    learner = members[0].learner
    fields = [f.name for f in dataclasses.fields(config)]
    return Population(members, mutation_space("ppo", learner.search, learner.tunable,
                                              members[0].hp.names, fields, ()),
                      np.random.default_rng(0), ready=config.ready, selection=config.selection,
                      quantile=config.quantile, explore=Explore(), episodes=5)  # fmt: skip


@pytest.mark.parametrize("selection", ["truncation", "tournament"])
def test_a_child_gets_its_parents_whole_state_and_new_hyperparameters(selection: str) -> None:
    pop = population(configs.PPO(**SMALL), selection)  # type: ignore[arg-type]
    try:
        pop.draw()
        for m in pop.members:
            m.start()
        for _ in range(3):
            for i, m in enumerate(pop.members):
                pop.record(i, driver.advance(m).returns)
        pop.windows[0].extend([500.0] * 5)  # member 0 scores best, member 1 worst
        pop.windows[1].clear()
        pop.windows[1].extend([1.0] * 5)
        states = [state_hash(m.state_dict()["learner"]) for m in pop.members]
        values = [m.hp.base() for m in pop.members]
        chosen = pop.exploit_and_explore()
        assert chosen and all(child != parent for child, parent in chosen)
        if selection == "truncation":
            assert chosen == [(1, 0)]
        children = {c for c, _ in chosen}
        for child, parent in chosen:
            member = pop.members[child]
            assert state_hash(member.state_dict()["learner"]) == states[parent]  # weights, Adam
            event = pop.lineage[-len(chosen) + sorted(chosen).index((child, parent))]
            assert event["parent_hash"] == states[parent] and event["parent"] == parent
            for name, r in pop.space.items():
                value = member.hp.base()[name]
                assert value != values[parent][name] and r.low <= value <= r.high
            lr = member.hp.learning_rate * 1.0
            assert member.learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
            assert not pop.windows[child]
        for i, m in enumerate(pop.members):
            if i not in children:  # parents and the rest: untouched
                assert state_hash(m.state_dict()["learner"]) == states[i]
                assert m.hp.base() == values[i]
        # the copy is the parent's state, not shared with it: the child's update leaves it be
        child, parent = chosen[0]
        if parent not in children:
            before = state_hash(pop.members[parent].state_dict()["learner"])
            driver.advance(pop.members[child])
            assert state_hash(pop.members[parent].state_dict()["learner"]) == before
    finally:
        for m in pop.members:
            m.close()


# ---- the shared engine ---------------------------------------------------------------------


def test_a_stacked_policy_acts_as_each_of_its_nets() -> None:
    """One vmapped call gives what each member's network gives for its own envs: the same
    actions from the same draws, log-probabilities and values; a few envs' values each by
    its own net."""
    obs_space, act_space = spaces.Box(0, 1, (10, 10, 4), np.bool_), spaces.Discrete(3)
    torch.manual_seed(0)
    nets = [ActorCritic(obs_space, act_space) for _ in range(3)]  # the MinAtar CNN
    policy = StackedPolicy(nets, 4)
    obs = torch.rand(12, 10, 10, 4) > 0.8
    torch.manual_seed(1)
    action, logprob, value = policy.act(obs, np.arange(12))
    with torch.no_grad():
        outs = [net.outputs(obs[4 * k : 4 * k + 4]) for k, net in enumerate(nets)]
        torch.manual_seed(1)
        want_action, want_logprob = nets[0].sample(torch.cat([o[0] for o in outs]))
    want_value = torch.cat([o[1] for o in outs])
    assert torch.equal(action, want_action)
    torch.testing.assert_close(logprob, want_logprob)
    torch.testing.assert_close(value, want_value)
    few = np.array([1, 6, 11])
    torch.testing.assert_close(policy.value(obs[few], few), want_value[few])
    with pytest.raises(ValueError, match="acts for all its 12 envs at once"):
        policy.act(obs[:4], np.arange(4))
    with pytest.raises(ValueError, match="feed-forward nets with discrete actions"):
        StackedPolicy([ActorCritic(obs_space, act_space, lstm=8)], 4)


def test_ppo_updates_learners_together_as_each_alone() -> None:
    """`update_together`: three PPO learners with the MinAtar CNN, each with its own
    hyperparameters and rollout, updated in one stacked pass per minibatch, end with the
    weights, optimizer moments and stats each one's own `update` gives (to float rounding);
    the one whose KL passes --target-kl stops its epochs there while the others go on."""
    config = ppo.resolve(ppo.Config(env="MinAtar/Breakout-v1", num_envs=4, num_steps=16,
                                    num_minibatches=1, update_epochs=3, target_kl=0.01,
                                    total_steps=64, torch_threads=1, num_threads=1,
                                    device="cpu"))  # fmt: skip
    draws = [dict(learning_rate=3e-2, clip_coef=0.3, ent_coef=0.05, vf_coef=0.9, gamma=0.95,
                  gae_lambda=0.9, max_grad_norm=5.0),
             dict(learning_rate=1e-5, clip_coef=0.1, ent_coef=1e-4, vf_coef=0.2, gamma=0.99,
                  gae_lambda=0.95, max_grad_norm=0.1),
             dict(learning_rate=2e-5, clip_coef=0.2, ent_coef=0.0, vf_coef=0.5, gamma=0.9,
                  gae_lambda=0.8, max_grad_norm=1.0)]  # fmt: skip
    together, alone, rollouts = [], [], []
    for k, hp in enumerate(draws):
        pair = [driver.make_trainer(ppo, dataclasses.replace(config, seed=k), EnvSeeds(k))
                for _ in range(2)]  # fmt: skip
        for trainer in pair:
            trainer.learner.hp.set(**hp)
        pair[0].start()
        rollouts.append(pair[0].sampler.collect())
        together.append(pair[0].learner)
        alone.append(pair[1].learner)
    torch.manual_seed(0)
    stats = ppo.update_together(together, rollouts)
    want = []
    for learner, rollout in zip(alone, rollouts, strict=True):
        torch.manual_seed(0)
        want.append(learner.update(rollout))
    for got, ref, got_stats, ref_stats in zip(together, alone, stats, want, strict=True):
        for name, p in got.net.named_parameters():
            torch.testing.assert_close(p, dict(ref.net.named_parameters())[name],
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
            moments, ref_moments = got.optimizer.state[p], ref.optimizer.state[
                dict(ref.net.named_parameters())[name]]  # fmt: skip
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(moments[key], ref_moments[key], rtol=1e-3, atol=1e-7)
        assert got_stats.keys() == ref_stats.keys()
        for key, value in got_stats.items():
            assert value == pytest.approx(ref_stats[key], rel=1e-3, abs=1e-5), key
    steps = [int(lr.optimizer.state[lr.params[0]]["step"]) for lr in together]
    assert steps == [2, 3, 3]  # member 0's KL passed 0.01 after its second epoch
    assert steps == [int(lr.optimizer.state[lr.params[0]]["step"]) for lr in alone]


def test_the_episode_tracker_hands_each_member_its_envs_episodes() -> None:
    tracker = EpisodeTracker(4)
    ids = np.arange(4)
    tracker.update(ids, np.ones(4, np.float32), np.array([False, True, False, False]), {})
    tracker.update(ids, np.full(4, 2.0, np.float32), np.array([True, False, False, True]), {})
    assert tracker.take(2, 4) == ([3.0], [2])  # env 3's
    assert tracker.take(0, 2) == ([1.0, 3.0], [1, 2])  # env 1's, then env 0's: as they ended
    assert tracker.take(0, 4) == ([], [])


def test_members_on_a_shared_engine_act_with_their_own_nets_on_their_own_envs() -> None:
    """Each member's share of the shared rollout holds its own envs (seeded as its own pool
    would be) and its own network's values; after the members update, the next rollout acts
    with the new weights; a member asking twice for one rollout is an error."""
    config = pbt_run.resolve(configs.PPO(**{**SMALL, "num_steps": 8, "population": 2}))
    assert config.engine == "shared"
    module, seeds = configs.learner_module(config), EnvSeeds(config.seed)
    engine = SharedEnvs(config, 2)
    members = [driver.make_trainer(module, configs.member_config(config, k), seeds,
                                   lane=engine.lanes[k]) for k in range(2)]  # fmt: skip
    engine.bind(members)
    try:
        for m in members:
            m.start()
        for _ in range(2):  # the first rollout, then one after each member's update
            acting = [copy.deepcopy(m.learner.net) for m in members]  # (advance updates them)
            engine.advance()
            for k, m in enumerate(members):
                share = engine.lanes[k].collect()
                if m.updates == 0:
                    with onebox.envs.make("CartPole-v1", 2, seed=m.seed) as own:
                        first, _ = own.reset(seed=m.seed)
                    np.testing.assert_array_equal(share.obs[0].numpy(), first)
                flat = share.obs.flatten(0, 1)
                with torch.no_grad():
                    mine = acting[k].value(flat).view(share.values.shape)
                    other = acting[1 - k].value(flat).view(share.values.shape)
                torch.testing.assert_close(share.values, mine)
                assert not torch.allclose(share.values, other)
            with pytest.raises(RuntimeError, match="lockstep"):
                engine.lanes[0].collect()
            engine.advance()
            for m in members:
                driver.advance(m)
            assert all(m.global_step == 16 * m.updates for m in members)
    finally:
        for m in members:
            m.close()
        engine.close()


@pytest.mark.parametrize(
    ("learner", "fields", "message"),
    [
        ("ppo", {"lstm": 8, "num_minibatches": 2}, "--lstm: a recurrent network's state is not"),
        ("a2c", {"sampler": "double"}, "--sampler double: the shared engine steps every env"),
        ("ppo", {"normalize_obs": True}, "each member keeps its own statistics"),
        ("ppo", {"compile": True}, "--compile compiles one network's forward"),
        ("ppo", {"env": "Pendulum-v1", "normalize_obs": False, "normalize_reward": False},
         "the stacked policy draws discrete actions"),
        ("pqn", {}, "pqn is not an on-policy actor-critic"),
        ("ppo", {"ray": "auto"}, "with --ray each member is a Tune trial of its own"),
    ],
)  # fmt: skip
def test_an_engine_that_does_not_fit_is_refused_or_not_chosen(
    learner: str, fields: dict[str, Any], message: str
) -> None:
    """`--engine shared` where it does not fit: an error saying why; `auto` there: own pools
    (the run's log says why, as `population_note` reads it)."""
    config = getattr(configs, learner.upper())(**{**SMALL, **fields})
    with pytest.raises(ValueError, match=re.escape(message)):
        pbt_run.resolve(dataclasses.replace(config, engine="shared"))
    resolved = pbt_run.resolve(config)
    assert resolved.engine == "own"
    if resolved.ray is None:
        assert message in pbt_run.population_note(resolved, {})


def test_the_shared_engine_is_chosen_where_it_fits_and_refused_on_the_command_line(
    capsys,
) -> None:
    config = pbt_run.resolve(configs.A2C(**SMALL))  # type: ignore[arg-type]
    assert config.engine == "shared" and "--engine shared" in pbt_run.population_note(config, {})
    assert pbt_run.resolve(configs.A2C(**SMALL, engine="own")).engine == "own"  # type: ignore[arg-type]
    argv = ["pbt", "ppo", *ARGS, "--lstm", "8", "--num-minibatches", "2", "--engine", "shared"]
    assert cli.main(argv) == 2
    assert "--engine shared does not fit: --lstm" in capsys.readouterr().err


def test_updates_are_batched_where_asked_and_refused_where_there_is_no_batched_update(
    capsys,
) -> None:
    """`--updates auto` on the CPU: separate, the log saying the batched pass is slower here;
    `batched` on its members' own engines, or for A2C (no batched update): an error."""
    config = pbt_run.resolve(configs.PPO(**SMALL))  # type: ignore[arg-type]
    assert (config.engine, config.updates) == ("shared", "separate")
    assert "measured 2x slower on a 2-core CPU" in pbt_run.population_note(config, {})
    config = pbt_run.resolve(configs.PPO(**SMALL, updates="batched"))  # type: ignore[arg-type]
    assert "(--updates batched)" in pbt_run.population_note(config, {})
    for learner, fields in (("ppo", {"engine": "own"}), ("a2c", {})):
        argv = ["pbt", learner, *ARGS, "--updates", "batched",
                *[f"--{k}={v}" for k, v in fields.items()]]  # fmt: skip
        assert cli.main(argv) == 2
        assert "--updates batched needs a shared engine" in capsys.readouterr().err


def test_ancestry_follows_copies_back_to_the_start() -> None:
    events = [{"step": 0, "member": m, "parent": None} for m in range(3)]
    events += [{"step": 10, "member": 2, "parent": 0}, {"step": 20, "member": 0, "parent": 1},
               {"step": 30, "member": 1, "parent": 2}]  # fmt: skip
    assert ancestry(events, 1, 40) == [(0, 0, 10), (2, 10, 30), (1, 30, 40)]
    assert ancestry(events, 0, 40) == [(1, 0, 20), (0, 20, 40)]


# ---- runs -----------------------------------------------------------------------------------------

ARGS = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "64", "--torch-threads", "1",
        "--num-threads", "1", "--population", "3", "--ready", "1024", "--total-steps", "5120"]  # fmt: skip


def pbt(tmp_path: Path, name: str, *args: str) -> Path:
    argv = ["pbt", "ppo", "--runs-dir", str(tmp_path), "--name", name, *ARGS, *args]
    assert cli.main(argv) == 0
    return tmp_path / name


def lineage(run_dir: Path) -> list[dict[str, Any]]:
    return json.loads((run_dir / "lineage.json").read_text())["events"]


@pytest.mark.parametrize("engine", ["own", "shared", "shared --updates batched"])
def test_a_run_is_a_product_and_its_lineage_repeats_from_its_seed(
    tmp_path: Path, capsys, monkeypatch, engine: str
) -> None:
    """A population's run folder, log, metrics, plots and `onebox eval`; its lineage the same
    from one seed with one worker; on each engine, with each way of updating."""
    threads: set[str] = set()  # the threads that stepped a run's members
    advance = driver.advance

    def recorded(trainer):
        threads.add(threading.current_thread().name)
        return advance(trainer)

    def stepped(name: str, workers: str) -> tuple[Path, set[str]]:
        threads.clear()
        return pbt(tmp_path, name, "--workers", workers, "--engine", *engine.split()), set(threads)

    monkeypatch.setattr(driver, "advance", recorded)
    (a, one), (b, _) = stepped("a", "1"), stepped("b", "1")
    assert lineage(a) == lineage(b)  # the same decisions, hyperparameters and parents
    c, two = stepped("c", "2")  # two members at once: a different interleaving
    assert len(lineage(c)) == len(lineage(a)) and lineage(c)[:3] == lineage(a)[:3]
    assert len(one) == 1 and len(two) == 2 and all(t.startswith("pbt-worker") for t in two)
    log = (a / "log.txt").read_text()
    assert f"(--engine {engine.split()[0]}" in log
    assert ("(--updates batched)" in log) == ("batched" in engine)
    events = lineage(a)
    assert [e["member"] for e in events[:3]] == [0, 1, 2] and events[3]["parent"] is not None
    for name in ("config.json", "checkpoint.pt", "metrics.csv", "hyperparams.png", "curve.png",
                 "lineage.png"):  # fmt: skip
        assert (a / name).is_file(), name
    assert sorted(p.name for p in (a / "members").iterdir()) == ["0", "1", "2"]
    rows = (a / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,time,member,tag,value"
    members = {r.split(",")[2] for r in rows[1:]}
    assert members == {"", "0", "1", "2"}
    tags = {r.split(",")[3] for r in rows[1:]}
    assert {"charts/episodic_return", "charts/learning_rate", "hyperparams/clip_coef",
            "pbt/objective", "pbt/copies", "losses/value_loss"} <= tags  # fmt: skip
    assert ("engine/env_seconds" in tags) == engine.startswith("shared")
    assert ("engine/learn_seconds" in tags) == ("batched" in engine)
    # eval plays the best member by default, or the one named
    capsys.readouterr()
    assert cli.main(["eval", str(a), "--episodes", "2", "--member", "2"]) == 0
    assert "CartPole-v1: 2 episodes" in capsys.readouterr().out
    assert cli.main(["eval", str(a), "--episodes", "2"]) == 0
    assert cli.main(["eval", str(a), "--member", "3"]) == 2
    assert "members 0 to 2" in capsys.readouterr().err


def test_a_resumed_population_continues_its_lineage(tmp_path: Path) -> None:
    run_dir = pbt(tmp_path, "run")
    before = run.load_checkpoint(run_dir)
    events = lineage(run_dir)
    config = run.load_config(run_dir)
    run.save_config(run_dir, dataclasses.replace(config, total_steps=2 * config.total_steps))
    assert cli.main(["pbt", "--resume", str(run_dir)]) == 0
    after = run.load_checkpoint(run_dir)
    assert lineage(run_dir)[: len(events)] == events and len(lineage(run_dir)) > len(events)
    assert after["population"]["rounds"] > before["population"]["rounds"]
    assert after["env_seeds"] == 2 * before["env_seeds"] == 2 * 3 * 2  # fresh seeds on resume
    for b, a in zip(before["members"], after["members"], strict=True):
        assert a["global_step"] == 2 * b["global_step"] and a["updates"] > b["updates"]
        assert not torch.equal(next(iter(a["learner"]["net"].values())),
                               next(iter(b["learner"]["net"].values())))  # fmt: skip
    assert cli.main(["train", "--resume", str(run_dir)]) == 2  # a population resumes with pbt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--population", "1"], "--population must be at least 2"),
        (["--mutate", "lerning_rate"], "ppo has no hyperparameter 'lerning_rate'"),
        (["--mutate", "update_epochs"], "update_epochs is fixed when ppo's trainer is built"),
        (["--mutate", "learning_rate=1e-2:1e-4"], "low < high"),
        (["--mutate", "learning_rate=1e-3:1e-3"], "low < high"),
        (["--ready", "512"], "fewer than an episode of CartPole-v1 can last (500)"),
        (["--ready", "5120"], "no member would ever copy another"),
        (["--quantile", "0.6"], "--quantile must be in (0, 0.5]"),
        (["--perturb", "1.0"], "never move"),
        (["--workers", "4"], "--workers must be from 1 to --population (3)"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    tmp_path: Path, capsys, args: list[str], message: str
) -> None:
    capsys.readouterr()
    argv = ["pbt", "ppo", "--runs-dir", str(tmp_path / "runs"), *ARGS, *args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert not (tmp_path / "runs").exists()


def test_a_learners_ray_flags_are_refused(capsys) -> None:
    argv = ["pbt", "impala", "--env", "CartPole-v1", "--population", "2"]
    for flags, message in ((["--actor-hosts", "2"], "--actor-hosts places"),
                           (["--process-actors"], "drop --process-actors")):  # fmt: skip
        assert cli.main([*argv, *flags]) == 2
        assert message in capsys.readouterr().err


def test_a_learner_without_populations_is_refused(capsys) -> None:
    assert cli.main(["pbt", "a3c", "--env", "CartPole-v1"]) == 2
    assert "Hogwild" in capsys.readouterr().err
    with pytest.raises(ValueError, match="declares no hyperparameters"):
        mutation_space("a3c", {}, {}, [], [], ())


@pytest.mark.parametrize("name", ["pqn", "dqn", "impala", "appo"])
def test_each_family_runs_as_a_population(tmp_path: Path, name: str) -> None:
    """A short population of each required learner family: rounds happen, copies load."""
    args = {
        "pqn": ["--num-envs", "2", "--num-steps", "32", "--total-steps", "4096", "--ready", "1024"],
        "dqn": ["--total-steps", "2400", "--learning-starts", "500", "--ready", "600"],
        "impala": ["--total-steps", "4000", "--ready", "1000", "--actors", "1",
                   "--envs-per-actor", "2"],
        "appo": ["--total-steps", "4096", "--ready", "1024", "--actors", "1",
                 "--envs-per-actor", "2"],
    }[name]  # fmt: skip
    argv = ["pbt", name, "--env", "CartPole-v1", "--runs-dir", str(tmp_path), "--name", "run",
            "--population", "2", "--quantile", "0.5", "--torch-threads", "1", "--device", "cpu",
            *args]  # fmt: skip
    assert cli.main(argv) == 0
    events = lineage(tmp_path / "run")
    assert any(e["parent"] is not None for e in events), events
    state = run.load_checkpoint(tmp_path / "run")
    assert len(state["members"]) == 2 and state["learner"] == name

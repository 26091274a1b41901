"""The learners of `onebox train`, one module each, and what they stand on.

Learners: `ppo`, `a2c`, `pqn` (on the sampler), `dqn`, `sac` (one inline actor and a replay
buffer), `impala`, `appo`, `apex`, `r2d2` (actors, inference and a channel), `a3c` (Hogwild
workers). Each module has its `Config`, `PRESETS`, `resolve(config)`, its learner (networks,
policy, update, state, tunable hyperparameters) and `Trainer`, its family's trainer with that
learner.

What they stand on: `trainer` (the learner contract: `Learner`, `Trainer`, `Hyperparams`,
`EnvSeeds`), one module per family of trainers (`onpolicy`, `offpolicy`, `actor_learner`; A3C's
in `a3c`), `driver` (runs any trainer as a run: session, schedules, seeding, logging, replay),
`common` (config checks, env families, devices, greedy policies), `vtrace`, and `launch` (what
`onebox train` and `onebox eval` call).
"""

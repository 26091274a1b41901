"""Population-based training (Jaderberg et al. 2017): N trainers of one learner in one process,
every so often the worst copying the best ones' whole state and perturbing their
hyperparameters, so that the population finds a hyperparameter schedule while it trains.

- `explore`: which hyperparameters mutate within what ranges, who copies whom, how a copy's
  hyperparameters move (pure decisions from one seeded generator);
- `population`: the members (each its learner's `Trainer`), their objectives, the in-memory
  copies and the lineage;
- `configs`: each supported learner's config plus the population's settings;
- `shared`: the members of an on-policy actor-critic on one engine (one env pool, one stacked
  forward acting for all, each member updating on its share);
- `run`: `onebox pbt LEARNER` as a run (folder, per-member logs, checkpoints, resume, eval);
- `plots`: the hyperparameter schedules, the best member's ancestral curve, the family tree.
"""

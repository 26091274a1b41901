"""Learners, one per module: `ppo` (more to come). Each module has a `Config`, `train` and
`load_policy` (used by `onebox eval`)."""

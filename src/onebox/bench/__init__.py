"""Benchmarks behind `onebox bench`: `envs` (env steps/s against Gymnasium and EnvPool).

`common` holds what every benchmark reuses: the timing loop, the machine description and the
writer of the marked sections of docs/benchmarks.md.
"""

"""Benchmarks behind `onebox bench`, one module per command:

- `envs`: env steps/s of onebox's pools next to Gymnasium's vector envs, EnvPool and ALE; its rows
  build on `loops` (the task, the timed loops), with the Atari rows in `atari_peers` and the
  process backend's (and the synthetic `onebox/Busy100us-v0` env) in `process_peers`.
- `train`: learners' env steps/s (PPO sync and double-buffered, APPO) with the time split.
- `inference`: the central inference server's requests/s, env steps/s and latency.
- `evolve`: population-evaluation frames/s against env-only and one-at-a-time evaluation.
- `replay`: prioritized replay against cpprb, and Atari memory per transition.
- `dqn`: DQN's env steps/s against CleanRL's dqn_atari.py.
- `apex`: Ape-X's learner updates/s alone and beside its actors.
- `cluster` (`onebox bench ray`): IMPALA's env steps/s with its actors in process and on Ray actor
  hosts.
- `gpu`: the GPU suite, one markdown report; `gpu_runs` holds its parts that run `onebox train` in
  a process of their own, `gpu_common` what both share (the config, the report's tables).

`common` holds what every benchmark reuses: the timing loop, the machine description, number
formatting, the command line that reproduces a run and the writer of the marked sections of
docs/benchmarks.md.
"""

"""`onebox bench dqn`: the learning-phase SPS from logs of cumulative SPS, and bad settings
rejected before anything runs; `onebox bench apex` on a run too short to measure."""

from __future__ import annotations

import pytest

from onebox import cli
from onebox.bench.dqn import learning_sps


def test_learning_sps_is_the_rate_between_the_first_and_last_log_after_learning_starts() -> None:
    # Cumulative SPS 50 at step 1000 (20 s), 40 at 2000 (50 s), 37.5 at 3000 (80 s): learning
    # from step 1000, the phase is steps 2000-3000 in 30 s.
    points = [(1000, 50.0), (2000, 40.0), (3000, 37.5)]
    assert learning_sps(points, 1000) == pytest.approx(1000 / 30)
    with pytest.raises(RuntimeError, match="fewer than 2 SPS logs"):
        learning_sps(points, 2000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cleanrl", "/nonexistent/dqn_atari.py"], "does not exist"),
        (["--total-steps", "2500", "--learning-starts", "1000"], "at least 2000"),
    ],
)
def test_bad_settings_fail_before_any_run(capsys, args, message) -> None:
    assert cli.main(["bench", "dqn", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_apex_run_too_short_to_measure_says_so(capsys) -> None:
    """A run that logs its learner's updates fewer than twice has no rate: a one-line error."""
    # Updates start at the classic preset's 2,000 transitions: the first update ends the run.
    args = ["bench", "apex", "--total-steps", "2001", "--seconds", "0.2", "--rounds", "1",
            "--actors", "1"]  # fmt: skip
    assert cli.main(args) == 2
    assert "--total-steps 2001 is too short" in capsys.readouterr().err

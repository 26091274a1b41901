"""`--ray` misuse fails at once with a clear error and writes nothing: Ray not installed, an
address nobody listens on or not of the form HOST:PORT, and bad host counts or flag combinations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onebox import cli


@pytest.mark.parametrize(
    "command", [["train", "impala"], ["train", "apex"], ["train", "r2d2"], ["evolve", "es"]]
)
def test_ray_without_the_extra_names_it(tmp_path: Path, monkeypatch, capsys, command) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` fails
    assert cli.main([*command, "--ray", "auto", "--runs-dir", str(tmp_path)]) == 2
    assert 'needs Ray, which is not installed: pip install "onebox[ray]"' in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("address", "message"),
    [("127.0.0.1:9", "cannot reach a Ray cluster at 127.0.0.1:9"),
     ("nohost", "give HOST:PORT")],
)  # fmt: skip
@pytest.mark.timeout(60)  # no hang on Ray's own retries
def test_bad_address_fails_fast(tmp_path: Path, capsys, address: str, message: str) -> None:
    pytest.importorskip("ray")  # the `ray` extra (in `test`); without it the test above applies
    args = ["train", "impala", "--ray", address, "--runs-dir", str(tmp_path)]
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "impala", "--ray", "auto", "--actor-hosts", "0"], "--actor-hosts must be at"),
        (["train", "apex", "--ray", "auto", "--actor-hosts", "-1"], "--actor-hosts must be at"),
        (["train", "impala", "--actor-hosts", "2"], "add --ray ADDRESS"),
        (["train", "impala", "--ray", "auto", "--actor-hosts", "3"], "--actors (2) must be at"),
        (["train", "impala", "--ray", "auto", "--process-actors"], "leave out --process-actors"),
        (["train", "impala", "--ray", "auto", "--inference", "central"], "--inference central"),
        (["train", "apex", "--ray", "auto", "--process-actors"], "leave out --process-actors"),
        (["train", "r2d2", "--ray", "auto", "--actor-hosts", "0"], "--actor-hosts must be at"),
        (["train", "r2d2", "--actor-hosts", "2"], "add --ray ADDRESS"),
        (
            ["train", "r2d2", "--ray", "auto", "--actors", "2", "--actor-hosts", "3"],
            "--actors (2) must be at",
        ),
        (["train", "r2d2", "--ray", "auto", "--process-actors"], "leave out --process-actors"),
        (["evolve", "es", "--ray", "auto", "--eval-hosts", "0"], "--eval-hosts must be at"),
        (["evolve", "ga", "--eval-hosts", "2"], "add --ray ADDRESS"),
    ],
)
def test_bad_flags_fail_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert cli.main([*args, "--runs-dir", str(tmp_path)]) != 0
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())

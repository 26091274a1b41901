"""The `onebox` command line and the env benchmark (short runs, no timing assertions)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

import onebox.envs
from onebox import cli
from onebox.bench import common, figures
from onebox.bench import envs as bench_envs


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onebox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_help_lists_subcommands():
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    assert "envs" in out.stdout and "bench" in out.stdout


def test_bench_help_lists_its_subcommands(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "envs" in capsys.readouterr().out


def test_bench_envs_help_documents_every_field(capsys):
    assert cli.main(["bench", "envs", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--num-envs", "--num-threads", "--seconds", "--peers", "--output"):
        assert flag in out
    assert "physical cores" in out  # a field's docstring


@pytest.mark.parametrize("argv", [[], ["bnech"], ["bench"], ["bench", "nope"]])
def test_missing_or_unknown_subcommand_fails(argv, capsys):
    assert cli.main(argv) == 2


def test_every_command_loads():
    def leaves(node, prefix):
        if isinstance(node, cli.Group):
            for name, child in node.commands.items():
                yield from leaves(child, (*prefix, name))
        else:
            yield prefix, node

    for path, command in leaves(cli.Group("", cli.COMMANDS), ()):
        assert callable(cli._load(command.run)), path
        assert hasattr(cli._load(command.config), "__dataclass_fields__"), path


def test_envs_lists_every_backend(capsys):
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1" in out and "native" in out
    assert "LunarLander-v3" in out and "process" in out  # any Gymnasium id, in worker processes


def test_envs_says_why_each_id_gets_its_backend(capsys):
    assert cli.main(["envs"]) == 0
    rows = {
        cells[1]: cells[2:4]
        for line in capsys.readouterr().out.splitlines()
        if len(cells := [c.strip() for c in line.split("│")]) > 4
    }
    assert rows["CartPole-v1"] == ["native", "native C++"]
    assert rows["LunarLander-v3"] == ["process", "process: no native port"]
    if rows.get("Pong-v5"):  # with ale-py
        assert rows["Pong-v5"] == ["atari", "ALE vector engine"]
    choice = onebox.envs.choose_backend("LunarLander-v3")
    assert (choice.backend, choice.fallback) == ("process", False)
    assert onebox.envs.choose_backend("NoSuchEnv-v0").backend is None


def test_atari_without_ale_py_says_how_to_install_it():
    code = """
import sys
sys.modules["ale_py"] = None  # as if not installed
import onebox.envs
print(onebox.envs.choose_backend("Pong-v5").why)
try:
    onebox.envs.make("Pong-v5")
except ImportError as e:
    print("ERROR:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    why, error = out.stdout.splitlines()
    assert why == 'ALE vector engine, not installed: pip install "onebox[atari]"'
    assert error.startswith("ERROR: Atari envs need ale-py") and "onebox[atari]" in error


def test_envs_filters_and_shows_spaces(capsys):
    assert cli.main(["envs", "--backend", "native", "--match", "cartpole", "--spaces"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1" in out and "Discrete(2)" in out and "500" in out
    assert "Acrobot" not in out and "LunarLander" not in out
    assert cli.main(["envs", "--backend", "nope"]) == 2


def test_bench_envs_runs_and_prints_a_table():
    out = run_cli(
        "bench", "envs", "--seconds", "0.2", "--warmup", "0.05", "--num-envs", "8",
        "--peers", "onebox", "gymnasium-sync",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for text in ("onebox sync", "onebox async", "Gymnasium SyncVectorEnv", "steps/s", "cpu"):
        assert text in out.stdout
    assert "EnvPool" not in out.stdout


def test_bench_envs_writes_its_section(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n")
    argv = ["bench", "envs", "--seconds", "0.05", "--warmup", "0", "--num-envs", "2",
            "--peers", "onebox-sync", "--num-threads", "1", "--output", str(doc)]  # fmt: skip
    assert cli.main(argv) == 0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n")
    assert text.count("<!-- bench:envs:CartPole-v1 -->") == 1
    assert "--peers onebox-sync" in text and "onebox sync" in text
    assert cli.main(argv) == 0
    assert doc.read_text().count("<!-- /bench:envs:CartPole-v1 -->") == 1
    # beside the table: the run's numbers as JSON and the figure drawn from them
    data = tmp_path / "figures" / "bench-envs-CartPole-v1.json"
    bars = figures.load(data)
    assert bars.groups == ["2 envs"] and list(bars.values) == ["onebox sync"]
    assert bars.values["onebox sync"][0] > 0 and bars.unit == "env steps/s"
    assert "![CartPole-v1: env steps/s" in doc.read_text()
    assert "](figures/bench-envs-CartPole-v1.png)" in doc.read_text()
    png = data.with_suffix(".png")
    png.unlink()
    assert figures.main([str(data)]) == 0 and png.stat().st_size > 1000  # redrawn from the data


def test_figures_scale_and_check_their_bars(tmp_path) -> None:
    """A log axis where the values span over 30x (a missing value left out), a linear one
    otherwise; a series with a value too few or too many is an error naming it."""
    spread = figures.Bars("t", "u", ["a", "b"], {"x": [1.0, 100.0], "y": [None, 2.0]})
    assert spread.log
    assert not figures.Bars("t", "u", ["a"], {"x": [10.0], "y": [200.0]}).log
    with pytest.raises(ValueError, match="series 'y' has 1 values for 2 groups"):
        figures.Bars("t", "u", ["a", "b"], {"x": [1.0, 2.0], "y": [1.0]})
    path = figures.save(spread, tmp_path / "doc.md", "bench:x:A/B")
    assert path == tmp_path / "figures" / "bench-x-A-B.png" and path.stat().st_size > 1000


def test_unknown_env_is_an_error(capsys):
    assert cli.main(["bench", "envs", "--env", "CartPol-v1", "--peers", "onebox-sync"]) == 2
    assert "CartPole-v1" in capsys.readouterr().err


def test_unavailable_peers_say_why():
    task = bench_envs.Task("CartPole-v1", bench_envs.ASYNC_VECTOR_MAX_ENVS + 1, 1)
    peer = next(p for p in bench_envs.PEERS if p.name == "gymnasium-async")
    result = bench_envs.measure_peer(peer, task, seconds=0.01, warmup=0)
    assert result.rate is None and "skipped" in result.note
    header, rows = bench_envs.table_rows([result])
    assert header == ["backend", "envs", "steps/s"]  # no onebox row: no ratio columns
    assert rows == [["Gymnasium AsyncVectorEnv", "65", result.note]]


def test_rounds_report_the_median_and_range_and_ratios_of_medians():
    ours, theirs = (
        next(p for p in bench_envs.PEERS if p.name == n) for n in ("onebox-sync", "envpool-sync")
    )
    mine = bench_envs.median_result([bench_envs.Result(ours, 8, r) for r in (300.0, 100.0, 200.0)])
    other = bench_envs.median_result(
        [bench_envs.Result(theirs, 8, r) for r in (50.0, 400.0, 100.0)]
    )
    assert (mine.rate, mine.rates) == (200.0, (300.0, 100.0, 200.0))
    assert other.rate == 100.0
    header, rows = bench_envs.table_rows([mine, other])
    assert header == ["backend", "envs", "steps/s", "range", "onebox sync ×"]
    assert rows == [
        ["onebox sync", "8", "200", "100-300", "1.00×"],
        ["EnvPool sync", "8", "100", "50-400", "2.00×"],
    ]
    missing = bench_envs.Result(theirs, 8, None, "n/a: not installed")
    assert bench_envs.median_result([other, missing]) == missing
    assert bench_envs.table_rows([mine, missing])[1][1] == [
        "EnvPool sync", "8", "n/a: not installed", "-", "-"
    ]  # fmt: skip


def test_bench_envs_rounds(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    argv = ["bench", "envs", "--seconds", "0.05", "--warmup", "0", "--num-envs", "2",
            "--peers", "onebox-sync", "onebox-async", "--num-threads", "1", "--rounds", "2",
            "--output", str(doc)]  # fmt: skip
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.count("(round 2/2)") == 2
    assert "2 interleaved rounds" in doc.read_text() and "| range |" in doc.read_text()
    assert cli.main([*argv[:-2], "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


def test_select_peers():
    names = [p.name for p in bench_envs.select_peers(("gymnasium-sync", "onebox"))]
    assert names == ["onebox-sync", "onebox-async", "gymnasium-sync"]
    with pytest.raises(ValueError):
        bench_envs.select_peers(("nope",))


def test_write_section_is_idempotent(tmp_path):
    path = tmp_path / "docs" / "b.md"
    common.write_section(path, "bench:envs:X", "first")
    assert path.read_text() == "<!-- bench:envs:X -->\nfirst\n<!-- /bench:envs:X -->\n"
    path.write_text("# Title\n\nbefore\n\n" + path.read_text() + "\nafter\n")
    common.write_section(path, "bench:envs:Y", "other")
    common.write_section(path, "bench:envs:X", "second\n| a | b |")
    once = path.read_text()
    common.write_section(path, "bench:envs:X", "second\n| a | b |")
    assert path.read_text() == once
    assert once == (
        "# Title\n\nbefore\n\n<!-- bench:envs:X -->\nsecond\n| a | b |\n<!-- /bench:envs:X -->\n"
        "\nafter\n\n<!-- bench:envs:Y -->\nother\n<!-- /bench:envs:Y -->\n"
    )


def test_write_section_refuses_an_unclosed_section(tmp_path):
    path = tmp_path / "b.md"
    path.write_text("<!-- bench:envs:X -->\nold\n")
    with pytest.raises(ValueError):
        common.write_section(path, "bench:envs:X", "new")


def test_measure_counts_steps():
    calls = []
    timing = common.measure(lambda k: calls.append(k), steps_per_call=3, seconds=0.01, warmup=0)
    assert timing.steps == 3 * sum(calls[1:]) and timing.seconds >= 0.01


def test_command_line_and_formats():
    config = bench_envs.EnvBenchConfig(num_envs=(8, 64), peers=("onebox",), num_threads=2)
    line = common.command_line("onebox bench envs", config)
    assert line.startswith("onebox bench envs --env CartPole-v1 --num-envs 8 64 --num-threads 2")
    assert "--output" not in line
    assert common.format_rate(1234567) == "1.23M" and common.format_rate(987) == "987"
    assert common.format_ratio(3.14159) == "3.14×" and common.format_ratio(48.2) == "48×"


@pytest.mark.parametrize("algo", sorted(cli.COMMANDS["train"].commands))
def test_train_help_documents_every_field(algo, capsys):
    config = cli._load(cli.COMMANDS["train"].commands[algo].config)
    assert cli.main(["train", algo, "--help"]) == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(config):
        assert "--" + field.name.replace("_", "-") in out, field.name
    assert "Env steps to train for" in out  # a field's docstring

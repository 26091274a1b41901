"""Scale-out on Ray: `--ray ADDRESS` spreads the actors of IMPALA, APPO, Ape-X and R2D2
(`onebox.cluster.actor_hosts`) or an evolution run's population (`onebox.cluster.evolve_hosts`)
over the machines of a Ray cluster. Ray is the engine; onebox only places its own pieces on it.

Nothing here imports Ray at module import: only a run given `--ray` does (`connect`), so onebox
without the `ray` extra works as before, and `--ray` without it fails with the command to run.
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

EXTRA = 'pip install "onebox[ray]"'
"""The command that installs Ray for `--ray`."""

CONNECT_TIMEOUT_S = 10.0
"""How long `connect` tries to reach a cluster's address before it gives up."""


def import_ray() -> Any:
    """The `ray` module; ValueError (bad input: `--ray`) naming the extra if it is missing."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"--ray needs Ray, which is not installed: {EXTRA}") from None
    return ray


def check_flags(ray: str | None, hosts: int | None, flag: str, exclusive: dict[str, bool],
                actors: int | None = None) -> None:  # fmt: skip
    """Raise ValueError on a bad combination of `--ray` with its host count (`flag`, e.g.
    `--actor-hosts`), the options that rule it out (`exclusive`: flag -> whether it is set) and
    the `actors` the hosts share (None: not a count to check)."""
    if ray is None:
        if hosts is not None:
            raise ValueError(f"{flag} spreads work over a Ray cluster: add --ray ADDRESS (or auto)")
        return
    if not ray.strip():
        raise ValueError("--ray takes a cluster address HOST:PORT, or `auto`")
    if hosts is not None and hosts < 1:
        raise ValueError(f"{flag} must be at least 1, got {hosts}")
    if hosts is not None and actors is not None and actors < hosts:
        raise ValueError(f"--actors ({actors}) must be at least {flag} ({hosts})")
    for other, given in exclusive.items():
        if given:
            raise ValueError(f"--ray and {other} exclude each other; leave out {other}")


def _reachable(address: str) -> None:
    """Raise ValueError (bad input) unless a TCP connection to HOST:PORT opens within the timeout (so
    that a wrong address fails fast instead of waiting on Ray's own retries)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(
            f"--ray {address!r}: give HOST:PORT (as `ray start --head` prints) or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ValueError(
            f"cannot reach a Ray cluster at {address} ({e}); start one with `ray start --head` "
            "and pass the address it prints, or `--ray auto` on a machine of the cluster"
        ) from None


def connect(address: str) -> bool:
    """Connect this process to the Ray cluster at `address` (`auto`: the one `ray start` runs on
    this machine); ValueError if Ray is missing or no cluster answers there. A process already connected (a test's or a benchmark's cluster) keeps its
    connection. Returns whether this call connected (then the caller disconnects at the end)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address != "auto" and not address.startswith("ray://"):
        _reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    except ConnectionError as e:
        raise ValueError(
            f"no Ray cluster at --ray {address} ({e}); start one with `ray start --head`"
        ) from None
    return True


def disconnect(connected: bool) -> None:
    """Undo `connect` (when it connected)."""
    if connected:
        import_ray().shutdown()


def cpu_nodes() -> int:
    """Alive nodes of the cluster that offer CPUs."""
    ray = import_ray()
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)


def rehost(run_dir: Path, config: Any, ray: str | None, hosts: int | None, field: str,
           resolve: Any) -> None:  # fmt: skip
    """`--resume RUN --ray ADDRESS --hosts N`: save the run's `config` with the cluster address
    and its host count (`field`: actor_hosts or eval_hosts) replaced where given, once
    `resolve` has checked it. Raises ValueError for a run that cannot go on Ray."""
    if ray is None and hosts is None:
        return
    if not hasattr(config, field):
        raise ValueError(f"--ray and --hosts: the run in {run_dir} cannot run on Ray")
    changes: dict[str, Any] = {"ray": ray or config.ray, field: hosts or getattr(config, field)}
    config = dataclasses.replace(config, **changes)
    resolve(config)
    from onebox.run import save_config

    save_config(run_dir, config)

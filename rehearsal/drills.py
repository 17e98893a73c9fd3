"""Failure drills on a running rehearsal: ``python -m rehearsal drill``.

``python -m rehearsal start --out DIR`` serves drills from ``DIR/control``:
``python -m rehearsal drill --out DIR ACTION [NODE]`` puts a request there, the
rehearsal carries it out in its main thread (a restarted process is the rehearsal's child
like the first one, in the same namespace and cgroup, and its teardown stops it), and
``drill`` prints the reply and exits 0 (1 if the drill failed, 2 if no rehearsal runs there).

Actions (:data:`ACTIONS`):

* ``kill-node N``: SIGKILL SuperNode N's process alone (as the OOM killer or ``kill -9``);
  the reply says what the rehearsal's supervisor stopped after it (its superexec, a
  ClientApp in flight) and that nothing of the node is left;
* ``restart-node N``: start it again on its device (namespace, address, cgroup limits, key
  and node id, environment, data); after a SIGKILL this waits until the SuperLink lists
  the dead session offline (up to a minute: heartbeats);
* ``kill-superlink``: SIGKILL the SuperLink's process alone; its superexec and a run's
  ServerApp are stopped after it;
* ``restart-superlink``: start it again in its namespace on its database; the reply comes
  once every running SuperNode is back online;
* ``status``: what runs (the rehearsal's description) and every process end seen so far.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flower_app import procfs

if TYPE_CHECKING:
    from rehearsal.rehearsal import Rehearsal

__all__ = ["ACTIONS", "Control", "DrillError", "perform", "request"]

#: action -> whether it names a node
ACTIONS = {
    "kill-node": True,
    "restart-node": True,
    "kill-superlink": False,
    "restart-superlink": False,
    "status": False,
}


class DrillError(RuntimeError):
    """No rehearsal answers a drill (none runs with that ``--out``, or it ended)."""


def control_dir(out: Path) -> Path:
    """Return the folder a rehearsal with ``--out out`` serves drills from."""
    return Path(out) / "control"


def perform(rehearsal: Rehearsal, action: str, node: int | None = None) -> list[str]:
    """Carry out one drill on ``rehearsal``; return what to tell the operator, a line each.

    Raises
    ------
    ValueError
        For an unknown action or node.
    RuntimeError
        If the drill fails (e.g. the node is not running, or is not accepted back).
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown drill {action!r}; one of {', '.join(ACTIONS)}")
    if ACTIONS[action] and (node is None or not 0 <= node < rehearsal.nodes):
        raise ValueError(f"{action} needs a node index 0..{rehearsal.nodes - 1}, got {node}")
    fed = rehearsal.federation
    if action == "kill-node":
        death = rehearsal.kill_node(node)
        left = rehearsal.node_processes(node)
        state = f"still running: {left}" if left else "no process left"
        return [death.describe(), f"SuperNode {node}: {state}"]
    if action == "restart-node":
        start = time.monotonic()
        proc = rehearsal.restart_node(node)
        host = fed.host_of(node)
        where = f"namespace {host.namespace}, " if host.namespace else ""
        limits = "no limits"
        if host.cgroup is not None:
            memory, cpus = host.cgroup.limits()
            limits = f"cgroup {host.cgroup.name}: {memory >> 20} MiB, {cpus:g} CPU"
        return [
            f"SuperNode {node} back after {time.monotonic() - start:.0f} s (pid {proc.pid}, node "
            f"id {fed.node_ids.get(node)}): {where}{limits}",
            f"its processes: {rehearsal.node_processes(node)}",
        ]
    if action == "kill-superlink":
        return [rehearsal.kill_superlink().describe()]
    if action == "restart-superlink":
        start = time.monotonic()
        proc = rehearsal.restart_superlink()
        running = sorted(i for i, p in fed.nodes.items() if i >= 0 and p.alive())
        return [f"SuperLink back after {time.monotonic() - start:.0f} s (pid {proc.pid}) on its "
                f"database {fed.database}; online again: SuperNodes {running}"]  # fmt: skip
    return [*rehearsal.describe(), *(f"ended: {d.describe()}" for d in rehearsal.deaths)]


class Control:
    """A rehearsal's side of the drills: requests in ``out/control``, answered in turn.

    Parameters
    ----------
    out : pathlib.Path
        The rehearsal's ``--out`` folder.
    rehearsal : Rehearsal
        What the drills act on.
    """

    def __init__(self, out: Path, rehearsal: Rehearsal) -> None:
        self.dir = control_dir(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rehearsal = rehearsal
        (self.dir / "pid").write_text(str(os.getpid()))

    def serve(self) -> int:
        """Answer every waiting request (in the order made); return how many."""
        done = 0
        for path in sorted(self.dir.glob("*.request")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            path.unlink(missing_ok=True)
            try:
                lines, ok = perform(self.rehearsal, data.get("action", ""), data.get("node")), True
            except Exception as err:  # noqa: BLE001 - told to the operator, the rehearsal goes on
                lines, ok = [f"{type(err).__name__}: {err}"], False
            for line in lines:
                self.rehearsal.say(f"drill {data.get('action')}: {line}")
            reply = path.with_suffix(".reply")
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"ok": ok, "lines": lines}))
            os.replace(tmp, reply)
            done += 1
        return done

    def close(self) -> None:
        """Stop serving (drills then say that no rehearsal runs here)."""
        (self.dir / "pid").unlink(missing_ok=True)


def request(
    out: Path, action: str, node: int | None = None, timeout: float = 600.0
) -> tuple[bool, list[str]]:
    """Ask the rehearsal running with ``--out out`` to carry out a drill; wait for its reply.

    Returns
    -------
    tuple
        ``(ok, lines)``: whether the drill succeeded, and what the rehearsal said.

    Raises
    ------
    DrillError
        If no rehearsal runs with that folder, it ends before answering, or does not
        answer within ``timeout`` s.
    """
    folder = control_dir(out)
    try:
        owner = int((folder / "pid").read_text())
    except (OSError, ValueError):
        raise DrillError(f"no rehearsal runs with --out {out} (no {folder / 'pid'})") from None
    if not procfs.alive(owner):
        raise DrillError(f"no rehearsal runs with --out {out} (process {owner} has ended)")
    name = f"{time.time_ns()}-{os.getpid()}"
    tmp = folder / f"{name}.tmp"
    tmp.write_text(json.dumps({"action": action, "node": node}))
    os.replace(tmp, folder / f"{name}.request")
    reply = folder / f"{name}.reply"
    deadline = time.monotonic() + timeout
    while not reply.exists():
        if not procfs.alive(owner):
            raise DrillError(f"the rehearsal (process {owner}) ended before answering")
        if time.monotonic() > deadline:
            raise DrillError(f"no answer from the rehearsal within {timeout:g} s")
        time.sleep(0.1)
    data = json.loads(reply.read_text())
    reply.unlink(missing_ok=True)
    return bool(data["ok"]), list(data["lines"])

"""A node's own privacy ledger: what its users' releases cost, and a budget it keeps.

The server chooses whom it samples, how often, and with how much noise it asks; a guarantee
the server computes is a guarantee the server could misreport. So each node accounts for
its own users (in cohort mode a node serves many), charging every release that leaves the
node with what the node itself can verify, and refuses to answer once its operator's budget
would be exceeded (``node_config`` ``dp-max-epsilon``: the server cannot change it).

What a node can verify is the noise *it* added. Other nodes' noise shares, the number of
clients the server says it sampled, and the shuffle model's blanket of other users' coins
all rest on parties the node cannot check (a server can sample one user with clients it
controls). So the ledger charges, per release and per user:

* **client-level Gaussian DP** (MaxFL, FedSubAvg): the user's own noise share, a Gaussian
  mechanism with noise multiplier σ/√K for the σ and K the request named (each client adds
  N(0, (σΔ₂)²/K), Δ₂ the replace-one sensitivity). Releases compose in Rényi DP
  (Σ 1/σ_t² per user; ``dp_accounting``'s RDP accountant gives ε at the node's δ), with no
  amplification by sampling (the server knows whom it sampled);
* **FedSM's randomiser** (shuffle-model DP): the local randomiser's ε per value,
  k·ln((2 − p)/p) for k bits each kept with probability 1 − p/2, summed over the values the
  user reported (δ = 0);

and a user's ε is the Gaussian part's ε at δ plus the local part (basic composition). The
figure is what holds if every other participant is the server's; the figure the server
reports assuming every client in the sum honest is ``dp-epsilon-honest-peers``.

The node's own DP code declares what an answer releases (:class:`Release`, as the
``dp-release-*`` metrics of its reply, which the privacy mod takes out before anything is
sent; a server refuses a reply that still carries them: the node's ClientApp lacks the mod).
A release is charged when the node computes its answer, before anything is sent; an answer
that would take any of its users past the budget is dropped and the question refused (rule
``privacy-budget``). A question is answered once (:mod:`flower_app.privacy.questions`), so
repeating it costs the node nothing. The ledger lives in the node's Context (one per run),
or, with ``dp-ledger`` in the ``node_config``, in a JSON file on the node's disk that every
run charges, so that a new run does not start a new budget.

The node's figures travel in every reply to a private request as the clear
``"node-privacy"`` record (:data:`NODE_PRIVACY_RECORD`): ``dp-epsilon`` (its worst user's
ε so far), ``dp-delta``, ``dp-releases`` and ``dp-max-epsilon`` (0: no budget). They depend
only on whom the server sampled and on the parameters it sent, which it knows.
"""

from __future__ import annotations

import fcntl
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from flower_app.files import atomic_write_text
from flower_app.privacy.refusals import NodeRefusedError

__all__ = [
    "LEDGER_FILE",
    "LEDGER_RECORD",
    "MAX_EPSILON",
    "NODE_DELTA",
    "NODE_PRIVACY_RECORD",
    "RELEASE_KEYS",
    "PrivacyLedger",
    "Release",
    "gaussian_release",
    "is_private_request",
    "local_release",
]

#: the clear record with the node's figures in every reply to a private request
NODE_PRIVACY_RECORD = "node-privacy"
#: the metrics a DP handler adds to its reply's ``"metrics"`` to declare what it released
#: (users, 1/σ² of each one's Gaussian share, each one's local ε); the mod takes them out
#: before anything is sent, and a server refuses a reply that still carries them
RELEASE_KEYS = ("dp-release-users", "dp-release-precision", "dp-release-local-epsilon")
#: the ledger in the node's Context
LEDGER_RECORD = "dp-ledger"
#: node_config: the largest ε a user of this node may reach (absent or 0: no budget)
MAX_EPSILON = "dp-max-epsilon"
#: node_config: the δ at which the node computes ε (default 1e-5)
NODE_DELTA = "dp-delta"
#: node_config: a JSON file on the node's disk that keeps the ledger across runs
LEDGER_FILE = "dp-ledger"
DEFAULT_DELTA = 1e-5


@dataclass(frozen=True)
class Release:
    """What one answer releases about each of the node's users in it.

    Attributes
    ----------
    users : tuple of int
        The users whose data the answer holds (in plain mode, the node's one client: 0).
    precision : tuple of float
        Per user, 1/σ² of its Gaussian noise share (0: none).
    local_epsilon : tuple of float
        Per user, the local randomiser's ε of its reports (0: none).
    """

    users: tuple[int, ...]
    precision: tuple[float, ...]
    local_epsilon: tuple[float, ...]

    @classmethod
    def pop_from(cls, content: RecordDict) -> Release | None:
        """Take a handler's declaration (the ``dp-release-*`` metrics) out of its reply.

        Returns None if the reply declares no release.

        Raises
        ------
        ValueError
            If the declaration is malformed.
        """
        metrics = content.get("metrics")
        if not isinstance(metrics, MetricRecord) or RELEASE_KEYS[0] not in metrics:
            return None
        values = {key: metrics.pop(key, []) for key in RELEASE_KEYS}
        users = [int(u) for u in values[RELEASE_KEYS[0]]]
        precision = [float(v) for v in values[RELEASE_KEYS[1]]]
        local = [float(v) for v in values[RELEASE_KEYS[2]]]
        if not (len(users) == len(precision) == len(local)) or len(set(users)) != len(users):
            raise ValueError("a dp-release declaration needs one entry per distinct user")
        costs = np.asarray(precision + local, dtype=np.float64)
        if costs.size and not (np.all(np.isfinite(costs)) and np.all(costs >= 0)):
            raise ValueError("a dp-release declaration holds a negative or non-finite cost")
        return cls(tuple(users), tuple(precision), tuple(local))

    def metrics(self) -> dict[str, list[int] | list[float]]:
        """Return the ``dp-release-*`` metrics a handler adds to its reply's ``"metrics"``."""
        return {
            RELEASE_KEYS[0]: list(self.users),
            RELEASE_KEYS[1]: list(self.precision),
            RELEASE_KEYS[2]: list(self.local_epsilon),
        }


def gaussian_release(users: Sequence[int], noise_multiplier: float, clients: int) -> Release:
    """Return the release of users who each added a Gaussian share N(0, (σΔ₂)²/K).

    Each share alone is a Gaussian mechanism with noise multiplier σ/√K: 1/σ_u² = K/σ².
    """
    precision = max(int(clients), 1) / float(noise_multiplier) ** 2
    n = len(users)
    return Release(tuple(int(u) for u in users), (precision,) * n, (0.0,) * n)


def local_release(epsilon_by_user: Mapping[int, float]) -> Release:
    """Return the release of users whose reports went through a local randomiser."""
    users = tuple(int(u) for u in epsilon_by_user)
    return Release(users, (0.0,) * len(users), tuple(float(epsilon_by_user[u]) for u in users))


def is_private_request(content: RecordDict) -> bool:
    """Return True if a request asks for a differentially private answer.

    Client-level Gaussian DP (``dp-noise`` > 0 in ``"config"``) or FedSM's randomiser
    (``dp-bits`` > 0).
    """
    config = content.get("config")
    if not isinstance(config, ConfigRecord):
        return False
    for key in ("dp-noise", "dp-bits"):
        value = config.get(key, 0)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return True
    return False


@lru_cache(maxsize=4096)
def _gaussian_epsilon(precision: float, delta: float) -> float:
    from flower_app.algorithms.common.gaussian_dp import server_epsilon

    return server_epsilon(precision, delta)


class PrivacyLedger:
    """The node's account of its users' releases (see the module docstring).

    Kept in the node's Context (one ledger per run), or, with ``dp-ledger`` in the
    ``node_config``, in that JSON file on the node's disk: one ledger for every run the node
    takes part in, so that a server cannot reset a node's budget by starting a new run. The
    file is written atomically under an exclusive lock (ClientApps of several runs may charge
    at once) and read exactly as written, or refused.

    Parameters
    ----------
    context : Context
        The node's context: the budget, δ and the ledger file are in its ``node_config``.
    """

    def __init__(self, context: Context) -> None:
        self.context = context
        cfg = context.node_config
        self.budget = _non_negative(cfg.get(MAX_EPSILON, 0.0), MAX_EPSILON)
        self.delta = _non_negative(cfg.get(NODE_DELTA, DEFAULT_DELTA), NODE_DELTA)
        if not 0.0 < self.delta < 1.0:
            raise NodeRefusedError("privacy-budget",
                                   f"node_config '{NODE_DELTA}' must be in (0, 1)")  # fmt: skip
        path = cfg.get(LEDGER_FILE)
        self.path = Path(str(path)) if path else None
        self._load()

    def _load(self) -> None:
        """Read the ledger (its file, or the Context's state)."""
        if self.path is None:
            rec = self.context.state.get(LEDGER_RECORD)
            data: dict[str, Any] = dict(rec) if isinstance(rec, ConfigRecord) else {}
        else:
            data = _read_ledger_file(self.path)
        users = [int(u) for u in data.get("users", [])]
        self.precision = dict(zip(users, (float(v) for v in data.get("precision", [])),
                                  strict=True))  # fmt: skip
        self.local = dict(zip(users, (float(v) for v in data.get("local-epsilon", [])),
                              strict=True))  # fmt: skip
        self.releases = int(data.get("releases", 0))

    def _store(self) -> None:
        users = sorted(self.precision)
        data = {"users": users, "precision": [self.precision[u] for u in users],
                "local-epsilon": [self.local[u] for u in users], "releases": self.releases}
        if self.path is None:
            self.context.state[LEDGER_RECORD] = ConfigRecord(data)  # type: ignore[arg-type]
        else:
            _write_ledger_file(self.path, data)

    def epsilon(self, precision: float, local: float) -> float:
        """Return a user's ε at the node's δ for its accumulated costs."""
        return (_gaussian_epsilon(float(precision), self.delta) if precision > 0 else 0.0) + local

    def worst(self) -> float:
        """Return the largest ε any of the node's users has reached."""
        pairs = {(self.precision.get(u, 0.0), self.local.get(u, 0.0)) for u in self.precision}
        return max((self.epsilon(p, q) for p, q in pairs), default=0.0)

    def charge(self, release: Release) -> None:
        """Charge a release, or refuse it if a user would pass the budget.

        Raises
        ------
        NodeRefusedError
            (rule ``privacy-budget``) if the budget is set and some user of the release
            would reach an ε above it; nothing is charged then.
        """
        with _locked(self.path):
            self._load()  # another run may have charged the file since
            after = {
                u: (self.precision.get(u, 0.0) + p, self.local.get(u, 0.0) + q)
                for u, p, q in zip(release.users, release.precision, release.local_epsilon,
                                   strict=True)  # fmt: skip
            }
            if self.budget > 0:
                for p, q in set(after.values()):
                    if self.epsilon(p, q) > self.budget:
                        raise NodeRefusedError(
                            "privacy-budget",
                            f"answering would take a user of this node past its privacy "
                            f"budget (node_config {MAX_EPSILON} = {self.budget:g} at "
                            f"{NODE_DELTA} = {self.delta:g}); this node answers no further "
                            "private questions that include that user",
                        )
            for u, (p, q) in after.items():
                self.precision[u], self.local[u] = p, q
            self.releases += 1
            self._store()

    def figures(self) -> MetricRecord:
        """Return the node's figures for the clear ``"node-privacy"`` reply record."""
        return MetricRecord(
            {"dp-epsilon": float(self.worst()), "dp-delta": float(self.delta),
             "dp-releases": int(self.releases), "dp-max-epsilon": float(self.budget)}
        )  # fmt: skip


#: what a ledger file says it is (read exactly, or refused)
LEDGER_FORMAT, LEDGER_VERSION = "flower_app-node-privacy-ledger", 1


def _read_ledger_file(path: Path) -> dict[str, Any]:
    """Return a ledger file's content ({} if it does not exist yet); refuse anything else."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict) and data.get("format") == LEDGER_FORMAT
        assert data.get("version") == LEDGER_VERSION
        n = len(data["users"])
        assert len(data["precision"]) == len(data["local-epsilon"]) == n
        assert all(isinstance(u, int) for u in data["users"])
        values = [float(v) for v in data["precision"] + data["local-epsilon"]]
        assert all(math.isfinite(v) and v >= 0 for v in values)
        assert isinstance(data["releases"], int) and data["releases"] >= 0
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise NodeRefusedError(
            "privacy-budget",
            f"the node's ledger file (node_config '{LEDGER_FILE}') is not a {LEDGER_FORMAT} "
            f"version {LEDGER_VERSION} file as this node writes it: the node answers no "
            "private question until its operator restores or removes it",
        ) from None
    return data


def _write_ledger_file(path: Path, data: dict[str, Any]) -> None:
    """Write the ledger atomically (a temporary file, fsync, rename)."""
    text = json.dumps({"format": LEDGER_FORMAT, "version": LEDGER_VERSION, **data}, indent=1)
    atomic_write_text(path, text + "\n", sync=True)


@contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    """Hold an exclusive lock on a ledger file's lock file (nothing for a Context ledger)."""
    if path is None:
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _non_negative(value: Any, key: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not (math.isfinite(out) and out >= 0):
        raise NodeRefusedError("privacy-budget", f"node_config '{key}' must be a number >= 0")
    return out

"""Where differential-privacy noise comes from: the operating system's entropy, on the node.

The server holds the run_config, and so the run's ``seed``: anything derived from it — the
users' draws, the sampling, SGD's batches — it can regenerate. DP noise it could regenerate
it could also subtract. So every DP draw (the Gaussian noise of
:mod:`~flower_app.algorithms.common.gaussian_dp` and :mod:`~flower_app.algorithms.fedsubavg.dp`,
FedSM's shuffle randomiser in :mod:`~flower_app.algorithms.fedsm.dp`) comes from a
:class:`NoiseSource`: by default a fresh ``numpy.random.default_rng()`` without a seed (its
``SeedSequence`` takes 128 bits from ``os.urandom``) per node and call, i.e. per node and
round, which nobody but that node can reproduce. Seeds keep deciding everything else, so
runs without DP stay bit-reproducible; runs with DP are reproducible in distribution only
(tests check variances and accounting, not bits).

The research mode ``dp-reproducible-noise = true`` (run_config; read by the *node* from its
own configuration, never from a message, so a server cannot switch it on) keys the noise
as it was keyed before: ``default_rng([seed, round, user, stream])`` with the streams
:data:`DP_NOISE` (Gaussian) and :data:`DP_STREAM` (FedSM). Runs then repeat bit for bit
(the direct-vs-Flower equality tests and the recorded sweeps use it), and **give no privacy
against the server** or anyone else holding the run_config: the log says so at the start,
and every round's row and ``summary.json`` carry ``dp-reproducible-noise``.
"""

from __future__ import annotations

import numpy as np

from flower_app.algorithms.common.streams import user_rng

__all__ = ["DP_NOISE", "DP_STREAM", "NO_PRIVACY_NOTE", "NoiseSource", "warn_no_privacy"]

#: the fourth word of a client's Gaussian noise key in the reproducible research mode
DP_NOISE = 0xD7
#: the fourth word of a FedSM user's randomiser key in the reproducible research mode
DP_STREAM = 0xD9

#: what the log and summary.json say about a run with reproducible noise
NO_PRIVACY_NOTE = (
    "dp-reproducible-noise = true: the DP noise is derived from the run's seed, so anyone "
    "holding the run_config (the server included) can regenerate and remove it; this run "
    "gives NO privacy against the server (research mode, for reproducible experiments)"
)


class NoiseSource:
    """The DP randomness of one node for one call (one round).

    Parameters
    ----------
    reproducible : bool, optional
        Research mode (default False): key every user's noise by
        ``[seed, server_round, user, stream]``. False: one generator from OS entropy for
        the whole call, shared by the users in the order they are noised.
    seed : int, optional
        The run seed (used only in the research mode).

    Examples
    --------
    >>> rng = NoiseSource().generator(1, 7, DP_NOISE)  # OS entropy: differs every call
    """

    def __init__(self, reproducible: bool = False, seed: int = 0) -> None:
        self.reproducible = bool(reproducible)
        self.seed = int(seed)
        self._fresh: np.random.Generator | None = None

    def generator(self, server_round: int, user: int, stream: int) -> np.random.Generator:
        """Return the generator that noises ``user`` in ``server_round``.

        Research mode: ``default_rng([seed, server_round, user, stream])``. Otherwise the
        call's OS-entropy generator (created on first use; ``server_round``, ``user`` and
        ``stream`` do not enter it).
        """
        if self.reproducible:
            return user_rng(self.seed, server_round, user, stream)
        if self._fresh is None:
            self._fresh = np.random.default_rng()
        return self._fresh


def warn_no_privacy() -> None:
    """Log, as a warning, that this run's DP noise gives no privacy against the server."""
    from logging import WARNING

    from flwr.common import log

    log(WARNING, "%s", NO_PRIVACY_NOTE)

"""How many clients a MaxFL-family run has: seen and unseen, per dataset (no data read).

The runner (:mod:`flower_app.runners.maxfl`) and the check before Flower
(:mod:`flower_app.datasets.check`) both count them here, so ``clients-per-round`` is checked
against the same number of seen clients in both.
"""

from __future__ import annotations

from flower_app.settings.setting import ConfigError

__all__ = ["DATASETS", "OWN_IMAGES_SEEN", "SENT140", "SENT140_UNSEEN", "client_counts"]

#: datasets of the family and their (seen clients, classes) defaults
DATASETS = {
    "fmnist": (100, 10),
    "emnist": (500, 62),
    "synthetic-emnist": (500, 62),
    "sent140": (308, 2),
    "synthetic-sent140": (308, 2),
}
#: Sent140 (real and stand-in): the paper's unseen clients (-1 in maxfl-unseen-users)
SENT140 = ("sent140", "synthetic-sent140")
SENT140_UNSEEN = 619
#: seen clients of your images without a ``client`` array (``num-users`` = 0)
OWN_IMAGES_SEEN = 100


def client_counts(
    dataset: str, num_users: int, unseen: int, own_clients: int | None = None, file: str = ""
) -> tuple[int, int]:
    """Return (seen, unseen) clients of a run.

    Parameters
    ----------
    dataset : str
        The ``dataset`` key.
    num_users : int
        ``num-users`` (0: the dataset's default).
    unseen : int
        ``maxfl-unseen-users`` (-1: as many as seen; Sent140: the paper's 619; your clients:
        all the others).
    own_clients : int, optional
        ``image-clients`` with a ``client`` array: the clients the file defines (the first
        half, rounded up, are seen by default).
    file : str, optional
        The file, named in the error.

    Raises
    ------
    ConfigError
        When more seen and unseen clients are asked for than the file defines.
    """
    if dataset in SENT140:
        return num_users or DATASETS[dataset][0], SENT140_UNSEEN if unseen < 0 else unseen
    if dataset == "image-clients" and own_clients is not None:
        seen = num_users or own_clients - own_clients // 2
        others = own_clients - seen if unseen < 0 else unseen
        if seen + others > own_clients:
            raise ConfigError(
                f"run_config 'num-users', 'maxfl-unseen-users': {seen} seen + {others} unseen "
                f"clients asked for; {file} has {own_clients}"
            )
        return seen, others
    seen = num_users or (OWN_IMAGES_SEEN if dataset == "image-clients" else DATASETS[dataset][0])
    return seen, seen if unseen < 0 else unseen

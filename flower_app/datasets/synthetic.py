"""Synthetic stand-ins for MovieLens-1M and DBLP, calibrated to published statistics.

They carry experiments where the real files are absent; every name they produce starts with
``synthetic-`` so they are never mistaken for the real data. Both are deterministic in ``seed``
and fast (vectorised numpy, generated in chunks so memory stays bounded).

synthetic-facility-location (stands in for MovieLens-1M)
    Calibrated to MovieLens-1M: density 1,000,209 / (6,040 x 3,706) = 0.0447 and the rating
    distribution 1: 5.6%, 2: 10.8%, 3: 26.1%, 4: 34.9%, 5: 22.6%. User ``u`` rates movie ``j``
    independently with probability ``min(1, c * a_u * w_j)``, where the activities ``a_u`` and
    popularities ``w_j`` are lognormal with sigma 1 (ML-1M's median/mean ratings per user is
    0.58, a lognormal with sigma 1 gives 0.61) and ``c`` is solved for so the expected density
    is the target. A user left without ratings gets one movie drawn by popularity. Ratings come
    from a latent score (movie quality, slightly correlated with popularity, + user bias +
    noise) cut at the quantiles of the ML-1M distribution, so users agree on good movies and
    the marginal distribution matches ML-1M. Genres ``genre-0`` .. ``genre-17`` (ML-1M has 18)
    are assigned by hashing the column index, independently of popularity.

synthetic-dblp (stands in for the FedSM paper's DBLP 2018-2021 network)
    The paper publishes only n = 704,738 researchers and m = 2,675 venues; everything else here
    is an assumption. Researcher degrees follow a discrete power law with exponential cutoff,
    ``P(k) ~ k^-alpha * exp(-k / 100)`` on ``k = 1..m``, with ``alpha`` solved for so the mean
    is ``mean_venues_per_researcher`` (default 2.5): most researchers have one or two venues,
    a few have hundreds. Venue popularity is lognormal (sigma 1.5, Zipf-like). Venues belong to
    research fields of about 50 venues; a researcher has a home field (drawn by field
    popularity) and draws each venue from it with probability 0.75, else from all venues, by
    popularity and without repetition. About 60% of the venues are in group ``conf``, the rest
    ``journals``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from flower_app.datasets.matrices import RatingsMatrix, VenueSets

__all__ = [
    "ML1M_DENSITY",
    "ML1M_RATING_DISTRIBUTION",
    "SYNTHETIC_DBLP_SIZE",
    "dblp_groups",
    "facility_location_groups",
    "synthetic_dblp",
    "synthetic_facility_location",
    "zipf_for_heat",
]

ML1M_DENSITY = 1_000_209 / (6_040 * 3_706)
"""Fraction of user-movie pairs rated in MovieLens-1M (0.0447)."""

ML1M_RATING_DISTRIBUTION = np.array([0.05616, 0.10753, 0.26114, 0.34890, 0.22626])
"""Share of ratings 1..5 in MovieLens-1M."""

SYNTHETIC_DBLP_SIZE = (704_738, 2_675)
"""Default researchers and venues of :func:`synthetic_dblp` (the FedSM paper's network)."""


def zipf_for_heat(
    draws: np.ndarray, target_dispersion: float, n_items: int, p_top_min: float
) -> np.ndarray:
    """Return Zipf-like popularities whose top item about ``target_dispersion`` clients draw.

    The feature-heat calibration of the FedSubAvg stand-ins (``synthetic-amazon``,
    ``synthetic-sent140``): the most popular item's probability p_top is chosen so that
    Σ_c [1 − (1 − p_top)^{draws_c}], the expected number of clients drawing it at least once,
    is ``target_dispersion``; then s so that p_top · Σ_v v^(−s) = 1, and p_v ∝ v^(−s). The
    rarest items are drawn by about one client, so n_max / n_min lands near the target.

    Parameters
    ----------
    draws : numpy.ndarray
        Items each client draws (float, one entry per client).
    target_dispersion : float
        Clients that should touch the top item (the paper's feature-heat dispersion).
    n_items : int
        Items (tokens, products) v = 1..n_items.
    p_top_min : float
        Lower end of p_top's bisection (its upper end is 0.5).

    Returns
    -------
    numpy.ndarray
        float64 probabilities of the n_items items, by rank (summing to 1).
    """
    lo, hi = p_top_min, 0.5
    for _ in range(60):
        p_top = (lo + hi) / 2
        covered = float(np.sum(1.0 - (1.0 - p_top) ** draws))
        lo, hi = (p_top, hi) if covered < target_dispersion else (lo, p_top)
    ranks = np.arange(1, n_items + 1, dtype=np.float64)
    lo_s, hi_s = 0.0, 3.0  # Σ p_top · v^(−s) = 1
    for _ in range(60):
        s = (lo_s + hi_s) / 2
        lo_s, hi_s = (s, hi_s) if p_top * float(np.sum(ranks**-s)) > 1.0 else (lo_s, s)
    probs = ranks**-s
    probs /= probs.sum()
    return probs

N_GENRES = 18
_USER_SIGMA = 1.0
_ITEM_SIGMA = 1.0
_QUALITY_POPULARITY = 0.3  # weight of log-popularity in a movie's latent quality
_QUALITY_SIGMA = 0.5
_USER_BIAS_SIGMA = 0.4
_NOISE_SIGMA = 0.7
_ROW_CHUNK_CELLS = 1 << 21  # cells of the Bernoulli grid generated at once

_DEGREE_CUTOFF = 100.0
_VENUE_SIGMA = 1.5
_VENUES_PER_FIELD = 50
_HOME_FIELD_SHARE = 0.75
_CONF_SHARE = 0.6
_RESEARCHER_CHUNK = 1 << 16
_REJECTION_ROUNDS = 6
_GUMBEL_CHUNK_CELLS = 1 << 21

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _hash_unit(n: int, salt: int) -> np.ndarray:
    """Return ``n`` deterministic pseudo-uniform numbers in [0, 1), one per index."""
    index = np.arange(n, dtype=np.uint64) + np.uint64(salt) * np.uint64(0x632BE59BD9B4E019)
    mixed = index * _GOLDEN
    mixed ^= mixed >> np.uint64(31)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(29)
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# --------------------------------------------------------------------------- facility location


def synthetic_facility_location(
    n_users: int = 2000,
    n_elements: int = 500,
    *,
    density: float = ML1M_DENSITY,
    seed: int = 0,
) -> RatingsMatrix:
    """Generate a MovieLens-1M-like users x movies ratings matrix.

    See the module docstring for the calibration.

    Parameters
    ----------
    n_users : int, default 2000
        Rows. MovieLens-1M has 6,040.
    n_elements : int, default 500
        Columns (movies). MovieLens-1M has 3,706 rated movies.
    density : float, default 0.0447
        Expected fraction of rated cells (MovieLens-1M's). Every user gets at least one
        rating, which can raise the density above a very small target.
    seed : int, default 0
        Seed; the same arguments give the same matrix.

    Returns
    -------
    RatingsMatrix
        Integer ratings 1..5 stored as float64; ``user_ids`` and ``element_ids`` are
        ``0..n-1``; ``element_groups`` are ``genre-0`` .. ``genre-17``; ``name`` is
        ``"synthetic-facility-location"``.
    """
    if n_users < 1 or n_elements < 1:
        raise ValueError(f"need n_users >= 1 and n_elements >= 1, got {n_users}, {n_elements}")
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    rng = np.random.default_rng([seed, 0x4D4C])
    log_item = rng.normal(0.0, _ITEM_SIGMA, n_elements)
    item_weight = np.exp(log_item)
    activity = np.exp(rng.normal(0.0, _USER_SIGMA, n_users))
    scale = _solve_scale(activity, item_weight, density * n_users * n_elements)
    rows, cols = _bernoulli_pairs(rng, activity * scale, item_weight)
    rows, cols = _give_everyone_one(rng, rows, cols, n_users, item_weight)
    ratings = _ratings(rng, rows, cols, log_item, n_users)
    values = sp.csr_matrix((ratings, (rows, cols)), shape=(n_users, n_elements))
    values.sum_duplicates()
    return RatingsMatrix(
        values=values,
        user_ids=np.arange(n_users, dtype=np.int64),
        element_ids=np.arange(n_elements, dtype=np.int64),
        element_groups=facility_location_groups(n_elements),
        name="synthetic-facility-location",
    )


def facility_location_groups(n_elements: int) -> np.ndarray:
    """Return the genres of :func:`synthetic_facility_location`'s elements (no data drawn).

    A hash of the element index, independent of the seed and the users: the check before
    Flower knows a partition matroid's rank without generating the instance.
    """
    genre = np.floor(_hash_unit(n_elements, salt=1) * N_GENRES).astype(np.int64)
    return np.array([f"genre-{g}" for g in genre.tolist()], dtype=str)


def dblp_groups(n_venues: int) -> np.ndarray:
    """Return the venue types of :func:`synthetic_dblp`'s venues (no data drawn; see above)."""
    return np.where(_hash_unit(n_venues, salt=2) < _CONF_SHARE, "conf", "journals")


def _expected_count(scaled: np.ndarray, sorted_weight: np.ndarray, cumsum: np.ndarray) -> float:
    """Return ``sum_u sum_j min(1, scaled_u * w_j)`` using sorted weights and their cumsum."""
    below = np.searchsorted(sorted_weight, 1.0 / scaled, side="left")
    small_sum = np.where(below > 0, cumsum[np.maximum(below - 1, 0)], 0.0)
    return float(np.sum(len(sorted_weight) - below) + np.sum(scaled * small_sum))


def _solve_scale(activity: np.ndarray, weight: np.ndarray, target: float) -> float:
    """Find ``c`` with ``sum min(1, c a_u w_j) = target`` by bisection on ``log c``."""
    sorted_weight = np.sort(weight)
    cumsum = np.cumsum(sorted_weight)
    low, high = -60.0, 60.0
    for _ in range(100):
        middle = 0.5 * (low + high)
        if _expected_count(np.exp(middle) * activity, sorted_weight, cumsum) < target:
            low = middle
        else:
            high = middle
    return float(np.exp(high))


def _bernoulli_pairs(
    rng: np.random.Generator, scaled: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Draw cell ``(u, j)`` with probability ``min(1, scaled_u w_j)``, in row chunks."""
    n_users, n_elements = len(scaled), len(weight)
    step = max(1, _ROW_CHUNK_CELLS // n_elements)
    rows, cols = [], []
    for start in range(0, n_users, step):
        stop = min(start + step, n_users)
        prob = np.minimum(1.0, scaled[start:stop, None] * weight[None, :])
        hit_rows, hit_cols = np.nonzero(rng.random(prob.shape) < prob)
        rows.append(hit_rows + start)
        cols.append(hit_cols)
    return np.concatenate(rows), np.concatenate(cols)


def _give_everyone_one(
    rng: np.random.Generator,
    rows: np.ndarray,
    cols: np.ndarray,
    n_users: int,
    weight: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Add one popularity-drawn element for each user without any."""
    empty = np.flatnonzero(np.bincount(rows, minlength=n_users) == 0)
    if len(empty) == 0:
        return rows, cols
    cumulative = np.cumsum(weight)
    picks = np.searchsorted(cumulative, rng.random(len(empty)) * cumulative[-1], side="right")
    picks = np.minimum(picks, len(weight) - 1)
    return np.concatenate([rows, empty]), np.concatenate([cols, picks])


def _ratings(
    rng: np.random.Generator,
    rows: np.ndarray,
    cols: np.ndarray,
    log_item: np.ndarray,
    n_users: int,
) -> np.ndarray:
    """Ratings 1..5: latent score cut at the ML-1M quantiles."""
    quality = _QUALITY_POPULARITY * log_item + rng.normal(0.0, _QUALITY_SIGMA, len(log_item))
    bias = rng.normal(0.0, _USER_BIAS_SIGMA, n_users)
    score = quality[cols] + bias[rows] + rng.normal(0.0, _NOISE_SIGMA, len(rows))
    cut_points = np.cumsum(ML1M_RATING_DISTRIBUTION)[:-1]
    thresholds = np.quantile(score, cut_points)
    return 1.0 + np.searchsorted(thresholds, score, side="right").astype(np.float64)


# --------------------------------------------------------------------------- dblp


def synthetic_dblp(
    *,
    n_researchers: int = SYNTHETIC_DBLP_SIZE[0],
    n_venues: int = SYNTHETIC_DBLP_SIZE[1],
    seed: int = 0,
    mean_venues_per_researcher: float = 2.5,
) -> VenueSets:
    """Generate a DBLP-like researchers x venues membership matrix.

    See the module docstring for the (assumed) degree and popularity model.

    Parameters
    ----------
    n_researchers : int, default 704_738
        Rows; the FedSM paper's DBLP 2018-2021 count.
    n_venues : int, default 2_675
        Columns; the paper's venue count.
    seed : int, default 0
        Seed; the same arguments give the same matrix.
    mean_venues_per_researcher : float, default 2.5
        Target mean number of venues per researcher (an assumption: the paper does not
        publish it). Must be at least 1 and reachable with ``n_venues``.

    Returns
    -------
    VenueSets
        Every researcher has at least one venue, no pair repeats; ``researchers`` is
        ``arange(n_researchers)``, ``venues`` are ``"synthetic/venue-<j>"``, groups are
        ``"conf"``/``"journals"``; ``name`` is ``"synthetic-dblp"``.
    """
    if n_researchers < 1 or n_venues < 1:
        raise ValueError(
            f"need n_researchers >= 1 and n_venues >= 1, got {n_researchers}, {n_venues}"
        )
    rng = np.random.default_rng([seed, 0xDB1B])
    degree_cdf = _degree_cdf(n_venues, mean_venues_per_researcher)
    venues = _VenueModel.draw(rng, n_venues)
    indptr = np.zeros(n_researchers + 1, dtype=np.int64)
    indices = []
    for start in range(0, n_researchers, _RESEARCHER_CHUNK):
        stop = min(start + _RESEARCHER_CHUNK, n_researchers)
        degrees = np.searchsorted(degree_cdf, rng.random(stop - start), side="right") + 1
        degrees = np.minimum(degrees, n_venues)
        keys = venues.sample_sets(rng, degrees)
        indices.append((keys % n_venues).astype(np.int32))
        indptr[start + 1 : stop + 1] = np.bincount(keys // n_venues, minlength=stop - start)
    np.cumsum(indptr, out=indptr)
    all_indices = np.concatenate(indices)
    matrix = sp.csr_matrix(
        (np.ones(len(all_indices)), all_indices, indptr), shape=(n_researchers, n_venues)
    )
    return VenueSets(
        matrix=matrix,
        researchers=np.arange(n_researchers, dtype=np.int64),
        venues=np.array([f"synthetic/venue-{j}" for j in range(n_venues)], dtype=str),
        element_groups=dblp_groups(n_venues),
        name="synthetic-dblp",
    )


def _degree_pmf(n_venues: int, alpha: float) -> np.ndarray:
    """``P(k) ~ k^-alpha exp(-k / cutoff)`` on ``k = 1..n_venues``, normalised."""
    k = np.arange(1, n_venues + 1, dtype=np.float64)
    log_p = -alpha * np.log(k) - k / _DEGREE_CUTOFF
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def _degree_cdf(n_venues: int, mean: float) -> np.ndarray:
    """Solve ``alpha >= 0`` for the target mean degree; return the degree CDF."""
    k = np.arange(1, n_venues + 1, dtype=np.float64)
    highest = float(_degree_pmf(n_venues, 0.0) @ k)
    if not 1.0 <= mean <= highest:
        raise ValueError(
            f"mean_venues_per_researcher must be in [1, {highest:.3g}] for "
            f"n_venues={n_venues}, got {mean}"
        )
    low, high = 0.0, 60.0
    for _ in range(100):
        middle = 0.5 * (low + high)
        if _degree_pmf(n_venues, middle) @ k > mean:
            low = middle
        else:
            high = middle
    cdf = np.cumsum(_degree_pmf(n_venues, 0.5 * (low + high)))
    cdf[-1] = 1.0
    return cdf


class _VenueModel:
    """Venue popularity and fields; samples researchers' venue sets without repetition."""

    def __init__(self, weight: np.ndarray, field: np.ndarray) -> None:
        self.weight = weight
        self.n_venues = len(weight)
        self.field = field
        self.order = np.argsort(field, kind="stable")
        self.cumulative = np.cumsum(weight[self.order])
        n_fields = int(field.max()) + 1
        field_weight = np.bincount(field, weights=weight, minlength=n_fields)
        block_end = np.cumsum(field_weight)
        self.block_low = block_end - field_weight
        self.block_width = field_weight
        self.field_cdf = block_end / block_end[-1]

    @classmethod
    def draw(cls, rng: np.random.Generator, n_venues: int) -> _VenueModel:
        """Draw lognormal popularities and uniform field memberships."""
        weight = np.exp(rng.normal(0.0, _VENUE_SIGMA, n_venues))
        n_fields = max(1, round(n_venues / _VENUES_PER_FIELD))
        return cls(weight, rng.integers(0, n_fields, n_venues))

    def _draw_venues(self, rng: np.random.Generator, home: np.ndarray) -> np.ndarray:
        """Draw one venue per entry of ``home``: from that field w.p. 0.75, else from all."""
        local = rng.random(len(home)) < _HOME_FIELD_SHARE
        low = np.where(local, self.block_low[home], 0.0)
        width = np.where(local, self.block_width[home], self.cumulative[-1])
        position = np.searchsorted(self.cumulative, low + rng.random(len(home)) * width, "right")
        return self.order[np.minimum(position, self.n_venues - 1)]

    def sample_sets(self, rng: np.random.Generator, degrees: np.ndarray) -> np.ndarray:
        """Return sorted unique keys ``row * n_venues + venue``, ``degrees[row]`` per row."""
        n_rows = len(degrees)
        home = np.minimum(
            np.searchsorted(self.field_cdf, rng.random(n_rows), side="right"),
            len(self.field_cdf) - 1,
        )
        keys = np.empty(0, dtype=np.int64)
        need = degrees.astype(np.int64)
        for _ in range(_REJECTION_ROUNDS):
            rows = np.repeat(np.arange(n_rows, dtype=np.int64), need)
            if len(rows) == 0:
                return keys
            new = rows * self.n_venues + self._draw_venues(rng, home[rows])
            keys = _sorted_unique(np.concatenate([keys, new]))
            need = degrees - np.bincount(keys // self.n_venues, minlength=n_rows)
        return self._fill_exactly(rng, keys, need, home)

    def _log_row_weights(self) -> np.ndarray:
        """Return ``log P(venue | home field)`` for one draw: a fields x venues table."""
        n_fields = len(self.block_width)
        in_field = self.field[None, :] == np.arange(n_fields)[:, None]
        width = np.maximum(self.block_width, np.finfo(float).tiny)[:, None]
        local = np.where(in_field, _HOME_FIELD_SHARE * self.weight[None, :] / width, 0.0)
        global_ = (1.0 - _HOME_FIELD_SHARE) * self.weight / self.weight.sum()
        return np.log(local + global_[None, :])

    def _fill_exactly(
        self, rng: np.random.Generator, keys: np.ndarray, need: np.ndarray, home: np.ndarray
    ) -> np.ndarray:
        """Complete the rows still short of venues by Gumbel-top-k (exact, no repetition)."""
        short = np.flatnonzero(need > 0)
        if len(short) == 0:
            return keys
        log_weight = self._log_row_weights()
        step = max(1, _GUMBEL_CHUNK_CELLS // self.n_venues)
        extra = []
        for start in range(0, len(short), step):
            rows = short[start : start + step]
            score = log_weight[home[rows]] + rng.gumbel(size=(len(rows), self.n_venues))
            taken = keys[np.isin(keys // self.n_venues, rows)]
            score[np.searchsorted(rows, taken // self.n_venues), taken % self.n_venues] = -np.inf
            top = int(need[rows].max())
            best = np.argpartition(-score, top - 1, axis=1)[:, :top]
            order = np.argsort(-np.take_along_axis(score, best, axis=1), axis=1, kind="stable")
            best = np.take_along_axis(best, order, axis=1)
            for i, row in enumerate(rows.tolist()):
                extra.append(row * self.n_venues + best[i, : need[row]])
        return _sorted_unique(np.concatenate([keys, *extra]))


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (faster than ``np.unique`` for int64 keys)."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]

"""Every run_config key of the app, declared once: type, default, valid values, family, help.

``[tool.flwr.app.config]`` in ``pyproject.toml`` and ``docs/configuration.md`` are generated
from these declarations (``python -m flower_app.settings --toml`` / ``--markdown``; tests
check both are in sync). The choice tuples of the algorithm families repeat constants of
:mod:`flower_app.algorithms` so that validating a config imports no algorithm code;
``tests/test_settings.py`` checks that they agree.
"""

from __future__ import annotations

from flower_app.registry import ALGORITHMS, DATASETS
from flower_app.settings.setting import Setting

__all__ = ["MATROIDS", "SETTINGS"]

MATROIDS = ("uniform", "partition")

_COMMON = "common"
_FEDSM = "fedsm"
_FEDCG = "fedcg"
_MAXFL = "maxfl"
_FSA = "fedsubavg"

_DECLARED = (
    # ------------------------------------------------------------------ common
    Setting(
        "algorithm", "choice", "fedsm", _COMMON,
        "algorithm to run; its family's keys apply (sections below)",
        choices=tuple(ALGORITHMS),
    ),
    Setting(
        "dataset", "choice", "synthetic-facility-location", _COMMON,
        "problem instance; must be one of the algorithm family's datasets",
        choices=tuple(DATASETS),
    ),
    Setting(
        "data-dir", "str", "", _COMMON,
        'dataset root ("" = $FLOWER_APP_DATA or ~/.cache/flower_app/datasets); '
        "absolute for flwr run",
    ),
    Setting(
        "data-seed", "int", 0, _COMMON,
        "seed of synthetic instances and data splits (kept apart from seed)", ge=0,
    ),
    Setting(
        "seed", "int", 0, _COMMON,
        "seed of everything the algorithm draws (server sampling, users' draws)", ge=0,
    ),
    Setting(
        "k", "int", 10, _COMMON, "elements to select (FedSM Alg. 1: communication rounds)", ge=1,
    ),
    Setting(
        "matroid", "choice", "uniform", _COMMON,
        "uniform (|S| <= k) or partition (at most partition-capacity per genre / venue type)",
        choices=MATROIDS,
    ),
    Setting(
        "partition-capacity", "int", 2, _COMMON,
        "capacity of every block of the partition matroid", ge=1,
    ),
    Setting(
        "clients-per-round", "count", 0.1, _COMMON,
        "K: users sampled per round, a count (int) or a fraction of all users (float)",
    ),
    Setting(
        "elements-per-client", "count", 0.1, _COMMON,
        "d: elements each sampled user evaluates, a count or a fraction of |E|",
    ),
    Setting(
        "report-bound", "float", 0.0, _COMMON,
        "submodular families: the largest value one user may report on one element (0 = the "
        "instance's λ: its top rating for facility location, 1 for coverage); reports above "
        "it are refused, profiles clipped to it; set it lower to tighten "
        "(docs/strategies/fedsm.md#dishonest-users-and-nodes)", ge=0,
    ),
    Setting(
        "num-users", "int", 0, _COMMON,
        "users of a synthetic instance, or MaxFL's seen clients (0 = default: 2,000 facility "
        "location, 704,738 DBLP stand-in, 6,040 MovieLens-1M, 100 FMNIST, 500 EMNIST, 308 "
        "Sent140 for MaxFL)", ge=0,
    ),
    Setting(
        "num-elements", "int", 0, _COMMON,
        "elements of a synthetic instance (0 = default: 500 facility location, 2,675 DBLP "
        "stand-in, 3,706 MovieLens-1M movies)", ge=0,
    ),
    Setting(
        "output-dir", "str", "", _COMMON,
        'parent of run folders ("" = $FLOWER_APP_OUTPUT or ~/flower_app_runs)',
    ),
    Setting(
        "run-name", "str", "", _COMMON,
        'run folder name ("" = <algorithm>-<dataset>-seed<seed>-<time>)',
    ),
    Setting(
        "round-timeout", "float", 600.0, _COMMON,
        "seconds to wait for the replies of one round", gt=0,
    ),
    Setting(
        "discovery-timeout", "float", 300.0, _COMMON,
        "seconds to wait for all nodes to register and announce their users", gt=0,
    ),
    Setting(
        "min-reply-fraction", "float", 0.5, _COMMON,
        "least fraction of a round's sampled users whose replies must arrive (nodes that "
        "fail or go offline are recorded per round); below it the run stops with an error",
        ge=0, le=1,
    ),
    Setting(
        "node-return-wait", "float", 0.0, _COMMON,
        "seconds a round waits, before it is sent, for nodes that serve users and went "
        "offline to be online again (e.g. a SuperNode restarted with its key); 0: no wait, "
        "their users are skipped and recorded as missing", ge=0,
    ),
    Setting(
        "resume", "bool", False, _COMMON,
        "continue the interrupted run in output-dir/run-name from its checkpoint.npz "
        "(same run_config; every federated algorithm on flwr run, server-data full or none); "
        "finished rounds are not redone",
    ),
    Setting(
        "server-data", "choice", "full", _COMMON,
        "full: the server loads the instance too (true F(S) per round, greedy reference); "
        "none: it reads no client data (sizes from the nodes, F(S) or the losses by federated "
        "evaluation, no greedy reference; submodular and FedSubAvg families; "
        "docs/node-local-data.md)",
        choices=("full", "none"),
    ),
    Setting(
        "element-groups", "str", "", _COMMON,
        "with server-data = none and matroid = partition: CSV (element,group) of the "
        "elements' groups, as python -m flower_app.export writes it; absolute for flwr run",
    ),
    Setting(
        "data-file", "str", "", _COMMON,
        "your own data (dataset = facility-location-table or coverage-sets): a CSV, TSV or "
        "parquet table, or (coverage) a text file of one line of items per user; absolute "
        "for flwr run (docs/own-data.md)",
    ),
    Setting(
        "data-columns", "str", "user,item,value", _COMMON,
        "column names of data-file's table: user,item,value (facility location) or "
        "user,item (coverage pairs)",
    ),
    Setting(
        "item-names", "str", "", _COMMON,
        "optional CSV (item,name) naming data-file's items; summary.json then lists the "
        "selected items by name",
    ),
    Setting(
        "dp-reproducible-noise", "bool", False, _COMMON,
        "research only: derive every DP draw (maxfl-dp-noise, fsa-dp-noise, fedsm-dp-epsilon) "
        "from (seed, round, user) so DP runs repeat bit for bit; gives NO privacy against the "
        "server or anyone holding the run_config (logged, and marked in every round's row and "
        "summary.json); default: OS entropy on each node",
    ),
    Setting(
        "secure-aggregation", "bool", False, _COMMON,
        "sum each round's replies with secure aggregation (SecAgg+): the server learns only "
        "the sum (every algorithm but mwfed and central-sgd; docs/privacy.md)",
    ),
    Setting(
        "secagg-num-shares", "int", 0, _COMMON,
        "secure aggregation: neighbours each node masks with and shares its seed with, "
        "itself included (0 = 2*ceil(log2 n)+1, SecAgg+; n or more = every node, SecAgg; "
        "at least 3)", ge=0,
    ),
    Setting(
        "secagg-reconstruction-threshold", "count", 0.5, _COMMON,
        "secure aggregation: shares needed to rebuild a seed, a count or a fraction of "
        "secagg-num-shares; always at least a strict majority (nodes refuse less: a count "
        "below it fails, a fraction below 0.5 is refused); nodes failing while unmasking "
        "tolerated: shares - threshold per neighbourhood",
    ),
    Setting(
        "secagg-frac-bits", "int", 24, _COMMON,
        "secure aggregation: fractional bits of the fixed-point encoding of real values "
        "(each client's value off by at most 2^-(bits+1); integers are exact); nodes refuse "
        "more than 43 - ceil(log2(nodes)), which leaves every value a range of +-2^20",
        ge=0, le=41,
    ),
    # ------------------------------------------------------------------ fedsm
    Setting(
        "fedsm-mode", "choice", "alg1", _FEDSM,
        "alg1 (k rounds, one element each), alg2 (O(log m) rounds) or amplified (Alg. 3)",
        choices=("alg1", "alg2", "amplified"),
    ),
    Setting(
        "fedsm-epsilon", "float", 0.405, _FEDSM,
        "ε of Alg. 2 and amplification (0.405: the authors' code)", gt=0, lt=1,
    ),
    Setting(
        "fedsm-tau", "float", 0.0, _FEDSM,
        "Alg. 2's initial threshold τ on the mean-form F (0: λ = max singleton value)",
    ),
    Setting(
        "fedsm-levels", "int", 0, _FEDSM,
        "Alg. 2's threshold levels (0: the paper's count, -1: until |S| = k)", ge=-1,
    ),
    Setting(
        "fedsm-j-from", "int", 1, _FEDSM,
        "Alg. 2's first prefix length: 1 (the pseudo-code) or 0 (Balkanski et al. 2019)",
        ge=0, le=1,
    ),
    Setting(
        "fedsm-eta", "float", 0.1, _FEDSM,
        "amplification step η", gt=0, lt=1, reciprocal_integer=True,
    ),
    Setting(
        "fedsm-inner", "choice", "alg1", _FEDSM, "amplification's subroutine",
        choices=("alg1", "alg2"),
    ),
    Setting(
        "fedsm-surrogate", "choice", "exact", _FEDSM,
        "amplification's gradients: exact (closed form) or sampled",
        choices=("exact", "sampled"),
    ),
    Setting(
        "fedsm-samples", "int", 4, _FEDSM,
        "sets R ~ y per user and round of the sampled surrogate", ge=0,
    ),
    Setting(
        "fedsm-rng", "choice", "per-user", _FEDSM,
        "users' draws of D: per-user (default_rng([seed, t, user]) each, the recorded runs) "
        "or batched (keyed Philox for all users at once, support-proportional; same law)",
        choices=("per-user", "batched"),
    ),
    Setting(
        "fedsm-history-clamp", "choice", "noise-aware", _FEDSM,
        "Algorithm 1 against dishonest users: choose by each estimate held to the mean of that "
        "element's estimates so far plus 3 standard errors (noise-aware, default), to the mean "
        "itself (mean: tighter), or not at all (off: the paper's Eq. (3), what the "
        "reproductions use); a deviation from the paper (docs/strategies/fedsm.md)",
        choices=("noise-aware", "mean", "off"),
    ),
    Setting(
        "fedsm-dp-epsilon", "float", 0.0, _FEDSM,
        "shuffle-model differential privacy (Appendix C): epsilon' of every sum query (one "
        "element, one round); 0 = off; Algorithm 1, per-user draws (docs/privacy.md)", ge=0,
    ),
    Setting(
        "fedsm-dp-delta", "float", 1e-6, _FEDSM,
        "delta' of every sum query under fedsm-dp-epsilon", gt=0, lt=1,
    ),
    Setting(
        "fedsm-rounding", "choice", "pipage", _FEDSM,
        "oblivious rounding of amplification's final x", choices=("pipage", "greedy"),
    ),
    # ------------------------------------------------------------------ fedcg
    Setting(
        "fedcg-rounds", "int", 100, _FEDCG,
        "communication rounds T (FedCG+ takes its own T, e.g. 20 for τ = 5)", ge=1,
    ),
    Setting("fedcg-eta", "float", 0.0, _FEDCG, "server step η (0 = 1/T)", ge=0),
    Setting(
        "fedcg-local-steps", "int", 5, _FEDCG,
        "τ: local continuous-greedy steps of FedCG+ (FedCG always uses 1)", ge=1,
    ),
    Setting(
        "fedcg-gradient", "choice", "exact", _FEDCG,
        "exact (closed-form gradients) or sampled (App. C.3 estimator)",
        choices=("exact", "sampled"),
    ),
    Setting(
        "fedcg-gradient-samples", "int", 10, _FEDCG,
        "sets R per gradient estimate with fedcg-gradient = sampled", ge=1,
    ),
    Setting(
        "fedcg-rounding", "choice", "greedy", _FEDCG,
        "rounding of x: greedy (as the authors' scripts), pipage, or verified (the "
        "discrete greedy, with its checks, over the 2k elements of largest x)",
        choices=("pipage", "greedy", "verified"),
    ),
    Setting(
        "fedcg-fill-base", "bool", True, _FEDCG,
        "complete each user's LMO answer to a base with random zero-gradient elements",
    ),
    Setting(
        "fedcg-report-pipage", "bool", False, _FEDCG,
        "also round the final x by pipage (own stream) and report objective-pipage",
    ),
    Setting(
        "fedcg-client-weights", "choice", "uniform", _FEDCG,
        "p_i: uniform (1/N) or data-size (∝ the user's non-zero entries)",
        choices=("uniform", "data-size"),
    ),
    Setting(
        "dgreedy-kappa", "float", 50.0, _FEDCG,
        "κ of the federated discrete greedy and of FedCG's verified rounding "
        "(κ_i = min(1, κ w_i))", gt=0,
    ),
    # ------------------------------------------------------------------ maxfl
    Setting("maxfl-rounds", "int", 200, _MAXFL, "communication rounds T", ge=1),
    Setting(
        "maxfl-lr", "float", 0.05, _MAXFL,
        "local learning rate η_l (Per-FedAvg's β, pFedMe's η)", gt=0,
    ),
    Setting(
        "maxfl-server-lr", "float", 1.0, _MAXFL, "global learning rate η_g (pFedMe's β)", gt=0,
    ),
    Setting("maxfl-batch-size", "int", 64, _MAXFL, "mini-batch size b", ge=1),
    Setting("maxfl-local-steps", "int", 10, _MAXFL, "local SGD steps τ per round", ge=1),
    Setting("maxfl-eps", "float", 0.001, _MAXFL, "ε of MaxFL's adaptive global step", gt=0),
    Setting(
        "maxfl-solo-steps", "int", 100, _MAXFL,
        "SGD steps of the solo model ŵ_k whose loss is the requirement ρ_k", ge=0,
    ),
    Setting(
        "maxfl-tune-steps", "int", 5, _MAXFL,
        "local steps of the locally-tuned evaluation (Table 3)", ge=0,
    ),
    Setting(
        "maxfl-requirement", "choice", "train", _MAXFL,
        "split of ρ_k and of the gaps F_k(w) − ρ_k: train or heldout",
        choices=("train", "heldout"),
    ),
    Setting(
        "maxfl-participation", "choice", "flexible", _MAXFL,
        "flexible (only appealed clients after the mandatory rounds) or all",
        choices=("flexible", "all"),
    ),
    Setting(
        "maxfl-mandatory-rounds", "int", 10, _MAXFL,
        "rounds every client takes part in before opting out", ge=0,
    ),
    Setting(
        "maxfl-partition", "choice", "dirichlet", _MAXFL,
        "dirichlet (maxfl-alpha) or clusters (5 clusters × 2 labels); image datasets only "
        "(Sent140's clients are its accounts)",
        choices=("dirichlet", "clusters"),
    ),
    Setting("maxfl-alpha", "float", 0.5, _MAXFL, "Dirichlet concentration α", gt=0),
    Setting(
        "maxfl-unseen-users", "int", -1, _MAXFL,
        "unseen (evaluation-only) clients (-1 = as many as seen; 619 for sent140 and "
        "synthetic-sent140)", ge=-1,
    ),
    Setting(
        "maxfl-sent140-vectors", "choice", "random", _MAXFL,
        "synthetic-sent140 only: the token vectors standing in for GloVe: random (seeded "
        "N(0, 1/200)), or planted: coordinate 0 holds each token's planted sentiment weight "
        "(a pre-trained embedding's best case)",
        choices=("random", "planted"),
    ),
    Setting(
        "maxfl-label-flip", "float", 0.3, _MAXFL,
        "fraction of clients whose labels are flipped (y → C−1−y)", ge=0, le=1,
    ),
    Setting(
        "maxfl-train-fraction", "float", 0.6, _MAXFL,
        "share of each client's examples used for training", gt=0, lt=1,
    ),
    Setting("maxfl-dropout", "float", 0.2, _MAXFL, "dropout rate of the MLP", ge=0, lt=1),
    Setting(
        "maxfl-eval-every", "int", 10, _MAXFL,
        "evaluation period in rounds (and rounds 0 and T)", ge=1,
    ),
    Setting(
        "maxfl-dp-noise", "float", 0.0, _MAXFL,
        "client-level DP: noise multiplier sigma of the distributed Gaussian noise (0 = off; "
        "maxfl and fedavg; needs secure-aggregation and maxfl-participation = all)", ge=0,
    ),
    Setting(
        "maxfl-dp-clip", "float", 1.0, _MAXFL,
        "client-level DP: L2 bound C on a client's update", gt=0,
    ),
    Setting(
        "maxfl-dp-delta", "float", 1e-5, _MAXFL,
        "client-level DP: delta at which each round's dp-epsilon is reported", gt=0, lt=1,
    ),
    Setting("maxfl-prox-mu", "float", 0.01, _MAXFL, "FedProx's μ", ge=0),
    Setting("maxfl-qffl-q", "float", 1.0, _MAXFL, "q of q-FFL", ge=0),
    Setting(
        "maxfl-byzantine", "float", 0.0, _MAXFL,
        "fraction of seen clients that are Byzantine (always opt in)", ge=0, le=1,
    ),
    Setting(
        "maxfl-byzantine-loss", "float", 10.0, _MAXFL,
        "what a Byzantine client adds to its reported loss",
    ),
    Setting(
        "maxfl-byzantine-noise", "float", 0.1, _MAXFL,
        "std of the Gaussian noise a Byzantine client adds to Δw", ge=0,
    ),
    Setting(
        "maxfl-mw-eta", "float", 0.1, _MAXFL, "MW-Fed's multiplicative-weights rate η_mw", gt=0,
    ),
    Setting(
        "maxfl-perfedavg-alpha", "float", 0.01, _MAXFL,
        "Per-FedAvg's inner (personalisation) step α", gt=0,
    ),
    Setting(
        "maxfl-pfedme-lambda", "float", 15.0, _MAXFL,
        "pFedMe's λ between the personalised and the local model", gt=0,
    ),
    Setting("maxfl-pfedme-k", "int", 5, _MAXFL, "pFedMe's inner steps K per local step", ge=1),
    Setting("maxfl-pfedme-lr", "float", 0.01, _MAXFL, "pFedMe's personal learning rate", gt=0),
    Setting(
        "maxfl-batched-clients", "bool", False, _MAXFL,
        "train a request's local-SGD clients together (stacked MLPs): same draws, models "
        "equal to one-by-one up to float32 rounding (not bit for bit, so off by default)",
    ),
    # ------------------------------------------------------------------ fedsubavg
    Setting("fsa-rounds", "int", 200, _FSA, "communication rounds R", ge=1),
    Setting(
        "fsa-local-iters", "int", 10, _FSA,
        "local SGD iterations I (CentralSGD: steps per round)", ge=1,
    ),
    Setting("fsa-batch-size", "int", 5, _FSA, "batch size B (CentralSGD: K·B)", ge=1),
    Setting("fsa-lr", "float", 0.1, _FSA, "learning rate γ (Table 4; FedAdam's η_l)", gt=0),
    Setting(
        "fsa-lr-decay", "float", 1.0, _FSA,
        "torch tasks: γ_t = γ·decay^(t−1) (the authors' Amazon code: 0.999)", gt=0, le=1,
    ),
    Setting(
        "fsa-clip-norm", "float", 0.0, _FSA,
        "torch tasks: global gradient-norm clipping (0 = none; the authors' Amazon code: 5)",
        ge=0,
    ),
    Setting(
        "fsa-embedding-init", "choice", "random", _FSA,
        "Sent140 LSTM's initial embedding rows: random (PyTorch's N(0, 1)); glove: the "
        "25-D Twitter GloVe vectors (glove.twitter.27B.25d.txt in data-dir/sent140 or "
        "data-dir; tokens it lacks keep random rows); planted: stand-in only, coordinate 0 "
        "holds each token's planted sentiment weight (a pre-trained embedding's best case)",
        choices=("random", "glove", "planted"),
    ),
    Setting(
        "fsa-eval-every", "int", 1, _FSA,
        "torch tasks: evaluate the full model every this many rounds (and after the last)",
        ge=1,
    ),
    Setting(
        "fsa-weighting", "choice", "clients", _FSA,
        "clients: Alg. 1 (N/n_m, plain means); samples: App. D.4 (data-size weights)",
        choices=("clients", "samples"),
    ),
    Setting(
        "fsa-dp-noise", "float", 0.0, _FSA,
        "client-level DP: noise multiplier sigma of the distributed Gaussian noise on the heat "
        "support (0 = off; needs secure-aggregation and fsa-weighting = clients)", ge=0,
    ),
    Setting("fsa-dp-clip", "float", 1.0, _FSA, "client-level DP: L2 bound C on a client's "
            "submodel update", gt=0),
    Setting("fsa-dp-delta", "float", 1e-5, _FSA, "client-level DP: delta of the reported "
            "dp-epsilon", gt=0, lt=1),
    Setting("fsa-proximal-mu", "float", 0.01, _FSA, "FedProx's μ (fedprox-sub only)", ge=0),
    Setting("fsa-adam-eta", "float", 1.0, _FSA, "FedAdam's server step η (Table 5)", gt=0),
    Setting("fsa-adam-beta1", "float", 0.9, _FSA, "FedAdam's β₁", ge=0, lt=1),
    Setting("fsa-adam-beta2", "float", 0.99, _FSA, "FedAdam's β₂", ge=0, lt=1),
    Setting(
        "fsa-adam-tau", "float", 0.001, _FSA,
        "FedAdam's τ (not in the paper: Flower's and Reddi et al.'s)", gt=0,
    ),
)  # fmt: skip

#: key -> declaration, in declaration order (common keys, then each family's)
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}
if len(SETTINGS) != len(_DECLARED):
    raise ValueError("a run_config key is declared twice")

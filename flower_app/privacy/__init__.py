"""Privacy: secure aggregation of every round's replies (and, later, differential privacy).

``SecureAggregation`` (server settings, given to a strategy) and
``secure_aggregation_mod`` (the ClientApp mod) are the two things a user needs; the
protocol is described in :mod:`flower_app.privacy.secagg_server`.
"""

from flower_app.privacy.secagg_client import secure_aggregation_mod
from flower_app.privacy.secagg_server import SecureAggregation, SecureSum, secure_sum

__all__ = ["SecureAggregation", "SecureSum", "secure_aggregation_mod", "secure_sum"]

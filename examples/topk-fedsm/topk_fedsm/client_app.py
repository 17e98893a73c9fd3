"""ClientApp: this node is one client with its own item scores; FedSM's helper answers."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flower_app.clients import ScoreTable, fedsm_evaluate, fedsm_reply
from topk_fedsm.task import load_scores

app = ClientApp()


def utility(context: Context) -> ScoreTable:
    """Return this client's f_i(S) = max_{j ∈ S} score_j (facility location)."""
    num_items = int(context.run_config["num-items"])
    scores = load_scores(
        int(context.node_config["partition-id"]), num_items, int(context.run_config["data-seed"])
    )
    return ScoreTable(scores, n_elements=num_items)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Report marginal gains for the items FedSM asks about."""
    return fedsm_reply(msg, context, utility(context))


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Report f_i(S) for the chosen items."""
    return fedsm_evaluate(msg, context, utility(context))

"""ClientApp of the quickstart-numpy shape: "train" adds noise to the model, "evaluate" replies."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Return the model plus noise (the quickstart's stand-in for local training)."""
    ndarrays = msg.content["arrays"].to_numpy_ndarrays()
    model = [m + np.random.rand(*m.shape) for m in ndarrays]
    metrics = MetricRecord({"random_metric": float(np.random.rand()), "num-examples": 1})
    return Message(RecordDict({"arrays": ArrayRecord(model), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Reply with a random metric (the quickstart's evaluation)."""
    metrics = MetricRecord({"random_metric": float(np.random.rand()), "num-examples": 1})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

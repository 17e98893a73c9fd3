"""Client side of the torch tasks (Sent140 LSTM, Amazon DIN) for FedSubAvg's plain mode.

One node is one client: node ``partition-id`` = c serves client c of the task. It answers the
strategy's counting query with its rows and n_c (:func:`~flower_app.clients.fedsubavg.heat_reply`,
declaring its partition id so the sample is drawn over partitions) and each ``train`` message
by loading the submodel (:func:`~flower_app.clients.fedsubavg.load_submodel`), running
:func:`~flower_app.algorithms.fedsubavg.torch_engine.local_train` and replying with its rows
(:func:`~flower_app.clients.fedsubavg.submodel_reply`): the drop-in helpers a Flower user's own
ClientApp uses, so this is also their worked example.

:class:`TorchTaskClient` is the message-level client the app's ClientApp routes to (see
:mod:`flower_app.clients.adapter`).
"""

from __future__ import annotations

from flwr.app import Message
from flwr.client import NumPyClient

from flower_app.algorithms.fedsubavg.torch_engine import TorchLocalConfig, local_train
from flower_app.algorithms.fedsubavg.torch_tasks import TorchSubmodelTask
from flower_app.clients.fedsubavg import heat_reply, load_submodel, submodel_reply

__all__ = ["TorchTaskClient"]


class TorchTaskClient(NumPyClient):
    """Client ``partition`` of a torch task, answering Message-API messages directly.

    Parameters
    ----------
    task : TorchSubmodelTask
        The task (only this client's samples are read for training).
    partition : int
        The client index c (the node's ``partition-id``).
    """

    def __init__(self, task: TorchSubmodelTask, partition: int) -> None:
        if not 0 <= int(partition) < task.n_clients:
            raise ValueError(
                f"partition-id {partition} is not a client of {task.name} (0..{task.n_clients - 1})"
            )
        self.task, self.partition = task, int(partition)

    def handle(self, msg: Message) -> Message:
        """Answer the counting query or a ``train`` message."""
        kind = msg.metadata.message_type
        if kind.startswith("query"):
            rows = self.task.client_rows(self.partition)
            return heat_reply(msg, rows, self.task.n_train(self.partition), self.partition)
        if kind.startswith("train"):
            return self.train(msg)
        raise ValueError(f"{type(self).__name__} does not answer {kind!r} messages")

    def train(self, msg: Message) -> Message:
        """Load the submodel, run the local steps, reply with the updated rows."""
        config = msg.content.config_records["config"]
        local = TorchLocalConfig.from_config(config)
        model = self.task.make_model()
        load_submodel(model, msg)
        loss = local_train(
            self.task, model, self.partition, local, int(config["seed"]),
            int(config["server-round"]),
        )  # fmt: skip
        n = self.task.n_train(self.partition)
        return submodel_reply(model, msg, n, {"local-train-loss": loss})

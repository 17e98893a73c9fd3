"""ClientApp: train the received model on this client's partition, evaluate it."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_app.clients import appeal_reply, ensure_rho, maxfl_metrics
from fmnist_maxfl.task import Net, load_data
from fmnist_maxfl.task import test as test_fn
from fmnist_maxfl.task import train as train_fn

DEVICE = "cpu"

app = ClientApp()


def _data(context: Context):
    pid, parts = context.node_config["partition-id"], context.node_config["num-partitions"]
    return load_data(int(pid), int(parts), context.run_config)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _data(context)
    rho = ensure_rho(context, lambda: solo_loss(trainloader, context))
    received_loss, _ = test_fn(model, trainloader, DEVICE)
    epochs, lr = int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"])
    train_loss = train_fn(model, trainloader, epochs, lr, DEVICE)
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    metric_record = maxfl_metrics(received_loss, rho, metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, valloader = _data(context)
    eval_loss, eval_acc = test_fn(model, valloader, DEVICE)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate("appeal")
def appeal(msg: Message, context: Context) -> Message:
    """MaxFL's opt-in test: the received model's loss on the local training data, and ρ."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _data(context)
    rho = ensure_rho(context, lambda: solo_loss(trainloader, context))
    return appeal_reply(msg, test_fn(model, trainloader, DEVICE)[0], rho)


def solo_loss(trainloader, context: Context) -> float:
    """ρ: the training loss of a model trained on this client's data alone."""
    model, cfg = Net(), context.run_config
    train_fn(model, trainloader, int(cfg["local-epochs"]), float(cfg["lr"]), DEVICE)
    return test_fn(model, trainloader, DEVICE)[0]

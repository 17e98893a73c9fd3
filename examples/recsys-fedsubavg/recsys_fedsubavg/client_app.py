"""recsys-fedsubavg: the ClientApp (training and evaluation on the node's ratings)."""

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_app.clients import heat_reply, load_submodel, submodel_reply
from recsys_fedsubavg.task import load_data, make_model, test, train

app = ClientApp()


@app.query("feature_heat")
def feature_heat(msg: Message, context: Context) -> Message:
    """Declare the embedding rows the node's training ratings touch (once, before round 1)."""
    pid, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    trainloader, _ = load_data(pid, n, context.run_config)
    users, items, _ = trainloader.dataset.tensors
    rows = {"user_emb.weight": users, "item_emb.weight": items}
    return heat_reply(msg, rows, num_examples=len(trainloader.dataset))


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    """Train the model on the node's ratings."""
    model = make_model(context.run_config)
    load_submodel(model, msg)
    pid, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    trainloader, _ = load_data(pid, n, context.run_config)
    epochs, lr = context.run_config["local-epochs"], msg.content["config"]["lr"]
    loss = train(model, trainloader, epochs, lr)
    return submodel_reply(model, msg, len(trainloader.dataset), {"train_loss": loss})


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    """Evaluate the global model on the node's held-out ratings."""
    model = make_model(context.run_config)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    pid, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    _, testloader = load_data(pid, n, context.run_config)
    loss = test(model, testloader)
    metrics = MetricRecord({"eval_loss": loss, "num-examples": len(testloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

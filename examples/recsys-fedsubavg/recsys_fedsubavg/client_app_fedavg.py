"""recsys-fedsubavg: the ClientApp (training and evaluation on the node's ratings)."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from recsys_fedsubavg.task import load_data, make_model, test, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    """Train the model on the node's ratings."""
    model = make_model(context.run_config)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    pid, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    trainloader, _ = load_data(pid, n, context.run_config)
    epochs, lr = context.run_config["local-epochs"], msg.content["config"]["lr"]
    loss = train(model, trainloader, epochs, lr)
    model_record = ArrayRecord(model.state_dict())
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": model_record, "metrics": metrics})
    return Message(content=content, reply_to=msg)


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

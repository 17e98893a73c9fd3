"""An in-process Grid for tests: calls the real ClientApp per message, no Ray.

One Context per node, as the simulation engine keeps them; ``tamper(msg, reply)`` may
replace a reply (to test how strategies treat bad ones).
"""

from __future__ import annotations

import uuid

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from flower_app.client_app import app as client_app


class LocalGrid(Grid):
    """In-process grid that calls the real ClientApp (no Ray); one Context per node."""

    def __init__(self, num_nodes: int, run_config: dict, app=None, node_config=None) -> None:
        """``app``: the ClientApp to call (default: this package's); ``node_config(i)``:
        the i-th node's node_config (default: partition-id / num-partitions)."""
        self.app = client_app if app is None else app
        # Message() outside a ServerApp process needs a task identity
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.node_ids = list(range(1000, 1000 + num_nodes))
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config=(
                    {"partition-id": i, "num-partitions": num_nodes}
                    if node_config is None
                    else node_config(i)
                ),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nid in enumerate(self.node_ids)
        }
        self._replies: dict[str, Message] = {}
        self.tamper = None  # optional hook: reply -> reply

    def set_run(self, run) -> None:  # pragma: no cover - not used
        self._run = run

    @property
    def run(self):  # pragma: no cover - not used
        return getattr(self, "_run", None)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.node_ids)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            try:
                reply = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as ex:  # noqa: BLE001
                reply = Message(Error(code=0, reason=repr(ex)), reply_to=msg)
            if self.tamper is not None:
                reply = self.tamper(msg, reply)
            self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(m) for m in message_ids if m in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

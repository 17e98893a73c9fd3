"""The LSTM (Sent140) and DIN (Amazon) of FedSubAvg's non-linear tasks: shapes, the submodel
property (a step on a client's data moves only the embedding rows it touches) and that they
learn on the calibrated stand-ins."""

from __future__ import annotations

import numpy as np
import torch

from flower_app.datasets.amazon import synthetic_amazon
from flower_app.datasets.sent140 import synthetic_sent140
from flower_app.models.din import DIN
from flower_app.models.lstm import SentimentLSTM


def _step(model: torch.nn.Module, loss: torch.Tensor, lr: float = 0.5) -> None:
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def test_lstm_moves_only_the_rows_of_its_tokens() -> None:
    torch.manual_seed(0)
    model = SentimentLSTM(vocab_size=50)
    assert model.embedding.weight.shape == (51, 25) and model.lstm.hidden_size == 100
    tokens = np.array([[3, 7, 7, 9, 0, 0], [4, 3, 0, 0, 0, 0]])
    before = model.embedding.weight.detach().clone()
    logits = model(torch.as_tensor(tokens))
    assert logits.shape == (2, 2)
    _step(model, torch.nn.functional.cross_entropy(logits, torch.tensor([1, 0])))
    moved = torch.nonzero((model.embedding.weight - before).abs().sum(dim=1) > 0).ravel()
    assert moved.tolist() == SentimentLSTM.submodel_rows(tokens).tolist() == [3, 4, 7, 9]
    assert torch.all(model.embedding.weight[0] == 0)  # padding is not a feature


def test_din_moves_only_its_user_and_item_rows() -> None:
    torch.manual_seed(0)
    model = DIN(n_users=10, n_items=30)
    uid, mid = np.array([2, 2, 5]), np.array([4, 8, 4])
    hist = np.array([[0, 0, 11, 12], [0, 11, 12, 4], [0, 0, 0, 0]])
    users_before = model.user_emb.weight.detach().clone()
    items_before = model.item_emb.weight.detach().clone()
    model.train()
    logits = model(*(torch.as_tensor(a) for a in (uid, mid, hist)))
    assert logits.shape == (3, 2)
    _step(model, torch.nn.functional.cross_entropy(logits, torch.tensor([1, 0, 1])))
    rows = DIN.submodel_rows(uid, mid, hist)
    moved_u = torch.nonzero((model.user_emb.weight - users_before).abs().sum(1) > 0).ravel()
    moved_i = torch.nonzero((model.item_emb.weight - items_before).abs().sum(1) > 0).ravel()
    assert moved_u.tolist() == rows["user_emb.weight"].tolist() == [2, 5]
    assert moved_i.tolist() == rows["item_emb.weight"].tolist() == [4, 8, 11, 12]


def test_both_models_fit_their_stand_ins() -> None:
    """The training loss falls (capacity to fit; generalisation is the runs' business)."""
    torch.manual_seed(0)
    task = synthetic_sent140(seed=1, n_clients=60, n_samples=3000, vocab_size=2000,
                             target_dispersion=55)  # fmt: skip
    x, y = torch.as_tensor(task.train_x[:1024]).long(), torch.as_tensor(task.train_y[:1024])
    lstm = SentimentLSTM(len(task.vocab))
    opt = torch.optim.Adam(lstm.parameters(), lr=0.01)
    first = last = 0.0
    for epoch in range(8):
        for start in range(0, 1024, 128):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(lstm(x[start : start + 128]),
                                                     y[start : start + 128])  # fmt: skip
            loss.backward()
            opt.step()
            value = float(loss.detach())
            first = value if epoch == 0 and start == 0 else first
            last = value
    assert last < first - 0.05
    amazon = synthetic_amazon(seed=1, n_clients=80, n_samples=5600, n_items=2000,
                              target_dispersion=40)  # fmt: skip
    din = DIN(amazon.n_clients, len(amazon.items))
    opt = torch.optim.Adam(din.parameters(), lr=0.01)
    u, m = torch.as_tensor(amazon.train_uid), torch.as_tensor(amazon.train_mid)
    h, c = torch.as_tensor(amazon.train_hist[:, -20:]), torch.as_tensor(amazon.train_clk)
    losses = []
    for epoch in range(4):
        order = torch.randperm(u.numel(), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, u.numel(), 256):
            idx = order[start : start + 256]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(din(u[idx], m[idx], h[idx]), c[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1


def test_din_keeps_no_batch_statistics_between_batches() -> None:
    """As DIN's reference code: nothing is averaged from the batches a client trains on.

    Its input BatchNorm is a fixed-statistics affine map and Dice normalises each batch by its
    own statistics, so the model has no buffers (no running means for FedAvg to average) and
    evaluation mode computes exactly what training mode does on the same batch.
    """
    torch.manual_seed(0)
    model = DIN(n_users=5, n_items=20)
    assert dict(model.named_buffers()) == {}
    uid = torch.tensor([1, 1, 2, 3])
    mid = torch.tensor([4, 5, 6, 7])
    hist = torch.tensor([[1, 2, 0], [3, 0, 0], [8, 9, 10], [0, 0, 0]])
    loss = model(uid, mid, hist).logsumexp(dim=1).sum()
    loss.backward()  # training on a batch of one user must not move anything but parameters
    train_out = model(uid, mid, hist)
    model.eval()
    assert torch.equal(model(uid, mid, hist), train_out)
    one = model(uid[:1], mid[:1], hist[:1])  # a batch of one row: Dice's gate is 1/2
    assert torch.isfinite(one).all()

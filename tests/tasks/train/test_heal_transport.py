"""Healing without pickles (tasks/train/heal_transport.py): a replica group's state sent as one snapshot frame over
HTTP on 127.0.0.1, verified before it is loaded."""

from __future__ import annotations

import io
import pickle
import threading
import urllib.error
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tasks.train.heal_transport import FramedHTTPTransport
from tasks.train.snapshot import SnapshotError, load_into, write_frame


class Holder:
    """A Stateful that keeps what it was loaded with."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def peer_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"user": {"default": {
        "model_optim": {"model": {"layers.0.w": torch.randn(4, 8, generator=g).to(torch.bfloat16),
                                  "norm.weight": torch.randn(8, generator=g)},
                        "optim": {"state.layers.0.w.exp_avg": torch.randn(4, 8, generator=g),
                                  "state.layers.0.w.step": torch.tensor(7.0),
                                  "param_groups.layers.0.w.lr": 0.01, "param_groups.layers.0.w.betas": [0.9, 0.95]}},
        "train": {"step": 7, "tokens": 7 * 512}}},
        "torchft": {"step": 7, "batches_committed": 7}}


def received_user_state(frame) -> dict:
    app_state = {"model_optim": Holder({}), "train": Holder({})}
    load_into(app_state, frame.header, frame.tensors, template=lambda: {"model_optim": {}, "train": {}})
    return {key: holder.state for key, holder in app_state.items()}


@pytest.fixture
def transports():
    made = [FramedHTTPTransport("127.0.0.1", timedelta(seconds=2)) for _ in range(2)]
    yield made
    for t in made:
        t.shutdown()


def test_a_peers_state_arrives_whole_bit_for_bit_without_unpickling_anything(transports, monkeypatch):
    sender, receiver = transports
    sent = peer_state()
    sender.send_checkpoint([1], 7, sent, timedelta(seconds=2))

    def refuse(*args, **kwargs):
        raise AssertionError("healing unpickled something")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    got = receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=2))

    assert got["torchft"] == {"step": 7, "batches_committed": 7}
    state = received_user_state(got["user"]["default"])
    want = sent["user"]["default"]
    assert state["train"] == want["train"]
    for part in ("model", "optim"):
        assert state["model_optim"][part].keys() == want["model_optim"][part].keys()
        for key, value in want["model_optim"][part].items():
            if isinstance(value, torch.Tensor):
                assert state["model_optim"][part][key].dtype == value.dtype
                assert torch.equal(state["model_optim"][part][key], value), key
            else:
                assert state["model_optim"][part][key] == value, key


def test_a_request_for_another_step_is_refused_and_nothing_is_served_after_disallow(transports):
    sender, receiver = transports
    sender.send_checkpoint([1], 7, peer_state(), timedelta(seconds=2))
    with pytest.raises(urllib.error.HTTPError, match="409"):
        receiver.recv_checkpoint(0, sender.metadata(), 8, timedelta(seconds=5))
    sender.disallow_checkpoint()  # the optimizer may now change the tensors: step 7 is no longer served
    with pytest.raises(urllib.error.HTTPError, match="409"):
        receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=5))


def test_a_request_that_comes_before_the_state_waits_for_it(transports):
    sender, receiver = transports
    got, asked = {}, threading.Event()

    def fetch():
        asked.set()
        got["state"] = receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=5))

    fetcher = threading.Thread(target=fetch)
    fetcher.start()
    asked.wait(5)
    sender.send_checkpoint([1], 7, peer_state(), timedelta(seconds=2))
    fetcher.join(10)
    assert got["state"]["torchft"]["step"] == 7


def test_a_corrupted_transfer_is_refused_before_anything_is_loaded(transports):
    """A peer (or the network) delivers a frame with one payload byte flipped: the checksum refuses it."""
    _, receiver = transports
    buf = io.BytesIO()
    write_frame(buf, {"step": 7, "objects": {"torchft/step": 7, "torchft/batches_committed": 7}},
                {"user/default/model_optim/model/w": torch.arange(64, dtype=torch.float32)})
    blob = bytearray(buf.getvalue())
    blob[20] ^= 0xFF

    class Tampered(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(bytes(blob))

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Tampered)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(SnapshotError, match="checksum"):
            receiver.recv_checkpoint(0, f"http://127.0.0.1:{server.server_address[1]}/checkpoint/", 7,
                                     timedelta(seconds=5))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

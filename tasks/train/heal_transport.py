"""Healing a replica group without unpickling: a torchft ``CheckpointTransport`` over HTTP that carries the
peer's state as one snapshot frame (snapshot.py: raw tensor bytes, a JSON header, an xxh3-128 checksum).

Why not torchft's own HTTPTransport: it ``torch.load``s what a peer sends with ``weights_only=False`` (its users'
state may hold any object), so whatever answers on a group's heal address can run code in every group it heals.
smelt's state is tensors and JSON values only, so one frame carries it whole, and the receiver verifies the
checksum before anything is loaded. A shard (DTensor) travels as its local tensor; the receiver rebuilds it on its
own mesh (``snapshot.load_into``), as a snapshot restore does.

The sender serves the state of exactly one step, from ``send_checkpoint`` until ``disallow_checkpoint`` (torchft
calls it in ``should_commit``, before the optimizer changes the tensors). A request that arrives before the state
is there waits for it (up to the timeout); a read in flight holds the state, and ``disallow_checkpoint`` waits for
it to finish, as torchft's read/write lock does.
"""

from __future__ import annotations

import threading
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torchft.checkpointing.transport import CheckpointTransport

from tasks.train.snapshot import SnapshotError, decode, flatten, unflatten, write_frame

PATH = "/checkpoint/"


class FramedHTTPTransport(CheckpointTransport[dict]):
    """Serves this rank's state to a healing peer and fetches a peer's, both as snapshot frames."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host, self.timeout_s = host, timeout.total_seconds()
        self._cond = threading.Condition()
        self._served: tuple[int, dict[str, torch.Tensor], dict[str, Any]] | None = None
        self._readers = 0
        transport = self

        class Handler(BaseHTTPRequestHandler):
            timeout = self.timeout_s  # a stalled peer cannot hold a serving thread forever

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                try:
                    step = int(self.path.removeprefix(PATH))
                except ValueError:
                    self.send_error(400, f"expected {PATH}<step>, got {self.path}")
                    return
                served = transport._acquire(step)
                if served is None:
                    self.send_error(409, f"not serving step {step}")
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    _, tensors, objects = served
                    write_frame(self.wfile, {"step": step, "objects": objects}, tensors)
                finally:
                    transport._release()

            def log_message(self, *args: object) -> None:  # one line per heal is logged by the group
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="smelt-heal-server", daemon=True)
        self._thread.start()

    # -- serving ------------------------------------------------------------------------------------

    def metadata(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}{PATH}"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: dict, timeout: timedelta) -> None:
        tensors, objects = flatten(state_dict)
        with self._cond:
            self._served = (step, tensors, objects)
            self._cond.notify_all()

    def disallow_checkpoint(self) -> None:
        with self._cond:
            self._served = None
            if not self._cond.wait_for(lambda: self._readers == 0, timeout=self.timeout_s):
                raise TimeoutError(f"a peer's read of this rank's state did not finish within {self.timeout_s:g} s")

    def _acquire(self, step: int) -> tuple | None:
        with self._cond:
            ready = self._cond.wait_for(lambda: self._served is not None and self._served[0] == step,
                                        timeout=self.timeout_s)
            if not ready:
                return None
            self._readers += 1
            return self._served

    def _release(self) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    # -- fetching -----------------------------------------------------------------------------------

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> dict:
        """The peer's state as torchft's Manager expects it: ``{"torchft": {...}, "user": {key: Frame}}``, each
        ``Frame`` for the load function registered under that key (verified, not yet loaded)."""
        with urllib.request.urlopen(f"{metadata}{step}", timeout=timeout.total_seconds()) as response:
            body = response.read()
        header, tensors = decode(body)
        if header.get("step") != step:
            raise SnapshotError(f"the peer sent step {header.get('step')}, not step {step}")
        objects = header["objects"]
        users = {path.split("/")[1] for path in [*objects, *tensors] if path.startswith("user/")}
        return {"torchft": unflatten({k: v for k, v in objects.items() if k.startswith("torchft/")})["torchft"],
                "user": {key: Frame.under(header, tensors, f"user/{key}/") for key in users}}

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join(timeout=self.timeout_s)


class Frame:
    """One registered key's part of a received frame: a header (``objects``, ``tensors`` entries) and the tensors,
    keys relative to the part, ready for ``snapshot.load_into``."""

    def __init__(self, header: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.header, self.tensors = header, tensors

    @classmethod
    def under(cls, header: dict, tensors: dict[str, torch.Tensor], prefix: str) -> "Frame":
        def strip(path: str) -> str:
            return path[len(prefix):]

        return cls({"objects": {strip(k): v for k, v in header["objects"].items() if k.startswith(prefix)},
                    "tensors": [{**e, "key": strip(e["key"])} for e in header["tensors"]
                                if e["key"].startswith(prefix)]},
                   {strip(k): t for k, t in tensors.items() if k.startswith(prefix)})

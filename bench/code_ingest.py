"""Code ingest throughput on the Python standard library's source tree as a folder input.

Runs the whole code ingest stage (``run_code_ingest``, default rules, one process, serial map) on
the running Python's stdlib folder (or ``--root``), with ``site-packages`` and ``__pycache__`` added
to ``reader.skip_dirs`` (installed packages and bytecode are not the stdlib's source; everything
else, tests and data files included, is read). The baseline, in the same run, lists the same tree
and reads and decodes the same files with nothing else: ``stage_vs_read`` is how many times longer
the stage takes than reading alone. The fastest of ``--repeat`` runs of each counts.

- ``files``: files listed (``in``); ``mb``: bytes of the files read / 1e6;
- ``files_per_s``, ``mb_per_s``: stage throughput on one core;
- ``docs_out``: files kept; ``read_mb_per_s``: the baseline; ``stage_vs_read``: stage / baseline time.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
import time

from tasks import contract, storage
from tasks.ingest.code.config import CodeIngestConfig
from tasks.ingest.code.readers import list_tree
from tasks.ingest.code.stage import run_code_ingest

EXCLUDED_DIRS = ["site-packages", "__pycache__"]


def read_only(root: str, cfg: CodeIngestConfig) -> tuple[float, int]:
    """Seconds to list the tree and read and decode every file the stage would read; bytes read."""
    started = time.perf_counter()
    fs, path = storage.filesystem(root)
    nbytes = 0
    for rel, size in list_tree(root, cfg.reader):
        if 0 <= size <= cfg.reader.max_file_bytes:
            with fs.open(f"{path}/{rel}", "rb") as f:
                data = f.read()
            nbytes += len(data)
            data.decode("utf-8", "replace")
    return time.perf_counter() - started, nbytes


def stage_once(root: str, cfg: CodeIngestConfig) -> tuple[float, contract.Manifest]:
    with tempfile.TemporaryDirectory(prefix="bench-code-") as out:
        started = time.perf_counter()
        manifest = run_code_ingest([root], f"{out}/docs", cfg, fingerprint="bench")
        return time.perf_counter() - started, manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=sysconfig.get_paths()["stdlib"],
                        help="folder tree to ingest (default: this Python's stdlib)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts")
    args = parser.parse_args()

    root = storage.normalize_url(args.root)
    cfg = CodeIngestConfig()
    cfg.reader.skip_dirs = [*cfg.reader.skip_dirs, *EXCLUDED_DIRS]
    read_s, read_bytes = min(read_only(root, cfg) for _ in range(args.repeat))
    stage_s, manifest = min((stage_once(root, cfg) for _ in range(args.repeat)), key=lambda run: run[0])
    files, mb = manifest.stats["in"], manifest.stats["funnel.read.bytes_in"] / 1e6
    print(json.dumps({
        "files": files,
        "mb": round(mb, 2),
        "files_per_s": round(files / stage_s, 1),
        "mb_per_s": round(mb / stage_s, 2),
        "docs_out": manifest.stats["out"],
        "read_mb_per_s": round(read_bytes / 1e6 / read_s, 2),
        "stage_vs_read": round(stage_s / read_s, 2),
    }))


if __name__ == "__main__":
    main()

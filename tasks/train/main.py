"""torchrun entry point: one process per rank trains (or resumes) the run in ``--run-dir``.

    torchrun ... -m tasks.train.main --config FILE.toml --data TOKENS_URL | --data name=URL ... \
        --run-dir URL [--set key=value ...] [--resume-from STEP [--skip-steps A:B]]
    python -m tasks.train.main --config FILE.toml --data URL --dry-run --nproc 8
    python -m tasks.train.main --config FILE.toml --dry-run --simulate-world 4096 [--rank R]

``--simulate-world N``: build rank R of an N-rank job with the trainer's code on a fake process group and
fake tensors, step it once under torch's memory tracker, and print its peak beside the planner's
(tasks/train/simulate_world.py); ``--data`` only sets the vocabulary there.

``--spare`` (smelt's node agent, tasks/train/agent.py): import everything, wait on stdin for this
process's rank, then train in generations, rejoining in process when a peer fails.

``--resume-from STEP``: continue from that older retained checkpoint on any world size, the later
checkpoints kept as a superseded branch; ``--skip-steps A:B`` also skips the samples steps A..B would
train on (tasks/branches.py). A restarted rank of the same launch does not branch again.

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

from tasks import contract
from tasks.branches import parse_skip_steps
from tasks.config import ConfigError, load
from tasks.errors import UserError
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
    parser.add_argument("--data", action="append",
                        help="tokens dataset URL, or name=URL for a mixture (repeat for each dataset)")
    parser.add_argument("--run-dir", help="run folder: metrics, summary, checkpoints (required unless --dry-run)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set optim.lr=3e-4 (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the layout, batch walk and busiest rank's parameter count as JSON "
                             "(memory: add --simulate-world, or see smelt plan)")
    parser.add_argument("--nproc", type=int, default=1, help="world size to describe with --dry-run")
    parser.add_argument("--simulate-world", type=int, metavar="N",
                        help="with --dry-run: build and step one rank of an N-rank job on fake tensors, measure its memory")
    parser.add_argument("--rank", type=int, default=0, help="the rank --simulate-world builds (its mesh coordinates)")
    parser.add_argument("--spare", action="store_true",
                        help="a warm spare of smelt's node agent: wait on stdin for a rank (tasks/train/agent.py)")
    parser.add_argument("--resume-from", type=int, metavar="STEP",
                        help="continue from this retained checkpoint; the later ones become a superseded branch")
    parser.add_argument("--skip-steps", metavar="A:B", help="with --resume-from: skip the samples of steps A..B")
    parser.add_argument("--branch-request", help="with --resume-from: the request's id (a flow run's); a launch "
                        "with the same id continues the branch it declared")
    args = parser.parse_args(argv)
    if not args.data and not (args.dry_run and args.simulate_world):
        parser.error("--data is required (unless --dry-run --simulate-world)")

    from tasks.train.node_launch import preflight  # torch import: after argument errors
    from tasks.train.faults import fault_callbacks  # torch imports: after argument errors
    from tasks.train.trainer import Trainer

    if args.spare:
        from tasks.train import agent

        agent.wait_for_assignment()
    _setup_logging()

    try:
        cfg = load(TrainConfig, args.config, args.overrides, section="train")
        if args.dry_run and args.simulate_world:
            print(json.dumps(simulate(cfg, args.data, args.simulate_world, args.rank), indent=2))
            return 0
        sources = parse_data(args.data)
        if args.dry_run:
            print(json.dumps(preflight(cfg, sources, [args.nproc]), indent=2))
            return 0
        if not args.run_dir:
            raise ConfigError("--run-dir is required to train")
        branch = {"resume_from": args.resume_from, "skip_steps": parse_skip_steps(args.skip_steps),
                  "branch_request": args.branch_request}
        if args.spare:
            return _train_in_generations(cfg, sources, args.run_dir, branch)
        trainer = Trainer(cfg, sources, args.run_dir, callbacks=fault_callbacks(cfg.faults, args.run_dir, _rank()),
                          **branch)
    except (UserError, contract.DatasetError) as e:  # a ValueError from a bug keeps its traceback
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


def simulate(cfg: TrainConfig, data: list[str] | None, world_size: int, rank: int) -> dict:
    """One simulated rank (tasks/train/simulate_world.py) beside the planner's figures for it (infra/memory.py)."""
    from infra.memory import planned_for_trainer
    from tasks.train.node_launch import data_vocab_size
    from tasks.train.simulate_world import simulate_rank

    vocab = data_vocab_size(parse_data(data)) if data else 0
    simulated = simulate_rank(cfg, world_size, rank, vocab)
    planned = planned_for_trainer(cfg.model_for_data(vocab) if vocab else cfg.model_config(), cfg.parallel,
                                  simulated.dp_shard, simulated.batch, simulated.coordinates["pp"])
    return {"simulated": simulated.as_dict(), "planned": planned,
            "difference": round(simulated.peak / planned["peak_bytes"] - 1, 4)}


def _rank() -> int:
    """This process's rank (torchrun and smelt's agent both set RANK; a lone process is rank 0)."""
    return int(os.environ.get("RANK", "0"))


def _train_in_generations(cfg, sources: dict[str, str], run_dir: str, branch: dict) -> int:
    """Under smelt's agent: rebuild the trainer in this process after a peer fails (agent.run_rank)."""
    import torch

    from tasks.train import agent
    from tasks.train.faults import fault_callbacks
    from tasks.train.trainer import Trainer

    def build_and_train() -> None:
        trainer = Trainer(cfg, sources, run_dir, callbacks=fault_callbacks(cfg.faults, run_dir, _rank()), **branch)
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

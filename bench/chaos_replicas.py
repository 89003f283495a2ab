"""Chaos for fault-tolerant replica groups (issue 41, item 4): ``python bench/chaos.py --replicas``.

Two torchft replica groups on 127.0.0.1 (tasks/train/replicas.py: torchft's Lighthouse and one process tree per
group, supervised by ``ReplicaGroups``), the tiny model of bench/chaos.py, in two layouts: ``2x1`` (one rank per
group, run directly) and ``2x2`` (two ranks per group under a torchrun agent, FSDP inside). Each layout trains one
fault-free reference run, then one run per fault kind, all with the same config and ``--replica-steps``. The fault
hits group 1 at step S (``--replica-fault-step``); R is group 1's last rank (its only one in ``2x1``; in ``2x2`` the
rank that does not host the group's Manager server, so torchrun tears the group down):

- ``rank_kill``        ``kill:rank=R,step=S``: SIGKILL of one rank at the start of step S
- ``group_kill``       ``ReplicaGroups.kill_group(1)`` once group 1 committed step S: the group's whole tree (a host)
- ``hang``             ``stop:rank=R,step=S``: SIGSTOP, the rank never comes back (the supervisor's hung-group rule)
- ``lighthouse_kill``  SIGKILL of the Lighthouse once group 1 committed step S (the supervisor restarts it)

The faults that restart group 1 also hold group 0 at step ``steps - 2`` until group 1 was restarted and is up
(``hold:rank=0,step=...,replica=1``), so that the survivor cannot finish the run before the group is back, whatever
the load; ``gate_wait_s`` says how long it waited (0 when the group was back sooner, the intended case), and a wait
there is no pause of the fault's: pauses are measured on the steps before the gate.

Figures of each fault, from the groups' own records (``<run>/replicas/group-<g>/metrics.jsonl``, one record per
committed step with its wall-clock ``time`` and the quorum's size, ``participants``); t is the fault's time (its
fired marker, or when the harness acted):

- ``pause_s``: the survivors' (group 0's; for the Lighthouse, both groups') longest gap between two consecutive
  committed steps that ends after t, up to the survivors' first step with group 1 back (healing included);
- ``median_step_s``: the survivors' median gap between consecutive committed steps over the run (alone and
  together), and ``pause_steps`` = pause_s / median_step_s (issue 41's goal: at most 2);
- ``fault_gap_s`` (and ``fault_gap_steps``): the survivors' gap that spans t, the failure's detection and the new
  quorum. The longest pause can come later: while the failed group restarts here, its interpreters and imports
  take the same 2 shared cores as the survivors (on a cluster it restarts on other hosts);
- ``steps_lost``: committed steps trained again once the run had gone past them (goal 0); ``split_steps``: steps two
  quorums committed side by side, each group in a quorum of its own from the same state (each trains the whole
  batch: the result is the same, one group's work is wasted). A step is committed by more than one quorum when
  its records outnumber its quorum's groups, or come from quorums of different sizes;
- ``restart_s``: t to the supervisor's restart of group 1 (detection); ``back_s``: t to the first step group 1
  committed in a quorum of every group after its restart (for the Lighthouse: after the supervisor restarted it);
- ``alone_steps``: the steps the survivors committed without group 1, each on the whole global batch;
- ``exactly_once``: ``replicas.merge_records`` found every sample of every step once;
- ``match``: the final parameters equal the reference's within ``--rtol`` (1e-5) relative, when both runs saved a
  final storage checkpoint (``compared``: "parameters"); else the final loss and every step's loss do
  (``compared``: "losses", the replica groups saved no parameters).

``goals`` gathers issue 41's targets over every fault. One JSON object: ``chaos.py`` prints it as its line.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.checkpoint_reader import list_committed, load_consolidated
from tasks.config import from_dict
from tasks.train import replicas
from tasks.train.config import TrainConfig
from tasks.train.faults import fired_faults
from tasks.train.node_launch import prepare_run
from tasks.train.replica_records import group_records, newest_step

LAYOUTS = {"2x1": 1, "2x2": 2}  # name → ranks per group
KINDS = ("rank_kill", "group_kill", "hang", "lighthouse_kill")
GROUPS = 2
GLOBAL_BATCH = 8
TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64}  # as bench/chaos.py
# Fast failure detection, as tests/tasks/train/test_replicas.py: the Lighthouse drops a silent group after 150 ms.
FT = {"enabled": True, "heartbeat_timeout_ms": 150, "join_timeout_ms": 150, "quorum_tick_ms": 20,
      "max_group_restarts": 2}
WAIT_S = 60.0  # the harness's wait for group 1 to reach the fault's step
CHECKPOINT_EVERY = 100  # storage checkpoints (the quorum's first participant saves), and always the last step's


@dataclass(frozen=True)
class ReplicaFault:
    kind: str
    step: int
    group_size: int

    @property
    def rank(self) -> int | None:
        """The faulted rank (global: replica id × group size + rank in the group), None for harness faults."""
        return 2 * self.group_size - 1 if self.kind in ("rank_kill", "hang") else None

    def specs(self, steps: int) -> list[str]:
        specs = {"rank_kill": [f"kill:rank={self.rank},step={self.step}"],
                 "hang": [f"stop:rank={self.rank},step={self.step}"]}.get(self.kind, [])
        if self.kind != "lighthouse_kill":  # group 1 restarts: the survivor may not finish before it is back
            specs.append(f"hold:rank=0,step={gate_step(steps)},replica=1")
        return specs


def gate_step(steps: int) -> int:
    return steps - 2


def replica_config(steps: int, group_size: int, timeout_s: float, specs: list[str], seq_len: int = 16) -> dict:
    return {"model": dict(TINY), "steps": steps, "seed": 0,
            "data": {"seq_len": seq_len, "global_batch": GLOBAL_BATCH, "prefetch": 0},
            "parallel": {"dp_replicate": GROUPS, "dp_shard": group_size},
            "snapshot": {"enabled": "off"}, "faults": {"inject": ";".join(specs)},
            "checkpoint": {"interval_steps": CHECKPOINT_EVERY},
            "ft": {**FT, "timeout_s": timeout_s}}


class Run:
    """One run folder trained by the replica groups to the end, with the harness's own fault on a thread."""

    def __init__(self, corpus: str, run_dir: Path, steps: int, group_size: int, timeout_s: float,
                 fault: ReplicaFault | None, log_path: Path | None, say, seq_len: int = 16) -> None:
        self.run_dir, self.steps, self.fault, self.say = run_dir, steps, fault, say
        cfg_dict = replica_config(steps, group_size, timeout_s, fault.specs(steps) if fault else [], seq_len)
        self.cfg = from_dict(TrainConfig, cfg_dict)
        self.args = prepare_run({"main": corpus}, cfg_dict, str(run_dir))
        self.group_size = group_size
        self.acted_at: float | None = None  # a harness fault's wall-clock time
        self.relaunched_at: float | None = None  # when the supervisor had restarted a killed Lighthouse
        self.done = threading.Event()
        self.tail: list[str] = []
        self._log = open(log_path, "w") if log_path else None
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            self.tail = [*self.tail[-199:], text]
            if self._log:
                self._log.write(f"{time.time():.3f} {text}\n")

    def train(self, timeout_s: float) -> replicas.ReplicaGroups:
        supervisor = replicas.ReplicaGroups(self.cfg, self.args, str(self.run_dir), GROUPS * self.group_size,
                                            log_line=self.line).start()
        if self.fault is not None:
            threading.Thread(target=self._act, args=(supervisor,), daemon=True).start()
        try:
            status = supervisor.run(timeout_s=timeout_s)
        except replicas.ReplicaError as e:
            raise RuntimeError(f"{self.run_dir.name}: {e}; last lines:\n" + "\n".join(self.tail[-40:])) from None
        finally:
            self.done.set()
            with self._lock:
                if self._log:
                    self._log.close()
                    self._log = None
        if status != 0:
            raise RuntimeError(f"{self.run_dir.name}: exit status {status}; last lines:\n" + "\n".join(self.tail[-40:]))
        return supervisor

    def _act(self, supervisor: replicas.ReplicaGroups) -> None:
        """The harness's fault, once group 1 committed the fault's step. A fault of the grammar that could not fire
        (group 1 joined the run past its step) would leave group 0 at the gate for good: the harness then kills
        group 1 itself, to open it, and the fault is reported unfired. Every wait is bounded."""
        run_dir, deadline = str(self.run_dir), time.monotonic() + WAIT_S + 2 * self.steps
        harness = self.fault.kind in ("group_kill", "lighthouse_kill")
        while time.monotonic() < deadline and not self.done.is_set():
            if harness and newest_step(run_dir, 1) >= self.fault.step:
                self.acted_at = time.time()
                if self.fault.kind == "group_kill":
                    supervisor.kill_group(1)
                else:
                    supervisor.lighthouse.proc.kill()
                    while supervisor.lighthouse.restarts < 1 and time.monotonic() < deadline:
                        time.sleep(0.005)
                    self.relaunched_at = time.time()
                self.line(f"chaos: {self.fault.kind} at {self.acted_at:.3f}")
                return
            if not harness and any(f["kind"] in ("kill", "stop") for f in fired_faults(run_dir)):
                return
            if not harness and newest_step(run_dir, 1) > self.fault.step:
                self.line(f"chaos: {self.fault.kind} did not fire (group 1 is past step {self.fault.step}); killing "
                          "group 1 to open the gate")
                supervisor.kill_group(1)
                return
            time.sleep(0.01)


# -- what a run shows -------------------------------------------------------------------------------------


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for g in range(GROUPS) for r in group_records(str(run_dir), g)}


def final_parameters(run_dir: Path, steps: int) -> dict[str, torch.Tensor] | None:
    """The final step's storage checkpoint, if the replica groups wrote one (else None)."""
    committed = [c for c in list_committed(str(run_dir)) if c["step"] == steps]
    return load_consolidated(committed[-1]["url"])[0] if committed else None


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(run_dir: Path, reference: dict, rtol: float) -> dict:
    """The run against the fault-free reference: parameters if both saved them, else every step's loss."""
    got = losses(run_dir)
    steps = sorted(reference["losses"])
    step_diff = max((relative(got[s], reference["losses"][s]) for s in steps if s in got), default=None)
    final = relative(got[steps[-1]], reference["losses"][steps[-1]]) if steps[-1] in got else None
    out = {"final_loss_rel_diff": final, "max_step_loss_rel_diff": step_diff,
           "missing_loss_steps": [s for s in steps if s not in got]}
    params, want = final_parameters(run_dir, steps[-1]), reference["parameters"]
    if params is not None and want is not None:
        diff = max(((params[k].double() - want[k].double()).abs().max() / want[k].double().abs().max().clamp_min(
            1e-30)).item() for k in want) if sorted(params) == sorted(want) else float("inf")
        return {**out, "compared": "parameters", "param_max_rel_diff": diff, "match": diff <= rtol}
    return {**out, "compared": "losses", "match": final is not None and step_diff is not None
            and not out["missing_loss_steps"] and max(final, step_diff) <= rtol}


def twice_committed(records: list[dict]) -> list[int]:
    """Steps committed by more than one quorum: a step whose records outnumber its quorum's groups, or come from
    quorums of different sizes (each group records a step it commits once, so one quorum gives at most
    ``participants``)."""
    by_step: dict[int, list[dict]] = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r)
    return sorted(s for s, rs in by_step.items()
                  if len(rs) > max(r["participants"] for r in rs) or len({r["participants"] for r in rs}) > 1)


def steps_lost(records: list[dict], resumed: list[int] = ()) -> tuple[int, int]:
    """(redone, split) among the steps committed twice: *redone* once the run had gone past them (a record of it
    after a record of a later step, or a step a resume from storage trained again: ``resumed``); *split* when two
    quorums committed it side by side (two groups each in a quorum of its own, from the same state)."""
    redone, split = 0, 0
    for step in twice_committed(records):
        mine = [r["time"] for r in records if r["step"] == step]
        later = [r["time"] for r in records if r["step"] > step]
        if step in resumed or (later and max(mine) > min(later)):
            redone += 1
        else:
            split += 1
    return redone, split


def median_gap(times: list[float]) -> float | None:
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else None


def measure(run: Run, supervisor: replicas.ReplicaGroups, steps: int) -> dict:
    """One fault's figures (the module docstring defines them)."""
    run_dir, fault = str(run.run_dir), run.fault
    by_group = {g: group_records(run_dir, g) for g in range(GROUPS)}
    fired = [f for f in fired_faults(run_dir) if f["kind"] in ("kill", "stop")]
    t = run.acted_at if fault.kind in ("group_kill", "lighthouse_kill") else (fired[0]["time"] if fired else None)
    out: dict = {"kind": fault.kind, "step": fault.step, "rank": fault.rank, "fired": t is not None,
                 "restarts": [g.restarts for g in supervisor.groups], "hung_kills": supervisor.hung_kills,
                 "lighthouse_restarts": supervisor.lighthouse.restarts}
    if t is None:
        return out
    survivors = [0, 1] if fault.kind == "lighthouse_kill" else [0]
    # back: group 1's first step committed in a quorum of every group after its restart (a record after t may be
    # its last before it) or, for the Lighthouse, after the new one started (the step in flight at t still commits)
    since = supervisor.groups[1].starts[1] if len(supervisor.groups[1].starts) > 1 else run.relaunched_at or t
    back = next((r["time"] for r in by_group[1] if r["time"] > since and r["participants"] == GROUPS), None)
    gate = gate_step(steps) if fault.kind != "lighthouse_kill" else steps + 1
    pause, gap, medians, alone = 0.0, 0.0, [], 0
    for g in survivors:
        records = by_group[g]
        medians.append(median_gap([r["time"] for r in records]))
        spans = [b["time"] - a["time"] for a, b in zip(records, records[1:]) if a["time"] <= t < b["time"]]
        gap = max([gap, *spans])
        ends = [i for i, r in enumerate(records) if i and r["time"] > t and r["step"] < gate]
        end = next((i for i in ends if back is not None and records[i]["time"] >= back), ends[-1] if ends else None)
        for i in ends:
            if i > end:
                break
            pause = max(pause, records[i]["time"] - records[i - 1]["time"])
        alone += sum(r["time"] > t and r["participants"] < GROUPS for r in records)
    held = next((f["time"] for f in fired_faults(run_dir) if f["kind"] == "hold"), None)
    before_gate = [r["time"] for r in by_group[0] if r["step"] == gate - 1]
    step_s = statistics.median([m for m in medians if m is not None])
    merged = replicas.merge_records(run_dir, GROUPS, GLOBAL_BATCH, write=False)
    restarted = supervisor.groups[1].starts[1:]
    out.update({
        "t": t, "pause_s": pause, "median_step_s": step_s, "pause_steps": pause / step_s if step_s else None,
        "fault_gap_s": gap, "fault_gap_steps": gap / step_s if step_s else None,
        **dict(zip(("steps_lost", "split_steps"), steps_lost([r for g in range(GROUPS) for r in by_group[g]],
                                                             merged["redone_steps"]))),
        "restart_s": restarted[0] - t if restarted else None, "back_s": back - t if back is not None else None,
        "alone_steps": alone, "gate_wait_s": max(0.0, held - before_gate[-1]) if held and before_gate else 0.0,
        "exactly_once": not merged["problems"] and merged["last_step"] == steps, "problems": merged["problems"][:3],
    })
    return out


def r4(x):
    return round(x, 4) if isinstance(x, float) else x


class ReplicaBench:
    """Every layout's reference and fault runs, one after another, in ``root``."""

    def __init__(self, args, root: Path, corpus: str, say) -> None:
        self.args, self.root, self.corpus, self.say = args, root, corpus, say
        self.count = 0

    def run(self, group_size: int, fault: ReplicaFault | None) -> tuple[Run, replicas.ReplicaGroups, float]:
        self.count += 1
        label = f"{GROUPS}x{group_size}-{fault.kind if fault else 'reference'}"
        run_dir = self.root / f"replicas-{self.count:02d}-{label}"
        log_path = Path(self.args.log_dir) / f"{run_dir.name}.log" if self.args.log_dir else None
        run = Run(self.corpus, run_dir, self.args.replica_steps, group_size, self.args.replica_timeout, fault,
                  log_path, self.say, seq_len=self.args.replica_seq_len)
        started = time.monotonic()
        supervisor = run.train(timeout_s=180 + 2 * self.args.replica_steps)
        wall = time.monotonic() - started
        self.say(f"  {run_dir.name}: {wall:.0f} s, restarts {[g.restarts for g in supervisor.groups]}, "
                 f"Lighthouse restarts {supervisor.lighthouse.restarts}")
        return run, supervisor, wall

    def drop(self, run: Run) -> None:
        if self.args.keep:
            self.say(f"  kept {run.run_dir}")
        else:
            shutil.rmtree(run.run_dir, ignore_errors=True)

    def layout(self, name: str) -> dict:
        group_size, steps = LAYOUTS[name], self.args.replica_steps
        self.say(f"replicas {name}: reference")
        ref_run, _, ref_wall = self.run(group_size, None)
        records = group_records(str(ref_run.run_dir), 0)
        reference = {"losses": losses(ref_run.run_dir), "parameters": final_parameters(ref_run.run_dir, steps),
                     "step_s": median_gap([r["time"] for r in records])}
        self.drop(ref_run)
        kinds = {}
        for kind in KINDS:
            fault = ReplicaFault(kind, self.args.replica_fault_step, group_size)
            self.say(f"replicas {name}: {kind} at step {fault.step}")
            run, supervisor, wall = self.run(group_size, fault)
            figures = {**measure(run, supervisor, steps), **compare(run.run_dir, reference, self.args.rtol),
                       "wall_s": wall}
            figures.pop("t", None)
            kinds[kind] = {k: r4(v) for k, v in figures.items()}
            self.say(f"  pause {r4(figures.get('pause_s'))} s ({r4(figures.get('pause_steps'))} steps), at the fault "
                     f"{r4(figures.get('fault_gap_s'))} s, lost {figures.get('steps_lost')}, split "
                     f"{figures.get('split_steps')}, back {r4(figures.get('back_s'))} s, match {figures['match']} "
                     f"({figures['compared']})")
            self.drop(run)
        return {"group_size": group_size, "reference_step_s": r4(reference["step_s"]), "reference_wall_s": r4(ref_wall),
                "kinds": kinds}


def goals(layouts: dict) -> dict:
    """Issue 41's targets over every fault: survivors' pause at most 2 step times (and, apart, the gap at the
    fault), no step lost, the fault-free result within rtol, every sample once, the group back; each as a bool and
    the faults that miss it."""
    faults = {f"{name}/{kind}": f for name, lay in layouts.items() for kind, f in lay["kinds"].items()}

    def check(ok) -> dict:
        missed = sorted(k for k, f in faults.items() if not ok(f))
        return {"met": not missed, "missed": missed}

    return {"pause_le_2_steps": check(lambda f: f.get("pause_steps") is not None and f["pause_steps"] <= 2),
            "fault_gap_le_2_steps": check(lambda f: f.get("fault_gap_steps") is not None
                                          and f["fault_gap_steps"] <= 2),
            "steps_lost_0": check(lambda f: f.get("steps_lost") == 0),
            "no_split_steps": check(lambda f: f.get("split_steps") == 0),
            "match_fault_free": check(lambda f: f.get("match") is True),
            "exactly_once": check(lambda f: f.get("exactly_once") is True),
            "back": check(lambda f: f.get("back_s") is not None)}


def run_replicas(args, root: Path, corpus: str, say) -> dict:
    """Every layout in ``args.replica_layouts``; the JSON's figures."""
    bench = ReplicaBench(args, root, corpus, say)
    layouts = {name: bench.layout(name) for name in args.replica_layouts}
    return {"mode": "replicas", "layouts": layouts, "goals": goals(layouts), "steps": args.replica_steps,
            "fault_step": args.replica_fault_step, "seq_len": args.replica_seq_len, "rtol": args.rtol,
            "ft": {**{k: v for k, v in FT.items() if k != "enabled"}, "timeout_s": args.replica_timeout}}

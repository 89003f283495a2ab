"""A Kubeflow PyTorchJob manifest for a training run (training-operator v1).

- one Worker replica per node, each running torchrun's agent with ``procs_per_node`` ranks;
- ``elasticPolicy``: c10d rendezvous, ``nnodes`` fixed to the layout (min = max: the global batch
  is fixed, and any world size resumes from a checkpoint, so a lost pod is replaced rather than
  shrunk around), ``maxRestarts`` for torchrun's in-job restarts;
- ``restartPolicy: OnFailure`` on the pods and ``backoffLimit`` on the job: a failed pod comes back
  and its ranks resume from the newest committed checkpoint;
- the rendezvous service: a headless Service selecting the first worker, so every agent reaches
  the c10d store at ``<name>-rdzv:<port>``;
- the object store credentials come from a Secret (``store_secret``: AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) as environment variables; the token cache and
  ``/dev/shm`` (DCP staging, data loader) are emptyDir volumes.

To stop with a final checkpoint before a deadline, send SIGUSR1 to the ranks (tasks/train/preemption.py).

With ``[train.ft]`` (``spec.replica_groups``): torchft's Lighthouse and an Indexed Job per replica group
instead (``render_replicas``; tasks/train/replica_cluster.py says how a restarted pod knows it is one).
"""

from __future__ import annotations

import yaml

from infra.launch.job import JobSpec, shell_line
from tasks.train.config import ReplicaConfig
from tasks.train.node_launch import TORCHRUN_ENV
from tasks.train.replicas import lighthouse_command

CACHE_DIR = "/var/cache/smelt"


def _header(spec: JobSpec, what: str) -> str:
    return (f"# Rendered by `smelt launch kubernetes` for the run {spec.run_dir}\n# {what}\n"
            f"# kubectl create secret generic {spec.store_secret} --from-literal=AWS_ACCESS_KEY_ID=… "
            "--from-literal=AWS_SECRET_ACCESS_KEY=… --from-literal=AWS_ENDPOINT_URL=…\n")


def _volumes() -> list[dict]:
    return [{"name": "token-cache", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def _mounts() -> list[dict]:
    return [{"name": "token-cache", "mountPath": CACHE_DIR}, {"name": "dshm", "mountPath": "/dev/shm"}]


def _resources(spec: JobSpec) -> dict:
    resources = {"limits": {"nvidia.com/gpu": spec.gpus_per_node}} if spec.gpus_per_node else {}
    if spec.cpus_per_node:
        resources.setdefault("requests", {})["cpu"] = spec.cpus_per_node
    return resources


def _env(spec: JobSpec, **extra: str) -> list[dict]:
    return [{"name": "SMELT_CACHE_DIR", "value": CACHE_DIR},
            *({"name": k, "value": v} for k, v in sorted({**TORCHRUN_ENV, **spec.env, **extra}.items()))]


def render(spec: JobSpec, python: str = "python", ft: ReplicaConfig | None = None) -> str:
    """The manifest (a Service and a PyTorchJob; with ``spec.replica_groups``, ``render_replicas``'s) for
    ``spec``, as YAML."""
    if spec.replica_groups:
        return render_replicas(spec, ft or ReplicaConfig(enabled=True), python)
    service = f"{spec.name}-rdzv"
    cmd = spec.torchrun(spec.name, python)
    container = {
        "name": "pytorch",  # the name the training operator expects
        "image": spec.image,
        "command": ["sh", "-c", 'trap "" USR1; exec ' + shell_line(cmd, service)],
        "env": _env(spec),
        "envFrom": [{"secretRef": {"name": spec.store_secret}}],
        "ports": [{"name": "rdzv", "containerPort": spec.rdzv_port}],
        "resources": _resources(spec),
        "volumeMounts": _mounts(),
    }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {"app": spec.name}},
        "spec": {
            "runPolicy": {"backoffLimit": spec.max_restarts * 4, "cleanPodPolicy": "Running",
                          **({"activeDeadlineSeconds": spec.time_limit_minutes * 60} if spec.time_limit_minutes else {})},
            "elasticPolicy": {"rdzvBackend": "c10d", "rdzvHost": service, "rdzvPort": spec.rdzv_port,
                              "minReplicas": spec.nodes, "maxReplicas": spec.nodes,
                              "nProcPerNode": spec.procs_per_node, "maxRestarts": spec.max_restarts},
            "pytorchReplicaSpecs": {"Worker": {
                "replicas": spec.nodes,
                "restartPolicy": "OnFailure",
                "template": {
                    "metadata": {"labels": {"app": spec.name}},
                    "spec": {
                        "subdomain": service,
                        "containers": [container],
                        "volumes": _volumes(),
                    },
                },
            }},
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "namespace": spec.namespace, "labels": {"app": spec.name}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"training.kubeflow.org/job-name": spec.name,
                              "training.kubeflow.org/replica-type": "worker",
                              "training.kubeflow.org/replica-index": "0"},
                 "ports": [{"name": "rdzv", "port": spec.rdzv_port, "targetPort": spec.rdzv_port}]},
    }
    header = _header(spec, f"{spec.nodes} node(s) × {spec.procs_per_node} rank(s) = world size {spec.world_size}")
    return header + yaml.safe_dump_all([svc, job], sort_keys=False)


def render_replicas(spec: JobSpec, ft: ReplicaConfig, python: str = "python") -> str:
    """``[train.ft]``: torchft's Lighthouse (a Deployment, restarted by Kubernetes when it exits, behind a
    Service) and per replica group an Indexed Job of ``nodes / replica_groups`` pods (one torchrun agent each,
    rendezvous on its pod 0 through the group's headless Service), every pod running ``tasks.train.replica_cluster
    group`` with the launch's id, the Lighthouse's address and its group id."""
    lighthouse = f"{spec.name}-lighthouse"
    labels = {"app": spec.name}
    docs: list[dict] = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": lighthouse, "namespace": spec.namespace,
                                                             "labels": labels},
         "spec": {"selector": {"app": spec.name, "role": "lighthouse"},
                  "ports": [{"name": "lighthouse", "port": spec.lighthouse_port, "targetPort": spec.lighthouse_port}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": lighthouse, "namespace": spec.namespace,
                                                                     "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": spec.name, "role": "lighthouse"}},
                  "template": {"metadata": {"labels": {"app": spec.name, "role": "lighthouse"}},
                               "spec": {"containers": [{
                                   "name": "lighthouse", "image": spec.image,
                                   "command": lighthouse_command(ft, f"0.0.0.0:{spec.lighthouse_port}",
                                                                 binary="torchft_lighthouse"),
                                   "ports": [{"name": "lighthouse", "containerPort": spec.lighthouse_port}]}]}}}},
    ]
    k = spec.nodes_per_group
    for g in range(spec.replica_groups):
        job = f"{spec.name}-g{g}"
        cmd = spec.replica_command("group", python, replica_id=g, nodes=k, procs_per_node=spec.procs_per_node,
                                   rdzv_host=f"{job}-0.{job}", rdzv_port=spec.rdzv_port, launch_id=spec.launch_id)
        container = {"name": "group", "image": spec.image, "command": cmd,
                     "env": _env(spec, TORCHFT_LIGHTHOUSE=f"http://{lighthouse}:{spec.lighthouse_port}",
                                 SMELT_REPLICA_ID=str(g), SMELT_LAUNCH_ID=spec.launch_id),
                     "envFrom": [{"secretRef": {"name": spec.store_secret}}],
                     "ports": [{"name": "rdzv", "containerPort": spec.rdzv_port}],
                     "resources": _resources(spec), "volumeMounts": _mounts()}
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": job, "namespace": spec.namespace,
                                                                         "labels": labels},
                     "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"job-name": job},
                              "ports": [{"name": "rdzv", "port": spec.rdzv_port, "targetPort": spec.rdzv_port}]}})
        docs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": job, "namespace": spec.namespace, "labels": {**labels, "replica": str(g)}},
                     "spec": {"completionMode": "Indexed", "completions": k, "parallelism": k,
                              # a pod's failure is a restart of its group (OnFailure: the same pod, its index kept)
                              "backoffLimit": ft.max_group_restarts * k,
                              **({"activeDeadlineSeconds": spec.time_limit_minutes * 60}
                                 if spec.time_limit_minutes else {}),
                              "template": {"metadata": {"labels": {**labels, "replica": str(g)}},
                                           "spec": {"subdomain": job, "restartPolicy": "OnFailure",
                                                    "containers": [container], "volumes": _volumes()}}}})
    header = _header(spec, f"{spec.replica_groups} torchft replica group(s) × {k} node(s) × {spec.procs_per_node} "
                           f"rank(s), launch {spec.launch_id}; delete the Lighthouse once every group's Job completed:"
                           f" kubectl delete deployment,service -l app={spec.name}")
    return header + yaml.safe_dump_all(docs, sort_keys=False)

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
"""

from __future__ import annotations

import yaml

from infra.launch.job import JobSpec, shell_line
from tasks.train.node_launch import TORCHRUN_ENV

CACHE_DIR = "/var/cache/smelt"


def render(spec: JobSpec, python: str = "python") -> str:
    """The manifest (a Service and a PyTorchJob) for ``spec``, as YAML."""
    service = f"{spec.name}-rdzv"
    cmd = spec.torchrun(spec.name, python)
    resources = {"limits": {"nvidia.com/gpu": spec.gpus_per_node}} if spec.gpus_per_node else {}
    if spec.cpus_per_node:
        resources.setdefault("requests", {})["cpu"] = spec.cpus_per_node
    container = {
        "name": "pytorch",  # the name the training operator expects
        "image": spec.image,
        "command": ["sh", "-c", 'trap "" USR1; exec ' + shell_line(cmd, service)],
        "env": [{"name": "SMELT_CACHE_DIR", "value": CACHE_DIR},
                *({"name": k, "value": v} for k, v in sorted({**TORCHRUN_ENV, **spec.env}.items()))],
        "envFrom": [{"secretRef": {"name": spec.store_secret}}],
        "ports": [{"name": "rdzv", "containerPort": spec.rdzv_port}],
        "resources": resources,
        "volumeMounts": [{"name": "token-cache", "mountPath": CACHE_DIR}, {"name": "dshm", "mountPath": "/dev/shm"}],
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
                        "volumes": [{"name": "token-cache", "emptyDir": {}},
                                    {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
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
    header = (f"# Rendered by `smelt launch kubernetes` for the run {spec.run_dir}\n"
              f"# {spec.nodes} node(s) × {spec.procs_per_node} rank(s) = world size {spec.world_size}\n"
              f"# kubectl create secret generic {spec.store_secret} --from-literal=AWS_ACCESS_KEY_ID=… "
              "--from-literal=AWS_SECRET_ACCESS_KEY=… --from-literal=AWS_ENDPOINT_URL=…\n")
    return header + yaml.safe_dump_all([svc, job], sort_keys=False)

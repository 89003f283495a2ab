"""Cluster launches of the trainer: a Slurm batch script (slurm.py) and a Kubeflow PyTorchJob
manifest (kubernetes.py), both rendered from one JobSpec (job.py) and the same torchrun command
line that local runs use (tasks/train/node_launch.py); submit.py renders and submits for either."""

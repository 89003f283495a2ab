"""prefect.yaml: every deployment's entrypoint names a real flow."""

import importlib
from pathlib import Path

import yaml
from prefect import Flow

ROOT = Path(__file__).resolve().parents[2]


def test_every_deployment_entrypoint_is_a_flow():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    names = []
    for deployment in spec["deployments"]:
        # Module-style (``flows.x:flow``): a file path would put flows/ first on sys.path (DESIGN §8).
        module_name, attr = deployment["entrypoint"].split(":")
        assert "/" not in module_name and not module_name.endswith(".py"), deployment["entrypoint"]
        module = importlib.import_module(module_name)
        assert isinstance(getattr(module, attr), Flow), deployment["entrypoint"]
        names.append(deployment["name"])
    assert {"crawl-to-model", "ingest", "dedup", "tokenize", "train", "eval"} <= set(names)


def test_eval_deployment_is_triggered_by_checkpoint_commits():
    from flows.train import CHECKPOINT_EVENT

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (evaluate,) = [d for d in spec["deployments"] if d["name"] == "eval"]
    assert evaluate["triggers"][0]["expect"] == [CHECKPOINT_EVENT]

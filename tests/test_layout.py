"""The tree's own rules, checked on the files themselves (docs/design.md §1)."""

import ast
import importlib.metadata
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OWN_DISTRIBUTION = "smelt"


def _dependency_top_levels() -> set[str]:
    """Top-level import names of every installed distribution except smelt itself."""
    names: set[str] = set()
    for dist in importlib.metadata.distributions():
        if (dist.metadata["Name"] or "").lower() == OWN_DISTRIBUTION:
            continue
        names |= set((dist.read_text("top_level.txt") or "").split())
        for file in dist.files or []:
            first = file.parts[0]
            if len(file.parts) == 1 and first.endswith(".py"):
                names.add(first.removesuffix(".py"))
            elif len(file.parts) > 1 and first != ".." and not first.endswith((".dist-info", ".data", ".egg-info")):
                names.add(first)
    return names


def _runs_as_script(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def _folders_put_on_sys_path() -> set[Path]:
    """The repo root, every folder holding a script (``python folder/x.py`` puts the folder first on
    sys.path) and every folder of a deployment entrypoint (Prefect loads file entrypoints as scripts)."""
    folders = {REPO}
    for path in REPO.rglob("*.py"):
        if ".venv" not in path.parts and _runs_as_script(path):
            folders.add(path.parent)
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        module = deployment["entrypoint"].split(":")[0]
        folders.add((REPO / module.replace(".", "/")).parent if not module.endswith(".py") else (REPO / module).parent)
    return folders


def test_no_module_on_sys_path_shadows_the_standard_library_or_a_dependency():
    taken = set(sys.stdlib_module_names) | _dependency_top_levels()
    folders = _folders_put_on_sys_path()
    assert {REPO / "flows", REPO / "bench"} <= folders
    clashes = []
    for folder in sorted(folders):
        for entry in folder.iterdir():
            name = entry.stem if entry.suffix == ".py" else entry.name if (entry / "__init__.py").exists() else None
            if name in taken:
                clashes.append(str(entry.relative_to(REPO)))
    assert clashes == [], f"these modules shadow a standard-library or dependency module: {clashes}"


STAGE_PACKAGES = ("ingest", "dedup", "tokenize", "train", "eval", "sample")


def _imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (``from tasks import datasets`` gives ``tasks.datasets``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {f"tasks.{a.name}" for a in node.names} if node.module == "tasks" else {node.module}
    return names


def test_no_stage_package_imports_another_stage():
    """Stages talk through datasets and the shared core (``tasks/*.py``), never through each other;
    the core imports no stage, so no stage reaches another through it."""
    crossings = set()
    for stage in (*STAGE_PACKAGES, None):
        paths = sorted((REPO / "tasks" / stage).rglob("*.py")) if stage else sorted((REPO / "tasks").glob("*.py"))
        for path in paths:
            for name in _imported_modules(path):
                parts = name.split(".")
                if parts[0] == "tasks" and len(parts) > 1 and parts[1] in STAGE_PACKAGES and parts[1] != stage:
                    crossings.add(f"{path.relative_to(REPO)} imports {name}")
    assert sorted(crossings) == [], "stage packages import each other; share through datasets or the core (tasks/*.py)"


def test_tasks_never_import_flows_or_prefect():
    """The work stays plain Python: importable, testable and runnable in a Dask worker without Prefect."""
    offenders = sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in (REPO / "tasks").rglob("*.py")
        for name in _imported_modules(path)
        if name.split(".")[0] in ("flows", "prefect", "prefect_dask")
    )
    assert offenders == []

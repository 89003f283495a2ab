"""The tree's own rules, checked on the files themselves (docs/design.md §1)."""

import ast
import importlib.metadata
import re
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
    """Absolute module names ``path`` imports (``from tasks import contract`` gives ``tasks.contract``)."""
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


# -- import cycles -----------------------------------------------------------------------------------------------

OWN_TOP_LEVELS = ("tasks", "flows", "infra", "bench", "configs", "tests")


def _own_modules() -> dict[str, Path]:
    """Dotted name → file of every module of the repository (a package is its ``__init__.py``)."""
    modules = {}
    paths = [p for top in OWN_TOP_LEVELS for p in (REPO / top).rglob("*.py")] + list(REPO.glob("*.py"))
    for path in paths:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _runtime_imports(path: Path):
    """(line, module, name, level) of every import the file can run, in functions too; not those under
    ``if TYPE_CHECKING:``, which never run."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for statement in block.body for node in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, None, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, node.module or "", alias.name, node.level) for alias in node.names)


def _import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """module → {own module it imports: line of the first such import}. ``from a import b`` names the module
    ``a.b`` where that is one, else ``a``; a bare name is also looked up beside the importing file, as a script
    run from its folder finds its siblings (``bench/``)."""
    modules = _own_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges: dict[str, int] = {}
        for line, module, attr, level in _runtime_imports(path):
            if level:
                candidates = [".".join(package[: len(package) - level + 1] + ([module] if module else []))]
            else:
                candidates = [module, ".".join([*package, module])] if package else [module]
            for candidate in candidates:
                target = f"{candidate}.{attr}" if f"{candidate}.{attr}" in modules else candidate
                if target in modules:
                    if target != name:
                        edges.setdefault(target, line)
                    break
        graph[name] = edges
    return graph, modules


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    cycles = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        while frontier:  # breadth first inside the component: the shortest way back to start
            node = frontier.pop(0)
            for child in sorted(graph[node]):
                if child == start:
                    cycles.append(paths[node] + [start])
                    frontier = []
                    break
                if child in component and child not in paths:
                    paths[child] = paths[node] + [child]
                    frontier.append(child)
    return cycles


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    """The checker itself: a cycle closed only by an import inside a function is still a cycle."""
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 9}, "d": {"a": 1}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from tasks import contract\n")
    assert [(module, name) for _, module, name, _ in _runtime_imports(module)] == [("os", None), ("tasks", "contract")]


def test_no_import_cycle_between_the_repositorys_modules():
    """Every import counts, including one inside a function: such an import only defers a cycle to the first
    call, where the partly initialised module fails, and it hides that the two modules are one. Break a cycle
    by moving what both need to a module both can import."""
    graph, modules = _import_graph()
    assert {"tasks.contract", "flows.cli", "infra.planner"} <= set(graph)
    found = [", ".join(f"{modules[a].relative_to(REPO)}:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:]))
             for cycle in _cycles(graph)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_planner_and_the_typed_config_load_without_torch():
    """`smelt plan` and config validation are arithmetic: importing them must not load torch or safetensors
    (the typed train config once reached both through hf.py, for one init_from check)."""
    import subprocess

    code = ("import sys, infra.planner, infra.commands, tasks.train.config, tasks.branches, tasks.checkpoint_layout; "
            "print(sorted(m for m in ('torch', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# -- module size -------------------------------------------------------------------------------------------------

MAX_LINES = 500
# Modules allowed over MAX_LINES, each with why it is still one module. An entry whose module is back under the
# limit is stale and fails the test, so the list only shrinks.
LONG_MODULES = {
    "tasks/train/trainer.py": "the training loop, read top to bottom in one file like nanoGPT's train.py",
    "tasks/lease.py": "one protocol (acquire, renew, takeover, fencing) whose parts are only correct together",
    "tasks/train/checkpoint_writer.py": "the save protocol (stage, write, commit, retain) around one manager's state",
    "tasks/train/snapshot.py": "the snapshot protocol (local copy, peer replica, restore) around one store's layout",
    "infra/timing.py": "one step-time model whose terms are summed together",
    "infra/planner.py": "search, verdict and verify over one PlanInputs; being changed by another issue this session",
    "bench/chaos.py": "a benchmark: one harness driving the same faults through three recovery paths",
}


def test_no_module_over_500_lines_outside_the_allow_list():
    """Small modules with one job each. Tests are not counted: a test file's length is its cases."""
    lengths = {str(path.relative_to(REPO)): len(path.read_text().splitlines())
               for name, path in _own_modules().items() if not name.startswith("tests")}
    long = sorted(f"{path} ({n} lines)" for path, n in lengths.items() if n > MAX_LINES and path not in LONG_MODULES)
    assert long == [], f"modules over {MAX_LINES} lines: split them by job, or add each to LONG_MODULES with a reason"
    stale = sorted(path for path in LONG_MODULES if lengths.get(path, 0) <= MAX_LINES)
    assert stale == [], f"LONG_MODULES lists modules that are gone or no longer over {MAX_LINES} lines: {stale}"
    assert all(reason.strip() for reason in LONG_MODULES.values())


# -- one home per definition -------------------------------------------------------------------------------------

# Module-level constants that hold the same value in more than one module of tasks/, flows/ and infra/, each with
# why it is not one definition yet. A new pair fails the test: import the constant from its home instead.
SHARED_VALUES = {
    "GB": "a unit, not a setting",
    "POLL_S": "the agent's and the replica supervisor's poll intervals, equal by choice, not by definition",
    "ROLL_RECORDS": "jsonlog's and tb_events' segment sizes, each tuned for its own file",
    "MAD_TO_SIGMA": "a statistical constant; trace reads run folders without importing the trainer",
    "METRICS": "trace and goodput read the trainer's metrics.jsonl without importing torch, which metrics.py does",
    "EVENTS": "trace reads the trainer's files without importing torch (tasks/trace/run.py)",
    "SKIPPED": "trace reads the trainer's files without importing torch (tasks/trace/run.py)",
    "LINEAGE": "trace reads the trainer's files without importing torch (tasks/trace/run.py)",
    "FOLDER": "trace reads the trainer's files without importing torch (tasks/trace/losses.py)",
    "CARRIED": "trace reads tokenize's columns without importing the stage (tasks/trace/documents.py)",
}
# Modules that still compute the checkout's root themselves instead of importing tasks/repo.py's REPO_ROOT.
OWN_REPO_ROOT: dict[str, str] = {}


def _module_constants() -> dict[tuple[str, str], list[str]]:
    """(NAME, value as written) → the modules of tasks/, flows/ and infra/ that assign it at module level."""
    found: dict[tuple[str, str], list[str]] = {}
    for top in ("tasks", "flows", "infra"):
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], (ast.Name, ast.Tuple)):
                    continue
                target, value = node.targets[0], node.value
                pairs = ([(target, value)] if isinstance(target, ast.Name) else
                         zip(target.elts, value.elts) if isinstance(value, ast.Tuple) else [])
                for name, expr in pairs:
                    if isinstance(name, ast.Name) and name.id.isupper() and "TypeVar" not in ast.unparse(expr):
                        found.setdefault((name.id, ast.unparse(expr)), []).append(str(path.relative_to(REPO)))
    return found


def test_a_constant_is_defined_in_one_module():
    """A second copy of a constant drifts from the first (two ASYNC_MODES, two REPO_ROOTs, two tables of GPU
    peaks once did); import it from its home."""
    repeated = {f"{name} = {value}": paths for (name, value), paths in _module_constants().items()
                if len(paths) > 1 and name not in SHARED_VALUES}
    assert repeated == {}, "constants defined in more than one module"
    roots = sorted(str(path.relative_to(REPO)) for top in ("tasks", "flows", "infra") for path in (REPO / top).rglob("*.py")
                   if re.search(r"Path\(__file__\)\.resolve\(\)\.(parents\[\d\]|parent\.parent)", path.read_text()))
    assert sorted(set(roots) - set(OWN_REPO_ROOT)) == ["tasks/repo.py"], "the checkout's root is tasks/repo.py's REPO_ROOT"

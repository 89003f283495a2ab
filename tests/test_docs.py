"""The design map and the README stay true: every test they cite exists, and they cite nothing outside the repo."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("doc", ["docs/design.md", "README.md"])
def test_every_cited_test_exists(doc):
    missing = []
    for path, name in CITED.findall((REPO / doc).read_text()):
        if not (REPO / path).is_file():
            missing.append(path)
        elif name and name not in _test_names(REPO / path):
            missing.append(f"{path}::{name}")
    assert missing == [], f"{doc} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", ["docs/design.md", "README.md"])
def test_docs_point_only_inside_the_repository(doc):
    text = (REPO / doc).read_text()
    assert "../" not in text, f"{doc} links outside the repository"
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not re.match(r"[a-z]+://", link):
            assert (REPO / link).exists(), f"{doc} links to {link}, which is not in the repository"

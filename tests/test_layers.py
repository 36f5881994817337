"""The engine's structure, checked: its layers and the absence of import cycles (import-linter's
contracts in pyproject.toml), imports at the top of every module, and no module importing
another's private names (docs/architecture.md, section 1)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests import layers_picture

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "epochal"


def modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def imports(path: Path):
    return [node for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_the_layers_hold_and_no_module_imports_itself_back():
    linted = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                            capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 broken" in linted.stdout, linted.stdout


def test_every_import_is_at_the_top_of_its_module():
    late = [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
            for path in modules() for node in imports(path) if node.col_offset > 0]
    assert not late, "imports inside functions or classes (move them to the top):\n" + "\n".join(late)


def test_no_module_imports_another_modules_private_names():
    private = [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
               for path in modules() for node in imports(path)
               if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("epochal"))
               and any(alias.name.startswith("_") for alias in node.names)]
    assert not private, "private names imported from another module (make them public or move them):\n" + \
        "\n".join(private)


def test_the_picture_of_the_layers_is_current():
    stale = [str(path.relative_to(ROOT)) for path in layers_picture.DOCUMENTS if layers_picture.stale(path)]
    assert not stale, f"the layers picture in {', '.join(stale)} is stale: python -m tests.layers_picture --write"

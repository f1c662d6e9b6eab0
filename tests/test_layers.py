"""The layers are a checked contract: lint-imports keeps them, and breaks on a wrong arrow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [LINT_IMPORTS, str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (iterative Tarjan)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("lnk", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_layers_contract_is_kept() -> None:
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_transport_imports_nothing_of_lnk_but_its_floor(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "lnk", copy / "lnk", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    legs = copy / "lnk" / "transport" / "legs.py"
    legs.write_text(legs.read_text() + "\nfrom lnk.agents.layout import Machine  # noqa\n")
    r = _lint_imports(copy)
    assert r.returncode != 0
    assert "transport is pipes" in r.stdout and "BROKEN" in r.stdout
    assert "lnk.transport.legs -> lnk.agents.layout" in r.stdout


def test_a_wrong_arrow_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "lnk", copy / "lnk", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    keys = copy / "lnk" / "formats" / "keys.py"
    keys.write_text(keys.read_text() + "\nfrom lnk.runtime.service import status  # noqa\n")
    r = _lint_imports(copy)
    assert r.returncode != 0
    assert "lnk.formats.keys -> lnk.runtime.service" in r.stdout

"""The import rules of docs/architecture.md, checked over every module's AST (lazy imports
inside functions count too): a module that imports across a forbidden line fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (importer prefix, forbidden import prefix, why)
FORBIDDEN = [
    ("data_prep", "agent_rl", "data_prep is the lowest layer (the demos subcommand dispatches by name)"),
    ("data_prep", "retriever_server", "data_prep is the lowest layer"),
    ("retriever_server", "agent_rl", "the retriever never depends on the trainer"),
    ("agent_rl", "retriever_server", "agent_rl reaches the retriever over HTTP only (schemas excepted)"),
    ("agent_rl.training.algos", "agent_rl", "algorithms are pure functions on tensors"),
    ("agent_rl.rollout.reward", "agent_rl", "rewards are plain functions of text"),
    ("agent_rl.rollout.protocol", "agent_rl", "the action protocol is standard library only"),
    ("agent_rl.rollout.tools", "agent_rl", "tools are plain async functions (MCP in mcp_tools)"),
    ("agent_rl.rollout", "agent_rl.training", "rollout knows nothing of the trainer"),
    ("agent_rl.rollout", "agent_rl.coldstart", "rollout knows nothing of cold start"),
    ("agent_rl.rollout", "agent_rl.evaluation", "rollout knows nothing of evaluation"),
    ("agent_rl.training", "agent_rl.coldstart", "RL does not depend on cold start"),
    ("agent_rl.training", "agent_rl.evaluation", "the trainer validates with rollout + reward, not evaluation"),
    ("agent_rl.coldstart", "agent_rl.evaluation", "cold start does not depend on evaluation"),
    *[(pkg, "benchmarks", "nothing imports the benchmarks") for pkg in ("agent_rl", "data_prep", "retriever_server")],
    *[(lib, "agent_rl.demo", "the library knows nothing of the demo that sits above it")
      for lib in ("agent_rl.config", "agent_rl.types", "agent_rl.precision", "agent_rl.rollout", "agent_rl.coldstart",
                  "agent_rl.training", "agent_rl.evaluation")],
]
ALLOWED = {  # (importer prefix, imported prefix): the exceptions the rules name
    ("agent_rl", "retriever_server.schemas"),  # the wire types
    ("agent_rl.demo", "retriever_server.launch"),  # the demo starts the service as a process
    ("agent_rl.training.algos", "agent_rl.training.algos"),  # within the package
    # the pure modules of the rollout: the reward reads the protocol's tags, the protocol offers the tools
    ("agent_rl.rollout.reward", "agent_rl.rollout.protocol"),
    ("agent_rl.rollout.protocol", "agent_rl.rollout.tools"),
}
STDLIB_AND_TORCH_ONLY = ("agent_rl.training.algos", "agent_rl.rollout.reward", "agent_rl.rollout.protocol",
                         "agent_rl.rollout.tools", "data_prep.normalize")  # the reward's normalisation


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in ("agent_rl", "data_prep", "retriever_server"):
        for p in (root / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            out[name] = p
    return out


def imports(path: Path, module: str) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out += [(f"{mod}.{a.name}" if a.name != "*" else mod, node.lineno) for a in node.names]
            out.append((mod, node.lineno))
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for module, path in sorted(modules(root).items()):
        for imported, line in imports(path, module):
            for src, dst, why in FORBIDDEN:
                if not (under(module, src) and under(imported, dst)):
                    continue
                if any(under(module, a) and under(imported, b) for a, b in ALLOWED):
                    continue
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {imported} ({why})")
    return found


def test_no_module_imports_across_a_forbidden_line():
    assert violations() == []


@pytest.mark.parametrize("pkg", STDLIB_AND_TORCH_ONLY)
def test_pure_packages_import_only_stdlib_and_torch(pkg):
    import sys

    allowed_top = set(sys.stdlib_module_names) | {"torch", "__future__"}
    bad = []
    for module, path in modules().items():
        if under(module, pkg):
            for imported, line in imports(path, module):
                top = imported.split(".")[0]
                if top not in allowed_top and not any(under(imported, p) for p in STDLIB_AND_TORCH_ONLY):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {imported}")
    assert bad == []


def test_the_checker_catches_a_violation(tmp_path, monkeypatch):
    """A test that cannot fail is a defect: plant a forbidden import and see it reported."""
    fake = tmp_path / "agent_rl" / "rollout" / "_planted_violation.py"  # a tree of its own: the source stays as it is
    fake.parent.mkdir(parents=True)
    fake.write_text("from agent_rl.training.trainer import RayTrainer\nimport retriever_server.app\n")
    got = violations(tmp_path)
    assert any("_planted_violation.py:1" in v and "agent_rl.training" in v for v in got)
    assert any("_planted_violation.py:2" in v and "retriever_server.app" in v for v in got)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (at the top or inside functions)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for imported, _ in imports(path, module):
            parts = imported.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods), None)
            if target is not None and target != module and not under(module, target):  # a package's own __init__ aside
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_circle_check_finds_a_planted_circle(tmp_path):
    pkg = tmp_path / "agent_rl"
    pkg.mkdir()
    (pkg / "a.py").write_text("from agent_rl.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from agent_rl import a\n")
    assert cycles(import_graph(tmp_path)) == [["agent_rl.a", "agent_rl.b"]]


def entry_point_outside_cli(root: Path = ROOT) -> list[str]:
    """Parsers outside a package's cli.py, and `__main__` modules that do more than call it."""
    found = {}  # where -> what: `from a.b import c` is two imports of one line
    for module, path in sorted(modules(root).items()):
        for imported, line in imports(path, module):
            where = f"{path.relative_to(root)}:{line}"
            if under(imported, "argparse") and not module.endswith(".cli"):
                found[where] = f"{module} imports argparse (parsers live in cli.py)"
            project = imported.split(".")[0] in ("agent_rl", "data_prep", "retriever_server")
            if module.endswith(".__main__") and project and not under(imported, module.removesuffix("__main__") + "cli"):
                found[where] = f"{module} imports more than its cli"
    return [f"{where}: {what}" for where, what in sorted(found.items())]


def test_entry_points_live_in_cli_modules():
    assert entry_point_outside_cli() == []


def test_the_entry_point_check_finds_a_planted_parser(tmp_path):
    pkg = tmp_path / "agent_rl" / "evaluation"
    pkg.mkdir(parents=True)
    (pkg / "evaluate.py").write_text("def main():\n    import argparse\n")
    (pkg / "cli.py").write_text("import argparse\n")
    (pkg / "__main__.py").write_text("from agent_rl.evaluation.evaluate import main\n")
    got = entry_point_outside_cli(tmp_path)
    assert len(got) == 2 and "__main__.py:1" in got[0] and "evaluate.py:2" in got[1]

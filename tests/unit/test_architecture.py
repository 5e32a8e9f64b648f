"""The layout is the architecture, enforced: the import-linter contracts hold (layer order,
a training core without Ray, MLflow or Optuna, benchmarks above raypeft and never imported by
it), no import cycles, short functions, and the training core runs where only torch,
transformers and pydantic (and a few small packages) are installed, as on the GPU benchmark
machines. benchmarks/ keeps the library's rules too: no cycles, functions of at most 80 lines,
no ``sys.path`` edits, a common module that imports no study.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "raypeft"
BENCHMARKS = REPO / "benchmarks"  # a package too, run as python -m benchmarks.<folder>.<study>
MAX_FUNCTION_LINES = 80
# Absent on the GPU machines; the training core must neither import nor need them.
ABSENT_ON_GPU_MACHINES = ("ray", "mlflow", "optuna", "datasets", "sklearn", "scipy")
TRAINING_CORE = ("training", "data", "modeling", "methods", "config", "errors")


def test_import_linter_contracts_are_kept():
    """`lint-imports` (the contracts in pyproject.toml) passes: the layer order, no Ray,
    MLflow or Optuna below tracking, raypeft imports nothing of benchmarks, and benchmarks
    import neither the tests nor pytest."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.is_file(), "import-linter is not installed: pip install -e '.[dev]'"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The raypeft modules ``module`` imports anywhere in its file (function level too)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `from pkg.mod import name` -> pkg.mod
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of ``package`` (raypeft, or benchmarks) and the modules of it it imports."""
    files = {_module_name(p): p for p in package.rglob("*.py")}
    return {m: _imports(p, m, set(files)) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_counting_function_level_imports():
    for package in (PACKAGE, BENCHMARKS):
        graph = import_graph(package)
        # a package's __init__ importing its own submodules, which import each other, is no
        # cycle of concern (the rule of the structure script)
        found = [c for c in cycles(graph) if not all(m.startswith(c[0]) for m in c)]
        assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
    assert "raypeft.config.schema" in import_graph()["raypeft.training.loop"]  # it sees imports


def test_benchmarks_common_imports_no_study():
    """What the studies share depends on none of them (a study imports common, not back)."""
    graph = import_graph(BENCHMARKS)
    assert "benchmarks.common.tables" in graph["benchmarks.search.peer_search"]  # it sees them
    wrong = {
        module: sorted(m for m in imported if not m.startswith("benchmarks.common"))
        for module, imported in graph.items()
        if module.startswith("benchmarks.common")
    }
    assert {m: i for m, i in wrong.items() if i} == {}


def test_every_benchmark_lives_in_a_folder_the_contracts_name():
    """benchmarks/ holds folders (common and one per subject), no study of its own, and the
    import-linter contract that keeps the folders apart names every one of them."""
    loose = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"studies outside a folder: {loose}"
    folders = {p.parent.name for p in BENCHMARKS.glob("*/__init__.py")} - {"common"}
    contracts = (REPO / "pyproject.toml").read_text()
    layer = next(line for line in contracts.splitlines() if "benchmarks.scale |" in line)
    named = {name.strip().removeprefix("benchmarks.") for name in layer.strip(' ",').split("|")}
    assert named == folders


def test_no_function_is_over_80_lines():
    """In raypeft/ and in benchmarks/ alike."""
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *BENCHMARKS.rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(long)


def test_benchmarks_edit_no_sys_path():
    """Benchmarks import raypeft and benchmarks.common as packages (``python -m
    benchmarks.<folder>.<study>`` from the repository root), never by putting folders on
    ``sys.path``."""
    edits = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in sorted(BENCHMARKS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert edits == [], "sys.path used in " + ", ".join(edits)


# Runs in a fresh interpreter where importing any of ABSENT_ON_GPU_MACHINES fails.
_WITHOUT_SEARCH_STACK = """
import importlib, pkgutil, sys
for name in {absent!r}:
    sys.modules[name] = None  # `import name` now raises ImportError

import numpy as np

import raypeft
for package in {core!r}:
    module = importlib.import_module(f"raypeft.{{package}}")
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{{module.__name__}}."):
        importlib.import_module(info.name)

from raypeft.config.schema import ExperimentConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.training.loop import train

S = 16
def split(n, seed):
    # random tokens; the label is the token after [CLS] (as tests/unit/test_train_loop.py)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, S))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    ones = np.ones((n, S), np.int64)
    return dict(input_ids=ids, attention_mask=ones, token_type_ids=0 * ones, labels=labels)

spec = TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy", "macro_f1"))
task = TokenizedTask(spec=spec, label_names=None, splits={{
    "train": split(32, 0), "validation": split(16, 1), "test": split(16, 2)}})
cfg = ExperimentConfig.model_validate({{
    "name": "core", "model": {{"name": "tiny-bert", "max_length": S}},
    "method": {{"name": "pt", "prompt_length": 4}},
    "train": {{"max_steps": 4, "eval_every": 2, "batch_size": 8}}}})
reports = []
best = train(cfg, task, lambda metrics, folder: reports.append(metrics))
assert [r["step"] for r in reports] == [2, 4], reports
assert 0.0 <= best["val_accuracy"] <= 1.0 and 0.0 <= best["val_macro_f1"] <= 1.0, best
loaded = sorted({{m.split(".")[0] for m, v in sys.modules.items() if v is not None}})
assert not set(loaded) & set({absent!r}), loaded
print("trained", best)
"""


def test_training_core_runs_without_ray_mlflow_optuna_datasets_sklearn_scipy():
    """Every module of the training core imports, and a tiny-bert trial trains and
    evaluates, in a process where none of those packages can be imported."""
    script = _WITHOUT_SEARCH_STACK.format(absent=ABSENT_ON_GPU_MACHINES, core=TRAINING_CORE)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "trained" in result.stdout

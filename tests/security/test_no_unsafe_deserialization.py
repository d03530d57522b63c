"""No pickle and no eval/exec on any path that request or model data can reach: every
Python file under core/, plugins/ and sdk/ is parsed (comments and strings do not count)
and any use outside the explicit allow-list below fails, naming the file and line.

Flagged: importing pickle-family modules (pickle, cPickle, cloudpickle, dill, marshal,
shelve, joblib); calling ``eval``, ``exec``, ``compile`` or ``__import__``; ``torch.load``
without ``weights_only=True``; ``yaml.load`` / ``yaml.unsafe_load``; ``numpy.load`` with
``allow_pickle=True``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("core", "plugins", "sdk")
# Tests are not shipped and never see request data.
SKIPPED_PARTS = {"build", ".venv", "__pycache__", "dist", ".eggs", "tests"}
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve"}
BANNED_MODULES |= {"joblib"}
BANNED_CALLS = {"eval", "exec", "compile", "__import__"}
# (path relative to the root, what is allowed, why). Keep it short, and give each entry a
# reason a reviewer can check.
ALLOWED: set[tuple[str, str]] = {
    # Grammar compile workers (issue 17): pickles cross only a private socket pair between
    # the engine process and its own child (no file, no network, no request bytes
    # unpickled: a request's spec is plain JSON data pickled by the engine itself). The
    # engine unpickles the compiled grammar from a worker that runs as the same user with
    # no extra isolation, so trusting it grants nothing that worker does not already have.
    ("core/engine/structured_output/compile_worker.py", "import pickle"),
}


def python_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            if SKIPPED_PARTS.isdisjoint(path.relative_to(ROOT).parts):
                files.append(path)
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _kw_is(call: ast.Call, name: str, value: object) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value == value
        for k in call.keywords
    )


def findings(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in BANNED_MODULES:
                    out.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in BANNED_MODULES:
                out.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if isinstance(node.func, ast.Name) and name in BANNED_CALLS:
                out.append((node.lineno, f"{name}()"))
            elif name.endswith("torch.load") and not _kw_is(node, "weights_only", True):
                out.append((node.lineno, "torch.load without weights_only=True"))
            elif name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load"):
                out.append((node.lineno, f"{name}() (use yaml.safe_load)"))
            elif name in ("np.load", "numpy.load") and _kw_is(node, "allow_pickle", True):
                out.append((node.lineno, "numpy.load(allow_pickle=True)"))
    return out


def test_scanner_catches_each_pattern() -> None:
    source = "\n".join(
        [
            "import pickle",
            "from cloudpickle import loads",
            "eval('1')",
            "exec('x = 1')",
            "torch.load('f')",
            "torch.load('f', weights_only=False)",
            "yaml.load(s)",
            "np.load('f', allow_pickle=True)",
            "model.eval()",  # a method, not the builtin: fine
            "torch.load('f', weights_only=True)",  # fine
            "x = 'eval(1) pickle'",  # a string: fine
        ]
    )
    assert [line for line, _ in findings(ast.parse(source))] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_no_pickle_or_eval_in_the_tree() -> None:
    files = python_files()
    assert len(files) > 50, "the scan found too few files; is ROOT right?"
    problems = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for line, what in findings(tree):
            if (rel, what) not in ALLOWED:
                problems.append(f"{rel}:{line}: {what}")
    assert not problems, "unsafe (de)serialisation or dynamic code:\n" + "\n".join(problems)

"""Render a kustomization of this folder without kubectl: ``python render.py overlays/gpu-1``.

CI runs ``kubectl kustomize`` where it is installed; a machine with PyPI only renders with
this file instead. It implements the subset of kustomize these manifests use, and refuses
anything else (so it never renders differently in silence):

- ``resources``: YAML files (several documents each) or folders with a kustomization;
- ``patches``: ``path`` to a JSON patch (RFC 6902: add, replace, remove) with a ``target``
  of ``kind`` and ``name``.

tests/deploy/test_kubernetes_manifests.py checks that both renderers agree.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
_KEYS = {"apiVersion", "kind", "resources", "patches"}
_PATCH_KEYS = {"path", "target"}
_TARGET_KEYS = {"kind", "name"}


class RenderError(ValueError):
    """The kustomization uses something this renderer does not implement, or is broken."""


def render(folder: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize folder`` would print (order aside)."""
    path = folder / KUSTOMIZATION
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - _KEYS
    if unknown:
        raise RenderError(f"{path}: fields {sorted(unknown)} are not supported by render.py")
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        resource = (folder / entry).resolve()
        if resource.is_dir():
            docs += render(resource)
        else:
            docs += [d for d in yaml.safe_load_all(resource.read_text()) if d is not None]
    for patch in spec.get("patches", []):
        _apply_patch(folder, patch, docs)
    return docs


def _apply_patch(folder: Path, patch: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    target = patch.get("target", {})
    if set(patch) - _PATCH_KEYS or set(target) - _TARGET_KEYS or "path" not in patch:
        raise RenderError(f"{folder}: a patch needs path and target (kind, name) only: {patch}")
    ops = yaml.safe_load((folder / patch["path"]).read_text())
    if not isinstance(ops, list):
        raise RenderError(f"{folder / patch['path']}: only JSON patches (a list of ops)")
    matched = [
        d
        for d in docs
        if d.get("kind") == target.get("kind")
        and d.get("metadata", {}).get("name") == target.get("name")
    ]
    if not matched:
        raise RenderError(f"{folder}: patch {patch['path']} matches no resource ({target})")
    for doc in matched:
        for op in ops:
            apply_op(doc, op)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise RenderError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_op(doc: dict[str, Any], op: dict[str, Any]) -> None:
    """One RFC 6902 operation (add, replace, remove) on ``doc``, in place."""
    *parents, last = _pointer(op["path"])
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    kind = op["op"]
    if kind not in ("add", "replace", "remove"):
        raise RenderError(f"JSON patch op {kind!r} is not supported (add, replace, remove)")
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        else:
            del node[index]
        return
    if kind in ("replace", "remove") and last not in node:
        raise RenderError(f"JSON patch {kind} of {op['path']}: no such member")
    if kind == "remove":
        del node[last]
    else:
        node[last] = copy.deepcopy(op["value"])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python render.py FOLDER (a folder with a kustomization.yaml)")
        return 2
    print(yaml.safe_dump_all(render(Path(argv[0])), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

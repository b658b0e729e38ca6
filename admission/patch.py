"""JSON Patch from the pod the apiserver sent to the mutated pod.

Shaped like the reference's Go differ: objects key by key, arrays index by index, surplus array items
removed from the end (highest index first) and new ones added at the end. Unchanged subtrees are
skipped with C-level equality, so a pod costs little more than the few fields a plugin touched.
We do not use jsonpatch.make_patch here: it walks every field in Python, and its array "move"
optimisation can emit patches that do not apply (see tests/admission/test_properties.py).
jsonpatch applies our patches in the tests.
"""

from __future__ import annotations

from typing import Any


def _escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _diff(path: str, before: Any, after: Any, ops: list[dict[str, Any]]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key, old in before.items():
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
            elif old != after[key]:
                _diff(f"{path}/{_escape(key)}", old, after[key], ops)
        for key, new in after.items():
            if key not in before:
                ops.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": new})
        return
    if isinstance(before, list) and isinstance(after, list):
        for index in range(len(before) - 1, len(after) - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{index}"})
        for index, (old, new) in enumerate(zip(before, after, strict=False)):
            if old != new:
                _diff(f"{path}/{index}", old, new, ops)
        for index in range(len(before), len(after)):
            ops.append({"op": "add", "path": f"{path}/{index}", "value": after[index]})
        return
    ops.append({"op": "replace", "path": path, "value": after})


def make_patch(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Operations that turn `before` into `after`."""
    ops: list[dict[str, Any]] = []
    _diff("", before, after, ops)
    return ops

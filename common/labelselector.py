"""Label and node selector requirements as the API server reads them: metav1.LabelSelector (PodDisruptionBudgets,
volume claims) and the node selector operators (Gt, Lt)."""

from __future__ import annotations

from typing import Any


def requirement_matches(values_of: dict[str, str], key: str, operator: str, values: list[str]) -> bool:
    present = key in values_of
    if operator == "In":
        return present and values_of[key] in values
    if operator == "NotIn":
        return not present or values_of[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(values_of[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def label_selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: None or {} selects everything (callers for which None selects nothing say so)."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(requirement_matches(labels, e.get("key", ""), e.get("operator", ""), e.get("values") or [])
               for e in selector.get("matchExpressions") or [])

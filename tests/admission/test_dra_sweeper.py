"""The template sweeper's decisions (admission/dra/sweeper.py) and its one-sweeper-per-replica lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from admission.dra.sweeper import LAST_REFERENCED_ANNOTATION, TemplateSweeper, decide

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _template(name: str, created_min_ago: float, stamped_min_ago: float | None = None) -> dict:
    metadata: dict = {"name": name, "namespace": "team",
                      "creationTimestamp": (NOW - timedelta(minutes=created_min_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if stamped_min_ago is not None:
        stamp = (NOW - timedelta(minutes=stamped_min_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata["annotations"] = {LAST_REFERENCED_ANNOTATION: stamp}
    return {"metadata": metadata}


def _pod(namespace: str, template: str) -> dict:
    return {"metadata": {"namespace": namespace}, "spec": {"resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": template}]}}


def _names(templates: list[dict]) -> list[str]:
    return [t["metadata"]["name"] for t in templates]


def test_referenced_templates_are_stamped_now_and_then_and_never_deleted() -> None:
    templates = [_template("old-used", 600, 2), _template("old-used-stale", 600, 30), _template("new-used", 1)]
    pods = [_pod("team", name) for name in ("old-used", "old-used-stale", "new-used")]
    decision = decide(templates, pods, NOW, idle_s=3600, stamp_every_s=300)
    assert _names(decision.stamp) == ["old-used-stale"] and decision.delete == []


def test_unreferenced_templates_go_an_hour_after_their_last_reference_or_creation() -> None:
    templates = [_template("fresh", 59), _template("idle", 61), _template("stamped-recently", 600, 59),
                 _template("stamped-long-ago", 600, 61), {"metadata": {"name": "no-times", "namespace": "team"}},
                 _template("same-name-other-namespace", 600)]
    decision = decide(templates, [_pod("elsewhere", "same-name-other-namespace")], NOW, 3600, 300)
    assert _names(decision.delete) == ["idle", "stamped-long-ago", "no-times", "same-name-other-namespace"]


def test_one_process_of_a_replica_sweeps(tmp_path: Path) -> None:
    lock = str(tmp_path / "lock")
    first, second = TemplateSweeper(None, lock_path=lock), TemplateSweeper(None, lock_path=lock)  # type: ignore[arg-type]
    assert first.holds_lock() and not second.holds_lock()
    first.stop()  # the holder is gone: the next round of another takes over
    assert second.holds_lock()
    second.stop()

"""The PromQL of manifests/components/monitoring: every query of the dashboard and the rules, and the metric
names they read (parsed with a real PromQL parser, promql-parser), for the tests that check them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import yaml

from testbed.cluster.manifests import MANIFESTS

COMPONENT = MANIFESTS / "components" / "monitoring"
DASHBOARD = COMPONENT / "dashboard.json"
RULES = COMPONENT / "rules.yaml"
# Grafana fills these in before a query reaches Prometheus; for parsing they get a value of the right type.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$node": ".*"}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def rules_document() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file (`groups:`), as promtool reads it."""
    return rules_document()["spec"]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with the Grafana variables filled in) for every target and query variable."""
    board = dashboard()
    found = []
    for panel in _panels(board["panels"]):
        for target in panel.get("targets") or []:
            found.append((panel["title"], fill_variables(target["expr"])))
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert match, f"dashboard variable {variable['name']}: unexpected query {variable['definition']}"
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def rule_queries() -> list[tuple[str, str]]:
    return [(rule.get("alert") or rule.get("record"), rule["expr"])
            for group in rule_groups()["groups"] for rule in group["rules"]]


def fill_variables(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attribute in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from _walk(child)
    for child in getattr(node, "args", None) or []:
        yield from _walk(child)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (a selector without a name is an error here: we never write one)."""
    found = set()
    for node in _walk(promql_parser.parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr}"
            found.add(node.name)
    return found


def exported_names(samples: set[str]) -> set[str]:
    """Names a query may use given the sample names of a scrape: each sample name, and for histograms and
    summaries the family name too."""
    names = set(samples)
    for sample in samples:
        for suffix in HISTOGRAM_SUFFIXES:
            if sample.endswith(suffix):
                names.add(sample[: -len(suffix)])
    return names

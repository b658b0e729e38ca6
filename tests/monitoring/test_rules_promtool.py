"""The alert rules and the dashboard's queries, checked by Prometheus' own promtool (tools/build-promtool.sh).

`promtool check rules` parses every expression and annotation template; `promtool test rules` runs
fracgpu_alerts_test.yaml, which feeds each alert a broken and a healthy state. The dashboard's queries are
checked the same way, each wrapped in a recording rule. A missing promtool fails these tests, naming the build.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from testbed.cluster.binaries import find_promtool
from testbed.cluster.monitoring import dashboard_queries, metric_names, rule_groups

HERE = Path(__file__).resolve().parent


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(find_promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_rules(path: Path, groups: dict) -> Path:
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def test_promtool_accepts_the_rules_and_their_templates(tmp_path):
    result = promtool("check", "rules", str(write_rules(tmp_path / "rules.yaml", rule_groups())), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_promtool_refuses_a_broken_expression_and_a_broken_template(tmp_path):
    """The check above can fail: one bad expression, one bad template, each is reported."""
    for index, (field, broken) in enumerate((("expr", "sum(rate(x[5m])"), ("summary", "{{ $value | nosuch }}"))):
        groups = copy.deepcopy(rule_groups())
        rule = groups["groups"][0]["rules"][0]
        if field == "expr":
            rule["expr"] = broken
        else:
            rule["annotations"]["summary"] = broken
        result = promtool("check", "rules", str(write_rules(tmp_path / f"broken{index}.yaml", groups)), cwd=tmp_path)
        assert result.returncode != 0, result.stdout
        assert "FAILED" in result.stdout + result.stderr


def test_every_alert_fires_on_its_broken_state_and_only_then(tmp_path):
    groups = copy.deepcopy(rule_groups())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # exp_alerts would have to repeat every rendered text
    write_rules(tmp_path / "rules.yaml", groups)
    shutil.copy(HERE / "fracgpu_alerts_test.yaml", tmp_path)
    result = promtool("test", "rules", "fracgpu_alerts_test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "fracgpu_alerts_test.yaml").read_text()))
    assert tested == {rule["alert"] for group in groups["groups"] for rule in group["rules"]}


def test_a_wrong_expectation_fails_the_rule_tests(tmp_path):
    groups = copy.deepcopy(rule_groups())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            if rule["alert"] == "FracgpuBindFailureRatio":
                rule["expr"] = rule["expr"].replace("> 0.1", "> 0.9")  # 50 % failures no longer alert
    write_rules(tmp_path / "rules.yaml", groups)
    shutil.copy(HERE / "fracgpu_alerts_test.yaml", tmp_path)
    result = promtool("test", "rules", "fracgpu_alerts_test.yaml", cwd=tmp_path)
    assert result.returncode != 0 and "FracgpuBindFailureRatio" in result.stdout + result.stderr


def test_promtool_accepts_every_dashboard_query(tmp_path):
    queries = dashboard_queries()
    rules = [{"record": f"fracgpu:dashboard_query_{index}", "expr": expr} for index, (_, expr) in enumerate(queries)]
    path = write_rules(tmp_path / "dashboard.yaml", {"groups": [{"name": "dashboard", "rules": rules}]})
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_metric_names_come_from_a_real_parse():
    assert metric_names('histogram_quantile(0.9, sum by (le) (rate(a_bucket{job="x", le!="1"}[5m])))'
                        ' / on (job) group_left b + absent(c == 1) + deriv(sum(d)[15m:1m]) - e offset 5m') == {
        "a_bucket", "b", "c", "d", "e"}

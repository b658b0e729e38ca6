"""`make test`'s last lines: the failed and errored tests of each JUnit report (testbed/failures.py)."""

from __future__ import annotations

from pathlib import Path

from testbed.failures import main

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" tests="3">
<testcase classname="tests.apiserver.test_dra_objects" name="test_slice[a]" time="1.0">
  <error message="failed on teardown with &quot;ApiError: 404&quot;&#10;more">trace</error></testcase>
<testcase classname="tests.binder.test_x" name="test_ok" time="0.1"/>
<testcase classname="tests.binder.test_x" name="test_bad" time="0.1"><failure message="assert 1 == 2">t</failure>
</testcase></testsuite></testsuites>"""


def test_each_failed_or_errored_test_on_a_line_and_missing_or_broken_reports_said(tmp_path: Path, capsys) -> None:
    whole, clean, broken = tmp_path / "whole.xml", tmp_path / "compat.xml", tmp_path / "broken.xml"
    whole.write_text(REPORT)
    clean.write_text('<testsuites><testsuite><testcase classname="tests.a" name="test_a"/></testsuite></testsuites>')
    broken.write_text("<testsuites>")
    assert main([str(whole), str(clean), str(tmp_path / "absent.xml"), str(broken)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        f"{whole}: 2 failed or errored",
        '  ERROR tests/apiserver/test_dra_objects.py::test_slice[a] - failed on teardown with "ApiError: 404"',
        "  FAILED tests/binder/test_x.py::test_bad - assert 1 == 2"]
    assert lines[3] == f"{clean}: no failure"
    assert lines[4] == f"{tmp_path / 'absent.xml'}: no report (the run did not get that far)"
    assert lines[5].startswith(f"{broken}: unreadable report")

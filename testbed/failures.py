"""`python -m testbed.failures REPORT.xml ...`: the tests that failed or errored in pytest's JUnit reports, one line
each, printed last by `make test`. The whole suite's own summary scrolls away under the compatibility run's output,
and a CI log that keeps only its tail would otherwise not say which test broke."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path


def failures(report: Path) -> list[str]:
    """`FAILED <id>` / `ERROR <id>` for each test case of the report that failed or errored."""
    found = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        test_id = "::".join(part for part in (case.get("classname", "").replace(".", "/") + ".py",
                                               case.get("name", "")) if part)
        for kind, word in (("failure", "FAILED"), ("error", "ERROR")):
            if case.find(kind) is not None:
                message = (case.find(kind).get("message") or "").splitlines()  # type: ignore[union-attr]
                found.append(f"{word} {test_id}" + (f" - {message[0][:200]}" if message else ""))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    for path in map(Path, argv if argv is not None else sys.argv[1:]):
        if not path.is_file():
            print(f"{path}: no report (the run did not get that far)")
            continue
        try:
            lines = failures(path)
        except ElementTree.ParseError as error:
            print(f"{path}: unreadable report ({error})")
            continue
        print(f"{path}: " + (f"{len(lines)} failed or errored" if lines else "no failure"))
        for line in lines:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

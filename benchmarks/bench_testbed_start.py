"""What the loopback policy (testbed/cluster/loopback_policy.py) adds to a test-bed control-plane start.

    python benchmarks/bench_testbed_start.py [--starts 5]

Alternates `ControlPlane().start()` with the policy and with it left out (`--starts` times each, so load drift
hits both alike) and prints the median, min and max start time of each, and of the wait for enforcement
(`ControlPlane.loopback_policy_seconds`). docs/testing.md records the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.cluster.controlplane import ControlPlane  # noqa: E402


class WithoutPolicy(ControlPlane):
    def _install_loopback_policy(self) -> None:  # the start as it was before the policy
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"with the policy": [], "without": [], "of which the policy": []}
    for _ in range(args.starts):
        for kind, label in ((ControlPlane, "with the policy"), (WithoutPolicy, "without")):
            started = time.monotonic()
            plane = kind().start()
            times[label].append(time.monotonic() - started)
            if kind is ControlPlane:
                times["of which the policy"].append(plane.loopback_policy_seconds)
            plane.stop()
    print("| start | median | min | max |\n|---|---|---|---|")
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.2f} s | {min(values):.2f} s | {max(values):.2f} s |")


if __name__ == "__main__":
    main()

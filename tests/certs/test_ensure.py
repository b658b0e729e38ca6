"""`ensure` and `verify` against an in-memory stand-in for the API (the real one: tests/apiserver/test_certs*)."""

from __future__ import annotations

import base64
import copy
import datetime
from typing import Any

from certs import checks, plan
from certs.ensure import Target, ensure, verify
from certs.kube import MUTATING, VALIDATING

TARGET = Target()
LIFETIMES = plan.Lifetimes()


class FakeApi:
    """Secrets and webhook configurations in dicts; records every write in order."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.configurations = {
            (MUTATING, TARGET.mutating): {"webhooks": [{"name": "m", "clientConfig": {"service": {}}}]},
            (VALIDATING, TARGET.validating): {"webhooks": [{"name": "v", "clientConfig": {"service": {}}}]},
        }
        self.writes: list[str] = []

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.secrets.get(name))

    def save_secret(self, namespace: str, name: str, body: dict[str, Any], exists: bool) -> None:
        assert (name in self.secrets) == exists
        self.secrets[name] = copy.deepcopy(body)
        self.writes.append(f"secret {name}")

    def read_webhook_configuration(self, resource: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.configurations[(resource, name)])

    def patch_webhook_configuration(self, resource: str, name: str, operations: list[dict[str, Any]]) -> None:
        configuration = self.configurations[(resource, name)]
        for operation in operations:
            if operation["op"] == "add":
                index = int(operation["path"].split("/")[2])
                configuration["webhooks"][index]["clientConfig"]["caBundle"] = operation["value"]
        self.writes.append(f"patch {name}")


def bundle_of(api: FakeApi, resource: str, name: str) -> bytes:
    return base64.b64decode(api.configurations[(resource, name)]["webhooks"][0]["clientConfig"]["caBundle"])


def test_first_run_writes_ca_before_serving_secret_then_both_bundles():
    api = FakeApi()
    report = ensure(api, TARGET, LIFETIMES)
    assert report.ok, report.problems
    assert api.writes == [f"secret {TARGET.ca_secret}", f"secret {TARGET.secret}",
                          f"patch {TARGET.mutating}", f"patch {TARGET.validating}"]
    ca = base64.b64decode(api.secrets[TARGET.ca_secret]["data"]["ca.crt"])
    assert bundle_of(api, MUTATING, TARGET.mutating) == ca == bundle_of(api, VALIDATING, TARGET.validating)
    serving = base64.b64decode(api.secrets[TARGET.secret]["data"]["tls.crt"])
    assert serving != ca and api.secrets[TARGET.secret]["type"] == "kubernetes.io/tls"
    checks.verify_chain(ca, serving, TARGET.hosts, datetime.datetime.now(datetime.UTC))


def test_second_run_changes_nothing():
    api = FakeApi()
    ensure(api, TARGET, LIFETIMES)
    api.writes.clear()
    report = ensure(api, TARGET, LIFETIMES)
    assert report.ok and report.actions == [] and api.writes == []


def test_renewal_window_reissues_the_leaf_and_keeps_the_bundle():
    api = FakeApi()
    ensure(api, TARGET, LIFETIMES)
    bundle = bundle_of(api, MUTATING, TARGET.mutating)
    old_leaf = api.secrets[TARGET.secret]["data"]["tls.crt"]
    api.writes.clear()
    report = ensure(api, TARGET, LIFETIMES, now=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=340))
    assert api.writes == [f"secret {TARGET.secret}"]
    assert api.secrets[TARGET.secret]["data"]["tls.crt"] != old_leaf
    assert bundle_of(api, MUTATING, TARGET.mutating) == bundle
    assert any("renewal window" in action for action in report.actions)


def test_verify_reports_a_leaf_put_into_cabundle_by_hand():
    api = FakeApi()
    ensure(api, TARGET, LIFETIMES)
    leaf = api.secrets[TARGET.secret]["data"]["tls.crt"]
    api.configurations[(VALIDATING, TARGET.validating)]["webhooks"][0]["clientConfig"]["caBundle"] = leaf
    problems = verify(api, TARGET).problems
    assert len(problems) == 1 and "not a CA certificate" in problems[0] and TARGET.validating in problems[0]
    assert ensure(api, TARGET, LIFETIMES).ok  # and ensure repairs it
    assert api.writes[-1] == f"patch {TARGET.validating}"

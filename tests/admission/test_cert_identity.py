"""Which serving certificate is in use, logged on every load with its serial, notAfter and names, and the
expiry warnings at 30, 7 and 1 days (then expired), logged once each even when the files never change."""

from __future__ import annotations

import datetime
import logging
import ssl

import pytest

from admission import tlsreload
from admission.tlsreload import ReloadingContext
from certs.pki import generate_directory
from common import identity

NOW = datetime.datetime.now(datetime.UTC)


@pytest.mark.parametrize(("days", "threshold"), [
    (400, None), (30, None), (29.9, 30), (7.5, 30), (6.9, 7), (1.0, 7), (0.5, 1), (0, 0), (-3, 0)])
def test_expiry_thresholds(days, threshold):
    assert identity.expiry_threshold(days) == threshold


def test_fields_name_the_certificate(tmp_path):
    _, serving = generate_directory(str(tmp_path), ["webhook.ns.svc", "10.0.0.1"], days=90)
    certificate = serving.certificate
    fields = identity.fields(certificate, NOW)
    assert fields["serial"] == f"{certificate.serial_number:x}"
    assert fields["sans"] == ["webhook.ns.svc", "10.0.0.1"]
    assert fields["not_after"] == certificate.not_valid_after_utc.isoformat()
    assert 89.9 < fields["days_left"] <= 90
    assert fields["issuer"] == "CN=fracgpu-webhook-ca"


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage()) for record in caplog.records if record.name == "admission.tls"]


def test_each_load_is_logged_with_the_identity_and_warnings_come_once_per_threshold(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="admission.tls")
    monkeypatch.setattr(tlsreload, "_RECHECK_SECONDS", 0.0)
    _, serving = generate_directory(str(tmp_path), ["127.0.0.1"], days=20)
    clock = [NOW]
    monkeypatch.setattr(tlsreload, "_utcnow", lambda: clock[0])
    context = ReloadingContext(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    context.get()
    loaded = [r for r in caplog.records if r.getMessage().startswith("serving certificate loaded: serial")]
    assert len(loaded) == 1
    assert loaded[0].fields["serial"] == f"{serving.certificate.serial_number:x}"
    assert loaded[0].fields["sans"] == ["127.0.0.1"] and loaded[0].fields["cert"] == str(tmp_path / "tls.crt")
    assert [level for level, _ in messages(caplog)] == ["INFO", "WARNING"]  # under 30 days already
    assert "under 30 days" in messages(caplog)[1][1]

    caplog.clear()
    context.get()  # nothing changed: nothing logged
    assert messages(caplog) == []
    clock[0] = NOW + datetime.timedelta(days=14)  # 6 days left
    context.get()
    context.get()
    assert [(level, "under 7 days" in text) for level, text in messages(caplog)] == [("WARNING", True)]
    caplog.clear()
    clock[0] = NOW + datetime.timedelta(days=21)
    context.get()
    assert [level for level, _ in messages(caplog)] == ["ERROR"]
    assert "has expired" in messages(caplog)[0][1]


def test_a_pair_that_does_not_load_is_logged_once_until_the_files_change(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="admission.tls")
    monkeypatch.setattr(tlsreload, "_RECHECK_SECONDS", 0.0)
    generate_directory(str(tmp_path / "a"), ["127.0.0.1"])
    generate_directory(str(tmp_path / "b"), ["127.0.0.1"])
    (tmp_path / "a" / "tls.key").write_bytes((tmp_path / "b" / "tls.key").read_bytes())
    context = ReloadingContext(str(tmp_path / "a" / "tls.crt"), str(tmp_path / "a" / "tls.key"))
    for _ in range(3):
        with pytest.raises(ssl.SSLError):
            context.get()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "does not load" in errors[0].getMessage()
    assert "KEY_VALUES_MISMATCH" in errors[0].fields["error"]
    # Fixed: the next load is logged with the identity of the certificate now served.
    generate_directory(str(tmp_path / "a"), ["127.0.0.1"])
    context.get()
    assert any(r.getMessage().startswith("serving certificate loaded: serial") for r in caplog.records)

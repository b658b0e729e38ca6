"""Each test starts with a full refusal rate limit: denials logged by earlier tests (hypothesis sends
thousands) must not decide whether this test's refusal is logged."""

import pytest

from admission import review
from common.logs import RateLimit


@pytest.fixture(autouse=True)
def fresh_refusal_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(review, "_refusals", RateLimit(review.REFUSALS_PER_SECOND, review.REFUSALS_BURST))

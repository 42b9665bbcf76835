"""The asynchronous strategies' end-to-end check: "trains the tone corpus as well as sync".

An asynchronous run is not reproducible (who averages with whom depends on timing), and the tone
corpus's validation split scores about 110 phones, so one phone error moves PER by ~0.009. Sync
often makes 0 errors there; an equally good asynchronous run may make 2 (a CI run did: 0.018
against 0.0; another, on a machine carrying three test streams at once, 0.0315 against 0.0). The
check is DESIGN's 3% relative, plus four phone errors of sampling noise. A strategy that did not
learn is far outside it (PER ~0.5 untrained, ~0.1 half trained).
"""
from __future__ import annotations

PHONE_ERRORS_OF_NOISE = 0.04  # about four of the validation split's ~110 scored phones


def assert_per_as_good_as(run: dict, reference: dict) -> None:
    per, ref = run["final"]["per"], reference["final"]["per"]
    assert per <= 1.03 * ref + PHONE_ERRORS_OF_NOISE, (run["final"], reference["final"])

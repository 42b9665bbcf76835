"""The native build's lock handling (asrdist/native): cpp_extension creates and removes
`<build dir>/lock` on every load, so learners loading the same kernel at once see it come and go."""
from __future__ import annotations

import os
import time

import asrdist.native as native


def test_a_lock_that_another_process_just_released_is_no_error(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    lock.touch()
    real_stat = type(lock).stat

    def released_meanwhile(self, *args, **kwargs):  # the other learner's load ends between our looks
        if self == lock:
            self.unlink()
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(type(lock), "stat", released_meanwhile)
    native._clear_stale_lock(lock)
    assert not lock.exists()


def test_only_a_lock_older_than_any_build_is_removed(tmp_path):
    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    fresh.touch()
    stale.touch()
    old = time.time() - native.STALE_LOCK_SECONDS - 60
    os.utime(stale, (old, old))
    native._clear_stale_lock(fresh)
    native._clear_stale_lock(stale)
    native._clear_stale_lock(tmp_path / "never-made")
    assert fresh.exists() and not stale.exists()

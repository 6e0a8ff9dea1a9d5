"""The payloads an env gets are new files: the scratch purge (and `envbuilder list`'s days left) go by the oldest
access time in the env, so a copy must not carry the installed file's times."""

from __future__ import annotations

import os
import stat
import time

from envbuilder.payloads import _deploy
from envbuilder.system import purge


def test_an_env_s_payloads_have_fresh_times_and_their_modes(tmp_path, monkeypatch):
    src = tmp_path / "installed"
    src.mkdir()
    (src / "check.py").write_text("OK = True\n")
    (src / "pin.sh").write_text("#!/bin/sh\n")
    (src / "__init__.py").write_text("")
    # Read 20 hours ago, written three days ago. (Under relatime a read leaves an access time alone while it is
    # under a day old and newer than the file's ctime: so a copy2 of the installed file kept its 20-hour-old access
    # time, and a new env's oldest file was nearly a day old. utime sets the ctime to now, so here the read that
    # copies refreshes the access time anyway; the write time shows whether the times were carried over.)
    now = time.time()
    for f in src.iterdir():
        os.utime(f, (now - 20 * 3600, now - 3 * 86400))
    monkeypatch.setattr(_deploy, "DIR", src)  # the package's payload directory, here a copy with old times
    prefix = tmp_path / "env"
    dest = _deploy.into_env(prefix)
    assert sorted(p.name for p in dest.iterdir()) == ["check.py", "pin.sh"]
    oldest, which = purge.oldest_access(prefix)
    assert oldest is not None and oldest > time.time() - 600, which
    assert all(p.stat().st_mtime > time.time() - 600 for p in dest.iterdir())
    assert stat.S_IMODE((dest / "pin.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "check.py").stat().st_mode) == 0o644

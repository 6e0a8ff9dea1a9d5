"""Inventory payload, run by the env's own python: its installed distributions as JSON on stdout.

Each entry: name, version, installer, whether it lives inside the env (argv[1]) or comes from a base/parent
environment, and the sha256 of its RECORD file (a fingerprint of exactly what was installed). Stdlib only.
"""

import hashlib
import json
import os
import sys
from importlib import metadata


def main(prefix):
    prefix = os.path.realpath(prefix)
    seen = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = name.lower().replace("_", "-")
        if key in seen:  # the first on sys.path wins, as for imports
            continue
        location = os.path.realpath(str(dist.locate_file("")))
        record = dist.read_text("RECORD")
        installer = (dist.read_text("INSTALLER") or "").strip() or None
        seen[key] = {
            "name": name,
            "version": dist.version,
            "installer": installer,
            "in_env": location == prefix or location.startswith(prefix + os.sep),
            "record_sha256": hashlib.sha256(record.encode()).hexdigest() if record else None,
        }
    json.dump(sorted(seen.values(), key=lambda d: d["name"].lower()), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

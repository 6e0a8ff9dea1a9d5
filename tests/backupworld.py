"""What the backup tests (test_backup.py, test_backup_torch.py) share: their recipes, the wheels of their index
(the machine's CPU torch and small test wheels built here), a user's world with a backup root, and the packages'
digests."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

from helpers import UserWorld
from wheelindex import build_wheel, demo_wheels, mirror_env

from envbuilder.backup import wheelhouse

TORCH_RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
[torch]
version = "latest"
variant = "auto"
packages = ["torch"]
[[packages]]
name = "numpy"
[[packages]]
name = "ebdata"
spec = "ebdata==1.0"
[[packages]]
name = "ebtool"
spec = "ebtool==1.0"
[filesystems.scratch]
path = "${{SCRATCH}}"
purge_days = 10
touch_allowed = false
notes = "touching files to dodge the purge is prohibited"
"""

SMALL_RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "{installer}"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
[torch]
install = false
{packages}
[filesystems.scratch]
path = "${{SCRATCH}}"
purge_days = 30
touch_allowed = {touch}
"""


def packages(*specs: str) -> str:
    return "".join(f'[[packages]]\nname = "{s.split("==")[0]}"\nspec = "{s}"\n' for s in specs)


def backup_files(d: Path, torch_files: Path) -> Path:
    """The index's files in ``d``: links to ``torch_files`` and the small test wheels."""
    for f in torch_files.iterdir():
        (d / f.name).symlink_to(f)
    demo_wheels(d)
    build_wheel(d, "ebdemo", "2.0", {"ebdemo/__init__.py": "VERSION = '2.0'\n"}, requires=["ebdep"])
    build_wheel(
        d,
        "ebdata",
        "1.0",
        {"ebdata/__init__.py": ""},
        data={
            "data/share/ebdata/table.txt": "row 1\nrow 2\n",
            "scripts/ebdata-run": "#!python\nimport sys\nprint('ebdata-run in', sys.prefix)\n",
        },
    )
    # 2 MB that does not compress: a package whose bytes show in the store's size.
    blob = random.Random(7).randbytes(2_000_000).hex()  # noqa: S311 - test data, not a secret
    build_wheel(d, "ebbig", "1.0", {"ebbig/__init__.py": "", "ebbig/blob.txt": blob})
    return d


class World(UserWorld):
    def __init__(self, root: Path, index: Any) -> None:
        self.work = root / "work"
        super().__init__(root, mirror_env(index), WORK=str(self.work))
        self.backups = self.work / "envbuilder" / "backups"

    def small(self, name: str, *specs: str, installer: str = "uv", touch: str = "false") -> str:
        text = SMALL_RECIPE.format(name=name, installer=installer, packages=packages(*specs), touch=touch)
        return self.write_recipe(name, text)

    def torch(self, name: str) -> str:
        return self.write_recipe(name, TORCH_RECIPE.format(name=name))

    def prefix(self, name: str) -> Path:
        return self.scratch / "envs" / name

    def store_bytes(self) -> int:
        """The bytes of the stored wheels (not the digests remembered beside them, .NAME.sha256)."""
        return sum(p.stat().st_size for p in (self.backups / "store").glob("*/[!.]*") if p.is_file())

    def python(self, name: str, code: str, prefix: Optional[Path] = None) -> str:
        py = (prefix or self.prefix(name)) / "bin" / "python"
        res = subprocess.run(
            [str(py), "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
        )
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()


def digests(prefix: Path) -> dict[str, str]:
    return {d.key: d.digest for d in wheelhouse.scan(prefix)}


# Portable archives (test_backup_portable*.py)

#: What unpack.sh may use: the system's tools, nothing of this checkout (no envbuilder, no test venv).
BARE_PATH = "/usr/bin:/bin"


def bare_env(home: Path) -> dict[str, str]:
    env = {"PATH": BARE_PATH, "HOME": str(home), "PYTHONPATH": "", "LC_ALL": "C"}
    assert shutil.which("envbuilder", path=BARE_PATH) is None
    return env


def pack(w: UserWorld, name: str, out: Path) -> Any:
    data = w.data("backup", name, "--portable", "-o", str(out))
    assert Path(data["path"]) == out and out.is_file()
    return data


def extract(archive: Path, into: Path) -> Path:
    into.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(into)], check=True, env={"PATH": BARE_PATH})
    return into


def unpack(kit: Path, target: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(kit / "unpack.sh"), target],
        capture_output=True,
        text=True,
        env=bare_env(home),
        timeout=600,
    )

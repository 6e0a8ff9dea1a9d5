"""The names of the forms envbuilder writes things in, where the command line offers them as choices: modulefile
languages, backup modes and backup archive formats. Their one home: ``render.modulefile`` and ``backup`` read them
from here, and so do ``--format`` and ``--mode``, whose help and completion then import nothing that writes."""

from __future__ import annotations

#: The modulefile languages, the first the default: Lua for Lmod, Tcl for Environment Modules (and Lmod).
MODULEFILE_FORMATS = ("lua", "tcl")

#: A backup holds an env's wheels (once each, shared by every backup: venvs), the env itself as an archive, or a
#: container env's image file as it is (``image``).
BACKUP_MODES = ("wheelhouse", "archive", "image")

#: The archive of an archive-mode backup: a tar (compressed with zstd where it is found) or a squashfs image.
BACKUP_FORMATS = ("tar", "squashfs")

#: A site mirror's layout (``envbuilder mirror``), the first the default: a PEP 503 tree or a flat wheelhouse.
MIRROR_LAYOUTS = ("simple", "wheelhouse")

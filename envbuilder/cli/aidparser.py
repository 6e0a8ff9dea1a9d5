"""The grammar of the first-aid commands (what an env's launch needs from an allocation, what a failed job's
output means); :mod:`envbuilder.cli.parser` registers them in the order ``--help`` lists them."""

from __future__ import annotations

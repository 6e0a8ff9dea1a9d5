"""Shells: one adapter module per shell (``posix``, ``fish``, ``csh``) and the registry every other module asks
(:mod:`envbuilder.core.shells.registry`). See ``docs/architecture.md``."""

"""Envs at job scale: :mod:`.image` packs an env into one squashfs image used from node-local storage, and
:mod:`.staging` copies it to every node of an allocation through the scheduler's own broadcast."""

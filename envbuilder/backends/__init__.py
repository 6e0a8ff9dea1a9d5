"""How an env is built. ``registry`` names every env kind, installer and conda engine (the schema, the CLI, the plan
and create read it); ``base`` is the backend protocol and the Build it works in; ``venv`` (venv, overlay,
user-prefix) and ``conda`` (conda, and the overlay clone) are the backends; ``installers`` are uv, virtualenv and
pip; ``rattler_engine`` is the embedded conda engine. ``buildlog`` runs and logs each command, ``uvcache`` sets
uv up, ``torchbuild`` checks an installed torch is the planned build, ``smoke`` tries it once in place, and
``activation`` writes the rendered activate scripts into an env (for create and restore too).

Where to add: an installer, a class in ``installers``; a conda engine, ``registry`` (and ``conda.engine_argv`` if
it does not take conda's command line); an env kind, a backend class and its ``Kind`` in ``registry.KINDS``."""

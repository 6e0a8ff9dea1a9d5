"""How an env is built. The names of every env kind, installer and conda engine live in ``core.kinds``;
``lookup`` gives the backend class of a kind; ``base`` is the backend protocol and the Build it works in; ``venv``
(venv, overlay, user-prefix) and ``conda`` (conda, and the overlay clone) are the backends; ``installers`` finds uv,
virtualenv and pip here; ``rattler_engine`` is the embedded conda engine. ``buildlog`` runs and logs each command,
``uvcache`` sets uv up, ``torchbuild`` checks an installed torch is the planned build, ``smoke`` tries it once in
place, and ``activation`` writes the rendered activate scripts into an env (for create and restore too).

Where to add: an installer, its command lines in ``plan.installers``, a class here in ``installers`` and its
name in ``core.kinds.INSTALLER_NAMES``; a conda engine, ``core.kinds`` (and ``conda.engine_argv`` if it does not take
conda's command line); an env kind, a backend class and its ``Kind`` in ``core.kinds.KINDS``."""

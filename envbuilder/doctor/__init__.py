"""`envbuilder doctor`: what is wrong with the recorded envs on this node (or on the node a facts file describes),
and how to fix each thing.

The checks are pure: each takes records, host facts, the environment mapping and what the index said, and returns
findings. What they need from the file system and from processes is gathered first, in :mod:`.collect`, which
is the only module here that does I/O. The rest, by concern: :mod:`.findings` (the result type and its
severities), :mod:`.replan` (the recipe planned again, the env's python), :mod:`.libraries` (CUDA libraries
shadowed from outside the env), :mod:`.index_checks` (table age, nightly pins, locks against the index) and
:mod:`.report` (health and purge, one env's checks, the whole report).

``envbuilder explain`` (what a failed job's output means) lives here too, as first aid beside the doctor: the
signature registry's format and matching (:mod:`.signatures`, pure), the explanation tied to an env
(:mod:`.explanation`, pure) and what it reads (:mod:`.jobs`: the registry's files, a log, a scheduler's record of a
job, the env's record and torch).

This file only describes the package: it imports none of its modules, so that importing a pure one (``report``,
say) does not bring in ``collect`` and its processes (tests/unit/test_startup.py). Callers import the module
that holds what they use.
"""

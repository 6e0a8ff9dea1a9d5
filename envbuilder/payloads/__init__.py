"""Scripts run by the *env's* python under a launcher. Standard library only at import; torch inside checks.

The package's face: ``_deploy`` (envbuilder's own module here, never copied into an env) says where the payloads
are and copies them into an env or a run directory.
"""

from envbuilder.payloads._deploy import DIR, copy_to, into_env

__all__ = ["DIR", "copy_to", "into_env"]

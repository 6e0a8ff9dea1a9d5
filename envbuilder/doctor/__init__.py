"""`envbuilder doctor`: what is wrong with the recorded envs on this node (or on the node a facts file describes),
and how to fix each thing.

The checks are pure: each takes records, host facts, the environment mapping and what the index said, and returns
findings. What they need from the file system and from processes is gathered first, in :mod:`.collect`, which
is the only module here that does I/O. The rest, by concern: :mod:`.findings` (the result type and its
severities), :mod:`.replan` (the recipe planned again, the env's python), :mod:`.libraries` (CUDA libraries
shadowed from outside the env), :mod:`.index_checks` (table age, nightly pins, locks against the index) and
:mod:`.report` (health and purge, one env's checks, the whole report).

The names below are the package's interface; the command and the tests use them as ``doctor.<name>``.
"""

from __future__ import annotations

from envbuilder.doctor.collect import (
    env_lib_dirs,
    gather,
    listdir,
    load_recipe,
    python_state,
    read_indexes,
    read_records,
)
from envbuilder.doctor.findings import ACTION, INFO, NODE, SEVERITIES, WARNING, Finding, ordered
from envbuilder.doctor.index_checks import (
    NIGHTLY_OLD_DAYS,
    TABLE_OLD_DAYS,
    TABLE_ROW_OLD_DAYS,
    TORCH_FAMILY,
    lock_findings,
    lock_index_urls,
    lock_upstreams,
    nightly_findings,
    table_findings,
    table_row_findings,
    torch_upstreams,
)
from envbuilder.doctor.libraries import (
    CUDA_LIBRARIES,
    LibraryLoad,
    activation_env,
    activation_module_findings,
    cuda_modules,
    library_findings,
    library_loads,
    node_library_findings,
    own_libraries,
    split_path_list,
    wheel_versions,
)
from envbuilder.doctor.replan import PythonState, facts_for_env, python_findings, replan_findings
from envbuilder.doctor.report import (
    PURGE_SOON_DAYS,
    Context,
    EnvInputs,
    Report,
    check_env,
    examine,
    safety_findings,
)

__all__ = [
    "ACTION",
    "CUDA_LIBRARIES",
    "INFO",
    "NIGHTLY_OLD_DAYS",
    "NODE",
    "PURGE_SOON_DAYS",
    "SEVERITIES",
    "TABLE_OLD_DAYS",
    "TABLE_ROW_OLD_DAYS",
    "TORCH_FAMILY",
    "WARNING",
    "Context",
    "EnvInputs",
    "Finding",
    "LibraryLoad",
    "PythonState",
    "Report",
    "activation_env",
    "activation_module_findings",
    "check_env",
    "cuda_modules",
    "env_lib_dirs",
    "examine",
    "facts_for_env",
    "gather",
    "library_findings",
    "library_loads",
    "listdir",
    "load_recipe",
    "lock_findings",
    "lock_index_urls",
    "lock_upstreams",
    "nightly_findings",
    "node_library_findings",
    "ordered",
    "own_libraries",
    "python_findings",
    "python_state",
    "read_indexes",
    "read_records",
    "replan_findings",
    "safety_findings",
    "split_path_list",
    "table_findings",
    "table_row_findings",
    "torch_upstreams",
    "wheel_versions",
]

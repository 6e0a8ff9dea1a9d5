"""An installer's network failure in words: each installer's own message becomes a NetworkError with the URL,
the cause and the way out; a failure that is not about the network stays as it was."""

from __future__ import annotations

import pytest

from envbuilder.backends.network import network_error
from envbuilder.core.errors import CommandFailed, NetworkError

PIP = """WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection \
broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to establish \
a new connection: [Errno 101] Network is unreachable')': /simple/ebdemo/
ERROR: Could not find a version that satisfies the requirement ebdemo==1.0 (from versions: none)"""
CONDA = """CondaHTTPError: HTTP 000 CONNECTION FAILED for url <https://conda.anaconda.org/conda-forge/linux-64/repodata.json>
Elapsed: -

An HTTP error occurred when trying to retrieve this URL."""


@pytest.mark.parametrize(
    ("argv", "stderr", "url", "cause"),
    [
        (
            ["/usr/bin/pip", "install", "--index-url", "https://mirror.site/simple", "ebdemo==1.0"],
            PIP,
            "https://mirror.site/simple",
            "no network route",
        ),
        (
            ["/opt/conda/bin/conda", "create", "--prefix", "/x"],
            CONDA,
            "https://conda.anaconda.org/conda-forge/linux-64/repodata.json",
            "the connection failed",
        ),
    ],
)
def test_each_installers_network_failure_names_url_cause_and_way_out(argv, stderr, url, cause):
    err = network_error(CommandFailed(argv, 1, stderr))
    assert isinstance(err, NetworkError) and err.exit_code == 11
    assert err.url == url and cause in err.cause, err.message
    assert url in err.message and "ENVBUILDER_INDEX_MIRROR" in (err.hint or "")


def test_a_failure_that_is_not_the_network_stays_a_command_failure():
    stderr = "error: No solution found when resolving dependencies:\n  Because ebdemo was not found..."
    assert network_error(CommandFailed(["uv", "pip", "install", "ebdemo"], 1, stderr)) is None

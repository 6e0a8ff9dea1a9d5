"""torchrun for the validation payload: ``python envbuilder_torchrun.py ARGS`` is ``python -m
torch.distributed.run ARGS``, except that an agent whose workers all finished leaves at once.

torchrun's agent imports the whole of torch, and once its workers are done the interpreter's teardown of those
modules (and the collection of their objects) took 0.3 to 0.5 s on every validation, after the last rank had
written its result and before envbuilder could write the report. Everything the agent had to do is done when its
``main`` returns: the workers are reaped, the rendezvous is shut down, its logs are written. So it flushes its
streams and logging handlers and ends with ``os._exit``, with the exit status torchrun would have given. Any
exception (a failed worker, a signal) takes torchrun's own way out, its report and exit status unchanged.

The collector is off while torch is imported (about a tenth of the import's CPU time went to walking the objects
the import had just made, again and again), and what the import made is then frozen.

The agent also looks at its workers every MONITOR_S (torchrun's ``--monitor-interval``, read from
``PET_MONITOR_INTERVAL`` where the command line does not give it): older torch releases looked every 5 s, so a
run waited up to 5 s after its last rank had ended (2.13 looks every 0.1 s). A value the user set is kept.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

#: How often the agent looks whether its workers have ended (seconds).
MONITOR_S = "0.05"


def _status(code: object) -> int:
    """The exit status the interpreter gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    gc.disable()  # the import makes torch's objects; the collector would walk them again and again meanwhile
    try:
        from torch.distributed.run import main as torchrun_main
    except ImportError as exc:  # as `python -m torch.distributed.run` says it: one line, no traceback
        sys.exit(f"{sys.executable}: cannot run torch.distributed.run ({type(exc).__name__}: {exc})")
    gc.freeze()  # what the import made is kept for good: later collections look only at what is new
    gc.enable()
    os.environ.setdefault("PET_MONITOR_INTERVAL", MONITOR_S)  # torchrun's parser reads it when main builds it
    try:
        torchrun_main(sys.argv[1:])
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_status(code))


if __name__ == "__main__":
    main()

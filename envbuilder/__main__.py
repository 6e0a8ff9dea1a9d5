import contextlib
import os
import sys
import threading

from envbuilder.cli import main, reader_gone


def entry() -> None:
    """Console-script entry point; the only place the process exit status is set."""
    code = main()
    try:
        sys.stdout.flush()  # here, not at exit: a reader that left is then a quiet exit, not a traceback
    except BrokenPipeError:
        code = reader_gone()
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    logging = sys.modules.get("logging")  # imported where a command logged (-v) or a library did
    if logging is not None:
        logging.shutdown()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # a thread still working is waited for, as the interpreter's exit does
    # Everything the command opened is closed and its output flushed: leave without the interpreter's teardown of
    # some 300 modules, which cost every command tens of milliseconds (a warm create's budget is a few hundred).
    os._exit(code)


if __name__ == "__main__":
    entry()

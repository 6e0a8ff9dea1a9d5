import sys

from envbuilder.cli import main, reader_gone


def entry() -> None:
    """Console-script entry point; the only place the process exit status is set."""
    code = main()
    try:
        sys.stdout.flush()  # here, not at exit: a reader that left is then a quiet exit, not a traceback
    except BrokenPipeError:
        code = reader_gone()
    sys.exit(code)


if __name__ == "__main__":
    entry()

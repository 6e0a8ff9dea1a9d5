import sys

from envbuilder.cli import main


def entry() -> None:
    """Console-script entry point; the only place the process exit status is set."""
    sys.exit(main())


if __name__ == "__main__":
    entry()

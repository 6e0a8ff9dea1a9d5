"""Scripts run by the *env's* python under a launcher. Standard library only at import; torch inside checks."""

from pathlib import Path

#: Where the payloads are, for the commands that run them (never imported by the payloads themselves).
DIR = Path(__file__).resolve().parent

"""The command line: grammar (:mod:`.parser`, from :mod:`.parts`), help and man page (:mod:`.helptext`,
:mod:`.manpage`), and completion scripts (:mod:`.completion`); human output lives in :mod:`envbuilder.system`.
:mod:`.dispatch` parses, dispatches and renders; this face re-exports its entry points."""

from envbuilder.cli.dispatch import envelope, main, reader_gone

__all__ = ["envelope", "main", "reader_gone"]

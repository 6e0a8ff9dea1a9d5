"""The command line: grammar (:mod:`.parser`, from :mod:`.parts`), help and man page (:mod:`.helptext`,
:mod:`.manpage`), completion scripts (:mod:`.completion`), and human output (:mod:`.console`, :mod:`.tables`,
:mod:`.progress`). :mod:`.dispatch` parses, dispatches and renders; this face re-exports its entry points."""

from envbuilder.cli.dispatch import envelope, main, reader_gone

__all__ = ["envelope", "main", "reader_gone"]

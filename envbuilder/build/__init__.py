"""Apply a plan: :mod:`.create` builds an env beside its prefix and swaps it into place, and :mod:`.activation`
writes the rendered activate scripts into it. Above the backends, below the command line."""

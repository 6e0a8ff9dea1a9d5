"""Apply a plan: :mod:`.create` builds an env beside its prefix and swaps it into place, :mod:`.activation`
writes the rendered activate scripts into it, and :mod:`.lockers` resolve a recipe for each target platform into a
lock (``envbuilder lock``). Above the backends, below the command line."""

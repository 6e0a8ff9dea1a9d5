"""Apply a plan: :mod:`.create` builds an env beside its prefix and swaps it into place (the backends, and
:mod:`envbuilder.backends.activation`, write what goes into it), and :mod:`.lockers` resolve a recipe for each
target platform into a lock (``envbuilder lock``). Above the backends, below the command line."""

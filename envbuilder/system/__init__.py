"""The I/O primitives, above :mod:`envbuilder.core` and below every domain package: :mod:`.proc` (the one
subprocess seam), :mod:`.fsutil` and :mod:`.textfile` (files written atomically, mutexes), :mod:`.removal` (deleting
only what envbuilder made), :mod:`.transaction` (swaps that survive interruption), :mod:`.relocate`,
:mod:`.state` (env records), :mod:`.purge`, :mod:`.strictmodes` (owner and mode checks), :mod:`.siteconfig` (where
the site config is; TOML files read), :mod:`.configfiles` (the user's and the site's settings read), :mod:`.host` (live host facts), :mod:`.modules` (Lmod and Tcl modules), and the
terminal: :mod:`.console` (messages), :mod:`.tables` (tables that fit the width) and :mod:`.progress`."""

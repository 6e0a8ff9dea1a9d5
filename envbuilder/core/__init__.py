"""The bottom layer: pure names and types every other layer may use, with no I/O and nothing above them.

:mod:`.errors` (the error tree and its exit families), :mod:`.structs` (frozen dataclasses), :mod:`.settings`
(where things live, from an environment mapping), :mod:`.config` (the settings' files, checks and precedence), :mod:`.facts` (host facts and their JSON form), :mod:`.values`
(what a recipe value may be), :mod:`._toml` (TOML on every supported Python), and the registries of names that
recipes and the command line choose from: :mod:`.kinds` (env kinds, installers, conda engines), :mod:`.checks`,
:mod:`.launchers`, :mod:`.schedulers` and :mod:`.shells`. Nothing here imports from any other envbuilder package."""

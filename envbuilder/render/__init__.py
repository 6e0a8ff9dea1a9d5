"""Pure text generation from a plan's parts: activate scripts for every shell (:mod:`.activate_scripts`) and
modulefiles in Lua and Tcl (:mod:`.modulefile`). Job scripts for the schedulers are ``plan.batch``'s (a plan shows
its job script). Nothing here writes a file or runs a command; :mod:`envbuilder.build` and the commands do."""

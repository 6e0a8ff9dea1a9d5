"""Pure text generation from a plan's parts: activate scripts for every shell (:mod:`.activate_scripts`),
modulefiles in Lua and Tcl (:mod:`.modulefile`) and job scripts for the schedulers (:mod:`.batch`). Nothing here
writes a file or runs a command; :mod:`envbuilder.build` and the commands do."""

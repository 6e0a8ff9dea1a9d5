"""Pure text generation: activate scripts for every shell (:mod:`.activate_scripts`) and modulefiles in Lua and
Tcl (:mod:`.modulefile`) from a plan's parts; the history report from validation records, as an HTML page
(:mod:`.report_html`, its plots drawn by :mod:`.svgplot`, what it shows taken by :mod:`.reportdata`) or Markdown
(:mod:`.report_md`). Job scripts for the schedulers are ``plan.batch``'s (a plan shows its job script). Nothing
here writes a file or runs a command; :mod:`envbuilder.build` and the commands do."""

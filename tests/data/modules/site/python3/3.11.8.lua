prereq("gcc")
setenv("TACC_PYTHON_VER", "3.11.8")
prepend_path("PATH", "/opt/fake/python-3.11.8/bin")

prereq("gcc", "openmpi")
setenv("TACC_PYTHON_VER", "3.11.8")
setenv("PYTHON_MPI", "1")
prepend_path("PATH", "/opt/fake/python-mpi-3.11.8/bin")

conflict("mvapich2")
setenv("MPI_FLAVOR", "openmpi")
setenv("MPICC", "/opt/fake/openmpi-5.0.5/bin/mpicc")
prepend_path("PATH", "/opt/fake/openmpi-5.0.5/bin")

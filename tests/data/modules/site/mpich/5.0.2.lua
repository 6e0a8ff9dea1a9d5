-- A site's MPICH 5.0.2, laid out by tests/mpitwin.py under ENVBUILDER_TEST_SOFT (else /opt/fake, which does not
-- exist): its mpicc (which records no RUNPATH), Hydra's mpiexec and its headers on PATH, and its libmpi, which
-- only this LD_LIBRARY_PATH finds.
conflict("openmpi")
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
local root = pathJoin(soft, "mpich-5.0.2")
setenv("MPI_FLAVOR", "mpich")
setenv("MPICH_HOME", root)
prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib"))

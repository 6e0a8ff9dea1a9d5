-- The seed-site twins' python module for Stampede3 (tests/integration/test_seed_twins.py): Stampede3's
-- python/X.Y.Z scheme (see ../../site/python/3.9.18.lua), for the CPython 3.11 of the machine's CPU torch wheel.
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
setenv("TACC_PYTHON_VER", "3.11.7")
prepend_path("PATH", pathJoin(soft, "python-3.11.7/bin"))
-- A site-built python: its libpython is found only through this.
prepend_path("LD_LIBRARY_PATH", pathJoin(soft, "python-3.11.7/lib"))

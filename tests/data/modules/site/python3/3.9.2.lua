-- Frontera's python3/3.9.2: its python3 on PATH. The software lives under ENVBUILDER_TEST_SOFT where a test lays
-- out a real interpreter (tests/integration/test_seed_sites.py), else under /opt/fake, which does not exist.
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
setenv("TACC_PYTHON_VER", "3.9.2")
prepend_path("PATH", pathJoin(soft, "python-3.9.2/bin"))
-- A site-built python: its libpython is found only through this (tests/sitepython.py).
prepend_path("LD_LIBRARY_PATH", pathJoin(soft, "python-3.9.2/lib"))

-- Vista's python3/3.11.8 (ENVBUILDER_TEST_SOFT: see python3/3.9.2.lua).
prereq("gcc")
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
setenv("TACC_PYTHON_VER", "3.11.8")
prepend_path("PATH", pathJoin(soft, "python-3.11.8/bin"))
-- A site-built python: its libpython is found only through this (tests/sitepython.py).
prepend_path("LD_LIBRARY_PATH", pathJoin(soft, "python-3.11.8/lib"))

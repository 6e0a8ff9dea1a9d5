-- Stampede3's python/3.9.18: its python3 on PATH (ENVBUILDER_TEST_SOFT: see ../python3/3.9.2.lua).
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
setenv("TACC_PYTHON_VER", "3.9.18")
prepend_path("PATH", pathJoin(soft, "python-3.9.18/bin"))
-- A site-built python: its libpython is found only through this (tests/sitepython.py).
prepend_path("LD_LIBRARY_PATH", pathJoin(soft, "python-3.9.18/lib"))

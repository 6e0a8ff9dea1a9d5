-- The seed-site twins' python3 module for Frontera and Lonestar6 (tests/integration/test_seed_twins.py): TACC's
-- python3/X.Y.Z scheme, for the CPython 3.11 that the machine's only CPU torch wheel (cp311) needs; the shipped
-- recipes' python3/3.9.x cannot run it. A site-built python like python3/3.9.2's (tests/sitepython.py).
local soft = os.getenv("ENVBUILDER_TEST_SOFT") or "/opt/fake"
setenv("TACC_PYTHON_VER", "3.11.7")
prepend_path("PATH", pathJoin(soft, "python-3.11.7/bin"))
-- A site-built python: its libpython is found only through this.
prepend_path("LD_LIBRARY_PATH", pathJoin(soft, "python-3.11.7/lib"))

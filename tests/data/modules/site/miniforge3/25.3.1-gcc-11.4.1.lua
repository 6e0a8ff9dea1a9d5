local root = "/opt/fake/miniforge3-25.3.1"
setenv("CONDA_EXE", pathJoin(root, "bin/conda"))
prepend_path("PATH", pathJoin(root, "bin"))

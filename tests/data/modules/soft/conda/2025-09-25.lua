-- Polaris-style: reachable only after `module use` of this tree.
local root = "/opt/fake/soft/datascience/conda/2025-09-25"
setenv("CONDA_PREFIX_MODULE", root)
setenv("CUDA_HOME", "/opt/fake/soft/compilers/cudatoolkit/cuda-12.9.1")
prepend_path("PATH", pathJoin(root, "bin"))

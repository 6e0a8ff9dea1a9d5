-- Polaris-style: reachable only after `module use` of this tree (torch 2.14, CUDA 13.0.3 on the real machine).
local root = "/opt/fake/soft/datascience/conda/2026-10-01"
setenv("CONDA_PREFIX_MODULE", root)
setenv("CUDA_HOME", "/opt/fake/soft/compilers/cudatoolkit/cuda-13.0.3")
prepend_path("PATH", pathJoin(root, "bin"))

local root = "/opt/fake/cuda-12.6"
setenv("CUDA_HOME", root)
setenv("CUDA_VERSION", "12.6")
prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib64"))

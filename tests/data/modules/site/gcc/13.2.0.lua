family("compiler")
setenv("GCC_VERSION", "13.2.0")
prepend_path("PATH", "/opt/fake/gcc-13.2.0/bin")
prepend_path("LD_LIBRARY_PATH", "/opt/fake/gcc-13.2.0/lib64")

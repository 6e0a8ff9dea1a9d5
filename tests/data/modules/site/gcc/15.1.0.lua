family("compiler")
setenv("GCC_VERSION", "15.1.0")
prepend_path("PATH", "/opt/fake/gcc-15.1.0/bin")
prepend_path("LD_LIBRARY_PATH", "/opt/fake/gcc-15.1.0/lib64")

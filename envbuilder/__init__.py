"""envbuilder: declarative, tested PyTorch environments for HPC clusters."""

__version__ = "0.1.0.dev0"

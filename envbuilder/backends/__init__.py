"""How an env is built: the venv backend (uv, virtualenv, pip), the conda backend (CLI engines and the embedded
rattler engine), and the torch build guard that checks an installed torch is the planned build."""

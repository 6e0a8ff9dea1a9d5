"""Scripts run by the *env's* python under a launcher. Standard library only at import; torch inside checks."""

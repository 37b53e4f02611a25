"""Holds the sitecustomize that `decodemon run` puts first on PYTHONPATH."""

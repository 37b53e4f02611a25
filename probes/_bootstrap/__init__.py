"""Holds the sitecustomize that `decodemon run` puts first on PYTHONPATH. The agent needs nothing in a target's
interpreter beyond the standard library: decodemon's own folder is mapped in as the `decodemon` package."""

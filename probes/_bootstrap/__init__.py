"""Holds the sitecustomize that `decodemon run` puts first on PYTHONPATH, and what the agent needs in a target's
interpreter beyond decodemon itself (standard library only: it is read where those needs may be missing)."""

RUNTIME_NEEDS = ("msgspec", "numpy")


def pip_line(exe: str) -> str:
    """The command that puts the agent's needs into the interpreter `exe`."""
    return f"`{exe} -m pip install {' '.join(RUNTIME_NEEDS)}`"

"""nvshim: an OCI runtime shim that gives containers NVIDIA GPUs."""

__version__ = "0.1.0"

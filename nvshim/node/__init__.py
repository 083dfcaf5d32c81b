"""Node administration: configuring containerd, Docker and CRI-O (``containerd``,
``docker``, ``crio``, with shared backup/revert in ``engine_files``), generating the
node's CDI spec (``cdigen``), diagnosing the node (``doctor``, ``doctor_engines``) and
the demo (``demo``).

May import :mod:`nvshim.runtime`, :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base
modules. Must not import :mod:`nvshim.cli` (no click here: these are library functions
the CLI calls).
"""

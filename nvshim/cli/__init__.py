"""The ``nvshim`` command: click commands only, thin.

Each command parses its options, calls a function of :mod:`nvshim.node`,
:mod:`nvshim.cdi`, :mod:`nvshim.runtime`, :mod:`nvshim.host` or :mod:`nvshim.sim` (``nvshim
sim create``), and prints. ``main``
holds the group and the one place errors become exit codes. Nothing imports this package.
"""

"""The ``nvshim`` command: click commands only, thin.

Each command parses its options, calls a function of :mod:`nvshim.node`,
:mod:`nvshim.cdi`, :mod:`nvshim.runtime`, :mod:`nvshim.host` or :mod:`nvshim.sim` (``nvshim
sim create``), and prints. ``main`` holds the group, ``sim``, ``demo``, ``hook`` and
``completion``, and the one place errors become exit codes; one module per other command:
``cmd_inspect``, ``cmd_cdi``, ``cmd_config``, ``cmd_grants``, ``cmd_runtime``,
``cmd_system``, ``cmd_doctor``. ``options`` holds the options several commands share,
``output`` what ``--quiet``/``--debug`` change. Nothing imports this package.
"""

"""The simulated GPU node that tests, benchmarks and ``nvshim demo`` run on: the tree a real
NVIDIA host has (device nodes, procfs, driver libraries and programs), as a directory.

Owns: building and loading a node (``build``: ``create_node``, ``load_node``); its model,
constants and plan (``model``); what its kernel module shows, ``dev/`` and ``proc/``
(``kernel``); its user-space driver files, libraries, programs, firmware and sockets
(``driver``). The simulated ``nvidia-smi`` script is package data
(``nvshim/data/sim-nvidia-smi.sh``).

Nothing a create or the hook runs imports it: it is used only from above, by the ``nvshim
sim`` and ``nvshim demo`` commands (``cli``, ``node.demo``), tests and benchmarks.
Production code never reads what only the simulator writes (``nvshim-sim.json``); the
simulator writes what a real host has, and facts a real host gives only through NVML in
the ``nvml-facts`` file format :mod:`nvshim.host.nvml` defines.

May import only :mod:`nvshim.host` and the base modules (``errors``, ``_record``,
``_jsonc``, ``files``, ``config``, ``edits``).
"""

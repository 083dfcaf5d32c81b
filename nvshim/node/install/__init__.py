"""What install.sh and the installer put on a node: the self-contained prefix's layout and
commands (``prefix``), building it (``payload``), and the ``nvshim-runtime`` sh front
(``trampoline`` renders it). Empty on purpose: install.sh imports one module at a time.
"""

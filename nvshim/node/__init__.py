"""Node administration: what the ``nvshim`` command and the installer run, never a create.

Its parts, by job: ``engines/`` (containerd, Docker and CRI-O behind one interface,
:mod:`nvshim.node.engines.api`: configure, revert, read, restart), ``doctor/`` (``nvshim
doctor``'s checks and findings) and ``install/`` (the self-contained prefix, its payload
and the ``nvshim-runtime`` sh front install.sh writes). Beside them: compiling the config
with the node plan cache and CDI index a create reads (``compile``) and the guard on a
default runtime's config (``configguard``); generating and refreshing the node's CDI specs
(``cdigen``, ``cdirefresh``); reading the grant and denial journals (``holders``: who holds
which GPU now, for ``nvshim grants``; ``denied``); what ``nvshim inspect`` shows of a
create plan (``inspection``); and the demo (``demo``).

May import :mod:`nvshim.runtime`, :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base
modules. Must not import :mod:`nvshim.cli` (no click here: these are library functions
the CLI calls).
"""

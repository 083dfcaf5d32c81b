"""Node administration: what the ``nvshim`` command and the installer run, never a create.

Owns: configuring containerd (``containerd`` configure, ``containerd_revert``,
``containerd_read`` what containerd sees, ``containerd_toml`` the shared TOML vocabulary),
Docker (``docker``) and CRI-O (``crio``), with shared backup/revert in ``engine_files``;
restarting containerd and waiting until its socket answers (``engine_restart``);
the installed ``nvshim-runtime`` sh script (``trampoline`` renders it, install.sh writes
it); compiling the config with the node plan cache and CDI index a create reads
(``compile``); generating the node's CDI spec (``cdigen``); reading the grant journal
(``holders``: who holds which GPU now, for ``nvshim grants``); what ``nvshim inspect``
shows of a create plan (``inspection``); diagnosing the node (``doctor`` runs and renders
the checks of ``doctor_config``, ``doctor_engines`` and ``doctor_host``, in the
vocabulary of ``findings``); and the demo (``demo``).

May import :mod:`nvshim.runtime`, :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base
modules. Must not import :mod:`nvshim.cli` (no click here: these are library functions
the CLI calls).
"""

"""``nvshim doctor``: the node's checks and their findings.

``checks`` runs every check in a fixed order and renders the findings (the vocabulary of
``findings``: :class:`~nvshim.node.doctor.findings.Finding`,
:class:`~nvshim.node.doctor.findings.DoctorOptions`); each other module asks one part of
the node: ``config`` (nvshim's config and runtimes), ``engines`` (containerd, Docker and
CRI-O, through :mod:`nvshim.node.engines.api`), ``handlers`` (containerd handlers lost in
its merge), ``follow`` and ``reach`` (what an engine's runtime runs and the config it
reads), ``injection`` (who injects CDI devices), ``host`` (GPUs, driver files, CDI specs),
``hooks`` (OCI hooks), ``exec`` (programs run as root), ``install`` (the default runtime's
config), ``agent`` (the fast path) and ``nri`` (NRI on, the agent registered). Empty on
purpose: the CLI's fast path imports only what it runs.
"""

"""The container engines nvshim registers with: containerd, Docker and CRI-O.

:mod:`~nvshim.node.engines.api` is the one interface (configure, revert, the runtimes an
engine loads, doctor's words for it); behind it each engine's own module keeps its
vocabulary: containerd (``containerd`` configures, ``containerd_revert`` reverts,
``containerd_read`` reads what containerd sees, ``containerd_chain`` the files it loads in
its order, ``containerd_toml`` the shared TOML vocabulary), Docker (``docker``) and CRI-O
(``crio``), with byte-exact backup and revert shared in ``files``; ``restart`` restarts an
engine and waits until it answers. Empty on purpose: importing one engine's module loads
no other.
"""

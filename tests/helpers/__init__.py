"""Helpers shared by the tests (mostly e2e): rootfs/bundle builders and container-engine runners.

One module per engine, plus what they share:

* :mod:`tests.helpers.common` — skips, unique ids, polling, process/cgroup teardown, running a
  command into a :class:`~tests.helpers.common.RunResult`, runtime stand-ins (env wrapper,
  failing runtime).
* :mod:`tests.helpers.node` — nvshim's config and env for the node under test, read-only
  roots, who did the in-root work.
* :mod:`tests.helpers.bundle` builds busybox (and glibc-loader) root filesystems and OCI
  bundles with a tab-indented ``config.json`` like ``runc spec`` writes.
* :mod:`tests.helpers.runc` — runc and crun (crun through a mount-namespace wrapper).
* :mod:`tests.helpers.debian13` — Debian 13's containerd 1.7, runc 1.1.15 and crun 1.21,
  fetched once into a cache with a private apt configuration (its
  :class:`~tests.helpers.debian13.DebianSuite`); :mod:`tests.helpers.debiansid` — the same
  for Debian unstable's newest engines (containerd 2.1).
* :mod:`tests.helpers.containerd` — a private containerd (1.6, or 1.7) driven with ``ctr``;
  :mod:`tests.helpers.cri` — its CRI plugin driven over gRPC as the kubelet does;
  :mod:`tests.helpers.containerd_samples` — containerd configs for the
  ``nvshim runtime configure`` tests.
* :mod:`tests.helpers.podman` — podman 4.3.1 and CDI specs where it reads them.
* :mod:`tests.helpers.docker` — a private dockerd 20.10 in its own mount namespace.
* :mod:`tests.helpers.podresources` — a kubelet PodResources gRPC server.
* :mod:`tests.helpers.noderoot` — Debian 11/12/13 node roots (mmdebstrap, cached) and running
  a command on one (private namespaces, chroot) with the root's own runc.
* :mod:`tests.helpers.commands` — ``nvshim`` from this checkout in a fresh process, and a
  rendered ``nvshim-runtime`` trampoline beside a compiled config and a recorder runtime.

The pytest fixtures that wrap these live in ``tests/conftest.py`` and ``tests/e2e/conftest.py``.
"""

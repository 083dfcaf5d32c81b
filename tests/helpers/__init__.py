"""Helpers shared by the e2e tests: rootfs/bundle builders and container-engine runners.

* :mod:`tests.helpers.bundle` builds busybox (and glibc-loader) root filesystems and OCI
  bundles with a tab-indented ``config.json`` like ``runc spec`` writes.
* :mod:`tests.helpers.engines` drives runc, crun (through a mount-namespace wrapper), a
  private containerd 1.6 daemon via ``ctr``, and podman 4.3.1, and returns
  :class:`~tests.helpers.engines.RunResult` values.

The pytest fixtures that wrap these live in ``tests/conftest.py`` and ``tests/e2e/conftest.py``.
"""

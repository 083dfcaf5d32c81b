"""The create road: only code ``nvshim-runtime create`` can run.

Owns, by job:

- the entry: ``argv`` (the runtime's argv grammar), ``main``;
- the request: ``claim`` (what config.json claims), ``identity`` (which Kubernetes
  container it is), ``request`` (what it may get; the device-token grammar it reads with
  is :mod:`nvshim.host.devices`'), ``engine`` (what the engine already injected),
  ``constraints`` (the NVIDIA_REQUIRE_* grammar), ``requirements`` (their facts and
  verdict); require-allocation's checks live in the ``allocation`` sub-package (``policy``,
  ``kubelet``; their wire codec is ``nvshim._protobuf``), loaded only when a create must
  ask the kubelet;
- the edits: ``create`` (the stages and commit), ``plan`` (the stages' records),
  ``hostedits`` (device tokens), ``cdiedits`` (CDI names), ``extras``, ``specjson``
  (reading and writing config.json); applying them to the spec is
  :func:`nvshim.edits.apply_edits`, beside the records;
- the in-root work and its hook fallback: ``rootwork`` (who does it, and the plan),
  ``rootcache`` (the container's ld.so.cache), ``appprofile`` (the EGL application
  profile), ``hookargs`` (the links hook's command line), ``devparams`` (the
  ``ModifyDeviceFiles: 0`` hook and its command line);
- the node plan cache a create reads: ``plancache`` (``planbuild`` writes it); the grant
  journal: ``grants`` (append at create); runc-style error logs and the debug log: ``logs``.

What a create never runs lives elsewhere: the trampoline's renderer, ``nvshim config
compile``, the journal's readers and ``nvshim inspect``'s views are in :mod:`nvshim.node`.

May import: :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base modules (``errors``,
``_record``, ``_jsonc``, ``files``, ``config``, ``edits``). Must not import
:mod:`nvshim.node` or :mod:`nvshim.cli`, nor click, structlog, yaml, jsonschema, pynvml or
tomlkit on the create path (``tests/unit/test_layers.py`` and the import guard check).
This file stays empty: every create imports it.
"""

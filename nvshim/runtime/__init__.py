"""The create road: the only code ``nvshim-runtime create`` runs.

Owns, by job:

- the entry: ``argv`` (the runtime's argv grammar), ``trampoline`` (its sh front), ``main``;
- the request: ``request`` (what config.json asks for), ``tokens`` (the device-token
  grammar, tokens onto GPUs), ``constraints`` (the NVIDIA_REQUIRE_* grammar),
  ``requirements`` (their facts and verdict), ``allocation`` (require-allocation's kubelet
  check and pod annotations), ``kubelet`` and ``podresources`` (asking the kubelet);
- the edits: ``create`` (plan and commit), ``hostedits``, ``extras``, ``apply``,
  ``specjson`` (reading and writing config.json);
- the in-root work and its hook fallback: ``rootwork``, ``hookargs`` (the hook's command
  line), ``devparams``;
- node caches: ``plancache``, ``compile``; the grant journal: ``grants`` (append at
  create); runc-style error logs: ``logs``;
- off the create path, read only by the ``nvshim`` command: ``holders`` (who holds which
  GPU now, for ``nvshim grants``), ``inspection`` (what ``nvshim inspect`` shows of a plan).

May import: :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base modules (``errors``,
``_record``, ``_jsonc``, ``files``, ``config``, ``edits``). Must not import
:mod:`nvshim.node` or :mod:`nvshim.cli`, nor click, structlog, yaml, jsonschema, pynvml or
tomlkit on the create path (``tests/unit/test_layers.py`` and the import guard check).
This file stays empty: every create imports it.
"""

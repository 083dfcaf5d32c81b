"""The create road: the only code ``nvshim-runtime create`` runs.

Owns: the runtime's argv grammar (``argv``) and its sh front (``trampoline``), the entry
(``main``), reading the bundle and the request (``request``; ``tokens``: the device-token
grammar and GPU selection; ``requirements``, ``kubelet``;
``allocation``: require-allocation's kubelet check and pod annotations),
planning and committing the edits (``create``, ``hostedits``, ``extras``, ``apply``,
``specjson``), the in-root work and its hook fallback (``rootwork``, ``hookargs``,
``devparams``), the node caches (``plancache``, ``compile``), the grant journal (``grants``)
and runc-style error logs (``logs``); off the create path, what ``nvshim inspect`` shows of a
plan (``inspection``).

May import: :mod:`nvshim.cdi`, :mod:`nvshim.host` and the base modules (``errors``,
``_record``, ``_jsonc``, ``files``, ``config``, ``edits``). Must not import
:mod:`nvshim.node` or :mod:`nvshim.cli`, nor click, structlog, yaml, jsonschema, pynvml or
tomlkit on the create path (``tests/unit/test_layers.py`` and the import guard check).
This file stays empty: every create imports it.
"""

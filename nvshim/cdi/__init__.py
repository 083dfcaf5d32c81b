"""Container Device Interface specs, one module per job:

``names`` the ``vendor/class=device`` grammar; ``model`` the loaded spec and registry
values; ``version`` cdiVersion gating; ``check`` the semantic checker (owner of every field
rule); ``load`` strict decoding and building a spec; ``registry`` spec-dir scans, CDI's
priority and conflict rules, name resolution, the refusal of edits nvshim cannot apply
(``intelRdt``, ``netDevices``) and device nodes filled from the host's; ``index`` the
stat-validated index of the spec dirs; ``schema`` the JSON-schema layer (``nvshim cdi
validate``); ``write`` building and writing specs; ``_plainyaml`` the YAML ``write``
writes, written and read without yaml; ``transform`` moving a spec's paths between roots.

A create that names a CDI device loads names, model, version, check, load, registry and
index, never schema or write. May import :mod:`nvshim.host` and the base modules. Must not
import :mod:`nvshim.runtime`, :mod:`nvshim.node` or :mod:`nvshim.cli`. yaml and jsonschema
are imported inside the functions that need them. This file stays empty: a create that
names a CDI device imports it.
"""

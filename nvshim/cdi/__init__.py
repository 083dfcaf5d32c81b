"""Container Device Interface specs: names, the spec model, loading, validation, the
registry that resolves ``vendor/class=device`` names, the stat-validated index of the spec
dirs (``index``), writing specs and transforming them (``transform``).

May import :mod:`nvshim.host` and the base modules. Must not import :mod:`nvshim.runtime`,
:mod:`nvshim.node` or :mod:`nvshim.cli`. Loading a JSON spec needs only the standard
library: yaml and jsonschema are imported inside the functions that need them.
This file stays empty: a create that names a CDI device imports it.
"""

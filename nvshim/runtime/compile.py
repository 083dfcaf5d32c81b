"""``nvshim config compile``: everything the create path reads pre-digested, in one step.

The compiled config (:func:`nvshim.config.compile_config`), the node plan cache
(:mod:`nvshim.runtime.plancache`) and the index of the CDI spec dirs (:mod:`nvshim.cdi.index`)
sit next to the YAML; creates check each with ``stat`` and rebuild a stale one.
"""

from __future__ import annotations

from nvshim.cdi import index as cdiindex
from nvshim.config import cdi_index_path, compile_config, config_path, load_config
from nvshim.runtime.plancache import refresh

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple


def compile_node(path: Optional[str] = None) -> Tuple[str, str, str]:
    """Compile the config at ``path`` (default: the node's), then its plan cache and CDI index.

    Returns what each step reports: the compiled copy's path, the plan cache's status, the
    index's status.
    """
    out = compile_config(path)
    config = load_config(path)
    plan = refresh(config)
    index = cdiindex.refresh(config.cdi_spec_dirs, cdi_index_path(config.source or config_path()))
    return out, plan, index

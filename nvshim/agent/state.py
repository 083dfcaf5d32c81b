"""What the agent holds warm between requests: the config and its generation, the node plan.

:attr:`AgentState.generation` names the config file the agent serves by what ``stat``
says of it (device, inode, size, modification time in ns): the fast-path client computes
the same string for the config the trampoline names, and a create whose generation
differs is not served (the runtime's own Python create runs, and the agent reloads).
The node plan is today's on-disk plan cache (:mod:`nvshim.runtime.plancache`): the agent
keeps its parsed copy in memory (:class:`nvshim.runtime.plancache.PlanMemo`) and reuses it
only while every check the runtime makes on the file still passes, so it is invalidated
exactly when the on-disk one is.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Optional

from nvshim.config import Config, config_path, load_config
from nvshim.errors import NvshimError

if TYPE_CHECKING:
    from nvshim.logs import Log

__all__ = ["AgentState", "generation_of", "install_changed"]


def generation_of(path: str) -> str:
    """``dev:ino:size:mtime_ns`` of ``path`` (what the C client sends); "" when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


#: nvshim's package marker, and what ``stat`` said of it when this agent loaded its code.
_PACKAGE_INIT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__init__.py"
)
_LOADED = generation_of(_PACKAGE_INIT)


def install_changed() -> str:
    """Why this agent's code is no longer the installed nvshim ("" while it is): the
    package removed (an uninstall) or its files replaced (an upgrade, a reinstall) under
    the running agent. Such an agent must not serve: its next lazy import would mix the
    old code with the new."""
    now = generation_of(_PACKAGE_INIT)
    if now == _LOADED:
        return ""
    if not now:
        return (
            f"nvshim's install is gone ({os.path.dirname(_PACKAGE_INIT)}: uninstalled "
            "under a running agent): stop this agent"
        )
    return (
        f"nvshim was reinstalled or upgraded under this running agent "
        f"({os.path.dirname(_PACKAGE_INIT)}): restart it on the new code"
    )


class AgentState:
    """The agent's warm state; shared by the socket's threads and the NRI plugin.

    ``config`` is None when the file cannot be loaded (``config_error`` says why): the
    agent then serves no create and the runtime's own create reports the error.
    """

    def __init__(self, config_file: Optional[str], log: Log) -> None:
        from nvshim.runtime.plancache import PlanMemo

        self.config_path = config_file or config_path()
        self.log = log
        self.config: Optional[Config] = None
        self.config_error = ""
        self.generation = ""
        self.plan_memo = PlanMemo()
        self._lock = threading.Lock()
        self.reload()

    def reload(self) -> bool:
        """Load the config file again; True when the generation changed."""
        with self._lock:
            before = self.generation
            generation = generation_of(self.config_path)
            try:
                config = load_config(self.config_path)
                error = "" if config.source else f"config {self.config_path} does not exist"
            except NvshimError as exc:
                config, error = None, str(exc)
            self.config = config if not error else None
            self.config_error = error
            self.generation = generation
            changed = generation != before
        if error:
            self.log.warning("config not loaded", config=self.config_path, error=error)
        elif changed:
            self.log.info("config loaded", config=self.config_path, generation=generation)
        return changed

    def reload_if_changed(self) -> bool:
        """Reload when the file's generation is not the one loaded (one ``stat``)."""
        if generation_of(self.config_path) == self.generation:
            return False
        return self.reload()

    def current(self) -> tuple[Optional[Config], str]:
        """(config, generation) as one consistent pair."""
        with self._lock:
            return self.config, self.generation

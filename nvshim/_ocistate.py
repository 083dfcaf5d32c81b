"""The OCI state a hook reads on stdin, and the container rootfs it names.

Shared by the two createContainer hooks (:mod:`nvshim.hook`, the links and ld.so.cache;
:mod:`nvshim.params_hook`, ``ModifyDeviceFiles: 0``) so that neither imports the other's
machinery, and by the agent's hook (:mod:`nvshim.agent.hookwork`), which reads the
bundle's config.json through the caller's root (``read_config``). Standard library ``os``
and ``json`` only, ``json`` (costly, with ``re``: BENCHMARKS.md) when a state is parsed:
the params hook that finds nothing to do never parses it.
"""

from __future__ import annotations

import os

from nvshim.errors import SpecError

TYPE_CHECKING = False  # typing: annotations only (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import IO, Any, Callable, Mapping, Optional

__all__ = ["container_root", "parse_state", "read_state", "state_bundle"]


def state_bundle(state: Mapping[str, Any]) -> str:
    """The OCI state's ``bundle``: an absolute path, else a SpecError."""
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise SpecError(f"oci state: bundle must be an absolute path, got {bundle!r}")
    return bundle


def _read_path(bundle: str) -> bytes:
    with open(os.path.join(bundle, "config.json"), "rb") as handle:
        return handle.read()


def container_root(
    state: Mapping[str, Any], read_config: "Optional[Callable[[str], bytes]]" = None
) -> str:
    """The rootfs path for OCI *state*: its ``root`` (crun), else ``root.path`` of the config.

    A relative path is joined to the bundle, whatever the cwd is (runc: the rootfs; crun:
    the bundle). ``read_config(bundle)``: the bundle's config.json bytes (default: opened
    by path); its OSError is a SpecError naming the file, a SpecError it raises passes.
    """
    bundle = state_bundle(state)
    root = state.get("root")
    if root is None:
        import json

        config_path = os.path.join(bundle, "config.json")
        try:
            config = json.loads((read_config or _read_path)(bundle))
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot read {config_path}: {exc}") from exc
        spec_root = config.get("root") if isinstance(config, dict) else None
        root = spec_root.get("path") if isinstance(spec_root, dict) else None
        where = f"{config_path} root.path"
    else:
        where = "oci state root"
    if not isinstance(root, str) or not root or "\0" in root:
        raise SpecError(f"{where} must be a non-empty string without NUL bytes, got {root!r}")
    return os.path.join(bundle, root)  # an absolute root replaces the bundle


def parse_state(text: str, where: str = "") -> Mapping[str, Any]:
    """The OCI state JSON object of ``text`` (``where``: said in the error, e.g. " on
    stdin")."""
    import json

    try:
        state = json.loads(text)
    except ValueError as exc:
        raise SpecError(f"cannot parse the oci state{where}: {exc}") from exc
    if not isinstance(state, dict):
        raise SpecError(f"the oci state{where} must be a json object")
    return state


def read_state(stream: IO[str]) -> Mapping[str, Any]:
    """The OCI state JSON object on ``stream`` (the hook's stdin)."""
    return parse_state(stream.read(), " on stdin")

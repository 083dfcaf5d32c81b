"""``nvshim-runtime``: the OCI runtime containerd/podman call instead of runc.

Only ``create`` and ``run`` are edited; every other command is ``execv``'d to the
low-level runtime with argv, env and fds untouched. This module imports nothing but
``os``, ``sys`` and the argv parser until it knows the command modifies the spec.
"""

from __future__ import annotations

import gc
import os
import sys

# A create is one short process with almost no reference cycles; the cyclic collector ran
# 5 times in each while the modules loaded. Memory is freed at exec/exit anyway.
gc.disable()

from nvshim.runtime.argv import Invocation, parse_argv  # noqa: E402 - after gc.disable()

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Callable, List, NoReturn, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.plan import Plan

__all__ = ["main", "find_runtime", "create"]


def find_runtime(candidates: Sequence[str], path_env: Optional[str]) -> Optional[str]:
    """First candidate found: absolute paths as-is, names looked up on ``path_env``."""
    dirs = (path_env if path_env is not None else os.defpath).split(os.pathsep)
    for name in candidates:
        if os.path.isabs(name):
            if os.path.isfile(name) and os.access(name, os.X_OK):
                return name
            continue
        if "/" in name:
            continue
        for d in dirs:
            full = os.path.join(d or ".", name)
            if os.path.isfile(full) and os.access(full, os.X_OK):
                return full
    return None


def _fail(message: str, inv: Invocation) -> NoReturn:
    from nvshim.runtime.logs import report_error

    report_error(message, inv.log, inv.log_format)
    sys.exit(1)


def _warn(message: str, inv: Invocation) -> None:
    """A warning line in runc's ``--log`` (containerd logs it); stdout and stderr stay the
    container's."""
    from nvshim.runtime.logs import report_warning

    report_warning(message, inv.log, inv.log_format)


def _record_grant(
    plan: Plan, config: Config, inv: Invocation, bundle: str, runtime: Optional[str]
) -> None:
    """Append this grant to the node's journal (before runc runs: a failed create leaves a
    record whose container never existed, which readers count as gone)."""
    import time

    from nvshim.runtime.grants import Grant, append_grant, default_root

    if not config.grants_journal:
        return

    runtime = runtime or config.runtimes[0]
    who = plan.identity
    claims: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    if plan.allocation is not None and plan.allocation.claims and plan.host is not None:
        from nvshim.runtime.allocation.cdinames import claim_gpus

        claims = claim_gpus(plan.host, config, plan.allocation, plan.granted_uuids)
    grant = Grant(
        time=time.time(),
        container_id=inv.container_id or "",
        bundle=os.path.abspath(bundle),
        root=os.path.abspath(inv.root) if inv.root else default_root(runtime),
        runtime=runtime,
        source=plan.grant_source,
        gpus=plan.granted_uuids,
        shared=plan.request.shared,
        verified=plan.verified,
        namespace=who.namespace if who else "",
        pod=who.pod if who else "",
        pod_uid=who.pod_uid if who else "",
        container=who.container if who else "",
        claims=claims,
    )
    warning = append_grant(config.grants_journal, grant, config.grants_journal_max_bytes)
    if warning is not None:
        _warn(warning, inv)


def _record_denial(
    config: Config,
    inv: Invocation,
    bundle: str,
    runtime: Optional[str],
    action: str,
    reason: str,
    plan: Optional[Plan] = None,
) -> None:
    """Append to the denial journal (beside the grant journal) that this container was
    ``stripped`` of the GPUs it asked for or ``refused``. Record or fail, as for a grant:
    HostError when the record cannot be written (a stripped create then fails; a refusal's
    error line says its record is missing). A compaction that failed is a warning."""
    import time

    from nvshim.errors import NvshimError
    from nvshim.runtime.denials import (
        Denial,
        append_denial,
        asked_of,
        denials_path,
        identity_fields,
    )
    from nvshim.runtime.grants import default_root

    assert config.grants_journal
    claim = plan.claim if plan is not None else None
    identity = plan.identity if plan is not None else None
    if plan is None:  # a refusal: the spec is read again for who asked what (never written)
        from nvshim.runtime.claim import image_view, read_claim
        from nvshim.runtime.specjson import read_spec

        try:
            view = image_view(read_spec(bundle)[2])
            identity = view.identity
            claim = read_claim(view, config)
        except NvshimError:
            pass
    runtime = runtime or config.runtimes[0]
    denial = Denial(
        time=time.time(),
        container_id=inv.container_id or "",
        bundle=bundle,
        root=os.path.abspath(inv.root) if inv.root else default_root(runtime),
        runtime=runtime,
        action=action,
        reason=reason,
        asked=asked_of(claim) if claim is not None else (),
        **identity_fields(identity),
    )
    warning = append_denial(
        denials_path(config.grants_journal), denial, config.grants_journal_max_bytes
    )
    if warning is not None:
        _warn(warning, inv)


def _cwd() -> str:
    """The bundle when no ``--bundle`` is given (runc's rule): the current directory."""
    from nvshim.errors import HostError

    try:
        return os.getcwd()
    except OSError as exc:
        raise HostError(f"no --bundle and no current directory: {exc.strerror}") from exc


def _absolute(path: str, cwd: Optional[str] = None) -> str:
    """``path`` (``--bundle``) made absolute against the current directory, so that the
    debug log and every message name the bundle wherever they are read. ``.`` components
    are dropped; ``..`` ones are kept: past a symlink only the kernel knows where they
    lead, and runc reads config.json the kernel's way."""
    if not path.startswith("/") and cwd is not None:
        path = f"{cwd}/{path}"
    if not path.startswith("/"):
        from nvshim.errors import HostError

        try:
            path = f"{os.getcwd()}/{path}"
        except OSError as exc:
            raise HostError(
                f"--bundle {path} is relative and there is no current directory: {exc.strerror}"
            ) from exc
    return "/" + "/".join(part for part in path.split("/") if part and part != ".")


def _load_config(inv: Invocation) -> Config:
    """The config; a create whose named config is missing fails (fail closed: the built-in
    defaults have require-allocation off). Other commands go on with the defaults, so that
    containers can still be stopped and deleted."""
    from nvshim.config import config_named, config_path, load_config
    from nvshim.errors import NvshimError

    try:
        config = load_config()
    except NvshimError as exc:
        _fail(str(exc), inv)
    if config.source is None and inv.modifies:
        named = config_named()
        if named:
            _fail(
                f"config {config_path()} does not exist (named by {named}): nvshim-runtime "
                "creates no container with the built-in defaults (require-allocation off) "
                "in its place; restore it, or name the config that exists",
                inv,
            )
    return config


def _restore_locale_env() -> None:
    """Give the runtime the caller's LC_CTYPE: CPython sets LC_CTYPE=C.UTF-8 in its own
    environment when started in the C locale (PEP 538), and that would reach runc. The
    trampoline says what it was (``-X nvshim-lc-ctype=VALUE`` or ``-X nvshim-lc-ctype-unset``);
    started any other way, the environment is left as it is."""
    xoptions = getattr(sys, "_xoptions", {})
    if "nvshim-lc-ctype-unset" in xoptions:
        os.environ.pop("LC_CTYPE", None)
    elif isinstance(xoptions.get("nvshim-lc-ctype"), str):
        os.environ["LC_CTYPE"] = xoptions["nvshim-lc-ctype"]


def _restore_ignored_signals() -> None:
    """Undo CPython's SIG_IGN for SIGPIPE and SIGXFSZ (set at every start-up): an ignored
    signal stays ignored across exec, and crun's hooks inherited it. Callers (containerd's
    Go shim, conmon) leave both at their default, which the runtime gets back; which of
    them a caller had ignored cannot be known once CPython has started (reading it in the
    trampoline costs a fork per create: BENCHMARKS.md), so a caller that ignores them
    deliberately is not
    mirrored. Other signals are CPython's to leave alone, and it does."""
    import _signal  # type: ignore[import-not-found]  # C module; signal.py imports enum

    _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)


def create(
    inv: Invocation,
    config: Config,
    runtime: Optional[str],
    cwd: Optional[str] = None,
    before_writes: Optional[Callable[[], None]] = None,
    served_by: str = "runtime",
) -> Optional[str]:
    """Plan and commit a create/run: None when done, else the one-line failure (its
    denial recorded; the caller reports it). Warnings go to ``inv.log``.

    ``cwd`` is the caller's working directory (default this process's): a relative
    ``--bundle`` is resolved against it. ``before_writes`` runs once the plan is made and
    before the journal, the rootfs or config.json is written; it may raise
    :class:`nvshim.errors.Abandoned`, which propagates. ``served_by`` names who did it
    (the runtime, the agent) in config.json's annotation and the debug log.
    """
    from nvshim.errors import Abandoned, NvshimError

    log = None  # the debug log (off by default: then neither imported nor fed)
    if config.debug_log:
        from nvshim.runtime.logs import open_debug_log

        log = open_debug_log(
            config.debug_log, lambda message: _warn(message, inv), id=inv.container_id
        )
    bundle: Optional[str] = None
    try:
        if inv.error:
            from nvshim.errors import UsageError

            raise UsageError(f"{inv.command}: {inv.error}")
        from nvshim.runtime.create import commit, plan_create

        bundle = _absolute(inv.bundle, cwd) if inv.bundle else (cwd or _cwd())
        plan = plan_create(bundle, config, log=log, save_cache=True)
        if before_writes is not None:
            before_writes()
        for warning in plan.warnings:
            _warn(warning, inv)
            if log is not None:
                log.event("warning", bundle=bundle, message=warning)
        if config.grants_journal and plan.granted_uuids:
            _record_grant(plan, config, inv, bundle, runtime)
        elif (
            config.grants_journal and plan.request.source == "none" and plan.claim.claims_gpus
        ):  # cheap: a container asking nothing stops here
            from nvshim.runtime.denials import strip_reason

            stripped = strip_reason(plan)
            if stripped is not None:
                if log is not None:
                    log.event("stripped", bundle=bundle, reason=stripped)
                _record_denial(config, inv, bundle, runtime, "stripped", stripped, plan)
        done = commit(plan, log, served_by)
        if log is not None:
            log.event("create", bundle=bundle, rewritten=done.written, served_by=served_by)
    except Abandoned:
        raise
    except NvshimError as exc:
        if log is not None:
            log.error("create failed", error=str(exc))
        from nvshim.errors import RequestError

        message = str(exc)
        if isinstance(exc, RequestError) and config.grants_journal and bundle is not None:
            try:  # record or fail: the refusal fails anyway, and says it went unrecorded
                _record_denial(config, inv, bundle, runtime, "refused", message)
            except NvshimError as unrecorded:
                message = f"{message} (not recorded: {unrecorded})"
        return message
    except Exception as exc:  # noqa: BLE001 - last resort: one line, never a traceback
        if log is not None:
            log.error("create failed", error=repr(exc))
        return f"internal error: {type(exc).__name__}: {exc}"
    return None


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    inv = parse_argv(args)
    config = _load_config(inv)
    # looked up once: the grant journal records it and it is exec'd below
    runtime = find_runtime(config.runtimes, os.environ.get("PATH"))
    if runtime is None:
        # before any edit: a create that cannot be handed over leaves config.json as it was
        _fail(
            f"no low-level runtime found: tried {', '.join(config.runtimes)} "
            f"(config runtimes) on PATH={os.environ.get('PATH', '')}",
            inv,
        )
    from nvshim.files import executable_problem  # loaded with the config already

    untrusted = executable_problem(runtime, "runtime")
    if untrusted:  # every command: it would run as root, as would a create's runc
        _fail(f"{untrusted} (runtimes: in {config.source or 'the built-in defaults'})", inv)

    if inv.modifies:
        failure = create(inv, config, runtime)
        if failure is not None:
            _fail(failure, inv)

    if inv.version:
        # like nvidia-container-runtime: our version first, then the low-level runtime's
        from nvshim import __version__

        sys.stdout.write(f"nvshim-runtime version {__version__}\n\n")
        sys.stdout.flush()
    _restore_locale_env()
    _restore_ignored_signals()
    try:
        os.execv(runtime, [runtime] + args)
    except OSError as exc:
        _fail(f"cannot execute {runtime}: {exc.strerror}", inv)


if __name__ == "__main__":
    main()

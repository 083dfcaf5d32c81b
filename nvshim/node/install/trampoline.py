"""The installed ``nvshim-runtime``: a POSIX sh trampoline in front of Python.

CPython's start (BENCHMARKS.md) is a cost runc's passthrough commands (start, state, kill,
delete, exec …) must not pay on every call. The trampoline decides "create/run or not" and
finds the bundle exactly as :func:`nvshim.runtime.argv.parse_argv` does (a differential test
checks both on hundreds of argv vectors); every other command is exec'd straight to the
low-level runtime.

For create/run it also skips Python when ``config.json`` cannot ask for anything: a spec
that contains none of ``NVIDIA_``, ``CUDA_VERSION``, ``nvidia-container-devices``,
``/dev/nvidia`` (a GPU the engine injected itself: :mod:`nvshim.runtime.engine`),
``nvidia-container-runtime-hook`` (``docker run --gpus``'s hook, which nvshim removes even
when Docker named no device), an annotation prefix, or a ``\\u``/``\\/`` JSON escape that
could hide one requests no GPU, and nvshim would leave it byte-identical anyway.

An engine can inject a GPU at any container path (``/dev/gpu1``, ``/dev/dri/card1``) into a
spec with none of that text; what it cannot change is the device number. config.json gives a
device's major as a JSON integer under the key ``major`` (``linux.devices`` and its cgroup
rule; runc refuses any other number form), so :data:`MAJOR_PATTERN` sends to Python every
spec with ``"major"`` (any letter case: runc matches keys case-insensitively; an escaped
key holds a ``\\u``) followed by 195 (the NVIDIA driver's fixed major) or a major the
kernel hands out dynamically (234-254, 384-511: ``nvidia-uvm``, ``nvidia-caps``, the IMEX
channels), or by a line break before the number (grep reads line by line), or by a number of ten
digits or more, either sign: runc keeps a device number's low 32 bits, so ``195 + 2**32``
is 195 to it; Python refuses every number outside 0..2^32-1
(:func:`nvshim.runtime.claim.image_view`), and a number of nine digits or fewer is below
2^32 (a negative one is, in 32 bits, above every NVIDIA major). Pods without a
GPU carry the fixed majors of ``/dev/null``, ttys and ``/dev/fuse`` only, and stay on the
fast path; a pod with another driver's dynamic-major device pays the Python start, which
leaves its spec untouched. The whole test is one ``grep -E`` (measured: as fast as the
``grep -F`` it replaced), so the annotation prefixes are written as ERE literals
(:func:`ere_literal`). Where the agent's socket and client are there, the client makes
the same test itself (``nvshim-agent-client --scan``, docs/agent.md) and grep does not run:
one process fewer on every create (``bench/execcost.py``); it sends a create on wherever
grep would, and also where it cannot judge as grep would. On a node
where nvshim is containerd's default runtime that is every pod without a GPU. Such creates
leave no debug-log record. A create whose config file is missing always reaches Python,
which fails it: the config the script embeds is *named* (install.sh writes it), and a named
config that is missing never means the built-in defaults (:func:`nvshim.config.config_named`).

Before the hand-over the runtime found and each directory above it must be owned by root
(``test -O``, no fork); otherwise Python starts, and refuses a runtime others could write
(:func:`nvshim.files.executable_problem`). Modes need a fork, so they are checked where the
list is made: ``nvshim config compile`` writes no list naming a runtime others could write.
One whose mode root loosens after compile is refused by every create that reaches Python
and reported by ``nvshim doctor``.

The low-level runtime list and the annotation prefixes come from ``<config stem>.runtimes``
and ``.annotation-prefixes``, written by ``nvshim config compile`` next to the compiled
config (one entry per line, read without word splitting or globbing). They carry the
YAML's mtime and sit next to a hard link to it (``<stem>.source-link``); unless the YAML
is still that inode with that exact mtime (edited, replaced or copied in since the last
compile, even with an older mtime) the trampoline hands everything to Python, which reads
the YAML itself — slower, never wrong.

Why one module: most of its lines are the sh script, one template read top to bottom in
the order sh runs it; the Python around it only checks and fills in the values. Cut into
pieces, the script's order (argv, the compiled lists, the grep, the agent, the hand-over)
could no longer be read in one place.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from nvshim.agent import AGENT_SOCKET
from nvshim.config import prefixes_path, runtimes_path  # the files the script reads
from nvshim.errors import UsageError

__all__ = [
    "render",
    "runtimes_path",
    "prefixes_path",
    "default_paths",
    "UnsafeValue",
    "MAJOR_PATTERN",
    "ere_literal",
]

#: grep -E: a ``major`` key whose value is (or may be, past a line break) 195 or a dynamic
#: major, or is outside 32 bits (see the module docstring).
MAJOR_PATTERN = (
    '"[Mm][Aa][Jj][Oo][Rr]"[[:space:]]*(:[[:space:]]*((195|23[4-9]|24[0-9]|'
    "25[0-4]|38[4-9]|39[0-9]|4[0-9][0-9]|50[0-9]|51[01])([^0-9]|$)|-?[0-9]{10})"
    "|:?[[:space:]]*$)"
)


def ere_literal(text: str) -> str:
    """``text`` as a POSIX extended regular expression matching it literally."""
    return "".join(f"\\{c}" if c in ".[]()*+?{}|^$\\" else c for c in text)


class UnsafeValue(UsageError, ValueError):
    """A path or version :func:`render` will not put into an sh script. Also a ValueError,
    which is what callers that check a trampoline (``nvshim doctor``) catch."""


_TEMPLATE = r"""#!/bin/sh
# nvshim-runtime — generated by nvshim's install.sh; do not edit (re-run install.sh).
# Decides whether runc's argv is create/run (then nvshim edits config.json, in Python)
# or anything else (then runc/crun is exec'd directly with the same argv, env and fds).
# shellcheck disable=SC2034 # py is read from this file by nvshim doctor (doctor/config.py)
py=@PYTHON@
conf=${NVSHIM_CONFIG:-@CONFIG@}
# CPython replaces a C locale's LC_CTYPE with C.UTF-8 in its environment (PEP 538, -I does
# not stop it); -X tells nvshim what the caller's LC_CTYPE was, so runc gets that back.
python() {
    if [ -n "${LC_CTYPE+set}" ]; then
        exec @LAUNCH@ -I -S -X "nvshim-lc-ctype=$LC_CTYPE" -c @BOOT@ "$@"
    fi
    exec @LAUNCH@ -I -S -X nvshim-lc-ctype-unset -c @BOOT@ "$@"
}

# 1. The command and, for create/run, the bundle, in runc's or crun's grammar: parsed
#    exactly as nvshim/runtime/argv.py does (its docstring explains the rules).
# crun's long options (argp accepts an unambiguous prefix): name:effect
gopts='cgroup-manager:value debug:bool log:value log-format:value root:value rootless:value
systemd-cgroup:bool help:help usage:help version:version program-name:value HANG:bool'
copts='bundle:bundle config:config console-socket:value detach:bool no-new-keyring:bool
no-pivot:bool no-subreaper:bool pid-file:value preserve-fds:value help:help usage:help
program-name:value HANG:bool'
# prefix NAME STRICT OPTIONS: eff := the effect of --NAME as a prefix ('' unknown, or
# 'ambiguous' for several options — unless not STRICT and they share one effect)
prefix() {
    eff=
    [ -n "$1" ] || return 0
    for o in $3; do
        case ${o%%:*} in
            "$1"*) if [ -z "$eff" ]; then eff=${o#*:}
                   elif [ "$eff" != "${o#*:}" ] || [ "$2" = 1 ]; then eff=ambiguous; fi ;;
        esac
    done
}
cmd= sub=0 skip= dd=0 bundle= err=0 ver=0 agent=0
for a in "$@"; do
    if [ -n "$skip" ]; then
        [ "$skip" = bundle ] && bundle=$a
        [ "$skip" = config ] && { err=1; skip=; break; }
        skip=; continue
    fi
    name=$a
    while :; do case $name in -*) name=${name#-} ;; *) break ;; esac; done
    hasval=0
    case $name in *=*) name=${name%%=*}; hasval=1 ;; esac
    if [ "$sub" = 0 ]; then
        if [ "$dd" = 1 ]; then
            cmd=$a; sub=1
        else
            case $a in
                --) dd=1 ;;
                -) cmd=$a; sub=1 ;;
                -*)
                    case $name in
                        log|log-format|root|rootless|criu|cgroup-manager) eff=value ;;
                        debug|systemd-cgroup) eff=bool ;;
                        v|version|V) eff=version ;;
                        h|help|usage|'?') eff=help ;;
                        *) case $a in
                               --*) prefix "$name" 0 "$gopts" ;;
                               -[vV]*) eff=version ;;
                               -[?]*) eff=help ;;
                               *) eff= ;;
                           esac ;;
                    esac
                    case $eff in
                        version) cmd= ver=1; break ;;
                        help) cmd=; break ;;
                        value) [ "$hasval" = 0 ] && skip=global ;;
                    esac
                    ;;
                *) cmd=$a; sub=1 ;;
            esac
        fi
        case $sub:$cmd in 1:create|1:run|0:*) ;; *) break ;; esac
        continue
    fi
    case $a in
        --) break ;;
        -) continue ;;
        --*)
            case $name in
                bundle|b) eff=bundle ;;
                config) eff=config ;;
                console-socket|pid-file|preserve-fds|program-name) eff=value ;;
                no-pivot|no-new-keyring|no-subreaper|detach|d|keep|HANG) eff=bool ;;
                help|h|usage) eff=help ;;
                *) prefix "$name" 1 "$copts"
                   [ "$eff" = ambiguous ] && { err=1; break; } ;;
            esac
            val=${a#*=} ;;
        -*)
            # runc reads -NAME as --NAME; crun reads short options d, b, f, ? clustered
            case $name in
                bundle|b) runc=bundle ;;
                console-socket|pid-file|preserve-fds) runc=value ;;
                no-pivot|no-new-keyring|detach|d|keep) runc=bool ;;
                help|h) runc=help ;;
                *) runc= ;;
            esac
            rest=${a#-} crun= cval=
            while :; do
                case $rest in
                    '') crun=bool; break ;;
                    d*) rest=${rest#d} ;;
                    b*) crun=bundle cval=${rest#b}; break ;;
                    f*) crun=config cval=${rest#f}; break ;;
                    [?]*) crun=help; break ;;
                    *) break ;;
                esac
            done
            if [ -n "$runc" ] && [ -n "$crun" ]; then
                if [ "$hasval" = 1 ] || [ -n "$cval" ] || [ "$runc" != "$crun" ]; then
                    err=1; break
                fi
            fi
            if [ -n "$runc" ]; then
                eff=$runc val=${a#*=}
            elif [ -n "$crun" ]; then
                eff=$crun val=$cval hasval=0
                [ -n "$cval" ] && hasval=1
            else
                eff=
            fi ;;
        *) continue ;;
    esac
    case $eff in
        help)
            # the runtime prints the command's help and creates nothing: pass (runc's
            # --help=false / -h=false is no help; other values fail in both runtimes)
            given=${a#"${a%%[!-]*}"}
            case $hasval:${given%%=*}:$val in
                1:help:0|1:help:f|1:help:F|1:help:FALSE|1:help:false|1:help:False) ;;
                1:h:0|1:h:f|1:h:F|1:h:FALSE|1:h:false|1:h:False) ;;
                *) cmd=; break ;;
            esac ;;
        bundle|config|value)
            if [ "$hasval" = 0 ]; then
                skip=$eff
            elif [ "$eff" = bundle ]; then
                bundle=$val
            elif [ "$eff" = config ]; then
                err=1; break
            fi ;;
    esac
done
[ "$sub" = 1 ] && [ -n "$skip" ] && err=1

case $cmd in
    create|run) decision=modify ;;
    *) decision=pass ;;
esac
if [ -n "${NVSHIM_TRAMPOLINE_DECIDE:-}" ]; then
    echo "$decision"
    if [ "$NVSHIM_TRAMPOLINE_DECIDE" = bundle ] && [ "$decision" = modify ]; then
        printf '%s:%s\n' "$err" "$bundle"
    fi
    exit 0
fi

# 2. The compiled lists; a YAML newer than them means "let Python read the YAML".
fresh=0
if [ -e "$conf" ]; then
    list=${conf%.yaml}.runtimes
    prefixes=${conf%.yaml}.annotation-prefixes
    # fresh: the YAML is the inode compile hard-linked, with the mtime compile copied onto
    # both lists (equal, not "not newer": cp -p or rsync -t bring older mtimes).
    # Owned by us (root): a file someone else owns or wrote goes to Python, which refuses it.
    # -O, -ef and -nt are not in POSIX.1-2017's test, but every /bin/sh a node has (dash,
    # bash, busybox ash: tests/unit/node/install/test_trampoline.py runs all three) has them,
    # and the portable way (stat) forks on every passthrough call.
    # shellcheck disable=SC3013
    if [ -O "$list" ] && [ -O "$prefixes" ] && [ -O "$conf" ] \
        && [ "$conf" -ef "${conf%.yaml}.source-link" ] \
        && [ ! "$conf" -nt "$list" ] && [ ! "$list" -nt "$conf" ] \
        && [ ! "$conf" -nt "$prefixes" ] && [ ! "$prefixes" -nt "$conf" ]; then
        fresh=1
    fi
    [ "$fresh" = 1 ] || python "$@"
fi

# 3. create/run: Python only when config.json can ask for something (node/install/trampoline.py).
#    Without the config, always: a missing config fails the create (fail closed).
if [ "$decision" = modify ]; then
    [ -e "$conf" ] || python "$@"
    [ "$err" = 0 ] || python "$@"
    spec=${bundle:-.}/config.json
    # Missing, a directory, a FIFO, a device: Python says so in one line (it never blocks).
    [ -f "$spec" ] || python "$@"
    if [ -S "${NVSHIM_AGENT_SOCKET:-@SOCKET@}" ] && [ -x @CLIENT@ ]; then
        # the agent's client reads config.json itself, with the same patterns: no grep
        # (one process fewer on every create; it asks the agent more often, never less)
        agent=scan
    else
        grep=/usr/bin/grep
        [ -x "$grep" ] || grep=/bin/grep
        [ -x "$grep" ] || python "$@"
        # -s: no message of grep's own (a vanished file is exit 2: Python reports it);
        # -D skip: a FIFO or device swapped in after the -f test is not read (never hangs);
        # 2>/dev/null: nor its loader's (a node whose C library broke: 127, Python decides).
        # One grep -E (a second grep would cost every pod one more fork+exec); the last is a
        # device number the NVIDIA driver may own, under any key case and any line breaks
        # (nvshim/node/install/trampoline.py says why it is enough). LC_ALL=C: bytes, in
        # every locale.
        LC_ALL=C "$grep" -q -s -D skip -E -e NVIDIA_ -e CUDA_VERSION \
            -e nvidia-container-devices -e /dev/nvidia -e nvidia-container-runtime-hook \
            -e '\\u' -e '\\/' -e @MAJOR@ -f "$prefixes" -- "$spec" </dev/null 2>/dev/null
        [ $? = 1 ] || agent=1
    fi
fi

# 4. Hand over to the first low-level runtime found. The list is read on stdin inside the
#    loop only (restored when it ends, before exec): any other fd may be one the caller
#    passes on (--preserve-fds, LISTEN_FDS, containerd's fds 3 and 4) and must reach the
#    runtime as it came. --version: nvshim's version first, then the runtime's (as
#    nvidia-container-runtime does).
pick() {
    found=
    while IFS= read -r r || [ -n "$r" ]; do
        case $r in
            /*) if [ -f "$r" ] && [ -x "$r" ]; then found=$r; break; fi ;;
            */*|'') ;;
            *) p=$(command -v -- "$r" 2>/dev/null </dev/null) || continue
               case $p in /*) found=$p; break ;; esac ;;
        esac
    done
}
if [ -e "$conf" ]; then
    pick < "$list"
else
    pick <<'DEFAULTS'
runc
crun
DEFAULTS
fi
if [ -n "$found" ] && [ -O / ]; then
    # As root: the runtime and every directory above it must be root's (no fork: test -O),
    # else Python judges it (nvshim.files.executable_problem) and refuses what others own.
    d=$found
    while [ -n "$d" ]; do
        [ -O "$d" ] || python "$@"
        d=${d%/*}
    done
fi
@AGENT@
if [ -n "$found" ]; then
    [ "$ver" = 0 ] || printf 'nvshim-runtime version %s\n\n' @VERSION@
    exec "$found" "$@"
fi
# Nothing found: let Python report it (one line on stderr and in runc's --log).
python "$@"
"""


#: What stands for ``@AGENT@``: a create that needs nvshim asks the resident agent first
#: (:mod:`nvshim.agent`, ``docs/agent.md``). The client's exit status: 0 config.json is
#: edited (go on to exec the runtime), 1 the agent refused the create (its line is out),
#: anything else (no agent, no client, a timeout, another version or config): Python.
_AGENT_BLOCK = r"""# 4b. A create that needs nvshim: the resident agent (nvshim agent) edits
#     config.json through a small client when it serves this very config; otherwise, or when
#     anything fails on the way, Python does it here (docs/agent.md). Never runc unedited.
#     With agent=scan the client first reads config.json as step 3's grep would (exit 3:
#     it asks for nothing, the runtime runs on it as it is).
if [ "$agent" != 0 ]; then
    sock=${NVSHIM_AGENT_SOCKET:-@SOCKET@} rc=2
    if [ -n "$found" ] && [ -S "$sock" ] && [ -x @CLIENT@ ]; then
        if [ "$agent" = scan ]; then
            @CLIENT@ --scan "$prefixes" @MAJOR@ "$sock" @VERSION@ "$conf" "$found" "$bundle" \
                "$@" </dev/null
        else
            @CLIENT@ "$sock" @VERSION@ "$conf" "$found" "$bundle" "$@" </dev/null
        fi
        rc=$?
    fi
    [ "$rc" = 1 ] && exit 1
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || python "$@"
fi"""


def _plain(path: str) -> bool:
    return path.startswith("/") and not any(c in path for c in " \t\n'\"$`\\")


def default_paths() -> List[str]:
    """nvshim's parent directory and the running interpreter's site-packages."""
    import sysconfig

    import nvshim

    out = [os.path.dirname(os.path.dirname(os.path.abspath(nvshim.__file__)))]
    for key in ("purelib", "platlib"):
        candidate = sysconfig.get_paths()[key]
        if candidate not in out and os.path.isdir(candidate):
            out.append(candidate)
    return out


def render(
    python: str,
    paths: Optional[Sequence[str]] = None,
    config: Optional[str] = None,
    launch: Optional[Sequence[str]] = None,
    preload: Optional[str] = None,
    agent_socket: Optional[str] = None,
    client: Optional[str] = None,
) -> str:
    """The trampoline script for an nvshim installed in ``python``'s environment.

    Python starts with ``-I -S``: ``site`` (and an editable install's import finder) costs
    on every start, so the directories that hold nvshim and its dependencies
    (``paths``, default :func:`default_paths`) are put on ``sys.path`` directly.
    ``config`` is the config file used when ``NVSHIM_CONFIG`` is unset (default
    ``/etc/nvshim/config.yaml``; install.sh passes its ``NVSHIM_ETCDIR``): the script and
    the Python it starts both use it, without adding anything to the environment the
    low-level runtime gets.
    """
    from nvshim.config import DEFAULT_CONFIG_PATH

    if not _plain(python):
        raise UnsafeValue(f"interpreter path must be absolute and plain: {python!r}")
    config = config or DEFAULT_CONFIG_PATH
    if not _plain(config):
        raise UnsafeValue(f"config path must be absolute and plain: {config!r}")
    words = ['"$py"']
    if launch:
        words = list(launch)
        for word in words:
            option = word.startswith("--") and word[2:].replace("-", "").isalnum()
            if not (_plain(word) or option):
                raise UnsafeValue(f"launch words must be absolute paths or options: {word!r}")
    entries = list(default_paths() if paths is None else paths)
    for path in entries:
        if not _plain(path):
            raise UnsafeValue(f"sys.path entry must be absolute and plain: {path!r}")
    import json

    # double-quoted list: the code sits inside single quotes in the script. The embedded
    # config is named (install.sh writes it): missing, it fails a create (config_named).
    default = "import nvshim.config as c; c.DEFAULT_CONFIG_NAMED = True; " + (
        "" if config == DEFAULT_CONFIG_PATH else f"c.DEFAULT_CONFIG_PATH = {json.dumps(config)}; "
    )
    first = ""  # the preload file first: nvshim.config above comes from it too
    if preload is not None:
        if not _plain(preload):
            raise UnsafeValue(f"preload path must be absolute and plain: {preload!r}")
        first = f"import nvshim._preload as p; p.install({json.dumps(preload)}); "
    boot = (
        f"import sys; sys.path[0:0] = {json.dumps(entries)}; {first}{default}"
        "from nvshim.runtime.main import main; main()"
    )
    from nvshim import __version__

    if not all(c.isalnum() or c in ".+-" for c in __version__):
        raise UnsafeValue(f"version must be plain: {__version__!r}")
    agent_socket = agent_socket or AGENT_SOCKET
    if client is None:
        from nvshim.agent.client import client_path

        client = client_path(python)
    for value, what in ((agent_socket, "agent socket"), (client, "agent client")):
        if not _plain(value):
            raise UnsafeValue(f"{what} path must be absolute and plain: {value!r}")
    agent = _AGENT_BLOCK
    return (
        _TEMPLATE.replace("@AGENT@", agent)
        .replace("@SOCKET@", agent_socket)
        .replace("@CLIENT@", client)
        .replace("@PYTHON@", python)
        .replace("@BOOT@", f"'{boot}'")
        .replace("@VERSION@", __version__)
        .replace("@CONFIG@", config)
        .replace("@MAJOR@", f"'{MAJOR_PATTERN}'")
        .replace("@LAUNCH@", " ".join(words))
    )

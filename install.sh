#!/bin/sh
# Install nvshim (run as root). Idempotent: running it again brings the installation up to
# date and changes nothing that is already right.
#
#   ./install.sh                      build nvshim's self-contained runtime (its own Python and C
#                                     library, in /opt/nvshim) and install it: the commands
#                                     nvshim and nvshim-runtime in /usr/local/bin
#   ./install.sh --payload DIR        only build it, into DIR: DIR/opt/nvshim, DIR/usr/local/bin,
#                                     DIR/install.sh, DIR/config/config.yaml (no root needed)
#   sh DIR/install.sh --from DIR      install a payload built earlier; the node needs /bin/sh and
#                                     coreutils, no python3 (sh DIR/install.sh alone does the same)
#   ./install.sh --dev                instead a venv in /opt/nvshim/venv with this checkout
#                                     editable, the test dependencies and container engines
#   ./install.sh --containerd         also register nvshim as a containerd runtime handler
#   ./install.sh --docker             also register it as a Docker runtime (/etc/docker/daemon.json),
#                                     and nvidia-container-runtime-hook beside nvshim-runtime (--gpus)
#   ./install.sh --crio               also register it as a CRI-O runtime handler (drop-in)
#   ./install.sh --containerd --nri   ... and turn on containerd 1.7's NRI (same drop-in, restart
#                                     and revert) for nvshim agent's NRI plugin; 2.x: nothing changes
#   ./install.sh --containerd --set-as-default
#                                     ... and make it the engine's default runtime (refused unless
#                                     /etc/nvshim/config.yaml has require-allocation: true)
#   ./install.sh --uninstall          remove exactly what earlier runs added, and the prefix;
#                                     the grant and denial journals stay (running containers
#                                     still hold what they record); while containerd tasks
#                                     still run through nvshim-runtime it becomes a forwarder
#                                     to runc, which a later --uninstall removes once none is left
#   ./install.sh --uninstall --purge  ... and remove those journals too: only the files and
#                                     folders nvshim's config named when install.sh ran and that
#                                     did not exist then (recorded in the manifest), never a
#                                     path a config names later
#
# The installed copy, sh /opt/nvshim/install.sh, does every option above but --dev and
# --payload (they build from a checkout): --containerd, --docker, --crio, --set-as-default,
# --from DIR, --uninstall [--purge], or nothing (recompile the config). It keeps the
# installed runtime; pass the NVSHIM_* settings the install used.
#
# NVSHIM_BINDIR (/usr/local/bin): where the two commands go. Supported: on a node whose /usr
# is read-only (Container-Optimized OS, Bottlerocket, Flatcar, Talos) set it to a writable
# directory outside NVSHIM_PREFIX, e.g. /opt/bin; the engines' configs name the runtime by
# its full path, doctor looks there (the installed nvshim command carries the setting) and
# --uninstall removes the folder again when it made it and it is empty.
# Other paths can be moved too: NVSHIM_PREFIX (/opt/nvshim), NVSHIM_ETCDIR (/etc/nvshim),
# NVSHIM_CONTAINERD_CONFIG (/etc/containerd/config.toml), NVSHIM_CONTAINERD_DROP_IN
# (<containerd config dir>/conf.d/99-nvshim.toml), NVSHIM_DOCKER_CONFIG (/etc/docker/daemon.json),
# NVSHIM_CRIO_CONFIG (/etc/crio/crio.conf), NVSHIM_CRIO_DROP_IN
# (<crio config dir>/crio.conf.d/99-nvshim.toml). NVSHIM_SKIP_APT=1 skips packages.
# NVSHIM_SYSTEMD_DIR, NVSHIM_UDEV_DIR: where the CDI refresh units and udev rule go
# (default: /etc/systemd/system and /etc/udev/rules.d, only where systemd runs).
# NVSHIM_PYTHON (/usr/bin/python3) is the interpreter a payload bundles (CPython 3.11+).
# NVSHIM_AGENT_NRI_SOCKET (none): the NRI socket nvshim-agent.service registers with.
# NVSHIM_KUBELET_SOCKET (/var/lib/kubelet/pod-resources/kubelet.sock): where a kubelet's
# PodResources socket is; a config written where it exists says verify-with: kubelet.
# NVSHIM_AGENT_UNIT (auto): auto writes nvshim-agent.service where systemd runs; off writes none
# and removes one an earlier install enabled (another process runs the agent: the DaemonSet's
# agent container, which its installer says with this setting).
#
# Restarting the engine after its config changed (and after --uninstall's revert):
#   NVSHIM_RESTART_MODE     auto (default): systemctl restart, only for the engine's system config
#                           and only when systemd runs it, else say so; systemd: systemctl restart
#                           NVSHIM_RESTART_UNIT; signal (containerd): NVSHIM_RESTART_SIGNAL to the
#                           process that owns NVSHIM_CONTAINERD_SOCKET, its supervisor restarts it;
#                           none: the operator restarts it
#   NVSHIM_RESTART_UNIT     the systemd unit (default: the engine's name; k3s: k3s or k3s-agent,
#                           RKE2: rke2-server or rke2-agent, microk8s: snap.microk8s.daemon-containerd)
#   NVSHIM_CONTAINERD_SOCKET  containerd's socket (/run/containerd/containerd.sock)
#   NVSHIM_RESTART_SIGNAL   SIGHUP;  NVSHIM_RESTART_TIMEOUT  60 (seconds containerd has to answer)
#   NVSHIM_CONTAINERD_CONFIG_SEED  a file copied to a missing containerd config first (k3s/RKE2:
#                           the generated config.toml beside config.toml.tmpl, less its
#                           "DO NOT EDIT" header lines); uninstall removes it
# With systemd or signal, containerd must answer on its socket before the change and again after
# the restart; when it does not come back, the previous config is put back byte for byte,
# containerd restarted again, and install.sh fails with one line naming the config and the socket.
# A missing containerd config is an error, not created (an empty file means containerd's defaults).
#
# A default runtime's config: with --set-as-default the config is compiled with
# `nvshim config compile --default-runtime`: refused (nothing changed, one line) unless it has
# require-allocation: true (a file of only comments counts as empty), and marked
# (config.default-runtime) so every later compile refuses the same.
#
# Every file and folder it writes gets an explicit mode (umask 022, then chmod); the manifest
# ($NVSHIM_PREFIX/install-manifest) is read only when root owns it and no one else can write it.
set -eu
umask 022

PREFIX=${NVSHIM_PREFIX:-/opt/nvshim}
BINDIR=${NVSHIM_BINDIR:-/usr/local/bin}
ETCDIR=${NVSHIM_ETCDIR:-/etc/nvshim}
CONTAINERD_CONFIG=${NVSHIM_CONTAINERD_CONFIG:-/etc/containerd/config.toml}
# the drop-in sits next to the config it belongs to (a moved config never writes /etc/containerd)
CONTAINERD_DROP_IN=${NVSHIM_CONTAINERD_DROP_IN:-$(dirname "$CONTAINERD_CONFIG")/conf.d/99-nvshim.toml}
DOCKER_CONFIG=${NVSHIM_DOCKER_CONFIG:-/etc/docker/daemon.json}
CRIO_CONFIG=${NVSHIM_CRIO_CONFIG:-/etc/crio/crio.conf}
CRIO_DROP_IN=${NVSHIM_CRIO_DROP_IN:-$(dirname "$CRIO_CONFIG")/crio.conf.d/99-nvshim.toml}
RESTART_MODE=${NVSHIM_RESTART_MODE:-auto}
RESTART_UNIT=${NVSHIM_RESTART_UNIT:-}
RESTART_SIGNAL=${NVSHIM_RESTART_SIGNAL:-SIGHUP}
RESTART_TIMEOUT=${NVSHIM_RESTART_TIMEOUT:-60}
CONTAINERD_SOCKET=${NVSHIM_CONTAINERD_SOCKET:-/run/containerd/containerd.sock}
CONTAINERD_CONFIG_SEED=${NVSHIM_CONTAINERD_CONFIG_SEED:-}
VENV=$PREFIX/venv
MANIFEST=$PREFIX/install-manifest
SRC=$(cd "$(dirname "$0")" && pwd)
PYTHON=${NVSHIM_PYTHON:-/usr/bin/python3}

# run from the installed prefix (sh /opt/nvshim/install.sh): no sources, no payload beside it
INSTALLED_COPY=0
if [ -f "$SRC/payload-files" ] && [ -x "$SRC/bin/python3" ] && [ ! -f "$SRC/.nvshim-payload" ]; then
    INSTALLED_COPY=1
fi

DEV=0 CONTAINERD=0 DOCKER=0 CRIO=0 DEFAULT=0 NRI=0 UNINSTALL=0 PURGE=0 PAYLOAD= FROM=

say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --dev) DEV=1 ;;
        --containerd) CONTAINERD=1 ;;
        --docker) DOCKER=1 ;;
        --crio) CRIO=1 ;;
        --set-as-default) DEFAULT=1 ;;
        --nri) NRI=1 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        --payload|--from)
            [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a directory (see --help)"
            if [ "$1" = --payload ]; then PAYLOAD=$2; else FROM=$2; fi
            shift ;;
        --payload=*) PAYLOAD=${1#*=} ;;
        --from=*) FROM=${1#*=} ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
if [ -n "$PAYLOAD" ] && { [ -n "$FROM" ] || [ "$DEV$UNINSTALL$CONTAINERD$DOCKER$CRIO$DEFAULT" != 000000 ]; }; then
    die "--payload only builds: it goes with no other option"
fi
[ "$PURGE" = 1 ] && [ "$UNINSTALL" = 0 ] && die "--purge goes with --uninstall"
[ "$NRI" = 1 ] && [ "$CONTAINERD" = 0 ] && die "--nri turns containerd's NRI on in nvshim's containerd drop-in: it goes with --containerd (CRI-O has NRI on by default from 1.30: [crio.nri] enable_nri = true)"
[ "$DEV" = 1 ] && [ -n "$FROM" ] && die "--dev builds a venv from this checkout: it does not go with --from"
if [ "$INSTALLED_COPY" = 1 ] && { [ "$DEV" = 1 ] || [ -n "$PAYLOAD" ]; }; then
    die "--dev and --payload build from nvshim's sources: run them from a checkout's install.sh, not the installed copy $SRC/install.sh"
fi
case $BINDIR in
    "$PREFIX"|"$PREFIX"/*) die "NVSHIM_BINDIR=$BINDIR is inside NVSHIM_PREFIX=$PREFIX, which an install replaces: pick a folder outside it (e.g. /opt/bin)" ;;
esac
# run from a payload (DIR/install.sh) with no --from: install that payload
if [ -z "$FROM$PAYLOAD" ] && [ "$DEV" = 0 ] && [ -f "$SRC/.nvshim-payload" ]; then FROM=$SRC; fi

# --- the self-contained runtime (nvshim/node/install/prefix.py has its layout) ----------------
build_payload() {  # build_payload DIR: the payload for PREFIX/BINDIR/ETCDIR into DIR
    [ -f "$SRC/nvshim/node/install/payload.py" ] \
        || die "no nvshim sources in $SRC: run the checkout's install.sh, or install a payload with --from DIR"
    "$PYTHON" -I -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
        || die "$PYTHON cannot build the self-contained runtime: it needs CPython 3.11 or newer (set NVSHIM_PYTHON)"
    if ! "$PYTHON" -I -m pip --version >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || die "$PYTHON has no pip: install python3-pip"
        apt_install python3-pip
    fi
    mkdir -p "$1" || die "cannot create the payload directory $1"
    # -B: no __pycache__ in the checkout (the payload writes only under DIR)
    "$PYTHON" -I -B -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from nvshim.node.install.payload import main; main(sys.argv[1:])' \
        "$SRC" --dest "$1" --src "$SRC" --prefix "$PREFIX" --bindir "$BINDIR" --etcdir "$ETCDIR"
}

FILE_LIST="payload-files"
# --- engine restart settings, checked before anything is written -----------------------
case ${NVSHIM_AGENT_UNIT:-auto} in
    auto|off) ;;
    *) die "NVSHIM_AGENT_UNIT=$NVSHIM_AGENT_UNIT is neither auto nor off" ;;
esac
case $RESTART_MODE in
    auto|systemd|signal|none) ;;
    *) die "NVSHIM_RESTART_MODE=$RESTART_MODE is not one of auto, systemd, signal, none" ;;
esac
case $RESTART_TIMEOUT in
    ''|*[!0-9]*) die "NVSHIM_RESTART_TIMEOUT=$RESTART_TIMEOUT is not a whole number of seconds" ;;
esac
if [ "$CONTAINERD" = 1 ] && [ "$UNINSTALL" = 0 ] && [ ! -e "$CONTAINERD_CONFIG" ]; then
    # containerd runs on built-in defaults without a file; writing one where this node's
    # containerd does not look (k3s, RKE2, microk8s keep theirs elsewhere) would change nothing
    # and look done, so a missing file is the operator's call
    if [ -z "$CONTAINERD_CONFIG_SEED" ]; then
        die "containerd config $CONTAINERD_CONFIG does not exist: set NVSHIM_CONTAINERD_CONFIG to the file this node's containerd reads (k3s/RKE2: config.toml.tmpl with NVSHIM_CONTAINERD_CONFIG_SEED, see deploy/README.md), or create it (an empty file means containerd's defaults)"
    fi
    [ -f "$CONTAINERD_CONFIG_SEED" ] \
        || die "NVSHIM_CONTAINERD_CONFIG_SEED $CONTAINERD_CONFIG_SEED is not a file (it was to seed the missing containerd config $CONTAINERD_CONFIG)"
fi

# --- manifest: one line per thing this script added ("file PATH", "pkg NAME", ...) ---
# (read with the shell alone: a node may have nothing but /bin/sh and coreutils)
# trusted only when root owns it and only root can write it (and the prefix holding it):
# a line in it makes --uninstall delete a path as root
check_trusted() {  # check_trusted PATH: dies unless PATH is root's and not group/other-writable
    [ -e "$1" ] || return 0
    owner=$(stat -c %u "$1") mode=$(stat -c %a "$1")
    case $owner:$mode in
        0:*[2367]?|0:*[2367]) ;;
        0:*) return 0 ;;
    esac
    die "$1 is not trusted (owner uid $owner, mode $mode): it must be root's and writable by root only; check its lines, then chown root $1 && chmod go-w $1"
}
MANIFEST_CHECKED=0
check_manifest() {
    [ "$MANIFEST_CHECKED" = 1 ] && return 0
    check_trusted "$PREFIX"
    check_trusted "$MANIFEST"
    check_trusted "$PREFIX/$FILE_LIST"
    MANIFEST_CHECKED=1
}

record() {
    [ -d "$PREFIX" ] || mkdir -p "$PREFIX"  # 0755: umask 022
    check_manifest
    if [ -f "$MANIFEST" ]; then
        while IFS= read -r line; do [ "$line" = "$*" ] && return 0; done < "$MANIFEST"
    fi
    echo "$*" >> "$MANIFEST"
    chmod 0644 "$MANIFEST"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# nvshim's own command, whichever way it is installed (the self-contained prefix or --dev's venv)
run_nvshim() {
    if [ -f "$PREFIX/$FILE_LIST" ] && [ -x "$PREFIX/bin/python3" ]; then
        "$PREFIX/bin/python3" -I -S -c 'import sys; sys.path[0:0] = [sys.argv.pop(1)]; sys.argv[0] = "nvshim"; from nvshim.cli.main import main; main()' \
            "$PREFIX/site" "$@"
    else
        "$VENV/bin/nvshim" "$@"
    fi
}
# prefix_module MODULE ARG... / venv_module MODULE ARG...: MODULE's main(ARG...) in the
# prefix's Python / in --dev's venv
prefix_module() {
    "$PREFIX/bin/python3" -I -S -c 'import sys, importlib; sys.path[0:0] = [sys.argv.pop(1)]; importlib.import_module(sys.argv.pop(1)).main(sys.argv[1:])' \
        "$PREFIX/site" "$@"
}
venv_module() {
    "$VENV/bin/python3" -I -c 'import sys, importlib; importlib.import_module(sys.argv.pop(1)).main(sys.argv[1:])' "$@"
}
# nvshim_module MODULE ARG...: MODULE's main(ARG...) in nvshim's own Python, whichever way it
# is installed (as run_nvshim)
nvshim_module() {
    if [ -f "$PREFIX/$FILE_LIST" ] && [ -x "$PREFIX/bin/python3" ]; then
        prefix_module "$@"
    else
        venv_module "$@"
    fi
}
have_nvshim() { { [ -f "$PREFIX/$FILE_LIST" ] && [ -x "$PREFIX/bin/python3" ]; } || [ -x "$VENV/bin/nvshim" ]; }

# --- containers that still run through nvshim-runtime at uninstall ----------------------
# containerd's runc shim runs a container's runtime (nvshim-runtime, for the nvshim handler
# or a default runtime) for every later kill, delete and state, and names it in the task's
# options.json. Removed, each such container could never be stopped ("fork/exec
# .../nvshim-runtime: no such file or directory", the pod stuck Terminating until a reboot).
# So an uninstall that finds any leaves a forwarder in its place that hands every command to
# the runtime nvshim handed to, and a later --uninstall removes it once none is left.
FORWARDER_MARK="# nvshim-runtime-forwarder"
is_forwarder() { [ -f "$BINDIR/nvshim-runtime" ] && sed -n 2p "$BINDIR/nvshim-runtime" | grep -qx -- "$FORWARDER_MARK"; }
containerd_states() {  # the state folders of the node's containerds (the manifest's configs;
    echo /run/containerd  # with none left, the ones a forwarder names)
    echo /run/docker/containerd/daemon
    if is_forwarder; then sed -n 's/^# containerd-state: //p' "$BINDIR/nvshim-runtime"; fi
    [ -f "$MANIFEST" ] || return 0
    while read -r engine cfg _rest; do
        [ "$engine" = containerd ] && [ -f "$cfg" ] || continue
        # the top-level `state = "..."` (before the first table)
        sed -n '/^[[:space:]]*\[/q; s/^[[:space:]]*state[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$cfg"
    done < "$MANIFEST"
}
runtime_users() {  # how many containerd tasks name $BINDIR/nvshim-runtime as their runtime
    n=0
    for state in $(containerd_states | sort -u); do
        for options in "$state"/io.containerd.runtime.v2.task/*/*/options.json; do
            [ -f "$options" ] || continue
            grep -q -F "\"binary_name\":\"$BINDIR/nvshim-runtime\"" "$options" && n=$((n + 1))
        done
    done
    echo "$n"
}
write_forwarder() {  # write_forwarder N: $BINDIR/nvshim-runtime hands every command on to the
    # runtime nvshim hands to (nvshim/node/install/forwarder.py), for N containers still running
    containerd_states | sort -u | nvshim_module nvshim.node.install.forwarder \
        --path "$BINDIR/nvshim-runtime" --runtimes "$ETCDIR/config.runtimes" --users "$1"
}
remove_forwarder() {  # an uninstall with nothing installed: a forwarder no task uses goes
    f="$BINDIR/nvshim-runtime"
    is_forwarder || return 1
    users=$(runtime_users)
    if [ "$users" = 0 ]; then
        rm -f "$f"
        say "removed the forwarder $f: no container runs through it any more"
    else
        say "kept the forwarder $f: $users container(s) still run through it"
    fi
}

uninstall() {
    if [ ! -f "$MANIFEST" ]; then
        remove_forwarder || say "nothing to uninstall ($MANIFEST not found)"
        exit 0
    fi
    check_manifest
    # engine configs: "ENGINE CONFIG [DROP-IN]" lines, reverted to their original bytes
    while read -r engine cfg drop_in; do
        case $engine in containerd|docker|crio) ;; *) continue ;; esac
        have_nvshim || continue
        set -- --runtime "$engine" --config "$cfg" --revert
        [ -n "${drop_in:-}" ] && set -- "$@" --drop-in "$drop_in"
        NVSHIM_CONFIG="$ETCDIR/config.yaml" run_nvshim "runtime" "configure" "$@" \
            || say "could not revert $cfg; see the message above"
        restart_engine "$engine" "$cfg" </dev/null \
            || say "reverted $cfg, but $engine did not come back after the restart: see the message above"
    done < "$MANIFEST"
    uninstall_agent_unit  # first: uninstall_cdi_refresh removes the units' folders
    stop_agents ""  # one started by hand, or by a unit systemd does not run here
    uninstall_cdi_refresh
    # containers created through nvshim-runtime that still run (see "containers that still
    # run" above): a forwarder takes its place, written while config.runtimes is there
    users=$(runtime_users)
    if [ "$users" != 0 ]; then
        write_forwarder "$users" || say "could not leave a forwarder: containers created through $BINDIR/nvshim-runtime cannot be stopped once it is gone"
    fi
    # files we wrote, only if unchanged since (an edited config stays, and we say so)
    pkgs=
    while read -r kind path sum; do
        case $kind in
            pkg) pkgs="$pkgs$path "; continue ;;
            file) ;;
            *) continue ;;
        esac
        if [ ! -e "$path" ]; then continue; fi
        [ "$users" != 0 ] && [ "$path" = "$BINDIR/nvshim-runtime" ] && continue
        if [ -n "${sum:-}" ] && [ "$(sha "$path")" != "$sum" ]; then
            say "kept $path: it was changed after installation"
            continue
        fi
        rm -f "$path"
    done < "$MANIFEST"
    rmdir "$ETCDIR" 2>/dev/null || true
    if [ -n "$pkgs" ]; then
        say "left installed: $pkgs(added by install.sh; other runtimes may use them — apt-get remove them if not)"
    fi
    # the self-contained runtime: every top-level entry its file list names (this script too:
    # sh keeps reading the open file)
    if [ -f "$PREFIX/$FILE_LIST" ]; then
        while IFS= read -r entry; do
            top=${entry%%/*}
            case $top in ''|.|..) continue ;; esac
            [ -e "$PREFIX/$top" ] && rm -rf "${PREFIX:?}/$top"
        done < "$PREFIX/$FILE_LIST"
    fi
    if [ "$PURGE" = 1 ]; then
        purge_journals
    elif grep -q '^journal ' "$MANIFEST"; then
        say "kept the grant and denial journals (--purge removes them)"
    fi
    # the folders install.sh made for the commands (NVSHIM_BINDIR), deepest first, if empty
    sed -n 's/^bindir-dir //p' "$MANIFEST" | sort -r | while IFS= read -r dir; do
        rmdir "$dir" 2>/dev/null || true
    done
    rm -rf "$VENV"
    rm -f "$MANIFEST"
    rmdir "$PREFIX" 2>/dev/null || true
    say "nvshim uninstalled"
}

# --- the files nvshim writes beside its config, and the grant and denial journals ------
# `nvshim config paths` names them (the same functions the runtime and compile use). The
# compiled copies, caches and the default-runtime mark are recorded as files (removed at
# uninstall). The runtime creates the journals at the first grant or denial: their paths are
# recorded only when they do not exist yet, with the folders that do not; --purge removes
# exactly those: regular files (never a link), folders only when empty. A journal the config
# names later, or one that was there before, is not nvshim's to delete.
record_config_paths() {
    paths=$("$BINDIR/nvshim" config paths --config "$ETCDIR/config.yaml" </dev/null) \
        || die "cannot ask nvshim which files its config makes it write (see the message above)"
    printf '%s\n' "$paths" | while read -r key path; do
        case $key in
            grants-journal|denied-journal) ;;
            *) record "file $path"; continue ;;
        esac
        [ -e "$path" ] || [ -L "$path" ] || record "journal $path"
        missing_dirs "$(dirname "$path")" | sort | while IFS= read -r dir; do
            record "journal-dir $dir"
        done
    done
}

purge_journals() {
    sed -n 's/^journal //p' "$MANIFEST" | while IFS= read -r path; do
        if [ -f "$path" ] && [ ! -L "$path" ]; then rm -f "$path" && say "purged $path"; fi
    done
    sed -n 's/^journal-dir //p' "$MANIFEST" | sort -r | while IFS= read -r dir; do
        if [ -d "$dir" ] && [ ! -L "$dir" ]; then rmdir "$dir" 2>/dev/null || true; fi
    done
}

restart_engine() {  # restart_engine containerd|docker|crio CONFIG: fails when it does not come back
    unit=${RESTART_UNIT:-$1}
    case $RESTART_MODE in
        none)
            say "did not restart $1 (NVSHIM_RESTART_MODE=none): restart it to load $2"
            return 0 ;;
        systemd|signal)
            if [ "$1" = containerd ]; then
                run_nvshim runtime restart --mode "$RESTART_MODE" --unit "$unit" \
                    --socket "$CONTAINERD_SOCKET" --signal "$RESTART_SIGNAL" --timeout "$RESTART_TIMEOUT" \
                    </dev/null
                return
            fi
            if [ "$RESTART_MODE" = signal ]; then
                say "did not restart $1: NVSHIM_RESTART_MODE=signal restarts containerd only; restart $1 to load $2"
                return 0
            fi
            systemctl restart "$unit" </dev/null && say "restarted $unit"
            return ;;
    esac
    case $1:$2 in  # auto
        containerd:/etc/containerd/config.toml|docker:/etc/docker/daemon.json|crio:/etc/crio/crio.conf) ;;
        *)  # a moved config (a test install) is not what the system's engine reads
            say "did not restart $1: $2 is not its system config; restart it yourself if something reads it"
            return 0 ;;
    esac
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 \
        && systemctl is-active --quiet "$unit" 2>/dev/null; then
        systemctl restart "$unit" && say "restarted $unit"
    else
        say "$unit is not run by systemd here: restart it yourself to load the change"
    fi
}

# --- CDI refresh when the driver changes ----------------------------------------------------
# `nvshim cdi refresh` brings the CDI specs the config's cdi-refresh lists, the node plan and
# the CDI index up to date with the driver. Where systemd runs, for a system install
# ($ETCDIR is /etc/nvshim), install.sh writes (nvshim/node/install/units.py renders them)
# and enables:
#   nvshim-cdi-refresh.path      PathChanged on /lib/modules/%v/modules.dep(.bin), the files
#                                `nvshim cdi refresh --print-watch-paths` names (the driver's
#                                libcuda.so.1 folders, the config) and $BINDIR/nvshim
#   nvshim-cdi-refresh.service   oneshot `nvshim cdi refresh`, at boot too, when the nvidia
#                                module is loaded; Restart=on-failure, at most 10 starts/10 min
#   99-nvshim-cdi-refresh.rules  (where udev runs) starts the service when nvidia is loaded
# NVSHIM_SYSTEMD_DIR / NVSHIM_UDEV_DIR write the files elsewhere (tests; nothing is enabled
# then). Without systemd, run `nvshim cdi refresh --watch` (e.g. in the DaemonSet's container).
REFRESH=nvshim-cdi-refresh
REFRESH_RULE=99-nvshim-cdi-refresh.rules

systemd_runs() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

# render_unit FILE OPTION...: the text of the unit or rule FILE, rendered and escaped by
# nvshim/node/install/units.py in nvshim's own Python: --dev's venv, else the prefix's
render_unit() {
    if [ "$DEV" = 1 ]; then
        venv_module nvshim.node.install.units "$@"
    else
        prefix_module nvshim.node.install.units "$@"
    fi
}

mkdir_recorded() {  # mkdir -p DIR, recording each folder it makes (removed at uninstall)
    [ -d "$1" ] && return 0
    mkdir_recorded "$(dirname "$1")"
    mkdir -m 0755 "$1"
    record "refresh-dir $1"
}

put_if_changed() {  # put_if_changed DEST < content: true when DEST was (re)written
    mkdir_recorded "$(dirname "$1")"
    tmp="$1.tmp.$$"
    cat > "$tmp"
    record "file $1"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
    chmod 0644 "$tmp"
    mv -f "$tmp" "$1"
}

install_cdi_refresh() {
    units=${NVSHIM_SYSTEMD_DIR:-} rules=${NVSHIM_UDEV_DIR:-} system=0
    if [ -z "$units" ] && [ "$ETCDIR" = /etc/nvshim ] && systemd_runs; then
        units=/etc/systemd/system system=1
        [ -z "$rules" ] && [ -d /run/udev ] && rules=/etc/udev/rules.d
    fi
    if [ -z "$units" ]; then
        say "no systemd units for CDI refresh (systemd does not run here, or this is not a system install): run '$BINDIR/nvshim cdi refresh --watch' to follow driver changes"
        return 0
    fi
    watched=$("$BINDIR/nvshim" cdi refresh --config "$ETCDIR/config.yaml" --print-watch-paths) \
        || die "cannot list the driver's files for $REFRESH.path (see the message above)"
    # every file rendered before any is written (a value a unit cannot carry writes none)
    path_unit=$(render_unit "$REFRESH.path" --bindir "$BINDIR" --watched "$watched") || exit 1
    service=$(render_unit "$REFRESH.service" --bindir "$BINDIR" --etcdir "$ETCDIR") || exit 1
    if [ -n "$rules" ]; then
        rule=$(render_unit "$REFRESH_RULE" --systemctl "$(command -v systemctl || echo /usr/bin/systemctl)") \
            || exit 1
    fi
    changed=0
    printf '%s\n' "$path_unit" | put_if_changed "$units/$REFRESH.path" && changed=1
    printf '%s\n' "$service" | put_if_changed "$units/$REFRESH.service" && changed=1
    if [ -n "$rules" ]; then
        printf '%s\n' "$rule" | put_if_changed "$rules/$REFRESH_RULE" \
            && [ "$system" = 1 ] && command -v udevadm >/dev/null 2>&1 \
            && udevadm control --reload-rules || true
    fi
    if [ "$system" = 1 ]; then
        [ "$changed" = 1 ] && systemctl daemon-reload
        systemctl enable --quiet "$REFRESH.service" "$REFRESH.path"
        systemctl start "$REFRESH.path"
        systemctl start --no-block "$REFRESH.service"
        record "systemd-enabled $REFRESH"
        say "enabled $REFRESH.path and $REFRESH.service (driver changes refresh the CDI specs, node plan and CDI index)"
    else
        say "wrote $units/$REFRESH.path and $REFRESH.service${rules:+ and $rules/$REFRESH_RULE} (not enabled: not the system's directories)"
    fi
}

uninstall_cdi_refresh() {  # before the manifest's files go: disable, remove, reload
    if grep -qx "systemd-enabled $REFRESH" "$MANIFEST" && systemd_runs; then
        systemctl disable --now --quiet "$REFRESH.path" "$REFRESH.service" 2>/dev/null || true
    fi
    grep -E "^file .*/($REFRESH\.path|$REFRESH\.service|$REFRESH_RULE)\$" "$MANIFEST" \
        | while read -r _ path; do rm -f "$path"; done
    sed -n 's/^refresh-dir //p' "$MANIFEST" | sort -r | while read -r dir; do
        rmdir "$dir" 2>/dev/null || true  # deepest first; one holding others' files stays
    done
    if grep -qx "systemd-enabled $REFRESH" "$MANIFEST" && systemd_runs; then
        systemctl daemon-reload
        command -v udevadm >/dev/null 2>&1 && udevadm control --reload-rules || true
    fi
}

# --- the node agent (nvshim agent: the runtime's fast path for GPU creates) -----------
# Where systemd runs and this is the system's install, nvshim-agent.service (rendered by
# nvshim/node/install/units.py) runs the agent in the host's mount namespace; nvshim-runtime's
# trampoline hands GPU creates to it through nvshim-agent-client and starts Python itself
# whenever the agent is not there (docs/agent.md).
AGENT_UNIT=nvshim-agent
install_agent_client() {  # the --dev venv's client (a payload carries its own)
    client=$VENV/libexec/nvshim-agent-client
    if "$VENV/bin/python3" -I -m nvshim.agent.client "$client"; then
        record "file $client"
    else
        say "no $client (see above): GPU creates start Python, as without an agent"
    fi
}
install_agent_unit() {
    if [ "${NVSHIM_AGENT_UNIT:-auto}" = off ]; then  # one agent per socket: the other one serves
        # an agent still running the code this install replaced (the DaemonSet's agent
        # container: its kubelet starts it again, on the new code)
        stop_agents "it ran the code this install replaced"
        if [ -f "$MANIFEST" ] && grep -qE "^file .*/$AGENT_UNIT\.service\$" "$MANIFEST"; then
            uninstall_agent_unit
            grep -vE "^(systemd-enabled $AGENT_UNIT|file .*/$AGENT_UNIT\.service)\$" "$MANIFEST" \
                > "$MANIFEST.new" || true
            chmod 0644 "$MANIFEST.new" && mv "$MANIFEST.new" "$MANIFEST"
            say "removed $AGENT_UNIT.service (NVSHIM_AGENT_UNIT=off: another process runs the agent)"
        fi
        return 0
    fi
    units=${NVSHIM_SYSTEMD_DIR:-} system=0
    if [ -z "$units" ] && [ "$ETCDIR" = /etc/nvshim ] && systemd_runs; then
        units=/etc/systemd/system system=1
    fi
    if [ -z "$units" ]; then
        stop_agents "it ran the code this install replaced: start it again ('$BINDIR/nvshim agent')"
        say "no systemd unit for the node agent (systemd does not run here, or this is not a system install): run '$BINDIR/nvshim agent' to give GPU creates the fast path"
        return 0
    fi
    service=$(render_unit "$AGENT_UNIT.service" --bindir "$BINDIR" --etcdir "$ETCDIR" \
        --nri-socket "${NVSHIM_AGENT_NRI_SOCKET:-none}") || exit 1
    changed=0
    printf '%s\n' "$service" | put_if_changed "$units/$AGENT_UNIT.service" && changed=1
    if [ "$system" = 1 ]; then
        [ "$changed" = 1 ] && systemctl daemon-reload
        systemctl enable --quiet "$AGENT_UNIT.service"
        # restarted whether or not the unit changed: the code it runs was just replaced
        systemctl restart "$AGENT_UNIT.service"
        record "systemd-enabled $AGENT_UNIT"
        say "enabled $AGENT_UNIT.service (GPU creates go through the node agent)"
    else
        say "wrote $units/$AGENT_UNIT.service (not enabled: not the system's directories)"
    fi
}
uninstall_agent_unit() {  # before the manifest's files go: stop, disable, remove, reload
    if grep -qx "systemd-enabled $AGENT_UNIT" "$MANIFEST" && systemd_runs; then
        systemctl disable --now --quiet "$AGENT_UNIT.service" 2>/dev/null || true
    fi
    grep -E "^file .*/$AGENT_UNIT\.service\$" "$MANIFEST" | while read -r _ path; do rm -f "$path"; done
    if grep -qx "systemd-enabled $AGENT_UNIT" "$MANIFEST" && systemd_runs; then
        systemctl daemon-reload
    fi
}

running() {  # the process exists and has not exited (a zombie waits for its parent only)
    [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# stop_agents WHY: SIGTERM every `nvshim agent` this prefix runs (its interpreter is in
# $PREFIX and "agent" is one of its words), then wait up to 10 s for each to go, saying
# WHY after each stopped. An agent left serving from a removed or replaced prefix would
# answer the engine's NRI calls and the trampoline with code that is gone or mixed.
stop_agents() {
    why=${1:+: $1}
    stopped=
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [ "$pid" = "$$" ] && continue
        words=$(tr '\0' '\n' < "$dir/cmdline" 2>/dev/null) || continue
        case $(printf '%s\n' "$words" | head -n 1) in "$PREFIX"/*) ;; *) continue ;; esac
        printf '%s\n' "$words" | grep -qx agent || continue
        kill -TERM "$pid" 2>/dev/null && stopped="$stopped $pid"
    done
    [ -n "$stopped" ] || return 0
    for pid in $stopped; do
        tries=0
        while running "$pid" && [ "$tries" -lt 100 ]; do sleep 0.1; tries=$((tries + 1)); done
        if running "$pid"; then
            say "the node agent (pid $pid) did not stop on SIGTERM within 10 s: stop it by hand"
        else
            say "stopped the node agent (pid $pid)$why"
        fi
    done
}

# --- packages ------------------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    [ "${NVSHIM_SKIP_APT:-0}" = 1 ] && return 0
    missing=""
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
    done
    [ -z "$missing" ] && return 0
    if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
    say "installing$missing"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    for pkg in $missing; do record "pkg $pkg"; done
}

install_file() {  # install_file DEST MODE < content
    tmp="$1.tmp.$$"
    cat > "$tmp"
    chmod "$2" "$tmp"
    mv -f "$tmp" "$1"
    record "file $1"
}

missing_dirs() {  # missing_dirs DIR: DIR and its ancestors that do not exist, one a line
    d=$1
    while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do printf '%s\n' "$d"; d=$(dirname "$d"); done
}

writable() {  # writable DIR: DIR exists (created if need be) and a file can be made in it
    mkdir -p "$1" 2>/dev/null || return 1  # 0755: umask 022
    probe="$1/.nvshim-write-test.$$"
    touch "$probe" 2>/dev/null || return 1  # not ': >': a special builtin's failed redirection exits sh
    rm -f "$probe"
}

# install_payload DIR: check everything first (nothing is written when a check fails), then
# put DIR's prefix in place of PREFIX in one rename and write the commands for PREFIX
install_payload() {
    from=$(cd "$1" 2>/dev/null && pwd) || die "payload $1: no such directory"
    meta=$from/.nvshim-payload
    [ -f "$meta" ] || die "$from is not an nvshim payload: $meta is missing (build one with install.sh --payload DIR)"
    built=
    while IFS='=' read -r key value; do
        [ "$key" = prefix ] && built=$value
    done < "$meta"
    case $built in /?*) ;; *) die "$meta names no prefix (prefix=/…)" ;; esac
    payload=$from$built
    for piece in "$from/config/config.yaml" "$payload/$FILE_LIST"; do
        [ -f "$piece" ] || die "payload $from is incomplete: $piece is missing"
    done
    while IFS= read -r entry; do
        [ -e "$payload/$entry" ] || die "payload $from is incomplete: $payload/$entry is missing"
    done < "$payload/$FILE_LIST"
    # the commands are /bin/sh scripts: a node root without a working /bin/sh cannot run them
    if [ ! -f /bin/sh ] || [ ! -x /bin/sh ] || ! /bin/sh -c : 2>/dev/null; then
        die "no usable /bin/sh on this node (missing, or its C library is): nvshim-runtime and nvshim are /bin/sh scripts"
    fi
    out=$("$payload/bin/python3" -I -S -c 'import sys; sys.path[0:0] = [sys.argv[1]]; import nvshim.runtime.main, nvshim.cli.main' "$payload/site" 2>&1) \
        || die "the payload's interpreter does not run here ($payload/bin/python3): $(printf '%s\n' "$out" | tail -n 1)"
    new_bindirs=$(missing_dirs "$BINDIR")
    writable "$BINDIR" || die "cannot write $BINDIR (read-only file system?): nothing installed; on a node with a read-only /usr, set NVSHIM_BINDIR to a writable folder (e.g. /opt/bin; see install.sh --help)"
    for dir in "$(dirname "$PREFIX")" "$(dirname "$ETCDIR")"; do
        writable "$dir" || die "cannot write $dir (read-only file system?): nothing installed"
    done
    if [ -e "$PREFIX" ] && [ ! -f "$MANIFEST" ] && [ ! -f "$PREFIX/$FILE_LIST" ] \
        && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
        die "$PREFIX exists and is not nvshim's: move it or set NVSHIM_PREFIX"
    fi

    new="$PREFIX.new.$$" old="$PREFIX.old.$$"
    rm -rf "$new" "$old"
    # cp -R, not -a: the files become root's whoever built the payload; no one else may
    # write any of it (the modes the payload brings, less group and other write)
    cp -R "$payload" "$new" || { rm -rf "$new"; die "could not copy $payload to $new"; }
    chmod -R go-w "$new" && chmod 0755 "$new"
    if [ -d "$PREFIX" ]; then
        # what the payload does not bring (the manifest, --dev's venv) stays in the prefix
        for entry in "$PREFIX"/* "$PREFIX"/.[!.]*; do
            [ -e "$entry" ] || continue
            [ -e "$new/${entry##*/}" ] || mv "$entry" "$new/"
        done
        # one atomic exchange (renameat2 RENAME_EXCHANGE, nvshim/node/install/swap.py run by
        # the new interpreter): a create running now (the trampoline starting Python, Python
        # importing lazily) never meets a missing prefix. Two renames left a gap in which such
        # creates failed with no log line (python3 not found, a stdlib module missing),
        # measured at 4 of 376 creates over three reinstalls; a file system without the
        # exchange still gets them.
        if "$new/bin/python3" -I -S -B -c 'import sys; sys.path[0:0] = [sys.argv.pop(1)]; from nvshim.node.install.swap import main; main(sys.argv[1:])' \
            "$new/site" "$new" "$PREFIX" 2>/dev/null; then
            rm -rf "$new"  # the previous prefix, now at this name
            new=
        else
            mv "$PREFIX" "$old" || { rm -rf "$new"; die "cannot replace $PREFIX (a mount point?)"; }
        fi
    fi
    if [ -n "$new" ]; then mv "$new" "$PREFIX"; fi
    rm -rf "$old"
    printf '%s\n' "$new_bindirs" | sort | while IFS= read -r dir; do
        if [ -n "$dir" ]; then record "bindir-dir $dir"; fi
    done
    # the commands, rendered for PREFIX, BINDIR and ETCDIR by the installed interpreter itself
    # (both default to $ETCDIR/config.yaml: an install with NVSHIM_ETCDIR never reads /etc/nvshim)
    "$PREFIX/bin/python3" -I -S -c 'import sys; p, cfg = sys.argv[2:4]; sys.path[0:0] = [sys.argv[1]]
from nvshim.node.install.prefix import render_runtime
sys.stdout.write(render_runtime(p, cfg))' \
        "$PREFIX/site" "$PREFIX" "$ETCDIR/config.yaml" | install_file "$BINDIR/nvshim-runtime" 0755
    "$PREFIX/bin/python3" -I -S -c 'import sys; p, cfg = sys.argv[2:4]; sys.path[0:0] = [sys.argv[1]]
from nvshim.node.install.prefix import render_cli
sys.stdout.write(render_cli(p, cfg, bindir=sys.argv[4]))' \
        "$PREFIX/site" "$PREFIX" "$ETCDIR/config.yaml" "$BINDIR" | install_file "$BINDIR/nvshim" 0755
    CONFIG_SRC=$from/config/config.yaml
}

if [ -n "$PAYLOAD" ]; then
    build_payload "$PAYLOAD"
    say "built nvshim's self-contained runtime in $PAYLOAD (install it with: sh $PAYLOAD/install.sh --from $PAYLOAD)"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (it writes $PREFIX, $BINDIR and $ETCDIR)"

if [ "$UNINSTALL" = 1 ]; then uninstall; exit 0; fi

CONFIG_SRC=$SRC/config/config.yaml
if [ -n "$FROM" ]; then
    # a node: no packages, no build; runc comes with its container engine
    install_payload "$FROM"
elif [ "$INSTALLED_COPY" = 1 ]; then
    # the installed copy: the runtime stays as it is; the config, the journals' record and
    # the engines are brought up to date
    [ -x "$BINDIR/nvshim" ] || die "$BINDIR/nvshim is not installed: set NVSHIM_BINDIR (and the other NVSHIM_* settings) as the install did"
    CONFIG_SRC=
elif [ "$DEV" = 0 ]; then
    apt_install runc busybox-static
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    build_payload "$work/payload"
    install_payload "$work/payload"
else
    apt_install runc busybox-static
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
    apt_install crun containerd podman umoci skopeo docker.io
    # the node-root tests (tests/helpers/noderoot.py) and the DaemonSet test build Debian roots
    apt_install mmdebstrap debian-archive-keyring
    # the real-driver tests compile their C probe (tests/probe/cudaprobe.c) at test time
    apt_install gcc libc6-dev
    # tests/unit/test_shellcheck.py checks every shell file, generated ones included
    apt_install shellcheck
    # tests/k8s builds runc from its Go module (cgo, seccomp) and makes the cluster's
    # certificates with openssl (tests/go, tests/helpers/k8s.py)
    apt_install libseccomp-dev pkg-config openssl

    # --- venv with the checkout editable (the tests and the commands run its code) -----
    if [ ! -x "$VENV/bin/python3" ]; then
        "$PYTHON" -m venv "$VENV"
        record "dir $VENV"
    fi
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check -e "${SRC}[test]"
    install_agent_client

    # --- commands: absolute interpreter, -I (containerd's PATH and env are not ours) ----
    mkdir -p "$BINDIR"
    "$VENV/bin/python3" -I -c 'import sys; from nvshim.node.install.trampoline import render; sys.stdout.write(render(sys.argv[1], config=sys.argv[2]))' \
        "$VENV/bin/python3" "$ETCDIR/config.yaml" | install_file "$BINDIR/nvshim-runtime" 0755
    "$VENV/bin/python3" -I -c 'import sys; from nvshim.node.install.dev import render_dev_cli; sys.stdout.write(render_dev_cli(*sys.argv[1:3]))' \
        "$VENV/bin/python3" "$ETCDIR/config.yaml" | install_file "$BINDIR/nvshim" 0755
fi

# --- config --------------------------------------------------------------------------
[ -d "$ETCDIR" ] || mkdir -p "$ETCDIR"  # 0755: umask 022
kept="kept the previous config"
if [ ! -e "$ETCDIR/config.yaml" ]; then
    kept="refused the default config it wrote"
    [ -n "$CONFIG_SRC" ] || die "no $ETCDIR/config.yaml, and the installed copy brings none: write one (see config/config.yaml in nvshim's sources) or install a payload with --from DIR"
    cp "$CONFIG_SRC" "$ETCDIR/config.yaml"
    chmod 0644 "$ETCDIR/config.yaml"
    # a kubelet runs here: its record is what a pod cannot forge (a GPU's UUID written
    # into a pod's own env is then no allocation)
    kubelet_socket=${NVSHIM_KUBELET_SOCKET:-/var/lib/kubelet/pod-resources/kubelet.sock}
    verify=""
    if [ -S "$kubelet_socket" ] && grep -qx 'verify-with: none' "$ETCDIR/config.yaml"; then
        sed -i 's/^verify-with: none$/verify-with: kubelet/' "$ETCDIR/config.yaml"
        if [ -n "${NVSHIM_KUBELET_SOCKET:-}" ]; then
            escaped=$(printf '%s' "$kubelet_socket" | sed 's/[|&\\]/\\&/g')
            sed -i "s|^kubelet-socket: .*\$|kubelet-socket: $escaped|" "$ETCDIR/config.yaml"
        fi
        verify=" (verify-with: kubelet: the kubelet's PodResources socket is at $kubelet_socket)"
    fi
    record "file $ETCDIR/config.yaml $(sha "$ETCDIR/config.yaml")"
    say "wrote $ETCDIR/config.yaml$verify"
fi
# a default runtime reads this config: compile refuses it unless require-allocation is on
# and marks it, so every later compile (the DaemonSet's ConfigMap apply too) refuses the same
set -- --config "$ETCDIR/config.yaml"
[ "$DEFAULT" = 1 ] && set -- "$@" --default-runtime
if ! out=$("$BINDIR/nvshim" config compile "$@" 2>&1 </dev/null); then
    out=$(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d' | tail -n 1)
    die "$kept: ${out#nvshim: }"
fi
[ -n "$out" ] && printf '%s\n' "$out" >&2
# the compiled copy, the trampoline's lists, the node plan cache, the CDI index, the
# default-runtime mark; the journals (see "the files nvshim writes beside its config" above)
record_config_paths
install_cdi_refresh  # see "CDI refresh when the driver changes" above
install_agent_unit  # see "the node agent" above

# --- container engines ---------------------------------------------------------------
# The engine's files as they were before this run (a copy, or a mark that the file was absent),
# to put back byte for byte when the engine does not come back with the new ones.
SNAP=""
snapshot_files() {  # snapshot_files FILE...
    SNAP=$(mktemp -d "${TMPDIR:-/tmp}/nvshim-install.XXXXXX")
    n=0
    for f in "$@"; do
        n=$((n + 1))
        printf '%s\n' "$f" > "$SNAP/$n.path"
        if [ -e "$f" ]; then cp -p "$f" "$SNAP/$n.bytes"; fi
        if [ ! -d "$(dirname "$f")" ]; then : > "$SNAP/$n.nodir"; fi
    done
}
restore_files() {
    for p in "$SNAP"/*.path; do
        n=${p%.path}
        f=$(cat "$p")
        if [ -e "$n.bytes" ]; then
            cp -p "$n.bytes" "$f.nvshim-restore.$$" && mv -f "$f.nvshim-restore.$$" "$f"
        else
            rm -f "$f"
            if [ -e "$n.nodir" ]; then rmdir "$(dirname "$f")" 2>/dev/null || true; fi
        fi
    done
}

configure_engine() {  # configure_engine ENGINE CONFIG [DROP-IN]
    set -- "$1" "$2" "${3:-}"
    engine=$1 cfg=$2 drop_in=$3
    waits=0
    if [ "$engine" = containerd ] && [ "$RESTART_MODE" != auto ] && [ "$RESTART_MODE" != none ]; then
        waits=1  # containerd must answer now: a wrong socket fails before anything is written
        run_nvshim runtime restart --check --socket "$CONTAINERD_SOCKET" \
            --signal "$RESTART_SIGNAL" || exit 1
    fi
    snapshot_files "$cfg" "$cfg.nvshim-orig.json" ${drop_in:+"$drop_in"}
    seeded=""
    if [ ! -e "$cfg" ] && [ "$engine" = containerd ] && [ -n "$CONTAINERD_CONFIG_SEED" ]; then
        mkdir -p "$(dirname "$cfg")"  # 0755: umask 022
        # k3s/RKE2 head their generated file with "# File generated by k3s. DO NOT EDIT. Use
        # config.toml.tmpl instead.": the template is the file to edit, so not there
        { grep -v '^#.*DO NOT EDIT' "$CONTAINERD_CONFIG_SEED" || true; } > "$cfg"
        chmod 0644 "$cfg"
        seeded="file $cfg $(sha "$cfg")"  # revert gives these bytes back; uninstall then removes it
        say "seeded $cfg from $CONTAINERD_CONFIG_SEED"
    fi
    set -- --runtime "$engine" --config "$cfg" --binary "$BINDIR/nvshim-runtime"
    [ -n "$drop_in" ] && set -- "$@" --drop-in "$drop_in"
    [ "$DEFAULT" = 1 ] && set -- "$@" --set-as-default
    [ "$NRI" = 1 ] && [ "$engine" = containerd ] && set -- "$@" --enable-nri
    out=$(NVSHIM_CONFIG="$ETCDIR/config.yaml" "$BINDIR/nvshim" runtime configure "$@" 2>&1) \
        || { printf '%s\n' "$out" >&2; restore_files; rm -rf "$SNAP"; exit 1; }
    printf '%s\n' "$out" >&2
    # restart only when something was written (a DaemonSet re-run must not bounce the engine)
    case $out in
        *"nothing written"*|*"already"*) ;;
        *)
            if ! why=$(restart_engine "$engine" "$cfg" 2>&1); then
                restore_files
                rm -rf "$SNAP"
                up="restarted" down="failed again"
                if [ "$waits" = 1 ]; then
                    up="answers again on $CONTAINERD_SOCKET" down="still does not answer on $CONTAINERD_SOCKET"
                fi
                if restart_engine "$engine" "$cfg" >/dev/null 2>&1; then
                    back="it $up"
                else
                    back="it $down (the previous config does not start it either: see its log)"
                fi
                why=$(printf '%s\n' "$why" | sed '/^[[:space:]]*$/d' | tail -n 1)
                why=${why#nvshim: }
                die "$engine did not come back with $cfg (${why#"$engine "}); put back the previous config and restarted $engine: $back"
            fi
            [ -n "$why" ] && printf '%s\n' "$why" >&2 ;;
    esac
    rm -rf "$SNAP"
    record "$engine $cfg${drop_in:+ $drop_in}"
    if [ -n "$seeded" ]; then record "$seeded"; fi
}
if [ "$CONTAINERD" = 1 ]; then configure_engine containerd "$CONTAINERD_CONFIG" "$CONTAINERD_DROP_IN"; fi
if [ "$DOCKER" = 1 ]; then
    configure_engine docker "$DOCKER_CONFIG"
    # docker run --gpus: configure put nvshim's nvidia-container-runtime-hook beside
    # nvshim-runtime, unless dockerd's PATH had one already (NVIDIA's: kept, and it said so)
    hook=$BINDIR/nvidia-container-runtime-hook
    if grep -qs "^# nvshim's stand-in" "$hook"; then record "file $hook $(sha "$hook")"; fi
fi
if [ "$CRIO" = 1 ]; then configure_engine crio "$CRIO_CONFIG" "$CRIO_DROP_IN"; fi

version=$("$BINDIR/nvshim" --version)
say "installed nvshim ${version##* } ($BINDIR/nvshim, $BINDIR/nvshim-runtime)"

#!/bin/sh
# Install nvshim on a Debian/Ubuntu machine (run as root). Idempotent: running it again
# brings the installation up to date and changes nothing that is already right.
#
#   ./install.sh                      install nvshim (venv in /opt/nvshim, commands in /usr/local/bin)
#   ./install.sh --dev                also install the test dependencies and container engines
#   ./install.sh --containerd         also register nvshim as a containerd runtime handler
#   ./install.sh --docker             also register it as a Docker runtime (/etc/docker/daemon.json),
#                                     and nvidia-container-runtime-hook beside nvshim-runtime (--gpus)
#   ./install.sh --crio               also register it as a CRI-O runtime handler (drop-in)
#   ./install.sh --containerd --set-as-default
#                                     ... and make it the engine's default runtime (refused unless
#                                     /etc/nvshim/config.yaml has require-allocation: true)
#   ./install.sh --uninstall          remove exactly what earlier runs added
#
# Paths can be moved for testing: NVSHIM_PREFIX (/opt/nvshim), NVSHIM_BINDIR
# (/usr/local/bin), NVSHIM_ETCDIR (/etc/nvshim), NVSHIM_CONTAINERD_CONFIG
# (/etc/containerd/config.toml), NVSHIM_CONTAINERD_DROP_IN (<containerd config
# dir>/conf.d/99-nvshim.toml), NVSHIM_DOCKER_CONFIG (/etc/docker/daemon.json),
# NVSHIM_CRIO_CONFIG (/etc/crio/crio.conf), NVSHIM_CRIO_DROP_IN
# (<crio config dir>/crio.conf.d/99-nvshim.toml). NVSHIM_SKIP_APT=1 skips packages.
# NVSHIM_SYSTEMD_DIR, NVSHIM_UDEV_DIR: where the CDI refresh units and udev rule go
# (default: /etc/systemd/system and /etc/udev/rules.d, only where systemd runs).
set -eu

PREFIX=${NVSHIM_PREFIX:-/opt/nvshim}
BINDIR=${NVSHIM_BINDIR:-/usr/local/bin}
ETCDIR=${NVSHIM_ETCDIR:-/etc/nvshim}
CONTAINERD_CONFIG=${NVSHIM_CONTAINERD_CONFIG:-/etc/containerd/config.toml}
# the drop-in sits next to the config it belongs to (a moved config never writes /etc/containerd)
CONTAINERD_DROP_IN=${NVSHIM_CONTAINERD_DROP_IN:-$(dirname "$CONTAINERD_CONFIG")/conf.d/99-nvshim.toml}
DOCKER_CONFIG=${NVSHIM_DOCKER_CONFIG:-/etc/docker/daemon.json}
CRIO_CONFIG=${NVSHIM_CRIO_CONFIG:-/etc/crio/crio.conf}
CRIO_DROP_IN=${NVSHIM_CRIO_DROP_IN:-$(dirname "$CRIO_CONFIG")/crio.conf.d/99-nvshim.toml}
VENV=$PREFIX/venv
MANIFEST=$PREFIX/install-manifest
SRC=$(cd "$(dirname "$0")" && pwd)
PYTHON=${NVSHIM_PYTHON:-/usr/bin/python3}

DEV=0 CONTAINERD=0 DOCKER=0 CRIO=0 DEFAULT=0 UNINSTALL=0
for arg in "$@"; do
    case $arg in
        --dev) DEV=1 ;;
        --containerd) CONTAINERD=1 ;;
        --docker) DOCKER=1 ;;
        --crio) CRIO=1 ;;
        --set-as-default) DEFAULT=1 ;;
        --uninstall) UNINSTALL=1 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $arg (see --help)" >&2; exit 1 ;;
    esac
done

say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it writes $PREFIX, $BINDIR and $ETCDIR)"

# --- manifest: one line per thing this script added ("file PATH", "pkg NAME", ...) ---
record() { mkdir -p "$PREFIX"; grep -qxF "$*" "$MANIFEST" 2>/dev/null || echo "$*" >> "$MANIFEST"; }

sha() { sha256sum "$1" | cut -d' ' -f1; }

uninstall() {
    [ -f "$MANIFEST" ] || { say "nothing to uninstall ($MANIFEST not found)"; exit 0; }
    # engine configs: "ENGINE CONFIG [DROP-IN]" lines, reverted to their original bytes
    grep -E '^(containerd|docker|crio) ' "$MANIFEST" | while read -r engine cfg drop_in; do
        [ -x "$VENV/bin/nvshim" ] || continue
        set -- --runtime "$engine" --config "$cfg" --revert
        [ -n "${drop_in:-}" ] && set -- "$@" --drop-in "$drop_in"
        NVSHIM_CONFIG="$ETCDIR/config.yaml" "$VENV/bin/nvshim" "runtime" "configure" "$@" \
            || say "could not revert $cfg; see the message above"
        restart_engine "$engine" "$cfg"
    done
    uninstall_cdi_refresh
    # files we wrote, only if unchanged since (an edited config stays, and we say so)
    grep '^file ' "$MANIFEST" | while read -r _ path sum; do
        if [ ! -e "$path" ]; then continue; fi
        if [ -n "${sum:-}" ] && [ "$(sha "$path")" != "$sum" ]; then
            say "kept $path: it was changed after installation"
            continue
        fi
        rm -f "$path"
    done
    rmdir "$ETCDIR" 2>/dev/null || true
    pkgs=$(sed -n 's/^pkg //p' "$MANIFEST" | tr '\n' ' ')
    if [ -n "$pkgs" ]; then
        say "left installed: $pkgs(added by install.sh; other runtimes may use them — apt-get remove them if not)"
    fi
    rm -rf "$VENV"
    rm -f "$MANIFEST"
    rmdir "$PREFIX" 2>/dev/null || true
    say "nvshim uninstalled"
}

restart_engine() {  # restart_engine containerd|docker|crio CONFIG
    unit=$1
    case $unit:$2 in
        containerd:/etc/containerd/config.toml|docker:/etc/docker/daemon.json|crio:/etc/crio/crio.conf) ;;
        *)  # a moved config (a test install) is not what the system's engine reads
            say "did not restart $unit: $2 is not its system config; restart it yourself if something reads it"
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
# ($ETCDIR is /etc/nvshim), install.sh writes and enables:
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

mkdir_recorded() {  # mkdir -p DIR, recording each folder it makes (removed at uninstall)
    [ -d "$1" ] && return 0
    mkdir_recorded "$(dirname "$1")"
    mkdir "$1"
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
    changed=0
    {
        echo "# Written by nvshim's install.sh: start $REFRESH.service when the NVIDIA driver changes."
        echo "[Unit]"
        echo "Description=Watch the NVIDIA driver for nvshim's CDI refresh"
        echo
        echo "[Path]"
        echo "PathChanged=/lib/modules/%v/modules.dep"
        echo "PathChanged=/lib/modules/%v/modules.dep.bin"
        # procfs is not watchable; the running kernel's modules.dep is named by %v above
        printf '%s\n' "$watched" "$BINDIR/nvshim" | grep -v -e '/proc/' -e '^/lib/modules/' \
            | sed -e 's/%/%%/g' -e 's/^/PathChanged=/'
        echo "Unit=$REFRESH.service"
        echo
        echo "[Install]"
        echo "WantedBy=multi-user.target"
    } | put_if_changed "$units/$REFRESH.path" && changed=1
    {
        echo "# Written by nvshim's install.sh: regenerate nvshim's CDI specs, node plan and CDI index."
        echo "[Unit]"
        echo "Description=Refresh nvshim's CDI specs, node plan and CDI index for the NVIDIA driver"
        echo "ConditionPathExists=|/sys/module/nvidia"
        echo "ConditionPathExists=|/sys/module/nvidia_current"
        echo "StartLimitIntervalSec=600"
        echo "StartLimitBurst=10"
        echo
        echo "[Service]"
        echo "Type=oneshot"
        echo "ExecStart=$BINDIR/nvshim cdi refresh --config $ETCDIR/config.yaml"
        echo "Restart=on-failure"
        echo "RestartSec=15"
        echo
        echo "[Install]"
        echo "WantedBy=multi-user.target"
    } | sed -e 's/%/%%/g' | put_if_changed "$units/$REFRESH.service" && changed=1
    if [ -n "$rules" ]; then
        systemctl=$(command -v systemctl || echo /usr/bin/systemctl)
        {
            echo "# Written by nvshim's install.sh: refresh nvshim's CDI specs when the NVIDIA module is loaded."
            echo "ACTION==\"add\", SUBSYSTEM==\"module\", KERNEL==\"nvidia|nvidia_current\", RUN+=\"$systemctl --no-block start $REFRESH.service\""
        } | put_if_changed "$rules/$REFRESH_RULE" \
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

if [ "$UNINSTALL" = 1 ]; then uninstall; exit 0; fi

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

apt_install runc busybox-static
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
if [ "$DEV" = 1 ]; then
    apt_install crun containerd podman umoci skopeo docker.io
    # the real-driver tests compile their C probe (tests/probe/cudaprobe.c) at test time
    apt_install gcc libc6-dev
fi

# --- venv and package ------------------------------------------------------------------
if [ ! -x "$VENV/bin/python3" ]; then
    "$PYTHON" -m venv "$VENV"
    record "dir $VENV"
fi
"$VENV/bin/python3" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if [ "$DEV" = 1 ]; then
    # editable, so the tests and the installed commands run the checkout's code
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check -e "$SRC[test]"
else
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "$SRC"
fi

# --- commands: absolute interpreter, -I (containerd's PATH and env are not ours) --------
install_file() {  # install_file MODE DEST < content
    tmp="$1.tmp.$$"
    cat > "$tmp"
    chmod "$2" "$tmp"
    mv -f "$tmp" "$1"
    record "file $1"
}

mkdir -p "$BINDIR"
# Both default to $ETCDIR/config.yaml: an install with NVSHIM_ETCDIR never reads /etc/nvshim.
"$VENV/bin/python3" -I -c 'import sys; from nvshim.node.trampoline import render; sys.stdout.write(render(sys.argv[1], config=sys.argv[2]))' \
    "$VENV/bin/python3" "$ETCDIR/config.yaml" | install_file "$BINDIR/nvshim-runtime" 0755
"$VENV/bin/python3" -I -c 'import json, sys; print(f"#!{sys.argv[1]} -I\nimport os\nos.environ.setdefault(\"NVSHIM_CONFIG\", {json.dumps(sys.argv[2])})\nfrom nvshim.cli.main import main\nmain()")' \
    "$VENV/bin/python3" "$ETCDIR/config.yaml" | install_file "$BINDIR/nvshim" 0755

# --- config --------------------------------------------------------------------------
mkdir -p "$ETCDIR"
if [ ! -e "$ETCDIR/config.yaml" ]; then
    cp "$SRC/config/config.yaml" "$ETCDIR/config.yaml"
    chmod 0644 "$ETCDIR/config.yaml"
    record "file $ETCDIR/config.yaml $(sha "$ETCDIR/config.yaml")"
    say "wrote $ETCDIR/config.yaml"
fi
"$BINDIR/nvshim" config compile --config "$ETCDIR/config.yaml"
record "file $ETCDIR/config.compiled.json"
record "file $ETCDIR/config.runtimes"
record "file $ETCDIR/config.annotation-prefixes"
record "file $ETCDIR/config.plan.json"  # the node plan cache (written when a driver is found)
record "file $ETCDIR/config.source-link"
record "file $ETCDIR/config.cdi-index.json"  # the index of the CDI spec dirs
install_cdi_refresh  # see "CDI refresh when the driver changes" above

# --- container engines ---------------------------------------------------------------
configure_engine() {  # configure_engine ENGINE CONFIG [DROP-IN]
    set -- "$1" "$2" "${3:-}"
    engine=$1 cfg=$2 drop_in=$3
    set -- --runtime "$engine" --config "$cfg" --binary "$BINDIR/nvshim-runtime"
    [ -n "$drop_in" ] && set -- "$@" --drop-in "$drop_in"
    [ "$DEFAULT" = 1 ] && set -- "$@" --set-as-default
    out=$(NVSHIM_CONFIG="$ETCDIR/config.yaml" "$BINDIR/nvshim" runtime configure "$@" 2>&1) \
        || { printf '%s\n' "$out" >&2; exit 1; }
    printf '%s\n' "$out" >&2
    record "$engine $cfg${drop_in:+ $drop_in}"
    # restart only when something was written (a DaemonSet re-run must not bounce the engine)
    case $out in *"nothing written"*|*"already"*) ;; *) restart_engine "$engine" "$cfg" ;; esac
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

say "installed nvshim $("$VENV/bin/python3" -I -c 'import nvshim; print(nvshim.__version__)') ($BINDIR/nvshim, $BINDIR/nvshim-runtime)"

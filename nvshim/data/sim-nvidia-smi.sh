#!/bin/sh
# SIMULATED nvidia-smi (nvshim sim): not NVIDIA's program, and no GPU is behind it.
# It lists the GPUs of a simulated node whose device nodes it can see under
# $NVSHIM_SIM_DEV (default /dev), numbered 0.. in PCI order as NVML numbers them.
DEV="${NVSHIM_SIM_DEV:-/dev}"
DRIVER_VERSION='@DRIVER@'
CUDA_VERSION='@CUDA@'
# gpu|minor|uuid|pci bus id|model   then   mig|gi cap minor|ci cap minor|uuid|profile
TABLE='@TABLE@'

no_driver() {
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (SIMULATED nvidia-smi (nvshim sim): no $DEV/nvidiactl)"
    exit 9
}

list_gpus() {
    printf '%s\n' "$TABLE" | {
        n=0; seen=0; m=0
        while IFS='|' read -r kind a b c d; do
            if [ "$kind" = gpu ]; then
                seen=0
                if [ -c "$DEV/nvidia$a" ]; then
                    seen=1; m=0
                    if [ "$1" = table ]; then
                        printf '| %3d  %-30s  %-12s  %-40s |\n' "$n" "$d" "$c" "$b"
                    else
                        printf 'GPU %d: %s (UUID: %s)\n' "$n" "$d" "$b"
                    fi
                    n=$((n + 1))
                fi
            elif [ "$kind" = mig ] && [ "$seen" = 1 ] && [ "$1" != table ] \
                && [ -c "$DEV/nvidia-caps/nvidia-cap$a" ] && [ -c "$DEV/nvidia-caps/nvidia-cap$b" ]; then
                printf '  MIG %-11s Device %2d: (UUID: %s)\n' "$d" "$m" "$c"
                m=$((m + 1))
            fi
        done
        if [ "$n" = 0 ]; then
            echo "No devices were found"
            exit 6
        fi
    }
}

[ -c "$DEV/nvidiactl" ] || no_driver
case "$*" in
    -L|--list-gpus)
        list_gpus list ;;
    "")
        echo "SIMULATED nvidia-smi (nvshim sim): no real GPU behind this output"
        echo "@RULE@"
        printf '| NVIDIA-SMI %-14s Driver Version: %-14s CUDA Version: %-20s |\n' "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION"
        echo "@RULE@"
        printf '| %3s  %-30s  %-12s  %-40s |\n' GPU Name Bus-Id UUID
        list_gpus table || exit $?
        echo "@RULE@" ;;
    --version)
        printf 'NVIDIA-SMI version  : %s (SIMULATED, nvshim sim)\nDRIVER version      : %s\nCUDA Version        : %s\n' \
            "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION" ;;
    *)
        echo "SIMULATED nvidia-smi (nvshim sim): supports only -L, --list-gpus, --version or no arguments" >&2
        exit 2 ;;
esac

#!/usr/bin/env bash
# Capture the parts of a node's /sys that envbuilder's affinity check reads (network devices, GPUs, NUMA nodes,
# CPU cores), as a small tree a test can point ENVBUILDER_SYSFS_ROOT at, plus `nvidia-smi topo -m`.
#
#   scripts/capture_topology.sh [--sys DIR] [DEST]
#
# DEST defaults to $OUT (else the current directory); the result is DEST/topology-HOST.tar.gz holding sys/ (the
# tree: plain files and directories, the kernel's symlinks kept as the same relative symlinks, each listed in
# sys/LINKS as "path -> target"), topo.txt (nvidia-smi topo -m, where nvidia-smi exists) and ORIGIN (host,
# date, kernel, CPU model). --sys reads another sysfs root (a captured tree) instead of /sys.
set -euo pipefail

SYS=/sys
if [ "${1:-}" = "--sys" ]; then
    SYS=${2:?--sys needs a directory}
    shift 2
fi
DEST=${1:-${OUT:-.}}
HOST=$(hostname -s 2>/dev/null || hostname)
WORK=$(mktemp -d)
trap 'rm -rf -- "$WORK"' EXIT
TREE=$WORK/sys
mkdir -p "$TREE"
: >"$TREE/LINKS"

# copy_file REL: a sysfs file's content (sysfs sizes lie, so read it); silently nothing where it cannot be read.
copy_file() {
    [ -f "$SYS/$1" ] || return 0
    mkdir -p "$TREE/$(dirname "$1")"
    cat "$SYS/$1" >"$TREE/$1" 2>/dev/null || rm -f "$TREE/$1"
}

# copy_link REL: the same relative symlink in the tree, recorded in LINKS.
copy_link() {
    [ -L "$SYS/$1" ] || return 0
    [ -L "$TREE/$1" ] && return 0
    local target
    target=$(readlink "$SYS/$1")
    mkdir -p "$TREE/$(dirname "$1")"
    ln -s "$target" "$TREE/$1"
    printf '%s -> %s\n' "$1" "$target" >>"$TREE/LINKS"
}

# real REL: where a link leads, relative to the sysfs root.
real() {
    local root path
    root=$(realpath "$SYS")
    path=$(realpath "$SYS/$1")
    printf '%s\n' "${path#"$root"/}"
}

# copy_pci ADDRESS: a PCI device's locality files, at its place under devices/, and its bus/pci/devices link.
copy_pci() {
    [ -n "$1" ] && [ -e "$SYS/bus/pci/devices/$1" ] || return 0
    local at file
    at=$(real "bus/pci/devices/$1")
    mkdir -p "$TREE/$at"
    for file in numa_node local_cpulist class vendor device; do
        copy_file "$at/$file"
    done
    copy_link "bus/pci/devices/$1"
}

# copy_class CLASS NAME FILES...: a class device (its link, the named files, its device link) and its PCI device.
copy_class() {
    local klass=$1 name=$2 at file
    shift 2
    copy_link "class/$klass/$name"
    at=$(real "class/$klass/$name")
    mkdir -p "$TREE/$at"
    for file in "$@"; do
        copy_file "$at/$file"
    done
    if [ -L "$SYS/$at/device" ]; then
        copy_link "$at/device"
        copy_pci "$(pci_of "$(realpath "$SYS/$at/device")")"
    fi
}

# pci_of PATH: the PCI address of PATH or of its nearest PCI ancestor (a virtio NIC hangs below its function).
pci_of() {
    local path=$1
    while [ "$path" != / ] && [ -n "$path" ]; do
        if [[ "$(basename "$path")" =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$ ]]; then
            basename "$path"
            return 0
        fi
        path=$(dirname "$path")
    done
}

shopt -s nullglob
for dev in "$SYS"/class/infiniband/*; do
    name=$(basename "$dev")
    ports=()
    for port in "$dev"/ports/*; do
        ports+=("ports/$(basename "$port")/state" "ports/$(basename "$port")/link_layer" "ports/$(basename "$port")/rate")
    done
    copy_class infiniband "$name" "${ports[@]}"
done
for dev in "$SYS"/class/cxi/*; do
    copy_class cxi "$(basename "$dev")" dev
done
for dev in "$SYS"/class/net/*; do
    copy_class net "$(basename "$dev")" operstate
done
# The GPUs (NVIDIA: vendor 0x10de, display class 0x03xxxx).
for dev in "$SYS"/bus/pci/devices/*; do
    if [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] && [[ "$(cat "$dev/class" 2>/dev/null)" == 0x03* ]]; then
        copy_pci "$(basename "$dev")"
    fi
done
for node in "$SYS"/devices/system/node/node*; do
    copy_file "devices/system/node/$(basename "$node")/cpulist"
done
copy_file devices/system/node/possible
copy_file devices/system/node/online
for cpu in "$SYS"/devices/system/cpu/cpu[0-9]*; do
    for file in thread_siblings_list core_id physical_package_id; do
        copy_file "devices/system/cpu/$(basename "$cpu")/topology/$file"
    done
done

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi topo -m >"$WORK/topo.txt" 2>&1 || true
fi
{
    printf 'host: %s\n' "$HOST"
    printf 'date: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf 'kernel: %s\n' "$(uname -r)"
    printf 'sysfs: %s\n' "$SYS"
    printf 'cpu: %s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)"
} >"$WORK/ORIGIN"

mkdir -p "$DEST"
tar -C "$WORK" -czf "$DEST/topology-$HOST.tar.gz" .
printf '%s\n' "$DEST/topology-$HOST.tar.gz"

#!/usr/bin/env bash
# Installs what qlist needs from Debian's packages when it is missing: redis-server (the
# quorum nodes) and libclang-dev (bindgen, for RocksDB's bindings). Needs root or sudo.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ! compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null && ! compgen -G "/usr/lib/*/libclang*.so*" >/dev/null; then
  need+=(libclang-dev)
fi
command -v cc >/dev/null 2>&1 || need+=(build-essential)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "qlist: installing ${need[*]} (apt-get)" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "qlist: need root or sudo to install ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}" >/dev/null

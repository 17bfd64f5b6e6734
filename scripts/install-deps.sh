#!/usr/bin/env bash
# Installs the system packages the build needs, if missing (Debian 12):
#   libclang-dev     bindgen in librocksdb-sys needs libclang
#   librocksdb-dev   RocksDB 7.8.3, linked instead of building RocksDB from source (DESIGN.md: ~3 min vs ~10 min)
#   clang            C toolchain pieces bindgen looks for
#   pkg-config       used by -sys crates to find system libraries
set -euo pipefail
packages=(libclang-dev librocksdb-dev clang pkg-config)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "cargo not found: install the Rust toolchain (rustup)" >&2; exit 1; }

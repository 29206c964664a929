#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build Quorum: protoc (tonic's code
# generation) and libclang (bindgen for the rocksdb crate). RocksDB itself is compiled from
# source by the rocksdb crate; see README.md, "Building".
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
echo "installing: ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null

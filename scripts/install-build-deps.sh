#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build Quorum: protoc (tonic's code
# generation), libclang (bindgen for the rocksdb crate), and MUNGE (libmunge to link against,
# munged for `quorum dev` and the tests), which every Slurm site already runs, and Python's venv
# for the tests' workflow client, and PostgreSQL's server, which the tests start to check what
# quorum-dbd exports, and what jepsen/ needs (iproute2, nftables, libfaketime), and what
# containers need (squashfuse, squashfs-tools) and their tests (a registry, skopeo, umoci). RocksDB itself is compiled from
# source by the rocksdb crate; see README.md, "Building".
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# libclang itself, not libclang-cpp (which other LLVM packages bring without it).
have_libclang=no
for pattern in '/usr/lib/llvm-*/lib/libclang.so*' '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' \
  '/usr/lib/*-linux-gnu/libclang.so*' '/usr/lib/*-linux-gnu/libclang-[0-9]*.so*'; do
  if compgen -G "$pattern" >/dev/null; then have_libclang=yes; fi
done
[ $have_libclang = yes ] || need+=(libclang-dev)
command -v c++ >/dev/null 2>&1 || need+=(g++)
[ -x /usr/sbin/munged ] || need+=(munge)
[ -e /usr/include/munge.h ] || need+=(libmunge-dev)
command -v make >/dev/null 2>&1 || need+=(make)
# The tests drive Quorum with Python clients from PyPI, in virtual environments (scripts/pypi-venv.sh).
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# quorum-dbd's tests start a PostgreSQL server of their own (Debian: /usr/lib/postgresql/N/bin).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
# jepsen/ puts each controller and agent in a network namespace of its own (iproute2), cuts the
# network with nftables, and moves controllers' wall clocks with libfaketime.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || command -v /usr/sbin/nft >/dev/null 2>&1 || need+=(nftables)
compgen -G '/usr/lib/*-linux-gnu/faketime/libfaketimeMT.so.1' >/dev/null || need+=(faketime)
# The tests scrape the controllers' /metrics with curl, as an operator would.
command -v curl >/dev/null 2>&1 || need+=(curl)
# Containers (--container-image): nodes mount squashfs images with squashfuse and save them with
# mksquashfs; the tests run a real OCI registry (docker-registry, htpasswd logins, TLS from
# openssl), build their image from busybox-static with umoci and push it with skopeo.
command -v squashfuse >/dev/null 2>&1 || need+=(squashfuse)
command -v mksquashfs >/dev/null 2>&1 || need+=(squashfs-tools)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && ! ldd /bin/busybox >/dev/null 2>&1 || need+=(busybox-static)
# MPI (srun --mpi=pmi2, mpirun inside allocations): the tests build a program with Debian's
# MPICH and Open MPI and run it as users do.
command -v mpicc.mpich >/dev/null 2>&1 || need+=(mpich libmpich-dev)
command -v mpicc.openmpi >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
# srun --mpi=pmix: the agent loads OpenPMIx's server library when a step asks for it.
ldconfig -p 2>/dev/null | grep -q 'libpmix\.so\.2 ' || need+=(libpmix2)
# The dashboard's tests drive a real browser: headless Chromium through its WebDriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
echo "installing: ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null

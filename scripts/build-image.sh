#!/bin/sh
# Builds Quorum's container image from scratch (no base image is pulled): a root file system of
# the five release binaries (stripped), MUNGE's daemon and tools (how users prove who they are:
# run munged beside the programs, sharing its socket, as deploy/compose does), exactly the shared
# libraries they all link (as ldd finds them on this machine), a busybox shell and tools for the
# jobs a node container runs, the Slurm commands' names, CA certificates, and /etc files
# for a `quorum` user (uid 999) and a `munge` user (uid 998). The
# result is an OCI image layout (umoci), which podman, skopeo and any registry take:
#
#   cargo build --release --bins && scripts/build-image.sh [OUT_DIR]      # default: target/image
#   skopeo copy oci:target/image/quorum:latest containers-storage:localhost/quorum:latest
#   podman run --rm localhost/quorum:latest quorum-controller --version
#
# It runs quorum-controller --config /etc/quorum/controller.toml (mount it, and the data volume
# /var/lib/quorum); name another program to run it instead (quorum-agent ..., quorum ...).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release
out=${1:-$root/target/image}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
programs="quorum quorum-dev quorum-controller quorum-agent quorum-supervisor quorum-dbd"

for p in $programs; do
    [ -x "$bin/$p" ] || { echo "build-image: no $bin/$p: run cargo build --release --bins first" >&2; exit 1; }
done
command -v umoci >/dev/null || { echo "build-image: needs umoci (apt install umoci)" >&2; exit 1; }
munge_programs="/usr/sbin/munged /usr/sbin/mungekey /usr/bin/munge /usr/bin/unmunge"
for p in $munge_programs /bin/busybox; do
    [ -x "$p" ] || { echo "build-image: needs $p (apt install munge busybox-static)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fs=$work/rootfs
install -d "$fs/usr/bin" "$fs/usr/sbin" "$fs/etc/quorum" "$fs/var/lib/quorum" "$fs/var/spool/quorum" "$fs/tmp" \
    "$fs/etc/ssl/certs" "$fs/etc/munge" "$fs/var/lib/munge" "$fs/var/log/munge" "$fs/run/munge"
chmod 1777 "$fs/tmp"
chmod 0700 "$fs/etc/munge" "$fs/var/lib/munge" "$fs/var/log/munge"
[ "$(id -u)" != 0 ] || chown 998:998 "$fs/etc/munge" "$fs/var/lib/munge" "$fs/var/log/munge" "$fs/run/munge"
for p in $programs; do
    objcopy --strip-debug --strip-unneeded "$bin/$p" "$fs/usr/bin/$p"
done
for p in $munge_programs; do
    cp "$p" "$fs$p"
done
# A shell and the basic tools for the jobs a node runs (busybox, statically linked), and the
# Slurm command names on their PATH (the agent's --slurm-commands), each the quorum program.
install -d "$fs/bin" "$fs/usr/local/lib/quorum/slurm"
cp /bin/busybox "$fs/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ -e "$fs/bin/$applet" ] || [ -e "$fs/usr/bin/$applet" ] || ln -s busybox "$fs/bin/$applet"
done
names=$(mktemp -d)
"$bin/quorum" install-slurm-commands "$names/slurm" >/dev/null
for name in $(ls "$names/slurm"); do
    ln -s /usr/bin/quorum "$fs/usr/local/lib/quorum/slurm/$name"
done
rm -rf "$names"
# Every library the programs load, at the path the loader looks for it, and the loader.
{
for p in $programs; do echo "$bin/$p"; done; for p in $munge_programs; do echo "$p"; done
} | while read -r p; do
    ldd "$p" | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }'
done | sort -u | while read -r lib; do
    install -d "$fs$(dirname "$lib")"
    cp -L "$lib" "$fs$lib"
done
# libnss for getpwnam (users by name), which glibc loads at run time, not at link time.
for lib in /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libnss_compat.so.2; do
    [ -e "$lib" ] && install -D "$lib" "$fs$lib"
done
[ -e /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$fs/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nquorum:x:999:999:Quorum:/var/lib/quorum:/usr/sbin/nologin\nmunge:x:998:998:MUNGE:/var/lib/munge:/usr/sbin/nologin\n' > "$fs/etc/passwd"
printf 'root:x:0:\nquorum:x:999:\nmunge:x:998:\n' > "$fs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$fs/etc/nsswitch.conf"

image=$out/quorum
rm -rf "$image"
install -d "$out"
umoci init --layout "$image"
umoci new --image "$image:latest"
# As root the layer keeps the files' owners (munge's directories are munge's); rootless, every
# file is root's.
rootless=--rootless
[ "$(id -u)" = 0 ] && rootless=
umoci unpack $rootless --image "$image:latest" "$work/bundle" >/dev/null
cp -a "$fs/." "$work/bundle/rootfs/"
umoci repack $rootless --image "$image:latest" "$work/bundle"
umoci config --image "$image:latest" \
    --config.cmd=/usr/bin/quorum-controller --config.cmd=--config --config.cmd=/etc/quorum/controller.toml \
    --config.env PATH=/usr/local/lib/quorum/slurm:/usr/bin:/usr/sbin:/bin \
    --config.volume /var/lib/quorum \
    --config.label org.opencontainers.image.title=quorum \
    --config.label "org.opencontainers.image.version=$version" \
    --config.workingdir /var/lib/quorum
umoci gc --layout "$image"
echo "$image:latest"

#!/bin/sh
# Builds Quorum's container image from scratch (no base image is pulled): a root file system of
# the five release binaries (stripped), exactly the shared libraries they link (as ldd finds
# them on this machine), CA certificates, and /etc files for a `quorum` user (uid 999). The
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
programs="quorum quorum-dev quorum-controller quorum-agent quorum-dbd"

for p in $programs; do
    [ -x "$bin/$p" ] || { echo "build-image: no $bin/$p: run cargo build --release --bins first" >&2; exit 1; }
done
command -v umoci >/dev/null || { echo "build-image: needs umoci (apt install umoci)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fs=$work/rootfs
install -d "$fs/usr/bin" "$fs/etc/quorum" "$fs/var/lib/quorum" "$fs/var/spool/quorum" "$fs/tmp" "$fs/etc/ssl/certs"
chmod 1777 "$fs/tmp"
for p in $programs; do
    objcopy --strip-debug --strip-unneeded "$bin/$p" "$fs/usr/bin/$p"
done
# Every library the programs load, at the path the loader looks for it, and the loader.
for p in $programs; do
    ldd "$bin/$p" | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }'
done | sort -u | while read -r lib; do
    install -d "$fs$(dirname "$lib")"
    cp -L "$lib" "$fs$lib"
done
# libnss for getpwnam (users by name), which glibc loads at run time, not at link time.
for lib in /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libnss_compat.so.2; do
    [ -e "$lib" ] && install -D "$lib" "$fs$lib"
done
[ -e /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$fs/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nquorum:x:999:999:Quorum:/var/lib/quorum:/usr/sbin/nologin\n' > "$fs/etc/passwd"
printf 'root:x:0:\nquorum:x:999:\n' > "$fs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$fs/etc/nsswitch.conf"

image=$out/quorum
rm -rf "$image"
install -d "$out"
umoci init --layout "$image"
umoci new --image "$image:latest"
umoci unpack --rootless --image "$image:latest" "$work/bundle" >/dev/null
cp -a "$fs/." "$work/bundle/rootfs/"
umoci repack --image "$image:latest" "$work/bundle"
umoci config --image "$image:latest" \
    --config.cmd=/usr/bin/quorum-controller --config.cmd=--config --config.cmd=/etc/quorum/controller.toml \
    --config.env PATH=/usr/bin \
    --config.volume /var/lib/quorum \
    --config.label org.opencontainers.image.title=quorum \
    --config.label "org.opencontainers.image.version=$version" \
    --config.workingdir /var/lib/quorum
umoci gc --layout "$image"
echo "$image:latest"

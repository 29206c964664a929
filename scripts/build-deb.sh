#!/bin/sh
# Builds the Debian package quorum_VERSION_ARCH.deb from the workspace's release binaries
# (run `cargo build --release --bins` first): the five programs (stripped), systemd units for
# the controller (as the `quorum` system user), the agent (as root) and the accounting daemon,
# example configuration, and the man pages `quorum man` writes. Its dependencies are what
# dpkg-shlibdeps finds the binaries linked against.
#
#   scripts/build-deb.sh [OUT_DIR]       # default: target/debian
#   apt install ./target/debian/quorum_*.deb
#
# Nothing here needs root: the files' owners are set in the archive (dpkg-deb --root-owner-group).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release
out=${1:-$root/target/debian}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
arch=$(dpkg --print-architecture)
programs="quorum quorum-dev quorum-controller quorum-agent quorum-supervisor quorum-dbd"

for p in $programs; do
    [ -x "$bin/$p" ] || { echo "build-deb: no $bin/$p: run cargo build --release --bins first" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/quorum
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/usr/share/doc/quorum/examples" \
    "$pkg/usr/share/man"
for p in $programs; do
    objcopy --strip-debug --strip-unneeded "$bin/$p" "$pkg/usr/bin/$p"
    chmod 0755 "$pkg/usr/bin/$p"
done

# The units, with the programs where the package puts them; the controller as its own user.
for unit in quorum-controller quorum-agent quorum-dbd; do
    sed 's#/usr/local/bin/#/usr/bin/#g' "$root/deploy/systemd/$unit.service" > "$pkg/lib/systemd/system/$unit.service"
done
sed -i 's/^\[Service\]$/[Service]\nUser=quorum\nGroup=quorum/' "$pkg/lib/systemd/system/quorum-controller.service"
sed -i 's/^\[Service\]$/[Service]\nUser=quorum\nGroup=quorum/' "$pkg/lib/systemd/system/quorum-dbd.service"
chmod 0644 "$pkg"/lib/systemd/system/*

cp "$root/deploy/examples/local/controller-1.toml" "$pkg/usr/share/doc/quorum/examples/controller.toml"
cp "$root/deploy/examples/dev/site.toml" "$pkg/usr/share/doc/quorum/examples/site.toml"
cp "$root/deploy/systemd/agent.env.example" "$pkg/usr/share/doc/quorum/examples/agent.env"
cp "$root/deploy/RUNBOOK.md" "$pkg/usr/share/doc/quorum/RUNBOOK.md"
cat > "$pkg/usr/share/doc/quorum/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: quorum
Files: *
License: $(sed -n 's/^license = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
EOF
chmod 0644 "$pkg"/usr/share/doc/quorum/* "$pkg"/usr/share/doc/quorum/examples/*

# Man pages of every command, Slurm's names included, compressed as Debian keeps them.
PATH="$bin:$PATH" "$bin/quorum" man "$pkg/usr/share/man" >/dev/null
find "$pkg/usr/share/man" -type f -name '*.1' -exec gzip -9n {} +
find "$pkg/usr/share/man" -type f -exec chmod 0644 {} +

# Dependencies from the libraries the binaries link.
install -d "$stage/debian"
printf 'Source: quorum\n\nPackage: quorum\nArchitecture: any\n' > "$stage/debian/control"
depends=$(cd "$stage" && dpkg-shlibdeps -O $(for p in $programs; do printf 'quorum/usr/bin/%s ' "$p"; done) 2>/dev/null \
    | sed -n 's/^shlibs:Depends=//p')
size=$(du -sk "$pkg" | cut -f1)

cat > "$pkg/DEBIAN/control" <<EOF
Package: quorum
Version: $version
Architecture: $arch
Maintainer: Quorum developers <quorum@localhost>
Installed-Size: $size
Depends: $depends, adduser
Recommends: munge
Suggests: libpmix2, openmpi-bin, mpich
Section: admin
Priority: optional
Description: batch scheduler for HPC and GPU clusters with Slurm's commands
 Quorum schedules batch jobs on HPC and GPU clusters with Slurm's model and
 commands (sbatch, srun, squeue, scontrol, sacct, ...): partitions, fairshare,
 QOS, backfill, multi-node jobs with typed GPUs, arrays, steps and accounting.
 Three or five controller replicas agree through Raft; node agents run the jobs.
EOF

cat > "$pkg/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd quorum >/dev/null; then
        adduser --system --group --home /var/lib/quorum --no-create-home --quiet quorum
    fi
    install -d -m 0755 /etc/quorum
    install -d -o quorum -g quorum -m 0700 /var/lib/quorum
    install -d -m 0700 /var/spool/quorum
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null || true
    fi
fi
exit 0
EOF

cat > "$pkg/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    for unit in quorum-controller quorum-agent quorum-dbd; do
        systemctl stop "$unit.service" >/dev/null 2>&1 || true
        systemctl disable "$unit.service" >/dev/null 2>&1 || true
    done
fi
exit 0
EOF

cat > "$pkg/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
if [ "$1" = purge ]; then
    # The configuration goes; the replicas' data (/var/lib/quorum, every job's script and
    # environment) and the agents' spool are the operator's to remove.
    rm -rf /etc/quorum
    if getent passwd quorum >/dev/null; then
        deluser --system --quiet quorum || true
    fi
    if getent group quorum >/dev/null; then
        delgroup --system --quiet quorum || true
    fi
fi
exit 0
EOF
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"

install -d "$out"
deb="$out/quorum_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"

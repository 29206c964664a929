#!/bin/sh
# Installs the Debian package in a clean Debian root (debootstrap --variant=minbase, then
# chroot) with apt, checks what it installed (the programs run, the `quorum` user, the units,
# the man pages), removes and purges it, and checks that nothing of it is left. Needs root and
# a Debian mirror (the machine's apt sources).
#
#   scripts/test-deb.sh target/debian/quorum_*.deb [ROOT_DIR]
set -eu

deb=$(realpath "$1")
root=${2:-/var/tmp/quorum-deb-root}
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}

if [ ! -x "$root/usr/bin/apt-get" ]; then
    echo "test-deb: debootstrap $suite into $root from $mirror"
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >/dev/null
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
cp "$deb" "$root/tmp/quorum.deb"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }

in_root apt-get update -qq
in_root apt-get install -y -qq /tmp/quorum.deb >/dev/null
in_root quorum-controller --version
in_root quorum-agent --version
in_root quorum-supervisor --fingerprint
in_root quorum --version
in_root getent passwd quorum
[ "$(in_root stat -c '%U %a' /var/lib/quorum)" = "quorum 700" ]
in_root test -f /lib/systemd/system/quorum-controller.service
grep -q '^User=quorum$' "$root/lib/systemd/system/quorum-controller.service"
in_root test -f /usr/share/man/man1/sbatch.1.gz
echo "test-deb: installed; removing"

in_root apt-get purge -y -qq quorum >/dev/null
for f in /usr/bin/quorum /usr/bin/quorum-controller /lib/systemd/system/quorum-controller.service /etc/quorum \
    /usr/share/doc/quorum /usr/share/man/man1/sbatch.1.gz; do
    if in_root test -e "$f"; then echo "test-deb: $f is left after purge" >&2; exit 1; fi
done
if in_root getent passwd quorum >/dev/null; then echo "test-deb: the quorum user is left after purge" >&2; exit 1; fi
echo "test-deb: purged cleanly"

#!/bin/sh
# Installs Brindle on a plain Linux host (no Kubernetes) and starts it.
#
#   cargo build --release --locked --bins -p brindle-cni -p brindle-ipam \
#       -p brindle-ctrl -p brindle-vrouter
#   sudo deploy/systemd/install.sh
#
# Environment:
#   BRINDLE_BIN_DIR  where the built binaries are (default: target/release of
#                    the repository this script is in)
#   DESTDIR          install under this root instead of /, and do not touch
#                    systemd (packaging, and the test in tests/tests/deploy.rs)
#
# Existing /etc/brindle/*.toml are kept: edit them, then
# `systemctl restart brindle-vrouter brindle-ctrl`.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin_dir=${BRINDLE_BIN_DIR:-$repo/target/release}
root=${DESTDIR:-}

# Copy then rename: a plugin the runtime is executing at this moment keeps its
# old inode, instead of failing with "text file busy" or running a torn file.
install_file() { # mode source destination
    tmp="$3.brindle-new.$$"
    cp "$2" "$tmp"
    chmod "$1" "$tmp"
    mv -f "$tmp" "$3"
}

for b in brindle brindle-ipam brindle-ctrl brindle-vrouter brindlectl; do
    [ -x "$bin_dir/$b" ] || { echo "install.sh: $bin_dir/$b missing: build the release binaries first" >&2; exit 1; }
done

mkdir -p "$root/usr/local/bin" "$root/opt/cni/bin" "$root/etc/cni/net.d" \
    "$root/etc/systemd/system" "$root/usr/local/share/doc/brindle"
install -d -m 0755 "$root/etc/brindle"

for b in brindle-ctrl brindle-vrouter brindlectl; do
    install_file 0755 "$bin_dir/$b" "$root/usr/local/bin/$b"
done
for b in brindle brindle-ipam; do
    install_file 0755 "$bin_dir/$b" "$root/opt/cni/bin/$b"
done
# The conflist chains the reference plugins tuning and portmap (and
# bandwidth with veth pods, the option)
# (Debian: containernetworking-plugins, in /usr/lib/cni); link them where the
# runtime looks unless the host already has its own.
for p in tuning bandwidth portmap; do
    if [ ! -e "$root/opt/cni/bin/$p" ] && [ -x "/usr/lib/cni/$p" ]; then
        ln -s "/usr/lib/cni/$p" "$root/opt/cni/bin/$p"
    fi
done
install_file 0644 "$here/../cni/10-brindle.conflist" "$root/etc/cni/net.d/10-brindle.conflist"

for c in node.toml vrouter.toml; do
    [ -e "$root/etc/brindle/$c" ] || install_file 0644 "$here/$c" "$root/etc/brindle/$c"
done
for u in brindle-vrouter.service brindle-ctrl.service; do
    install_file 0644 "$here/$u" "$root/etc/systemd/system/$u"
done
install_file 0644 "$here/../README.md" "$root/usr/local/share/doc/brindle/README.md"

if [ -z "$root" ]; then
    # XDP programs and maps are pinned in the BPF filesystem.
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
    systemctl daemon-reload
    systemctl enable --now brindle-vrouter.service brindle-ctrl.service
    echo "Brindle installed; status: systemctl status brindle-vrouter brindle-ctrl; brindlectl --help"
else
    echo "Brindle installed under $root (systemd untouched)"
fi

#!/bin/sh
# Builds the Brindle image with Podman, from Debian's packages alone (no
# container registry is needed):
#
#   1. the base, localhost/brindle-base:bookworm-<hash>: mmdebstrap makes a
#      Debian bookworm root (variant essential, plus RUNTIME_PACKAGES) from
#      Debian's signed packages and `podman import` turns it into an image.
#      Kept between builds; the tag changes with the package list.
#   2. the binaries: `cargo build --release --locked` of the four packages,
#      or the ones in --binaries DIR; copied into a small build context with
#      debug sections stripped.
#   3. `podman build -f deploy/Containerfile` on that context.
#
# usage (as root, from anywhere in the repository):
#   deploy/image/build.sh [--tag localhost/brindle:0.1.0] [--binaries DIR] [--base-only]
#
# Needs: mmdebstrap, podman, binutils (strip); `cargo xtask deps` installs them.
set -eu

# What the daemons and the init container use at run time: iproute2 and
# iptables (the daemon programs the host and an operator debugs with them),
# ca-certificates (TLS to etcd and the Kubernetes API), and the reference
# plugins tuning, bandwidth and portmap that the conflist chains
# (containernetworking-plugins, copied by install-cni to hosts that lack them).
RUNTIME_PACKAGES="iproute2,iptables,ca-certificates,containernetworking-plugins"
SUITE=bookworm
BINARIES="brindle-ctrl brindle-vrouter brindlectl brindle brindle-ipam"

repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=localhost/brindle:0.1.0
bin_dir=
base_only=no
while [ $# -gt 0 ]; do
    case $1 in
        --tag) tag=$2; shift 2 ;;
        --binaries) bin_dir=$2; shift 2 ;;
        --base-only) base_only=yes; shift ;;
        *) echo "usage: $0 [--tag TAG] [--binaries DIR] [--base-only]" >&2; exit 2 ;;
    esac
done

for tool in mmdebstrap podman strip; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool not found (cargo xtask deps installs it)" >&2
        exit 1
    }
done

# 1. The base. Its tag names the suite and a hash of everything that makes
#    it (suite, packages, options), so a changed recipe builds a new base and
#    an unchanged one is reused.
#    essential: dpkg, coreutils, a shell and libc, without apt (nothing in the
#    image installs packages); no Recommends; documentation, manuals and
#    translations are not unpacked, nor the reference plugins the conflist
#    does not chain (dhcp, bridge, macvlan, ... are most of the package).
#    force-unsafe-io: the root is a throwaway tarball.
set -- --variant=essential --include="$RUNTIME_PACKAGES" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='force-unsafe-io' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/lib/cni/*' \
    --dpkgopt='path-include=/usr/lib/cni/tuning' \
    --dpkgopt='path-include=/usr/lib/cni/bandwidth' \
    --dpkgopt='path-include=/usr/lib/cni/portmap' \
    "$SUITE"
recipe_hash=$(printf '%s\n' "$@" | sha256sum | cut -c1-12)
base=localhost/brindle-base:$SUITE-$recipe_hash
if podman image exists "$base"; then
    echo "base $base exists"
else
    echo "building base $base from Debian $SUITE packages: $RUNTIME_PACKAGES"
    started=$(date +%s)
    mmdebstrap --quiet "$@" - |
        podman import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["/bin/sh"]' \
            --message "Debian $SUITE (essential) with $RUNTIME_PACKAGES, made by mmdebstrap" \
            - "$base" >/dev/null
    echo "base $base built in $(( $(date +%s) - started )) s"
fi
[ "$base_only" = yes ] && exit 0

# 2. The binaries.
if [ -z "$bin_dir" ]; then
    (cd "$repo" && cargo build --release --locked --bins \
        -p brindle-cni -p brindle-ipam -p brindle-ctrl -p brindle-vrouter)
    bin_dir=${CARGO_TARGET_DIR:-$repo/target}/release
fi
context=$(mktemp -d "${TMPDIR:-/tmp}/brindle-image.XXXXXX")
trap 'rm -rf "$context"' EXIT INT TERM
mkdir "$context/bin"
for b in $BINARIES; do
    [ -x "$bin_dir/$b" ] || { echo "$0: $bin_dir/$b: no such binary" >&2; exit 1; }
    strip --strip-debug -o "$context/bin/$b" "$bin_dir/$b"
done
cp "$repo/deploy/image/install-cni.sh" "$context/install-cni.sh"
cp "$repo/deploy/cni/10-brindle.conflist" "$context/10-brindle.conflist"

# 3. The image.
podman build --quiet --pull=never --network=none \
    --build-arg "BASE_IMAGE=$base" \
    -f "$repo/deploy/Containerfile" -t "$tag" "$context" >/dev/null
echo "built $tag on $base"

#!/bin/sh
# brindle-install-cni: the DaemonSet's init container. Puts the CNI plugins
# and the conflist where the host's container runtime looks for them (the
# host's /opt/cni/bin and /etc/cni/net.d, mounted into the container).
#
# Environment (the defaults match deploy/kubernetes/base/daemonset.yaml):
#   BRINDLE_CNI_SRC_DIR   the plugins in the image       (/opt/brindle/cni/bin)
#   BRINDLE_CNI_REF_DIR   the reference plugins          (/usr/lib/cni)
#   BRINDLE_CNI_BIN_DIR   the host's plugin directory    (/host/opt/cni/bin)
#   BRINDLE_CNI_NET_DIR   the host's config directory    (/host/etc/cni/net.d)
#   BRINDLE_CNI_CONFLIST  the conflist to install        (/etc/brindle/10-brindle.conflist)
set -eu

src_dir=${BRINDLE_CNI_SRC_DIR:-/opt/brindle/cni/bin}
ref_dir=${BRINDLE_CNI_REF_DIR:-/usr/lib/cni}
bin_dir=${BRINDLE_CNI_BIN_DIR:-/host/opt/cni/bin}
net_dir=${BRINDLE_CNI_NET_DIR:-/host/etc/cni/net.d}
conflist=${BRINDLE_CNI_CONFLIST:-/etc/brindle/10-brindle.conflist}

# Copy to a temporary name in the same directory, then rename over the old
# file: a runtime exec'ing the plugin or reading the conflist right now sees
# the old file or the new one, never a torn one, and replacing a running
# binary never fails with "text file busy".
install_file() { # mode source destination
    tmp="$3.brindle-new.$$"
    cp "$2" "$tmp"
    chmod "$1" "$tmp"
    mv -f "$tmp" "$3"
}

mkdir -p "$bin_dir" "$net_dir"
for plugin in brindle brindle-ipam; do
    install_file 0755 "$src_dir/$plugin" "$bin_dir/$plugin"
    echo "installed $bin_dir/$plugin"
done
# The conflist chains the reference plugins tuning and portmap (and
# bandwidth with veth pods, the option).
# Most nodes have them already (kubeadm's kubernetes-cni, the distribution's
# containernetworking-plugins); the host's own copies win.
for plugin in tuning bandwidth portmap; do
    if [ ! -e "$bin_dir/$plugin" ]; then
        install_file 0755 "$ref_dir/$plugin" "$bin_dir/$plugin"
        echo "installed $bin_dir/$plugin"
    fi
done
# The conflist last: once it exists the runtime calls the plugins.
install_file 0644 "$conflist" "$net_dir/10-brindle.conflist"
echo "installed $net_dir/10-brindle.conflist"

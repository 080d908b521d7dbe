#!/usr/bin/env bash
# Makes the Linux kernel produce the frames in this directory.
#
# Run as root: ./capture.sh   (needs iproute2, iputils-ping, tcpdump, python3)
#
# Topology, in three network namespaces created here and removed on exit:
#
#   A  a0 02:00:00:00:00:0a 192.168.100.1/24, fd00::1/64
#      vx0 (VXLAN VNI 4096, dstport 4789, noudpcsum) 02:00:00:00:0e:01 10.244.0.1/24
#      vx1 (VXLAN VNI 4097, dstport 8472, default)   02:00:00:00:0e:11 10.245.0.1/24
#      default via 192.168.100.254
#   R  r0 02:00:00:00:00:1a 192.168.100.254/24, fd00::fe/64 (peer of a0)
#      vx0 10.244.0.2/24 (02:00:00:00:0e:02),
#      vx1 10.245.0.2/24 (02:00:00:00:0e:12), forwarding on
#      r1 02:00:00:00:00:1b 192.168.200.254/24, fd01::fe/64, mtu 1300
#   B  b0 02:00:00:00:00:0b 192.168.200.1/24, fd01::1/64, mtu 1300,
#      default via .254 / fd01::fe
#   (A's IPv6 default route is via fd00::fe)
#
# Every capture is taken on a0 in A, one scenario at a time, and written as
# <scenario>.hex: one frame per line, hex, in capture order.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TAG=wv$$
A=$TAG-a R=$TAG-r B=$TAG-b
WORK=$(mktemp -d)
TCPDUMP_PID=

cleanup() {
    [ -n "$TCPDUMP_PID" ] && kill "$TCPDUMP_PID" 2>/dev/null || true
    for ns in "$A" "$R" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

ip netns add "$A"; ip netns add "$R"; ip netns add "$B"
ip link add a0 netns "$A" type veth peer name r0 netns "$R"
ip link add r1 netns "$R" type veth peer name b0 netns "$B"

a() { ip netns exec "$A" "$@"; }
r() { ip netns exec "$R" "$@"; }
b() { ip netns exec "$B" "$@"; }

for ns in "$A" "$R" "$B"; do ip netns exec "$ns" ip link set lo up; done
for ns in "$A" "$R" "$B"; do ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=0; done
r sysctl -qw net.ipv4.ip_forward=1
r sysctl -qw net.ipv6.conf.all.forwarding=1

a ip link set a0 address 02:00:00:00:00:0a
r ip link set r0 address 02:00:00:00:00:1a
r ip link set r1 address 02:00:00:00:00:1b mtu 1300
b ip link set b0 address 02:00:00:00:00:0b mtu 1300

a ip addr add 192.168.100.1/24 dev a0
a ip -6 addr add fd00::1/64 dev a0 nodad
r ip addr add 192.168.100.254/24 dev r0
r ip -6 addr add fd00::fe/64 dev r0 nodad
r ip addr add 192.168.200.254/24 dev r1
r ip -6 addr add fd01::fe/64 dev r1 nodad
b ip addr add 192.168.200.1/24 dev b0
b ip -6 addr add fd01::1/64 dev b0 nodad
a ip link set a0 up; r ip link set r0 up; r ip link set r1 up; b ip link set b0 up
a ip route add default via 192.168.100.254
b ip route add default via 192.168.200.254
a ip -6 route add default via fd00::fe
b ip -6 route add default via fd01::fe

# The checksums in a capture are final only without TX checksum offload
# (veth offloads by default, and tcpdump would see partial checksums).
a ethtool -K a0 tx off >/dev/null; r ethtool -K r0 tx off >/dev/null
r ethtool -K r1 tx off >/dev/null; b ethtool -K b0 tx off >/dev/null

# VXLAN with Calico's VNI and port, outer UDP checksum 0 (noudpcsum)
a ip link add vx0 type vxlan id 4096 dstport 4789 local 192.168.100.1 remote 192.168.100.254 dev a0 noudpcsum
r ip link add vx0 type vxlan id 4096 dstport 4789 local 192.168.100.254 remote 192.168.100.1 dev r0 noudpcsum
a ip link set vx0 address 02:00:00:00:0e:01; r ip link set vx0 address 02:00:00:00:0e:02
a ip addr add 10.244.0.1/24 dev vx0; r ip addr add 10.244.0.2/24 dev vx0
a ip link set vx0 up; r ip link set vx0 up
# and one with the kernel's default checksum setting (on this kernel:
# udpcsum, the outer UDP checksum is computed)
a ip link add vx1 type vxlan id 4097 dstport 8472 local 192.168.100.1 remote 192.168.100.254 dev a0
r ip link add vx1 type vxlan id 4097 dstport 8472 local 192.168.100.254 remote 192.168.100.1 dev r0
a ip link set vx1 address 02:00:00:00:0e:11; r ip link set vx1 address 02:00:00:00:0e:12
a ip addr add 10.245.0.1/24 dev vx1; r ip addr add 10.245.0.2/24 dev vx1
a ip link set vx1 up; r ip link set vx1 up
sleep 1

# capture NAME FILTER COMMAND...: runs COMMAND in A while tcpdump listens on a0.
capture() {
    local name=$1 filter=$2; shift 2
    a tcpdump -i a0 -U -s 0 -w "$WORK/$name.pcap" $filter >/dev/null 2>&1 &
    TCPDUMP_PID=$!
    sleep 1
    a "$@" >/dev/null 2>&1 || true
    sleep 1
    kill "$TCPDUMP_PID"; wait "$TCPDUMP_PID" 2>/dev/null || true
    TCPDUMP_PID=
    python3 - "$WORK/$name.pcap" "$HERE/$name.hex" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
magic = struct.unpack("<I", data[:4])[0]
end = "<" if magic in (0xa1b2c3d4, 0xa1b23c4d) else ">"
off, lines = 24, []
while off + 16 <= len(data):
    _, _, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
    lines.append(data[off + 16:off + 16 + incl].hex())
    off += 16 + incl
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print(f"{sys.argv[2]}: {len(lines)} frames")
PY
}

# The neighbour entry is flushed first so that the kernel ARPs.
capture arp_icmp_echo "arp or icmp" sh -c "ip neigh flush dev a0; ping -c 1 -W 1 192.168.100.254"
capture vxlan_arp_icmp_echo "udp port 4789" ping -c 1 -W 1 10.244.0.2
capture vxlan_default_csum_icmp_echo "udp port 8472" ping -c 1 -W 1 10.245.0.2
capture ipv6_icmp_echo "ip6" ping -6 -c 1 -W 1 fd00::fe
# TTL 1 through R: R answers with time exceeded (type 11 code 0).
capture icmp_time_exceeded "icmp" ping -c 1 -W 1 -t 1 192.168.200.1
# DF and 1428 bytes towards B behind R's 1300-byte link: R answers with
# fragmentation needed (type 3 code 4, next-hop MTU 1300).
capture icmp_frag_needed "icmp" ping -c 1 -W 1 -M do -s 1400 192.168.200.1
# The same for IPv6: hop limit 1 through R gives time exceeded (ICMPv6 type
# 3 code 0), 1448 bytes gives packet too big (type 2, MTU 1300).
capture icmpv6_time_exceeded "icmp6 and ip6[40] != 135 and ip6[40] != 136 and ip6[40] != 133 and ip6[40] != 134" ping -6 -c 1 -W 1 -t 1 fd01::1
capture icmpv6_packet_too_big "icmp6 and ip6[40] != 135 and ip6[40] != 136 and ip6[40] != 133 and ip6[40] != 134" ping -6 -c 1 -W 1 -M do -s 1400 fd01::1
# An IPv4 header with options (record route, 40 bytes) to R.
capture ipv4_options "icmp" ping -c 1 -W 1 -R 192.168.100.254

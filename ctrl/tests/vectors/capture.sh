#!/bin/sh
# Record a BIRD 2 <-> GoBGP session with tcpdump and turn every BGP message
# into a hex vector (see README.md). Needs root; leaves nothing behind.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
NB=bgpcap-bird-$$
NG=bgpcap-gobgp-$$
cleanup() {
    [ -f "$W/bird.pid" ] && kill "$(cat "$W/bird.pid")" 2>/dev/null || true
    [ -f "$W/gobgpd.pid" ] && kill "$(cat "$W/gobgpd.pid")" 2>/dev/null || true
    [ -f "$W/tcpdump.pid" ] && kill "$(cat "$W/tcpdump.pid")" 2>/dev/null || true
    sleep 0.5
    ip netns del "$NB" 2>/dev/null || true
    ip netns del "$NG" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
ip netns add "$NB"
ip netns add "$NG"
ip link add vcapb$$ netns "$NB" type veth peer name vcapg$$ netns "$NG"
ip -n "$NB" link set lo up
ip -n "$NG" link set lo up
ip -n "$NB" addr add 10.0.0.1/24 dev vcapb$$
ip -n "$NB" addr add 10.0.0.3/24 dev vcapb$$
ip -n "$NB" addr add fd00::1/64 dev vcapb$$ nodad
ip -n "$NG" addr add 10.0.0.2/24 dev vcapg$$
ip -n "$NG" addr add 10.0.0.4/24 dev vcapg$$
ip -n "$NG" addr add fd00::2/64 dev vcapg$$ nodad
ip -n "$NB" link set vcapb$$ up
ip -n "$NG" link set vcapg$$ up

cat > "$W/bird.conf" <<BIRD
router id 10.0.0.1;
protocol device {}
protocol static s4 { ipv4; route 192.0.2.0/24 blackhole; route 198.51.100.0/25 blackhole; }
protocol static s6 { ipv6; route 2001:db8:1::/48 blackhole; }
filter out4 { bgp_community.add((65001,100)); bgp_med = 50; accept; }
protocol bgp g1 {
    local 10.0.0.1 as 65001;
    neighbor 10.0.0.2 as 4200000002;
    hold time 90;
    graceful restart on;
    ipv4 { import all; export filter out4; };
    ipv6 { import all; export all; next hop address fd00::1; };
}
protocol bgp g2 {
    local 10.0.0.3 as 65001;
    neighbor 10.0.0.4 as 23456;
    enable as4 off;
    ipv4 { import all; export all; };
}
BIRD
cat > "$W/gobgpd.toml" <<GOBGP
[global.config]
  as = 4200000002
  router-id = "10.0.0.2"
[[neighbors]]
  [neighbors.config]
    neighbor-address = "10.0.0.1"
    peer-as = 65001
  [neighbors.transport.config]
    local-address = "10.0.0.2"
  [neighbors.graceful-restart.config]
    enabled = true
    restart-time = 120
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-unicast"
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv6-unicast"
[[neighbors]]
  [neighbors.config]
    neighbor-address = "10.0.0.3"
    peer-as = 65001
  [neighbors.transport.config]
    local-address = "10.0.0.4"
GOBGP

ip netns exec "$NG" tcpdump -i vcapg$$ -U -w "$W/bgp.pcap" 'tcp port 179' >/dev/null 2>&1 &
echo $! > "$W/tcpdump.pid"
sleep 1
ip netns exec "$NB" bird -c "$W/bird.conf" -s "$W/bird.ctl" -P "$W/bird.pid"
ip netns exec "$NG" gobgpd -f "$W/gobgpd.toml" --api-hosts 127.0.0.1:50099 >"$W/gobgpd.log" 2>&1 &
echo $! > "$W/gobgpd.pid"
G="ip netns exec $NG gobgp -p 50099"
sleep 6
$G global rib add 203.0.113.0/24 origin igp med 10 community 65002:1,no-export -a ipv4
$G global rib add 203.0.113.128/25 aspath 65010,65011 origin egp aggregator 65010:10.9.9.9 -a ipv4
$G global rib add 2001:db8:2::/48 nexthop fd00::2 -a ipv6
sleep 4
$G neighbor 10.0.0.1 softresetin
ip netns exec "$NB" birdc -s "$W/bird.ctl" reload in g1
sleep 2
$G global rib del 203.0.113.0/24 -a ipv4
sleep 2
ip netns exec "$NB" birdc -s "$W/bird.ctl" disable g1
sleep 1
$G neighbor 10.0.0.3 disable
sleep 2
kill "$(cat "$W/tcpdump.pid")"; rm "$W/tcpdump.pid"
sleep 1
python3 "$HERE/extract.py" "$W/bgp.pcap" "$HERE"

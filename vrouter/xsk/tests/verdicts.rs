//! The steering program's verdict for each kind of frame, rule by rule, by
//! running it on crafted frames (BPF_PROG_TEST_RUN) with a socket bound on
//! loopback in a namespace made by the test.

mod common;

use std::net::Ipv4Addr;

use anyhow::Result;
use brindle_xsk::{
    Role, Steering, SteeringConfig, Umem, UmemConfig, Verdict, XdpMode, XskConfig, XskSocket,
    ifindex,
};
use common::{Enter, Netns, mac, udp_frame};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const PEER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

/// Ethernet + IPv4 (with `options` bytes of IP options) + `l4` payload.
fn ipv4(proto: u8, dst: Ipv4Addr, options: usize, l4: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&mac(10, 1));
    f.extend_from_slice(&mac(10, 2));
    f.extend_from_slice(&[0x08, 0x00]);
    let ihl = 20 + options;
    let mut ip = vec![0u8; ihl];
    ip[0] = 0x40 | (ihl / 4) as u8;
    ip[2..4].copy_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&PEER.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    for b in &mut ip[20..] {
        *b = 1; // NOP options
    }
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

fn ports(sport: u16, dport: u16) -> Vec<u8> {
    let mut l4 = sport.to_be_bytes().to_vec();
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&[0u8; 16]);
    l4
}

fn arp(target: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac(10, 1));
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac(10, 1));
    f.extend_from_slice(&PEER.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

fn ethertype(t: u16, len: usize) -> Vec<u8> {
    let mut f = mac(10, 1).to_vec();
    f.extend_from_slice(&mac(10, 2));
    f.extend_from_slice(&t.to_be_bytes());
    f.resize(len, 0);
    f
}

#[test]
#[ignore = "requires root and network namespaces"]
fn each_rule_gives_the_expected_verdict() -> Result<()> {
    let ns = Netns::new("sv")?;
    ns.enter(|| -> Result<()> {
        let steering = Steering::new(SteeringConfig::default())?;
        steering.set_node(Some(NODE), 4789)?;
        steering.add_pod_prefix(Ipv4Addr::new(10, 244, 1, 0), 24)?;
        let lo = ifindex("lo")?;
        let umem = Umem::new(UmemConfig {
            frame_count: 64,
            ..UmemConfig::default()
        })?;
        let config = XskConfig {
            rx_size: 64,
            tx_size: 64,
            fill_size: 64,
            comp_size: 64,
            ..XskConfig::default()
        };
        let sock = XskSocket::bind(&umem, lo, 0, &config)?;
        let uplink = steering.attach(lo, Role::Uplink, XdpMode::Auto)?;
        uplink.set_socket(&sock)?;

        use Verdict::{Pass, Redirect};
        let vxlan = udp_frame(mac(10, 2), mac(10, 1), PEER, NODE, 40000, 4789, &[0u8; 16]);
        let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
            ("IPIP to the node", ipv4(4, NODE, 0, &[0x45; 20]), Redirect),
            (
                "IPIP to another address",
                ipv4(4, OUTSIDE, 0, &[0x45; 20]),
                Pass,
            ),
            ("VXLAN to the node", vxlan.clone(), Redirect),
            (
                "VXLAN to the node, IP options",
                ipv4(17, NODE, 8, &ports(40000, 4789)),
                Redirect,
            ),
            (
                "UDP 4790 to the node",
                ipv4(17, NODE, 0, &ports(40000, 4790)),
                Pass,
            ),
            (
                "DNS to the node",
                ipv4(17, NODE, 0, &ports(40000, 53)),
                Pass,
            ),
            (
                "BGP to the node",
                ipv4(6, NODE, 0, &ports(40000, 179)),
                Pass,
            ),
            ("SSH to the node", ipv4(6, NODE, 0, &ports(40000, 22)), Pass),
            (
                "kubelet to the node",
                ipv4(6, NODE, 0, &ports(40000, 10250)),
                Pass,
            ),
            (
                "ICMP to the node",
                ipv4(1, NODE, 0, &[8, 0, 0, 0, 0, 0, 0, 0]),
                Pass,
            ),
            (
                "UDP to a pod",
                ipv4(17, POD, 0, &ports(40000, 53)),
                Redirect,
            ),
            ("TCP to a pod", ipv4(6, POD, 0, &ports(40000, 80)), Redirect),
            (
                "IPv4 outside the pod prefixes",
                ipv4(6, OUTSIDE, 0, &ports(40000, 80)),
                Pass,
            ),
            ("ARP for a pod", arp(POD), Redirect),
            ("ARP for the node", arp(NODE), Pass),
            ("IPv6", ethertype(0x86dd, 80), Pass),
            ("802.1Q", ethertype(0x8100, 80), Pass),
            ("IPv4 cut inside its header", vxlan[..30].to_vec(), Pass),
            (
                "VXLAN cut inside the UDP ports",
                vxlan[..14 + 20 + 3].to_vec(),
                Pass,
            ),
            ("ARP cut short", arp(POD)[..40].to_vec(), Pass),
            ("bare Ethernet header", ethertype(0x0800, 14), Pass),
        ];
        let mut wrong = Vec::new();
        for (name, frame, want) in &cases {
            let got = uplink.test_verdict(frame)?;
            if got != *want {
                wrong.push(format!("{name}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "uplink: {wrong:#?}");
        // Every run was counted once, under its verdict.
        let redirects = cases.iter().filter(|c| c.2 == Redirect).count() as u64;
        let counters = uplink.counters()?;
        assert_eq!(counters.redirected, redirects, "{counters:?}");
        assert_eq!(
            counters.passed,
            cases.len() as u64 - redirects,
            "{counters:?}"
        );

        // Map updates take effect at once.
        steering.remove_pod_prefix(Ipv4Addr::new(10, 244, 1, 0), 24)?;
        assert_eq!(uplink.test_verdict(&ipv4(17, POD, 0, &ports(1, 2)))?, Pass);
        steering.add_pod_prefix(POD, 32)?;
        assert_eq!(
            uplink.test_verdict(&ipv4(17, POD, 0, &ports(1, 2)))?,
            Redirect
        );
        steering.set_node(Some(NODE), 8472)?;
        assert_eq!(uplink.test_verdict(&vxlan)?, Pass);
        assert_eq!(
            uplink.test_verdict(&ipv4(17, NODE, 0, &ports(1, 8472)))?,
            Redirect
        );
        steering.set_node(None, 4789)?;
        assert_eq!(uplink.test_verdict(&ipv4(4, NODE, 0, &[0x45; 20]))?, Pass);
        assert_eq!(uplink.test_verdict(&vxlan)?, Pass);

        // Fail-open: no socket for the queue, and a redirect becomes a pass.
        uplink.clear_socket(0)?;
        let before = uplink.counters()?;
        assert_eq!(uplink.test_verdict(&ipv4(17, POD, 0, &ports(1, 2)))?, Pass);
        let after = uplink.counters()?;
        assert_eq!(
            (after.passed, after.redirected),
            (before.passed + 1, before.redirected)
        );
        drop(uplink);

        // The pod-port variant: all ARP and traffic to pod prefixes.
        let pod = steering.attach(lo, Role::Pod, XdpMode::Auto)?;
        pod.set_socket(&sock)?;
        let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
            (
                "ARP for the gateway",
                arp(Ipv4Addr::new(169, 254, 1, 1)),
                Redirect,
            ),
            ("ARP for a pod", arp(POD), Redirect),
            ("UDP to a pod", ipv4(17, POD, 0, &ports(1, 2)), Redirect),
            (
                "TCP to the node",
                ipv4(6, NODE, 0, &ports(40000, 10250)),
                Pass,
            ),
            (
                "to the outside",
                ipv4(6, OUTSIDE, 0, &ports(40000, 443)),
                Pass,
            ),
            ("IPv6", ethertype(0x86dd, 80), Pass),
        ];
        let mut wrong = Vec::new();
        for (name, frame, want) in &cases {
            let got = pod.test_verdict(frame)?;
            if got != *want {
                wrong.push(format!("{name}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "pod: {wrong:#?}");
        Ok(())
    })
}

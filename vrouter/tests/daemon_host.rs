//! Host <-> pod and pod -> outside, through the kernel.
//!
//! The choice: the pod-role steering program passes to the kernel what is
//! not for a pod or a block (XDP_PASS decided from the vrouter's pod-prefix
//! map), rather than re-injecting through a TAP device. No copy, no extra
//! device, and when the vrouter is down the kernel still carries it. For
//! the kernel's side, the CNI plugin installs what Calico installs, plus
//! one thing: the host end of the pod's veth has the MAC ee:ee:ee:ee:ee:ee
//! (so frames the pod sends to its gateway are addressed to the host), a
//! /32 route to the pod via that veth, and a permanent neighbour entry for
//! the pod (the steering program sends all of the pod's ARP to the vrouter,
//! so the kernel cannot learn the pod's MAC by itself).
//!
//! Root only: `cargo test -p brindle-vrouter -- --include-ignored`.

mod common;

use anyhow::Result;
use common::{Netns, Vrouter, counter, pod, tcp_exchange, unique};

#[test]
#[ignore = "requires root and network namespaces"]
fn node_reaches_a_pod_and_a_pod_reaches_outside_through_the_kernel() -> Result<()> {
    let node = Netns::new("vn")?;
    let outside = Netns::new("vo")?;
    let (ha, hb, up) = (unique("ha"), unique("hb"), unique("up"));
    let mac_a = "02:b5:00:00:00:02";
    let pod_a = pod(&node, &ha, "10.67.0.2", mac_a)?;
    let _pod_b = pod(&node, &hb, "10.67.0.3", "02:b5:00:00:00:03")?;
    // What the CNI plugin does on the node for pod A.
    node.ip(&["link", "set", &ha, "address", "ee:ee:ee:ee:ee:ee"])?;
    node.ip(&["route", "add", "10.67.0.2/32", "dev", &ha])?;
    node.ip(&[
        "neigh",
        "replace",
        "10.67.0.2",
        "lladdr",
        mac_a,
        "dev",
        &ha,
        "nud",
        "permanent",
    ])?;
    // An outside network the node routes to (and back to the pods).
    node.ip(&[
        "link",
        "add",
        &up,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &outside.name,
    ])?;
    node.ip(&["addr", "add", "203.0.113.1/24", "dev", &up])?;
    node.ip(&["link", "set", &up, "up"])?;
    outside.ip(&["addr", "add", "203.0.113.2/24", "dev", "eth0"])?;
    outside.ip(&["link", "set", "eth0", "up"])?;
    outside.ip(&["route", "add", "10.67.0.0/16", "via", "203.0.113.1"])?;
    node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;

    let vrouter = Vrouter::start(
        &node,
        &[
            "run",
            "--io",
            "xdp",
            "--node",
            "203.0.113.1",
            "--port",
            &format!("{ha}=pod:10.67.0.2"),
            "--port",
            &format!("{hb}=pod:10.67.0.3"),
            "--neighbor",
            "10.67.0.3=02:b5:00:00:00:03",
            "--route",
            "10.67.0.0/16=blackhole",
        ],
    )?;
    // A kubelet probe: from the node's namespace to the pod, and back.
    tcp_exchange(&pod_a, &node, "10.67.0.2")?;
    // The pod to a server outside the cluster, through the node's kernel.
    tcp_exchange(&outside, &pod_a, "203.0.113.2")?;
    // And pod to pod still goes through the vrouter.
    let out = pod_a.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.67.0.3"])?;
    assert!(out.contains("2 received"), "{out}");
    let c = vrouter.stop()?;
    assert!(counter(&c, "forwarded") >= 2, "{c}");
    // The TCP exchanges were passed to the kernel: the vrouter answered ARP
    // for the gateway but routed nothing of them.
    assert!(counter(&c, "forwarded") <= 4, "{c}");
    assert!(counter(&c, "arp_replies") >= 1, "{c}");
    Ok(())
}

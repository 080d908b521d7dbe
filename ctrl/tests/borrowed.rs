//! Borrowed addresses between two real `brindle-ctrl` daemons over a real
//! etcd (issue 14 item 5): the pool has room for one block, node 1 claims
//! it, node 2's pod borrows an address from it (IPAM's last resort), node 2
//! announces that address as a /32 over BGP and node 1, the block's owner,
//! routes it to node 2 (longest prefix over its own block's blackhole);
//! DEL withdraws it. Nodes are 127.0.0.1 and .2 on loopback, as in
//! `three_nodes.rs`; the data path of the same thing is the lab's
//! (`lab --borrow`).

mod daemon_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use brindle_api::endpoint::{Endpoint, EndpointKey, EndpointRequest, PodRef};
use brindle_api::framing::Client;
use brindle_api::vrouter::{Encap, RouteTarget};
use brindle_ctrl::ctrl_api::{CtrlRequest, NodeStatus};
use brindle_ctrl::programming::desired::Desired;
use daemon_support::{Daemon, Etcd, FakeVrouter, free_port, wait_for};
use ipnet::IpNet;
use serde_json::Value;

struct Node {
    address: Ipv4Addr,
    dir: PathBuf,
    vrouter: FakeVrouter,
    daemon: Daemon,
}

impl Node {
    fn start(top: &Path, etcd: &Etcd, i: u8, bgp_port: u16) -> Node {
        let dir = top.join(format!("n{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let address = Ipv4Addr::new(127, 0, 0, i);
        let vrouter = FakeVrouter::start(&dir.join("vrouter.sock"), &format!("boot-{i}"));
        let env: Vec<(String, String)> = [
            ("BRINDLE_NODE_NAME", format!("node-{i}")),
            ("BRINDLE_NODE_ADDRESS", address.to_string()),
            (
                "BRINDLE_API_SOCKET",
                dir.join("ctrl.sock").display().to_string(),
            ),
            (
                "BRINDLE_VROUTER_SOCKET",
                dir.join("vrouter.sock").display().to_string(),
            ),
            ("BRINDLE_VROUTER_UPLINK", "eth0".into()),
            ("BRINDLE_DATASTORE_TYPE", "etcd".into()),
            ("BRINDLE_DATASTORE_ENDPOINTS", etcd.url.clone()),
            ("BRINDLE_BGP_LISTEN_PORT", bgp_port.to_string()),
            ("BRINDLE_BGP_HOLD_TIME_SECS", "9".into()),
            // One block in the whole pool: the second node must borrow.
            ("BRINDLE_IPAM_DEFAULT_POOL_CIDR", "10.244.0.0/28".into()),
            ("BRINDLE_IPAM_BLOCK_SIZE", "28".into()),
            (
                "BRINDLE_METRICS_LISTEN",
                format!("{address}:{}", free_port()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let daemon = Daemon::start(&env, &dir.join("ctrl.sock"), &dir.join("log"));
        Node {
            address,
            dir,
            vrouter,
            daemon,
        }
    }

    fn client(&self) -> Client {
        Client::connect(self.dir.join("ctrl.sock"), Duration::from_secs(10)).unwrap()
    }

    /// Allocates an address for container `c` (the IPAM plugin's call)
    /// and returns it with its block.
    fn allocate(&self, c: &str) -> (IpNet, IpNet) {
        let r: Value = self
            .client()
            .call(&serde_json::json!({"v":1,"op":"ipam_allocate",
                "handle":{"network":"k8s-pod-network","container_id":c,"ifname":"eth0"},
                "node":self.daemon_name(),"attrs":{},"ipv4":true,"ipv6":false}))
            .unwrap();
        let a = &r["addresses"][0];
        (
            a["address"].as_str().unwrap().parse().unwrap(),
            a["block"].as_str().unwrap().parse().unwrap(),
        )
    }

    fn daemon_name(&self) -> String {
        format!("node-{}", self.address.octets()[3])
    }

    /// The CNI plugin's ADD of a veth pod with `address` (no netns work:
    /// the fake vrouter attaches nothing).
    fn add_endpoint(&self, c: &str, address: IpNet) {
        let ep = Endpoint {
            key: key(c),
            pod: PodRef::default(),
            netns: "/var/run/netns/test".into(),
            host_ifname: format!("bri{c}"),
            host_ifindex: 42,
            host_mac: "ee:ee:ee:ee:ee:ee".into(),
            pod_mac: "02:00:00:00:00:01".into(),
            ips: vec![address],
            gateways: vec!["169.254.1.1".parse().unwrap()],
            mtu: 1480,
            interface: Default::default(),
        };
        let _: Endpoint = self
            .client()
            .call(&EndpointRequest::AddEndpoint {
                endpoint: Box::new(ep),
            })
            .unwrap();
    }

    fn routes(&self) -> BTreeMap<IpNet, RouteTarget> {
        let mut d = Desired::default();
        for r in self.vrouter.requests() {
            d.apply(&r);
        }
        d.routes
    }

    fn status(&self) -> NodeStatus {
        self.client().call(&CtrlRequest::CtrlNodeStatus).unwrap()
    }

    /// The BGP best routes: prefix and next hop.
    fn bgp_routes(&self) -> Vec<(String, String)> {
        let v: Value = self.client().call(&CtrlRequest::CtrlBgpRoutes).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["prefix"].as_str().unwrap_or_default().to_owned(),
                    r["next_hop"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

fn key(c: &str) -> EndpointKey {
    EndpointKey {
        network: "k8s-pod-network".into(),
        container_id: c.into(),
        ifname: "eth0".into(),
    }
}

fn ipip(remote: Ipv4Addr) -> RouteTarget {
    RouteTarget::Encap {
        encap: Encap::Ipip,
        remote,
    }
}

#[test]
#[ignore = "starts a real etcd and two daemons (needs etcd-server)"]
fn a_borrowed_address_is_announced_as_a_host_route_routed_by_the_blocks_owner_and_withdrawn_on_del()
{
    let top = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(top.path());
    let bgp_port = free_port();
    let n1 = Node::start(top.path(), &etcd, 1, bgp_port);
    let n2 = Node::start(top.path(), &etcd, 2, bgp_port);

    // Node 1 claims the pool's only block and runs a pod in it.
    let (a1, block) = n1.allocate("c1");
    assert_eq!(block, "10.244.0.0/28".parse::<IpNet>().unwrap());
    n1.add_endpoint("c1", a1);
    // Node 2 has no block to claim: IPAM borrows from node 1's.
    let (a2, b2) = n2.allocate("c2");
    assert_eq!(b2, block, "node 2 borrowed from node 1's block");
    assert_ne!(a2, a1);
    n2.add_endpoint("c2", a2);
    let host = IpNet::from(a2.addr());

    // Node 2 announces the borrowed /32 (and no block); node 1 announces
    // the block only.
    wait_for(
        "node 2 to announce its borrowed /32",
        Duration::from_secs(30),
        || n2.status().announced_borrowed == vec![host],
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", n2.status(), n2.daemon.log()));
    assert_eq!(n2.status().announced_blocks, vec![]);
    assert_eq!(n1.status().announced_blocks, vec![block]);
    assert_eq!(n1.status().announced_borrowed, vec![]);

    // Node 1, the block's owner, learned the /32 with node 2 as next hop
    // and routes it there, beside its block's blackhole; node 2 routes
    // the block to node 1 and the /32 to its pod's port.
    wait_for(
        "node 1 to route the /32 to node 2",
        Duration::from_secs(30),
        || n1.routes().get(&host) == Some(&ipip(n2.address)),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", n1.routes(), n1.daemon.log()));
    assert!(
        n1.bgp_routes()
            .contains(&(host.to_string(), n2.address.to_string())),
        "{:?}",
        n1.bgp_routes()
    );
    assert_eq!(n1.routes().get(&block), Some(&RouteTarget::Blackhole));
    wait_for(
        "node 2 to route the block to node 1",
        Duration::from_secs(30),
        || n2.routes().get(&block) == Some(&ipip(n1.address)),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", n2.routes()));
    assert_eq!(
        n2.routes().get(&host),
        Some(&RouteTarget::Local {
            port: "bric2".into()
        })
    );
    // Node 1's own pod is not announced as a /32 by anyone.
    assert!(!n2.routes().contains_key(&IpNet::from(a1.addr())));

    // DEL on node 2: the /32 is withdrawn, node 1 forgets it (the block's
    // blackhole stays).
    let _: Value = n2
        .client()
        .call(&EndpointRequest::DeleteEndpoint { key: key("c2") })
        .unwrap();
    wait_for("node 1 to drop the /32", Duration::from_secs(30), || {
        !n1.routes().contains_key(&host)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", n1.routes()));
    assert_eq!(n2.status().announced_borrowed, vec![]);
    assert_eq!(n1.routes().get(&block), Some(&RouteTarget::Blackhole));
    drop((n1, n2));
    drop(etcd);
}

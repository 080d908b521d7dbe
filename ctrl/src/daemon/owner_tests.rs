//! The owner's decisions: events in, effects out. The vrouter programming
//! goes through a real [`Executor`] over the recording fake where what the
//! vrouter ends up holding is the point (resync after a restart).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use brindle_api::endpoint::{Endpoint, PodInterface};
use brindle_api::framing::{PROTOCOL_VERSION, Reply};
use brindle_api::vrouter::{
    DesiredState, Encap, NodeConfig, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
    VxlanConfig,
};
use ipnet::IpNet;

use super::Owner;
use crate::bgp::rib::{BestRoute, RouteChange};
use crate::bgp::speaker::PeerConfig;
use crate::config::{Config, Validated};
use crate::ctrl_api::{CtrlRequest, NodeStatus};
use crate::daemon::effect::{BgpCommand, DatastoreRequest, Effect, GcPass};
use crate::daemon::event::{DatastoreView, Event, Responder};
use crate::endpoints::EndpointChange;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::programming::Work;
use crate::programming::dataplane::RecordingDataplane;
use crate::programming::desired::tests::endpoint;
use crate::programming::desired::{endpoint_added, endpoint_removed};
use crate::programming::executor::Executor;
use crate::registry::{NodeRecord, Role};
use crate::routing::PoolRouting;

const ME: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 11);
const GW: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 254);

fn validated(configured_gateway: Option<Ipv4Addr>) -> Validated {
    Validated {
        node_name: "n1".into(),
        node_address: ME,
        uplink: "eth0".into(),
        metrics_listen: "127.0.0.1:9091".parse().unwrap(),
        default_pool: "10.244.0.0/16".parse().unwrap(),
        underlay_subnet: Some("10.99.0.0/24".parse().unwrap()),
        underlay_gateway: configured_gateway,
        cluster_id: None,
        service_prefixes: BTreeSet::new(),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn pool(cidr: &str, encapsulation: &str) -> PoolRouting {
    PoolRouting {
        cidr: net(cidr),
        encapsulation: encapsulation.parse().unwrap(),
        nat_outgoing: true,
    }
}

/// An owner of node n1 (10.99.0.11) with an IPIP pool, started with no
/// endpoints; the start's effects are dropped. The automatic IPAM GC is off
/// (its own tests turn it on).
fn owner_with(v: Validated) -> Owner {
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 0;
    owner_with_config(config, v)
}

fn owner_with_config(config: Config, v: Validated) -> Owner {
    let mut o = Owner::new(
        config,
        v,
        "embedded",
        Arc::new(Metrics::new()),
        vec![pool("10.244.0.0/16", "ipip")],
    );
    o.start(Vec::new(), &mut Vec::new());
    o
}

fn owner() -> Owner {
    owner_with(validated(None))
}

fn run(o: &mut Owner, event: Event) -> Vec<Effect> {
    let mut out = Vec::new();
    o.handle(event, &mut out);
    out
}

fn apply(reqs: Vec<VrouterRequest>) -> Effect {
    Effect::Vrouter(Work::Apply(reqs))
}

fn node(peers: Vec<Ipv4Addr>, gateway: Option<Ipv4Addr>) -> NodeConfig {
    NodeConfig {
        address_v4: Some(ME),
        address_v6: None,
        underlay_subnet: Some("10.99.0.0/24".parse().unwrap()),
        underlay_gateway: gateway,
        vxlan: VxlanConfig::default(),
        tunnel_peers: peers,
    }
}

fn set_node(peers: Vec<Ipv4Addr>, gateway: Option<Ipv4Addr>) -> Effect {
    apply(vec![VrouterRequest::SetNode {
        node: node(peers, gateway),
    }])
}

fn record(name: &str, address: Ipv4Addr, heartbeat_ms: u64) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        address,
        as_number: 64512,
        bgp_port: 179,
        role: Role::Node,
        blocks: vec![],
        heartbeat_ms,
        lease_secs: 30,
    }
}

/// A view where every read worked.
fn view(pools: Vec<PoolRouting>, blocks: &[&str], nodes: Vec<NodeRecord>) -> DatastoreView {
    DatastoreView {
        pools: Some(pools),
        affine_blocks: Some(blocks.iter().map(|b| net(b)).collect()),
        foreign_blocks: Some(BTreeSet::new()),
        nodes: Some(nodes),
        heartbeat_ok: true,
        now_ms: 1_000_000,
    }
}

fn best(prefix: &str, next_hop: Ipv4Addr) -> BestRoute {
    BestRoute {
        prefix: net(prefix),
        next_hop: IpAddr::V4(next_hop),
        peer: IpAddr::V4(next_hop),
        as_path: vec![],
    }
}

fn mesh_peer(addr: Ipv4Addr) -> Effect {
    let mut pc = PeerConfig::new(IpAddr::V4(addr), 64512);
    pc.local_address = Some(IpAddr::V4(ME));
    Effect::Bgp(BgpCommand::AddPeer(Box::new(pc)))
}

#[test]
fn the_start_programs_the_node_the_uplink_and_the_stored_endpoints() {
    let mut o = Owner::new(
        Config::default(),
        validated(None),
        "embedded",
        Arc::new(Metrics::new()),
        vec![],
    );
    let ep = endpoint("c1", "bri1", "10.244.0.5/32");
    let mut out = Vec::new();
    o.start(vec![ep.clone()], &mut out);
    let mut reqs = vec![
        VrouterRequest::SetNode {
            node: node(vec![], None),
        },
        VrouterRequest::AddPorts {
            ports: vec![PortSpec {
                name: "eth0".into(),
                kind: PortKind::Uplink,
                addresses: vec![],
                peer_mac: None,
                endpoint: None,
                device: Default::default(),
                workload: None,
            }],
        },
    ];
    reqs.extend(endpoint_added(&ep).unwrap());
    assert_eq!(out, vec![apply(reqs)]);
    assert_eq!(o.metrics.endpoints.get(), 1);
}

#[test]
fn a_tick_refreshes_the_datastore_reconciles_the_vrouter_and_the_bgp_metrics() {
    let mut o = owner();
    assert_eq!(
        run(&mut o, Event::Tick),
        vec![
            Effect::Datastore(DatastoreRequest::Refresh),
            Effect::Vrouter(Work::Reconcile),
            Effect::Bgp(BgpCommand::RefreshMetrics),
        ]
    );
}

#[test]
fn learned_routes_are_routed_by_their_pool_and_again_when_the_pools_change() {
    let mut o = owner();
    let other = Ipv4Addr::new(172, 16, 0, 9);
    assert_eq!(
        run(
            &mut o,
            Event::Route(RouteChange::Added(best("10.244.7.0/26", other)))
        ),
        vec![apply(vec![VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: net("10.244.7.0/26"),
                target: RouteTarget::Encap {
                    encap: Encap::Ipip,
                    remote: other
                },
            }]
        }])]
    );
    // The same pools: nothing re-routed. Another encapsulation: every
    // learned route again.
    let out = run(
        &mut o,
        Event::Datastore(view(vec![pool("10.244.0.0/16", "ipip")], &[], vec![])),
    );
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Vrouter(_))),
        "{out:?}"
    );
    let out = run(
        &mut o,
        Event::Datastore(view(vec![pool("10.244.0.0/16", "vxlan")], &[], vec![])),
    );
    assert_eq!(
        out[0],
        apply(vec![VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: net("10.244.7.0/26"),
                target: RouteTarget::Encap {
                    encap: Encap::Vxlan,
                    remote: other
                },
            }]
        }])
    );
    // A withdrawn route is removed and not re-routed later.
    assert_eq!(
        run(
            &mut o,
            Event::Route(RouteChange::Removed {
                prefix: net("10.244.7.0/26")
            })
        ),
        vec![apply(vec![VrouterRequest::RemoveRoutes {
            prefixes: vec![net("10.244.7.0/26")]
        }])]
    );
    let out = run(
        &mut o,
        Event::Datastore(view(vec![pool("10.244.0.0/16", "ipip")], &[], vec![])),
    );
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Vrouter(_))),
        "{out:?}"
    );
}

#[test]
fn our_blocks_are_announced_blackholed_and_withdrawn_when_released() {
    let mut o = owner();
    let pools = || vec![pool("10.244.0.0/16", "ipip")];
    let out = run(
        &mut o,
        Event::Datastore(view(pools(), &["10.244.0.0/26"], vec![])),
    );
    assert_eq!(
        out[..2],
        [
            Effect::Bgp(BgpCommand::Announce(net("10.244.0.0/26"), IpAddr::V4(ME))),
            apply(vec![VrouterRequest::AddRoutes {
                routes: vec![Route {
                    prefix: net("10.244.0.0/26"),
                    target: RouteTarget::Blackhole
                }]
            }]),
        ]
    );
    // Unchanged: nothing.
    let out = run(
        &mut o,
        Event::Datastore(view(pools(), &["10.244.0.0/26"], vec![])),
    );
    assert!(out.is_empty(), "{out:?}");
    // Released, another one affine.
    let out = run(
        &mut o,
        Event::Datastore(view(pools(), &["10.244.0.64/26"], vec![])),
    );
    assert_eq!(
        out,
        vec![
            Effect::Bgp(BgpCommand::Announce(net("10.244.0.64/26"), IpAddr::V4(ME))),
            Effect::Bgp(BgpCommand::Withdraw(net("10.244.0.0/26"))),
            apply(vec![VrouterRequest::AddRoutes {
                routes: vec![Route {
                    prefix: net("10.244.0.64/26"),
                    target: RouteTarget::Blackhole
                }]
            }]),
            apply(vec![VrouterRequest::RemoveRoutes {
                prefixes: vec![net("10.244.0.0/26")]
            }]),
        ]
    );
}

#[test]
fn the_mesh_follows_live_nodes_and_a_refused_peer_is_asked_again() {
    let mut o = owner();
    let now = 1_000_000;
    let n2 = Ipv4Addr::new(10, 99, 0, 12);
    let n3 = Ipv4Addr::new(10, 99, 0, 13);
    let nodes = vec![
        record("n1", ME, now),
        record("n2", n2, now),
        record("n3", n3, now),
    ];
    let out = run(&mut o, Event::Datastore(view(vec![], &[], nodes.clone())));
    assert_eq!(
        out,
        vec![
            mesh_peer(n2),
            mesh_peer(n3),
            set_node(vec![n2, n3], None),
            Effect::Health(Health {
                datastore_ok: true,
                vrouter_reachable: None
            }),
        ]
    );
    // The speaker refused n3: asked again on the next view, n2 is not.
    assert!(run(&mut o, Event::PeerFailed(IpAddr::V4(n3))).is_empty());
    let out = run(&mut o, Event::Datastore(view(vec![], &[], nodes)));
    assert_eq!(out, vec![mesh_peer(n3)]);
    // n3's lease ran out: its peer goes and it is no tunnel peer any more.
    let nodes = vec![
        record("n1", ME, now),
        record("n2", n2, now),
        record("n3", n3, now - 31_000),
    ];
    let out = run(&mut o, Event::Datastore(view(vec![], &[], nodes)));
    assert_eq!(
        out,
        vec![
            Effect::Bgp(BgpCommand::RemovePeer(IpAddr::V4(n3))),
            set_node(vec![n2], None),
        ]
    );
    // node status shows it not live.
    let (responder, answer) = Responder::new();
    let out = run(&mut o, Event::Query(CtrlRequest::CtrlNodeStatus, responder));
    let [Effect::Answer(_, Reply::Ok { result })] = &out[..] else {
        panic!("{out:?}")
    };
    let status: NodeStatus = serde_json::from_value(result.clone()).unwrap();
    assert_eq!(
        status
            .nodes
            .iter()
            .map(|n| (n.record.name.as_str(), n.live))
            .collect::<Vec<_>>(),
        vec![("n1", true), ("n2", true), ("n3", false)]
    );
    drop(answer);
}

#[test]
fn a_datastore_outage_makes_the_daemon_unready_and_changes_nothing_else() {
    let mut o = owner();
    run(&mut o, Event::Vrouter { reachable: true });
    let out = run(
        &mut o,
        Event::Datastore(view(vec![pool("10.244.0.0/16", "ipip")], &[], vec![])),
    );
    assert_eq!(
        out,
        vec![Effect::Health(Health {
            datastore_ok: true,
            vrouter_reachable: Some(true)
        })]
    );
    let out = run(
        &mut o,
        Event::Datastore(DatastoreView {
            heartbeat_ok: false,
            ..DatastoreView::default()
        }),
    );
    assert_eq!(
        out,
        vec![Effect::Health(Health {
            datastore_ok: false,
            vrouter_reachable: Some(true)
        })]
    );
}

#[test]
fn endpoints_are_programmed_replaced_and_removed_and_counted() {
    let mut o = owner();
    let ep = endpoint("c1", "bri1", "10.244.0.5/32");
    let added = |ep: &Endpoint, replaced: Option<&Endpoint>| {
        Event::Endpoint(EndpointChange::Added {
            endpoint: Box::new(ep.clone()),
            replaced: replaced.map(|r| Box::new(r.clone())),
        })
    };
    assert_eq!(
        run(&mut o, added(&ep, None)),
        vec![apply(endpoint_added(&ep).unwrap())]
    );
    assert_eq!(o.metrics.endpoints.get(), 1);
    // A retried ADD with the same port and addresses: programmed again
    // (idempotent), nothing removed.
    assert_eq!(
        run(&mut o, added(&ep, Some(&ep))),
        vec![apply(endpoint_added(&ep).unwrap())]
    );
    // With a new host interface: the old programming goes first.
    let mut again = ep.clone();
    again.host_ifname = "bri2".into();
    let mut reqs = endpoint_removed(&ep);
    reqs.extend(endpoint_added(&again).unwrap());
    assert_eq!(run(&mut o, added(&again, Some(&ep))), vec![apply(reqs)]);
    assert_eq!(o.metrics.endpoints.get(), 1);
    assert_eq!(
        run(
            &mut o,
            Event::Endpoint(EndpointChange::Removed(Box::new(again.clone())))
        ),
        vec![apply(endpoint_removed(&again))]
    );
    assert_eq!(o.metrics.endpoints.get(), 0);
}

#[test]
fn a_retried_add_that_turns_a_veth_pod_into_a_tap_pod_removes_the_veth_port_first() {
    let mut o = owner();
    let veth = endpoint("c1", "bri1", "10.244.0.5/32");
    let mut tap = veth.clone();
    tap.host_ifname = String::new();
    tap.interface = PodInterface::Tap {
        netns: veth.netns.clone(),
        ifname: "eth0".into(),
        queues: 1,
    };
    let added = |ep: &Endpoint, replaced: Option<&Endpoint>| {
        Event::Endpoint(EndpointChange::Added {
            endpoint: Box::new(ep.clone()),
            replaced: replaced.map(|r| Box::new(r.clone())),
        })
    };
    run(&mut o, added(&veth, None));
    let mut reqs = endpoint_removed(&veth);
    reqs.extend(endpoint_added(&tap).unwrap());
    assert_eq!(run(&mut o, added(&tap, Some(&veth))), vec![apply(reqs)]);
    // The TAP's queue count changed on a retry: the port is re-made.
    let mut more = tap.clone();
    if let PodInterface::Tap { queues, .. } = &mut more.interface {
        *queues = 2;
    }
    let mut reqs = endpoint_removed(&tap);
    reqs.extend(endpoint_added(&more).unwrap());
    assert_eq!(run(&mut o, added(&more, Some(&tap))), vec![apply(reqs)]);
    assert_eq!(o.metrics.endpoints.get(), 1);
}

#[test]
fn a_reload_announces_and_withdraws_only_the_changed_service_prefixes() {
    let mut v = validated(None);
    v.service_prefixes = [net("10.96.0.0/12"), net("192.0.2.0/24")].into();
    let mut o = Owner::new(
        Config::default(),
        v.clone(),
        "embedded",
        Arc::new(Metrics::new()),
        vec![],
    );
    let mut out = Vec::new();
    o.start(vec![], &mut out);
    assert_eq!(
        out[1..],
        [
            Effect::Bgp(BgpCommand::Announce(net("10.96.0.0/12"), IpAddr::V4(ME))),
            Effect::Bgp(BgpCommand::Announce(net("192.0.2.0/24"), IpAddr::V4(ME))),
        ]
    );
    let mut nv = v.clone();
    nv.service_prefixes = [net("10.96.0.0/12"), net("198.51.100.0/24")].into();
    let out = run(&mut o, Event::Reload(Ok(Box::new((Config::default(), nv)))));
    assert_eq!(
        out,
        vec![
            Effect::Bgp(BgpCommand::Announce(net("198.51.100.0/24"), IpAddr::V4(ME))),
            Effect::Bgp(BgpCommand::Withdraw(net("192.0.2.0/24"))),
        ]
    );
    // A reload that failed keeps everything.
    assert!(run(&mut o, Event::Reload(Err("bad".into()))).is_empty());
}

#[test]
fn queries_are_answered_by_the_owner_or_passed_to_the_speaker() {
    let mut o = owner();
    let (r, _answer) = Responder::new();
    let out = run(&mut o, Event::Query(CtrlRequest::CtrlBgpPeers, r));
    assert!(
        matches!(&out[..], [Effect::Bgp(BgpCommand::Peers(_))]),
        "{out:?}"
    );
    let (r, _answer) = Responder::new();
    let out = run(&mut o, Event::Query(CtrlRequest::CtrlBgpRoutes, r));
    assert!(
        matches!(&out[..], [Effect::Bgp(BgpCommand::Routes(_))]),
        "{out:?}"
    );
    // Shutting down: the speaker is leaving; queries get an error.
    assert_eq!(
        run(&mut o, Event::Shutdown),
        vec![Effect::Bgp(BgpCommand::Shutdown)]
    );
    assert!(o.stopping());
    let (r, _answer) = Responder::new();
    let out = run(&mut o, Event::Query(CtrlRequest::CtrlBgpPeers, r));
    assert!(
        matches!(&out[..], [Effect::Answer(_, Reply::Error(_))]),
        "{out:?}"
    );
}

#[test]
fn a_learned_gateway_reaches_the_vrouter_once_per_change_and_after_a_restart() {
    let mut o = owner();
    let fake = RecordingDataplane::new("b1");
    let mut ex = Executor::new(fake.clone(), None);
    ex.reconcile();
    fake.take();
    let mut send = |effects: Vec<Effect>| {
        for e in effects {
            if let Effect::Vrouter(w) = e {
                ex.work(w);
            }
        }
    };
    assert!(run(&mut o, Event::Gateway(None)).is_empty());

    send(run(&mut o, Event::Gateway(Some(GW))));
    assert_eq!(
        fake.take(),
        vec![VrouterRequest::SetNode {
            node: node(vec![], Some(GW))
        }]
    );
    // The same gateway again: nothing to send.
    assert!(run(&mut o, Event::Gateway(Some(GW))).is_empty());
    // New tunnel peers keep the gateway.
    let n3 = Ipv4Addr::new(10, 99, 1, 13);
    let now = 1_000_000;
    send(run(
        &mut o,
        Event::Datastore(view(
            vec![pool("10.244.0.0/16", "ipip")],
            &[],
            vec![record("n3", n3, now)],
        )),
    ));
    assert_eq!(
        fake.take(),
        vec![VrouterRequest::SetNode {
            node: node(vec![n3], Some(GW))
        }]
    );
    // A restarted vrouter gets it back in the Sync.
    fake.restart("b2");
    send(run(&mut o, Event::Tick));
    assert_eq!(
        fake.take(),
        vec![
            VrouterRequest::Hello {
                version: PROTOCOL_VERSION
            },
            VrouterRequest::Sync {
                state: DesiredState {
                    node: Some(node(vec![n3], Some(GW))),
                    ports: vec![],
                    routes: vec![],
                    neighbors: vec![],
                    policy: None,
                }
            }
        ]
    );
    // The default route gone: the vrouter forgets the gateway.
    assert_eq!(
        run(&mut o, Event::Gateway(None)),
        vec![set_node(vec![n3], None)]
    );
}

#[test]
fn a_configured_gateway_wins_over_the_learned_one() {
    let configured = Ipv4Addr::new(10, 99, 0, 1);
    let mut o = owner_with(validated(Some(configured)));
    assert!(run(&mut o, Event::Gateway(Some(GW))).is_empty());
    assert!(run(&mut o, Event::Gateway(None)).is_empty());
}

fn gc_passes(effects: &[Effect]) -> Vec<&GcPass> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Datastore(DatastoreRequest::IpamGc(p)) => Some(p),
            _ => None,
        })
        .collect()
}

#[test]
fn the_ipam_gc_runs_every_interval_with_the_endpoints_and_the_live_nodes() {
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 60;
    let mut o = owner_with_config(config, validated(None));
    let ep = endpoint("c1", "bri1", "10.244.0.5/32");
    run(
        &mut o,
        Event::Endpoint(EndpointChange::Added {
            endpoint: Box::new(ep.clone()),
            replaced: None,
        }),
    );
    let other = Ipv4Addr::new(10, 99, 0, 12);
    let dead = Ipv4Addr::new(10, 99, 0, 13);
    let mut v = view(
        vec![pool("10.244.0.0/16", "ipip")],
        &[],
        vec![
            record("n1", ME, 1_000_000),
            record("n2", other, 999_000),
            record("n3", dead, 1),
        ],
    );
    let out = run(&mut o, Event::Datastore(v.clone()));
    let passes = gc_passes(&out);
    assert_eq!(passes.len(), 1, "{out:?}");
    assert_eq!(
        passes[0],
        &GcPass {
            endpoints: BTreeSet::from([(ep.key.container_id.clone(), ep.key.ifname.clone())]),
            pods: None,
            live_nodes: BTreeSet::from(["n1".to_owned(), "n2".to_owned()]),
            now_ms: 1_000_000,
        }
    );
    // Not again within the interval; again after it.
    v.now_ms += 59_999;
    assert!(gc_passes(&run(&mut o, Event::Datastore(v.clone()))).is_empty());
    v.now_ms += 1;
    assert_eq!(
        gc_passes(&run(&mut o, Event::Datastore(v.clone()))).len(),
        1
    );
}

#[test]
fn no_ipam_gc_on_a_view_with_a_failed_read() {
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 60;
    let mut o = owner_with_config(config, validated(None));
    // The node list could not be read: every other node would look dead.
    let mut v = view(vec![pool("10.244.0.0/16", "ipip")], &[], Vec::new());
    v.nodes = None;
    assert!(gc_passes(&run(&mut o, Event::Datastore(v.clone()))).is_empty());
    let mut v = view(vec![pool("10.244.0.0/16", "ipip")], &[], Vec::new());
    v.heartbeat_ok = false;
    assert!(gc_passes(&run(&mut o, Event::Datastore(v))).is_empty());
}

#[test]
fn with_the_kubernetes_source_gc_gets_the_pods_once_listed_and_deleted_nodes_are_not_live() {
    use brindle_kube::{Feed, KubeEvent, NodeInfo, Resource};
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 60;
    config.datastore.kubernetes.enabled = true;
    let mut o = owner_with_config(config, validated(None));
    let pod = Resource::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop"}}))
    .unwrap();
    let n1 = NodeInfo {
        name: "n1".into(),
        labels: Default::default(),
        internal_ips: vec![IpAddr::V4(ME)],
        external_ips: vec![],
        pod_cidrs: vec![],
    };
    // Listed but not done: no pod source yet, and every node still counts.
    for e in [KubeEvent::Apply(pod), KubeEvent::NodeApply(n1)] {
        assert!(run(&mut o, Event::Kube(Box::new(e))).is_empty());
    }
    let other = Ipv4Addr::new(10, 99, 0, 12);
    let mut v = view(
        vec![pool("10.244.0.0/16", "ipip")],
        &[],
        vec![record("n1", ME, 1_000_000), record("n2", other, 999_000)],
    );
    let out = run(&mut o, Event::Datastore(v.clone()));
    let pass = gc_passes(&out)[0].clone();
    assert_eq!(pass.pods, None);
    assert_eq!(
        pass.live_nodes,
        BTreeSet::from(["n1".to_owned(), "n2".to_owned()])
    );
    // Both listed: the pods that exist, and n2 (gone from the API, its
    // lease still live) is not live.
    run(&mut o, Event::Kube(Box::new(KubeEvent::Synced(Feed::Pods))));
    run(
        &mut o,
        Event::Kube(Box::new(KubeEvent::Synced(Feed::Nodes))),
    );
    v.now_ms += 60_000;
    let out = run(&mut o, Event::Datastore(v));
    let pass = gc_passes(&out)[0].clone();
    assert_eq!(
        pass.pods,
        Some(BTreeSet::from([("shop".to_owned(), "web".to_owned())]))
    );
    assert_eq!(pass.live_nodes, BTreeSet::from(["n1".to_owned()]));
}

fn policy_update(effects: &[Effect]) -> Option<&brindle_api::vrouter::PolicyUpdate> {
    effects.iter().find_map(|e| match e {
        Effect::Vrouter(Work::Apply(reqs)) => reqs.iter().find_map(|r| match r {
            VrouterRequest::ApplyPolicy { update } => Some(update),
            _ => None,
        }),
        _ => None,
    })
}

#[test]
fn policy_is_compiled_for_local_pods_and_sent_after_their_port() {
    use brindle_policy::compile::Change;
    use brindle_policy::resource::parse_documents;

    let mut o = owner();
    let docs = parse_documents(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: a}\n\
         spec: {podSelector: {}}\n",
    )
    .unwrap();
    let fx = run(
        &mut o,
        Event::Policy(docs.into_iter().map(Change::Apply).collect()),
    );
    assert!(
        policy_update(&fx).is_none(),
        "no local pod: nothing to send"
    );
    assert_eq!(
        run(&mut o, Event::PolicyStored),
        vec![Effect::Datastore(DatastoreRequest::ReadPolicy)]
    );

    let mut ep = endpoint("c1", "bri1", "10.244.0.5/32");
    ep.pod.namespace = "a".into();
    ep.pod.name = "p1".into();
    let fx = run(
        &mut o,
        Event::Endpoint(EndpointChange::Added {
            endpoint: Box::new(ep.clone()),
            replaced: None,
        }),
    );
    let Effect::Vrouter(Work::Apply(reqs)) = &fx[0] else {
        panic!("{fx:?}")
    };
    assert!(
        matches!(reqs[0], VrouterRequest::AddPorts { .. }),
        "{reqs:?}"
    );
    let update = policy_update(&fx).expect("a program for a/p1");
    assert_eq!(update.generation, 1);
    assert_eq!(update.programs[0].endpoint.name, "p1");
    let program = update.programs[0].program.as_ref().unwrap();
    assert_eq!(program.ingress.tiers.len(), 1, "isolated for ingress");

    // The pod goes: its program goes after its port.
    let fx = run(
        &mut o,
        Event::Endpoint(EndpointChange::Removed(Box::new(ep))),
    );
    let update = policy_update(&fx).unwrap();
    assert_eq!(update.generation, 2);
    assert_eq!(update.programs[0].program, None);
    // A Kubernetes event is a compiler change too.
    let delete = brindle_kube::KubeEvent::Delete(brindle_policy::resource::ResourceKey {
        kind: brindle_policy::resource::Kind::KubernetesNetworkPolicy,
        namespace: Some("a".into()),
        name: "deny".into(),
    });
    run(&mut o, Event::Kube(Box::new(delete)));
    assert_eq!(o.policy.policy_count(), 0);
}

#[test]
fn with_a_host_port_the_vrouter_gets_it_and_the_kernel_routes_every_pod_prefix_into_it() {
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 0;
    config.vrouter.host_port = "brindle0".into();
    config.vrouter.host_port_queues = 2;
    config.vrouter.host_port_mtu = 1440;
    let mut o = Owner::new(
        config,
        validated(None),
        "embedded",
        Arc::new(Metrics::new()),
        vec![pool("10.244.0.0/16", "ipip")],
    );
    let mut out = Vec::new();
    o.start(Vec::new(), &mut out);
    let host_state = |routes: &[&str]| {
        Effect::Host(crate::hostpath::HostState {
            port: "brindle0".into(),
            mtu: 1440,
            routes: routes.iter().map(|p| net(p)).collect(),
            nat: crate::hostpath::NatPools {
                masquerade: [net("10.244.0.0/16")].into(),
                pools: [net("10.244.0.0/16")].into(),
            },
        })
    };
    let host_route = |p: &str| Route {
        prefix: net(p),
        target: RouteTarget::Host,
    };
    assert_eq!(
        out,
        vec![
            apply(vec![
                VrouterRequest::SetNode {
                    node: node(vec![], None),
                },
                VrouterRequest::AddPorts {
                    ports: vec![
                        PortSpec {
                            name: "eth0".into(),
                            kind: PortKind::Uplink,
                            addresses: vec![],
                            peer_mac: None,
                            endpoint: None,
                            device: Default::default(),
                            workload: None,
                        },
                        PortSpec {
                            name: "brindle0".into(),
                            kind: PortKind::Host,
                            addresses: vec![],
                            peer_mac: None,
                            endpoint: None,
                            device: brindle_api::vrouter::PortDevice::Tap {
                                netns: None,
                                ifname: "brindle0".into(),
                                queues: 2,
                            },
                            workload: None,
                        },
                    ],
                },
                VrouterRequest::AddRoutes {
                    routes: vec![host_route("0.0.0.0/0"), host_route("::/0")],
                },
            ]),
            host_state(&[]),
        ]
    );

    // A remote block and a borrowed /32 go into the kernel once per batch;
    // a service prefix another node announces goes to the host in the
    // vrouter and not into the kernel's host path.
    let peer = Ipv4Addr::new(10, 99, 0, 12);
    let mut out = Vec::new();
    for p in ["10.244.1.0/26", "10.244.0.77/32", "10.96.0.0/12"] {
        o.handle(Event::Route(RouteChange::Added(best(p, peer))), &mut out);
    }
    o.flush(&mut out);
    assert_eq!(out.len(), 5, "{out:?}");
    // The peer's own address, once, routed like its block (issue 14: the
    // replies to its host's traffic go back through its vrouter).
    let peer_route = apply(vec![VrouterRequest::AddRoutes {
        routes: vec![Route {
            prefix: net("10.99.0.12/32"),
            target: RouteTarget::Encap {
                encap: brindle_api::vrouter::Encap::Ipip,
                remote: peer,
            },
        }],
    }]);
    assert_eq!(out[1], peer_route);
    assert_eq!(
        out[3],
        apply(vec![VrouterRequest::AddRoutes {
            routes: vec![host_route("10.96.0.0/12")]
        }])
    );
    assert_eq!(out[4], host_state(&["10.244.0.77/32", "10.244.1.0/26"]));

    // Our own block joins; a withdrawn remote block leaves; nothing new, no
    // effect.
    let mut out = run(
        &mut o,
        Event::Datastore(view(
            vec![pool("10.244.0.0/16", "ipip")],
            &["10.244.0.0/26"],
            vec![],
        )),
    );
    o.handle(
        Event::Route(RouteChange::Removed {
            prefix: net("10.244.1.0/26"),
        }),
        &mut out,
    );
    o.flush(&mut out);
    assert_eq!(
        out.last(),
        Some(&host_state(&["10.244.0.0/26", "10.244.0.77/32"]))
    );
    let mut out = Vec::new();
    o.flush(&mut out);
    assert_eq!(out, vec![]);

    // The peer's last pod prefix withdrawn: its address route goes too.
    let out = run(
        &mut o,
        Event::Route(RouteChange::Removed {
            prefix: net("10.244.0.77/32"),
        }),
    );
    assert!(
        out.contains(&apply(vec![VrouterRequest::RemoveRoutes {
            prefixes: vec![net("10.99.0.12/32")]
        }])),
        "{out:?}"
    );
}

#[test]
fn the_tunnel_peers_are_sent_in_every_encapsulation_mode_and_follow_the_nodes() {
    // The vrouter takes the list as the whole truth (empty = no tunnel from
    // anyone), so ctrl sends it whatever the pools' mode, and an empty list
    // when the last other node goes.
    let now = 1_000_000;
    let n2 = Ipv4Addr::new(10, 99, 0, 12);
    for mode in [
        "none",
        "ipip_cross_subnet",
        "vxlan_cross_subnet",
        "vxlan",
        "ipip",
    ] {
        let mut config = Config::default();
        config.ipam.gc_interval_secs = 0;
        let mut o = Owner::new(
            config,
            validated(None),
            "embedded",
            Arc::new(Metrics::new()),
            vec![pool("10.244.0.0/16", mode)],
        );
        o.start(Vec::new(), &mut Vec::new());
        let set_nodes = |out: Vec<Effect>| -> Vec<Effect> {
            out.into_iter()
                .filter(|e| {
                    matches!(e, Effect::Vrouter(Work::Apply(r))
                        if matches!(r[..], [VrouterRequest::SetNode { .. }]))
                })
                .collect()
        };
        let pools = vec![pool("10.244.0.0/16", mode)];
        let nodes = vec![record("n1", ME, now), record("n2", n2, now)];
        let out = run(&mut o, Event::Datastore(view(pools.clone(), &[], nodes)));
        assert_eq!(set_nodes(out), vec![set_node(vec![n2], None)], "{mode}");
        let nodes = vec![record("n1", ME, now), record("n2", n2, now - 31_000)];
        let out = run(&mut o, Event::Datastore(view(pools, &[], nodes)));
        assert_eq!(set_nodes(out), vec![set_node(vec![], None)], "{mode}");
    }
}

#[path = "owner_borrow_tests.rs"]
mod borrow;

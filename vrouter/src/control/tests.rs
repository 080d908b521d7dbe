//! The control state's decisions, checked on recorded effects: no sockets,
//! no workers, no root.

use brindle_api::framing::RemoteErrorKind;
use brindle_api::vrouter::{
    self as api, DesiredState, Mac, Neighbor, NodeConfig, PortKind, Route, RouteTarget,
    VrouterRequest as R,
};

use super::*;

const UPLINK_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn control() -> Control<Recording> {
    let rec = Recording::new(2)
        .with_link("eth0", UPLINK_MAC)
        .with_link("pod1", [2, 0, 0, 0, 1, 1])
        .with_link("pod2", [2, 0, 0, 0, 1, 2]);
    Control::new(rec, PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24))
}

fn port(name: &str, kind: PortKind, addrs: &[&str]) -> api::PortSpec {
    api::PortSpec {
        name: name.into(),
        kind,
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        peer_mac: None,
        endpoint: None,
        device: Default::default(),
        workload: None,
    }
}

fn route(prefix: &str, target: RouteTarget) -> Route {
    Route {
        prefix: prefix.parse().unwrap(),
        target,
    }
}

fn local(port: &str) -> RouteTarget {
    RouteTarget::Local { port: port.into() }
}

fn ipip(remote: &str) -> RouteTarget {
    RouteTarget::Encap {
        encap: api::Encap::Ipip,
        remote: remote.parse().unwrap(),
    }
}

fn changed(c: &mut Control<Recording>, req: R) -> u64 {
    let v = c.handle(req).expect("request succeeds");
    v["changed"].as_u64().expect("a Changed result")
}

fn node(addr: &str, vni: u32) -> NodeConfig {
    NodeConfig {
        address_v4: Some(addr.parse().unwrap()),
        address_v6: None,
        underlay_subnet: Some("192.168.0.0/24".parse().unwrap()),
        underlay_gateway: None,
        vxlan: api::VxlanConfig {
            vni,
            ..api::VxlanConfig::default()
        },
        tunnel_peers: vec![],
    }
}

#[test]
fn ports_and_routes_become_attachments_fib_writes_and_steering_once() {
    let mut c = control();
    let ports = vec![
        port("eth0", PortKind::Uplink, &[]),
        port("pod1", PortKind::Pod, &["10.244.0.5"]),
    ];
    assert_eq!(
        changed(
            &mut c,
            R::AddPorts {
                ports: ports.clone()
            }
        ),
        2
    );
    let fx = c.effects_mut().take();
    assert!(matches!(
        &fx[0],
        Effect::Attach { id: 0, name, role: Role::Uplink, first: 0, endpoint }
            if name == "eth0" && endpoint.mac == UPLINK_MAC
    ));
    // The uplink's worker 0 owns a port: the pod goes to worker 1.
    assert!(matches!(
        &fx[1],
        Effect::Attach { id: 1, name, role: Role::Pod, first: 1, endpoint }
            if name == "pod1" && endpoint.addrs == vec!["10.244.0.5".parse::<IpAddr>().unwrap()]
    ));
    assert_eq!(fx.len(), 2);

    let routes = vec![
        route("10.244.0.5/32", local("pod1")),
        route("10.244.1.0/26", ipip("192.168.0.12")),
        route("10.9.0.0/16", RouteTarget::Blackhole),
    ];
    assert_eq!(
        changed(
            &mut c,
            R::AddRoutes {
                routes: routes.clone()
            }
        ),
        3
    );
    let fx = c.effects_mut().take();
    assert_eq!(
        fx[0],
        Effect::Fib(vec![
            FibChange::Upsert {
                prefix: "10.244.0.5/32".parse().unwrap(),
                next_hop: NextHop::Local { port: 1 },
            },
            FibChange::Upsert {
                prefix: "10.244.1.0/26".parse().unwrap(),
                next_hop: NextHop::Encap {
                    encap: Encap::Ipip,
                    remote: "192.168.0.12".parse().unwrap(),
                },
            },
            FibChange::Upsert {
                prefix: "10.9.0.0/16".parse().unwrap(),
                next_hop: NextHop::Blackhole,
            },
        ])
    );
    assert!(fx.contains(&Effect::SteerAdd(("10.244.0.5".parse().unwrap(), 32))));
    assert!(fx.contains(&Effect::SteerAdd(("10.244.1.0".parse().unwrap(), 26))));
    assert!(!fx.iter().any(|e| matches!(e, Effect::SteerAdd((_, 16)))));
    // No node address yet: no underlay, nothing to resolve.
    assert!(!fx.iter().any(|e| matches!(e, Effect::Resolve(_))));

    // The same again: nothing.
    assert_eq!(changed(&mut c, R::AddPorts { ports }), 0);
    assert_eq!(changed(&mut c, R::AddRoutes { routes }), 0);
    assert_eq!(c.effects_mut().take(), vec![]);
    assert_eq!(c.routes(), 3);
}

#[test]
fn a_route_to_an_unknown_port_is_refused_and_nothing_of_its_batch_is_applied() {
    let mut c = control();
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("pod1", PortKind::Pod, &["10.244.0.5"])],
        },
    );
    c.effects_mut().take();
    let e = c
        .handle(R::AddRoutes {
            routes: vec![
                route("10.244.0.5/32", local("pod1")),
                route("10.244.0.6/32", local("nope")),
            ],
        })
        .unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::NotFound);
    assert!(e.message.contains("nope"), "{}", e.message);
    assert_eq!(c.effects_mut().take(), vec![]);
    assert_eq!(c.routes(), 0);
}

#[test]
fn a_missing_interface_is_the_callers_error_and_leaves_no_slot_taken() {
    let mut c = control();
    let e = c
        .handle(R::AddPorts {
            ports: vec![port("ghost0", PortKind::Pod, &[])],
        })
        .unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::InvalidRequest);
    assert!(e.message.contains("ghost0"), "{}", e.message);
    assert_eq!(c.effects_mut().take(), vec![]);
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("pod1", PortKind::Pod, &[])],
        },
    );
    assert!(matches!(
        c.effects_mut().take()[0],
        Effect::Attach { id: 0, .. }
    ));
}

#[test]
fn a_port_that_leaves_takes_its_routes_out_and_brings_them_back_in_its_new_slot() {
    let mut c = control();
    let state = |with_pod: bool| {
        let mut ports = vec![port("pod2", PortKind::Pod, &["10.244.0.6"])];
        let mut routes = vec![route("10.244.0.6/32", local("pod2"))];
        if with_pod {
            ports.push(port("pod1", PortKind::Pod, &["10.244.0.5"]));
            routes.push(route("10.244.0.5/32", local("pod1")));
        }
        DesiredState {
            node: None,
            ports,
            routes,
            neighbors: vec![],
            policy: None,
        }
    };
    assert_eq!(changed(&mut c, R::Sync { state: state(true) }), 4);
    let fx = c.effects_mut().take();
    assert!(matches!(&fx[1], Effect::Attach { id: 1, name, .. } if name == "pod1"));
    // Without pod1: its port and its route go.
    assert_eq!(
        changed(
            &mut c,
            R::Sync {
                state: state(false)
            }
        ),
        2
    );
    let fx = c.effects_mut().take();
    assert_eq!(fx[0], Effect::Detach(1));
    assert!(fx.contains(&Effect::Fib(vec![FibChange::Remove {
        prefix: "10.244.0.5/32".parse().unwrap()
    }])));
    assert!(fx.contains(&Effect::SteerRemove(("10.244.0.5".parse().unwrap(), 32))));
    // Back: slot 1 is reused and the route returns.
    assert_eq!(changed(&mut c, R::Sync { state: state(true) }), 2);
    let fx = c.effects_mut().take();
    assert!(matches!(&fx[0], Effect::Attach { id: 1, name, .. } if name == "pod1"));
    assert!(fx.contains(&Effect::Fib(vec![FibChange::Upsert {
        prefix: "10.244.0.5/32".parse().unwrap(),
        next_hop: NextHop::Local { port: 1 },
    }])));
    assert_eq!(changed(&mut c, R::Sync { state: state(true) }), 0);
}

#[test]
fn a_new_vni_rewrites_the_vxlan_routes_and_neighbours_end_the_resolving() {
    let mut c = control();
    changed(
        &mut c,
        R::SetNode {
            node: node("192.168.0.1", 4096),
        },
    );
    let fx = c.effects_mut().take();
    assert_eq!(
        fx,
        vec![
            Effect::SteerNode(Some("192.168.0.1".parse().unwrap()), 4789),
            Effect::Pipeline {
                node_v4: "192.168.0.1".parse().unwrap(),
                vni: 4096
            },
            Effect::TunnelPeers(Some(vec![])),
        ]
    );
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("eth0", PortKind::Uplink, &[])],
        },
    );
    let vxlan = RouteTarget::Encap {
        encap: api::Encap::Vxlan,
        remote: "192.168.0.12".parse().unwrap(),
    };
    changed(
        &mut c,
        R::AddRoutes {
            routes: vec![route("10.244.1.0/26", vxlan)],
        },
    );
    // The tunnel's next hop is on the subnet and has no MAC: the kernel is
    // asked to resolve it.
    assert!(
        c.effects_mut()
            .take()
            .contains(&Effect::Resolve("192.168.0.12".parse().unwrap()))
    );
    assert_eq!(
        changed(
            &mut c,
            R::SetNode {
                node: node("192.168.0.1", 7)
            }
        ),
        1
    );
    let fx = c.effects_mut().take();
    assert!(fx.contains(&Effect::Fib(vec![FibChange::Upsert {
        prefix: "10.244.1.0/26".parse().unwrap(),
        next_hop: NextHop::Encap {
            encap: Encap::Vxlan { vni: 7 },
            remote: "192.168.0.12".parse().unwrap(),
        },
    }])));
    assert_eq!(
        c.unresolved(),
        vec![("eth0".to_owned(), "192.168.0.12".parse().unwrap())]
    );
    changed(
        &mut c,
        R::SetNeighbors {
            neighbors: vec![Neighbor {
                port: "eth0".into(),
                ip: "192.168.0.12".parse().unwrap(),
                mac: Mac([2, 0, 0, 0, 0, 12]),
            }],
        },
    );
    let fx = c.effects_mut().take();
    assert_eq!(
        fx,
        vec![Effect::Neighbor(
            0,
            "192.168.0.12".parse().unwrap(),
            Some([2, 0, 0, 0, 0, 12])
        )]
    );
    assert!(c.unresolved().is_empty());
    c.resolve_missing();
    assert_eq!(c.effects_mut().take(), vec![], "nothing left to resolve");
}

#[test]
fn a_full_steering_map_leaves_prefixes_to_the_kernel_and_the_request_succeeds() {
    let mut c = control();
    c.effects_mut().steer_capacity = 1;
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("pod1", PortKind::Pod, &[])],
        },
    );
    let n = changed(
        &mut c,
        R::AddRoutes {
            routes: vec![
                route("10.244.0.5/32", local("pod1")),
                route("10.244.0.6/32", local("pod1")),
            ],
        },
    );
    assert_eq!(n, 2);
    let steered: Vec<Effect> = c
        .effects_mut()
        .take()
        .into_iter()
        .filter(|e| matches!(e, Effect::SteerAdd(_)))
        .collect();
    assert_eq!(steered.len(), 1);
    assert_eq!(c.routes(), 2, "both routes are in the FIB");
}

fn policies(c: &Control<Recording>) -> Vec<(u64, Vec<PortId>)> {
    c.effects()
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Policy {
                generation,
                workloads,
            } => Some((*generation, workloads.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn policy_updates_apply_all_or_nothing_and_pod_workloads_reach_the_workers() {
    use brindle_policy::program::{EndpointKey, Program, ProgramUpdate, Update};
    let mut c = control();
    let a = EndpointKey::new("demo", "a");
    let mut pod = port("pod1", PortKind::Pod, &["10.65.0.2"]);
    pod.workload = Some(a.clone());
    assert_eq!(changed(&mut c, R::AddPorts { ports: vec![pod] }), 1);
    let id = c.ports["pod1"].id;
    assert_eq!(policies(&c), vec![(0, vec![id])]);
    let update = Update {
        generation: 1,
        programs: vec![ProgramUpdate {
            endpoint: a.clone(),
            program: Some(Program::default()),
        }],
        ..Update::default()
    };
    assert_eq!(
        changed(
            &mut c,
            R::ApplyPolicy {
                update: update.clone()
            }
        ),
        1
    );
    assert_eq!(c.policy().generation(), 1);
    assert!(c.policy().state().endpoint(&a).is_some());
    // The same generation again: refused, nothing changes, nothing sent.
    let err = c
        .handle(R::ApplyPolicy {
            update: update.clone(),
        })
        .unwrap_err();
    assert_eq!(err.kind, RemoteErrorKind::InvalidRequest);
    assert!(
        err.message.contains("policy update refused"),
        "{}",
        err.message
    );
    assert_eq!(policies(&c).len(), 2);
    // A resync replaces the state, whatever its generation.
    let state = DesiredState {
        ports: vec![],
        policy: Some(Update {
            generation: 1,
            ..Update::default()
        }),
        ..DesiredState::default()
    };
    c.handle(R::Sync { state }).expect("sync");
    assert!(c.policy().state().endpoint(&a).is_none());
    // The pod left with the sync: its slot has no workload any more.
    assert_eq!(policies(&c).last(), Some(&(1, vec![])));
}

#[test]
fn a_refused_policy_snapshot_does_not_fail_the_sync_and_the_policy_in_force_stays() {
    use brindle_policy::program::{
        Chain, EndpointKey, Program, ProgramUpdate, Side, TierChain, TierEnd, Update,
    };
    let mut c = control();
    let a = EndpointKey::new("demo", "a");
    let good = Update {
        generation: 1,
        programs: vec![ProgramUpdate {
            endpoint: a.clone(),
            program: Some(Program::default()),
        }],
        ..Update::default()
    };
    assert_eq!(changed(&mut c, R::ApplyPolicy { update: good }), 1);
    // A program reading a set the snapshot lacks: refused.
    let bad_program = Program {
        ingress: Chain {
            tiers: vec![TierChain {
                tier: "default".into(),
                rules: vec![brindle_policy::program::CompiledRule {
                    action: brindle_policy::program::RuleAction::Allow,
                    when: brindle_policy::program::Match {
                        src: Side {
                            in_sets: vec![brindle_policy::program::SetId(7)],
                            ..Side::default()
                        },
                        ..Default::default()
                    },
                    policy: 0,
                    index: 0,
                }],
                end: TierEnd::Deny,
            }],
        },
        ..Program::default()
    };
    let mut pod = port("pod1", PortKind::Pod, &["10.65.0.2"]);
    pod.workload = Some(EndpointKey::new("demo", "b"));
    let state = DesiredState {
        ports: vec![pod],
        policy: Some(Update {
            generation: 5,
            programs: vec![ProgramUpdate {
                endpoint: EndpointKey::new("demo", "b"),
                program: Some(bad_program),
            }],
            ..Update::default()
        }),
        ..DesiredState::default()
    };
    let n = changed(&mut c, R::Sync { state });
    assert_eq!(n, 1, "the port is attached, the snapshot is not applied");
    assert!(c.ports.contains_key("pod1"));
    assert_eq!(c.policy().generation(), 1, "the policy in force stays");
    assert!(c.policy().state().endpoint(&a).is_some());
    assert_eq!(c.refused_policy_snapshots(), 1);
    let stats: api::Stats =
        serde_json::from_value(c.handle(R::GetStats).expect("stats")).expect("parses");
    assert_eq!(stats.policy_snapshots_refused, 1);
}

#[test]
fn a_tap_host_port_speaks_as_the_gateway_to_the_kernels_mac() {
    let rec = Recording::new(2).with_link("brindle0", [2, 0, 0, 0, 0xb0, 0]);
    let mut c = Control::new(rec, PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24));
    let mut host = port("brindle0", PortKind::Host, &[]);
    host.device = api::PortDevice::Tap {
        netns: None,
        ifname: "brindle0".into(),
        queues: 2,
    };
    assert_eq!(changed(&mut c, R::AddPorts { ports: vec![host] }), 1);
    let attached = c.effects_mut().take().into_iter().find_map(|e| match e {
        Effect::AttachTap { endpoint, .. } => Some(endpoint),
        _ => None,
    });
    // The dataplane fills in the device's MTU and, as the peer, its MAC.
    let mut want = Endpoint::host(GATEWAY_MAC, [0; 6], 0);
    want.peer_mac = None;
    assert_eq!(
        attached,
        Some(want),
        "our MAC is the pods' gateway's, the peer is brindle0's own"
    );
}

#[test]
fn veth_pods_send_the_vrouter_everything_while_a_host_port_is_attached() {
    let rec = Recording::new(1)
        .with_link("pod1", [2, 0, 0, 0, 1, 1])
        .with_link("brindle0", [2, 0, 0, 0, 0xb0, 0]);
    let mut c = Control::new(rec, PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24));
    let pod_roles = |c: &mut Control<Recording>| -> Vec<Role> {
        c.effects_mut()
            .take()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Attach { name, role, .. } if name == "pod1" => Some(role),
                _ => None,
            })
            .collect()
    };
    let pod = port("pod1", PortKind::Pod, &["10.65.0.2"]);
    let mut host = port("brindle0", PortKind::Host, &[]);
    host.device = api::PortDevice::Tap {
        netns: None,
        ifname: "brindle0".into(),
        queues: 1,
    };
    // Without a host port: the pod's own prefix steering, as before.
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![pod.clone()],
        },
    );
    assert_eq!(pod_roles(&mut c), vec![Role::Pod]);
    // The host port arrives: the pod is re-opened with every frame steered.
    changed(&mut c, R::AddPorts { ports: vec![host] });
    assert_eq!(pod_roles(&mut c), vec![Role::All]);
    // It leaves: back to prefix steering.
    changed(
        &mut c,
        R::RemovePorts {
            names: vec!["brindle0".into()],
        },
    );
    assert_eq!(pod_roles(&mut c), vec![Role::Pod]);
    // One batch with both, pod listed first: the host port goes first.
    let mut c2 = Control::new(
        Recording::new(1)
            .with_link("pod1", [2, 0, 0, 0, 1, 1])
            .with_link("brindle0", [2, 0, 0, 0, 0xb0, 0]),
        PipelineConfig::new(Ipv4Addr::UNSPECIFIED, 24),
    );
    let mut host = port("brindle0", PortKind::Host, &[]);
    host.device = api::PortDevice::Tap {
        netns: None,
        ifname: "brindle0".into(),
        queues: 1,
    };
    changed(
        &mut c2,
        R::AddPorts {
            ports: vec![pod, host],
        },
    );
    assert_eq!(pod_roles(&mut c2), vec![Role::All]);
}

#[test]
fn a_tap_port_is_attached_by_namespace_and_name_without_a_link_lookup() {
    let mut c = control();
    let mut tap = port("tap-pod9", PortKind::Pod, &["10.244.0.9"]);
    tap.device = api::PortDevice::Tap {
        netns: Some("/var/run/netns/pod9".into()),
        ifname: "eth0".into(),
        queues: 2,
    };
    // "tap-pod9" is no interface of the vrouter's namespace: no link read.
    assert_eq!(changed(&mut c, R::AddPorts { ports: vec![tap] }), 1);
    let fx = c.effects_mut().take();
    let Some(Effect::AttachTap {
        name,
        netns,
        ifname,
        endpoint,
        ..
    }) = fx.first()
    else {
        panic!("{fx:?}");
    };
    assert_eq!(
        (name.as_str(), netns.as_deref(), ifname.as_str()),
        ("tap-pod9", Some("/var/run/netns/pod9"), "eth0")
    );
    assert_eq!(endpoint.kind, crate::endpoint::PortKind::Pod);
    assert_eq!(endpoint.mac, crate::endpoint::GATEWAY_MAC);
    assert_eq!(
        endpoint.addrs,
        vec!["10.244.0.9".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn a_batch_of_ports_attaches_every_one_it_can_spread_over_the_workers() {
    // One AddPorts with many pods (ctrl merges parallel CNI ADDs): one
    // that cannot be opened (its interface is gone) fails the request but
    // not the others, and its slot is free again.
    let mut c = control();
    let err = c
        .handle(R::AddPorts {
            ports: vec![
                port("pod1", PortKind::Pod, &["10.244.0.5"]),
                port("gone", PortKind::Pod, &["10.244.0.6"]),
                port("pod2", PortKind::Pod, &["10.244.0.7"]),
            ],
        })
        .unwrap_err();
    assert_eq!(err.kind, RemoteErrorKind::InvalidRequest);
    let attached: Vec<(String, u16, usize)> = c
        .effects_mut()
        .take()
        .into_iter()
        .filter_map(|e| match e {
            Effect::Attach {
                id, name, first, ..
            } => Some((name, id, first)),
            _ => None,
        })
        .collect();
    assert_eq!(
        attached,
        vec![("pod1".into(), 0, 0), ("pod2".into(), 1, 1)],
        "both attached, on the two workers"
    );
    // Their routes go in; the failed one's slot is the next one used.
    assert_eq!(
        changed(
            &mut c,
            R::AddRoutes {
                routes: vec![
                    route("10.244.0.5/32", local("pod1")),
                    route("10.244.0.7/32", local("pod2")),
                ],
            }
        ),
        2
    );
    c.effects_mut().links.insert(
        "gone".into(),
        LinkInfo {
            mac: [2; 6],
            mtu: 1500,
        },
    );
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("gone", PortKind::Pod, &["10.244.0.6"])],
        },
    );
    assert!(c.effects_mut().take().iter().any(|e| matches!(
        e,
        Effect::Attach { id: 2, name, .. } if name == "gone"
    )));
}

#[test]
fn the_later_spec_of_a_name_in_one_batch_is_the_one_attached() {
    let mut c = control();
    let n = changed(
        &mut c,
        R::AddPorts {
            ports: vec![
                port("pod1", PortKind::Pod, &["10.244.0.5"]),
                port("pod1", PortKind::Pod, &["10.244.0.9"]),
            ],
        },
    );
    assert_eq!(n, 1);
    let fx = c.effects_mut().take();
    let addrs: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Attach { endpoint, .. } => Some(endpoint.addrs.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(addrs, vec![vec!["10.244.0.9".parse::<IpAddr>().unwrap()]]);
}

#[test]
fn a_sync_with_a_pod_whose_interface_is_gone_applies_the_rest() {
    // The CNI plugin rolled back an ADD (its device is gone) that ctrl
    // still holds: the Sync attaches the others and their routes and
    // succeeds (was: failed whole, and ctrl resynced in a loop answering
    // every ADD "vrouter not reachable"); the missing pod's route waits
    // out of the FIB and goes in when its port comes.
    let mut c = control();
    let state = DesiredState {
        node: None,
        ports: vec![
            port("pod1", PortKind::Pod, &["10.244.0.5"]),
            port("gone", PortKind::Pod, &["10.244.0.6"]),
        ],
        routes: vec![
            route("10.244.0.5/32", local("pod1")),
            route("10.244.0.6/32", local("gone")),
        ],
        neighbors: vec![],
        policy: None,
    };
    c.handle(R::Sync { state }).expect("the sync succeeds");
    let fx = c.effects_mut().take();
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Attach { name, .. } if name == "pod1"))
    );
    assert!(
        c.effects()
            .fib
            .contains_key(&"10.244.0.5/32".parse().unwrap())
    );
    assert!(
        !c.effects()
            .fib
            .contains_key(&"10.244.0.6/32".parse().unwrap())
    );
    c.effects_mut().links.insert(
        "gone".into(),
        LinkInfo {
            mac: [2; 6],
            mtu: 1500,
        },
    );
    changed(
        &mut c,
        R::AddPorts {
            ports: vec![port("gone", PortKind::Pod, &["10.244.0.6"])],
        },
    );
    assert!(
        c.effects()
            .fib
            .contains_key(&"10.244.0.6/32".parse().unwrap())
    );
}

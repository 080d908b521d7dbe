//! Borrowed addresses (issue 14 item 5): a pod of ours whose address lies
//! in another node's block is announced as a host route, withdrawn with
//! its pod, and routed into the kernel's host port.

use super::*;

const N2: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 12);

/// A view where our block is 10.244.0.0/26 and node 2's 10.244.0.64/26.
fn blocks_view() -> DatastoreView {
    DatastoreView {
        foreign_blocks: Some([net("10.244.0.64/26")].into()),
        ..view(
            vec![pool("10.244.0.0/16", "ipip")],
            &["10.244.0.0/26"],
            vec![],
        )
    }
}

fn added(ep: &Endpoint) -> Event {
    Event::Endpoint(EndpointChange::Added {
        endpoint: Box::new(ep.clone()),
        replaced: None,
    })
}

fn bgp(out: &[Effect]) -> Vec<&BgpCommand> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Bgp(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn announce(p: &str) -> BgpCommand {
    BgpCommand::Announce(net(p), IpAddr::V4(ME))
}

#[test]
fn a_pod_address_in_another_nodes_block_is_announced_as_a_host_route_until_its_pod_goes() {
    let mut o = owner();
    run(&mut o, Event::Datastore(blocks_view()));
    // A pod in our own block: only the block is announced (it was).
    let own = endpoint("c1", "bri1", "10.244.0.5/32");
    assert_eq!(bgp(&run(&mut o, added(&own))), Vec::<&BgpCommand>::new());
    // A pod whose address IPAM borrowed from node 2's block.
    let guest = endpoint("c2", "bri2", "10.244.0.70/32");
    let out = run(&mut o, added(&guest));
    assert_eq!(bgp(&out), vec![&announce("10.244.0.70/32")]);
    // Its port and /32 are programmed as for any pod.
    assert!(
        out.contains(&apply(endpoint_added(&guest).unwrap())),
        "{out:?}"
    );
    assert_eq!(o.metrics.borrowed_addresses.get(), 1);
    // The next views announce nothing again.
    assert_eq!(
        bgp(&run(&mut o, Event::Datastore(blocks_view()))),
        Vec::<&BgpCommand>::new()
    );
    // Node status lists it.
    let (reply, rx) = Responder::new();
    let out = run(&mut o, Event::Query(CtrlRequest::CtrlNodeStatus, reply));
    for e in out {
        if let Effect::Answer(r, v) = e {
            r.send(v);
        }
    }
    let Reply::Ok { result } = rx.recv().unwrap() else {
        panic!("no status")
    };
    let status: NodeStatus = serde_json::from_value(result).unwrap();
    assert_eq!(status.announced_borrowed, vec![net("10.244.0.70/32")]);
    // DEL withdraws it; the own pod's DEL withdraws nothing.
    let out = run(
        &mut o,
        Event::Endpoint(EndpointChange::Removed(Box::new(guest))),
    );
    assert_eq!(
        bgp(&out),
        vec![&BgpCommand::Withdraw(net("10.244.0.70/32"))]
    );
    let out = run(
        &mut o,
        Event::Endpoint(EndpointChange::Removed(Box::new(own))),
    );
    assert_eq!(bgp(&out), Vec::<&BgpCommand>::new());
    assert_eq!(o.metrics.borrowed_addresses.get(), 0);
}

#[test]
fn a_pod_restored_before_the_first_view_is_announced_once_the_blocks_are_read() {
    let mut o = owner();
    let guest = endpoint("c2", "bri2", "10.244.0.70/32");
    // Before any view, nothing is known to be another node's: an address of
    // a block we just claimed must not flap as a /32.
    assert_eq!(bgp(&run(&mut o, added(&guest))), Vec::<&BgpCommand>::new());
    let out = run(&mut o, Event::Datastore(blocks_view()));
    assert_eq!(
        bgp(&out),
        vec![&announce("10.244.0.0/26"), &announce("10.244.0.70/32")]
    );
    // A view whose block read failed keeps the last known blocks.
    let failed = DatastoreView {
        affine_blocks: None,
        foreign_blocks: None,
        ..blocks_view()
    };
    assert_eq!(
        bgp(&run(&mut o, Event::Datastore(failed))),
        Vec::<&BgpCommand>::new()
    );
    // Node 2's block released its affinity to us (a GC gave it away, we
    // claimed it): the address is ours, the host route goes.
    let ours = DatastoreView {
        affine_blocks: Some([net("10.244.0.0/26"), net("10.244.0.64/26")].into()),
        foreign_blocks: Some(BTreeSet::new()),
        ..blocks_view()
    };
    let out = run(&mut o, Event::Datastore(ours));
    assert!(
        bgp(&out).contains(&&BgpCommand::Withdraw(net("10.244.0.70/32"))),
        "{out:?}"
    );
}

#[test]
fn the_block_owner_routes_a_learned_borrowed_address_to_the_borrower_and_the_kernel_into_the_host_port()
 {
    let mut config = Config::default();
    config.ipam.gc_interval_secs = 0;
    config.vrouter.host_port = "brindle0".into();
    let mut o = Owner::new(
        config,
        validated(None),
        "embedded",
        Arc::new(Metrics::new()),
        vec![pool("10.244.0.0/16", "ipip")],
    );
    o.start(Vec::new(), &mut Vec::new());
    // Our block is a blackhole in the vrouter; node 2 borrowed .7 from it.
    let mut out = run(
        &mut o,
        Event::Datastore(view(
            vec![pool("10.244.0.0/16", "ipip")],
            &["10.244.0.0/26"],
            vec![],
        )),
    );
    o.handle(
        Event::Route(RouteChange::Added(best("10.244.0.7/32", N2))),
        &mut out,
    );
    o.flush(&mut out);
    assert!(
        out.contains(&apply(vec![VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: net("10.244.0.0/26"),
                target: RouteTarget::Blackhole,
            }]
        }])),
        "{out:?}"
    );
    assert!(
        out.contains(&apply(vec![VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: net("10.244.0.7/32"),
                target: RouteTarget::Encap {
                    encap: Encap::Ipip,
                    remote: N2,
                },
            }]
        }])),
        "{out:?}"
    );
    let host_routes = |out: &[Effect]| {
        out.iter()
            .filter_map(|e| match e {
                Effect::Host(h) => Some(h.routes.clone()),
                _ => None,
            })
            .next_back()
    };
    assert_eq!(
        host_routes(&out),
        Some([net("10.244.0.0/26"), net("10.244.0.7/32")].into())
    );
    // Our own borrowed address (from node 2's block) goes into the kernel's
    // host port as well.
    let mut out = run(
        &mut o,
        Event::Datastore(DatastoreView {
            foreign_blocks: Some([net("10.244.0.64/26")].into()),
            ..view(
                vec![pool("10.244.0.0/16", "ipip")],
                &["10.244.0.0/26"],
                vec![],
            )
        }),
    );
    o.handle(added(&endpoint("c2", "bri2", "10.244.0.70/32")), &mut out);
    o.flush(&mut out);
    assert_eq!(
        host_routes(&out),
        Some(
            [
                net("10.244.0.0/26"),
                net("10.244.0.7/32"),
                net("10.244.0.70/32")
            ]
            .into()
        )
    );
}

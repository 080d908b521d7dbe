//! Merging queued route requests before they go to the vrouter.
//!
//! BGP hands over one route change at a time; sent as they come, a full
//! table is one socket round trip per route, and the vrouter pays its
//! per-request costs (a FIB snapshot publish, the steering update) as often.
//! [`coalesce`] turns each run of consecutive `AddRoutes`/`RemoveRoutes`
//! into its net effect: per prefix only the last change counts (a route
//! announced, withdrawn and announced again is one add), sent as at most
//! one `RemoveRoutes` and one `AddRoutes` per [`MAX_ROUTES_PER_REQUEST`]
//! routes. Any other request ends the run and keeps its place, so a route
//! never goes out before the port it names or after the port is removed.
//!
//! Pod ports are merged too (issue 17): parallel CNI ADDs queue one
//! `AddPorts` each, between their routes and policy updates; every
//! `AddPorts` up to the next request that is not a route change, a policy
//! update or another `AddPorts` joins the first one, so the vrouter gets
//! them in one request and opens them in parallel (an AF_XDP port's XDP
//! attach and sockets, a TAP's queues: 20-30 ms each, mostly waiting in
//! the kernel). Ports only move earlier, never past a `RemovePorts`, a
//! `Sync`, `SetNode` or `SetNeighbors`, so whatever names a port still
//! comes after it and a removed port is never added before its removal.

use std::collections::HashMap;

use brindle_api::vrouter::{Route, VrouterRequest};
use ipnet::IpNet;

/// Routes per request: large enough that the per-request costs vanish,
/// small enough that one request stays a few hundred kilobytes on the
/// socket and a few milliseconds of the vrouter's API thread.
pub const MAX_ROUTES_PER_REQUEST: usize = 10_000;

/// The net effect of a run of route requests.
#[derive(Default)]
struct RouteRun {
    /// Prefixes (host bits cleared, as the vrouter keys them) in the order
    /// they first appeared.
    order: Vec<IpNet>,
    /// The last change per prefix: the route added, or the prefix removed
    /// (as the request spelt it).
    last: HashMap<IpNet, Change>,
}

enum Change {
    Add(Route),
    Remove(IpNet),
}

impl RouteRun {
    fn record(&mut self, key: IpNet, change: Change) {
        if self.last.insert(key.trunc(), change).is_none() {
            self.order.push(key.trunc());
        }
    }

    /// Appends the run's requests to `out`: removals first (their prefixes
    /// differ from every added one, so the order between them does not
    /// matter), in the order the prefixes first appeared.
    fn flush(&mut self, out: &mut Vec<VrouterRequest>, cap: usize) {
        let mut removes = Vec::new();
        let mut adds = Vec::new();
        for key in self.order.drain(..) {
            match self.last.remove(&key) {
                Some(Change::Remove(p)) => removes.push(p),
                Some(Change::Add(r)) => adds.push(r),
                None => {}
            }
        }
        let cap = cap.max(1);
        for chunk in chunks(removes, cap) {
            out.push(VrouterRequest::RemoveRoutes { prefixes: chunk });
        }
        for chunk in chunks(adds, cap) {
            out.push(VrouterRequest::AddRoutes { routes: chunk });
        }
    }
}

/// `items` in pieces of at most `cap`, without copying when it fits and
/// moving each item once when it does not (`split_off` from the front
/// would move the remainder again for every piece).
fn chunks<T>(items: Vec<T>, cap: usize) -> Vec<Vec<T>> {
    if items.len() <= cap {
        return if items.is_empty() {
            Vec::new()
        } else {
            vec![items]
        };
    }
    let mut pieces = Vec::with_capacity(items.len().div_ceil(cap));
    let mut rest = items.into_iter();
    loop {
        let piece: Vec<T> = rest.by_ref().take(cap).collect();
        if piece.is_empty() {
            return pieces;
        }
        pieces.push(piece);
    }
}

/// `reqs` with each run of route requests replaced by its net effect in
/// requests of at most `cap` routes (see the module docs). The vrouter ends
/// in the same state as with `reqs` sent one by one.
pub fn coalesce(reqs: Vec<VrouterRequest>, cap: usize) -> Vec<VrouterRequest> {
    let mut out = Vec::new();
    let mut run = RouteRun::default();
    // Where the open window's `AddPorts` is in `out`.
    let mut ports_at: Option<usize> = None;
    for req in reqs {
        match req {
            VrouterRequest::AddPorts { ports } => match ports_at {
                Some(i) => {
                    let VrouterRequest::AddPorts { ports: merged } = &mut out[i] else {
                        unreachable!("ports_at names an AddPorts");
                    };
                    for p in ports {
                        // The later spec of a name is the one in force.
                        merged.retain(|m| m.name != p.name);
                        merged.push(p);
                    }
                }
                None => {
                    run.flush(&mut out, cap);
                    ports_at = Some(out.len());
                    out.push(VrouterRequest::AddPorts { ports });
                }
            },
            policy @ VrouterRequest::ApplyPolicy { .. } => {
                run.flush(&mut out, cap);
                out.push(policy);
            }
            VrouterRequest::AddRoutes { routes } => {
                for r in routes {
                    run.record(r.prefix, Change::Add(r));
                }
            }
            VrouterRequest::RemoveRoutes { prefixes } => {
                for p in prefixes {
                    run.record(p, Change::Remove(p));
                }
            }
            other => {
                run.flush(&mut out, cap);
                ports_at = None;
                out.push(other);
            }
        }
    }
    run.flush(&mut out, cap);
    out
}

#[cfg(test)]
mod tests {
    use brindle_api::vrouter::{PortKind, PortSpec, RouteTarget};

    use super::*;
    use crate::programming::desired::Desired;

    fn local(prefix: &str, port: &str) -> Route {
        Route {
            prefix: prefix.parse().unwrap(),
            target: RouteTarget::Local { port: port.into() },
        }
    }

    fn add(routes: Vec<Route>) -> VrouterRequest {
        VrouterRequest::AddRoutes { routes }
    }

    fn remove(prefixes: &[&str]) -> VrouterRequest {
        VrouterRequest::RemoveRoutes {
            prefixes: prefixes.iter().map(|p| p.parse().unwrap()).collect(),
        }
    }

    fn state(reqs: &[VrouterRequest]) -> Desired {
        let mut d = Desired::default();
        for r in reqs {
            d.apply(r);
        }
        d
    }

    #[test]
    fn a_run_becomes_its_net_effect_and_other_requests_keep_their_place() {
        let port = VrouterRequest::AddPorts {
            ports: vec![PortSpec {
                name: "bri2".into(),
                kind: PortKind::Pod,
                addresses: vec![],
                peer_mac: None,
                endpoint: None,
                device: Default::default(),
                workload: None,
            }],
        };
        let reqs = vec![
            add(vec![local("10.0.0.0/24", "eth0")]),
            remove(&["10.0.0.0/24"]),
            add(vec![local("10.0.1.0/24", "eth0")]),
            remove(&["10.0.2.0/24"]),
            add(vec![local("10.0.0.0/24", "eth1")]),
            port.clone(),
            add(vec![local("10.244.0.7/32", "bri2")]),
            remove(&["10.0.1.0/24"]),
        ];
        let out = coalesce(reqs.clone(), 10);
        assert_eq!(
            out,
            vec![
                remove(&["10.0.2.0/24"]),
                add(vec![
                    local("10.0.0.0/24", "eth1"),
                    local("10.0.1.0/24", "eth0")
                ]),
                port,
                remove(&["10.0.1.0/24"]),
                add(vec![local("10.244.0.7/32", "bri2")]),
            ]
        );
        assert_eq!(state(&out), state(&reqs));
    }

    #[test]
    fn ten_thousand_single_route_changes_become_a_handful_of_requests() {
        let mut reqs = Vec::new();
        for i in 0..10_000u32 {
            let prefix = format!("10.{}.{}.0/24", i / 256, i % 256);
            reqs.push(add(vec![local(&prefix, "eth0")]));
            // Every tenth route is withdrawn again, every hundredth comes
            // back with another next hop.
            if i % 10 == 0 {
                reqs.push(remove(&[prefix.as_str()]));
            }
            if i % 100 == 0 {
                reqs.push(add(vec![local(&prefix, "eth1")]));
            }
        }
        let out = coalesce(reqs.clone(), 4_000);
        let sizes: Vec<(&str, usize)> = out
            .iter()
            .map(|r| match r {
                VrouterRequest::RemoveRoutes { prefixes } => ("remove", prefixes.len()),
                VrouterRequest::AddRoutes { routes } => ("add", routes.len()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            sizes,
            vec![
                ("remove", 900),
                ("add", 4_000),
                ("add", 4_000),
                ("add", 1_100)
            ]
        );
        // The adds keep the order the prefixes first came in.
        let VrouterRequest::AddRoutes { routes } = &out[1] else {
            unreachable!()
        };
        assert_eq!(routes[0], local("10.0.0.0/24", "eth1"));
        assert_eq!(routes[1], local("10.0.1.0/24", "eth0"));
        assert_eq!(state(&out), state(&reqs));
    }

    fn pod(name: &str, ip: &str) -> PortSpec {
        PortSpec {
            name: name.into(),
            kind: PortKind::Pod,
            addresses: vec![ip.parse().unwrap()],
            peer_mac: None,
            endpoint: None,
            device: Default::default(),
            workload: None,
        }
    }

    fn ports(specs: Vec<PortSpec>) -> VrouterRequest {
        VrouterRequest::AddPorts { ports: specs }
    }

    fn policy(generation: u64) -> VrouterRequest {
        VrouterRequest::ApplyPolicy {
            update: brindle_api::vrouter::PolicyUpdate {
                generation,
                ..Default::default()
            },
        }
    }

    #[test]
    fn parallel_adds_ports_go_out_in_one_request_ahead_of_their_routes() {
        // Three CNI ADDs queued while the executor was busy: port, route
        // and policy step each.
        let (a, b, c) = (
            pod("bria", "10.65.0.2"),
            pod("brib", "10.65.0.3"),
            pod("bric", "10.65.0.4"),
        );
        let reqs = vec![
            ports(vec![a.clone()]),
            add(vec![local("10.65.0.2/32", "bria")]),
            policy(1),
            ports(vec![b.clone()]),
            add(vec![local("10.65.0.3/32", "brib")]),
            policy(2),
            ports(vec![c.clone()]),
            add(vec![local("10.65.0.4/32", "bric")]),
        ];
        let out = coalesce(reqs.clone(), 10);
        assert_eq!(
            out,
            vec![
                ports(vec![a, b, c]),
                add(vec![local("10.65.0.2/32", "bria")]),
                policy(1),
                add(vec![local("10.65.0.3/32", "brib")]),
                policy(2),
                add(vec![local("10.65.0.4/32", "bric")]),
            ]
        );
        assert_eq!(state(&out), state(&reqs));
    }

    #[test]
    fn ports_never_move_past_a_removal_and_the_later_spec_of_a_name_wins() {
        let a = pod("bria", "10.65.0.2");
        let a2 = pod("bria", "10.65.0.9");
        let b = pod("brib", "10.65.0.3");
        let gone = VrouterRequest::RemovePorts {
            names: vec!["bria".into()],
        };
        let reqs = vec![
            ports(vec![a.clone()]),
            ports(vec![b.clone()]),
            ports(vec![a2.clone()]),
            gone.clone(),
            ports(vec![a.clone()]),
        ];
        let out = coalesce(reqs.clone(), 10);
        assert_eq!(out, vec![ports(vec![b, a2]), gone, ports(vec![a])]);
        assert_eq!(state(&out), state(&reqs));
    }

    #[test]
    fn host_bits_name_the_same_prefix() {
        let reqs = vec![
            add(vec![local("10.0.0.0/24", "eth0")]),
            remove(&["10.0.0.9/24"]),
        ];
        assert_eq!(coalesce(reqs, 10), vec![remove(&["10.0.0.9/24"])]);
    }
}

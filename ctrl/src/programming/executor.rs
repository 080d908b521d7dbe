//! The one place that applies vrouter programming.

use std::sync::Arc;
use std::time::Instant;

use brindle_api::vrouter::{Neighbor, VrouterRequest};
use tracing::{debug, info, warn};

use super::Work;
use super::acks::PortAcks;
use super::coalesce::{MAX_ROUTES_PER_REQUEST, coalesce};
use super::dataplane::Dataplane;
use super::desired::Desired;
use crate::metrics::Metrics;
use crate::neighbors::NeighborChange;

/// Applies requests to a [`Dataplane`], keeping the desired state, and
/// resyncs when the vrouter was unreachable or restarted.
pub struct Executor<D> {
    dataplane: D,
    desired: Desired,
    /// Boot ID of the vrouter we last synced.
    boot_id: Option<String>,
    /// The vrouter holds exactly `desired` (no failure since the last sync).
    in_sync: bool,
    /// The vrouter answered the last call.
    reachable: bool,
    metrics: Option<Arc<Metrics>>,
    /// Routes carried by the `Sync` itself; the rest follow it in batches.
    max_sync_routes: usize,
    /// Where the ports the vrouter answered for are published (CNI ADD
    /// waits there for its port).
    acks: Option<Arc<PortAcks>>,
}

/// Routes in a resync's `Sync` message: about 100 bytes of JSON each at
/// most, so the message stays well under the socket's 64 MiB.
pub const MAX_SYNC_ROUTES: usize = 200_000;

impl<D: Dataplane> Executor<D> {
    /// An executor that has programmed nothing yet.
    pub fn new(dataplane: D, metrics: Option<Arc<Metrics>>) -> Self {
        Executor {
            dataplane,
            desired: Desired::default(),
            boot_id: None,
            in_sync: false,
            reachable: false,
            metrics,
            max_sync_routes: MAX_SYNC_ROUTES,
            acks: None,
        }
    }

    /// Publishes the ports the vrouter acknowledged to `acks`.
    pub fn with_acks(mut self, acks: Arc<PortAcks>) -> Self {
        self.acks = Some(acks);
        self
    }

    /// Publishes what a batch the vrouter answered in full added and
    /// removed.
    fn acknowledge(&self, reqs: &[VrouterRequest]) {
        let Some(acks) = &self.acks else { return };
        for r in reqs {
            match r {
                VrouterRequest::AddPorts { ports } => acks.added(ports),
                VrouterRequest::RemovePorts { names } => acks.removed(names),
                _ => {}
            }
        }
    }

    /// Whether the vrouter answered last time we tried.
    pub fn reachable(&self) -> bool {
        self.reachable
    }

    /// The desired state.
    pub fn desired(&self) -> &Desired {
        &self.desired
    }

    /// The boot ID of the vrouter last synced.
    pub fn boot_id(&self) -> Option<&str> {
        self.boot_id.as_deref()
    }

    /// Records `reqs` in the desired state and sends them if the vrouter is
    /// in sync; otherwise tries to resync (which includes them). Runs of
    /// route requests go out merged ([`coalesce`]).
    pub fn submit(&mut self, reqs: Vec<VrouterRequest>) {
        for r in &reqs {
            self.desired.apply(r);
        }
        if !self.in_sync {
            self.reconcile();
            return;
        }
        let ports: Vec<VrouterRequest> = reqs
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    VrouterRequest::AddPorts { .. } | VrouterRequest::RemovePorts { .. }
                )
            })
            .cloned()
            .collect();
        for r in &coalesce(reqs, MAX_ROUTES_PER_REQUEST) {
            let start = Instant::now();
            match self.dataplane.call(r) {
                Ok(_) => self.observe(start),
                Err(e) => {
                    warn!(error = %e, "vrouter call failed; will resync");
                    self.set_reachable(false);
                    self.in_sync = false;
                    // The rest is in `desired` and goes with the resync.
                    self.reconcile();
                    return;
                }
            }
        }
        self.acknowledge(&ports);
    }

    /// Applies a queue item.
    pub fn work(&mut self, work: Work) {
        match work {
            Work::Apply(reqs) => self.submit(reqs),
            Work::Neighbors(changes) => self.neighbors(changes),
            Work::Reconcile => self.reconcile(),
        }
    }

    /// Applies kernel neighbour changes: new or changed MACs go out as one
    /// `SetNeighbors`; a removal takes the entry out of the desired state
    /// and, because the vrouter protocol has no removal op for neighbours,
    /// converges the vrouter with a `Sync` (removals are rare: a node that
    /// left, an entry the kernel failed to resolve).
    pub fn neighbors(&mut self, changes: Vec<NeighborChange>) {
        let mut set: Vec<Neighbor> = Vec::new();
        let mut removed = false;
        for c in changes {
            match c {
                NeighborChange::Set(n) => {
                    if self.desired.neighbors.get(&(n.port.clone(), n.ip)) != Some(&n) {
                        set.retain(|s| (s.port.as_str(), s.ip) != (n.port.as_str(), n.ip));
                        set.push(n);
                    }
                }
                NeighborChange::Removed { port, ip } => {
                    set.retain(|s| (s.port.as_str(), s.ip) != (port.as_str(), ip));
                    removed |= self.desired.neighbors.remove(&(port, ip)).is_some();
                }
            }
        }
        if !set.is_empty() {
            self.submit(vec![VrouterRequest::SetNeighbors { neighbors: set }]);
        }
        if removed {
            self.in_sync = false;
            self.reconcile();
        }
    }

    /// Checks the vrouter (Hello) and sends one `Sync` with the whole desired
    /// state when it was out of sync or has a new boot ID. Called on a timer
    /// and after failures.
    pub fn reconcile(&mut self) {
        let hello = match self.dataplane.hello() {
            Ok(h) => h,
            Err(e) => {
                if self.reachable {
                    warn!(error = %e, "vrouter unreachable; keeping the desired state");
                }
                self.set_reachable(false);
                self.in_sync = false;
                return;
            }
        };
        let restarted = self.boot_id.as_deref() != Some(hello.boot_id.as_str());
        if self.in_sync && !restarted {
            self.set_reachable(true);
            return;
        }
        let mut state = self.desired.to_sync();
        // A full table does not fit in one message (1M routes are about
        // 80 MB of JSON, the socket takes 64 MiB): the `Sync` carries the
        // first routes and the rest follow as `AddRoutes`, in sync only
        // once the last one is in.
        let rest = if state.routes.len() > self.max_sync_routes {
            state.routes.split_off(self.max_sync_routes)
        } else {
            Vec::new()
        };
        info!(
            boot_id = %hello.boot_id,
            restarted,
            ports = state.ports.len(),
            routes = state.routes.len() + rest.len(),
            "resyncing the vrouter"
        );
        let start = Instant::now();
        let mut result = self
            .dataplane
            .call(&VrouterRequest::Sync { state })
            .map(|c| c.changed);
        let mut rest = rest.into_iter().peekable();
        while let Ok(done) = result
            && rest.peek().is_some()
        {
            let routes: Vec<_> = rest.by_ref().take(MAX_ROUTES_PER_REQUEST).collect();
            result = self
                .dataplane
                .call(&VrouterRequest::AddRoutes { routes })
                .map(|c| done + c.changed);
        }
        match result {
            Ok(changed) => {
                debug!(changed, "resync done");
                self.observe(start);
                self.boot_id = Some(hello.boot_id);
                self.in_sync = true;
                self.set_reachable(true);
                if let Some(acks) = &self.acks {
                    acks.replace(self.desired.ports.values().cloned());
                }
            }
            Err(e) => {
                warn!(error = %e, "resync failed");
                if let Some(acks) = &self.acks {
                    acks.clear();
                }
                self.in_sync = false;
                self.set_reachable(false);
            }
        }
    }

    fn observe(&self, start: Instant) {
        if let Some(m) = &self.metrics {
            m.programming_seconds.observe(start.elapsed().as_secs_f64());
        }
    }

    fn set_reachable(&mut self, up: bool) {
        self.reachable = up;
        if let Some(m) = &self.metrics {
            m.vrouter_reachable.set(i64::from(up));
        }
    }
}

#[cfg(test)]
mod tests {
    use brindle_api::framing::PROTOCOL_VERSION;
    use brindle_api::vrouter::{
        DesiredState, Mac, PortKind, PortSpec, Route, RouteTarget, VrouterRequest,
    };

    use ipnet::IpNet;

    use super::*;
    use crate::neighbors::NeighborChange;
    use crate::programming::dataplane::RecordingDataplane;
    use crate::programming::desired::tests::{endpoint, tap_endpoint};
    use crate::programming::desired::{endpoint_added, endpoint_removed, tap_port_name};

    fn hello() -> VrouterRequest {
        VrouterRequest::Hello {
            version: PROTOCOL_VERSION,
        }
    }

    fn pod_port(name: &str, ip: &str, handle: &str) -> PortSpec {
        PortSpec {
            name: name.into(),
            kind: PortKind::Pod,
            addresses: vec![ip.parse().unwrap()],
            peer_mac: Some(Mac([2, 0, 0, 0, 0, 1])),
            endpoint: Some(handle.into()),
            device: Default::default(),
            workload: None,
        }
    }

    fn local(prefix: &str, port: &str) -> Route {
        Route {
            prefix: prefix.parse().unwrap(),
            target: RouteTarget::Local { port: port.into() },
        }
    }

    /// An executor already synced (empty) with boot "b1"; the log is cleared.
    fn synced() -> (Executor<RecordingDataplane>, RecordingDataplane) {
        let fake = RecordingDataplane::new("b1");
        let mut ex = Executor::new(fake.clone(), None);
        ex.reconcile();
        assert_eq!(
            fake.take(),
            vec![
                hello(),
                VrouterRequest::Sync {
                    state: DesiredState::default()
                }
            ]
        );
        (ex, fake)
    }

    #[test]
    fn ten_thousand_queued_route_changes_go_out_as_a_few_requests_in_order() {
        let (mut ex, fake) = synced();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let mut reqs = endpoint_added(&ep).unwrap();
        let mut sent_last = Vec::new();
        for i in 0..10_000u32 {
            let prefix = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
            reqs.push(VrouterRequest::AddRoutes {
                routes: vec![local(&prefix, "bri1")],
            });
            if i % 2 == 1 {
                reqs.push(VrouterRequest::RemoveRoutes {
                    prefixes: vec![prefix.parse().unwrap()],
                });
            } else {
                sent_last.push(local(&prefix, "bri1"));
            }
        }
        reqs.extend(endpoint_removed(&ep));
        ex.submit(reqs);
        let sent = fake.take();
        // The pod's port; the net effect of the route run: the withdrawn
        // prefixes and the pod's host route (added, then removed with the
        // endpoint) go as one removal, the 5,000 that stayed as one add in
        // the order they came; the port's removal still goes last.
        assert_eq!(sent.len(), 4, "{:?}", &sent[..sent.len().min(1)]);
        assert_eq!(
            sent[0],
            VrouterRequest::AddPorts {
                ports: vec![pod_port("bri1", "10.244.0.5", "k8s-pod-network/c1/eth0")],
            }
        );
        let VrouterRequest::RemoveRoutes { prefixes } = &sent[1] else {
            panic!("not a removal: {:?}", sent[1]);
        };
        assert_eq!(prefixes.len(), 5_001);
        assert_eq!(prefixes[0], "10.244.0.5/32".parse::<IpNet>().unwrap());
        assert_eq!(prefixes[1], "10.100.1.0/24".parse::<IpNet>().unwrap());
        assert!(sent[2] == VrouterRequest::AddRoutes { routes: sent_last });
        assert_eq!(
            sent[3],
            VrouterRequest::RemovePorts {
                names: vec!["bri1".into()]
            }
        );
        assert_eq!(ex.desired().routes.len(), 5_000);
        assert!(ex.desired().ports.is_empty());
    }

    #[test]
    fn a_table_too_large_for_one_sync_follows_it_in_batches() {
        let fake = RecordingDataplane::new("b1");
        let mut ex = Executor::new(fake.clone(), None);
        ex.max_sync_routes = 3;
        fake.set_down(true);
        let routes: Vec<Route> = (0..8)
            .map(|i| local(&format!("10.0.{i}.0/24"), "eth0"))
            .collect();
        ex.submit(vec![VrouterRequest::AddRoutes {
            routes: routes.clone(),
        }]);
        assert!(fake.take().is_empty());
        fake.set_down(false);
        ex.reconcile();
        assert_eq!(
            fake.take(),
            vec![
                hello(),
                VrouterRequest::Sync {
                    state: DesiredState {
                        routes: routes[..3].to_vec(),
                        ..DesiredState::default()
                    }
                },
                VrouterRequest::AddRoutes {
                    routes: routes[3..].to_vec()
                },
            ]
        );
        assert!(ex.reachable());
    }

    #[test]
    fn a_port_is_acknowledged_only_once_the_vrouter_answered_its_batch() {
        use std::time::Instant;
        let fake = RecordingDataplane::new("b1");
        let acks = Arc::new(PortAcks::default());
        let mut ex = Executor::new(fake.clone(), None).with_acks(acks.clone());
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        let reqs = endpoint_added(&ep).unwrap();
        let VrouterRequest::AddPorts { ports } = &reqs[0] else {
            panic!("no port first");
        };
        let port = ports[0].clone();
        // The vrouter is away: nothing is acknowledged.
        fake.set_down(true);
        ex.submit(reqs.clone());
        assert!(!acks.wait(&port, Instant::now()));
        // It answers the resync: the port is there.
        fake.set_down(false);
        ex.reconcile();
        assert!(acks.wait(&port, Instant::now()));
        ex.submit(endpoint_removed(&ep));
        assert!(!acks.wait(&port, Instant::now()));
        ex.submit(reqs);
        assert!(acks.wait(&port, Instant::now()));
    }

    #[test]
    fn adding_an_endpoint_sends_a_pod_port_then_its_host_route() {
        let (mut ex, fake) = synced();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        ex.submit(endpoint_added(&ep).unwrap());
        assert_eq!(
            fake.take(),
            vec![
                VrouterRequest::AddPorts {
                    ports: vec![pod_port("bri1", "10.244.0.5", "k8s-pod-network/c1/eth0")]
                },
                VrouterRequest::AddRoutes {
                    routes: vec![local("10.244.0.5/32", "bri1")]
                },
            ]
        );
        assert!(ex.reachable());
    }

    #[test]
    fn a_dual_stack_endpoint_gets_both_host_routes_and_both_source_addresses() {
        let (mut ex, fake) = synced();
        let mut ep = endpoint("c1", "bri1", "10.244.0.5/32");
        ep.ips.push("fd00:244::5/128".parse().unwrap());
        ex.submit(endpoint_added(&ep).unwrap());
        let reqs = fake.take();
        let VrouterRequest::AddPorts { ports } = &reqs[0] else {
            panic!("{reqs:?}")
        };
        assert_eq!(
            ports[0].addresses,
            vec![
                "10.244.0.5".parse::<std::net::IpAddr>().unwrap(),
                "fd00:244::5".parse().unwrap()
            ]
        );
        assert_eq!(
            reqs[1],
            VrouterRequest::AddRoutes {
                routes: vec![
                    local("10.244.0.5/32", "bri1"),
                    local("fd00:244::5/128", "bri1")
                ]
            }
        );
    }

    #[test]
    fn deleting_an_endpoint_removes_its_routes_then_its_port() {
        let (mut ex, fake) = synced();
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        ex.submit(endpoint_added(&ep).unwrap());
        fake.take();
        ex.submit(endpoint_removed(&ep));
        assert_eq!(
            fake.take(),
            vec![
                VrouterRequest::RemoveRoutes {
                    prefixes: vec!["10.244.0.5/32".parse().unwrap()]
                },
                VrouterRequest::RemovePorts {
                    names: vec!["bri1".into()]
                },
            ]
        );
        assert!(ex.desired().ports.is_empty());
        assert!(ex.desired().routes.is_empty());
    }

    #[test]
    fn changes_made_while_the_vrouter_is_down_are_kept_and_synced_when_it_answers() {
        let (mut ex, fake) = synced();
        fake.set_down(true);
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        ex.submit(endpoint_added(&ep).unwrap());
        assert!(fake.take().is_empty());
        assert!(!ex.reachable());
        fake.set_down(false);
        ex.reconcile();
        assert_eq!(
            fake.take(),
            vec![
                hello(),
                VrouterRequest::Sync {
                    state: DesiredState {
                        node: None,
                        ports: vec![pod_port("bri1", "10.244.0.5", "k8s-pod-network/c1/eth0")],
                        routes: vec![local("10.244.0.5/32", "bri1")],
                        neighbors: vec![],
                        policy: None,
                    }
                }
            ]
        );
        assert!(ex.reachable());
    }

    #[test]
    fn a_vrouter_restart_with_a_new_boot_id_replays_the_whole_state() {
        let (mut ex, fake) = synced();
        let a = endpoint("c1", "bri1", "10.244.0.5/32");
        let b = endpoint("c2", "bri2", "10.244.0.6/32");
        ex.submit(endpoint_added(&a).unwrap());
        ex.submit(endpoint_added(&b).unwrap());
        ex.submit(vec![VrouterRequest::AddRoutes {
            routes: vec![Route {
                prefix: "10.244.1.0/26".parse().unwrap(),
                target: RouteTarget::Encap {
                    encap: brindle_api::vrouter::Encap::Ipip,
                    remote: "192.168.0.12".parse().unwrap(),
                },
            }],
        }]);
        fake.take();
        // A periodic check against the same vrouter changes nothing.
        ex.reconcile();
        assert_eq!(fake.take(), vec![hello()]);

        fake.restart("b2");
        ex.reconcile();
        let reqs = fake.take();
        assert_eq!(reqs.len(), 2, "{reqs:?}");
        assert_eq!(reqs[0], hello());
        let VrouterRequest::Sync { state } = &reqs[1] else {
            panic!("{reqs:?}")
        };
        assert_eq!(
            state.ports,
            vec![
                pod_port("bri1", "10.244.0.5", "k8s-pod-network/c1/eth0"),
                pod_port("bri2", "10.244.0.6", "k8s-pod-network/c2/eth0"),
            ]
        );
        let prefixes: Vec<String> = state.routes.iter().map(|r| r.prefix.to_string()).collect();
        assert_eq!(
            prefixes,
            ["10.244.0.5/32", "10.244.0.6/32", "10.244.1.0/26"]
        );
        assert_eq!(ex.boot_id(), Some("b2"));
    }

    #[test]
    fn a_tap_pod_is_replayed_with_its_device_after_a_vrouter_restart_and_removed_by_name() {
        let (mut ex, fake) = synced();
        let ep = tap_endpoint("c1", "10.244.0.5/32");
        let added = endpoint_added(&ep).unwrap();
        ex.submit(added.clone());
        assert_eq!(fake.take(), added);
        fake.restart("b2");
        ex.reconcile();
        let reqs = fake.take();
        let VrouterRequest::Sync { state } = &reqs[1] else {
            panic!("{reqs:?}")
        };
        let VrouterRequest::AddPorts { ports } = &added[0] else {
            panic!("{added:?}")
        };
        // The same port, device and all: the vrouter re-attaches the pod's
        // TAP by netns and name, and its route names the same port.
        assert_eq!(&state.ports, ports);
        let port = tap_port_name(&ep.key.handle());
        assert_eq!(state.routes, vec![local("10.244.0.5/32", &port)]);
        ex.submit(endpoint_removed(&ep));
        assert_eq!(
            fake.take(),
            vec![
                VrouterRequest::RemoveRoutes {
                    prefixes: vec!["10.244.0.5/32".parse().unwrap()]
                },
                VrouterRequest::RemovePorts { names: vec![port] },
            ]
        );
        assert!(ex.desired().ports.is_empty());
    }

    #[test]
    fn a_restart_noticed_by_a_failed_call_resyncs_including_that_call() {
        let (mut ex, fake) = synced();
        fake.restart("b2");
        let ep = endpoint("c1", "bri1", "10.244.0.5/32");
        ex.submit(endpoint_added(&ep).unwrap());
        let reqs = fake.take();
        assert_eq!(reqs[0], hello());
        let VrouterRequest::Sync { state } = &reqs[1] else {
            panic!("{reqs:?}")
        };
        assert_eq!(state.routes, vec![local("10.244.0.5/32", "bri1")]);
        assert_eq!(reqs.len(), 2);
    }

    fn neighbor(ip: &str, last: u8) -> brindle_api::vrouter::Neighbor {
        brindle_api::vrouter::Neighbor {
            port: "eth0".into(),
            ip: ip.parse().unwrap(),
            mac: Mac([2, 0, 0, 0, 0, last]),
        }
    }

    #[test]
    fn kernel_neighbours_are_sent_as_one_set_neighbors_and_unchanged_ones_not_again() {
        let (mut ex, fake) = synced();
        ex.neighbors(vec![
            NeighborChange::Set(neighbor("10.0.0.1", 1)),
            NeighborChange::Set(neighbor("10.0.0.3", 3)),
        ]);
        assert_eq!(
            fake.take(),
            vec![VrouterRequest::SetNeighbors {
                neighbors: vec![neighbor("10.0.0.1", 1), neighbor("10.0.0.3", 3)]
            }]
        );
        // The same entry again (a REACHABLE -> STALE transition) sends
        // nothing; a new MAC replaces it.
        ex.neighbors(vec![NeighborChange::Set(neighbor("10.0.0.1", 1))]);
        assert!(fake.take().is_empty());
        ex.neighbors(vec![NeighborChange::Set(neighbor("10.0.0.1", 9))]);
        assert_eq!(
            fake.take(),
            vec![VrouterRequest::SetNeighbors {
                neighbors: vec![neighbor("10.0.0.1", 9)]
            }]
        );
    }

    #[test]
    fn a_removed_neighbour_is_dropped_from_the_desired_state_by_a_sync() {
        let (mut ex, fake) = synced();
        ex.neighbors(vec![
            NeighborChange::Set(neighbor("10.0.0.1", 1)),
            NeighborChange::Set(neighbor("10.0.0.3", 3)),
        ]);
        fake.take();
        ex.neighbors(vec![NeighborChange::Removed {
            port: "eth0".into(),
            ip: "10.0.0.1".parse().unwrap(),
        }]);
        assert_eq!(
            fake.take(),
            vec![
                hello(),
                VrouterRequest::Sync {
                    state: DesiredState {
                        neighbors: vec![neighbor("10.0.0.3", 3)],
                        ..DesiredState::default()
                    }
                }
            ]
        );
        // Removing what was never there costs nothing.
        ex.neighbors(vec![NeighborChange::Removed {
            port: "eth0".into(),
            ip: "10.0.0.7".parse().unwrap(),
        }]);
        assert!(fake.take().is_empty());
    }
}

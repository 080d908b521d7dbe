//! Network policy in the pipeline (issue 15), and the per-worker flow table
//! that also remembers which flows entered from the host port (issue 14).
//!
//! - [`PolicyView`]: what the workers read, immutable once published: the
//!   policy state (`brindle_policy::classify::PolicyState`: programs of the
//!   local endpoints, IP sets, generations) and, per port slot, the pod's
//!   workload (its policy endpoint) and that endpoint's generation.
//! - [`PolicyCell`] / [`PolicyReader`]: the control thread publishes a new
//!   view (a version number and an `Arc` behind a mutex); a worker compares
//!   the version once per batch (one atomic load) and takes the new `Arc`
//!   only when it changed. No lock per packet.
//! - [`Flows`]: one per worker, in its pipeline: the connection table
//!   (`brindle_policy::conntrack::ConnTable`, allocated on first use) and
//!   [`Flows::check`], the hook the pipeline calls for every routed packet
//!   that leaves or enters a pod, after the FIB lookup.
//!
//! Where a flow is checked: a pod's flows live in the table of the worker
//! that owns the pod's port, so both directions of a flow meet one entry.
//! A frame from a local pod is checked on its worker (the pod's egress
//! program, and the destination's ingress program when the destination is
//! a pod of the same worker); a frame to a pod owned by another worker is
//! checked by that worker when it takes the hand-off
//! ([`Flows::check_handed`]), against the pod's ingress program. A flow
//! between two pods of different workers thus has one entry in each
//! worker's table, each with its own pod's program. A pod's flows with the
//! uplink and the host port live on its flow home ([`Flows::set_flow_home`]:
//! a veth pod's owner, a TAP pod's first queue; other workers hand such
//! packets there); a TAP pod's flows with the node's other pods live on
//! one worker chosen alike for both directions ([`Flows::pair_home`]),
//! since its kernel may send a flow's packets on any worker's queue.
//!
//! Decisions: a new flow is classified (egress of the source pod, then
//! ingress of the destination pod: both must allow); allowed flows are
//! tracked, replies and later packets pass on the entry; a newer generation
//! of either pod's program revalidates the flow on its next packet. Drops:
//! `policy_denied`, `conntrack_full` (a new allowed flow the full table
//! cannot hold: never a silent pass, logged at most every 10 s),
//! `conntrack_invalid` (out-of-state TCP, an ICMP error about no flow, a
//! non-first fragment or a truncated L4 header of a policed pod).

mod parse;
mod rules;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brindle_policy::classify::{PolicyState, Verdict, classify};
use brindle_policy::conntrack::{ConnTable, Outcome, Seen, Stats, Timeouts, tcp_flags};
use brindle_policy::program::{Direction, EndpointKey, Update};

pub use brindle_policy::classify::ApplyError;
pub use rules::{Counts, RuleKey, sum_rules};

use crate::counters::DropReason;
use crate::frame::PortId;

/// Flows a worker's table holds by default (2^17 slots at 73 bytes: about
/// 9.6 MiB per worker, allocated when the first flow is tracked).
pub const DEFAULT_FLOWS_PER_WORKER: usize = 100_000;

/// The flow's mark bit: its first packet entered from the host port.
pub const MARK_FROM_HOST: u8 = 1;

/// What the pipeline learns of a flow from [`Flows::check`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// The packet goes the reply way of a tracked flow.
    pub reply: bool,
    /// The flow's first packet entered from the host port (its replies go
    /// back to the kernel, which undoes kube-proxy's DNAT).
    pub from_host: bool,
}

/// One port slot's policy identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PortPolicy {
    /// The pod's workload (K8S_POD_NAMESPACE/K8S_POD_NAME).
    key: Option<EndpointKey>,
    /// Its program's generation (0: no program, not policed).
    generation: u64,
    /// It has a program.
    policed: bool,
}

/// The policy the workers enforce: immutable, shared by `Arc`.
#[derive(Clone, Debug, Default)]
pub struct PolicyView {
    state: PolicyState,
    /// Added to the state's generations: a snapshot that replaces the
    /// state (a controller that restarted counts from 1 again) starts
    /// above every generation flows may carry, so they all revalidate.
    base: u64,
    workloads: Vec<Option<EndpointKey>>,
    ports: Vec<PortPolicy>,
    /// Track every flow through a pod port (on once any program exists; a
    /// host port turns tracking on in the pipeline too).
    track: bool,
}

impl PolicyView {
    /// No policy, no workloads: nothing policed, nothing tracked.
    pub fn new() -> PolicyView {
        PolicyView::default()
    }

    /// The policy state.
    pub fn state(&self) -> &PolicyState {
        &self.state
    }

    /// The policy generation applied (the controller's).
    pub fn generation(&self) -> u64 {
        self.state.generation()
    }

    /// The generation flows are stamped with: the controller's plus this
    /// vrouter's offset for replaced states.
    fn stamp(&self, generation: u64) -> u64 {
        self.base.saturating_add(generation)
    }

    /// This view with `update` applied (all of it, or the error and no
    /// change).
    pub fn with_update(&self, update: &Update) -> Result<PolicyView, ApplyError> {
        let mut state = self.state.clone();
        state.apply(update)?;
        Ok(self.rebuilt(state, self.base, self.workloads.clone()))
    }

    /// This view with the whole state replaced by `snapshot` (a
    /// `Compiler::snapshot()`, applied to an empty state; generation 0 is
    /// the empty state). Every flow revalidates at its next packet.
    pub fn with_snapshot(&self, snapshot: &Update) -> Result<PolicyView, ApplyError> {
        let mut state = PolicyState::default();
        if snapshot.generation > 0 || !snapshot.is_empty() {
            state.apply(snapshot)?;
        }
        let base = self.stamp(self.state.generation()).saturating_add(1);
        Ok(self.rebuilt(state, base, self.workloads.clone()))
    }

    /// This view with port slot `port`'s workload set (`None`: not a pod
    /// with a workload, never policed).
    pub fn with_workload(&self, port: PortId, key: Option<EndpointKey>) -> PolicyView {
        let mut v = self.clone();
        v.set_workload(port, key);
        v
    }

    /// Sets port slot `port`'s workload in place.
    pub fn set_workload(&mut self, port: PortId, key: Option<EndpointKey>) {
        let i = usize::from(port);
        if self.workloads.len() <= i {
            self.workloads.resize(i + 1, None);
        }
        if self.workloads[i] == key {
            return;
        }
        self.workloads[i] = key;
        self.ports = Self::port_table(&self.state, self.base, &self.workloads);
    }

    /// Port slots the view knows (with a workload or not).
    pub fn slots(&self) -> usize {
        self.workloads.len()
    }

    /// The workload of a port slot.
    pub fn workload(&self, port: PortId) -> Option<&EndpointKey> {
        self.workloads.get(usize::from(port))?.as_ref()
    }

    fn port_table(
        state: &PolicyState,
        base: u64,
        workloads: &[Option<EndpointKey>],
    ) -> Vec<PortPolicy> {
        workloads
            .iter()
            .map(|k| {
                let ep = k.as_ref().and_then(|k| state.endpoint(k));
                PortPolicy {
                    key: k.clone(),
                    generation: ep.map_or(base, |e| base.saturating_add(e.generation)),
                    policed: ep.is_some(),
                }
            })
            .collect()
    }

    fn rebuilt(
        &self,
        state: PolicyState,
        base: u64,
        workloads: Vec<Option<EndpointKey>>,
    ) -> PolicyView {
        let ports = Self::port_table(&state, base, &workloads);
        let track = state.endpoints() > 0;
        PolicyView {
            state,
            base,
            workloads,
            ports,
            track,
        }
    }

    #[inline]
    fn port(&self, port: Option<PortId>) -> Option<&PortPolicy> {
        self.ports.get(usize::from(port?)).filter(|p| p.policed)
    }

    /// The verdict for a packet in a flow's original direction: the
    /// source pod's egress program, then the destination pod's ingress
    /// program (either absent: allowed on that side). `sides` gets what
    /// each side classified (egress, ingress), for the rule counters.
    fn verdict(
        &self,
        src: Option<&PortPolicy>,
        dst: Option<&PortPolicy>,
        pkt: &brindle_policy::classify::Packet,
        log: &mut LogLimit,
        sides: &mut [Option<Verdict>; 2],
    ) -> Verdict {
        let sets = self.state.sets();
        let mut side = |p: Option<&PortPolicy>, dir| {
            let key = p.and_then(|p| p.key.as_ref())?;
            let ep = self.state.endpoint(key)?;
            let v = classify(&ep.program, dir, sets, pkt);
            if let Some((tier, rule)) = v.logged {
                log.line(key, &ep.program, dir, tier, rule, v.allow, pkt);
            }
            Some(v)
        };
        let egress = side(src, Direction::Egress);
        sides[0] = egress;
        if let Some(v) = egress
            && !v.allow
        {
            return v;
        }
        let ingress = side(dst, Direction::Ingress);
        sides[1] = ingress;
        ingress.or(egress).unwrap_or(Verdict::NO_POLICY)
    }
}

/// Calico's `Log` action: a line per classified packet that met a Log
/// rule, at most [`LogLimit::PER_SECOND`] a second per worker (the rest
/// counted and reported with the next line).
#[derive(Debug, Default)]
pub struct LogLimit {
    now_ns: u64,
    window: u64,
    lines: u32,
    suppressed: u64,
}

impl LogLimit {
    /// Lines a worker writes per second at most.
    pub const PER_SECOND: u32 = 10;

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn line(
        &mut self,
        key: &EndpointKey,
        program: &brindle_policy::program::Program,
        dir: Direction,
        tier: u16,
        rule: u32,
        allow: bool,
        pkt: &brindle_policy::classify::Packet,
    ) {
        let window = self.now_ns / 1_000_000_000;
        if window != self.window {
            self.window = window;
            self.lines = 0;
        }
        if self.lines >= Self::PER_SECOND {
            self.suppressed += 1;
            return;
        }
        self.lines += 1;
        // Taken here: the macro evaluates its fields only when enabled.
        let suppressed = std::mem::take(&mut self.suppressed);
        let (policy, index) = program
            .rule_of(dir, tier, rule)
            .map_or((String::new(), 0), |(p, i)| (p.to_string(), i));
        tracing::info!(
            endpoint = %key,
            direction = ?dir,
            policy,
            rule = index,
            allowed = allow,
            src = %pkt.src,
            dst = %pkt.dst,
            protocol = pkt.protocol,
            src_port = pkt.src_port,
            dst_port = pkt.dst_port,
            suppressed,
            "policy log"
        );
    }
}

// ===== publishing =====

struct Shared {
    version: AtomicU64,
    view: Mutex<Arc<PolicyView>>,
}

/// The control thread's end: publishes views to every [`PolicyReader`].
#[derive(Clone)]
pub struct PolicyCell {
    shared: Arc<Shared>,
}

impl Default for PolicyCell {
    fn default() -> Self {
        PolicyCell::new()
    }
}

impl PolicyCell {
    /// A cell holding an empty view.
    pub fn new() -> PolicyCell {
        PolicyCell {
            shared: Arc::new(Shared {
                version: AtomicU64::new(0),
                view: Mutex::new(Arc::new(PolicyView::new())),
            }),
        }
    }

    /// The view published last.
    pub fn current(&self) -> Arc<PolicyView> {
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Publishes `view`: workers take it at their next batch.
    pub fn publish(&self, view: impl Into<Arc<PolicyView>>) {
        let mut v = self.shared.view.lock().unwrap_or_else(|e| e.into_inner());
        *v = view.into();
        self.shared.version.fetch_add(1, Ordering::Release);
    }

    /// A reader for one worker.
    pub fn reader(&self) -> PolicyReader {
        PolicyReader {
            shared: self.shared.clone(),
            seen: u64::MAX,
            view: Arc::new(PolicyView::new()),
        }
    }
}

/// A worker's end: the view as of its last [`PolicyReader::refresh`].
pub struct PolicyReader {
    shared: Arc<Shared>,
    seen: u64,
    view: Arc<PolicyView>,
}

impl PolicyReader {
    /// Takes the newest view if one was published since the last call
    /// (one atomic load when nothing changed).
    #[inline]
    pub fn refresh(&mut self) {
        let v = self.shared.version.load(Ordering::Acquire);
        if v != self.seen {
            self.view = self
                .shared
                .view
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            self.seen = v;
        }
    }
}

// ===== the per-worker flow table =====

/// Counters of one worker's flow table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// The connection table's own counters (tracked, new, revalidated,
    /// denied, related, invalid, full, expired).
    pub table: Stats,
    /// Flows tracked now (expired ones included until swept).
    pub flows: u64,
    /// The policy generation this worker enforces.
    pub generation: u64,
    /// Packets passed on the batch's last flow without a table lookup
    /// (not in `table.tracked`).
    pub batched: u64,
}

/// The last flow a batch passed: the next packet of the same flow, the
/// same way, with the same TCP flags (no SYN, FIN or RST), would change
/// nothing in its entry (same time, same state: Linux's ACK transitions
/// are idempotent), so it passes without a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LastFlow {
    seen: Seen,
    src: Option<PortId>,
    dst: Option<PortId>,
    from_host: bool,
    flow: Flow,
}

/// One worker's flow table and its view of the policy.
pub struct Flows {
    reader: Option<PolicyReader>,
    view: Arc<PolicyView>,
    table: Option<ConnTable>,
    capacity: usize,
    /// Port slots owned by another worker (their pods are checked there).
    remote: Vec<bool>,
    /// Per port slot: the worker that keeps the pod's flows with the
    /// uplink and the host port when that is another one; `u16::MAX`: this
    /// worker (or not a pod port).
    homes: Vec<u16>,
    /// Per port slot: a pod port with a part on every worker (a TAP pod's
    /// queues), whose frames any worker may read.
    spread: Vec<bool>,
    /// Track flows even without policy (a host port is configured).
    host_port: bool,
    epoch: Instant,
    now_ns: u64,
    last_sweep: u64,
    last_full_log: Option<Instant>,
    last: Option<LastFlow>,
    batched: u64,
    log: LogLimit,
    rules: rules::RuleCounters,
}

impl Default for Flows {
    fn default() -> Self {
        Flows::new()
    }
}

impl Flows {
    /// No policy, no table yet.
    pub fn new() -> Flows {
        Flows {
            reader: None,
            view: Arc::new(PolicyView::new()),
            table: None,
            capacity: DEFAULT_FLOWS_PER_WORKER,
            remote: Vec::new(),
            homes: Vec::new(),
            spread: Vec::new(),
            host_port: false,
            epoch: Instant::now(),
            now_ns: 0,
            last_sweep: 0,
            last_full_log: None,
            last: None,
            batched: 0,
            log: LogLimit::default(),
            rules: rules::RuleCounters::default(),
        }
    }

    /// Reads the policy published in `cell`'s readers from now on.
    pub fn set_reader(&mut self, reader: PolicyReader) {
        self.reader = Some(reader);
    }

    /// Uses `view` directly (tests, benchmarks; a reader's next refresh
    /// replaces it).
    pub fn set_view(&mut self, view: Arc<PolicyView>) {
        self.rules.fold(&self.view, &view);
        self.view = view;
    }

    /// Takes the newest published view, if any (what every batch does
    /// first; the worker also calls it before a snapshot, so an idle
    /// worker's counters are named against the policy in force).
    #[inline]
    pub fn refresh_view(&mut self) {
        if let Some(r) = &mut self.reader {
            r.refresh();
            if !Arc::ptr_eq(&r.view, &self.view) {
                // Positions counted so far are named by the view left.
                self.rules.fold(&self.view, &r.view);
                self.view = r.view.clone();
            }
        }
    }

    /// The per-rule counters (see `rules`), by name.
    pub fn rule_counts(&self) -> Vec<(RuleKey, Counts)> {
        self.rules.snapshot(&self.view)
    }

    /// The view in force.
    pub fn view(&self) -> &PolicyView {
        &self.view
    }

    /// Sets the table's capacity (before its first flow; a table in use
    /// is replaced, empty).
    pub fn set_capacity(&mut self, flows: usize) {
        self.capacity = flows.max(1);
        if self.table.is_some() {
            self.table = Some(ConnTable::new(self.capacity, Timeouts::default()));
        }
    }

    /// Marks slot `port` as owned by another worker (or not).
    pub fn set_remote(&mut self, port: PortId, remote: bool) {
        let i = usize::from(port);
        if self.remote.len() <= i {
            self.remote.resize(i + 1, false);
        }
        self.remote[i] = remote;
    }

    /// Says that the flows of the pod in slot `port` with the uplink and
    /// the host port are kept by worker `home` (`None`: by this worker),
    /// so that both directions of such a flow meet one table: the uplink's
    /// RSS and the host port's queues pick workers of their own, not the
    /// pod's (`Pipeline::keeper`).
    pub fn set_flow_home(&mut self, port: PortId, home: Option<usize>) {
        let i = usize::from(port);
        if self.homes.len() <= i {
            self.homes.resize(i + 1, u16::MAX);
        }
        self.homes[i] = home.and_then(|h| u16::try_from(h).ok()).unwrap_or(u16::MAX);
    }

    /// Says that the pod port in slot `port` has a part on every worker (a
    /// TAP pod: one queue each), so any worker may read its frames (or
    /// not: a veth pod, read by its owner only).
    pub fn set_spread(&mut self, port: PortId, spread: bool) {
        let i = usize::from(port);
        if self.spread.len() <= i {
            self.spread.resize(i + 1, false);
        }
        self.spread[i] = spread;
    }

    /// Whether the pod port in slot `port` has a part on every worker
    /// ([`Flows::set_spread`]).
    #[inline]
    pub fn is_spread(&self, port: PortId) -> bool {
        self.spread.get(usize::from(port)).copied().unwrap_or(false)
    }

    /// The worker that keeps the flows between the local pods `a` and `b`
    /// when it is another one: the same for both directions (so a flow's
    /// packets meet one table whichever queue of a TAP pod the kernel
    /// picks). Two TAP pods: the flow home of the lower slot; a TAP pod
    /// and a veth pod: the veth pod's owner; two veth pods: none (each
    /// owner reads its own pod's frames and checks the other's when they
    /// are handed to it).
    #[inline]
    pub fn pair_home(&self, a: PortId, b: PortId) -> Option<usize> {
        match (self.is_spread(a), self.is_spread(b)) {
            (true, true) => self.flow_home(a.min(b)),
            (true, false) => self.flow_home(b),
            (false, true) => self.flow_home(a),
            (false, false) => None,
        }
    }

    /// The worker that keeps the uplink and host-port flows of the pod in
    /// slot `port`, when it is another one ([`Flows::set_flow_home`]).
    #[inline]
    pub fn flow_home(&self, port: PortId) -> Option<usize> {
        match self.homes.get(usize::from(port)) {
            Some(&h) if h != u16::MAX => Some(usize::from(h)),
            _ => None,
        }
    }

    /// The counters.
    pub fn stats(&self) -> FlowStats {
        FlowStats {
            table: self.table.as_ref().map(|t| t.stats()).unwrap_or_default(),
            flows: self.table.as_ref().map_or(0, |t| t.len() as u64),
            generation: self.view.generation(),
            batched: self.batched,
        }
    }

    /// Once per batch: the newest policy view, the clock, whether a host
    /// port exists (flows are then always tracked, for their "from host"
    /// mark), and about once a second the expiry sweep.
    #[inline]
    pub fn begin_batch(&mut self, now: Instant, host_port: bool) {
        self.host_port = host_port;
        self.last = None;
        self.refresh_view();
        self.now_ns = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        if self.now_ns.saturating_sub(self.last_sweep) >= 1_000_000_000 {
            self.last_sweep = self.now_ns;
            if let Some(t) = &mut self.table {
                t.sweep(self.now_ns);
            }
        }
    }

    /// Whether flows are tracked at all (a policy exists, or a host
    /// port): when not, [`Flows::check`] passes everything untouched.
    #[inline]
    pub fn tracking(&self) -> bool {
        self.view.track || self.host_port
    }

    /// Whether port slot `port` belongs to another worker.
    #[inline]
    pub fn is_remote(&self, port: PortId) -> bool {
        self.remote.get(usize::from(port)).copied().unwrap_or(false)
    }

    /// The hook for a routed packet (`ip`: its IP header to its end):
    /// `src_pod` is the pod it comes from (the ingress port, or for a
    /// packet from the host port a local pod by its source address),
    /// `dst_pod` the pod the route leads to, `from_host` whether it
    /// entered from the host port. A destination pod owned by another
    /// worker is left to that worker ([`Flows::check_handed`]); a source
    /// pod owned by another worker (only possible from the host port) is
    /// not tracked here.
    #[inline]
    pub fn check(
        &mut self,
        ip: &[u8],
        v6: bool,
        src_pod: Option<PortId>,
        dst_pod: Option<PortId>,
        from_host: bool,
    ) -> Result<Flow, DropReason> {
        if !self.tracking() {
            return Ok(Flow::default());
        }
        let src_pod = src_pod.filter(|p| !self.is_remote(*p));
        let dst_pod = dst_pod.filter(|p| !self.is_remote(*p));
        if src_pod.is_none() && dst_pod.is_none() {
            return Ok(Flow::default());
        }
        self.track(ip, v6, src_pod, dst_pod, from_host)
    }

    /// Whether this worker's table tracks the flow of the IP packet `ip`
    /// (no change to the entry).
    pub fn tracks(&self, ip: &[u8], v6: bool) -> bool {
        let Some(table) = &self.table else {
            return false;
        };
        let seen = if v6 {
            parse::seen_v6(ip)
        } else {
            parse::seen_v4(ip)
        };
        seen.is_some_and(|s| {
            let t = match &s.quoted {
                // An ICMP error belongs to the flow it quotes.
                Some(q) => q,
                None => &s.tuple,
            };
            table.contains(t, self.now_ns)
        })
    }

    /// The hook for a frame another worker handed over for this worker's
    /// pod port `port` (`frame`: Ethernet header first, as the pipeline
    /// wrote it: untagged, 14 bytes).
    pub fn check_handed(
        &mut self,
        frame: &[u8],
        port: PortId,
        from_host: bool,
    ) -> Result<Flow, DropReason> {
        if !self.tracking() {
            return Ok(Flow::default());
        }
        let Some(ip) = frame.get(14..) else {
            return Err(DropReason::ParseError);
        };
        let v6 = match u16::from_be_bytes([frame[12], frame[13]]) {
            0x0800 => false,
            0x86dd => true,
            // The pipeline hands over only IP (ARP replies leave by the
            // port they came in).
            _ => return Ok(Flow::default()),
        };
        self.track(ip, v6, None, Some(port), from_host)
    }

    #[inline(never)]
    fn track(
        &mut self,
        ip: &[u8],
        v6: bool,
        src_pod: Option<PortId>,
        dst_pod: Option<PortId>,
        from_host: bool,
    ) -> Result<Flow, DropReason> {
        let view = &*self.view;
        let src = view.port(src_pod);
        let dst = view.port(dst_pod);
        let seen: Option<Seen> = if v6 {
            parse::seen_v6(ip)
        } else {
            parse::seen_v4(ip)
        };
        let Some(seen) = seen else {
            // Nothing to track by: refused only where a policy applies.
            return if src.is_some() || dst.is_some() {
                Err(DropReason::ConntrackInvalid)
            } else {
                Ok(Flow::default())
            };
        };
        if let Some(l) = &self.last
            && l.seen == seen
            && l.src == src_pod
            && l.dst == dst_pod
            && l.from_host == from_host
        {
            self.batched += 1;
            return Ok(l.flow);
        }
        let generation = src
            .map_or(0, |p| p.generation)
            .max(dst.map_or(0, |p| p.generation));
        let capacity = self.capacity;
        let table = self
            .table
            .get_or_insert_with(|| ConnTable::new(capacity, Timeouts::default()));
        let mark = if from_host { MARK_FROM_HOST } else { 0 };
        let log = &mut self.log;
        log.now_ns = self.now_ns;
        let mut sides = [None; 2];
        let mut swapped = false;
        let (outcome, mark) = table.process_marked(&seen, self.now_ns, generation, mark, |pkt| {
            // A reply revalidated: the table hands the flow's original
            // direction, whose source is this packet's destination pod.
            swapped = pkt.src != seen.tuple.src
                || pkt.dst != seen.tuple.dst
                || (pkt.icmp.is_none() && pkt.src_port != seen.tuple.src_port);
            if swapped {
                view.verdict(dst, src, pkt, log, &mut sides)
            } else {
                view.verdict(src, dst, pkt, log, &mut sides)
            }
        });
        if sides.iter().any(Option::is_some) {
            let (from, to) = if swapped {
                (dst_pod, src_pod)
            } else {
                (src_pod, dst_pod)
            };
            let denied = matches!(outcome, Outcome::Denied(_));
            let counted = denied || matches!(outcome, Outcome::New(_) | Outcome::Revalidated(_));
            let ports = [(from, Direction::Egress), (to, Direction::Ingress)];
            for (v, (port, direction)) in sides.iter().zip(ports) {
                if let (Some(v), Some(port)) = (v, port)
                    && counted
                    && (!denied || !v.allow)
                {
                    self.rules.count(
                        rules::Hit {
                            port,
                            direction,
                            decision: v.decision,
                            allow: v.allow,
                        },
                        ip.len(),
                    );
                }
            }
        }
        let flow = Flow {
            reply: matches!(outcome, Outcome::Tracked { reply: true }),
            from_host: mark & MARK_FROM_HOST != 0,
        };
        match outcome {
            Outcome::Tracked { .. } | Outcome::New(_) | Outcome::Revalidated(_) => {
                let repeatable = seen.quoted.is_none()
                    && (seen.tuple.protocol != 6
                        || seen.tcp_flags & (tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST)
                            == 0);
                self.last = repeatable.then_some(LastFlow {
                    seen,
                    src: src_pod,
                    dst: dst_pod,
                    from_host,
                    flow,
                });
                Ok(flow)
            }
            Outcome::Related => Ok(Flow {
                reply: true,
                ..flow
            }),
            Outcome::Denied(_) => Err(DropReason::PolicyDenied),
            Outcome::Invalid => Err(DropReason::ConntrackInvalid),
            Outcome::Full => {
                self.log_full();
                Err(DropReason::ConntrackFull)
            }
        }
    }

    #[cold]
    fn log_full(&mut self) {
        let now = Instant::now();
        if self
            .last_full_log
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
        {
            self.last_full_log = Some(now);
            tracing::warn!(
                capacity = self.capacity,
                refused = self.table.as_ref().map_or(0, |t| t.stats().full),
                "connection table full: new flows dropped (conntrack_full)"
            );
        }
    }
}

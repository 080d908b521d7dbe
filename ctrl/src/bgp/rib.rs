//! Routing tables: Adj-RIB-In per peer, the Loc-RIB with best-path
//! selection, and Adj-RIB-Out per peer; route reflection (RFC 4456) and
//! iBGP split horizon decide what goes out.
//!
//! Pure data structures: the speaker feeds in decoded UPDATEs and session
//! events, and takes out [`RouteChange`]s for the dataplane and UPDATEs to
//! send.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;

use super::packet::{
    AFI_IPV4, AFI_IPV6, AsPath, Attrs, MpReach, MpUnreach, Origin, SAFI_UNICAST, UpdateMsg,
};

/// Well-known communities (RFC 1997).
pub const NO_EXPORT: u32 = 0xffff_ff01;
pub const NO_ADVERTISE: u32 = 0xffff_ff02;
/// LOCAL_PREF assumed when none is set.
pub const DEFAULT_LOCAL_PREF: u32 = 100;

/// Where a path came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Source {
    /// Announced by this node.
    Local,
    /// Learned from the peer with this address.
    Peer(IpAddr),
}

/// An established peer as the RIB needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub addr: IpAddr,
    pub remote_as: u32,
    pub router_id: Ipv4Addr,
    /// We reflect routes to this peer as its route reflector (RFC 4456).
    pub rr_client: bool,
    /// Our address on the session: the next hop we announce.
    pub local_v4: Option<Ipv4Addr>,
    /// Our IPv6 next hop for IPv6 routes.
    pub local_v6: Option<Ipv6Addr>,
    /// Families negotiated with the peer.
    pub families: Vec<(u16, u8)>,
}

/// One candidate path for a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    pub source: Source,
    pub next_hop: IpAddr,
    pub attrs: Arc<Attrs>,
    /// Router ID of the peer it came from (ours for local paths).
    pub peer_router_id: Ipv4Addr,
    pub ebgp: bool,
    /// Kept for a restarting peer (RFC 4724) until it refreshes it.
    pub stale: bool,
}

impl Path {
    fn local_pref(&self) -> u32 {
        self.attrs.local_pref.unwrap_or(DEFAULT_LOCAL_PREF)
    }
}

/// A change of the best route of a prefix learned from a peer: what the
/// daemon programs into the dataplane. Local routes never appear.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum RouteChange {
    Added(BestRoute),
    Changed(BestRoute),
    Removed { prefix: IpNet },
}

/// The best route of a prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BestRoute {
    pub prefix: IpNet,
    pub next_hop: IpAddr,
    /// The peer it was learned from.
    pub peer: IpAddr,
    pub as_path: Vec<u32>,
}

/// A row of the route table snapshot (`brindlectl bgp routes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteEntry {
    pub prefix: IpNet,
    pub next_hop: IpAddr,
    pub source: Source,
    pub as_path: Vec<u32>,
    pub local_pref: u32,
    pub med: Option<u32>,
    pub best: bool,
    pub stale: bool,
}

/// Why an UPDATE from a peer was refused as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPrefixExceeded {
    pub afi: u16,
    pub safi: u8,
    pub limit: u32,
}

/// A route as sent to one peer (Adj-RIB-Out).
#[derive(Clone, Debug, PartialEq, Eq)]
struct OutRoute {
    attrs: Arc<Attrs>,
    next_hop: IpAddr,
}

/// All three tables of the speaker.
#[derive(Debug)]
pub struct Rib {
    local_as: u32,
    router_id: Ipv4Addr,
    cluster_id: Ipv4Addr,
    peers: HashMap<IpAddr, PeerInfo>,
    /// Adj-RIB-In: which prefixes each peer announced (their paths live in
    /// the Loc-RIB candidates, so they are stored once).
    adj_in: HashMap<IpAddr, HashSet<IpNet>>,
    /// Loc-RIB: candidates per prefix, best first.
    loc: HashMap<IpNet, Vec<Path>>,
    adj_out: HashMap<IpAddr, HashMap<IpNet, OutRoute>>,
    /// Prefixes whose best path changed since the last `take_dirty`.
    dirty: Vec<IpNet>,
    dirty_set: HashSet<IpNet>,
    changes: Vec<RouteChange>,
}

fn family_of(p: &IpNet) -> (u16, u8) {
    match p {
        IpNet::V4(_) => (AFI_IPV4, SAFI_UNICAST),
        IpNet::V6(_) => (AFI_IPV6, SAFI_UNICAST),
    }
}

/// RFC 4271 §9.1.2.2 plus the usual tie breakers: true if `a` is better.
fn better(a: &Path, b: &Path) -> bool {
    use std::cmp::Ordering::*;
    let cmp = b
        .local_pref()
        .cmp(&a.local_pref())
        .then_with(|| (b.source == Source::Local).cmp(&(a.source == Source::Local)))
        .then_with(|| {
            let la = a.attrs.as_path.as_ref().map_or(0, AsPath::path_len);
            let lb = b.attrs.as_path.as_ref().map_or(0, AsPath::path_len);
            la.cmp(&lb)
        })
        .then_with(|| {
            let oa = a.attrs.origin.unwrap_or(Origin::Incomplete);
            let ob = b.attrs.origin.unwrap_or(Origin::Incomplete);
            oa.cmp(&ob)
        })
        .then_with(|| {
            // MED only between paths from the same neighbouring AS.
            let na = a.attrs.as_path.as_ref().and_then(AsPath::first_as);
            let nb = b.attrs.as_path.as_ref().and_then(AsPath::first_as);
            if na == nb {
                a.attrs.med.unwrap_or(0).cmp(&b.attrs.med.unwrap_or(0))
            } else {
                Equal
            }
        })
        .then_with(|| b.ebgp.cmp(&a.ebgp))
        .then_with(|| {
            // RFC 4456 §9: the ORIGINATOR_ID stands in for the router ID.
            let ia = a.attrs.originator_id.unwrap_or(a.peer_router_id);
            let ib = b.attrs.originator_id.unwrap_or(b.peer_router_id);
            u32::from(ia).cmp(&u32::from(ib))
        })
        .then_with(|| a.attrs.cluster_list.len().cmp(&b.attrs.cluster_list.len()))
        .then_with(|| source_addr(a).cmp(&source_addr(b)));
    cmp == Less
}

fn source_addr(p: &Path) -> Option<IpAddr> {
    match p.source {
        Source::Local => None,
        Source::Peer(a) => Some(a),
    }
}

fn as_list(p: &Path) -> Vec<u32> {
    p.attrs
        .as_path
        .as_ref()
        .map(|ap| {
            ap.segments
                .iter()
                .flat_map(|s| s.asns.iter().copied())
                .collect()
        })
        .unwrap_or_default()
}

fn best_route(prefix: IpNet, p: &Path) -> Option<BestRoute> {
    match p.source {
        Source::Local => None,
        Source::Peer(peer) => Some(BestRoute {
            prefix,
            next_hop: p.next_hop,
            peer,
            as_path: as_list(p),
        }),
    }
}

impl Rib {
    pub fn new(local_as: u32, router_id: Ipv4Addr, cluster_id: Option<Ipv4Addr>) -> Self {
        Self {
            local_as,
            router_id,
            cluster_id: cluster_id.unwrap_or(router_id),
            peers: HashMap::new(),
            adj_in: HashMap::new(),
            loc: HashMap::new(),
            adj_out: HashMap::new(),
            dirty: Vec::new(),
            dirty_set: HashSet::new(),
            changes: Vec::new(),
        }
    }

    /// A session came up: the peer receives routes from now on.
    pub fn peer_up(&mut self, info: PeerInfo) {
        self.adj_out.insert(info.addr, HashMap::new());
        self.peers.insert(info.addr, info);
    }

    /// A session went down. With `graceful` the peer's routes stay, marked
    /// stale, until [`Rib::end_of_rib`] or [`Rib::remove_stale`].
    pub fn peer_down(&mut self, addr: IpAddr, graceful: bool) {
        self.peers.remove(&addr);
        self.adj_out.remove(&addr);
        let prefixes: Vec<IpNet> = self
            .adj_in
            .get(&addr)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        if graceful {
            for p in prefixes {
                if let Some(paths) = self.loc.get_mut(&p) {
                    paths
                        .iter_mut()
                        .filter(|x| x.source == Source::Peer(addr))
                        .for_each(|x| x.stale = true);
                }
            }
        } else {
            self.adj_in.remove(&addr);
            for p in prefixes {
                self.remove_path(p, Source::Peer(addr));
            }
        }
    }

    /// Removes the stale routes of `addr` in `family` (all families if
    /// `None`): End-of-RIB received, or the restart time ran out.
    pub fn remove_stale(&mut self, addr: IpAddr, family: Option<(u16, u8)>) {
        let Some(set) = self.adj_in.get(&addr) else {
            return;
        };
        let stale: Vec<IpNet> = set
            .iter()
            .filter(|p| family.is_none_or(|f| family_of(p) == f))
            .filter(|p| {
                self.loc.get(p).is_some_and(|paths| {
                    paths
                        .iter()
                        .any(|x| x.source == Source::Peer(addr) && x.stale)
                })
            })
            .copied()
            .collect();
        for p in stale {
            if let Some(s) = self.adj_in.get_mut(&addr) {
                s.remove(&p);
            }
            self.remove_path(p, Source::Peer(addr));
        }
    }

    /// End-of-RIB from a peer (RFC 4724 §4.2): its stale routes of that
    /// family were not refreshed, so they go.
    pub fn end_of_rib(&mut self, addr: IpAddr, family: (u16, u8)) {
        self.remove_stale(addr, Some(family));
    }

    /// Prefixes the peer announced (its Adj-RIB-In).
    pub fn prefixes_in(&self, addr: IpAddr) -> usize {
        self.adj_in.get(&addr).map_or(0, HashSet::len)
    }

    /// Prefixes we announce to the peer (its Adj-RIB-Out).
    pub fn prefixes_out(&self, addr: IpAddr) -> usize {
        self.adj_out.get(&addr).map_or(0, HashMap::len)
    }

    /// Announces a prefix of this node.
    pub fn announce_local(&mut self, prefix: IpNet, next_hop: IpAddr) {
        let attrs = Attrs {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::default()),
            ..Default::default()
        };
        let path = Path {
            source: Source::Local,
            next_hop,
            attrs: Arc::new(attrs),
            peer_router_id: self.router_id,
            ebgp: false,
            stale: false,
        };
        self.insert_path(prefix.trunc(), path);
    }

    pub fn withdraw_local(&mut self, prefix: IpNet) {
        self.remove_path(prefix.trunc(), Source::Local);
    }

    /// Applies an UPDATE from an established peer. `max_prefixes` is
    /// checked after applying; on excess the caller tears the session down
    /// (which removes the routes).
    pub fn update_from_peer(
        &mut self,
        addr: IpAddr,
        msg: &UpdateMsg,
        max_prefixes: Option<u32>,
    ) -> Result<(), MaxPrefixExceeded> {
        let Some(peer) = self.peers.get(&addr).cloned() else {
            return Ok(());
        };
        for w in &msg.withdrawn {
            self.withdraw_from(addr, IpNet::V4(*w));
        }
        if let Some(u) = &msg.mp_unreach {
            for w in &u.withdrawn {
                self.withdraw_from(addr, *w);
            }
        }
        let announced = msg
            .nlri
            .iter()
            .map(|n| {
                (
                    IpNet::V4(*n),
                    msg.attrs.as_ref().and_then(|a| a.next_hop).map(IpAddr::V4),
                )
            })
            .chain(
                msg.mp_reach
                    .iter()
                    .flat_map(|r| r.nlri.iter().map(move |n| (*n, Some(r.next_hop)))),
            );
        // RFC 7606 treat-as-withdraw, and the loop checks of RFC 4271 §9.1.2
        // and RFC 4456 §8: every announced prefix becomes a withdrawal.
        let attrs = match (&msg.attrs, &msg.treat_as_withdraw) {
            (Some(a), None) if self.accept(&peer, a) => Some(self.import_attrs(&peer, a)),
            _ => None,
        };
        for (prefix, next_hop) in announced {
            match (&attrs, next_hop) {
                (Some(a), Some(nh)) => {
                    let path = Path {
                        source: Source::Peer(addr),
                        next_hop: nh,
                        attrs: a.clone(),
                        peer_router_id: peer.router_id,
                        ebgp: peer.remote_as != self.local_as,
                        stale: false,
                    };
                    self.adj_in.entry(addr).or_default().insert(prefix);
                    self.insert_path(prefix, path);
                }
                _ => self.withdraw_from(addr, prefix),
            }
        }
        if let Some(limit) = max_prefixes
            && self.prefixes_in(addr) > limit as usize
        {
            let (afi, safi) = msg
                .mp_reach
                .as_ref()
                .map(|r| (r.afi, r.safi))
                .unwrap_or((AFI_IPV4, SAFI_UNICAST));
            return Err(MaxPrefixExceeded { afi, safi, limit });
        }
        Ok(())
    }

    fn accept(&self, peer: &PeerInfo, a: &Attrs) -> bool {
        let ibgp = peer.remote_as == self.local_as;
        if !ibgp {
            let path = a.effective_as_path();
            // Our own AS: a loop. RFC 4271 §6.3: an eBGP peer's path must
            // start with its AS (RFC 7606 §7.2: treat-as-withdraw).
            if path.contains(self.local_as) || path.first_as() != Some(peer.remote_as) {
                return false;
            }
        }
        // RFC 4456 §8: our own route reflected back.
        if a.originator_id == Some(self.router_id) || a.cluster_list.contains(&self.cluster_id) {
            return false;
        }
        true
    }

    fn import_attrs(&self, peer: &PeerInfo, a: &Attrs) -> Arc<Attrs> {
        let mut a = a.clone();
        // The real path on a 2-octet session (RFC 6793).
        if let Some(p4) = a.as4_path.take() {
            a.as_path = Some(a.as_path.unwrap_or_default().merge_as4(&p4));
        }
        if peer.remote_as != self.local_as {
            // LOCAL_PREF is not taken from outside the AS (RFC 4271 §5.1.5).
            a.local_pref = None;
        }
        // The next hop lives in `Path`; MP_REACH carried it for IPv6.
        a.next_hop = None;
        Arc::new(a)
    }

    fn withdraw_from(&mut self, addr: IpAddr, prefix: IpNet) {
        if let Some(s) = self.adj_in.get_mut(&addr)
            && s.remove(&prefix)
        {
            self.remove_path(prefix, Source::Peer(addr));
        }
    }

    fn insert_path(&mut self, prefix: IpNet, path: Path) {
        let paths = self.loc.entry(prefix).or_default();
        let old_best = paths.first().cloned();
        paths.retain(|p| p.source != path.source);
        let pos = paths
            .iter()
            .position(|p| better(&path, p))
            .unwrap_or(paths.len());
        paths.insert(pos, path);
        self.best_changed(prefix, old_best);
    }

    fn remove_path(&mut self, prefix: IpNet, source: Source) {
        let Some(paths) = self.loc.get_mut(&prefix) else {
            return;
        };
        let old_best = paths.first().cloned();
        paths.retain(|p| p.source != source);
        if paths.is_empty() {
            self.loc.remove(&prefix);
        }
        self.best_changed(prefix, old_best);
    }

    fn best_changed(&mut self, prefix: IpNet, old: Option<Path>) {
        let new = self.loc.get(&prefix).and_then(|p| p.first());
        if old.as_ref() == new {
            return;
        }
        let old_route = old.as_ref().and_then(|p| best_route(prefix, p));
        let new_route = new.and_then(|p| best_route(prefix, p));
        match (old_route, new_route) {
            (None, Some(r)) => self.changes.push(RouteChange::Added(r)),
            (Some(o), Some(r)) if o != r => self.changes.push(RouteChange::Changed(r)),
            (Some(_), None) => self.changes.push(RouteChange::Removed { prefix }),
            _ => {}
        }
        if self.dirty_set.insert(prefix) {
            self.dirty.push(prefix);
        }
    }

    /// The dataplane changes since the last call.
    pub fn take_changes(&mut self) -> Vec<RouteChange> {
        std::mem::take(&mut self.changes)
    }

    /// Prefixes whose best path changed since the last call.
    pub fn take_dirty(&mut self) -> Vec<IpNet> {
        self.dirty_set.clear();
        std::mem::take(&mut self.dirty)
    }

    /// Every prefix in the Loc-RIB (for a full export to a new peer).
    pub fn all_prefixes(&self) -> Vec<IpNet> {
        self.loc.keys().copied().collect()
    }

    /// What `best` becomes when sent to `to`, or `None` if it must not be
    /// sent (split horizon, reflection rules, well-known communities).
    fn export(&self, best: &Path, to: &PeerInfo, prefix: &IpNet) -> Option<OutRoute> {
        if best.source == Source::Peer(to.addr) || best.attrs.communities.contains(&NO_ADVERTISE) {
            return None;
        }
        if !to.families.contains(&family_of(prefix)) {
            return None;
        }
        let to_ibgp = to.remote_as == self.local_as;
        let from = match best.source {
            Source::Local => None,
            Source::Peer(a) => Some(self.peers.get(&a).cloned().map_or((a, false, false), |p| {
                (a, p.remote_as == self.local_as, p.rr_client)
            })),
        };
        let mut a = (*best.attrs).clone();
        let self_nh = match prefix {
            IpNet::V4(_) => to.local_v4.map(IpAddr::V4),
            IpNet::V6(_) => to.local_v6.map(IpAddr::V6),
        };
        let next_hop;
        if to_ibgp {
            if let Some((_, from_ibgp, from_client)) = from {
                if from_ibgp {
                    // iBGP split horizon, relaxed by route reflection
                    // (RFC 4456 §6): a client's routes go to every iBGP
                    // peer, a non-client's only to clients.
                    if !from_client && !to.rr_client {
                        return None;
                    }
                    if a.originator_id.is_none() {
                        a.originator_id = Some(best.peer_router_id);
                    }
                    a.cluster_list.insert(0, self.cluster_id);
                }
                next_hop = best.next_hop;
            } else {
                next_hop = self_nh.unwrap_or(best.next_hop);
            }
            a.local_pref = Some(best.local_pref());
        } else {
            if best.attrs.communities.contains(&NO_EXPORT) {
                return None;
            }
            a.as_path = Some(a.as_path.unwrap_or_default().prepend(self.local_as));
            a.local_pref = None;
            a.originator_id = None;
            a.cluster_list.clear();
            if from.is_some_and(|(_, ibgp, _)| !ibgp) {
                // MED is not passed from one neighbouring AS to another.
                a.med = None;
            }
            next_hop = self_nh?;
        }
        Some(OutRoute {
            attrs: Arc::new(a),
            next_hop,
        })
    }

    /// Brings the Adj-RIB-Out of `to` up to date for `prefixes` and returns
    /// the UPDATEs that do it, grouped by shared attributes.
    pub fn updates_for(&mut self, to: IpAddr, prefixes: &[IpNet]) -> Vec<UpdateMsg> {
        let Some(peer) = self.peers.get(&to).cloned() else {
            return Vec::new();
        };
        let mut announce: Vec<(OutRoute, IpNet)> = Vec::new();
        let mut withdraw: Vec<IpNet> = Vec::new();
        // Exports of the same source attributes share one Arc, so grouping
        // by pointer puts them into the same UPDATE.
        let mut cache: HashMap<(usize, IpAddr, (u16, u8)), Option<OutRoute>> = HashMap::new();
        for prefix in prefixes {
            let want = self
                .loc
                .get(prefix)
                .and_then(|paths| paths.first())
                .and_then(|best| {
                    // The export depends only on the attributes (shared by the
                    // paths of one UPDATE from one peer), the next hop and the
                    // family.
                    let key = (
                        Arc::as_ptr(&best.attrs) as usize,
                        best.next_hop,
                        family_of(prefix),
                    );
                    cache
                        .entry(key)
                        .or_insert_with(|| self.export(best, &peer, prefix))
                        .clone()
                });
            let out = self.adj_out.entry(to).or_default();
            match want {
                Some(o) => {
                    if out.get(prefix).is_none_or(|cur| *cur != o) {
                        out.insert(*prefix, o.clone());
                        announce.push((o, *prefix));
                    }
                }
                None => {
                    if out.remove(prefix).is_some() {
                        withdraw.push(*prefix);
                    }
                }
            }
        }
        build_updates(announce, withdraw)
    }

    /// The route table, every candidate of every prefix.
    pub fn routes(&self) -> Vec<RouteEntry> {
        let mut out: Vec<RouteEntry> = self
            .loc
            .iter()
            .flat_map(|(prefix, paths)| {
                paths.iter().enumerate().map(move |(i, p)| RouteEntry {
                    prefix: *prefix,
                    next_hop: p.next_hop,
                    source: p.source,
                    as_path: as_list(p),
                    local_pref: p.local_pref(),
                    med: p.attrs.med,
                    best: i == 0,
                    stale: p.stale,
                })
            })
            .collect();
        out.sort_by(|a, b| a.prefix.cmp(&b.prefix).then(b.best.cmp(&a.best)));
        out
    }

    /// The best path of a prefix.
    pub fn best(&self, prefix: &IpNet) -> Option<&Path> {
        self.loc.get(prefix).and_then(|p| p.first())
    }
}

/// Prefixes per UPDATE, small enough that the message stays under 4096
/// octets with a few hundred octets of attributes.
const V4_PER_UPDATE: usize = 600;
const V6_PER_UPDATE: usize = 150;

fn build_updates(announce: Vec<(OutRoute, IpNet)>, withdraw: Vec<IpNet>) -> Vec<UpdateMsg> {
    let mut msgs = Vec::new();
    let (w4, w6): (Vec<IpNet>, Vec<IpNet>) = withdraw
        .into_iter()
        .partition(|p| matches!(p, IpNet::V4(_)));
    for chunk in w4.chunks(V4_PER_UPDATE) {
        msgs.push(UpdateMsg {
            withdrawn: chunk
                .iter()
                .filter_map(|p| match p {
                    IpNet::V4(n) => Some(*n),
                    IpNet::V6(_) => None,
                })
                .collect(),
            ..Default::default()
        });
    }
    for chunk in w6.chunks(V6_PER_UPDATE) {
        msgs.push(UpdateMsg {
            attrs: None,
            mp_unreach: Some(MpUnreach {
                afi: AFI_IPV6,
                safi: SAFI_UNICAST,
                withdrawn: chunk.to_vec(),
            }),
            ..Default::default()
        });
    }
    // Group announcements by (attributes, next hop), keeping first-seen order.
    let mut groups: Vec<(OutRoute, Vec<IpNet>)> = Vec::new();
    let mut index: HashMap<(usize, IpAddr), usize> = HashMap::new();
    for (o, p) in announce {
        let key = (Arc::as_ptr(&o.attrs) as usize, o.next_hop);
        match index.get(&key) {
            Some(&i) => groups[i].1.push(p),
            None => {
                index.insert(key, groups.len());
                groups.push((o, vec![p]));
            }
        }
    }
    for (o, prefixes) in groups {
        match o.next_hop {
            IpAddr::V4(nh) if prefixes.iter().all(|p| matches!(p, IpNet::V4(_))) => {
                let mut a = (*o.attrs).clone();
                a.next_hop = Some(nh);
                for chunk in prefixes.chunks(V4_PER_UPDATE) {
                    msgs.push(UpdateMsg {
                        attrs: Some(a.clone()),
                        nlri: chunk
                            .iter()
                            .filter_map(|p| match p {
                                IpNet::V4(n) => Some(*n),
                                IpNet::V6(_) => None,
                            })
                            .collect(),
                        ..Default::default()
                    });
                }
            }
            nh => {
                let afi = if matches!(prefixes[0], IpNet::V4(_)) {
                    AFI_IPV4
                } else {
                    AFI_IPV6
                };
                for chunk in prefixes.chunks(V6_PER_UPDATE) {
                    msgs.push(UpdateMsg {
                        attrs: Some((*o.attrs).clone()),
                        mp_reach: Some(MpReach {
                            afi,
                            safi: SAFI_UNICAST,
                            next_hop: nh,
                            link_local: None,
                            nlri: chunk.to_vec(),
                        }),
                        ..Default::default()
                    });
                }
            }
        }
    }
    msgs
}

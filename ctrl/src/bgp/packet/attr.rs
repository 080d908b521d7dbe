//! Path attributes (RFC 4271 §5, RFC 4760, RFC 6793): decoding with RFC 7606 error handling, and encoding.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes, BytesMut};
use ipnet::IpNet;

use super::prefix::{decode_prefixes_v4, decode_prefixes_v6, encode_prefix};
use super::{
    AFI_IPV4, AFI_IPV6, AS_TRANS, DecodeCxt, EncodeCxt, Reader, SAFI_UNICAST, UpdateError,
};

pub(super) const FLAG_OPTIONAL: u8 = 0x80;
pub(super) const FLAG_TRANSITIVE: u8 = 0x40;
pub(super) const FLAG_PARTIAL: u8 = 0x20;
pub(super) const FLAG_EXTENDED_LEN: u8 = 0x10;

pub(super) const ATTR_ORIGIN: u8 = 1;
pub(super) const ATTR_AS_PATH: u8 = 2;
pub(super) const ATTR_NEXT_HOP: u8 = 3;
pub(super) const ATTR_MED: u8 = 4;
pub(super) const ATTR_LOCAL_PREF: u8 = 5;
pub(super) const ATTR_ATOMIC_AGGREGATE: u8 = 6;
pub(super) const ATTR_AGGREGATOR: u8 = 7;
pub(super) const ATTR_COMMUNITIES: u8 = 8;
pub(super) const ATTR_ORIGINATOR_ID: u8 = 9;
pub(super) const ATTR_CLUSTER_LIST: u8 = 10;
pub(super) const ATTR_MP_REACH: u8 = 14;
pub(super) const ATTR_MP_UNREACH: u8 = 15;
pub(super) const ATTR_AS4_PATH: u8 = 17;

/// The path attributes this speaker understands, plus unknown transitive
/// ones kept for passing on.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct Attrs {
    pub origin: Option<Origin>,
    pub as_path: Option<AsPath>,
    pub next_hop: Option<Ipv4Addr>,
    pub med: Option<u32>,
    pub local_pref: Option<u32>,
    pub atomic_aggregate: bool,
    /// (AS, address); the AS is 2-octet (or AS_TRANS) on 2-octet sessions.
    pub aggregator: Option<(u32, Ipv4Addr)>,
    pub communities: Vec<u32>,
    pub originator_id: Option<Ipv4Addr>,
    pub cluster_list: Vec<Ipv4Addr>,
    /// RFC 6793: only on sessions with a 2-octet speaker.
    pub as4_path: Option<AsPath>,
    pub unknown: Vec<UnknownAttr>,
}

/// An optional attribute we do not interpret.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnknownAttr {
    pub flags: u8,
    pub type_code: u8,
    pub value: Bytes,
}

/// ORIGIN values (RFC 4271 §5.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    Igp = 0,
    Egp = 1,
    Incomplete = 2,
}

/// An AS_PATH or AS4_PATH.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct AsPath {
    pub segments: Vec<AsSegment>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AsSegment {
    pub kind: AsSegmentKind,
    pub asns: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsSegmentKind {
    Set = 1,
    Sequence = 2,
    ConfedSequence = 3,
    ConfedSet = 4,
}

/// MP_REACH_NLRI (RFC 4760) for IPv4 or IPv6 unicast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpReach {
    pub afi: u16,
    pub safi: u8,
    /// The global next hop.
    pub next_hop: IpAddr,
    /// The IPv6 link-local next hop, when 32 octets were sent.
    pub link_local: Option<Ipv6Addr>,
    pub nlri: Vec<IpNet>,
}

/// MP_UNREACH_NLRI (RFC 4760). Empty `withdrawn` is an End-of-RIB marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpUnreach {
    pub afi: u16,
    pub safi: u8,
    pub withdrawn: Vec<IpNet>,
}

impl AsPath {
    /// A path of one AS_SEQUENCE.
    pub fn sequence(asns: Vec<u32>) -> Self {
        if asns.is_empty() {
            return Self::default();
        }
        Self {
            segments: vec![AsSegment {
                kind: AsSegmentKind::Sequence,
                asns,
            }],
        }
    }

    /// Path length for best-path selection (RFC 4271 §9.1.2.2: a set counts
    /// as one, confederation segments do not count).
    pub fn path_len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s.kind {
                AsSegmentKind::Sequence => s.asns.len(),
                AsSegmentKind::Set => 1,
                _ => 0,
            })
            .sum()
    }

    pub fn contains(&self, asn: u32) -> bool {
        self.segments.iter().any(|s| s.asns.contains(&asn))
    }

    /// The neighbour AS (first AS of the first sequence).
    pub fn first_as(&self) -> Option<u32> {
        self.segments
            .first()
            .filter(|s| s.kind == AsSegmentKind::Sequence)
            .and_then(|s| s.asns.first().copied())
    }

    /// The path with `asn` prepended (RFC 4271 §5.1.2).
    pub fn prepend(&self, asn: u32) -> AsPath {
        let mut segments = self.segments.clone();
        match segments.first_mut() {
            Some(s) if s.kind == AsSegmentKind::Sequence && s.asns.len() < 255 => {
                s.asns.insert(0, asn)
            }
            _ => segments.insert(
                0,
                AsSegment {
                    kind: AsSegmentKind::Sequence,
                    asns: vec![asn],
                },
            ),
        }
        AsPath { segments }
    }

    /// Whether any AS number needs four octets.
    pub fn needs_four_octets(&self) -> bool {
        self.segments
            .iter()
            .any(|s| s.asns.iter().any(|a| *a > u32::from(u16::MAX)))
    }

    /// RFC 6793 §4.2.3: rebuild the real path from AS_PATH and AS4_PATH.
    pub fn merge_as4(&self, as4: &AsPath) -> AsPath {
        let (n2, n4) = (self.path_len(), as4.path_len());
        if n2 < n4 {
            return self.clone();
        }
        // Keep the leading (n2 - n4) ASes of AS_PATH, then AS4_PATH.
        let mut keep = n2 - n4;
        let mut segments = Vec::new();
        for s in &self.segments {
            if keep == 0 {
                break;
            }
            match s.kind {
                AsSegmentKind::Sequence => {
                    let take = keep.min(s.asns.len());
                    segments.push(AsSegment {
                        kind: s.kind,
                        asns: s.asns[..take].to_vec(),
                    });
                    keep -= take;
                }
                AsSegmentKind::Set => {
                    segments.push(s.clone());
                    keep -= 1;
                }
                _ => segments.push(s.clone()),
            }
        }
        segments.extend(as4.segments.iter().cloned());
        AsPath { segments }
    }

    pub(super) fn decode(val: &[u8], four: bool) -> Option<AsPath> {
        let width = if four { 4 } else { 2 };
        let mut r = Reader::new(val);
        let mut segments = Vec::new();
        while !r.is_empty() {
            let kind = match r.u8()? {
                1 => AsSegmentKind::Set,
                2 => AsSegmentKind::Sequence,
                3 => AsSegmentKind::ConfedSequence,
                4 => AsSegmentKind::ConfedSet,
                _ => return None,
            };
            let n = r.u8()? as usize;
            if n == 0 {
                return None;
            }
            let raw = r.take(n * width)?;
            let asns = raw
                .chunks_exact(width)
                .map(|c| {
                    if four {
                        u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                    } else {
                        u32::from(u16::from_be_bytes([c[0], c[1]]))
                    }
                })
                .collect();
            segments.push(AsSegment { kind, asns });
        }
        Some(AsPath { segments })
    }

    pub(super) fn encode(&self, buf: &mut BytesMut, four: bool) {
        for s in &self.segments {
            for chunk in s.asns.chunks(255) {
                buf.put_u8(s.kind as u8);
                buf.put_u8(chunk.len() as u8);
                for a in chunk {
                    if four {
                        buf.put_u32(*a);
                    } else {
                        buf.put_u16(u16::try_from(*a).unwrap_or(AS_TRANS));
                    }
                }
            }
        }
    }
}

/// What decoding one attribute did to the message (RFC 7606 §2).
pub(super) enum AttrFault {
    /// Session reset: a NOTIFICATION with this error.
    Reset(UpdateError),
    /// Treat-as-withdraw (RFC 7606 §2), with the RFC 4271 error.
    Withdraw(UpdateError),
    /// Attribute discard (RFC 7606 §2), with the RFC 4271 error.
    Discard(UpdateError),
}

/// The raw attribute (flags, type, length, value) for NOTIFICATION data.
pub(super) fn attr_data(flags: u8, code: u8, val: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(val.len() + 4);
    if flags & FLAG_EXTENDED_LEN != 0 {
        b.put_u8(flags);
        b.put_u8(code);
        b.put_u16(val.len() as u16);
    } else {
        b.put_u8(flags);
        b.put_u8(code);
        b.put_u8(val.len() as u8);
    }
    b.put_slice(val);
    b.freeze()
}

pub(super) fn expected_flags(code: u8) -> Option<u8> {
    Some(match code {
        ATTR_ORIGIN | ATTR_AS_PATH | ATTR_NEXT_HOP | ATTR_LOCAL_PREF | ATTR_ATOMIC_AGGREGATE => {
            FLAG_TRANSITIVE
        }
        ATTR_MED | ATTR_ORIGINATOR_ID | ATTR_CLUSTER_LIST | ATTR_MP_REACH | ATTR_MP_UNREACH => {
            FLAG_OPTIONAL
        }
        ATTR_AGGREGATOR | ATTR_COMMUNITIES | ATTR_AS4_PATH => FLAG_OPTIONAL | FLAG_TRANSITIVE,
        _ => return None,
    })
}

pub(super) fn decode_attr(
    flags: u8,
    code: u8,
    val: &[u8],
    cxt: &DecodeCxt,
    attrs: &mut Attrs,
    mp_reach: &mut Option<MpReach>,
    mp_unreach: &mut Option<MpUnreach>,
) -> Result<(), AttrFault> {
    let data = || attr_data(flags, code, val);
    let mut r = Reader::new(val);
    if let Some(expected) = expected_flags(code) {
        // RFC 4271 §6.3: optional and transitive bits must match the
        // attribute; the partial bit is only allowed on optional transitive.
        let mask = FLAG_OPTIONAL | FLAG_TRANSITIVE;
        let partial_bad =
            flags & FLAG_PARTIAL != 0 && expected != (FLAG_OPTIONAL | FLAG_TRANSITIVE);
        if flags & mask != expected || partial_bad {
            let e = UpdateError::AttributeFlags(data());
            return Err(match code {
                ATTR_MP_REACH | ATTR_MP_UNREACH => AttrFault::Reset(e),
                ATTR_ATOMIC_AGGREGATE | ATTR_AGGREGATOR | ATTR_AS4_PATH => AttrFault::Discard(e),
                _ => AttrFault::Withdraw(e),
            });
        }
    }
    let withdraw_len = || AttrFault::Withdraw(UpdateError::AttributeLength(data()));
    match code {
        ATTR_ORIGIN => {
            if val.len() != 1 {
                return Err(withdraw_len());
            }
            attrs.origin = Some(match val[0] {
                0 => Origin::Igp,
                1 => Origin::Egp,
                2 => Origin::Incomplete,
                _ => return Err(AttrFault::Withdraw(UpdateError::InvalidOrigin(data()))),
            });
        }
        ATTR_AS_PATH => {
            attrs.as_path = Some(
                AsPath::decode(val, cxt.four_octet_as)
                    .ok_or(AttrFault::Withdraw(UpdateError::MalformedAsPath))?,
            );
        }
        ATTR_NEXT_HOP => {
            if val.len() != 4 {
                return Err(withdraw_len());
            }
            let nh = r.ipv4().ok_or_else(withdraw_len)?;
            // RFC 4271 §6.3: a syntactically wrong next hop (RFC 7606 §7.3:
            // treat-as-withdraw).
            if nh.is_unspecified() || nh.is_multicast() || nh.is_broadcast() {
                return Err(AttrFault::Withdraw(UpdateError::InvalidNextHop(data())));
            }
            attrs.next_hop = Some(nh);
        }
        ATTR_MED | ATTR_LOCAL_PREF => {
            let v = if val.len() == 4 { r.u32() } else { None };
            let v = v.ok_or_else(withdraw_len)?;
            if code == ATTR_MED {
                attrs.med = Some(v);
            } else {
                attrs.local_pref = Some(v);
            }
        }
        ATTR_ATOMIC_AGGREGATE => {
            if !val.is_empty() {
                return Err(AttrFault::Discard(UpdateError::AttributeLength(data())));
            }
            attrs.atomic_aggregate = true;
        }
        ATTR_AGGREGATOR => {
            let want = if cxt.four_octet_as { 8 } else { 6 };
            if val.len() != want {
                // RFC 7606 §7.7: attribute discard.
                return Err(AttrFault::Discard(UpdateError::AttributeLength(data())));
            }
            let asn = if cxt.four_octet_as {
                r.u32()
            } else {
                r.u16().map(u32::from)
            };
            attrs.aggregator = asn.zip(r.ipv4());
        }
        ATTR_COMMUNITIES => {
            if !val.len().is_multiple_of(4) {
                return Err(withdraw_len());
            }
            attrs.communities = val
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
        }
        ATTR_ORIGINATOR_ID => {
            if val.len() != 4 {
                return Err(withdraw_len());
            }
            attrs.originator_id = r.ipv4();
        }
        ATTR_CLUSTER_LIST => {
            if !val.len().is_multiple_of(4) {
                return Err(withdraw_len());
            }
            attrs.cluster_list = val
                .chunks_exact(4)
                .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]))
                .collect();
        }
        ATTR_AS4_PATH => {
            // RFC 6793 §6: a malformed AS4_PATH is discarded. On a 4-octet
            // session it should not appear at all and is ignored too.
            match AsPath::decode(val, true) {
                Some(p) if !cxt.four_octet_as => attrs.as4_path = Some(p),
                Some(_) => {}
                None => {
                    return Err(AttrFault::Discard(UpdateError::OptionalAttribute(data())));
                }
            }
        }
        ATTR_MP_REACH => {
            *mp_reach = decode_mp_reach(val)
                .map(Some)
                .map_err(AttrFault::Reset)?
                .flatten();
        }
        ATTR_MP_UNREACH => {
            *mp_unreach = decode_mp_unreach(val).map_err(AttrFault::Reset)?;
        }
        _ => {
            if flags & FLAG_OPTIONAL == 0 {
                return Err(AttrFault::Reset(
                    UpdateError::UnrecognizedWellKnownAttribute(data()),
                ));
            }
            // RFC 4271 §5: unknown optional transitive attributes are passed
            // on with the partial bit set; non-transitive ones are dropped.
            if flags & FLAG_TRANSITIVE != 0 {
                attrs.unknown.push(UnknownAttr {
                    flags: (flags | FLAG_PARTIAL) & !FLAG_EXTENDED_LEN,
                    type_code: code,
                    value: Bytes::copy_from_slice(val),
                });
            }
        }
    }
    Ok(())
}

/// `Ok(None)` for a family we did not negotiate (ignored).
pub(super) fn decode_mp_reach(val: &[u8]) -> Result<Option<MpReach>, UpdateError> {
    let bad = || UpdateError::OptionalAttribute(attr_data(FLAG_OPTIONAL, ATTR_MP_REACH, val));
    let mut r = Reader::new(val);
    let afi = r.u16().ok_or_else(bad)?;
    let safi = r.u8().ok_or_else(bad)?;
    let nh_len = r.u8().ok_or_else(bad)? as usize;
    let nh = r.take(nh_len).ok_or_else(bad)?;
    let _reserved = r.u8().ok_or_else(bad)?;
    let rest = r.take(r.remaining()).unwrap_or_default();
    if safi != SAFI_UNICAST {
        return Ok(None);
    }
    let mut n = Reader::new(nh);
    let (next_hop, link_local, nlri) = match (afi, nh_len) {
        (AFI_IPV4, 4) => (
            IpAddr::V4(n.ipv4().ok_or_else(bad)?),
            None,
            decode_prefixes_v4(rest)
                .map_err(|_| bad())?
                .into_iter()
                .map(IpNet::V4)
                .collect(),
        ),
        (AFI_IPV6, 16 | 32) => (
            IpAddr::V6(n.ipv6().ok_or_else(bad)?),
            if nh_len == 32 { n.ipv6() } else { None },
            decode_prefixes_v6(rest)
                .ok_or_else(bad)?
                .into_iter()
                .map(IpNet::V6)
                .collect(),
        ),
        (AFI_IPV4 | AFI_IPV6, _) => return Err(bad()),
        _ => return Ok(None),
    };
    Ok(Some(MpReach {
        afi,
        safi,
        next_hop,
        link_local,
        nlri,
    }))
}

pub(super) fn decode_mp_unreach(val: &[u8]) -> Result<Option<MpUnreach>, UpdateError> {
    let bad = || UpdateError::OptionalAttribute(attr_data(FLAG_OPTIONAL, ATTR_MP_UNREACH, val));
    let mut r = Reader::new(val);
    let afi = r.u16().ok_or_else(bad)?;
    let safi = r.u8().ok_or_else(bad)?;
    let rest = r.take(r.remaining()).unwrap_or_default();
    if safi != SAFI_UNICAST {
        return Ok(None);
    }
    let withdrawn = match afi {
        AFI_IPV4 => decode_prefixes_v4(rest)
            .map_err(|_| bad())?
            .into_iter()
            .map(IpNet::V4)
            .collect(),
        AFI_IPV6 => decode_prefixes_v6(rest)
            .ok_or_else(bad)?
            .into_iter()
            .map(IpNet::V6)
            .collect(),
        _ => return Ok(None),
    };
    Ok(Some(MpUnreach {
        afi,
        safi,
        withdrawn,
    }))
}

pub(super) fn put_attr(buf: &mut BytesMut, flags: u8, code: u8, body: impl FnOnce(&mut BytesMut)) {
    let start = buf.len();
    buf.put_u8(flags | FLAG_EXTENDED_LEN);
    buf.put_u8(code);
    buf.put_u16(0);
    body(buf);
    let len = buf.len() - start - 4;
    if len <= 255 {
        // Use the one-octet length: move the value one octet left.
        buf[start] = flags & !FLAG_EXTENDED_LEN;
        buf[start + 2] = len as u8;
        buf.copy_within(start + 4.., start + 3);
        buf.truncate(buf.len() - 1);
    } else {
        buf[start + 2..start + 4].copy_from_slice(&(len as u16).to_be_bytes());
    }
}

impl Attrs {
    /// The AS path with AS4_PATH merged in (RFC 6793 §4.2.3).
    pub fn effective_as_path(&self) -> AsPath {
        let p = self.as_path.clone().unwrap_or_default();
        match &self.as4_path {
            Some(p4) => p.merge_as4(p4),
            None => p,
        }
    }

    pub(super) fn encode(
        &self,
        buf: &mut BytesMut,
        cxt: &EncodeCxt,
        mp_reach: Option<&MpReach>,
        mp_unreach: Option<&MpUnreach>,
    ) {
        if let Some(o) = self.origin {
            put_attr(buf, FLAG_TRANSITIVE, ATTR_ORIGIN, |b| b.put_u8(o as u8));
        }
        if let Some(p) = &self.as_path {
            put_attr(buf, FLAG_TRANSITIVE, ATTR_AS_PATH, |b| {
                p.encode(b, cxt.four_octet_as)
            });
        }
        if let Some(nh) = self.next_hop {
            put_attr(buf, FLAG_TRANSITIVE, ATTR_NEXT_HOP, |b| {
                b.put_slice(&nh.octets())
            });
        }
        if let Some(m) = self.med {
            put_attr(buf, FLAG_OPTIONAL, ATTR_MED, |b| b.put_u32(m));
        }
        if let Some(lp) = self.local_pref {
            put_attr(buf, FLAG_TRANSITIVE, ATTR_LOCAL_PREF, |b| b.put_u32(lp));
        }
        if self.atomic_aggregate {
            put_attr(buf, FLAG_TRANSITIVE, ATTR_ATOMIC_AGGREGATE, |_| {});
        }
        if let Some((asn, addr)) = self.aggregator {
            put_attr(buf, FLAG_OPTIONAL | FLAG_TRANSITIVE, ATTR_AGGREGATOR, |b| {
                if cxt.four_octet_as {
                    b.put_u32(asn);
                } else {
                    b.put_u16(u16::try_from(asn).unwrap_or(AS_TRANS));
                }
                b.put_slice(&addr.octets());
            });
        }
        if !self.communities.is_empty() {
            put_attr(
                buf,
                FLAG_OPTIONAL | FLAG_TRANSITIVE,
                ATTR_COMMUNITIES,
                |b| self.communities.iter().for_each(|c| b.put_u32(*c)),
            );
        }
        if let Some(o) = self.originator_id {
            put_attr(buf, FLAG_OPTIONAL, ATTR_ORIGINATOR_ID, |b| {
                b.put_slice(&o.octets())
            });
        }
        if !self.cluster_list.is_empty() {
            put_attr(buf, FLAG_OPTIONAL, ATTR_CLUSTER_LIST, |b| {
                self.cluster_list
                    .iter()
                    .for_each(|c| b.put_slice(&c.octets()))
            });
        }
        if let Some(r) = mp_reach {
            put_attr(buf, FLAG_OPTIONAL, ATTR_MP_REACH, |b| {
                b.put_u16(r.afi);
                b.put_u8(r.safi);
                match (r.next_hop, r.link_local) {
                    (IpAddr::V4(a), _) => {
                        b.put_u8(4);
                        b.put_slice(&a.octets());
                    }
                    (IpAddr::V6(a), None) => {
                        b.put_u8(16);
                        b.put_slice(&a.octets());
                    }
                    (IpAddr::V6(a), Some(ll)) => {
                        b.put_u8(32);
                        b.put_slice(&a.octets());
                        b.put_slice(&ll.octets());
                    }
                }
                b.put_u8(0);
                r.nlri.iter().for_each(|n| encode_prefix(b, n));
            });
        }
        if let Some(u) = mp_unreach {
            put_attr(buf, FLAG_OPTIONAL, ATTR_MP_UNREACH, |b| {
                b.put_u16(u.afi);
                b.put_u8(u.safi);
                u.withdrawn.iter().for_each(|n| encode_prefix(b, n));
            });
        }
        if !cxt.four_octet_as
            && let Some(p4) = &self.as4_path
        {
            put_attr(buf, FLAG_OPTIONAL | FLAG_TRANSITIVE, ATTR_AS4_PATH, |b| {
                p4.encode(b, true)
            });
        }
        for u in &self.unknown {
            put_attr(buf, u.flags & !FLAG_EXTENDED_LEN, u.type_code, |b| {
                b.put_slice(&u.value)
            });
        }
    }
}

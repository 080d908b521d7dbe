//! OPEN (RFC 4271 §4.2) and its capabilities (RFC 5492).

use std::net::Ipv4Addr;

use bytes::{BufMut, Bytes, BytesMut};

use super::{AS_TRANS, BGP_VERSION, DecodeError, OpenError, Reader};

pub(super) const CAP_MULTIPROTOCOL: u8 = 1;
pub(super) const CAP_ROUTE_REFRESH: u8 = 2;
pub(super) const CAP_GRACEFUL_RESTART: u8 = 64;
pub(super) const CAP_FOUR_OCTET_AS: u8 = 65;

pub(super) const OPT_PARAM_CAPABILITIES: u8 = 2;

/// An OPEN message (RFC 4271 §4.2). `my_as` is the 2-octet field; the real
/// AS of a four-octet speaker is in its capability ([`OpenMsg::real_as`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenMsg {
    pub version: u8,
    pub my_as: u16,
    pub hold_time: u16,
    pub identifier: Ipv4Addr,
    pub capabilities: Vec<Capability>,
}

/// A capability (RFC 5492) from the OPEN's optional parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capability {
    /// RFC 4760.
    MultiProtocol { afi: u16, safi: u8 },
    /// RFC 2918.
    RouteRefresh,
    /// RFC 6793.
    FourOctetAs(u32),
    /// RFC 4724.
    GracefulRestart(GracefulRestartCap),
    /// Anything else, kept as received.
    Unknown { code: u8, value: Bytes },
}

/// RFC 4724 §3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GracefulRestartCap {
    /// The R bit: the sender has restarted.
    pub restarting: bool,
    /// Seconds the receiver should keep the sender's routes.
    pub restart_time: u16,
    /// (AFI, SAFI, forwarding state preserved).
    pub families: Vec<(u16, u8, bool)>,
}

impl OpenMsg {
    /// A four-octet-AS-aware OPEN for `asn`.
    pub fn new(asn: u32, hold_time: u16, identifier: Ipv4Addr, mut caps: Vec<Capability>) -> Self {
        if !caps.iter().any(|c| matches!(c, Capability::FourOctetAs(_))) {
            caps.push(Capability::FourOctetAs(asn));
        }
        Self {
            version: BGP_VERSION,
            my_as: u16::try_from(asn).unwrap_or(AS_TRANS),
            hold_time,
            identifier,
            capabilities: caps,
        }
    }

    /// The sender's AS: from the four-octet AS capability if present.
    pub fn real_as(&self) -> u32 {
        self.capabilities
            .iter()
            .find_map(|c| match c {
                Capability::FourOctetAs(a) => Some(*a),
                _ => None,
            })
            .unwrap_or(u32::from(self.my_as))
    }

    pub fn has_capability(&self, f: impl Fn(&Capability) -> bool) -> bool {
        self.capabilities.iter().any(f)
    }

    pub(super) fn decode_body(body: &[u8]) -> Result<OpenMsg, DecodeError> {
        let mut r = Reader::new(body);
        let malformed = || DecodeError::from(OpenError::Malformed);
        let version = r.u8().ok_or_else(malformed)?;
        let my_as = r.u16().ok_or_else(malformed)?;
        let hold_time = r.u16().ok_or_else(malformed)?;
        let identifier = r.ipv4().ok_or_else(malformed)?;
        let opt_len = r.u8().ok_or_else(malformed)? as usize;
        if version != BGP_VERSION {
            return Err(OpenError::UnsupportedVersion(version).into());
        }
        if r.remaining() != opt_len {
            return Err(malformed());
        }
        // RFC 4271 §6.2: hold time 1 or 2 is unacceptable.
        if hold_time == 1 || hold_time == 2 {
            return Err(OpenError::UnacceptableHoldTime(hold_time).into());
        }
        // RFC 6286: a zero identifier is never valid.
        if identifier.is_unspecified() {
            return Err(OpenError::BadBgpIdentifier(identifier).into());
        }
        let mut capabilities = Vec::new();
        while !r.is_empty() {
            let ptype = r.u8().ok_or_else(malformed)?;
            let plen = r.u8().ok_or_else(malformed)? as usize;
            let pval = r.take(plen).ok_or_else(malformed)?;
            if ptype != OPT_PARAM_CAPABILITIES {
                return Err(OpenError::UnsupportedOptionalParameter(ptype).into());
            }
            let mut c = Reader::new(pval);
            while !c.is_empty() {
                let code = c.u8().ok_or_else(malformed)?;
                let clen = c.u8().ok_or_else(malformed)? as usize;
                let cval = c.take(clen).ok_or_else(malformed)?;
                capabilities.push(Capability::decode(code, cval).ok_or_else(malformed)?);
            }
        }
        Ok(OpenMsg {
            version,
            my_as,
            hold_time,
            identifier,
            capabilities,
        })
    }

    pub(super) fn encode_body(&self, buf: &mut BytesMut) {
        buf.put_u8(self.version);
        buf.put_u16(self.my_as);
        buf.put_u16(self.hold_time);
        buf.put_slice(&self.identifier.octets());
        let len_at = buf.len();
        buf.put_u8(0);
        // One optional parameter per capability, as BIRD and GoBGP do.
        for cap in &self.capabilities {
            buf.put_u8(OPT_PARAM_CAPABILITIES);
            let plen_at = buf.len();
            buf.put_u8(0);
            cap.encode(buf);
            buf[plen_at] = (buf.len() - plen_at - 1) as u8;
        }
        buf[len_at] = (buf.len() - len_at - 1) as u8;
    }
}

impl Capability {
    pub(super) fn decode(code: u8, val: &[u8]) -> Option<Capability> {
        let mut r = Reader::new(val);
        Some(match code {
            CAP_MULTIPROTOCOL if val.len() == 4 => {
                let afi = r.u16()?;
                r.u8()?;
                Capability::MultiProtocol { afi, safi: r.u8()? }
            }
            CAP_ROUTE_REFRESH if val.is_empty() => Capability::RouteRefresh,
            CAP_FOUR_OCTET_AS if val.len() == 4 => Capability::FourOctetAs(r.u32()?),
            CAP_GRACEFUL_RESTART if val.len() >= 2 && (val.len() - 2).is_multiple_of(4) => {
                let word = r.u16()?;
                let mut families = Vec::new();
                while !r.is_empty() {
                    let afi = r.u16()?;
                    let safi = r.u8()?;
                    let flags = r.u8()?;
                    families.push((afi, safi, flags & 0x80 != 0));
                }
                Capability::GracefulRestart(GracefulRestartCap {
                    restarting: word & 0x8000 != 0,
                    restart_time: word & 0x0fff,
                    families,
                })
            }
            CAP_MULTIPROTOCOL | CAP_ROUTE_REFRESH | CAP_FOUR_OCTET_AS | CAP_GRACEFUL_RESTART => {
                return None;
            }
            code => Capability::Unknown {
                code,
                value: Bytes::copy_from_slice(val),
            },
        })
    }

    pub(super) fn encode(&self, buf: &mut BytesMut) {
        match self {
            Capability::MultiProtocol { afi, safi } => {
                buf.put_slice(&[CAP_MULTIPROTOCOL, 4]);
                buf.put_u16(*afi);
                buf.put_u8(0);
                buf.put_u8(*safi);
            }
            Capability::RouteRefresh => buf.put_slice(&[CAP_ROUTE_REFRESH, 0]),
            Capability::FourOctetAs(a) => {
                buf.put_slice(&[CAP_FOUR_OCTET_AS, 4]);
                buf.put_u32(*a);
            }
            Capability::GracefulRestart(gr) => {
                buf.put_u8(CAP_GRACEFUL_RESTART);
                buf.put_u8((2 + 4 * gr.families.len()) as u8);
                let r = if gr.restarting { 0x8000 } else { 0 };
                buf.put_u16(r | (gr.restart_time & 0x0fff));
                for (afi, safi, fwd) in &gr.families {
                    buf.put_u16(*afi);
                    buf.put_u8(*safi);
                    buf.put_u8(if *fwd { 0x80 } else { 0 });
                }
            }
            Capability::Unknown { code, value } => {
                buf.put_u8(*code);
                buf.put_u8(value.len() as u8);
                buf.put_slice(value);
            }
        }
    }

    /// The capability as it appears on the wire (code, length, value): the
    /// data of an Unsupported Capability NOTIFICATION.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b.freeze()
    }
}

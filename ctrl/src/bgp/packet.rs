//! The BGP-4 message codec (RFC 4271 §4) as owned types.
//!
//! `Message::decode(&[u8], &DecodeCxt)` takes one whole message (framed with
//! [`get_message_len`]) and `Message::encode(&EncodeCxt)` writes one. Every
//! decode error carries what RFC 4271 §6 needs to build the NOTIFICATION
//! (`From<&DecodeError> for NotificationMsg`). With
//! [`DecodeCxt::revised_error_handling`] (RFC 7606, the default) the errors
//! that RFC 7606 downgrades come back inside an `Ok` UPDATE as
//! "treat-as-withdraw" or as a discarded attribute instead of an `Err`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes, BytesMut};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use thiserror::Error;

/// The 16-octet marker of every message.
pub const MARKER: [u8; 16] = [0xff; 16];
/// Length of the fixed header (marker, length, type).
pub const HEADER_LEN: usize = 19;
/// Largest message without RFC 8654 extended messages.
pub const MAX_MESSAGE_LEN: usize = 4096;
/// The AS number a 2-octet speaker sees in place of a 4-octet one (RFC 6793).
pub const AS_TRANS: u16 = 23456;
/// The BGP version we speak.
pub const BGP_VERSION: u8 = 4;

pub const AFI_IPV4: u16 = 1;
pub const AFI_IPV6: u16 = 2;
pub const SAFI_UNICAST: u8 = 1;

const MSG_OPEN: u8 = 1;
const MSG_UPDATE: u8 = 2;
const MSG_NOTIFICATION: u8 = 3;
const MSG_KEEPALIVE: u8 = 4;
const MSG_ROUTE_REFRESH: u8 = 5;

const FLAG_OPTIONAL: u8 = 0x80;
const FLAG_TRANSITIVE: u8 = 0x40;
const FLAG_PARTIAL: u8 = 0x20;
const FLAG_EXTENDED_LEN: u8 = 0x10;

const ATTR_ORIGIN: u8 = 1;
const ATTR_AS_PATH: u8 = 2;
const ATTR_NEXT_HOP: u8 = 3;
const ATTR_MED: u8 = 4;
const ATTR_LOCAL_PREF: u8 = 5;
const ATTR_ATOMIC_AGGREGATE: u8 = 6;
const ATTR_AGGREGATOR: u8 = 7;
const ATTR_COMMUNITIES: u8 = 8;
const ATTR_ORIGINATOR_ID: u8 = 9;
const ATTR_CLUSTER_LIST: u8 = 10;
const ATTR_MP_REACH: u8 = 14;
const ATTR_MP_UNREACH: u8 = 15;
const ATTR_AS4_PATH: u8 = 17;

const CAP_MULTIPROTOCOL: u8 = 1;
const CAP_ROUTE_REFRESH: u8 = 2;
const CAP_GRACEFUL_RESTART: u8 = 64;
const CAP_FOUR_OCTET_AS: u8 = 65;

const OPT_PARAM_CAPABILITIES: u8 = 2;

// ===== contexts =====

/// What the decoder must know about the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeCxt {
    /// Both sides announced the four-octet AS capability: AS_PATH and
    /// AGGREGATOR carry 4-octet AS numbers.
    pub four_octet_as: bool,
    /// RFC 7606: treat-as-withdraw and attribute discard instead of a session
    /// reset where that RFC allows it.
    pub revised_error_handling: bool,
}

impl Default for DecodeCxt {
    fn default() -> Self {
        Self {
            four_octet_as: true,
            revised_error_handling: true,
        }
    }
}

/// What the encoder must know about the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeCxt {
    /// Write 4-octet AS numbers in AS_PATH and AGGREGATOR.
    pub four_octet_as: bool,
}

impl Default for EncodeCxt {
    fn default() -> Self {
        Self {
            four_octet_as: true,
        }
    }
}

// ===== errors =====

/// Why a message could not be decoded, precise enough for the NOTIFICATION
/// RFC 4271 §6 asks for (see `From<&DecodeError> for NotificationMsg`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("message header: {0}")]
    Header(#[from] HeaderError),
    #[error("OPEN: {0}")]
    Open(#[from] OpenError),
    #[error("UPDATE: {0}")]
    Update(#[from] UpdateError),
    #[error("ROUTE-REFRESH: bad length {0}")]
    RouteRefreshLength(u16),
    #[error("NOTIFICATION too short")]
    NotificationLength,
}

/// RFC 4271 §6.1, error code 1.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum HeaderError {
    #[error("marker is not all ones")]
    ConnectionNotSynchronized,
    #[error("bad message length {0}")]
    BadMessageLength(u16),
    #[error("bad message type {0}")]
    BadMessageType(u8),
}

/// RFC 4271 §6.2, error code 2 (and RFC 5492 for capabilities).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum OpenError {
    #[error("malformed optional parameters")]
    Malformed,
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    #[error("bad peer AS {0}")]
    BadPeerAs(u32),
    #[error("bad BGP identifier {0}")]
    BadBgpIdentifier(Ipv4Addr),
    #[error("unsupported optional parameter {0}")]
    UnsupportedOptionalParameter(u8),
    #[error("unacceptable hold time {0}")]
    UnacceptableHoldTime(u16),
    #[error("unsupported capability")]
    UnsupportedCapability(Bytes),
}

/// RFC 4271 §6.3, error code 3. The `Bytes` is the NOTIFICATION data (the
/// erroneous attribute, type, length and value, as the RFC asks).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum UpdateError {
    #[error("malformed attribute list")]
    MalformedAttributeList,
    #[error("unrecognized well-known attribute")]
    UnrecognizedWellKnownAttribute(Bytes),
    #[error("missing well-known attribute {0}")]
    MissingWellKnownAttribute(u8),
    #[error("attribute flags error")]
    AttributeFlags(Bytes),
    #[error("attribute length error")]
    AttributeLength(Bytes),
    #[error("invalid ORIGIN")]
    InvalidOrigin(Bytes),
    #[error("invalid NEXT_HOP")]
    InvalidNextHop(Bytes),
    #[error("optional attribute error")]
    OptionalAttribute(Bytes),
    #[error("invalid network field")]
    InvalidNetworkField,
    #[error("malformed AS_PATH")]
    MalformedAsPath,
}

/// Error codes of RFC 4271 §4.5 and later RFCs.
pub mod error_code {
    pub const MESSAGE_HEADER: u8 = 1;
    pub const OPEN_MESSAGE: u8 = 2;
    pub const UPDATE_MESSAGE: u8 = 3;
    pub const HOLD_TIMER_EXPIRED: u8 = 4;
    pub const FSM: u8 = 5;
    pub const CEASE: u8 = 6;
    pub const ROUTE_REFRESH: u8 = 7;
}

/// Cease subcodes (RFC 4486).
pub mod cease {
    pub const MAX_PREFIXES: u8 = 1;
    pub const ADMIN_SHUTDOWN: u8 = 2;
    pub const PEER_DECONFIGURED: u8 = 3;
    pub const ADMIN_RESET: u8 = 4;
    pub const CONNECTION_REJECTED: u8 = 5;
    pub const OTHER_CONFIG_CHANGE: u8 = 6;
    pub const CONNECTION_COLLISION: u8 = 7;
    pub const OUT_OF_RESOURCES: u8 = 8;
}

impl From<&DecodeError> for NotificationMsg {
    fn from(e: &DecodeError) -> Self {
        use error_code::*;
        let (code, subcode, data) = match e {
            DecodeError::Header(h) => match h {
                HeaderError::ConnectionNotSynchronized => (MESSAGE_HEADER, 1, Bytes::new()),
                HeaderError::BadMessageLength(l) => {
                    (MESSAGE_HEADER, 2, Bytes::copy_from_slice(&l.to_be_bytes()))
                }
                HeaderError::BadMessageType(t) => {
                    (MESSAGE_HEADER, 3, Bytes::copy_from_slice(&[*t]))
                }
            },
            DecodeError::Open(o) => match o {
                OpenError::Malformed => (OPEN_MESSAGE, 0, Bytes::new()),
                OpenError::UnsupportedVersion(_) => (
                    OPEN_MESSAGE,
                    1,
                    Bytes::copy_from_slice(&u16::from(BGP_VERSION).to_be_bytes()),
                ),
                OpenError::BadPeerAs(_) => (OPEN_MESSAGE, 2, Bytes::new()),
                OpenError::BadBgpIdentifier(_) => (OPEN_MESSAGE, 3, Bytes::new()),
                OpenError::UnsupportedOptionalParameter(_) => (OPEN_MESSAGE, 4, Bytes::new()),
                OpenError::UnacceptableHoldTime(_) => (OPEN_MESSAGE, 6, Bytes::new()),
                OpenError::UnsupportedCapability(d) => (OPEN_MESSAGE, 7, d.clone()),
            },
            DecodeError::Update(u) => match u {
                UpdateError::MalformedAttributeList => (UPDATE_MESSAGE, 1, Bytes::new()),
                UpdateError::UnrecognizedWellKnownAttribute(d) => (UPDATE_MESSAGE, 2, d.clone()),
                UpdateError::MissingWellKnownAttribute(t) => {
                    (UPDATE_MESSAGE, 3, Bytes::copy_from_slice(&[*t]))
                }
                UpdateError::AttributeFlags(d) => (UPDATE_MESSAGE, 4, d.clone()),
                UpdateError::AttributeLength(d) => (UPDATE_MESSAGE, 5, d.clone()),
                UpdateError::InvalidOrigin(d) => (UPDATE_MESSAGE, 6, d.clone()),
                UpdateError::InvalidNextHop(d) => (UPDATE_MESSAGE, 8, d.clone()),
                UpdateError::OptionalAttribute(d) => (UPDATE_MESSAGE, 9, d.clone()),
                UpdateError::InvalidNetworkField => (UPDATE_MESSAGE, 10, Bytes::new()),
                UpdateError::MalformedAsPath => (UPDATE_MESSAGE, 11, Bytes::new()),
            },
            DecodeError::RouteRefreshLength(l) => {
                (ROUTE_REFRESH, 1, Bytes::copy_from_slice(&l.to_be_bytes()))
            }
            // RFC 4271 §6.4: no NOTIFICATION answers a NOTIFICATION; the
            // connection is closed. This value is never sent.
            DecodeError::NotificationLength => (MESSAGE_HEADER, 2, Bytes::new()),
        };
        NotificationMsg {
            code,
            subcode,
            data,
        }
    }
}

// ===== framing =====

/// The length of the message at the start of `buf`, once its header is in:
/// `Ok(None)` while fewer than 19 octets are buffered. Checks the marker and
/// the length bounds (RFC 4271 §6.1).
pub fn get_message_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[..16] != MARKER {
        return Err(HeaderError::ConnectionNotSynchronized.into());
    }
    let len = u16::from_be_bytes([buf[16], buf[17]]);
    if (len as usize) < HEADER_LEN || len as usize > MAX_MESSAGE_LEN {
        return Err(HeaderError::BadMessageLength(len).into());
    }
    Ok(Some(len as usize))
}

// ===== a bounds-checked reader =====

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    fn remaining(&self) -> usize {
        self.buf.len()
    }
    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn ipv4(&mut self) -> Option<Ipv4Addr> {
        self.u32().map(Ipv4Addr::from)
    }
    fn ipv6(&mut self) -> Option<Ipv6Addr> {
        self.take(16).map(|b| {
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            Ipv6Addr::from(a)
        })
    }
}

// ===== messages =====

/// One BGP message.
// UPDATE is both the largest and by far the most common message: boxing it
// would add an allocation to every one.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Open(OpenMsg),
    Update(UpdateMsg),
    Notification(NotificationMsg),
    Keepalive,
    RouteRefresh(RouteRefreshMsg),
}

impl Message {
    /// Decodes one whole message (header included).
    pub fn decode(buf: &[u8], cxt: &DecodeCxt) -> Result<Message, DecodeError> {
        let len = match get_message_len(buf)? {
            Some(len) if len == buf.len() => len,
            _ => {
                let l = if buf.len() >= 18 {
                    u16::from_be_bytes([buf[16], buf[17]])
                } else {
                    buf.len() as u16
                };
                return Err(HeaderError::BadMessageLength(l).into());
            }
        };
        let kind = buf[18];
        let body = &buf[HEADER_LEN..];
        let len16 = len as u16;
        // Per-type minimum and exact lengths (RFC 4271 §6.1).
        let ok = match kind {
            MSG_OPEN => len >= 29,
            MSG_UPDATE => len >= 23,
            MSG_NOTIFICATION => len >= 21,
            MSG_KEEPALIVE => len == 19,
            MSG_ROUTE_REFRESH => true,
            t => return Err(HeaderError::BadMessageType(t).into()),
        };
        if !ok {
            return Err(HeaderError::BadMessageLength(len16).into());
        }
        match kind {
            MSG_OPEN => OpenMsg::decode_body(body).map(Message::Open),
            MSG_UPDATE => UpdateMsg::decode_body(body, cxt).map(Message::Update),
            MSG_NOTIFICATION => NotificationMsg::decode_body(body).map(Message::Notification),
            MSG_KEEPALIVE => Ok(Message::Keepalive),
            _ => RouteRefreshMsg::decode_body(body, len16).map(Message::RouteRefresh),
        }
    }

    /// Encodes the message, header included.
    pub fn encode(&self, cxt: &EncodeCxt) -> Bytes {
        let mut buf = BytesMut::with_capacity(64);
        self.encode_into(&mut buf, cxt);
        buf.freeze()
    }

    /// Appends the encoded message to `buf`.
    pub fn encode_into(&self, buf: &mut BytesMut, cxt: &EncodeCxt) {
        let start = buf.len();
        buf.put_slice(&MARKER);
        buf.put_u16(0);
        match self {
            Message::Open(m) => {
                buf.put_u8(MSG_OPEN);
                m.encode_body(buf);
            }
            Message::Update(m) => {
                buf.put_u8(MSG_UPDATE);
                m.encode_body(buf, cxt);
            }
            Message::Notification(m) => {
                buf.put_u8(MSG_NOTIFICATION);
                buf.put_u8(m.code);
                buf.put_u8(m.subcode);
                buf.put_slice(&m.data);
            }
            Message::Keepalive => buf.put_u8(MSG_KEEPALIVE),
            Message::RouteRefresh(m) => {
                buf.put_u8(MSG_ROUTE_REFRESH);
                buf.put_u16(m.afi);
                buf.put_u8(m.subtype);
                buf.put_u8(m.safi);
            }
        }
        let len = (buf.len() - start) as u16;
        buf[start + 16..start + 18].copy_from_slice(&len.to_be_bytes());
    }
}

// ===== OPEN =====

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

    fn decode_body(body: &[u8]) -> Result<OpenMsg, DecodeError> {
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

    fn encode_body(&self, buf: &mut BytesMut) {
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
    fn decode(code: u8, val: &[u8]) -> Option<Capability> {
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

    fn encode(&self, buf: &mut BytesMut) {
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

// ===== NOTIFICATION, ROUTE-REFRESH =====

/// A NOTIFICATION message (RFC 4271 §4.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotificationMsg {
    pub code: u8,
    pub subcode: u8,
    pub data: Bytes,
}

impl NotificationMsg {
    pub fn new(code: u8, subcode: u8) -> Self {
        Self {
            code,
            subcode,
            data: Bytes::new(),
        }
    }

    fn decode_body(body: &[u8]) -> Result<NotificationMsg, DecodeError> {
        if body.len() < 2 {
            return Err(DecodeError::NotificationLength);
        }
        Ok(NotificationMsg {
            code: body[0],
            subcode: body[1],
            data: Bytes::copy_from_slice(&body[2..]),
        })
    }
}

/// A ROUTE-REFRESH message (RFC 2918; `subtype` from RFC 7313, 0 = normal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteRefreshMsg {
    pub afi: u16,
    pub subtype: u8,
    pub safi: u8,
}

impl RouteRefreshMsg {
    fn decode_body(body: &[u8], len: u16) -> Result<RouteRefreshMsg, DecodeError> {
        if body.len() != 4 {
            return Err(DecodeError::RouteRefreshLength(len));
        }
        Ok(RouteRefreshMsg {
            afi: u16::from_be_bytes([body[0], body[1]]),
            subtype: body[2],
            safi: body[3],
        })
    }
}

// ===== UPDATE =====

/// An UPDATE message (RFC 4271 §4.3) with its multiprotocol parts.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UpdateMsg {
    pub withdrawn: Vec<Ipv4Net>,
    pub attrs: Option<Attrs>,
    pub nlri: Vec<Ipv4Net>,
    pub mp_reach: Option<MpReach>,
    pub mp_unreach: Option<MpUnreach>,
    /// RFC 7606: the attributes were malformed in a way that turns every
    /// announced prefix of this message into a withdrawal. Holds the error
    /// RFC 4271 would have sent, for the log.
    pub treat_as_withdraw: Option<UpdateError>,
    /// RFC 7606: attributes dropped as malformed (type codes), for the log.
    pub discarded: Vec<u8>,
}

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

    fn decode(val: &[u8], four: bool) -> Option<AsPath> {
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

    fn encode(&self, buf: &mut BytesMut, four: bool) {
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
enum AttrFault {
    /// Session reset: a NOTIFICATION with this error.
    Reset(UpdateError),
    /// Treat-as-withdraw (RFC 7606 §2), with the RFC 4271 error.
    Withdraw(UpdateError),
    /// Attribute discard (RFC 7606 §2), with the RFC 4271 error.
    Discard(UpdateError),
}

fn decode_prefixes_v4(buf: &[u8]) -> Result<Vec<Ipv4Net>, UpdateError> {
    let mut r = Reader::new(buf);
    let mut out = Vec::new();
    while !r.is_empty() {
        let len = r.u8().ok_or(UpdateError::InvalidNetworkField)?;
        if len > 32 {
            return Err(UpdateError::InvalidNetworkField);
        }
        let octets = r
            .take(usize::from(len).div_ceil(8))
            .ok_or(UpdateError::InvalidNetworkField)?;
        let mut a = [0u8; 4];
        a[..octets.len()].copy_from_slice(octets);
        let net =
            Ipv4Net::new(Ipv4Addr::from(a), len).map_err(|_| UpdateError::InvalidNetworkField)?;
        out.push(net.trunc());
    }
    Ok(out)
}

fn decode_prefixes_v6(buf: &[u8]) -> Option<Vec<Ipv6Net>> {
    let mut r = Reader::new(buf);
    let mut out = Vec::new();
    while !r.is_empty() {
        let len = r.u8()?;
        if len > 128 {
            return None;
        }
        let octets = r.take(usize::from(len).div_ceil(8))?;
        let mut a = [0u8; 16];
        a[..octets.len()].copy_from_slice(octets);
        out.push(Ipv6Net::new(Ipv6Addr::from(a), len).ok()?.trunc());
    }
    Some(out)
}

fn encode_prefix(buf: &mut BytesMut, net: &IpNet) {
    let len = net.prefix_len();
    buf.put_u8(len);
    let n = usize::from(len).div_ceil(8);
    match net {
        IpNet::V4(n4) => buf.put_slice(&n4.addr().octets()[..n]),
        IpNet::V6(n6) => buf.put_slice(&n6.addr().octets()[..n]),
    }
}

/// The raw attribute (flags, type, length, value) for NOTIFICATION data.
fn attr_data(flags: u8, code: u8, val: &[u8]) -> Bytes {
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

impl UpdateMsg {
    /// An End-of-RIB marker (RFC 4724 §2) for the family.
    pub fn end_of_rib(afi: u16, safi: u8) -> UpdateMsg {
        if afi == AFI_IPV4 && safi == SAFI_UNICAST {
            return UpdateMsg::default();
        }
        UpdateMsg {
            mp_unreach: Some(MpUnreach {
                afi,
                safi,
                withdrawn: Vec::new(),
            }),
            ..Default::default()
        }
    }

    /// The family this message marks the end of the RIB for, if it is an
    /// End-of-RIB marker.
    pub fn end_of_rib_family(&self) -> Option<(u16, u8)> {
        if !self.withdrawn.is_empty() || !self.nlri.is_empty() || self.mp_reach.is_some() {
            return None;
        }
        match (&self.attrs, &self.mp_unreach) {
            (None, None) => Some((AFI_IPV4, SAFI_UNICAST)),
            (None, Some(u)) if u.withdrawn.is_empty() => Some((u.afi, u.safi)),
            _ => None,
        }
    }

    fn decode_body(body: &[u8], cxt: &DecodeCxt) -> Result<UpdateMsg, DecodeError> {
        let mut r = Reader::new(body);
        let malformed = || DecodeError::from(UpdateError::MalformedAttributeList);
        // RFC 4271 §6.3: lengths that do not add up are a Malformed
        // Attribute List; RFC 7606 §4 keeps that a session reset.
        let wlen = r.u16().ok_or_else(malformed)? as usize;
        let wbuf = r.take(wlen).ok_or_else(malformed)?;
        let alen = r.u16().ok_or_else(malformed)? as usize;
        let abuf = r.take(alen).ok_or_else(malformed)?;
        let nbuf = r.take(r.remaining()).unwrap_or_default();
        let withdrawn = decode_prefixes_v4(wbuf)?;
        let nlri = decode_prefixes_v4(nbuf)?;
        let mut msg = UpdateMsg {
            withdrawn,
            nlri,
            ..Default::default()
        };
        if abuf.is_empty() {
            if !msg.nlri.is_empty() {
                // NLRI without any attribute: the mandatory ones are missing.
                let e = UpdateError::MissingWellKnownAttribute(ATTR_ORIGIN);
                if !cxt.revised_error_handling {
                    return Err(e.into());
                }
                msg.treat_as_withdraw = Some(e);
            }
            return Ok(msg);
        }
        let mut attrs = Attrs::default();
        let mut seen = [false; 256];
        let mut a = Reader::new(abuf);
        while !a.is_empty() {
            let flags = a.u8().ok_or_else(malformed)?;
            let Some(code) = a.u8() else {
                // A lone flags octet at the end: the list is cut short.
                fault(
                    &mut msg,
                    cxt,
                    AttrFault::Withdraw(UpdateError::MalformedAttributeList),
                )?;
                break;
            };
            let len = if flags & FLAG_EXTENDED_LEN != 0 {
                a.u16().map(usize::from)
            } else {
                a.u8().map(usize::from)
            };
            // RFC 7606 §4: an attribute that overruns the attribute field
            // makes the rest unparseable: treat-as-withdraw.
            let Some(val) = len.and_then(|l| a.take(l)) else {
                let data = attr_data(flags, code, a.take(a.remaining()).unwrap_or_default());
                fault(
                    &mut msg,
                    cxt,
                    AttrFault::Withdraw(UpdateError::AttributeLength(data)),
                )?;
                break;
            };
            if seen[code as usize] {
                // RFC 7606 §3 g: duplicates are discarded, except the MP ones.
                if code == ATTR_MP_REACH || code == ATTR_MP_UNREACH || !cxt.revised_error_handling {
                    return Err(malformed());
                }
                continue;
            }
            seen[code as usize] = true;
            if let Err(f) = decode_attr(flags, code, val, cxt, &mut attrs, &mut msg) {
                fault(&mut msg, cxt, f)?;
            }
        }
        let has_nlri = !msg.nlri.is_empty();
        // RFC 4271 §6.3 missing mandatory attributes (RFC 7606 §3 d:
        // treat-as-withdraw). NEXT_HOP only matters for IPv4 NLRI.
        let missing = if attrs.origin.is_none() && !seen[ATTR_ORIGIN as usize] {
            Some(ATTR_ORIGIN)
        } else if attrs.as_path.is_none() && !seen[ATTR_AS_PATH as usize] {
            Some(ATTR_AS_PATH)
        } else if has_nlri && attrs.next_hop.is_none() && !seen[ATTR_NEXT_HOP as usize] {
            Some(ATTR_NEXT_HOP)
        } else {
            None
        };
        if let Some(t) = missing
            && (has_nlri || msg.mp_reach.is_some())
        {
            fault(
                &mut msg,
                cxt,
                AttrFault::Withdraw(UpdateError::MissingWellKnownAttribute(t)),
            )?;
        }
        // An attribute list that kept nothing reads as no attributes, so
        // that decoding our own encoding gives the same value.
        msg.attrs = (attrs != Attrs::default()).then_some(attrs);
        Ok(msg)
    }

    fn encode_body(&self, buf: &mut BytesMut, cxt: &EncodeCxt) {
        let wl_at = buf.len();
        buf.put_u16(0);
        for w in &self.withdrawn {
            encode_prefix(buf, &IpNet::V4(*w));
        }
        let wl = (buf.len() - wl_at - 2) as u16;
        buf[wl_at..wl_at + 2].copy_from_slice(&wl.to_be_bytes());
        let al_at = buf.len();
        buf.put_u16(0);
        if let Some(a) = &self.attrs {
            a.encode(buf, cxt, self.mp_reach.as_ref(), self.mp_unreach.as_ref());
        } else if self.mp_reach.is_some() || self.mp_unreach.is_some() {
            Attrs::default().encode(buf, cxt, self.mp_reach.as_ref(), self.mp_unreach.as_ref());
        }
        let al = (buf.len() - al_at - 2) as u16;
        buf[al_at..al_at + 2].copy_from_slice(&al.to_be_bytes());
        for n in &self.nlri {
            encode_prefix(buf, &IpNet::V4(*n));
        }
    }
}

/// Applies an attribute fault: an `Err` to reset the session, or records
/// the RFC 7606 outcome in `msg`.
fn fault(msg: &mut UpdateMsg, cxt: &DecodeCxt, f: AttrFault) -> Result<(), DecodeError> {
    match f {
        AttrFault::Reset(e) => Err(e.into()),
        AttrFault::Withdraw(e) | AttrFault::Discard(e) if !cxt.revised_error_handling => {
            Err(e.into())
        }
        AttrFault::Withdraw(e) => {
            if msg.treat_as_withdraw.is_none() {
                msg.treat_as_withdraw = Some(e);
            }
            Ok(())
        }
        AttrFault::Discard(_) => Ok(()),
    }
}

fn expected_flags(code: u8) -> Option<u8> {
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

fn decode_attr(
    flags: u8,
    code: u8,
    val: &[u8],
    cxt: &DecodeCxt,
    attrs: &mut Attrs,
    msg: &mut UpdateMsg,
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
            msg.mp_reach = decode_mp_reach(val)
                .map(Some)
                .map_err(AttrFault::Reset)?
                .flatten();
        }
        ATTR_MP_UNREACH => {
            msg.mp_unreach = decode_mp_unreach(val).map_err(AttrFault::Reset)?;
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
fn decode_mp_reach(val: &[u8]) -> Result<Option<MpReach>, UpdateError> {
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

fn decode_mp_unreach(val: &[u8]) -> Result<Option<MpUnreach>, UpdateError> {
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

fn put_attr(buf: &mut BytesMut, flags: u8, code: u8, body: impl FnOnce(&mut BytesMut)) {
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

    fn encode(
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

//! The BGP-4 message codec (RFC 4271 §4) as owned types.
//!
//! `Message::decode(&[u8], &DecodeCxt)` takes one whole message (framed with
//! [`get_message_len`]) and `Message::encode(&EncodeCxt)` writes one. Every
//! decode error carries what RFC 4271 §6 needs to build the NOTIFICATION
//! (`From<&DecodeError> for NotificationMsg`). With
//! [`DecodeCxt::revised_error_handling`] (RFC 7606, the default) the errors
//! that RFC 7606 downgrades come back inside an `Ok` UPDATE as
//! "treat-as-withdraw" or as a discarded attribute instead of an `Err`.

mod attr;
mod error;
mod notification;
mod open;
mod prefix;
mod update;

pub use attr::{AsPath, AsSegment, AsSegmentKind, Attrs, MpReach, MpUnreach, Origin, UnknownAttr};
pub use error::{DecodeError, HeaderError, OpenError, UpdateError, cease, error_code};
pub use notification::{NotificationMsg, RouteRefreshMsg};
pub use open::{Capability, GracefulRestartCap, OpenMsg};
pub use update::UpdateMsg;

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes, BytesMut};

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

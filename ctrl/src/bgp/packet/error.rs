//! Decode errors and the NOTIFICATION each one asks for (RFC 4271 §6).

use std::net::Ipv4Addr;

use bytes::Bytes;
use thiserror::Error;

use super::{BGP_VERSION, NotificationMsg};

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

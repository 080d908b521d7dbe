//! NOTIFICATION (RFC 4271 §4.5) and ROUTE-REFRESH (RFC 2918).

use bytes::Bytes;

use super::DecodeError;

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

    pub(super) fn decode_body(body: &[u8]) -> Result<NotificationMsg, DecodeError> {
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
    pub(super) fn decode_body(body: &[u8], len: u16) -> Result<RouteRefreshMsg, DecodeError> {
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

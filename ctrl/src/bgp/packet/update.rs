//! UPDATE (RFC 4271 §4.3): withdrawn routes, path attributes, NLRI, and the prefix codec.

use bytes::{BufMut, BytesMut};
use ipnet::{IpNet, Ipv4Net};

use super::attr::{
    ATTR_AS_PATH, ATTR_MP_REACH, ATTR_MP_UNREACH, ATTR_NEXT_HOP, ATTR_ORIGIN, AttrFault, Attrs,
    FLAG_EXTENDED_LEN, MpReach, MpUnreach, attr_data, decode_attr,
};
use super::prefix::{decode_prefixes_v4, encode_prefix};
use super::{AFI_IPV4, DecodeCxt, DecodeError, EncodeCxt, Reader, SAFI_UNICAST, UpdateError};

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

/// Applies an attribute fault: an `Err` to reset the session, or records
/// the RFC 7606 outcome in `msg`.
pub(super) fn fault(msg: &mut UpdateMsg, cxt: &DecodeCxt, f: AttrFault) -> Result<(), DecodeError> {
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

    pub(super) fn decode_body(body: &[u8], cxt: &DecodeCxt) -> Result<UpdateMsg, DecodeError> {
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
            if let Err(f) = decode_attr(
                flags,
                code,
                val,
                cxt,
                &mut attrs,
                &mut msg.mp_reach,
                &mut msg.mp_unreach,
            ) {
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

    pub(super) fn encode_body(&self, buf: &mut BytesMut, cxt: &EncodeCxt) {
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

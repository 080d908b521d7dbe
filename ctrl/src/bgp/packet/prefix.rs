//! Prefixes as NLRI and withdrawn routes carry them (RFC 4271 §4.3,
//! RFC 4760 §5): a length in bits, then the fewest octets that hold it.

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, BytesMut};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{Reader, UpdateError};

pub(super) fn decode_prefixes_v4(buf: &[u8]) -> Result<Vec<Ipv4Net>, UpdateError> {
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

pub(super) fn decode_prefixes_v6(buf: &[u8]) -> Option<Vec<Ipv6Net>> {
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

pub(super) fn encode_prefix(buf: &mut BytesMut, net: &IpNet) {
    let len = net.prefix_len();
    buf.put_u8(len);
    let n = usize::from(len).div_ceil(8);
    match net {
        IpNet::V4(n4) => buf.put_slice(&n4.addr().octets()[..n]),
        IpNet::V6(n6) => buf.put_slice(&n6.addr().octets()[..n]),
    }
}

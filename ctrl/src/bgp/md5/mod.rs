//! TCP-MD5 signatures (RFC 2385) via `setsockopt(TCP_MD5SIG)`: the one
//! socket option of this crate that neither nix nor socket2 wraps. The
//! option's `struct tcp_md5sig` is built here as bytes, without `unsafe`;
//! the system call itself is in [`sys`].

mod sys;

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

/// Linux's `TCP_MD5SIG_MAXKEYLEN`.
pub const MAX_KEY_LEN: usize = 80;

/// `sizeof(struct __kernel_sockaddr_storage)`.
const SOCKADDR_STORAGE_LEN: usize = 128;
/// `sizeof(struct tcp_md5sig)` from `<linux/tcp.h>`: the address, flags,
/// prefix length, key length, interface index and key.
const TCP_MD5SIG_LEN: usize = SOCKADDR_STORAGE_LEN + 1 + 1 + 2 + 4 + MAX_KEY_LEN;

/// Installs (or with `None` removes) the MD5 key for segments to and from
/// `peer` on `socket`. On a listening socket this covers the connections it
/// accepts from `peer`. `v6_socket`: the socket is AF_INET6, so an IPv4 peer
/// is written as a v4-mapped address.
pub fn set_md5_key(
    socket: BorrowedFd<'_>,
    peer: IpAddr,
    key: Option<&[u8]>,
    v6_socket: bool,
) -> io::Result<()> {
    let key = key.unwrap_or_default();
    if key.len() > MAX_KEY_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TCP-MD5 key longer than 80 bytes",
        ));
    }
    let peer = match (peer, v6_socket) {
        (IpAddr::V4(a), true) => IpAddr::V6(a.to_ipv6_mapped()),
        (p, _) => p,
    };
    sys::set_tcp_md5sig(socket, &tcp_md5sig(peer, key))
}

/// `struct tcp_md5sig` for `peer` and `key` (at most [`MAX_KEY_LEN`]
/// octets) in the machine's byte order, the port and address in network
/// order as in a `sockaddr_in`/`sockaddr_in6`.
fn tcp_md5sig(peer: IpAddr, key: &[u8]) -> [u8; TCP_MD5SIG_LEN] {
    let mut sig = [0u8; TCP_MD5SIG_LEN];
    // sockaddr_in: family, port (0), address; sockaddr_in6: family, port
    // (0), flow info (0), address, scope id (0).
    match peer {
        IpAddr::V4(a) => {
            sig[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            sig[4..8].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            sig[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            sig[8..24].copy_from_slice(&a.octets());
        }
    }
    let at = SOCKADDR_STORAGE_LEN;
    // flags and prefix length stay 0 (whole address, no interface).
    sig[at + 2..at + 4].copy_from_slice(&(key.len() as u16).to_ne_bytes());
    sig[at + 8..at + 8 + key.len()].copy_from_slice(key);
    sig
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_is_laid_out_as_linux_struct_tcp_md5sig() {
        assert_eq!(TCP_MD5SIG_LEN, 216);
        let sig = tcp_md5sig("192.0.2.7".parse().unwrap(), b"secret");
        assert_eq!(u16::from_ne_bytes([sig[0], sig[1]]), libc::AF_INET as u16);
        assert_eq!(&sig[4..8], &[192, 0, 2, 7]);
        assert_eq!(u16::from_ne_bytes([sig[130], sig[131]]), 6);
        assert_eq!(&sig[136..142], b"secret");
        assert!(sig[142..].iter().all(|b| *b == 0));
        let sig = tcp_md5sig("2001:db8::1".parse().unwrap(), b"");
        assert_eq!(u16::from_ne_bytes([sig[0], sig[1]]), libc::AF_INET6 as u16);
        assert_eq!(sig[8], 0x20);
        assert_eq!(sig[23], 1);
    }

    #[test]
    fn a_key_on_a_tcp_socket_is_accepted_and_a_long_one_refused() {
        use std::os::fd::AsFd;
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer: IpAddr = "127.0.0.2".parse().unwrap();
        set_md5_key(s.as_fd(), peer, Some(b"secret"), false).unwrap();
        set_md5_key(s.as_fd(), peer, None, false).unwrap();
        let e = set_md5_key(s.as_fd(), peer, Some(&[b'x'; 81]), false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

//! The speaker's configuration, its errors and its status rows: the types
//! shared by the live speaker ([`super::speaker`]), its Sans-IO core
//! ([`super::core`]) and the replay ([`super::record`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;
use thiserror::Error;

use super::fsm::State;
use super::packet::{AFI_IPV4, AFI_IPV6, SAFI_UNICAST};

/// The standard BGP port.
pub const BGP_PORT: u16 = 179;

// ===== configuration =====

/// The speaker as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeakerConfig {
    pub local_as: u32,
    pub router_id: Ipv4Addr,
    /// Where to accept connections (`0.0.0.0:179` usually; port 0 picks a
    /// free port, see [`super::speaker::Speaker::listen_addr`]); `None` for no listener.
    pub listen: Option<SocketAddr>,
    /// Route-reflector cluster ID (RFC 4456); the router ID by default.
    pub cluster_id: Option<Ipv4Addr>,
    /// Restart time we announce for graceful restart (RFC 4724); `None`
    /// leaves the capability out.
    pub graceful_restart_time: Option<u16>,
    /// Next hop for IPv6 routes we announce over IPv4 sessions.
    pub ipv6_next_hop: Option<Ipv6Addr>,
    /// Record every input of the speaker (commands, connections, received
    /// messages, timer events) as JSON lines to this file, for
    /// [`super::record::Replay`].
    pub record: Option<std::path::PathBuf>,
}

impl SpeakerConfig {
    pub fn new(local_as: u32, router_id: Ipv4Addr) -> Self {
        Self {
            local_as,
            router_id,
            listen: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), BGP_PORT)),
            cluster_id: None,
            graceful_restart_time: Some(120),
            ipv6_next_hop: None,
            record: None,
        }
    }
}

/// One neighbour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    pub address: IpAddr,
    /// The peer's port for our outgoing connections.
    pub port: u16,
    pub remote_as: u32,
    /// TCP-MD5 password (RFC 2385).
    pub password: Option<String>,
    /// Close the session (Cease/1) when the peer sends more prefixes.
    pub max_prefixes: Option<u32>,
    /// The peer is our route-reflector client.
    pub rr_client: bool,
    pub hold_time: u16,
    pub keepalive: Option<u16>,
    pub connect_retry: u16,
    /// Only accept connections, never open one.
    pub passive: bool,
    /// Source address of our connections.
    pub local_address: Option<IpAddr>,
    pub families: Vec<(u16, u8)>,
}

impl PeerConfig {
    pub fn new(address: IpAddr, remote_as: u32) -> Self {
        Self {
            address,
            port: BGP_PORT,
            remote_as,
            password: None,
            max_prefixes: None,
            rr_client: false,
            hold_time: 90,
            keepalive: None,
            connect_retry: 5,
            passive: false,
            local_address: None,
            families: vec![(AFI_IPV4, SAFI_UNICAST), (AFI_IPV6, SAFI_UNICAST)],
        }
    }

    pub(crate) fn validate(&self) -> Result<(), SpeakerError> {
        let bad = |reason| SpeakerError::InvalidPeer {
            address: self.address,
            reason,
        };
        if self.hold_time == 1 || self.hold_time == 2 {
            return Err(bad("hold time must be 0 or at least 3 seconds"));
        }
        if self.keepalive == Some(0) {
            return Err(bad("keepalive must be at least 1 second"));
        }
        if self.connect_retry == 0 {
            return Err(bad("connect retry must be at least 1 second"));
        }
        if self
            .password
            .as_ref()
            .is_some_and(|p| p.len() > super::md5::MAX_KEY_LEN)
        {
            return Err(bad("password longer than 80 bytes"));
        }
        if self.families.is_empty() {
            return Err(bad("no address family"));
        }
        Ok(())
    }
}

/// Errors of the speaker API.
#[derive(Debug, Error)]
pub enum SpeakerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot set the TCP-MD5 key for {peer}: {source}")]
    Md5 {
        peer: IpAddr,
        source: std::io::Error,
    },
    #[error("peer {address}: {reason}")]
    InvalidPeer {
        address: IpAddr,
        reason: &'static str,
    },
    #[error("peer {0} already exists")]
    PeerExists(IpAddr),
    #[error("no peer {0}")]
    NoSuchPeer(IpAddr),
    #[error("the speaker has stopped")]
    Stopped,
    #[error("cannot record to {path}: {source}")]
    Record {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// A row of `brindlectl bgp peers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerStatus {
    pub address: IpAddr,
    pub remote_as: u32,
    pub state: State,
    pub rr_client: bool,
    /// Seconds since the session came up.
    pub uptime_secs: Option<u64>,
    pub prefixes_in: usize,
    pub prefixes_out: usize,
    pub updates_in: u64,
    pub updates_out: u64,
    pub last_error: Option<String>,
}

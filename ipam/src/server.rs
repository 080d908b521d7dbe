//! The node daemon's side of the IPAM protocol: answers
//! [`brindle_api::ipam::IpamRequest`]s against an [`Ipam`]. The daemon mounts
//! [`handle_request`] on `/run/brindle/ctrl.sock` (one line in, one
//! [`Reply`] line out); [`serve_connection`] does that loop for one accepted
//! stream, for the daemon and for tests.

use std::io::{BufRead, Write};

use brindle_api::framing::{
    self, FramingError, PROTOCOL_VERSION, RemoteError, RemoteErrorKind, Reply,
};
use brindle_api::ipam::{AllocateResult, IpamOp, IpamRequest, ReleaseResult};
use serde_json::Value;

use crate::allocator::{AllocateArgs, Ipam, IpamError};
use crate::store::Datastore;

fn remote(e: IpamError) -> RemoteError {
    RemoteError {
        kind: e.kind(),
        message: e.to_string(),
    }
}

fn ok<T: serde::Serialize>(v: T) -> Reply<Value> {
    match serde_json::to_value(v) {
        Ok(result) => Reply::Ok { result },
        Err(e) => Reply::Error(RemoteError {
            kind: RemoteErrorKind::Internal,
            message: e.to_string(),
        }),
    }
}

/// Answers one request. The result is a JSON value so that one socket can
/// serve every request type; its shape is the type named on each
/// [`IpamOp`] variant.
pub fn handle_request<S: Datastore>(ipam: &Ipam<S>, req: IpamRequest) -> Reply<Value> {
    if req.v != PROTOCOL_VERSION {
        return Reply::Error(RemoteError {
            kind: RemoteErrorKind::InvalidRequest,
            message: format!(
                "protocol version {} not supported (this daemon speaks {PROTOCOL_VERSION})",
                req.v
            ),
        });
    }
    let r = match req.op {
        IpamOp::IpamAllocate {
            handle,
            node,
            node_labels,
            attrs,
            pools,
            ipv4,
            ipv6,
        } => ipam
            .allocate(&AllocateArgs {
                handle,
                node,
                node_labels,
                attrs,
                pools,
                ipv4,
                ipv6,
            })
            .map(|addresses| ok(AllocateResult { addresses })),
        IpamOp::IpamReleaseHandle { handle } => ipam
            .release_handle(&handle)
            .map(|released| ok(ReleaseResult { released })),
        IpamOp::IpamReleaseAddress { address } => ipam.release_address(address).map(|r| {
            ok(ReleaseResult {
                released: r.into_iter().collect(),
            })
        }),
        IpamOp::IpamQueryHandle { handle } => match ipam.query_handle(&handle) {
            Ok(Some(v)) => Ok(ok(v)),
            Ok(None) => Err(IpamError::NotFound(format!("handle {handle}"))),
            Err(e) => Err(e),
        },
        IpamOp::IpamListPools => ipam.pools().map(ok),
        IpamOp::IpamListBlocks => ipam.blocks().map(ok),
        IpamOp::IpamListHandles => ipam.handles().map(ok),
        IpamOp::IpamGcAttachments {
            network,
            node,
            valid,
        } => ipam.gc_attachments(&network, &node, &valid).map(ok),
        IpamOp::IpamGcNodes { live_nodes } => ipam.gc_nodes(&live_nodes).map(ok),
        IpamOp::IpamStatus => ipam.status().map(ok),
    };
    r.unwrap_or_else(|e| Reply::Error(remote(e)))
}

/// Serves requests from one connection until the peer closes it. A line that
/// is not a valid request gets an `invalid_request` reply and the connection
/// continues.
pub fn serve_connection<S: Datastore, R: BufRead, W: Write>(
    ipam: &Ipam<S>,
    mut reader: R,
    mut writer: W,
) -> Result<(), FramingError> {
    loop {
        let reply = match framing::read_message::<_, IpamRequest>(&mut reader) {
            Ok(None) => return Ok(()),
            Ok(Some(req)) => handle_request(ipam, req),
            Err(FramingError::Malformed(e)) => Reply::Error(RemoteError {
                kind: RemoteErrorKind::InvalidRequest,
                message: format!("not an IPAM request: {e}"),
            }),
            Err(e) => return Err(e),
        };
        framing::write_message(&mut writer, &reply)?;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use brindle_api::ipam::{AllocateResult, HandleId, IpamRequest};

    use super::*;
    use crate::model::Pool;
    use crate::store::MemoryStore;

    fn ipam() -> Ipam<MemoryStore> {
        let ipam = Ipam::new(MemoryStore::new(), "/t");
        ipam.put_pool(&Pool::new("p", "10.3.0.0/24".parse().unwrap()))
            .unwrap();
        ipam
    }

    fn allocate(c: &str) -> IpamOp {
        IpamOp::IpamAllocate {
            handle: HandleId {
                network: "net".into(),
                container_id: c.into(),
                ifname: "eth0".into(),
            },
            node: "n1".into(),
            node_labels: Default::default(),
            attrs: Default::default(),
            pools: Vec::new(),
            ipv4: true,
            ipv6: false,
        }
    }

    #[test]
    fn another_protocol_version_is_refused_as_invalid() {
        let req = IpamRequest {
            v: PROTOCOL_VERSION + 1,
            op: IpamOp::IpamStatus,
        };
        match handle_request(&ipam(), req) {
            Reply::Error(e) => assert_eq!(e.kind, RemoteErrorKind::InvalidRequest),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn an_unknown_handle_query_is_not_found_and_a_bad_handle_is_invalid() {
        let i = ipam();
        let q = |c: &str| {
            handle_request(
                &i,
                IpamRequest::new(IpamOp::IpamQueryHandle {
                    handle: HandleId {
                        network: "net".into(),
                        container_id: c.into(),
                        ifname: "eth0".into(),
                    },
                }),
            )
        };
        assert!(matches!(
            q("nope"),
            Reply::Error(RemoteError {
                kind: RemoteErrorKind::NotFound,
                ..
            })
        ));
        assert!(matches!(
            q("a/b"),
            Reply::Error(RemoteError {
                kind: RemoteErrorKind::InvalidRequest,
                ..
            })
        ));
    }

    #[test]
    fn a_connection_survives_a_garbage_line_and_answers_the_next_request() {
        let i = ipam();
        let mut input = b"this is not json\n".to_vec();
        framing::write_message(&mut input, &IpamRequest::new(allocate("c1"))).unwrap();
        let mut output = Vec::new();
        serve_connection(&i, Cursor::new(input), &mut output).unwrap();
        let mut r = Cursor::new(output);
        let first: Reply<Value> = framing::read_message(&mut r).unwrap().unwrap();
        assert!(matches!(
            first,
            Reply::Error(RemoteError {
                kind: RemoteErrorKind::InvalidRequest,
                ..
            })
        ));
        let second: Reply<AllocateResult> = framing::read_message(&mut r).unwrap().unwrap();
        let got = second.into_result().unwrap();
        assert_eq!(got.addresses.len(), 1);
        assert!(
            got.addresses[0]
                .block
                .contains(&got.addresses[0].address.addr())
        );
    }

    #[test]
    fn an_exhausted_pool_is_reported_with_the_exhausted_kind() {
        let i = Ipam::new(MemoryStore::new(), "/t");
        let mut p = Pool::new("p", "10.4.0.0/32".parse().unwrap());
        p.block_size = Some(32);
        i.put_pool(&p).unwrap();
        assert!(matches!(
            handle_request(&i, IpamRequest::new(allocate("a"))),
            Reply::Ok { .. }
        ));
        match handle_request(&i, IpamRequest::new(allocate("b"))) {
            Reply::Error(e) => assert_eq!(e.kind, RemoteErrorKind::Exhausted),
            other => panic!("expected exhausted, got {other:?}"),
        }
    }
}

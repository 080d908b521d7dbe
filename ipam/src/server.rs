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

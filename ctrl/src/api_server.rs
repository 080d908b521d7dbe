//! `/run/brindle/ctrl.sock`: one thread per connection, one request per
//! line, dispatched by `op`: `ipam_*` to the IPAM server of `brindle-ipam`,
//! `ctrl_*` to the daemon's own ops, `policy_*` to the policy resources
//! (`crate::policy::ops`), the rest to the endpoint handler.
//!
//! Threads rather than tasks because every op does blocking datastore I/O
//! (the etcd backend runs its own runtime and blocks on it), and the
//! connections are few (one per CNI invocation).

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use brindle_api::endpoint::EndpointRequest;
use brindle_api::framing::{self, FramingError, RemoteError, RemoteErrorKind, Reply};
use brindle_api::ipam::IpamRequest;
use brindle_ipam::Ipam;
use brindle_ipam::store::Datastore;
use serde_json::Value;
use tracing::{debug, warn};

use crate::ctrl_api::{CtrlRequest, is_ctrl_op};
use crate::endpoints::EndpointHandler;
use crate::metrics::{Metrics, op_label};
use crate::policy::ops::{PolicyOps, PolicyRequest, is_policy_op};

/// Answers the `ctrl_*` ops (implemented by the daemon).
pub trait CtrlOps: Send + Sync {
    /// Answers one request.
    fn handle(&self, req: CtrlRequest) -> Reply<Value>;
}

/// Everything the socket serves.
pub struct ApiServer {
    /// The IPAM.
    pub ipam: Arc<Ipam<Arc<dyn Datastore>>>,
    /// The endpoint handler.
    pub endpoints: Arc<EndpointHandler>,
    /// The daemon's own ops.
    pub ctrl: Arc<dyn CtrlOps>,
    /// The policy resources (`brindlectl apply|delete|get`).
    pub policy: Arc<PolicyOps>,
    /// Where the time of each request is observed, by op.
    pub metrics: Arc<Metrics>,
}

fn invalid(message: String) -> Reply<Value> {
    Reply::Error(RemoteError {
        kind: RemoteErrorKind::InvalidRequest,
        message,
    })
}

impl ApiServer {
    /// Answers one request line (already parsed as JSON).
    pub fn dispatch(&self, line: Value) -> Reply<Value> {
        let op = line
            .get("op")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if op.starts_with("ipam_") {
            match serde_json::from_value::<IpamRequest>(line) {
                Ok(req) => brindle_ipam::server::handle_request(&self.ipam, req),
                Err(e) => invalid(format!("not an IPAM request: {e}")),
            }
        } else if is_ctrl_op(&op) {
            match serde_json::from_value::<CtrlRequest>(line) {
                Ok(req) => self.ctrl.handle(req),
                Err(e) => invalid(format!("not a ctrl request: {e}")),
            }
        } else if is_policy_op(&op) {
            match serde_json::from_value::<PolicyRequest>(line) {
                Ok(req) => self.policy.handle(req),
                Err(e) => invalid(format!("not a policy request: {e}")),
            }
        } else {
            match serde_json::from_value::<EndpointRequest>(line) {
                Ok(req) => self.endpoints.handle(req),
                Err(e) => invalid(format!("unknown or malformed request (op {op:?}): {e}")),
            }
        }
    }

    /// Serves one connection until the peer closes it.
    pub fn serve_connection(&self, stream: UnixStream) -> Result<(), FramingError> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        loop {
            let reply = match framing::read_message::<_, Value>(&mut reader) {
                Ok(None) => return Ok(()),
                Ok(Some(line)) => {
                    let started = Instant::now();
                    let op = op_label(line.get("op").and_then(Value::as_str).unwrap_or(""));
                    let reply = self.dispatch(line);
                    self.metrics
                        .api_request_seconds
                        .get_or_create(&op)
                        .observe(started.elapsed().as_secs_f64());
                    reply
                }
                Err(FramingError::Malformed(e)) => invalid(format!("not JSON: {e}")),
                Err(e) => return Err(e),
            };
            framing::write_message(&mut writer, &reply)?;
        }
    }
}

/// Binds the socket at `path`: removes a stale one (a daemon already running
/// holds the datastore lock, so we only get here when it is stale), creates
/// the directory, and makes the socket 0600 (root only).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => debug!(path = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts connections forever, one thread each.
pub fn serve(listener: UnixListener, server: Arc<ApiServer>) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let server = server.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("ctrl-conn".into())
                        .spawn(move || {
                            if let Err(e) = server.serve_connection(stream) {
                                debug!(error = %e, "api connection ended");
                            }
                        });
                if let Err(e) = spawned {
                    warn!(error = %e, "cannot start a connection thread");
                }
            }
            Err(e) => warn!(error = %e, "accept on the api socket failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use brindle_api::framing::Client;
    use brindle_ipam::model::Pool;
    use brindle_ipam::store::MemoryStore;
    use serde_json::json;

    use super::*;
    use crate::endpoints::EndpointStore;
    use crate::health::Health;

    struct FixedCtrl;

    impl CtrlOps for FixedCtrl {
        fn handle(&self, req: CtrlRequest) -> Reply<Value> {
            Reply::Ok {
                result: json!({ "asked": format!("{req:?}") }),
            }
        }
    }

    fn server() -> Arc<ApiServer> {
        let store: Arc<dyn Datastore> = Arc::new(MemoryStore::new());
        let ipam = Ipam::new(store.clone(), "/brindle/ipam");
        ipam.put_pool(&Pool::new("p", "10.3.0.0/24".parse().unwrap()))
            .unwrap();
        // Endpoint changes are not looked at here.
        let (_, health) = tokio::sync::watch::channel(Health {
            datastore_ok: true,
            vrouter_reachable: Some(true),
        });
        Arc::new(ApiServer {
            ipam: Arc::new(ipam),
            policy: Arc::new(PolicyOps {
                store: crate::policy::PolicyStore::new(store.clone(), "/brindle/"),
                changed: Box::new(|| {}),
            }),
            endpoints: Arc::new(EndpointHandler {
                store: EndpointStore::new(store, "/brindle/", "n1"),
                changes: Box::new(|_| {}),
                health,
                port_wait: None,
            }),
            ctrl: Arc::new(FixedCtrl),
            metrics: Arc::new(Metrics::new()),
        })
    }

    #[test]
    fn requests_go_to_ipam_ctrl_or_endpoints_by_op() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/ctrl.sock");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"stale").unwrap();
        let listener = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let s = server();
        std::thread::spawn(move || serve(listener, s));
        let mut c = Client::connect(&path, Duration::from_secs(5)).unwrap();

        let r: Value = c
            .call(&json!({"v":1,"op":"ipam_allocate",
                "handle":{"network":"n","container_id":"c","ifname":"eth0"},
                "node":"n1","attrs":{},"ipv4":true,"ipv6":false}))
            .unwrap();
        assert_eq!(r["addresses"][0]["address"], "10.3.0.0/32");

        let r: Value = c.call(&json!({"op":"ctrl_bgp_peers"})).unwrap();
        assert_eq!(r["asked"], "CtrlBgpPeers");

        let r: Value = c.call(&json!({"op":"list_endpoints"})).unwrap();
        assert_eq!(r, json!([]));

        let e = c.call::<_, Value>(&json!({"op":"frobnicate"})).unwrap_err();
        assert!(e.to_string().contains("frobnicate"), "{e}");
        let e = c.call::<_, Value>(&json!({"op":"ctrl_nope"})).unwrap_err();
        assert!(e.to_string().contains("InvalidRequest"), "{e}");
        let e = c
            .call::<_, Value>(&json!({"v":1,"op":"ipam_allocate"}))
            .unwrap_err();
        assert!(e.to_string().contains("InvalidRequest"), "{e}");
        // The connection survives bad requests.
        let r: Value = c.call(&json!({"op":"status"})).unwrap();
        assert_eq!(r["ready"], true);
    }
}

//! The `brindle-ipam` CNI IPAM plugin: ADD, DEL, CHECK, GC and STATUS over a
//! [`Backend`]; VERSION, environment and config validation, and the output
//! encoding are the shared driver's ([`brindle_api::cni::dispatch`]).
//!
//! Error codes: the spec's 4 (environment), 6 (decode), 7 (config), 11 (try
//! again later: daemon or datastore unreachable, too much contention), 50
//! (STATUS: not available), and the plugin-specific [`EXHAUSTED`] and
//! [`INTERNAL`].

use std::collections::BTreeSet;
use std::net::IpAddr;

use brindle_api::cni::{CniError, CniResult, ErrorCode, IpConfig, Plugin, Request, Route};
use brindle_api::framing::{RemoteError, RemoteErrorKind};
use brindle_api::ipam::{
    AllocateResult, Attributes, GcReport, HandleId, HandleView, IpamOp, IpamStatus, ReleaseResult,
};
use ipnet::IpNet;

use crate::config::{Backend, PluginConfig};

/// Plugin-specific code: no address is free for this node.
pub const EXHAUSTED: ErrorCode = ErrorCode(100);
/// Plugin-specific code: an unexpected failure in the IPAM.
pub const INTERNAL: ErrorCode = ErrorCode(101);

/// Maps an IPAM error to the CNI error a runtime sees.
pub fn cni_error(e: RemoteError) -> CniError {
    let code = match e.kind {
        RemoteErrorKind::InvalidRequest => ErrorCode::INVALID_CONFIG,
        RemoteErrorKind::Exhausted => EXHAUSTED,
        RemoteErrorKind::TryAgainLater => ErrorCode::TRY_AGAIN_LATER,
        RemoteErrorKind::NotFound | RemoteErrorKind::Conflict | RemoteErrorKind::Internal => {
            INTERNAL
        }
    };
    CniError::new(code, e.message)
}

/// The plugin. Stateless: each invocation reads its config and opens its
/// backend.
#[derive(Debug, Default)]
pub struct IpamPlugin;

struct Invocation {
    cfg: PluginConfig,
    backend: Backend,
    handle: HandleId,
}

impl IpamPlugin {
    fn config(req: &Request) -> Result<PluginConfig, CniError> {
        let ipam =
            req.conf.ipam.as_ref().ok_or_else(|| {
                CniError::invalid_config("the network config has no ipam section")
            })?;
        serde_json::from_value(serde_json::Value::Object(ipam.extra.clone())).map_err(|e| {
            CniError::invalid_config("invalid ipam settings").with_details(e.to_string())
        })
    }

    fn open(req: &Request) -> Result<Invocation, CniError> {
        let cfg = Self::config(req)?;
        if !cfg.assign_ipv4 && !cfg.assign_ipv6 {
            return Err(CniError::invalid_config(
                "assign_ipv4 and assign_ipv6 are both false",
            ));
        }
        let backend = Backend::open(&cfg).map_err(cni_error)?;
        tracing::debug!(backend = backend.describe(), "IPAM backend");
        let handle = HandleId {
            network: req.conf.name.clone(),
            container_id: req.env.container_id.clone(),
            ifname: req.env.ifname.clone(),
        };
        Ok(Invocation {
            cfg,
            backend,
            handle,
        })
    }
}

fn default_route(v6: bool) -> Route {
    Route {
        dst: if v6 {
            "::/0".parse().unwrap_or(IpNet::V6(Default::default()))
        } else {
            IpNet::V4(Default::default())
        },
        gw: None,
        mtu: None,
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    }
}

impl Plugin for IpamPlugin {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let mut inv = Self::open(req)?;
        let node = inv.cfg.node_name();
        let attrs = Attributes {
            namespace: req.env.args.pod_namespace().map(str::to_owned),
            pod: req.env.args.pod_name().map(str::to_owned),
            node: node.clone(),
        };
        let result: AllocateResult = inv
            .backend
            .call(IpamOp::IpamAllocate {
                handle: inv.handle.clone(),
                node,
                node_labels: inv.cfg.node_labels.clone(),
                attrs,
                pools: inv.cfg.pools.clone(),
                ipv4: inv.cfg.assign_ipv4,
                ipv6: inv.cfg.assign_ipv6,
            })
            .map_err(cni_error)?;
        let ips: Vec<IpConfig> = result
            .addresses
            .iter()
            .map(|a| IpConfig {
                address: a.address,
                gateway: None,
                interface: None,
            })
            .collect();
        let routes = match &inv.cfg.routes {
            Some(rs) => rs
                .iter()
                .map(|r| Route {
                    dst: r.dst,
                    gw: r.gw,
                    ..default_route(false)
                })
                .collect(),
            None => {
                let fams: BTreeSet<bool> =
                    ips.iter().map(|ip| ip.address.addr().is_ipv6()).collect();
                fams.into_iter().map(default_route).collect()
            }
        };
        Ok(CniResult {
            interfaces: Vec::new(),
            ips,
            routes,
            dns: req.conf.dns.clone().unwrap_or_default(),
        })
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let mut inv = Self::open(req)?;
        let released: ReleaseResult = inv
            .backend
            .call(IpamOp::IpamReleaseHandle {
                handle: inv.handle.clone(),
            })
            .map_err(cni_error)?;
        tracing::debug!(handle = %inv.handle, released = ?released.released, "DEL");
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let mut inv = Self::open(req)?;
        let held: HandleView = inv
            .backend
            .call(IpamOp::IpamQueryHandle {
                handle: inv.handle.clone(),
            })
            .map_err(|e| {
                if e.kind == RemoteErrorKind::NotFound {
                    CniError::new(
                        ErrorCode::UNKNOWN_CONTAINER,
                        format!("no addresses allocated for {}", inv.handle),
                    )
                } else {
                    cni_error(e)
                }
            })?;
        if let Some(prev) = &req.conf.prev_result {
            let (_, prev) = CniResult::from_json(prev)?;
            let held: BTreeSet<IpAddr> = held.addresses.into_iter().collect();
            for ip in prev.ips {
                if !held.contains(&ip.address.addr()) {
                    return Err(CniError::new(
                        INTERNAL,
                        format!(
                            "prevResult address {} is not allocated to {}",
                            ip.address, inv.handle
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let Some(valid) = req.conf.gc_valid_attachments() else {
            // The runtime did not say what is valid: release nothing.
            return Ok(());
        };
        let mut inv = Self::open(req)?;
        let report: GcReport = inv
            .backend
            .call(IpamOp::IpamGcAttachments {
                network: req.conf.name.clone(),
                node: inv.cfg.node_name(),
                valid: valid
                    .into_iter()
                    .map(|a| brindle_api::ipam::Attachment {
                        container_id: a.container_id,
                        ifname: a.ifname,
                    })
                    .collect(),
            })
            .map_err(cni_error)?;
        tracing::info!(released = report.addresses.len(), "GC");
        Ok(())
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        // An unreachable daemon or datastore means "not available"; a bad
        // config stays a config error.
        let mut inv = Self::open(req).map_err(|e| {
            if e.code == ErrorCode::TRY_AGAIN_LATER {
                CniError {
                    code: ErrorCode::PLUGIN_NOT_AVAILABLE,
                    ..e
                }
            } else {
                e
            }
        })?;
        let status: IpamStatus = inv
            .backend
            .call(IpamOp::IpamStatus)
            .map_err(|e| CniError::new(ErrorCode::PLUGIN_NOT_AVAILABLE, e.message))?;
        if status.pools == 0 || status.free == 0 {
            return Err(CniError::new(
                ErrorCode::PLUGIN_NOT_AVAILABLE,
                format!(
                    "{} enabled pools, {} free addresses",
                    status.pools, status.free
                ),
            ));
        }
        Ok(())
    }
}

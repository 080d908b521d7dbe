//! The `policy_*` ops on `ctrl.sock` (`brindlectl apply|delete|get`).
//! Documents travel as the text the user gave (multi-document YAML or
//! JSON, `List` kinds, as kubectl takes them) and are parsed and validated
//! here: every problem comes back with its document number and field path,
//! and nothing is stored unless every document is valid.

use brindle_api::framing::{RemoteError, RemoteErrorKind, Reply};
use brindle_policy::resource::{Resource, parse_documents};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::store::{KINDS, PolicyStore, StoreFailure, kinds_named};

/// A policy request of `brindlectl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PolicyRequest {
    /// Create or replace every resource of `documents`. Result:
    /// `Vec<Applied>`.
    PolicyApply {
        /// YAML or JSON documents.
        documents: String,
    },
    /// Delete every resource named by `documents` (kind, namespace, name).
    /// Result: `Vec<Applied>`; one missing is `not_found` and nothing is
    /// deleted, unless `ignore_not_found`.
    PolicyDelete {
        /// YAML or JSON documents.
        documents: String,
        /// Missing resources are skipped.
        #[serde(default)]
        ignore_not_found: bool,
    },
    /// The stored resources of a kind (`networkpolicies`, `tiers`, ...,
    /// `all`), optionally of one namespace. Result: `Vec<object>`.
    PolicyGet {
        /// The kind's name as `brindlectl get` takes it.
        kind: String,
        /// Only this namespace (namespaced kinds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
    },
}

/// Whether a request line is a policy op (by its `op`).
pub fn is_policy_op(op: &str) -> bool {
    op.starts_with("policy_")
}

/// Answers the policy ops: the records, and who to tell after a write.
pub struct PolicyOps {
    /// The records.
    pub store: PolicyStore,
    /// Called after every write that changed something (the daemon reads
    /// the policy again at once instead of at the next tick).
    pub changed: Box<dyn Fn() + Send + Sync>,
}

fn error(kind: RemoteErrorKind, message: impl Into<String>) -> Reply<Value> {
    Reply::Error(RemoteError {
        kind,
        message: message.into(),
    })
}

fn failure(e: StoreFailure) -> Reply<Value> {
    let kind = match &e {
        StoreFailure::Store(_) => RemoteErrorKind::TryAgainLater,
        StoreFailure::NotFound(_) => RemoteErrorKind::NotFound,
        StoreFailure::Conflict => RemoteErrorKind::Conflict,
    };
    error(kind, e.to_string())
}

fn ok<T: Serialize>(v: T) -> Reply<Value> {
    match serde_json::to_value(v) {
        Ok(result) => Reply::Ok { result },
        Err(e) => error(RemoteErrorKind::Internal, e.to_string()),
    }
}

fn parse(documents: &str) -> Result<Vec<Resource>, Reply<Value>> {
    let docs = parse_documents(documents)
        .map_err(|e| error(RemoteErrorKind::InvalidRequest, e.to_string()))?;
    if docs.is_empty() {
        return Err(error(
            RemoteErrorKind::InvalidRequest,
            "no resources in the input",
        ));
    }
    Ok(docs)
}

impl PolicyOps {
    /// Answers one request.
    pub fn handle(&self, req: PolicyRequest) -> Reply<Value> {
        match req {
            PolicyRequest::PolicyApply { documents } => {
                let docs = match parse(&documents) {
                    Ok(d) => d,
                    Err(reply) => return reply,
                };
                match self.store.apply(&docs) {
                    Ok(report) => {
                        if report
                            .iter()
                            .any(|a| a.outcome != super::store::Outcome::Unchanged)
                        {
                            (self.changed)();
                        }
                        ok(report)
                    }
                    Err(e) => failure(e),
                }
            }
            PolicyRequest::PolicyDelete {
                documents,
                ignore_not_found,
            } => {
                let docs = match parse(&documents) {
                    Ok(d) => d,
                    Err(reply) => return reply,
                };
                let keys: Vec<_> = docs.iter().map(Resource::key).collect();
                match self.store.delete(&keys, ignore_not_found) {
                    Ok(report) => {
                        if !report.is_empty() {
                            (self.changed)();
                        }
                        ok(report)
                    }
                    Err(e) => failure(e),
                }
            }
            PolicyRequest::PolicyGet { kind, namespace } => {
                let Some(kinds) = kinds_named(&kind) else {
                    let names: Vec<&str> = KINDS
                        .iter()
                        .map(|k| super::store::kind_segment(*k))
                        .collect();
                    return error(
                        RemoteErrorKind::InvalidRequest,
                        format!(
                            "unknown kind {kind:?}: networkpolicies, globalnetworkpolicies, tiers, \
                             globalnetworksets, namespaces, pods, serviceaccounts, all (or {})",
                            names.join(", ")
                        ),
                    );
                };
                let mut out = Vec::new();
                for k in kinds {
                    match self.store.list(k, namespace.as_deref()) {
                        Ok(list) => out.extend(list.iter().map(Resource::to_value)),
                        Err(e) => return failure(e.into()),
                    }
                }
                ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use brindle_ipam::store::MemoryStore;

    use super::*;

    fn ops() -> (PolicyOps, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let c = n.clone();
        let ops = PolicyOps {
            store: PolicyStore::new(Arc::new(MemoryStore::new()), "/brindle/"),
            changed: Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        };
        (ops, n)
    }

    fn err(r: Reply<Value>) -> RemoteError {
        match r {
            Reply::Error(e) => e,
            Reply::Ok { result } => panic!("not an error: {result}"),
        }
    }

    const GOOD: &str = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {name: ext}\n\
        spec: {nets: [192.0.2.0/24]}\n";

    #[test]
    fn an_invalid_document_stores_nothing_and_names_the_field() {
        let (ops, changed) = ops();
        let bad = format!(
            "{GOOD}---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: x}}\n\
             spec:\n  podSelector: {{}}\n  ingress:\n  - from:\n    - ipBlock: {{cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}\n"
        );
        let e = err(ops.handle(PolicyRequest::PolicyApply { documents: bad }));
        assert_eq!(e.kind, RemoteErrorKind::InvalidRequest);
        assert!(e.message.contains("document 2"), "{}", e.message);
        assert!(
            e.message
                .contains("spec.ingress[0].from[0].ipBlock.except[0]"),
            "{}",
            e.message
        );
        let Reply::Ok { result } = ops.handle(PolicyRequest::PolicyGet {
            kind: "all".into(),
            namespace: None,
        }) else {
            panic!()
        };
        assert_eq!(result, serde_json::json!([]), "nothing half-applied");
        assert_eq!(changed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn apply_get_delete_round_trip() {
        let (ops, changed) = ops();
        let Reply::Ok { result } = ops.handle(PolicyRequest::PolicyApply {
            documents: GOOD.into(),
        }) else {
            panic!()
        };
        assert_eq!(
            result,
            serde_json::json!([{"resource": "GlobalNetworkSet ext", "outcome": "created"}])
        );
        assert_eq!(changed.load(Ordering::SeqCst), 1);
        ops.handle(PolicyRequest::PolicyApply {
            documents: GOOD.into(),
        });
        assert_eq!(changed.load(Ordering::SeqCst), 1, "unchanged: no read");
        let Reply::Ok { result } = ops.handle(PolicyRequest::PolicyGet {
            kind: "globalnetworksets".into(),
            namespace: None,
        }) else {
            panic!()
        };
        assert_eq!(result[0]["spec"]["nets"][0], "192.0.2.0/24");
        assert_eq!(result[0]["kind"], "GlobalNetworkSet");
        let e = err(ops.handle(PolicyRequest::PolicyGet {
            kind: "services".into(),
            namespace: None,
        }));
        assert!(e.message.contains("unknown kind"), "{}", e.message);
        ops.handle(PolicyRequest::PolicyDelete {
            documents: GOOD.into(),
            ignore_not_found: false,
        });
        let e = err(ops.handle(PolicyRequest::PolicyDelete {
            documents: GOOD.into(),
            ignore_not_found: false,
        }));
        assert_eq!(e.kind, RemoteErrorKind::NotFound);
        assert_eq!(changed.load(Ordering::SeqCst), 2);
    }
}

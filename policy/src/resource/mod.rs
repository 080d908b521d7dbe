//! The resources policy is made of, as `kubectl` and `calicoctl` take them:
//! multi-document YAML (`---`), JSON (one object, a stream of objects or an
//! array), and `List` kinds (`v1 List`, `NetworkPolicyList`, ...).
//!
//! - [`k8s`]: `networking.k8s.io/v1` `NetworkPolicy`; `v1` `Namespace`,
//!   `Pod` and `ServiceAccount` (for their labels, a pod's named container
//!   ports, service account and addresses).
//! - [`calico`]: `projectcalico.org/v3` `NetworkPolicy`,
//!   `GlobalNetworkPolicy`, `Tier`, `GlobalNetworkSet`.
//!
//! Policy kinds refuse unknown fields (a typo must not silently widen a
//! policy); `Pod`, `Namespace` and `ServiceAccount` ignore what policy does
//! not use, so real objects from a cluster parse. Every resource is
//! validated ([`Resource::validate`]) with field paths in its errors.

pub mod calico;
pub mod k8s;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `metadata`, the part policy uses. Other metadata fields (uid,
/// resourceVersion, managedFields, ...) are accepted and dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
    /// `metadata.namespace`; namespaced kinds default it to `default` when
    /// parsed, as kubectl does without a context namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `metadata.labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` (kept for `get`, never matched on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// The namespace (`default` when absent).
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// The kinds this crate understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// `v1 Namespace`.
    Namespace,
    /// `v1 Pod`.
    Pod,
    /// `v1 ServiceAccount`.
    ServiceAccount,
    /// `networking.k8s.io/v1 NetworkPolicy`.
    KubernetesNetworkPolicy,
    /// `projectcalico.org/v3 NetworkPolicy`.
    NetworkPolicy,
    /// `projectcalico.org/v3 GlobalNetworkPolicy`.
    GlobalNetworkPolicy,
    /// `projectcalico.org/v3 Tier`.
    Tier,
    /// `projectcalico.org/v3 GlobalNetworkSet`.
    GlobalNetworkSet,
}

impl Kind {
    /// `apiVersion` of the kind.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Pod | Kind::ServiceAccount => "v1",
            Kind::KubernetesNetworkPolicy => k8s::NETWORKING_V1,
            _ => calico::PROJECTCALICO_V3,
        }
    }

    /// `kind` as written in a document.
    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::KubernetesNetworkPolicy | Kind::NetworkPolicy => "NetworkPolicy",
            Kind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
            Kind::Tier => "Tier",
            Kind::GlobalNetworkSet => "GlobalNetworkSet",
        }
    }

    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::Pod | Kind::ServiceAccount | Kind::KubernetesNetworkPolicy | Kind::NetworkPolicy
        )
    }

    fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Some(match (api_version, kind) {
            ("v1", "Namespace") => Kind::Namespace,
            ("v1", "Pod") => Kind::Pod,
            ("v1", "ServiceAccount") => Kind::ServiceAccount,
            (k8s::NETWORKING_V1, "NetworkPolicy") => Kind::KubernetesNetworkPolicy,
            (calico::PROJECTCALICO_V3, "NetworkPolicy") => Kind::NetworkPolicy,
            (calico::PROJECTCALICO_V3, "GlobalNetworkPolicy") => Kind::GlobalNetworkPolicy,
            (calico::PROJECTCALICO_V3, "Tier") => Kind::Tier,
            (calico::PROJECTCALICO_V3, "GlobalNetworkSet") => Kind::GlobalNetworkSet,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version(), self.kind_name())
    }
}

/// Which object: kind, namespace (namespaced kinds only) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ResourceKey {
    /// The kind.
    pub kind: Kind,
    /// The namespace, for namespaced kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.kind_name(), self.name),
            None => write!(f, "{} {}", self.kind.kind_name(), self.name),
        }
    }
}

/// One parsed object.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    /// `v1 Namespace`.
    Namespace(k8s::Namespace),
    /// `v1 Pod`.
    Pod(k8s::Pod),
    /// `v1 ServiceAccount`.
    ServiceAccount(k8s::ServiceAccount),
    /// `networking.k8s.io/v1 NetworkPolicy`.
    KubernetesNetworkPolicy(k8s::NetworkPolicy),
    /// `projectcalico.org/v3 NetworkPolicy`.
    NetworkPolicy(calico::NetworkPolicy),
    /// `projectcalico.org/v3 GlobalNetworkPolicy`.
    GlobalNetworkPolicy(calico::GlobalNetworkPolicy),
    /// `projectcalico.org/v3 Tier`.
    Tier(calico::Tier),
    /// `projectcalico.org/v3 GlobalNetworkSet`.
    GlobalNetworkSet(calico::GlobalNetworkSet),
}

impl Resource {
    /// The object's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Resource::Namespace(r) => &r.metadata,
            Resource::Pod(r) => &r.metadata,
            Resource::ServiceAccount(r) => &r.metadata,
            Resource::KubernetesNetworkPolicy(r) => &r.metadata,
            Resource::NetworkPolicy(r) => &r.metadata,
            Resource::GlobalNetworkPolicy(r) => &r.metadata,
            Resource::Tier(r) => &r.metadata,
            Resource::GlobalNetworkSet(r) => &r.metadata,
        }
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Namespace(_) => Kind::Namespace,
            Resource::Pod(_) => Kind::Pod,
            Resource::ServiceAccount(_) => Kind::ServiceAccount,
            Resource::KubernetesNetworkPolicy(_) => Kind::KubernetesNetworkPolicy,
            Resource::NetworkPolicy(_) => Kind::NetworkPolicy,
            Resource::GlobalNetworkPolicy(_) => Kind::GlobalNetworkPolicy,
            Resource::Tier(_) => Kind::Tier,
            Resource::GlobalNetworkSet(_) => Kind::GlobalNetworkSet,
        }
    }

    /// Kind, namespace and name.
    pub fn key(&self) -> ResourceKey {
        let kind = self.kind();
        let meta = self.metadata();
        ResourceKey {
            kind,
            namespace: kind.namespaced().then(|| meta.namespace().to_owned()),
            name: meta.name.clone(),
        }
    }

    /// Checks everything the API servers check (and what Brindle does not
    /// support), with the field path of each problem.
    pub fn validate(&self) -> Result<(), Invalid> {
        let mut errors = Errors::default();
        let meta = self.metadata();
        validate_name(&mut errors, "metadata.name", &meta.name);
        if self.kind().namespaced() {
            validate_name(&mut errors, "metadata.namespace", meta.namespace());
        }
        k8s::validate_labels(&mut errors, "metadata.labels", &meta.labels);
        match self {
            Resource::Namespace(_) | Resource::ServiceAccount(_) => {}
            Resource::Pod(r) => r.validate(&mut errors),
            Resource::KubernetesNetworkPolicy(r) => r.validate(&mut errors),
            Resource::NetworkPolicy(r) => r.validate(&mut errors),
            Resource::GlobalNetworkPolicy(r) => r.validate(&mut errors),
            Resource::Tier(r) => r.validate(&mut errors),
            Resource::GlobalNetworkSet(r) => r.validate(&mut errors),
        }
        if errors.0.is_empty() {
            Ok(())
        } else {
            Err(Invalid {
                key: self.key(),
                errors: errors.0,
            })
        }
    }

    /// The object as a JSON value with `apiVersion` and `kind` (what `get
    /// -o json|yaml` prints and what a datastore stores).
    pub fn to_value(&self) -> Value {
        let kind = self.kind();
        let body = match self {
            Resource::Namespace(r) => serde_json::to_value(r),
            Resource::Pod(r) => serde_json::to_value(r),
            Resource::ServiceAccount(r) => serde_json::to_value(r),
            Resource::KubernetesNetworkPolicy(r) => serde_json::to_value(r),
            Resource::NetworkPolicy(r) => serde_json::to_value(r),
            Resource::GlobalNetworkPolicy(r) => serde_json::to_value(r),
            Resource::Tier(r) => serde_json::to_value(r),
            Resource::GlobalNetworkSet(r) => serde_json::to_value(r),
        };
        let mut map = serde_json::Map::new();
        map.insert("apiVersion".into(), kind.api_version().into());
        map.insert("kind".into(), kind.kind_name().into());
        // Serializing these plain structs into a Value cannot fail (string
        // keys, no non-finite floats after validation).
        if let Ok(Value::Object(fields)) = body {
            map.extend(fields);
        }
        Value::Object(map)
    }

    /// Parses one object from a JSON value with `apiVersion` and `kind`.
    pub fn from_value(value: Value) -> Result<Resource, ObjectError> {
        let Value::Object(mut map) = value else {
            return Err(ObjectError::NotAnObject);
        };
        let api_version = take_str(&mut map, "apiVersion")?;
        let kind = take_str(&mut map, "kind")?;
        let Some(k) = Kind::from_type(&api_version, &kind) else {
            return Err(ObjectError::UnknownKind { api_version, kind });
        };
        let value = Value::Object(map);
        let mut resource = match k {
            Kind::Namespace => Resource::Namespace(serde_json::from_value(value)?),
            Kind::Pod => Resource::Pod(serde_json::from_value(value)?),
            Kind::ServiceAccount => Resource::ServiceAccount(serde_json::from_value(value)?),
            Kind::KubernetesNetworkPolicy => {
                Resource::KubernetesNetworkPolicy(serde_json::from_value(value)?)
            }
            Kind::NetworkPolicy => Resource::NetworkPolicy(serde_json::from_value(value)?),
            Kind::GlobalNetworkPolicy => {
                Resource::GlobalNetworkPolicy(serde_json::from_value(value)?)
            }
            Kind::Tier => Resource::Tier(serde_json::from_value(value)?),
            Kind::GlobalNetworkSet => Resource::GlobalNetworkSet(serde_json::from_value(value)?),
        };
        resource.default_namespace();
        Ok(resource)
    }

    fn default_namespace(&mut self) {
        if !self.kind().namespaced() {
            return;
        }
        let meta = match self {
            Resource::Pod(r) => &mut r.metadata,
            Resource::ServiceAccount(r) => &mut r.metadata,
            Resource::KubernetesNetworkPolicy(r) => &mut r.metadata,
            Resource::NetworkPolicy(r) => &mut r.metadata,
            _ => return,
        };
        if meta.namespace.as_deref().is_none_or(str::is_empty) {
            meta.namespace = Some("default".into());
        }
    }
}

fn take_str(
    map: &mut serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<String, ObjectError> {
    match map.remove(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(ObjectError::Missing(key)),
    }
}

/// Why one object could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The document is not a mapping.
    #[error("not an object")]
    NotAnObject,
    /// `apiVersion` or `kind` missing or not a string.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A kind this crate does not handle.
    #[error("unsupported kind {kind} (apiVersion {api_version})")]
    UnknownKind {
        /// The document's apiVersion.
        api_version: String,
        /// The document's kind.
        kind: String,
    },
    /// A field of the wrong type, an unknown field, ...
    #[error(transparent)]
    Field(#[from] serde_json::Error),
}

/// Why a document stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not YAML (or not JSON, for input starting with `{` or `[`).
    #[error("document {document}: {source}")]
    Syntax {
        /// 1-based document number.
        document: usize,
        /// The parser's message (with line and column).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// One object of a document (or of a List's items) is wrong.
    #[error("document {document}{}{}: {source}", item.map(|i| format!(", item {i}")).unwrap_or_default(), name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Object {
        /// 1-based document number.
        document: usize,
        /// 1-based item number inside a List.
        item: Option<usize>,
        /// `kind name` when the document had them.
        name: Option<String>,
        /// What is wrong.
        source: ObjectError,
    },
    /// A valid object that does not pass validation.
    #[error("document {document}: {source}")]
    Invalid {
        /// 1-based document number.
        document: usize,
        /// The problems.
        source: Invalid,
    },
}

/// One problem of a resource: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.ingress[0].from[1].ipBlock.except[0]`.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// A resource that failed validation, with every problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} is invalid: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Invalid {
    /// Which resource.
    pub key: ResourceKey,
    /// Every problem, in field order.
    pub errors: Vec<FieldError>,
}

/// Collects field errors during validation.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<FieldError>);

impl Errors {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.to_string(),
        });
    }
}

/// A DNS-1123 subdomain: what Kubernetes accepts as an object name.
pub(crate) fn validate_name(errors: &mut Errors, path: &str, name: &str) {
    if name.is_empty() {
        errors.add(path, "required");
        return;
    }
    if name.len() > 253 {
        errors.add(path, "longer than 253 characters");
    }
    let ok = name.split('.').all(|part| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    });
    if !ok {
        errors.add(
            path,
            format!("{name:?} is not a DNS-1123 subdomain (lower case alphanumerics, '-' and '.')"),
        );
    }
}

/// Parses every object in `text`: multi-document YAML, or JSON (one object,
/// a stream of objects, or an array of them); `List` kinds are flattened.
/// Each object is validated; the first failure is returned with its
/// document number, so a caller applies all or nothing.
pub fn parse_documents(text: &str) -> Result<Vec<Resource>, ParseError> {
    let documents = split_documents(text)?;
    let mut out = Vec::new();
    for (i, doc) in documents.into_iter().enumerate() {
        let document = i + 1;
        if doc.is_null() {
            continue;
        }
        expand(doc, document, &mut out)?;
    }
    Ok(out)
}

fn split_documents(text: &str) -> Result<Vec<Value>, ParseError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut docs = Vec::new();
        for (i, v) in serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .enumerate()
        {
            let v = v.map_err(|e| ParseError::Syntax {
                document: i + 1,
                source: Box::new(e),
            })?;
            match v {
                Value::Array(items) => docs.extend(items),
                v => docs.push(v),
            }
        }
        return Ok(docs);
    }
    let mut docs = Vec::new();
    for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(de).map_err(|e| ParseError::Syntax {
            document: i + 1,
            source: Box::new(e),
        })?;
        docs.push(v);
    }
    Ok(docs)
}

fn describe(v: &Value) -> Option<String> {
    let kind = v.get("kind")?.as_str()?;
    let meta = v.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str);
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str);
    Some(match (ns, name) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => kind.to_owned(),
    })
}

fn expand(doc: Value, document: usize, out: &mut Vec<Resource>) -> Result<(), ParseError> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind.ends_with("List") && doc.get("items").is_some() {
        let api_version = doc.get("apiVersion").cloned();
        let item_kind = kind.strip_suffix("List").unwrap_or_default().to_owned();
        let Some(Value::Array(items)) = doc.get("items").cloned() else {
            return Err(ParseError::Object {
                document,
                item: None,
                name: Some(kind.to_owned()),
                source: ObjectError::NotAnObject,
            });
        };
        for (j, mut item) in items.into_iter().enumerate() {
            // Typed lists (NetworkPolicyList) may leave the type out of
            // their items; a v1 List's items carry their own.
            if let Value::Object(map) = &mut item {
                if !map.contains_key("kind") && !item_kind.is_empty() {
                    map.insert("kind".into(), item_kind.clone().into());
                }
                if !map.contains_key("apiVersion")
                    && let Some(v) = &api_version
                {
                    map.insert("apiVersion".into(), v.clone());
                }
            }
            out.push(one(item, document, Some(j + 1))?);
        }
        return Ok(());
    }
    out.push(one(doc, document, None)?);
    Ok(())
}

fn one(value: Value, document: usize, item: Option<usize>) -> Result<Resource, ParseError> {
    let name = describe(&value);
    let resource = Resource::from_value(value).map_err(|source| ParseError::Object {
        document,
        item,
        name,
        source,
    })?;
    resource
        .validate()
        .map_err(|source| ParseError::Invalid { document, source })?;
    Ok(resource)
}

#[cfg(test)]
mod tests;

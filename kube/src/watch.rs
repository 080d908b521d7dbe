//! The Kubernetes API as a source: kube-runtime watchers (list, then watch
//! from the list's resource version with bookmarks; relist after `410
//! Gone`; back off after errors) on Nodes, Pods, Namespaces and
//! NetworkPolicies, their events reduced to watcher [`Input`]s of the
//! daemon's types.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use brindle_policy::resource::{Kind, Resource, ResourceKey};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::config::WATCH_SECS;
use crate::convert;
use crate::event::{Feed, KubeEvent, NodeInfo};
use crate::source::{Collection, InputStream, ResourceSource, drive};
use crate::store::Input;

/// What went wrong, counted (the daemon exports them).
#[derive(Debug, Default)]
pub struct Counters {
    /// Watcher errors (failed lists and watches, `ERROR` events such as
    /// `410 Gone`); each is followed by a retry after a backoff.
    pub watch_errors: AtomicU64,
    /// Objects `brindle_policy` does not take: left out (the version
    /// before, if any, stays in force).
    pub dropped: AtomicU64,
}

fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_SECS)
}

/// The watcher of `api` as inputs; `convert` makes the value of an
/// applied object, `key` the key of any object (a deleted one too).
fn inputs<K, Key, V>(
    api: Api<K>,
    feed: Feed,
    counters: Arc<Counters>,
    key: fn(&K) -> Key,
    convert: fn(&K) -> Result<V, convert::ConvertError>,
) -> InputStream<Key, V>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    Key: Send + 'static,
    V: Send + 'static,
{
    watcher(api, watch_config())
        .default_backoff()
        .filter_map(move |event| {
            let out = match event {
                Err(e) => {
                    counters.watch_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(%feed, error = %e, "kubernetes watch failed; retrying");
                    None
                }
                Ok(watcher::Event::Init) => Some(Input::Init),
                Ok(watcher::Event::InitDone) => Some(Input::InitDone),
                Ok(watcher::Event::Delete(o)) => Some(Input::Delete(key(&o))),
                Ok(watcher::Event::InitApply(o)) => convert_or_count(&o, feed, &counters, convert)
                    .map(|v| Input::InitApply(key(&o), v)),
                Ok(watcher::Event::Apply(o)) => {
                    convert_or_count(&o, feed, &counters, convert).map(|v| Input::Apply(key(&o), v))
                }
            };
            futures::future::ready(out)
        })
        .boxed()
}

fn convert_or_count<K: kube::Resource, V>(
    o: &K,
    feed: Feed,
    counters: &Counters,
    convert: fn(&K) -> Result<V, convert::ConvertError>,
) -> Option<V> {
    match convert(o) {
        Ok(v) => Some(v),
        Err(e) => {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            warn!(%feed, name = %o.name_any(), error = %e, "kubernetes object left out");
            None
        }
    }
}

fn resource_key<K: kube::Resource>(kind: Kind, o: &K) -> ResourceKey {
    ResourceKey {
        kind,
        namespace: kind.namespaced().then(|| {
            o.meta()
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into())
        }),
        name: o.meta().name.clone().unwrap_or_default(),
    }
}

fn resource<K: Serialize>(o: &K) -> Result<Resource, convert::ConvertError> {
    convert::resource(o)
}

/// Namespaces, Pods and NetworkPolicies of the whole cluster (policy
/// selects peers anywhere) as a [`ResourceSource`].
pub struct KubeResources {
    client: Client,
    counters: Arc<Counters>,
}

impl KubeResources {
    /// The source on `client`.
    pub fn new(client: Client, counters: Arc<Counters>) -> Self {
        KubeResources { client, counters }
    }
}

impl ResourceSource for KubeResources {
    fn collections(self: Box<Self>) -> Vec<Collection> {
        let c = &self.counters;
        vec![
            (
                Feed::Namespaces,
                inputs::<Namespace, _, _>(
                    Api::all(self.client.clone()),
                    Feed::Namespaces,
                    c.clone(),
                    |o| resource_key(Kind::Namespace, o),
                    resource,
                ),
            ),
            (
                Feed::Pods,
                inputs::<Pod, _, _>(
                    Api::all(self.client.clone()),
                    Feed::Pods,
                    c.clone(),
                    |o| resource_key(Kind::Pod, o),
                    resource,
                ),
            ),
            (
                Feed::NetworkPolicies,
                inputs::<NetworkPolicy, _, _>(
                    Api::all(self.client.clone()),
                    Feed::NetworkPolicies,
                    c.clone(),
                    |o| resource_key(Kind::KubernetesNetworkPolicy, o),
                    resource,
                ),
            ),
        ]
    }
}

/// The nodes of the cluster as inputs.
pub fn nodes(client: Client, counters: Arc<Counters>) -> InputStream<String, NodeInfo> {
    inputs::<Node, _, _>(
        Api::all(client),
        Feed::Nodes,
        counters,
        |o| o.name_any(),
        |o| Ok(convert::node(o)),
    )
}

/// Watches the API through `client` and hands every net change to `send`
/// until it returns `false` (the daemon is gone).
pub async fn run(client: Client, counters: Arc<Counters>, send: impl FnMut(KubeEvent) -> bool) {
    let nodes = nodes(client.clone(), counters.clone());
    let resources: Box<dyn ResourceSource> = Box::new(KubeResources::new(client, counters));
    drive(Some(nodes), vec![resources], send).await;
}

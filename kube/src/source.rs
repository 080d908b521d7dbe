//! The one interface behind which policy and label sources sit: a
//! [`ResourceSource`] hands out collections, each a stream of watcher
//! [`Input`]s of `brindle_policy` resources. The Kubernetes API
//! ([`crate::watch::KubeResources`]) is one; objects stored by
//! `brindlectl apply` or read from files are others ([`StaticSource`] is the
//! simplest). [`drive`] runs them all through one [`Store`] per collection,
//! so every source yields the same [`KubeEvent`]s with the same resync
//! semantics.

use brindle_policy::resource::{Resource, ResourceKey};
use futures::stream::{self, BoxStream, StreamExt};

use crate::event::{Feed, KubeEvent, NodeInfo};
use crate::store::{Change, Input, Store};

/// A stream of watcher inputs of one collection.
pub type InputStream<K, V> = BoxStream<'static, Input<K, V>>;

/// A collection of one source: which feed it is, and its inputs.
pub type Collection = (Feed, InputStream<ResourceKey, Resource>);

/// A source of policy resources (Namespaces, Pods, NetworkPolicies, and
/// later Calico's kinds).
pub trait ResourceSource: Send {
    /// Its collections, each listed and watched on its own (a relist of one
    /// does not touch the others).
    fn collections(self: Box<Self>) -> Vec<Collection>;
}

/// A fixed set of resources: listed once, never changed.
#[derive(Debug, Clone)]
pub struct StaticSource {
    feed: Feed,
    resources: Vec<Resource>,
}

impl StaticSource {
    /// The resources, reported as `feed`.
    pub fn new(feed: Feed, resources: Vec<Resource>) -> Self {
        StaticSource { feed, resources }
    }
}

impl ResourceSource for StaticSource {
    fn collections(self: Box<Self>) -> Vec<Collection> {
        let inputs = std::iter::once(Input::Init)
            .chain(
                self.resources
                    .into_iter()
                    .map(|r| Input::InitApply(r.key(), r)),
            )
            .chain(std::iter::once(Input::InitDone));
        let inputs = stream::iter(inputs).chain(stream::pending());
        vec![(self.feed, inputs.boxed())]
    }
}

enum Tagged {
    Resource(usize, Box<Input<ResourceKey, Resource>>),
    Node(Input<String, NodeInfo>),
}

/// Runs the nodes' inputs and every source's collections through their
/// stores and hands each net change to `send`, until `send` says the
/// receiver is gone (`false`) or every stream ended.
pub async fn drive(
    nodes: Option<InputStream<String, NodeInfo>>,
    sources: Vec<Box<dyn ResourceSource>>,
    mut send: impl FnMut(KubeEvent) -> bool,
) {
    let mut feeds = Vec::new();
    let mut streams: Vec<BoxStream<'static, Tagged>> = Vec::new();
    for (i, (feed, inputs)) in sources
        .into_iter()
        .flat_map(|s| s.collections())
        .enumerate()
    {
        feeds.push((feed, Store::<ResourceKey, Resource>::new()));
        streams.push(
            inputs
                .map(move |input| Tagged::Resource(i, Box::new(input)))
                .boxed(),
        );
    }
    if let Some(nodes) = nodes {
        streams.push(nodes.map(Tagged::Node).boxed());
    }
    let mut node_store = Store::<String, NodeInfo>::new();
    let mut all = stream::select_all(streams);
    let mut resource_changes = Vec::new();
    let mut node_changes = Vec::new();
    while let Some(tagged) = all.next().await {
        let mut events = Vec::new();
        match tagged {
            Tagged::Resource(i, input) => {
                let (feed, store) = &mut feeds[i];
                store.handle(*input, &mut resource_changes);
                events.extend(resource_changes.drain(..).map(|c| match c {
                    Change::Apply(r) => KubeEvent::Apply(r),
                    Change::Delete(k) => KubeEvent::Delete(k),
                    Change::Synced => KubeEvent::Synced(*feed),
                }));
            }
            Tagged::Node(input) => {
                node_store.handle(input, &mut node_changes);
                events.extend(node_changes.drain(..).map(|c| match c {
                    Change::Apply(n) => KubeEvent::NodeApply(n),
                    Change::Delete(name) => KubeEvent::NodeDelete(name),
                    Change::Synced => KubeEvent::Synced(Feed::Nodes),
                }));
            }
        }
        for e in events {
            if !send(e) {
                return;
            }
        }
    }
}

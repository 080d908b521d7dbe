//! What the `brindle` CNI plugin tells the node daemon about pods, over
//! `/run/brindle/ctrl.sock` ([`crate::CTRL_SOCKET`]).
//!
//! Framing is [`crate::framing`]: one [`EndpointRequest`] per line, answered
//! by one [`crate::framing::Reply`] line whose `result` is the type named on
//! each request below. Requests are tagged by `op`:
//!
//! ```json
//! {"op":"add_endpoint","endpoint":{"key":{"network":"k8s-pod-network","container_id":"c0ffee","ifname":"eth0"}, ...}}
//! {"status":"ok","result":{"key":{...}, ...}}
//! ```
//!
//! An endpoint is keyed by its attachment, [`EndpointKey`] (network name +
//! container ID + interface name, the same triple the IPAM handle is made
//! of), so a retried ADD replaces the record and a DEL removes exactly it.
//!
//! Error kinds the daemon uses ([`crate::framing::RemoteErrorKind`]):
//! `not_found` for get/delete of an unknown key (the plugin treats it as
//! success on DEL), `try_again_later` when the daemon cannot reach its
//! datastore or the vrouter (the plugin maps it to CNI code 11),
//! `invalid_request` for a malformed endpoint.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The attachment an endpoint belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointKey {
    /// The CNI network name (`name` in the conflist).
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl EndpointKey {
    /// The allocation handle: `network/containerID/ifname`. `/` cannot occur
    /// in any of the three (the CNI spec's rules for network names,
    /// container IDs and interface names), so the handle is unambiguous. The
    /// IPAM plugin keys allocations by it and the CNI plugin names the host
    /// veth from its hash.
    pub fn handle(&self) -> String {
        format!("{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Kubernetes identity of the pod, from `CNI_ARGS`; empty outside Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `K8S_POD_NAME`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `K8S_POD_UID`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub infra_container_id: String,
}

/// What the pod's interface is, and so how the vrouter reaches the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PodInterface {
    /// A veth pair: the pod's frames come out of the host end
    /// ([`Endpoint::host_ifname`]), where the vrouter takes them by AF_XDP.
    #[default]
    Veth,
    /// A persistent multi-queue TAP with a virtio-net header, inside the
    /// pod's netns and nowhere else ([`Endpoint::host_ifname`] is empty):
    /// the vrouter attaches its queues by name and netns
    /// (`brindle_xsk::Tap::attach`), one per worker.
    Tap {
        /// The pod's netns path (`CNI_NETNS`).
        netns: String,
        /// The TAP's name in that netns (`CNI_IFNAME`).
        ifname: String,
        /// The queues it was made with (the vrouter's workers).
        queues: u16,
    },
}

impl PodInterface {
    /// Whether this is the default, a veth pair.
    pub fn is_veth(&self) -> bool {
        matches!(self, PodInterface::Veth)
    }
}

/// A pod's attachment as the CNI plugin made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Which attachment this is.
    pub key: EndpointKey,
    /// The pod it belongs to.
    #[serde(default)]
    pub pod: PodRef,
    /// `CNI_NETNS` at ADD time.
    pub netns: String,
    /// The host end of the veth (`bri` + 11 hex digits).
    pub host_ifname: String,
    /// The host end's ifindex in the host netns.
    pub host_ifindex: u32,
    /// The host end's MAC (`ee:ee:ee:ee:ee:ee`).
    pub host_mac: String,
    /// The pod end's MAC (the source of the pod's frames).
    pub pod_mac: String,
    /// The pod's addresses (/32 and /128): the only sources the vrouter
    /// accepts from this endpoint, and the host routes to program.
    pub ips: Vec<IpNet>,
    /// The pod's gateways (169.254.1.1 and/or fe80::ecee:eeff:feee:eeee),
    /// for which the vrouter answers ARP / neighbour solicitations.
    #[serde(default)]
    pub gateways: Vec<IpAddr>,
    /// The MTU of both veth ends (of the TAP).
    pub mtu: u32,
    /// The kind of the pod's interface; absent (veth) in records and
    /// requests from before TAP pods.
    #[serde(default, skip_serializing_if = "PodInterface::is_veth")]
    pub interface: PodInterface,
}

/// How long the daemon's `add_endpoint` waits, at most, for the vrouter to
/// acknowledge the pod's port before it answers (so the pod's first packets
/// meet an attached port). A plugin's exchange timeout must outlast it with
/// room for the datastore write and a node's parallel ADDs queueing at it:
/// the CNI plugin's default is 10 s (was 2 s, which rolled back ADDs the
/// daemon completed when 110 TAP pods started at once).
pub const ADD_PORT_WAIT: Duration = Duration::from_millis(1500);

/// A request from the CNI plugin to the node daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum EndpointRequest {
    /// ADD finished its netns work: store the endpoint and program the
    /// vrouter (port on the host veth, /32 route to it). Replaces a record
    /// with the same key. Answer: the stored [`Endpoint`].
    AddEndpoint {
        /// The endpoint (boxed: it is much larger than the other requests).
        endpoint: Box<Endpoint>,
    },
    /// DEL: forget the endpoint and unprogram it. Answer: [`Deleted`]; an
    /// unknown key is `existed: false`, not an error.
    DeleteEndpoint {
        /// The attachment.
        key: EndpointKey,
    },
    /// CHECK: the daemon's record. Answer: [`Endpoint`], or `not_found`.
    GetEndpoint {
        /// The attachment.
        key: EndpointKey,
    },
    /// Every endpoint of `network` (all networks when `None`). Answer:
    /// `Vec<Endpoint>`.
    ListEndpoints {
        /// Only this network.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
    },
    /// GC: delete every endpoint of `network` whose key is not in `valid`.
    /// Answer: [`GcReport`].
    GcEndpoints {
        /// The network being collected.
        network: String,
        /// The attachments still in use (`cni.dev/valid-attachments`).
        valid: Vec<EndpointKey>,
    },
    /// STATUS: is the daemon ready for new endpoints? Answer:
    /// [`DaemonStatus`].
    Status,
}

/// Answer to [`EndpointRequest::DeleteEndpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// Whether there was a record to delete.
    pub existed: bool,
}

/// Answer to [`EndpointRequest::GcEndpoints`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// The endpoints that were deleted.
    pub removed: Vec<EndpointKey>,
}

/// Answer to [`EndpointRequest::Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// Ready for ADDs (datastore and vrouter reachable).
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// [`crate::framing::PROTOCOL_VERSION`] of the daemon.
    pub protocol_version: u32,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key() -> EndpointKey {
        EndpointKey {
            network: "k8s-pod-network".into(),
            container_id: "c0ffee".into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn handle_joins_the_attachment_with_slashes() {
        assert_eq!(key().handle(), "k8s-pod-network/c0ffee/eth0");
    }

    #[test]
    fn requests_are_tagged_by_op() {
        let del = EndpointRequest::DeleteEndpoint { key: key() };
        assert_eq!(
            serde_json::to_value(&del).unwrap(),
            json!({"op":"delete_endpoint","key":{"network":"k8s-pod-network","container_id":"c0ffee","ifname":"eth0"}})
        );
        assert_eq!(
            serde_json::to_value(EndpointRequest::Status).unwrap(),
            json!({"op":"status"})
        );
        assert_eq!(
            serde_json::to_value(EndpointRequest::ListEndpoints { network: None }).unwrap(),
            json!({"op":"list_endpoints"})
        );
    }

    #[test]
    fn an_endpoint_round_trips() {
        let ep = Endpoint {
            key: key(),
            pod: PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: "u".into(),
                infra_container_id: String::new(),
            },
            netns: "/var/run/netns/x".into(),
            host_ifname: "bri0123456789a".into(),
            host_ifindex: 7,
            host_mac: "ee:ee:ee:ee:ee:ee".into(),
            pod_mac: "02:00:00:00:00:01".into(),
            ips: vec!["10.1.0.5/32".parse().unwrap()],
            gateways: vec!["169.254.1.1".parse().unwrap()],
            mtu: 1480,
            interface: PodInterface::Veth,
        };
        let req = EndpointRequest::AddEndpoint {
            endpoint: Box::new(ep.clone()),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with(r#"{"op":"add_endpoint","endpoint":"#));
        let back: EndpointRequest = serde_json::from_str(&line).unwrap();
        assert_eq!(back, req);
        assert!(!line.contains("interface"), "a veth endpoint is as before");

        let tap = Endpoint {
            host_ifname: String::new(),
            host_ifindex: 0,
            interface: PodInterface::Tap {
                netns: "/var/run/netns/x".into(),
                ifname: "eth0".into(),
                queues: 2,
            },
            ..ep
        };
        let value = serde_json::to_value(&tap).unwrap();
        assert_eq!(
            value["interface"],
            json!({"kind":"tap","netns":"/var/run/netns/x","ifname":"eth0","queues":2})
        );
        assert_eq!(serde_json::from_value::<Endpoint>(value).unwrap(), tap);
    }
}

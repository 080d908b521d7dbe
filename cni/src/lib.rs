//! The `brindle` CNI plugin's library. See `cni/README.md`.
//!
//! - [`plugin`]: the verbs (ADD, DEL, CHECK, GC, STATUS) on top of the
//!   generic exec driver in `brindle_api::cni`.
//! - [`config`]: the plugin's own config keys.
//! - [`ifname`]: host veth names from the attachment handle.
//! - [`mac`]: the MAC a runtime asks the pod's interface to have.
//! - [`delegate`]: exec of the IPAM plugin, as the spec describes.
//! - [`netlink`] and [`netns`]: a blocking rtnetlink client, and how a
//!   socket inside a pod's netns is opened without moving our own thread.
//! - [`tap`]: the `tap` pod interface (`interfaceKind: tap`).
//! - [`daemon`]: the node daemon's endpoint API.
//! - [`conflist`]: the one conflist template.
#![forbid(unsafe_code)]

pub mod config;
pub mod conflist;
pub mod daemon;
pub mod delegate;
pub mod ifname;
pub mod mac;
pub mod netlink;
pub mod netns;
pub mod plugin;
pub mod tap;

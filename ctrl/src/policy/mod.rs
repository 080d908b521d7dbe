//! Network policy resources in the datastore (issue 15): stored under
//! `<root>policy/<kind>/[<namespace>/]<name>` as the object's JSON (what
//! `brindlectl get -o json` prints), applied and deleted all or nothing in
//! one transaction, read back by every node's [`watch::PolicyWatch`] and
//! compiled by the owner loop (`brindle_policy::compile::Compiler`).
//!
//! - [`store`]: the records (apply, delete, list).
//! - [`ops`]: the `policy_*` ops on `ctrl.sock` for `brindlectl apply|delete|get`.
//! - [`watch`]: what changed in the datastore since the last read, as
//!   compiler changes (policy resources, and the endpoints of other nodes).

pub mod ops;
pub mod store;
pub mod watch;

pub use store::PolicyStore;
pub use watch::PolicyWatch;

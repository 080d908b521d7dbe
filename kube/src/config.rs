//! `[datastore.kubernetes]` of the node daemon's configuration: whether
//! the Kubernetes API is watched, and how it is reached.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};

/// How long one watch call lasts (the API server ends it then and the
/// watcher resumes from the last resource version; a connection that goes
/// silent is noticed 5 s after this).
pub const WATCH_SECS: u32 = 60;

/// No byte from the API server for this long ends a call (longer than a
/// watch call, which the server closes itself).
pub const READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECS as u64 + 10);

/// Connecting to the API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `[datastore.kubernetes]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubeConfig {
    /// Watch the Kubernetes API (Nodes, Pods, Namespaces,
    /// NetworkPolicies). IPAM stays in the datastore (`etcd` or embedded).
    pub enabled: bool,
    /// A kubeconfig file; empty: the pod's service account (in-cluster:
    /// `KUBERNETES_SERVICE_HOST`/`_PORT` and the token and CA mounted under
    /// `/var/run/secrets/kubernetes.io/serviceaccount`).
    pub kubeconfig: String,
}

/// Why the API cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster service account.
    #[error("in-cluster service account: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// Building the client.
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

impl KubeConfig {
    /// Checks what can be checked without the API: a kubeconfig that is
    /// named exists.
    pub fn validate(&self) -> Result<(), String> {
        if self.enabled && !self.kubeconfig.is_empty() && !Path::new(&self.kubeconfig).is_file() {
            return Err(format!(
                "datastore.kubernetes.kubeconfig {:?}: no such file",
                self.kubeconfig
            ));
        }
        Ok(())
    }

    /// A client of the API server, with the timeouts above.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let mut config = if self.kubeconfig.is_empty() {
            kube::Config::incluster()?
        } else {
            let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|source| {
                ClientError::Kubeconfig {
                    path: self.kubeconfig.clone(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: self.kubeconfig.clone(),
                    source,
                })?
        };
        with_timeouts(&mut config);
        Ok(kube::Client::try_from(config)?)
    }
}

/// Connect, read and write timeouts on every call.
pub fn with_timeouts(config: &mut kube::Config) {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(CONNECT_TIMEOUT);
    config.reset_reader_on_write = true;
}

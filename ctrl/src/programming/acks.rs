//! Which pod ports the vrouter has acknowledged: the executor records a
//! port once the vrouter answered the whole batch that added it (its
//! `AddPorts`, routes and policy: the port forwards), and CNI ADD waits
//! for its port here (bounded), so a pod's first packets are not sent
//! before the vrouter attached its port (issue 17: 2 of 110 pods lost
//! their first ping when ADD answered at the store).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use brindle_api::vrouter::PortSpec;

/// The ports the vrouter holds as the executor last heard, by name.
#[derive(Default)]
pub struct PortAcks {
    ports: Mutex<HashMap<String, PortSpec>>,
    changed: Condvar,
}

impl PortAcks {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, PortSpec>> {
        self.ports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The vrouter answered a batch that added `ports`.
    pub fn added(&self, ports: &[PortSpec]) {
        let mut m = self.lock();
        for p in ports {
            m.insert(p.name.clone(), p.clone());
        }
        self.changed.notify_all();
    }

    /// The vrouter answered a batch that removed `names`.
    pub fn removed(&self, names: &[String]) {
        let mut m = self.lock();
        for n in names {
            m.remove(n);
        }
    }

    /// The vrouter holds exactly `ports` (a resync answered).
    pub fn replace(&self, ports: impl IntoIterator<Item = PortSpec>) {
        let mut m = self.lock();
        *m = ports.into_iter().map(|p| (p.name.clone(), p)).collect();
        self.changed.notify_all();
    }

    /// The vrouter went away: nothing is acknowledged until it answers.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Waits until the vrouter acknowledged `port` as it is, or `deadline`;
    /// whether it did.
    pub fn wait(&self, port: &PortSpec, deadline: Instant) -> bool {
        let mut m = self.lock();
        loop {
            if m.get(&port.name) == Some(port) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            m = self
                .changed
                .wait_timeout(m, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use brindle_api::vrouter::{PortDevice, PortKind};

    use super::*;

    fn port(name: &str) -> PortSpec {
        PortSpec {
            name: name.into(),
            kind: PortKind::Pod,
            addresses: vec!["10.244.0.5".parse().unwrap()],
            peer_mac: None,
            endpoint: None,
            device: PortDevice::Xdp,
            workload: None,
        }
    }

    #[test]
    fn a_waiter_wakes_when_its_port_is_acknowledged_and_not_before() {
        let acks = Arc::new(PortAcks::default());
        let a = port("bri1");
        assert!(!acks.wait(&a, Instant::now()));
        let waiter = {
            let (acks, a) = (acks.clone(), a.clone());
            std::thread::spawn(move || acks.wait(&a, Instant::now() + Duration::from_secs(30)))
        };
        acks.added(&[port("bri2")]);
        acks.added(std::slice::from_ref(&a));
        assert!(waiter.join().unwrap());
        // Another spec under the same name is not this port.
        let mut moved = a.clone();
        moved.addresses = vec!["10.244.0.6".parse().unwrap()];
        assert!(!acks.wait(&moved, Instant::now()));
        acks.removed(&["bri1".into()]);
        assert!(!acks.wait(&a, Instant::now()));
        acks.replace([a.clone()]);
        assert!(acks.wait(&a, Instant::now()));
        acks.clear();
        assert!(!acks.wait(&a, Instant::now()));
    }
}

//! The underlay gateway and its neighbour entry, learned from a real kernel
//! in a namespace: the uplink's default gateway is followed as the route
//! changes, and the gateway's resolved entry is among the uplink's
//! neighbours sent to the vrouter.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use brindle_api::vrouter::{Mac, Neighbor};
use brindle_ctrl::gateway;
use brindle_ctrl::neighbors::{self, NeighborChange};
use common::{Netns, in_netns};
use tokio::sync::mpsc;

/// Waits for the next value of `rx`; bounded so a watcher that never
/// answers fails the test instead of hanging it.
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .context("no value within 10 s")?
        .ok_or_else(|| anyhow!("the watcher stopped"))
}

#[test]
#[ignore = "requires root and network namespaces"]
fn the_uplink_default_gateway_is_followed_and_its_neighbour_reaches_the_vrouter() -> Result<()> {
    let ns = Netns::new("ctgw")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up0p"])?;
    ns.ip(&["link", "set", "up0", "up"])?;
    ns.ip(&["link", "set", "up0p", "up"])?;
    ns.ip(&["addr", "add", "10.77.0.2/24", "dev", "up0"])?;
    ns.ip(&["route", "add", "default", "via", "10.77.0.1", "dev", "up0"])?;
    ns.ip(&[
        "neigh",
        "add",
        "10.77.0.1",
        "lladdr",
        "02:00:00:00:77:01",
        "dev",
        "up0",
        "nud",
        "permanent",
    ])?;
    let ns_name = ns.name.clone();
    let worker = in_netns(&ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let (gtx, mut grx) = mpsc::unbounded_channel();
            let gw_task = tokio::spawn(gateway::watch("up0".into(), move |g| gtx.send(g).is_ok()));
            let (ntx, mut nrx) = mpsc::unbounded_channel();
            let n_task = tokio::spawn(neighbors::watch("up0".into(), move |c| ntx.send(c).is_ok()));

            assert_eq!(next(&mut grx).await?, Some(Ipv4Addr::new(10, 77, 0, 1)));
            let initial = next(&mut nrx).await?;
            assert!(
                initial.contains(&NeighborChange::Set(Neighbor {
                    port: "up0".into(),
                    ip: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
                    mac: Mac([0x02, 0, 0, 0, 0x77, 0x01]),
                })),
                "the gateway's entry is not among {initial:?}"
            );

            // Another gateway, then none: each change is sent.
            let ip = |args: &[&str]| -> Result<()> {
                let mut full = vec!["ip", "-n", ns_name.as_str()];
                full.extend_from_slice(args);
                common::run(&full).map(|_| ())
            };
            ip(&[
                "route",
                "replace",
                "default",
                "via",
                "10.77.0.254",
                "dev",
                "up0",
            ])?;
            assert_eq!(next(&mut grx).await?, Some(Ipv4Addr::new(10, 77, 0, 254)));
            // A route other than a default one changes nothing.
            ip(&[
                "route",
                "add",
                "10.78.0.0/16",
                "via",
                "10.77.0.9",
                "dev",
                "up0",
            ])?;
            ip(&["route", "del", "default"])?;
            assert_eq!(next(&mut grx).await?, None);
            gw_task.abort();
            n_task.abort();
            Ok(())
        })
    });
    worker
        .join()
        .map_err(|_| anyhow!("the test thread panicked"))?
}

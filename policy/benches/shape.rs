//! The Calico-shaped rule set of `brindle-perf`'s kernel-calico scenario,
//! as policies: 50 local endpoints, each selected by its own Calico
//! GlobalNetworkPolicy of 23 ingress and 23 egress rules (2,300 rules), the
//! rules matching 10 global network sets per endpoint of 8 addresses each
//! (500 sets), the probe flow allowed by the last rule of each chain.

use std::net::{IpAddr, Ipv4Addr};

use brindle_policy::compile::{Change, Compiler, EndpointInfo};
use brindle_policy::program::EndpointKey;
use brindle_policy::resource::parse_documents;

pub const ENDPOINTS: usize = 50;
pub const RULES_PER_DIRECTION: usize = 23;
pub const SETS_PER_ENDPOINT: usize = 10;

pub fn endpoint_addr(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 201, (i / 250) as u8, (i % 250 + 2) as u8))
}

/// Address `j` of set `s` (none of them an endpoint's).
pub fn set_addr(s: usize, j: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        172,
        16 + (s / 250) as u8,
        (s % 250) as u8,
        j as u8 + 1,
    ))
}

fn yaml(endpoints: usize) -> String {
    let mut y = String::new();
    y.push_str("apiVersion: v1\nkind: Namespace\nmetadata: {name: bench}\n");
    for i in 0..endpoints {
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: ep{i}, namespace: bench, labels: {{ep: e{i}}}}}\n"
        ));
        for k in 0..SETS_PER_ENDPOINT {
            let s = i * SETS_PER_ENDPOINT + k;
            let nets: Vec<String> = (0..8).map(|j| format!("{}/32", set_addr(s, j))).collect();
            y.push_str(&format!(
                "---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata: {{name: s{s}, labels: {{set: s{s}}}}}\nspec: {{nets: [{}]}}\n",
                nets.join(", ")
            ));
        }
        let rules = |ingress: bool| {
            let mut r = String::new();
            for n in 0..RULES_PER_DIRECTION {
                let s = i * SETS_PER_ENDPOINT + n % SETS_PER_ENDPOINT;
                let port = 1000 + n;
                if ingress {
                    r.push_str(&format!(
                        "  - action: Allow\n    protocol: UDP\n    source: {{selector: set == \"s{s}\"}}\n    destination: {{ports: [{port}]}}\n"
                    ));
                } else {
                    r.push_str(&format!(
                        "  - action: Allow\n    protocol: UDP\n    destination: {{selector: set == \"s{s}\", ports: [{port}]}}\n"
                    ));
                }
            }
            r
        };
        y.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {{name: ep{i}}}\nspec:\n  selector: ep == \"e{i}\"\n  types: [Ingress, Egress]\n  ingress:\n{}  egress:\n{}",
            rules(true),
            rules(false)
        ));
    }
    y
}

pub fn changes(endpoints: usize) -> Vec<Change> {
    let mut c: Vec<Change> = parse_documents(&yaml(endpoints))
        .expect("the bench's policies parse")
        .into_iter()
        .map(Change::Apply)
        .collect();
    for i in 0..endpoints {
        c.push(Change::Endpoint(
            EndpointKey::new("bench", format!("ep{i}")),
            Some(EndpointInfo {
                addrs: vec![endpoint_addr(i)],
                local: true,
            }),
        ));
    }
    c
}

pub fn compiled() -> Compiler {
    let mut c = Compiler::new();
    c.apply(changes(ENDPOINTS));
    c
}

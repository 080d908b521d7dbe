//! Compiling the Calico-shaped rule set (see shape.rs) from nothing, and
//! one policy change on top of it; and the programming case: 1,000
//! Kubernetes policies over 1,000 local endpoints (20 namespaces, 100 app
//! labels, each policy selecting the ~10 pods of one app and allowing port
//! 80 from the next app), compiled on top of the endpoints.

use std::hint::black_box;

use brindle_policy::compile::{Change, Compiler};
use brindle_policy::resource::parse_documents;
use criterion::{Criterion, criterion_group, criterion_main};

#[path = "shape.rs"]
mod shape;

fn bench(c: &mut Criterion) {
    let changes = shape::changes(shape::ENDPOINTS);
    c.bench_function("compile/calico_shape_from_nothing", |b| {
        b.iter(|| {
            let mut compiler = Compiler::new();
            black_box(compiler.apply(changes.clone()))
        })
    });
    let mut compiler = shape::compiled();
    let flip = |port: u16| {
        parse_documents(&format!(
            "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {{name: ep7, namespace: bench}}\nspec:\n  selector: ep == \"e7\"\n  ingress:\n  - action: Allow\n    protocol: TCP\n    destination: {{ports: [{port}]}}\n"
        ))
        .expect("parses")
        .into_iter()
        .map(Change::Apply)
        .collect::<Vec<_>>()
    };
    let (a, b2) = (flip(80), flip(81));
    let mut odd = false;
    c.bench_function("compile/one_policy_changed", |b| {
        b.iter(|| {
            odd = !odd;
            let u = compiler.apply(if odd { a.clone() } else { b2.clone() });
            assert_eq!(u.programs.len(), 1);
            black_box(u)
        })
    });
}

fn thousand(c: &mut Criterion) {
    let mut endpoints = Vec::new();
    let mut y = String::new();
    for n in 0..20 {
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ns{n}}}\n"
        ));
    }
    for i in 0..1000 {
        let ns = i % 20;
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: ns{ns}, labels: {{app: a{}}}}}\n",
            i % 100
        ));
        endpoints.push(Change::Endpoint(
            brindle_policy::program::EndpointKey::new(format!("ns{ns}"), format!("p{i}")),
            Some(brindle_policy::compile::EndpointInfo {
                addrs: vec![std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                    10,
                    1,
                    (i / 250) as u8,
                    (i % 250) as u8 + 1,
                ))],
                local: true,
            }),
        ));
    }
    let mut base: Vec<Change> = parse_documents(&y)
        .expect("parses")
        .into_iter()
        .map(Change::Apply)
        .collect();
    base.extend(endpoints);
    let mut p = String::new();
    for i in 0..1000 {
        p.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: np{i}, namespace: ns{}}}\nspec:\n  podSelector: {{matchLabels: {{app: a{}}}}}\n  ingress:\n  - from: [{{namespaceSelector: {{}}, podSelector: {{matchLabels: {{app: a{}}}}}}}]\n    ports: [{{port: 80}}]\n",
            i % 20,
            i % 100,
            (i + 1) % 100
        ));
    }
    let p = p;
    let policies: Vec<Change> = parse_documents(&p)
        .expect("parses")
        .into_iter()
        .map(Change::Apply)
        .collect();
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    g.bench_function("1000_policies_onto_1000_endpoints", |b| {
        b.iter_batched(
            || {
                let mut compiler = Compiler::new();
                compiler.apply(base.clone());
                compiler
            },
            |mut compiler| {
                let u = compiler.apply(policies.clone());
                assert_eq!(u.programs.len(), 1000);
                black_box(u)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    // Apply -> enforced, in process: the documents parsed (as ctrl's
    // apply does), compiled, the update through its wire form (JSON, as
    // ApplyPolicy carries it) and applied to the dataplane's state (as the
    // vrouter does). Not here: the store write, the 200 ms marker poll,
    // the socket and the workers taking the new view (next batch).
    g.bench_function("1000_policies_apply_to_enforced_state", |b| {
        b.iter_batched(
            || {
                let mut compiler = Compiler::new();
                let first = compiler.apply(base.clone());
                let mut state = brindle_policy::classify::PolicyState::default();
                if !first.is_empty() {
                    state.apply(&first).expect("applies");
                }
                (compiler, state)
            },
            |(mut compiler, mut state)| {
                let changes: Vec<Change> = parse_documents(&p)
                    .expect("parses")
                    .into_iter()
                    .map(Change::Apply)
                    .collect();
                let u = compiler.apply(changes);
                let wire = serde_json::to_vec(&u).expect("serialises");
                let u: brindle_policy::program::Update =
                    serde_json::from_slice(&wire).expect("parses");
                state.apply(&u).expect("applies");
                assert_eq!(state.endpoints(), 1000);
                black_box(state)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench, thousand);
criterion_main!(benches);

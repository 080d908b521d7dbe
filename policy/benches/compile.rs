//! Compiling the Calico-shaped rule set (see shape.rs) from nothing, and
//! one policy change on top of it.

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

criterion_group!(benches, bench);
criterion_main!(benches);

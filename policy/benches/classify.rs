//! ns per classification with the Calico-shaped rule set (see shape.rs):
//! the probe is allowed by the last rule of the chain, so a classification
//! walks all 23 rules of the direction (each a set lookup and a port test).

use std::hint::black_box;

use brindle_policy::classify::{Packet, PolicyState};
use brindle_policy::program::{Direction, EndpointKey};
use criterion::{Criterion, criterion_group, criterion_main};

#[path = "shape.rs"]
mod shape;

fn bench(c: &mut Criterion) {
    let compiler = shape::compiled();
    let mut dp = PolicyState::default();
    dp.apply(&compiler.snapshot())
        .expect("the snapshot applies");
    let i = shape::ENDPOINTS / 2;
    let ep = EndpointKey::new("bench", format!("ep{i}"));
    let last = shape::RULES_PER_DIRECTION - 1;
    let set = i * shape::SETS_PER_ENDPOINT + last % shape::SETS_PER_ENDPOINT;
    let ingress = Packet::ported(
        shape::set_addr(set, 7),
        shape::endpoint_addr(i),
        17,
        40000,
        1000 + last as u16,
    );
    let egress = Packet::ported(
        shape::endpoint_addr(i),
        shape::set_addr(set, 7),
        17,
        40000,
        1000 + last as u16,
    );
    let program = &dp.endpoint(&ep).expect("a program").program;
    assert_eq!(program.rule_count(), 2 * shape::RULES_PER_DIRECTION);
    assert!(dp.classify(&ep, Direction::Ingress, &ingress).allow);
    assert!(dp.classify(&ep, Direction::Egress, &egress).allow);
    let denied = Packet {
        dst_port: 999,
        ..ingress
    };
    assert!(!dp.classify(&ep, Direction::Ingress, &denied).allow);

    let sets = dp.sets();
    c.bench_function("classify/ingress_last_rule", |b| {
        b.iter(|| {
            brindle_policy::classify::classify(
                program,
                Direction::Ingress,
                sets,
                black_box(&ingress),
            )
        })
    });
    c.bench_function("classify/egress_last_rule", |b| {
        b.iter(|| {
            brindle_policy::classify::classify(program, Direction::Egress, sets, black_box(&egress))
        })
    });
    c.bench_function("classify/denied_end_of_tier", |b| {
        b.iter(|| {
            brindle_policy::classify::classify(
                program,
                Direction::Ingress,
                sets,
                black_box(&denied),
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Every malformed-message case of RFC 4271 §6 the codec can see, table
//! driven: the NOTIFICATION (code, subcode, data) RFC 4271 asks for, and
//! what RFC 7606 revised error handling does instead.

use brindle_ctrl::bgp::packet::*;

fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(kind);
    m.extend_from_slice(body);
    m
}

fn open_body(version: u8, asn: u16, hold: u16, id: [u8; 4], params: &[u8]) -> Vec<u8> {
    let mut b = vec![version];
    b.extend_from_slice(&asn.to_be_bytes());
    b.extend_from_slice(&hold.to_be_bytes());
    b.extend_from_slice(&id);
    b.push(params.len() as u8);
    b.extend_from_slice(params);
    b
}

fn update(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(withdrawn);
    b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    b.extend_from_slice(attrs);
    b.extend_from_slice(nlri);
    msg(2, &b)
}

const ORIGIN: &[u8] = &[0x40, 1, 1, 0];
const AS_PATH: &[u8] = &[0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9];
const NEXT_HOP: &[u8] = &[0x40, 3, 4, 10, 0, 0, 1];
const NLRI: &[u8] = &[24, 192, 0, 2];

fn attrs(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn mandatory_with(extra: &[u8]) -> Vec<u8> {
    attrs(&[ORIGIN, AS_PATH, NEXT_HOP, extra])
}

/// What RFC 7606 does with the message.
#[derive(Debug, PartialEq)]
enum Revised {
    /// Still a session reset with the RFC 4271 NOTIFICATION.
    Reset,
    /// The UPDATE is accepted with every announced prefix withdrawn.
    TreatAsWithdraw,
    /// The UPDATE is accepted without the bad attribute.
    Discard,
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    code: u8,
    subcode: u8,
    data: Vec<u8>,
    revised: Revised,
}

fn case(
    name: &'static str,
    bytes: Vec<u8>,
    code: u8,
    subcode: u8,
    data: &[u8],
    revised: Revised,
) -> Case {
    Case {
        name,
        bytes,
        code,
        subcode,
        data: data.to_vec(),
        revised,
    }
}

fn cases() -> Vec<Case> {
    use Revised::*;
    let mut bad_marker = msg(4, &[]);
    bad_marker[3] = 0;
    let mut short = msg(4, &[]);
    short[17] = 18;
    let mut huge = msg(4, &[]);
    huge[16..18].copy_from_slice(&4097u16.to_be_bytes());
    let mp_reach_bad_nh = [0x80, 14, 8, 0, 2, 1, 3, 1, 2, 3, 0];
    vec![
        // §6.1 Message Header error handling.
        case("marker not all ones", bad_marker, 1, 1, &[], Reset),
        case("length below 19", short, 1, 2, &[0, 18], Reset),
        case("length above 4096", huge, 1, 2, &[0x10, 0x01], Reset),
        case(
            "keepalive longer than 19",
            msg(4, &[0]),
            1,
            2,
            &[0, 20],
            Reset,
        ),
        case(
            "open shorter than 29",
            msg(1, &[4, 0, 1]),
            1,
            2,
            &[0, 22],
            Reset,
        ),
        case(
            "update shorter than 23",
            msg(2, &[0, 0]),
            1,
            2,
            &[0, 21],
            Reset,
        ),
        case(
            "notification shorter than 21",
            msg(3, &[6]),
            1,
            2,
            &[0, 20],
            Reset,
        ),
        case("unknown message type", msg(9, &[]), 1, 3, &[9], Reset),
        // §6.2 OPEN message error handling.
        case(
            "open with version 3",
            msg(1, &open_body(3, 65001, 90, [10, 0, 0, 1], &[])),
            2,
            1,
            &[0, 4],
            Reset,
        ),
        case(
            "open with hold time 1",
            msg(1, &open_body(4, 65001, 1, [10, 0, 0, 1], &[])),
            2,
            6,
            &[],
            Reset,
        ),
        case(
            "open with hold time 2",
            msg(1, &open_body(4, 65001, 2, [10, 0, 0, 1], &[])),
            2,
            6,
            &[],
            Reset,
        ),
        case(
            "open with identifier 0.0.0.0",
            msg(1, &open_body(4, 65001, 90, [0, 0, 0, 0], &[])),
            2,
            3,
            &[],
            Reset,
        ),
        case(
            "open with authentication parameter",
            msg(1, &open_body(4, 65001, 90, [10, 0, 0, 1], &[1, 1, 0])),
            2,
            4,
            &[],
            Reset,
        ),
        case(
            "open with parameter overrunning the parameters",
            msg(1, &open_body(4, 65001, 90, [10, 0, 0, 1], &[2, 9, 0])),
            2,
            0,
            &[],
            Reset,
        ),
        case(
            "open with four-octet AS capability of wrong length",
            msg(
                1,
                &open_body(4, 65001, 90, [10, 0, 0, 1], &[2, 4, 65, 2, 0, 1]),
            ),
            2,
            0,
            &[],
            Reset,
        ),
        // §6.3 UPDATE message error handling.
        case(
            "withdrawn length overruns the message",
            update(&[24, 10, 0], &[], &[])
                .into_iter()
                .enumerate()
                .map(|(i, b)| if i == 20 { 9 } else { b })
                .collect(),
            3,
            1,
            &[],
            Reset,
        ),
        case(
            "attribute length overruns the message",
            {
                let mut m = update(&[], ORIGIN, &[]);
                m[22] = 40;
                m
            },
            3,
            1,
            &[],
            Reset,
        ),
        case(
            "duplicate mp_reach",
            update(
                &[],
                &attrs(&[
                    ORIGIN,
                    AS_PATH,
                    &[0x80, 15, 3, 0, 1, 1],
                    &[0x80, 15, 3, 0, 1, 1],
                ]),
                &[],
            ),
            3,
            1,
            &[],
            Reset,
        ),
        case(
            "duplicate origin (RFC 7606: first one kept)",
            update(&[], &attrs(&[ORIGIN, ORIGIN, AS_PATH, NEXT_HOP]), NLRI),
            3,
            1,
            &[],
            Discard,
        ),
        case(
            "unrecognized well-known attribute",
            update(&[], &mandatory_with(&[0x40, 99, 1, 7]), NLRI),
            3,
            2,
            &[0x40, 99, 1, 7],
            Reset,
        ),
        case(
            "missing origin",
            update(&[], &attrs(&[AS_PATH, NEXT_HOP]), NLRI),
            3,
            3,
            &[1],
            TreatAsWithdraw,
        ),
        case(
            "missing as_path",
            update(&[], &attrs(&[ORIGIN, NEXT_HOP]), NLRI),
            3,
            3,
            &[2],
            TreatAsWithdraw,
        ),
        case(
            "missing next_hop",
            update(&[], &attrs(&[ORIGIN, AS_PATH]), NLRI),
            3,
            3,
            &[3],
            TreatAsWithdraw,
        ),
        case(
            "nlri without any attribute",
            update(&[], &[], NLRI),
            3,
            3,
            &[1],
            TreatAsWithdraw,
        ),
        case(
            "origin marked optional",
            update(&[], &attrs(&[&[0xc0, 1, 1, 0], AS_PATH, NEXT_HOP]), NLRI),
            3,
            4,
            &[0xc0, 1, 1, 0],
            TreatAsWithdraw,
        ),
        case(
            "med marked well-known",
            update(&[], &mandatory_with(&[0x40, 4, 4, 0, 0, 0, 1]), NLRI),
            3,
            4,
            &[0x40, 4, 4, 0, 0, 0, 1],
            TreatAsWithdraw,
        ),
        case(
            "origin of length 2",
            update(&[], &attrs(&[&[0x40, 1, 2, 0, 0], AS_PATH, NEXT_HOP]), NLRI),
            3,
            5,
            &[0x40, 1, 2, 0, 0],
            TreatAsWithdraw,
        ),
        case(
            "next_hop of length 3",
            update(
                &[],
                &attrs(&[ORIGIN, AS_PATH, &[0x40, 3, 3, 10, 0, 0]]),
                NLRI,
            ),
            3,
            5,
            &[0x40, 3, 3, 10, 0, 0],
            TreatAsWithdraw,
        ),
        case(
            "local_pref of length 2",
            update(&[], &mandatory_with(&[0x40, 5, 2, 0, 1]), NLRI),
            3,
            5,
            &[0x40, 5, 2, 0, 1],
            TreatAsWithdraw,
        ),
        case(
            "communities of length 5",
            update(&[], &mandatory_with(&[0xc0, 8, 5, 0, 0, 0, 1, 2]), NLRI),
            3,
            5,
            &[0xc0, 8, 5, 0, 0, 0, 1, 2],
            TreatAsWithdraw,
        ),
        case(
            "atomic_aggregate with a value",
            update(&[], &mandatory_with(&[0x40, 6, 1, 0]), NLRI),
            3,
            5,
            &[0x40, 6, 1, 0],
            Discard,
        ),
        case(
            "aggregator of length 5",
            update(&[], &mandatory_with(&[0xc0, 7, 5, 0, 1, 10, 0, 0]), NLRI),
            3,
            5,
            &[0xc0, 7, 5, 0, 1, 10, 0, 0],
            Discard,
        ),
        case(
            "origin value 3",
            update(&[], &attrs(&[&[0x40, 1, 1, 3], AS_PATH, NEXT_HOP]), NLRI),
            3,
            6,
            &[0x40, 1, 1, 3],
            TreatAsWithdraw,
        ),
        case(
            "next_hop 0.0.0.0",
            update(
                &[],
                &attrs(&[ORIGIN, AS_PATH, &[0x40, 3, 4, 0, 0, 0, 0]]),
                NLRI,
            ),
            3,
            8,
            &[0x40, 3, 4, 0, 0, 0, 0],
            TreatAsWithdraw,
        ),
        case(
            "next_hop multicast",
            update(
                &[],
                &attrs(&[ORIGIN, AS_PATH, &[0x40, 3, 4, 224, 0, 0, 1]]),
                NLRI,
            ),
            3,
            8,
            &[0x40, 3, 4, 224, 0, 0, 1],
            TreatAsWithdraw,
        ),
        case(
            "mp_reach with a 3-octet IPv6 next hop",
            update(&[], &attrs(&[ORIGIN, AS_PATH, &mp_reach_bad_nh]), &[]),
            3,
            9,
            &mp_reach_bad_nh,
            Reset,
        ),
        case(
            "nlri prefix length 33",
            update(&[], &mandatory_with(&[]), &[33, 10, 0, 0, 0, 0]),
            3,
            10,
            &[],
            Reset,
        ),
        case(
            "nlri prefix cut short",
            update(&[], &mandatory_with(&[]), &[24, 10, 0]),
            3,
            10,
            &[],
            Reset,
        ),
        case(
            "withdrawn prefix length 40",
            update(&[40, 1, 2, 3, 4, 5], &[], &[]),
            3,
            10,
            &[],
            Reset,
        ),
        case(
            "as_path segment type 5",
            update(
                &[],
                &attrs(&[ORIGIN, &[0x40, 2, 6, 5, 1, 0, 0, 0xfd, 0xe9], NEXT_HOP]),
                NLRI,
            ),
            3,
            11,
            &[],
            TreatAsWithdraw,
        ),
        case(
            "as_path segment overruns the attribute",
            update(
                &[],
                &attrs(&[ORIGIN, &[0x40, 2, 6, 2, 2, 0, 0, 0xfd, 0xe9], NEXT_HOP]),
                NLRI,
            ),
            3,
            11,
            &[],
            TreatAsWithdraw,
        ),
        case(
            "as_path empty segment",
            update(&[], &attrs(&[ORIGIN, &[0x40, 2, 2, 2, 0], NEXT_HOP]), NLRI),
            3,
            11,
            &[],
            TreatAsWithdraw,
        ),
        // RFC 7313 §5: ROUTE-REFRESH of the wrong length.
        case(
            "route refresh of length 22",
            msg(5, &[0, 1, 0]),
            7,
            1,
            &[0, 22],
            Reset,
        ),
    ]
}

#[test]
fn every_rfc4271_malformed_case_maps_to_its_notification() {
    let strict = DecodeCxt {
        four_octet_as: true,
        revised_error_handling: false,
    };
    for c in cases() {
        let err = match Message::decode(&c.bytes, &strict) {
            Ok(m) => panic!("{}: decoded as {m:?}", c.name),
            Err(e) => e,
        };
        let n = NotificationMsg::from(&err);
        assert_eq!(
            (n.code, n.subcode, &n.data[..]),
            (c.code, c.subcode, &c.data[..]),
            "{}: {err}",
            c.name
        );
    }
}

#[test]
fn revised_error_handling_withdraws_or_discards_where_rfc7606_says() {
    for c in cases() {
        let got = Message::decode(&c.bytes, &DecodeCxt::default());
        match c.revised {
            Revised::Reset => {
                let err = got.expect_err(c.name);
                let n = NotificationMsg::from(&err);
                assert_eq!((n.code, n.subcode), (c.code, c.subcode), "{}", c.name);
            }
            Revised::TreatAsWithdraw => {
                let Ok(Message::Update(u)) = got else {
                    panic!("{}: {got:?}", c.name)
                };
                let e = u.treat_as_withdraw.unwrap_or_else(|| panic!("{}", c.name));
                let n = NotificationMsg::from(&DecodeError::Update(e));
                assert_eq!((n.code, n.subcode), (c.code, c.subcode), "{}", c.name);
            }
            Revised::Discard => {
                let Ok(Message::Update(u)) = got else {
                    panic!("{}: {got:?}", c.name)
                };
                assert_eq!(u.treat_as_withdraw, None, "{}", c.name);
                let a = u.attrs.unwrap();
                assert!(!a.atomic_aggregate && a.aggregator.is_none(), "{}", c.name);
                assert_eq!(u.nlri.len(), 1, "{}", c.name);
            }
        }
    }
}

#[test]
fn unknown_optional_transitive_attribute_is_kept_with_the_partial_bit() {
    let m = update(
        &[],
        &mandatory_with(&[0xc0, 200, 2, 0xab, 0xcd, 0x80, 201, 1, 1]),
        NLRI,
    );
    let Message::Update(u) = Message::decode(&m, &DecodeCxt::default()).unwrap() else {
        panic!()
    };
    let a = u.attrs.unwrap();
    assert_eq!(a.unknown.len(), 1, "non-transitive 201 is dropped");
    assert_eq!((a.unknown[0].flags, a.unknown[0].type_code), (0xe0, 200));
    let out = Message::Update(UpdateMsg {
        attrs: Some(a),
        nlri: u.nlri,
        ..Default::default()
    })
    .encode(&EncodeCxt::default());
    assert!(
        hex::encode(&out).contains("e0c802abcd"),
        "{}",
        hex::encode(&out)
    );
}

#[test]
fn two_octet_session_rebuilds_the_path_from_as4_path() {
    // AS_PATH [23456, 65010] (2-octet) and AS4_PATH [4200000002, 65010].
    let as_path = [0x40, 2, 6, 2, 2, 0x5b, 0xa0, 0xfd, 0xf2];
    let as4 = [0xc0, 17, 10, 2, 2, 0xfa, 0x56, 0xea, 0x02, 0, 0, 0xfd, 0xf2];
    let m = update(&[], &attrs(&[ORIGIN, &as_path, NEXT_HOP, &as4]), NLRI);
    let two = DecodeCxt {
        four_octet_as: false,
        revised_error_handling: true,
    };
    let Message::Update(u) = Message::decode(&m, &two).unwrap() else {
        panic!()
    };
    let a = u.attrs.clone().unwrap();
    assert_eq!(a.as_path, Some(AsPath::sequence(vec![23456, 65010])));
    assert_eq!(
        a.effective_as_path(),
        AsPath::sequence(vec![4_200_000_002, 65010])
    );
    // And back out on a 2-octet session: AS_TRANS in AS_PATH, AS4_PATH kept.
    let out = Message::Update(u.clone()).encode(&EncodeCxt {
        four_octet_as: false,
    });
    assert_eq!(Message::decode(&out, &two).unwrap(), Message::Update(u));
}

#[test]
fn framing_waits_for_a_whole_header() {
    let k = msg(4, &[]);
    assert_eq!(get_message_len(&k[..18]).unwrap(), None);
    assert_eq!(get_message_len(&k).unwrap(), Some(19));
}

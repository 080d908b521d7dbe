// Shared by every target: decode with the message type forced, check the
// decoder never panics and that whatever it accepts encodes and decodes to
// the same value.
use brindle_ctrl::bgp::packet::{DecodeCxt, EncodeCxt, Message};

/// `kind` 0 keeps the type octet from the input.
pub fn check(data: &[u8], kind: u8) {
    let Some((&flags, body)) = data.split_first() else { return };
    let cxt = DecodeCxt {
        four_octet_as: flags & 1 != 0,
        revised_error_handling: flags & 2 != 0,
    };
    let mut msg = vec![0xff; 16];
    let len = (19 + body.len().saturating_sub(usize::from(kind == 0))).min(u16::MAX as usize) as u16;
    msg.extend_from_slice(&len.to_be_bytes());
    if kind != 0 {
        msg.push(kind);
    }
    msg.extend_from_slice(body);
    let _ = brindle_ctrl::bgp::packet::get_message_len(&msg);
    let Ok(decoded) = Message::decode(&msg, &cxt) else { return };
    if let Message::Update(u) = &decoded
        && u.treat_as_withdraw.is_some()
    {
        return;
    }
    let encoded = decoded.encode(&EncodeCxt {
        four_octet_as: cxt.four_octet_as,
    });
    let again = Message::decode(&encoded, &cxt).expect("our own encoding decodes");
    assert_eq!(again, decoded);
}

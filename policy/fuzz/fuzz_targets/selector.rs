//! Fuzz target: the selector parser. A selector that parses prints in its
//! canonical form, which parses back to the same selector.
#![no_main]

use brindle_policy::selector::Selector;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sel) = Selector::parse(text) else {
        return;
    };
    let printed = sel.to_string();
    let again = Selector::parse(&printed).expect("a printed selector parses");
    assert_eq!(again, sel, "{text:?} printed as {printed:?}");
});

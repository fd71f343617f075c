//! The committed C header is exactly what cbindgen generates from the sources.

#[test]
fn committed_header_matches_generated() {
    let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/dflash2.h")).expect("generated header");
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/dflash2.h")).expect("include/dflash2.h");
    assert!(
        generated == committed,
        "include/dflash2.h is stale: regenerate it with `DFLASH2_WRITE_HEADER=1 cargo build` and commit it"
    );
}

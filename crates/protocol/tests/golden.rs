//! The wire's exact bytes, pinned: every message of every table (its sample), every reply,
//! every variant of the types inside them, the envelopes, a frame header and the preambles are
//! encoded and compared with tests/golden/wire.txt. postcard encodes an enum variant by its
//! position, so a reordered, inserted or retyped variant or field changes bytes here.
//!
//! A change of bytes is a change of the wire: bump `PROTOCOL_VERSION`, then rewrite the file
//! with `RGPU_BLESS=1 cargo test -p rgpu-protocol --test golden`. Blessing refuses changed
//! bytes under the version the file already names, so an incompatible change cannot go out
//! under the old number.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;

use rgpu_protocol::cuda::{self, CuReply, CuRequest};
use rgpu_protocol::opencl::{self, ClReply, ClRequest};
use rgpu_protocol::sample::Sample;
use rgpu_protocol::session::{SessionReply, SessionRequest};
use rgpu_protocol::*;

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/wire.txt")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the wire looks like now: name -> hex bytes, in a stable order.
fn encode_everything() -> Vec<(String, String)> {
    let mut out = Vec::new();
    fn add<T: serde::Serialize>(out: &mut Vec<(String, String)>, name: String, value: &T) {
        let bytes = postcard::to_allocvec(value).expect("encodes");
        out.push((name, hex(&bytes)));
    }
    for request in SessionRequest::samples() {
        add(
            &mut out,
            format!("SessionRequest.{}", request.name()),
            &request,
        );
    }
    for reply in SessionReply::samples() {
        add(&mut out, format!("SessionReply.{}", reply.name()), &reply);
    }
    for request in ClRequest::samples() {
        add(&mut out, format!("ClRequest.{}", request.name()), &request);
    }
    for reply in ClReply::samples() {
        add(&mut out, format!("ClReply.{}", reply.name()), &reply);
    }
    for request in CuRequest::samples() {
        add(&mut out, format!("CuRequest.{}", request.name()), &request);
    }
    for reply in CuReply::samples() {
        add(&mut out, format!("CuReply.{}", reply.name()), &reply);
    }
    fn variants<T: Sample + serde::Serialize + Debug>(
        out: &mut Vec<(String, String)>,
        type_name: &str,
    ) {
        for (i, value) in T::variants().iter().enumerate() {
            add(out, format!("{type_name}[{i}]"), value);
        }
    }
    variants::<ClientMsg>(&mut out, "ClientMsg");
    variants::<fabric::LinkRequest>(&mut out, "fabric::LinkRequest");
    variants::<fabric::LinkReply>(&mut out, "fabric::LinkReply");
    variants::<ServerMsg>(&mut out, "ServerMsg");
    variants::<opencl::Command>(&mut out, "opencl::Command");
    variants::<opencl::Transfer>(&mut out, "opencl::Transfer");
    variants::<opencl::InfoQuery>(&mut out, "opencl::InfoQuery");
    variants::<opencl::KernelArg>(&mut out, "opencl::KernelArg");
    variants::<opencl::ArgKind>(&mut out, "opencl::ArgKind");
    variants::<opencl::ObjKind>(&mut out, "opencl::ObjKind");
    variants::<cuda::OccupancyQuery>(&mut out, "cuda::OccupancyQuery");
    variants::<cuda::ImageKind>(&mut out, "cuda::ImageKind");
    let header = FrameHeader {
        body_len: 0x0102,
        lanes: 3,
        seq: 0x0a0b_0c0d,
        bulk_len: 1 << 33,
    };
    out.push(("FrameHeader".into(), hex(&header.encode())));
    let preambles = [
        ("Preamble.client", Preamble::client(false, None)),
        (
            "Preamble.client_tls_lane",
            Preamble::client(true, Some(0x1122)),
        ),
        (
            "Preamble.server_refused",
            Preamble::server(Preamble::REFUSED),
        ),
    ];
    for (name, preamble) in preambles {
        out.push((name.into(), hex(&preamble.encode())));
    }
    out
}

fn render(lines: &[(String, String)]) -> String {
    let mut text = String::from(
        "# The rgpu wire, pinned by crates/protocol/tests/golden.rs: a sample of every message\n\
         # and type, and its bytes. Changed bytes need a new PROTOCOL_VERSION; then\n\
         # RGPU_BLESS=1 cargo test -p rgpu-protocol --test golden rewrites this file.\n",
    );
    text.push_str(&format!("version {PROTOCOL_VERSION}\n"));
    for (name, bytes) in lines {
        text.push_str(&format!("{name} {bytes}\n"));
    }
    text
}

/// The file's version and lines.
fn parse(text: &str) -> (u32, BTreeMap<String, String>) {
    let mut version = 0;
    let mut lines = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line.split_once(' ').expect("name and value");
        if name == "version" {
            version = value.parse().expect("a version number");
        } else {
            lines.insert(name.to_string(), value.to_string());
        }
    }
    (version, lines)
}

#[test]
fn the_wire_is_as_pinned() {
    let now = encode_everything();
    let names: std::collections::HashSet<&String> = now.iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), now.len(), "two samples share a name");
    let path = golden_path();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (version, pinned) = parse(&text);
    let current: BTreeMap<String, String> = now.iter().cloned().collect();
    let mut changes = Vec::new();
    for (name, bytes) in &current {
        match pinned.get(name) {
            Some(old) if old == bytes => {}
            Some(old) => changes.push(format!("{name}: {old} -> {bytes}")),
            None => changes.push(format!("{name}: new")),
        }
    }
    for name in pinned.keys().filter(|n| !current.contains_key(*n)) {
        changes.push(format!("{name}: gone"));
    }
    let bless = std::env::var_os("RGPU_BLESS").is_some();
    if changes.is_empty() && version == PROTOCOL_VERSION {
        return;
    }
    if bless {
        assert!(
            changes.is_empty() || version < PROTOCOL_VERSION,
            "the wire changed under protocol version {version}; bump PROTOCOL_VERSION \
             (crates/protocol/src/lib.rs) before blessing:\n{}",
            changes.join("\n")
        );
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, render(&now)).unwrap();
        return;
    }
    panic!(
        "the wire differs from {} (version {version}; PROTOCOL_VERSION is {PROTOCOL_VERSION}):\n\
         {}\nIf the change is meant: bump PROTOCOL_VERSION, then run \
         RGPU_BLESS=1 cargo test -p rgpu-protocol --test golden",
        path.display(),
        changes.join("\n")
    );
}

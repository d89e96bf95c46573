//! Every message of every table survives a round trip through a frame (the tables' own
//! samples: a message added to a table is covered without touching this file); what is
//! answered and what carries bulk is as the tables say; malformed frames and preambles are
//! rejected. The exact bytes are pinned by golden.rs.

use rgpu_protocol::cuda::{CuReply, CuRequest, Extent, Pitch};
use rgpu_protocol::opencl::{ClReply, ClRequest, Command, ObjKind};
use rgpu_protocol::sample::Sample;
use rgpu_protocol::session::{SessionReply, SessionRequest};
use rgpu_protocol::*;

fn round_trip<T>(msg: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let mut buf = Vec::new();
    encode_frame(msg, 42, 7, &mut buf).expect("encodes");
    let header = FrameHeader::decode(buf[..HEADER_LEN].try_into().unwrap()).expect("header");
    assert_eq!(header.seq, 42);
    assert_eq!(header.bulk_len, 7);
    assert_eq!(header.body_len as usize, buf.len() - HEADER_LEN);
    let decoded: T = decode_body(&buf[HEADER_LEN..]).expect("decodes");
    assert_eq!(&decoded, msg);
}

#[test]
fn every_message_round_trips() {
    let mut client: Vec<ClientMsg> = ClientMsg::variants();
    client.extend(ClRequest::samples().into_iter().map(ClientMsg::Cl));
    client.extend(CuRequest::samples().into_iter().map(ClientMsg::Cu));
    client.extend(
        SessionRequest::samples()
            .into_iter()
            .map(ClientMsg::Session),
    );
    let mut server: Vec<ServerMsg> = ServerMsg::variants();
    server.extend(ClReply::samples().into_iter().map(ServerMsg::Cl));
    server.extend(CuReply::samples().into_iter().map(ServerMsg::Cu));
    server.extend(SessionReply::samples().into_iter().map(ServerMsg::Session));
    assert_eq!(
        client.len(),
        ClientMsg::variants().len()
            + ClRequest::NAMES.len()
            + CuRequest::NAMES.len()
            + SessionRequest::NAMES.len()
    );
    // And every further variant of what they carry.
    client.extend(
        ClRequest::field_variants()
            .into_iter()
            .map(|(_, m)| ClientMsg::Cl(m)),
    );
    client.extend(
        CuRequest::field_variants()
            .into_iter()
            .map(|(_, m)| ClientMsg::Cu(m)),
    );
    server.extend(
        ClReply::further_variants()
            .into_iter()
            .map(|(_, m)| ServerMsg::Cl(m)),
    );
    server.extend(
        CuReply::further_variants()
            .into_iter()
            .map(|(_, m)| ServerMsg::Cu(m)),
    );
    for msg in &client {
        round_trip(msg);
    }
    for msg in &server {
        round_trip(msg);
    }
    for command in Command::variants() {
        round_trip(&command);
    }
}

#[test]
fn replies_answer_their_own_request() {
    for reply in CuReply::samples() {
        assert!(CuRequest::NAMES.contains(&reply.name()), "{reply:?}");
    }
    for reply in ClReply::samples() {
        assert!(ClRequest::NAMES.contains(&reply.name()), "{reply:?}");
    }
}

#[test]
fn what_is_answered_and_what_carries_bulk_is_as_the_tables_say() {
    assert!(ClientMsg::Session(SessionRequest::Ping {}).expects_reply());
    let read = ClRequest::EnqueueRead {
        queue: 1,
        wait: vec![],
        event: 0,
        transfer: Sample::sample(),
    };
    let write = ClRequest::EnqueueWrite {
        queue: 1,
        wait: vec![],
        event: 0,
        transfer: Sample::sample(),
    };
    assert!(read.expects_reply() && read.reads() && !read.takes_bulk());
    assert!(!write.expects_reply() && write.takes_bulk());
    let release = ClRequest::Release {
        kind: ObjKind::Mem,
        id: 1,
    };
    assert!(!release.expects_reply());
    assert!(ClRequest::Finish { queue: 1 }.expects_reply());
    let bulk: Vec<&str> = CuRequest::samples()
        .iter()
        .filter(|r| r.takes_bulk())
        .map(|r| r.name())
        .collect();
    assert_eq!(
        bulk,
        [
            "HostMirrorWrite",
            "MemcpyHtoD",
            "LoadImage",
            "LinkAddData",
            "Launch",
            "GraphAddNode",
            "GraphNodeSetParams",
            "MemcpyHtoA"
        ]
    );
    let reads: Vec<&str> = CuRequest::samples()
        .iter()
        .filter(|r| r.reads())
        .map(|r| r.name())
        .collect();
    assert_eq!(reads, ["MemcpyDtoH", "MemcpyAtoH"]);
}

fn header_bytes(body_len: u32, lanes: u32, bulk_len: u64) -> [u8; HEADER_LEN] {
    FrameHeader {
        body_len,
        lanes,
        seq: 1,
        bulk_len,
    }
    .encode()
}

#[test]
fn malformed_headers_are_rejected() {
    assert!(
        FrameHeader::decode(&header_bytes(0, 0, 0)).is_err(),
        "empty body"
    );
    assert!(
        FrameHeader::decode(&header_bytes(8, MAX_LANES + 1, 0)).is_err(),
        "more lanes than a session may have"
    );
    assert_eq!(
        FrameHeader::decode(&header_bytes(8, 4, 1 << 26)).map(|h| h.lanes),
        Ok(4),
        "bulk striped over 4 lanes"
    );
    assert!(
        FrameHeader::decode(&header_bytes(u32::MAX, 0, 0)).is_err(),
        "huge body"
    );
    assert!(
        FrameHeader::decode(&header_bytes(8, 0, u64::MAX)).is_err(),
        "huge bulk"
    );
    assert!(FrameHeader::decode(&header_bytes(8, 0, 1 << 20)).is_ok());
}

#[test]
fn malformed_bodies_are_rejected() {
    // Every message, truncated at every length.
    let mut buf = Vec::new();
    for msg in ClRequest::samples().into_iter().map(ClientMsg::Cl) {
        buf.clear();
        encode_frame(&msg, 1, 0, &mut buf).unwrap();
        let body = &buf[HEADER_LEN..];
        for cut in 0..body.len() {
            assert!(
                decode_body::<ClientMsg>(&body[..cut]).is_err(),
                "{msg:?} truncated at {cut}"
            );
        }
    }
    let body = &buf[HEADER_LEN..];
    // Trailing garbage.
    let mut long = body.to_vec();
    long.push(0);
    assert!(decode_body::<ClientMsg>(&long).is_err());
    // An unknown variant tag.
    assert!(decode_body::<ClientMsg>(&[0xff, 0xff, 0x7f]).is_err());
}

#[test]
fn preamble_detects_version_and_magic() {
    let ours = Preamble::client(false, None).encode();
    assert_eq!(
        Preamble::decode(&ours).unwrap(),
        Preamble::client(false, None)
    );
    let mut other = ours;
    other[4..8].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    let err = Preamble::decode(&other).unwrap_err();
    assert!(err.to_string().contains("version mismatch"), "{err}");
    // An older peer's shorter preamble: its head alone tells the mismatch.
    let mut v3 = [0u8; 12];
    v3[0..4].copy_from_slice(b"RGPU");
    v3[4..8].copy_from_slice(&3u32.to_le_bytes());
    let err = Preamble::check_head(v3[..8].try_into().unwrap()).unwrap_err();
    assert!(err.to_string().contains("speaks version 3"), "{err}");
    let mut bad = ours;
    bad[0] = b'X';
    assert!(Preamble::decode(&bad).is_err());
    let mut unknown_flag = ours;
    unknown_flag[8] = 0x80;
    assert!(Preamble::decode(&unknown_flag).is_err());
}

/// The preamble's layout: magic, version, flags (TLS = 1, refused = 2) and the session a data
/// lane joins, all little-endian, then an empty line (golden.rs pins the bytes).
#[test]
fn preamble_layout() {
    let lane = Preamble::client(true, Some(0x0102030405060708)).encode();
    let mut expected = Vec::new();
    expected.extend_from_slice(b"RGPU");
    expected.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    expected.extend_from_slice(&[1, 0, 0, 0]);
    expected.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    expected.extend_from_slice(b"\r\n\r\n");
    assert_eq!(lane.to_vec(), expected);
    let refused = Preamble::server(Preamble::REFUSED).encode();
    assert_eq!(&refused[8..20], &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let decoded = Preamble::decode(&lane).unwrap();
    assert!(decoded.tls() && !decoded.refused());
    assert_eq!(decoded.lane_of, Some(0x0102030405060708));
}

#[test]
fn proofs_bind_token_and_nonces() {
    let (token, s, c) = (b"a-shared-secret-token".as_slice(), [1u8; 32], [2u8; 32]);
    let proof = auth::client_proof(token, &s, &c);
    assert!(auth::verify_client(token, &s, &c, &proof));
    assert!(!auth::verify_client(
        b"another-secret-token!",
        &s,
        &c,
        &proof
    ));
    assert!(
        !auth::verify_client(token, &c, &s, &proof),
        "nonces swapped"
    );
    let server = auth::server_proof(token, &s, &c);
    assert_ne!(server, proof, "the two directions differ");
    assert!(auth::verify_server(token, &s, &c, &server));
    assert!(!auth::verify_server(token, &s, &c, &proof));
}

const BOX: Extent = Extent {
    width: 100,
    height: 30,
    depth: 2,
};

#[test]
fn copy_shapes_measure_and_place_their_rows() {
    let pitch = Pitch {
        row: 128,
        slice_rows: 32,
    };
    assert_eq!(BOX.bytes(), Some(6000));
    assert!(BOX.fits(pitch));
    // The last row: slice 1, row 29.
    assert_eq!(BOX.span(pitch), Some((32 + 29) * 128 + 100));
    let offsets: Vec<u64> = BOX.row_offsets(pitch).collect();
    assert_eq!(offsets.len(), 60);
    assert_eq!(&offsets[..2], &[0, 128]);
    assert_eq!(offsets[30], 32 * 128);
    assert_eq!(BOX.span(BOX.packed()), BOX.bytes());
    assert!(BOX.is_contiguous(BOX.packed()));
    assert!(!BOX.is_contiguous(pitch));

    // Rows wider than their pitch, or slices taller than theirs, overlap.
    let narrow = Pitch {
        row: 99,
        slice_rows: 32,
    };
    let short = Pitch {
        row: 128,
        slice_rows: 29,
    };
    assert!(!BOX.fits(narrow) && !BOX.fits(short));
    // One row or one slice needs no pitch.
    assert!(Extent::linear(7).fits(Pitch {
        row: 0,
        slice_rows: 0
    }));
    assert_eq!(Extent::linear(0).span(BOX.packed()), Some(0));
    // Overflow is caught, not wrapped.
    let huge = Extent {
        width: 1 << 40,
        height: 1 << 30,
        depth: 1,
    };
    assert_eq!(huge.bytes(), None);
    assert!(!huge.fits(huge.packed()));
}

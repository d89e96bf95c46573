//! The CUDA side of a real server over a real socket. CI machines have no CUDA driver: there
//! the server must still start, report no CUDA devices, refuse CUDA work with
//! CUDA_ERROR_NOT_SUPPORTED and consume the bulk data of refused requests, so the session goes
//! on. Where a GPU is present (`cargo test -p rgpu-server --test cuda` on the GPU machine, or
//! the test binary carried there), memory round-trips through it: linear (striped over data
//! lanes), and as 3D boxes of pitched rows, narrow and wider than a staging buffer, host to
//! device, device to device and back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rgpu_client::{Connection, CudaClient, Handoff, ReadSink, SendPtr};
use rgpu_protocol::cuda::{CuRequest, Extent, Pitch};
use rgpu_protocol::ClientMsg;

const NOT_SUPPORTED: u32 = 801;

fn connect(server: &Running) -> std::sync::Arc<Connection> {
    let mut config = rgpu_client::ClientConfig::plain(Vec::new());
    config.reply_timeout = Duration::from_secs(60);
    Connection::connect(&server.endpoint, &config).expect("connects")
}

#[test]
fn cuda_requests_on_any_server() {
    let server = Running::start(None);
    let conn = connect(&server);
    let inventory = conn.cuda().get_inventory().unwrap();
    if inventory.devices.is_empty() {
        // No CUDA: refused, with the bulk of a posted write consumed, inline or striped over
        // data lanes (twice: the second finds the lanes where the first left them).
        let allocated = conn.cuda().mem_alloc(1, 64).unwrap();
        assert_eq!(allocated, Err(NOT_SUPPORTED));
        write(
            &conn,
            0x1000,
            Extent::linear(100_000),
            None,
            &[7u8; 100_000],
        );
        conn.ping()
            .expect("the session goes on after a refused write");
        assert_eq!(conn.open_lanes(3), 3);
        let data = vec![9u8; (5 << 20) + 5];
        for _ in 0..2 {
            write(
                &conn,
                0x1000,
                Extent::linear(data.len() as u64),
                None,
                &data,
            );
            conn.ping()
                .expect("the session goes on after a refused striped write");
        }
        return;
    }
    // A GPU: one context, 8 MiB written and read back.
    conn.cuda().create_context(1, 0, 0, true).unwrap();
    let size = 8 << 20;
    let ptr = conn
        .cuda()
        .mem_alloc(1, size)
        .unwrap()
        .expect("allocation succeeds");
    let data: Vec<u8> = (0..size as usize).map(|i| (i * 7 % 251) as u8).collect();
    // 8 MiB: striped over three data lanes.
    assert_eq!(conn.open_lanes(3), 3);
    let linear = Extent::linear(size);
    write(&conn, ptr, linear, None, &data);
    assert_eq!(read(&conn, ptr, linear, linear.packed()), data);

    // Boxes of pitched rows: narrow rows (several per staging buffer) and rows wider than one.
    let boxes = [
        (
            Extent {
                width: 1000,
                height: 30,
                depth: 3,
            },
            Pitch {
                row: 1024,
                slice_rows: 32,
            },
        ),
        (
            Extent {
                width: 1_500_000,
                height: 2,
                depth: 1,
            },
            Pitch {
                row: 2 << 20,
                slice_rows: 2,
            },
        ),
    ];
    let copy_at = ptr + (size / 2);
    for (extent, pitch) in boxes {
        let packed = &data[..extent.bytes().unwrap() as usize];
        write(&conn, ptr, extent, Some(pitch), packed);
        assert_eq!(read(&conn, ptr, extent, pitch), packed, "{extent:?}");
        // Device to device, from the pitched rows into packed ones.
        conn.cuda()
            .memcpy_dtod(1, 0, copy_at, extent.packed(), ptr, pitch, 0, extent)
            .unwrap();
        let whole = Extent::linear(extent.bytes().unwrap());
        assert_eq!(read(&conn, copy_at, whole, whole.packed()), packed);
    }
    assert_eq!(conn.cuda().mem_free(1, ptr).unwrap(), 0);
}

/// Posts a write of `data` (the rows of `extent`, packed; laid out by `pitch`, else packed) to
/// `dst` in context 1 (from 4 MiB on, striped over the connection's data lanes).
fn write(conn: &Connection, dst: u64, extent: Extent, pitch: Option<Pitch>, data: &[u8]) {
    let pitch = pitch.unwrap_or(extent.packed());
    conn.cuda()
        .memcpy_htod(1, 0, dst, extent, pitch, data)
        .unwrap();
}

/// Reads the rows of `extent` at `src` in context 1, packed.
fn read(conn: &Connection, src: u64, extent: Extent, pitch: Pitch) -> Vec<u8> {
    let mut bytes = vec![0u8; extent.bytes().unwrap() as usize];
    let done = Arc::new(Handoff::default());
    let signal = done.clone();
    let sink = ReadSink {
        dst: SendPtr(bytes.as_mut_ptr()),
        len: bytes.len(),
        done: Box::new(move |result| signal.fill(result)),
    };
    conn.cuda()
        .memcpy_dtoh(1, 0, src, extent, pitch, sink)
        .unwrap();
    let status = done.wait(Duration::from_secs(60)).expect("the read ends");
    assert_eq!(status.unwrap(), 0, "read of {extent:?}");
    bytes
}

#[test]
fn a_bad_cuda_request_ends_only_its_session() {
    let server = Running::start(None);
    let bad = connect(&server);
    // Bulk data with a request that takes none breaks the protocol.
    let stream = CuRequest::CreateStream {
        id: 1,
        ctx: 1,
        flags: 0,
        priority: 0,
    };
    let _ = bad.post(&ClientMsg::Cu(stream), &[1, 2, 3]);
    let _ = bad.flush();
    let good = connect(&server);
    good.ping().expect("another session is unaffected");
}

/// A data lane joins a session only with the key that session's welcome gave its client, and a
/// refused lane does not disturb the session.
#[test]
fn a_lane_needs_its_sessions_key() {
    use rgpu_protocol::LaneAttach;
    use rgpu_transport::{client_handshake, Stream};

    let server = Running::start(None);
    let conn = connect(&server);
    for (session, key) in [(conn.session_id(), [0u8; 32]), (999_999, [0u8; 32])] {
        let stream = Stream::connect(&server.endpoint, Duration::from_secs(5)).unwrap();
        let attach = LaneAttach {
            session,
            key,
            index: 0,
        };
        let plain = rgpu_transport::TlsConnector::new(&Default::default()).unwrap();
        let refused = client_handshake(
            stream,
            &plain,
            &server.endpoint,
            None,
            "intruder",
            Some(attach),
        );
        let why = refused.err().expect("a lane with a wrong key is refused");
        assert!(why.to_string().contains("not a data lane"), "{why}");
    }
    conn.ping().expect("the session is undisturbed");
    assert_eq!(conn.open_lanes(2), 2, "its own client's lanes still join");
}

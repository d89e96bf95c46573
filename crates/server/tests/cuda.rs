//! The CUDA side of a real server over a real socket. CI machines have no CUDA driver: there
//! the server must still start, report no CUDA devices, refuse CUDA work with
//! CUDA_ERROR_NOT_SUPPORTED and consume the bulk data of refused requests, so the session goes
//! on. Where a GPU is present, memory round-trips through it.

mod common;

use std::time::Duration;

use common::*;
use rgpu_client::Connection;
use rgpu_protocol::cuda::{CuReply, CuRequest};

const NOT_SUPPORTED: u32 = 801;

fn connect(server: &Running) -> std::sync::Arc<Connection> {
    Connection::connect(
        &server.endpoint,
        None,
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
    .expect("connects")
}

#[test]
fn cuda_requests_on_any_server() {
    let server = Running::start(None);
    let conn = connect(&server);
    let inventory = match conn.call_cu(CuRequest::GetInventory, &[]).unwrap() {
        CuReply::Inventory(inventory) => inventory,
        other => panic!("unexpected reply {other:?}"),
    };
    if inventory.devices.is_empty() {
        // No CUDA: refused, with the bulk of a posted write consumed.
        let reply = conn
            .call_cu(CuRequest::MemAlloc { ctx: 1, size: 64 }, &[])
            .unwrap();
        assert_eq!(reply, CuReply::Status(NOT_SUPPORTED));
        let write = CuRequest::MemcpyHtoD {
            ctx: 1,
            stream: 0,
            dst: 0x1000,
        };
        conn.post_cu(write, &[7u8; 100_000]).unwrap();
        conn.ping()
            .expect("the session goes on after a refused write");
        return;
    }
    // A GPU: one context, 8 MiB written and read back.
    conn.post_cu(
        CuRequest::CreateContext {
            id: 1,
            device: 0,
            flags: 0,
            primary: true,
        },
        &[],
    )
    .unwrap();
    let size = 8 << 20;
    let ptr = match conn
        .call_cu(CuRequest::MemAlloc { ctx: 1, size }, &[])
        .unwrap()
    {
        CuReply::Pointer { status: 0, ptr } => ptr,
        other => panic!("allocation failed: {other:?}"),
    };
    let data: Vec<u8> = (0..size as usize).map(|i| (i * 7 % 251) as u8).collect();
    let write = CuRequest::MemcpyHtoD {
        ctx: 1,
        stream: 0,
        dst: ptr,
    };
    conn.post_cu(write, &data).unwrap();
    let reply = conn
        .call_cu(CuRequest::Synchronize { ctx: 1 }, &[])
        .unwrap();
    assert_eq!(reply, CuReply::Status(0));
    let free = CuRequest::MemFree { ctx: 1, ptr };
    assert_eq!(conn.call_cu(free, &[]).unwrap(), CuReply::Status(0));
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
    let _ = bad.post_cu(stream, &[1, 2, 3]);
    let _ = bad.flush();
    let good = connect(&server);
    good.ping().expect("another session is unaffected");
}

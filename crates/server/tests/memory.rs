//! A session's memory comes back when its client dies mid-transfer. In its own test binary
//! (its own process), so that no other test moves the resident set size meanwhile.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Client, Running, CL_SUCCESS};
use rgpu_protocol::opencl::{ClRequest, Transfer};

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// One session's worth of work: a 128 MiB buffer, written in full, then a write of 64 MiB
/// that the client abandons halfway.
fn session_killed_mid_transfer(server: &Running, data: &[u8]) -> bool {
    const SIZE: usize = 128 << 20;
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    if client.setup().is_none() {
        return false;
    }
    assert_eq!(client.create_buffer(1, SIZE as u64, &[]), CL_SUCCESS);
    client.write(
        vec![],
        0,
        Transfer::Buffer {
            buffer: 1,
            offset: 0,
            size: SIZE as u64,
        },
        data,
    );
    assert_eq!(client.finish(), CL_SUCCESS);
    client.send_header(
        ClRequest::EnqueueWrite {
            queue: 1,
            wait: vec![],
            event: 0,
            transfer: Transfer::Buffer {
                buffer: 1,
                offset: 0,
                size: 64 << 20,
            },
        },
        64 << 20,
    );
    client.stream.write_all(&data[..32 << 20]).unwrap();
    client.stream.shutdown();
    true
}

#[test]
fn a_killed_client_leaves_no_memory_behind() {
    let server = Running::start(None);
    let data = vec![0x5au8; 128 << 20];
    // Warm up: the implementation's own one-time allocations.
    if !session_killed_mid_transfer(&server, &data) {
        return;
    }
    let settle = || {
        // The session cleans up on its own thread; give it a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = rss();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            let now = rss();
            if now.abs_diff(last) < (1 << 20) {
                return now;
            }
            last = now;
        }
        last
    };
    let baseline = settle();
    for _ in 0..3 {
        assert!(session_killed_mid_transfer(&server, &data));
    }
    let after = settle();
    eprintln!(
        "resident: {} MiB after warm-up, {} MiB after three killed sessions",
        baseline >> 20,
        after >> 20
    );
    assert!(
        after < baseline + (48 << 20),
        "memory grew from {} MiB to {} MiB",
        baseline >> 20,
        after >> 20
    );
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    client.ping();
}

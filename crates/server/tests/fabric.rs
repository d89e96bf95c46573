//! The server-to-server fabric over real sockets: two servers on this machine's OpenCL device,
//! a buffer of one pulled into a buffer of the other (striped over several links, the pull
//! asked for before the export is made), a process pulling a part of an export into host
//! memory over its own links, and tickets that serve their bytes once.

mod common;

use common::*;
use rgpu_protocol::opencl::{ClReply, ClRequest, Transfer};
use rgpu_protocol::PeerExport;
use rgpu_transport::peer::{Links, PullSink, Receive};
use rgpu_transport::{ClientSecurity, TlsConnector};

const SIZE: usize = 20 << 20;

#[test]
fn buffers_move_between_servers_over_striped_links() {
    let (a, b) = (Running::start(None), Running::start(None));
    let mut exporter = Client::connect(&a.endpoint, None).unwrap();
    let Some(_) = exporter.setup() else { return };
    let mut importer = Client::connect(&b.endpoint, None).unwrap();
    importer
        .setup()
        .expect("the same device on the second server");
    let data = pattern(SIZE, 3);
    assert_eq!(exporter.create_buffer(1, SIZE as u64, &data), CL_SUCCESS);
    assert_eq!(importer.create_buffer(1, SIZE as u64, &[]), CL_SUCCESS);
    let session = exporter.session_id;
    let export = |ticket| PeerExport {
        endpoint: a.endpoint.to_string(),
        session,
        ticket,
    };

    // The pull goes first: the exporting server waits for the export its link names.
    let ticket = [5u8; 32];
    let pull = importer.send(
        ClRequest::PullBuffer {
            queue: 1,
            buffer: 1,
            offset: 0,
            size: SIZE as u64,
            from: export(ticket),
        },
        &[],
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    exporter.send(
        ClRequest::ExportBuffer {
            queue: 1,
            buffer: 1,
            offset: 0,
            size: SIZE as u64,
            ticket,
        },
        &[],
    );
    assert_eq!(importer.reply(pull), ClReply::PullBuffer(Ok(())));
    let all = Transfer::Buffer {
        buffer: 1,
        offset: 0,
        size: SIZE as u64,
    };
    let (back, status) = importer.read(1, all, SIZE);
    assert_eq!(status, CL_SUCCESS);
    assert!(back == data, "the pulled buffer differs");

    // Part of a buffer, pulled into host memory by this process over links of its own.
    let ticket = [6u8; 32];
    let (offset, len) = (1 << 20, 9 << 20);
    exporter.send(
        ClRequest::ExportBuffer {
            queue: 1,
            buffer: 1,
            offset,
            size: len,
            ticket,
        },
        &[],
    );
    let tls = TlsConnector::new(&ClientSecurity::default()).unwrap();
    let links = Links::new(None, tls, "fabric-test");
    let host = HostSink(std::sync::Mutex::new(vec![0u8; len as usize]));
    links.pull(&export(ticket), len, &host).unwrap();
    let start = offset as usize;
    assert!(host.0.into_inner().unwrap() == data[start..start + len as usize]);
    // Used up: a second pull of the same ticket is refused (after the exporter's wait).
    let again = HostSink(std::sync::Mutex::new(vec![0u8; 16]));
    let refused = links.pull(&export(ticket), 16, &again);
    assert!(refused.is_err(), "a used ticket was served again");

    // One use, whatever became of the first attempt: a pull given up after its first MiB
    // leaves nothing for a second one (which once got every byte).
    let ticket = [7u8; 32];
    let len = 4u64 << 20;
    exporter.send(
        ClRequest::ExportBuffer {
            queue: 1,
            buffer: 1,
            offset: 0,
            size: len,
            ticket,
        },
        &[],
    );
    let quitter = GivesUpAfter(1 << 20);
    assert!(links.pull(&export(ticket), len, &quitter).is_err());
    let again = HostSink(std::sync::Mutex::new(vec![0u8; len as usize]));
    let refused = links.pull(&export(ticket), len, &again);
    assert!(
        refused.is_err(),
        "an abandoned pull's bytes were served again"
    );
}

/// A puller that takes the first bytes of a part and gives up.
struct GivesUpAfter(usize);

impl PullSink for GivesUpAfter {
    fn part(&self, _offset: u64, _len: u64, receive: Receive) -> Result<(), String> {
        receive(&mut vec![0u8; self.0])?;
        Err("given up".into())
    }
}

/// Host memory that parts of a pull fill (a lock per part is fine for a test).
struct HostSink(std::sync::Mutex<Vec<u8>>);

impl PullSink for HostSink {
    fn part(&self, offset: u64, len: u64, receive: Receive) -> Result<(), String> {
        let mut part = vec![0u8; len as usize];
        receive(&mut part)?;
        let mut all = self.0.lock().unwrap();
        all[offset as usize..(offset + len) as usize].copy_from_slice(&part);
        Ok(())
    }
}

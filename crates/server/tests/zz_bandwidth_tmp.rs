//! A real server on 127.0.0.1:0, driven by a raw client that speaks the wire protocol through
//! rgpu-transport. The OpenCL tests need a device (PoCL on CPU in CI); without one they say so
//! and return.

use std::io::Write;
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_protocol::opencl::{
    BufferRect, ClReply, ClRequest, Command, Id, InfoQuery, Inventory, KernelArg, ObjKind,
};
use rgpu_protocol::{ClientMsg, ServerMsg};
use rgpu_server::{Server, ServerConfig, ShutdownHandle};
use rgpu_transport::{client_handshake, Endpoint, FrameReader, FrameWriter, Stream, Token};

const CL_SUCCESS: i32 = 0;
const CL_INVALID_VALUE: i32 = -30;
const CL_INVALID_CONTEXT: i32 = -34;
const CL_INVALID_COMMAND_QUEUE: i32 = -36;
const CL_INVALID_MEM_OBJECT: i32 = -38;
const CL_INVALID_KERNEL: i32 = -48;
const CL_INVALID_EVENT: i32 = -58;
const CL_COMPLETE: i32 = 0;
const CL_MEM_READ_WRITE: u64 = 1;
const CL_EVENT_COMMAND_EXECUTION_STATUS: u32 = 0x11D3;
const CL_DEVICE_NAME: u32 = 0x102B;
const CL_CONTEXT_DEVICES: u32 = 0x1081;

struct Running {
    endpoint: Endpoint,
    shutdown: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Running {
    fn start(token: Option<Token>) -> Running {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = Server::bind(ServerConfig {
            listen: Endpoint::Tcp("127.0.0.1:0".into()),
            token,
            platform_filter: None,
            device_filter: None,
            opencl_library: None,
            name: "test-server".into(),
        })
        .expect("server binds");
        let endpoint = server.local_endpoint();
        let shutdown = server.shutdown_handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Running {
            endpoint,
            shutdown,
            thread,
        }
    }

    fn stop(mut self) -> Duration {
        let started = Instant::now();
        self.shutdown.shutdown();
        let thread = self.thread.take().unwrap();
        thread.join().unwrap().unwrap();
        started.elapsed()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.shutdown.shutdown();
            let _ = thread.join();
        }
    }
}

struct Client {
    reader: FrameReader<Stream>,
    writer: FrameWriter<Stream>,
    stream: Stream,
    seq: u64,
}

impl Client {
    fn connect(endpoint: &Endpoint, token: Option<&Token>) -> Result<Client, String> {
        let mut stream = Stream::connect(endpoint, Duration::from_secs(5)).unwrap();
        client_handshake(&mut stream, token, "server-test").map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Ok(Client {
            reader: FrameReader::new(stream.try_clone().unwrap()),
            writer: FrameWriter::new(stream.try_clone().unwrap()),
            stream,
            seq: 0,
        })
    }

    fn send(&mut self, request: ClRequest, bulk: &[u8]) -> u64 {
        self.seq += 1;
        self.writer
            .send(&ClientMsg::Cl(request), self.seq, bulk)
            .unwrap();
        self.seq
    }

    /// The next frame (skipping event notifications), with its bulk.
    fn next(&mut self) -> (u64, ServerMsg, Vec<u8>) {
        loop {
            let (header, msg) = self.reader.read_message::<ServerMsg>().unwrap();
            let mut bulk = vec![0u8; header.bulk_len as usize];
            self.reader.read_bulk(&mut bulk).unwrap();
            if !matches!(msg, ServerMsg::EventStatus { .. }) {
                return (header.seq, msg, bulk);
            }
        }
    }

    fn reply(&mut self, seq: u64) -> ClReply {
        let (got, msg, _) = self.next();
        assert_eq!(got, seq, "reply to the request sent");
        match msg {
            ServerMsg::Cl(reply) => reply,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn call(&mut self, request: ClRequest) -> ClReply {
        let seq = self.send(request, &[]);
        self.reply(seq)
    }

    fn status(&mut self, request: ClRequest) -> i32 {
        match self.call(request) {
            ClReply::Status(status) => status,
            other => panic!("expected a status, got {other:?}"),
        }
    }

    /// A read's data (placed at each chunk's offset) and final status.
    fn read(&mut self, queue: Id, command: Command, len: usize) -> (Vec<u8>, i32) {
        let seq = self.send(
            ClRequest::Enqueue {
                queue,
                wait: vec![],
                event: 0,
                command,
            },
            &[],
        );
        let mut data = vec![0u8; len];
        loop {
            let (got, msg, bulk) = self.next();
            assert_eq!(got, seq);
            match msg {
                ServerMsg::Data { offset } => {
                    let at = offset as usize;
                    data[at..at + bulk.len()].copy_from_slice(&bulk);
                }
                ServerMsg::Cl(ClReply::Status(status)) => return (data, status),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn ping(&mut self) {
        self.seq += 1;
        self.writer.send(&ClientMsg::Ping, self.seq, &[]).unwrap();
        let (seq, msg, _) = self.next();
        assert_eq!((seq, msg), (self.seq, ServerMsg::Pong));
    }

    fn inventory(&mut self) -> Inventory {
        match self.call(ClRequest::GetInventory) {
            ClReply::Inventory(inventory) => inventory,
            other => panic!("expected the inventory, got {other:?}"),
        }
    }

    /// Context 1 and queue 1 on the first device; `None` without a device.
    fn setup(&mut self) -> Option<Id> {
        let inventory = self.inventory();
        let Some(device) = inventory.devices.first() else {
            eprintln!("no OpenCL device on this machine; skipping");
            return None;
        };
        let device = device.id;
        let status = self.status(ClRequest::CreateContext {
            id: 1,
            devices: vec![device],
            properties: vec![0],
        });
        assert_eq!(status, CL_SUCCESS);
        let status = self.status(ClRequest::CreateQueue {
            id: 1,
            context: 1,
            device,
            properties: vec![0],
        });
        assert_eq!(status, CL_SUCCESS);
        Some(device)
    }

    fn create_buffer(&mut self, id: Id, size: u64, contents: &[u8]) -> i32 {
        let seq = self.send(
            ClRequest::CreateBuffer {
                id,
                context: 1,
                flags: CL_MEM_READ_WRITE,
                size,
                properties: vec![],
            },
            contents,
        );
        match self.reply(seq) {
            ClReply::Status(status) => status,
            other => panic!("{other:?}"),
        }
    }

    fn enqueue(&mut self, wait: Vec<Id>, event: Id, command: Command, bulk: &[u8]) {
        self.send(
            ClRequest::Enqueue {
                queue: 1,
                wait,
                event,
                command,
            },
            bulk,
        );
    }

    fn finish(&mut self) -> i32 {
        self.status(ClRequest::Finish { queue: 1 })
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}


#[test]
fn bandwidth() {
    let server = Running::start(None);
    let mut client = Client::connect(&server.endpoint, None).unwrap();
    client.setup().unwrap();
    const SIZE: usize = 64 << 20;
    let data = pattern(SIZE, 1);
    assert_eq!(client.create_buffer(1, SIZE as u64, &[]), CL_SUCCESS);
    for round in 0..3 {
        let t = Instant::now();
        for _ in 0..8 {
            client.enqueue(vec![], 0, Command::WriteBuffer { buffer: 1, offset: 0, size: SIZE as u64 }, &data);
        }
        assert_eq!(client.finish(), CL_SUCCESS);
        let w = 8.0 * SIZE as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        for _ in 0..8 {
            let (_, s) = client.read(1, Command::ReadBuffer { buffer: 1, offset: 0, size: SIZE as u64 }, SIZE);
            assert_eq!(s, 0);
        }
        let r = 8.0 * SIZE as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        for _ in 0..1000 { client.ping(); }
        let ping = t.elapsed().as_secs_f64() / 1000.0 * 1e6;
        let t = Instant::now();
        for _ in 0..1000 { assert_eq!(client.finish(), 0); }
        let fin = t.elapsed().as_secs_f64() / 1000.0 * 1e6;
        eprintln!("round {round}: write {w:.2} GB/s, read {r:.2} GB/s, ping {ping:.1} us, finish {fin:.1} us");
    }
    // raw loopback for reference
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    let th = std::thread::spawn(move || { let (mut s, _) = l.accept().unwrap(); let mut b = vec![0u8; 1<<20]; let mut n = 0usize; while n < 8*SIZE { use std::io::Read; n += s.read(&mut b).unwrap(); } });
    let mut s = TcpStream::connect(a).unwrap();
    let t = Instant::now();
    for _ in 0..8 { s.write_all(&data).unwrap(); }
    th.join().unwrap();
    eprintln!("raw loopback {:.2} GB/s", 8.0 * SIZE as f64 / t.elapsed().as_secs_f64() / 1e9);
}

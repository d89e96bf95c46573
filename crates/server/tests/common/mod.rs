//! Test helpers: a real server on 127.0.0.1:0 and a raw client that speaks the wire protocol
//! through rgpu-transport.
#![allow(dead_code)]

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rgpu_protocol::opencl::{ClReply, ClRequest, Command, Id, Inventory, Transfer};
use rgpu_protocol::session::{SessionReply, SessionRequest};
use rgpu_protocol::{ClientMsg, ServerMsg};
use rgpu_server::{Server, ServerConfig, ShutdownHandle};
use rgpu_transport::{
    client_handshake, ClientSecurity, Endpoint, FrameReader, FrameWriter, Stream, TlsConnector,
    Token,
};

pub const CL_SUCCESS: i32 = 0;
pub const CL_INVALID_VALUE: i32 = -30;
pub const CL_INVALID_CONTEXT: i32 = -34;
pub const CL_INVALID_COMMAND_QUEUE: i32 = -36;
pub const CL_INVALID_MEM_OBJECT: i32 = -38;
pub const CL_INVALID_KERNEL: i32 = -48;
pub const CL_INVALID_EVENT: i32 = -58;
pub const CL_COMPLETE: i32 = 0;
pub const CL_MEM_READ_WRITE: u64 = 1;
pub const CL_EVENT_COMMAND_EXECUTION_STATUS: u32 = 0x11D3;
pub const CL_DEVICE_NAME: u32 = 0x102B;
pub const CL_CONTEXT_DEVICES: u32 = 0x1081;

pub struct Running {
    pub endpoint: Endpoint,
    pub shutdown: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Running {
    pub fn start(token: Option<Token>) -> Running {
        Self::start_on(Endpoint::Tcp("127.0.0.1:0".into()), token)
    }

    pub fn start_on(listen: Endpoint, token: Option<Token>) -> Running {
        Self::start_with(
            rgpu_server::SessionSettings {
                token,
                ..Default::default()
            },
            listen,
        )
    }

    /// A server with these session settings (CUDA on, its name "test-server").
    pub fn start_with(sessions: rgpu_server::SessionSettings, listen: Endpoint) -> Running {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = Server::bind(ServerConfig {
            listen,
            sessions: rgpu_server::SessionSettings {
                cuda: true,
                name: "test-server".into(),
                ..sessions
            },
            // Sessions on threads: a library test has no rgpu executable to start workers.
            workers: None,
            metrics: None,
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

    pub fn stop(mut self) -> Duration {
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

pub struct Client {
    pub reader: FrameReader<Stream>,
    pub writer: FrameWriter<Stream>,
    pub stream: Stream,
    pub seq: u64,
    /// The session the server's welcome named.
    pub session_id: u64,
}

impl Client {
    pub fn connect(endpoint: &Endpoint, token: Option<&Token>) -> Result<Client, String> {
        let plain = TlsConnector::new(&ClientSecurity::default()).unwrap();
        Self::connect_with(endpoint, token, &plain)
    }

    /// Connects with these TLS settings.
    pub fn connect_with(
        endpoint: &Endpoint,
        token: Option<&Token>,
        tls: &TlsConnector,
    ) -> Result<Client, String> {
        let stream = Stream::connect(endpoint, Duration::from_secs(5)).unwrap();
        let (stream, welcome) = client_handshake(stream, tls, endpoint, token, "server-test", None)
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Ok(Client {
            reader: FrameReader::new(stream.try_clone().unwrap()),
            writer: FrameWriter::new(stream.try_clone().unwrap()),
            stream,
            seq: 0,
            session_id: welcome.session_id,
        })
    }

    pub fn send(&mut self, request: ClRequest, bulk: &[u8]) -> u64 {
        self.seq += 1;
        self.writer
            .send(&ClientMsg::Cl(request), self.seq, bulk)
            .unwrap();
        self.seq
    }

    /// Sends a request's frame announcing `bulk_len` bytes of bulk, without the bulk (the
    /// caller sends it, or part of it, on `stream`).
    pub fn send_header(&mut self, request: ClRequest, bulk_len: u64) -> u64 {
        self.seq += 1;
        self.writer
            .queue_header(&ClientMsg::Cl(request), self.seq, bulk_len)
            .unwrap();
        self.writer.flush().unwrap();
        self.seq
    }

    /// The next frame (skipping event notifications), with its bulk.
    pub fn next(&mut self) -> (u64, ServerMsg, Vec<u8>) {
        loop {
            let (header, msg) = self.reader.read_message::<ServerMsg>().unwrap();
            let mut bulk = vec![0u8; header.bulk_len as usize];
            self.reader.read_bulk(&mut bulk).unwrap();
            // Notices that answer no request: event statuses (one, or the final ones before a
            // wait's reply), and the sign of life a session
            // busy for over a second sends every second (a slow build on a loaded machine), and
            // its request for one from a client silent for a while.
            if !matches!(
                msg,
                ServerMsg::EventStatus { .. }
                    | ServerMsg::EventsFinal { .. }
                    | ServerMsg::Working
                    | ServerMsg::Heartbeat
            ) {
                return (header.seq, msg, bulk);
            }
        }
    }

    pub fn reply(&mut self, seq: u64) -> ClReply {
        let (got, msg, _) = self.next();
        assert_eq!(got, seq, "reply to the request sent");
        match msg {
            ServerMsg::Cl(reply) => reply,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    pub fn call(&mut self, request: ClRequest) -> ClReply {
        let seq = self.send(request, &[]);
        self.reply(seq)
    }

    pub fn status(&mut self, request: ClRequest) -> i32 {
        status_of(self.call(request))
    }

    /// A read's data (placed at each chunk's offset) and final status.
    pub fn read(&mut self, queue: Id, transfer: Transfer, len: usize) -> (Vec<u8>, i32) {
        let seq = self.send(
            ClRequest::EnqueueRead {
                queue,
                wait: vec![],
                event: 0,
                transfer,
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
                ServerMsg::ReadDone { status } => return (data, status),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    pub fn ping(&mut self) {
        self.seq += 1;
        let ping = ClientMsg::Session(SessionRequest::Ping {});
        self.writer.send(&ping, self.seq, &[]).unwrap();
        let (seq, msg, _) = self.next();
        let pong = ServerMsg::Session(SessionReply::Ping(()));
        assert_eq!((seq, msg), (self.seq, pong));
    }

    pub fn inventory(&mut self) -> Inventory {
        match self.call(ClRequest::GetInventory {}) {
            ClReply::GetInventory(inventory) => inventory,
            other => panic!("expected the inventory, got {other:?}"),
        }
    }

    /// Context 1 and queue 1 on the first device; `None` without a device.
    pub fn setup(&mut self) -> Option<Id> {
        let inventory = self.inventory();
        let Some(device) = inventory.devices.first() else {
            no_device("no OpenCL device on this machine");
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

    pub fn create_buffer(&mut self, id: Id, size: u64, contents: &[u8]) -> i32 {
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
        status_of(self.reply(seq))
    }

    pub fn enqueue(&mut self, wait: Vec<Id>, event: Id, command: Command, bulk: &[u8]) {
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

    pub fn write(&mut self, wait: Vec<Id>, event: Id, transfer: Transfer, bulk: &[u8]) {
        self.send(
            ClRequest::EnqueueWrite {
                queue: 1,
                wait,
                event,
                transfer,
            },
            bulk,
        );
    }

    /// Writes `data` to `buffer` (event 7), then reads it all back.
    pub fn write_then_read_back(&mut self, buffer: Id, data: &[u8]) -> (Vec<u8>, i32) {
        let size = data.len() as u64;
        let all = Transfer::Buffer {
            buffer,
            offset: 0,
            size,
        };
        self.write(vec![], 7, all.clone(), data);
        self.read(1, all, data.len())
    }

    pub fn finish(&mut self) -> i32 {
        self.status(ClRequest::Finish { queue: 1 })
    }
}

/// The status of a reply that is only a status (`Answer<()>`).
pub fn status_of(reply: ClReply) -> i32 {
    use ClReply::*;
    match reply {
        CreateContext(answer)
        | CreateQueue(answer)
        | CreateBuffer(answer)
        | CreateSubBuffer(answer)
        | CreateImage(answer)
        | CreateSampler(answer)
        | CreateProgramWithSource(answer)
        | CreateProgramWithIl(answer)
        | CreateProgramWithBuiltInKernels(answer)
        | BuildProgram(answer)
        | CompileProgram(answer)
        | LinkProgram(answer)
        | WaitForEvents(answer)
        | Finish(answer) => answer.err().unwrap_or(CL_SUCCESS),
        other => panic!("expected a status, got {other:?}"),
    }
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
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

/// A test that needs an OpenCL device and found none: skipped, unless `RGPU_REQUIRE_DEVICE=1`
/// (scripts/test.sh, which installs PoCL), where that is a failure.
pub fn no_device(why: &str) {
    if std::env::var_os("RGPU_REQUIRE_DEVICE").is_some_and(|v| v == "1") {
        panic!("{why} (RGPU_REQUIRE_DEVICE=1)");
    }
    eprintln!("{why}; skipping");
}

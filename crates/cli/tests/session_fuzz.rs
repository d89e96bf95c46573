//! Session fuzzer: a real `rgpu server` (a worker process per session; PoCL on the CPU in CI)
//! gets sessions that send random well-formed requests — random bytes that decode as a
//! `ClientMsg`, so every kind of request with arbitrary ids, sizes, offsets, options and
//! descriptors, some with bulk bytes — while a healthy session beside them keeps checking its
//! answers and new sessions keep being admitted. Time-bounded (RGPU_FUZZ_SECONDS, default 20;
//! RGPU_FUZZ_SEED repeats a run).
//!
//! Holds: the listener never dies, the healthy session never sees a wrong or missing answer,
//! every fuzzing session ends or answers. A fuzzing session whose worker dies is reported (its
//! request is a validation gap worth closing) but contained by design.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rgpu_protocol::opencl::{ClReply, ClRequest};
use rgpu_protocol::{decode_body, ClientMsg, ServerMsg};
use rgpu_transport::{client_handshake, Endpoint, FrameReader, FrameWriter, Stream};

/// A small, seedable generator (xorshift64*): the fuzzer needs speed and repeatability, not
/// statistical quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A random message that decodes: mostly OpenCL requests with small ids (so they name objects
/// that exist), sometimes anything at all.
fn random_message(rng: &mut Rng) -> ClientMsg {
    loop {
        let len = 2 + rng.below(96) as usize;
        let mut bytes = rng.bytes(len);
        // ClientMsg::Cl is variant 2 in postcard's encoding of the enum; small ids follow.
        if rng.below(4) != 0 {
            bytes[0] = 2;
            for b in bytes.iter_mut().skip(2).take(6) {
                *b %= 8;
            }
        }
        match decode_body::<ClientMsg>(&bytes) {
            Ok(ClientMsg::Authenticate { .. }) | Err(_) => continue,
            Ok(msg) => return msg,
        }
    }
}

struct Server {
    child: Child,
    endpoint: Endpoint,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rgpu"))
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--session-memory",
                "1G",
                "--max-sessions-per-client",
                "0",
            ])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("rgpu server starts");
        let log = Arc::new(Mutex::new(String::new()));
        let (found, endpoint) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap());
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                if let Some(at) = line.strip_prefix("rgpu server listening on ") {
                    let _ = found.send(at.to_string());
                }
                let mut log = kept.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let endpoint = endpoint
            .recv_timeout(Duration::from_secs(60))
            .expect("the server reports where it listens");
        Server {
            child,
            endpoint: Endpoint::parse(&endpoint).unwrap(),
            log,
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(endpoint: &Endpoint) -> Result<(FrameReader<Stream>, FrameWriter<Stream>), String> {
    let stream = Stream::connect(endpoint, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let plain = rgpu_transport::TlsConnector::new(&Default::default())?;
    let (stream, _) = client_handshake(stream, &plain, endpoint, None, "session-fuzz", None)
        .map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    Ok((
        FrameReader::new(stream.try_clone().map_err(|e| e.to_string())?),
        FrameWriter::new(stream),
    ))
}

/// One fuzzing session: random requests, then whatever comes back until the session goes
/// quiet. Returns how many requests it sent.
fn fuzz_session(endpoint: &Endpoint, rng: &mut Rng) -> u64 {
    let Ok((mut reader, mut writer)) = connect(endpoint) else {
        return 0;
    };
    let count = 1 + rng.below(60);
    let mut sent = 0;
    for seq in 1..=count {
        let msg = random_message(rng);
        let bulk = if rng.below(8) == 0 {
            let len = rng.below(4096) as usize;
            rng.bytes(len)
        } else {
            Vec::new()
        };
        if writer.send(&msg, seq, &bulk).is_err() {
            break;
        }
        sent += 1;
    }
    // Drain replies until the server closes the session or stays quiet for a moment.
    let _ = reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)));
    while let Ok((header, _)) = reader.read_frame() {
        let mut bulk = vec![0u8; header.bulk_len.min(64 << 20) as usize];
        if reader.read_bulk(&mut bulk).is_err() {
            break;
        }
    }
    sent
}

/// The healthy session: asks for the inventory and pings, over and over, checking each answer.
fn healthy_session(endpoint: &Endpoint, until: Instant, failures: &AtomicU64) -> u64 {
    let (mut reader, mut writer) = connect(endpoint).expect("the healthy session connects");
    let mut rounds = 0;
    let mut seq = 0;
    while Instant::now() < until {
        seq += 1;
        writer
            .send(&ClientMsg::Cl(ClRequest::GetInventory {}), seq, &[])
            .expect("the healthy session can send");
        match reader.read_message::<ServerMsg>() {
            Ok((header, ServerMsg::Cl(ClReply::GetInventory(inventory))))
                if header.seq == seq && !inventory.devices.is_empty() => {}
            other => {
                eprintln!("healthy session: unexpected answer {other:?}");
                failures.fetch_add(1, Ordering::Relaxed);
                return rounds;
            }
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    rounds
}

#[test]
fn random_sessions_never_reach_the_listener_or_another_session() {
    let seconds: u64 = std::env::var("RGPU_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("RGPU_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("session fuzzer: {seconds} s, RGPU_FUZZ_SEED={seed}");
    let mut server = Server::start();
    {
        // Without an OpenCL device there is nothing to fuzz below the protocol.
        let (mut reader, mut writer) = connect(&server.endpoint).unwrap();
        writer
            .send(&ClientMsg::Cl(ClRequest::GetInventory {}), 1, &[])
            .unwrap();
        match reader.read_message::<ServerMsg>() {
            Ok((_, ServerMsg::Cl(ClReply::GetInventory(inventory))))
                if !inventory.devices.is_empty() => {}
            other => {
                // scripts/test.sh installs PoCL: there, no device is a failure.
                let why = format!("no OpenCL device ({other:?})");
                if std::env::var_os("RGPU_REQUIRE_DEVICE").is_some_and(|v| v == "1") {
                    panic!("{why} (RGPU_REQUIRE_DEVICE=1)");
                }
                eprintln!("{why}; skipping");
                return;
            }
        }
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    let failures = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let sessions = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let healthy = {
        let (endpoint, failures) = (server.endpoint.clone(), failures.clone());
        std::thread::spawn(move || healthy_session(&endpoint, until, &failures))
    };
    let fuzzers: Vec<_> = (0..2)
        .map(|n| {
            let endpoint = server.endpoint.clone();
            let (requests, sessions, stop) = (requests.clone(), sessions.clone(), stop.clone());
            let mut rng = Rng(seed.wrapping_add(n * 0x9E37_79B9_7F4A_7C15) | 1);
            std::thread::spawn(move || {
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    requests.fetch_add(fuzz_session(&endpoint, &mut rng), Ordering::Relaxed);
                    sessions.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // New sessions keep being admitted while the fuzzers run.
    let mut admitted = 0;
    while Instant::now() < until {
        assert!(
            server.alive(),
            "the listener died:\n{}",
            server.log.lock().unwrap()
        );
        if connect(&server.endpoint).is_ok() {
            admitted += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    for fuzzer in fuzzers {
        fuzzer.join().expect("a fuzzing thread");
    }
    let rounds = healthy.join().expect("the healthy session's thread");
    let log = server.log.lock().unwrap().clone();
    let crashed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ended abnormally"))
        .collect();
    eprintln!(
        "session fuzzer: {} sessions, {} requests; healthy session {rounds} rounds; {admitted} \
         sessions admitted alongside; {} fuzzing sessions ended abnormally (contained)",
        sessions.load(Ordering::Relaxed),
        requests.load(Ordering::Relaxed),
        crashed.len()
    );
    for line in &crashed {
        eprintln!("  {line}");
    }
    assert!(server.alive(), "the listener died:\n{log}");
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "the healthy session was disturbed"
    );
    assert!(rounds > 0 && admitted > 0);
    let _ = std::io::stderr().flush();
}

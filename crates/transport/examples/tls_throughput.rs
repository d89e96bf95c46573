//! TCP connections over loopback, in the clear and in TLS. First one connection: how fast one
//! thread sends 1 GiB in 1 MiB writes to one thread reading it (what the record layer costs per
//! core). Then a 64 MiB buffer striped in 1 MiB pieces over 1, 2, 4 and 8 connections into
//! another 64 MiB buffer, as data lanes move a large copy (memory not in cache: what the record
//! layer costs against memory bandwidth).
//!   cargo run --release -p rgpu-transport --example tls_throughput [-- striped]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use rgpu_transport::{
    accept_preamble, client_handshake, server_handshake, ClientSecurity, Endpoint, Plaintext,
    ServerSecurity, Stream, TlsConnector, TlsIdentity, TlsMode,
};

const TOTAL: usize = 1 << 30;
const WRITE: usize = 1 << 20;

/// One core sealing and opening 16 KiB records in place, per AEAD: the ceiling per thread.
fn aead_speeds() {
    use aws_lc_rs::aead::{
        Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
    };
    for (name, algorithm) in [
        ("AES-128-GCM", &AES_128_GCM),
        ("AES-256-GCM", &AES_256_GCM),
        ("ChaCha20-Poly1305", &CHACHA20_POLY1305),
    ] {
        let key =
            LessSafeKey::new(UnboundKey::new(algorithm, &vec![7u8; algorithm.key_len()]).unwrap());
        let mut record = vec![1u8; 16 << 10];
        let rounds = (256 << 20) / record.len();
        let started = Instant::now();
        let mut tags = Vec::with_capacity(rounds);
        for i in 0..rounds {
            let nonce = Nonce::assume_unique_for_key([i as u8; 12]);
            tags.push(
                key.seal_in_place_separate_tag(nonce, Aad::empty(), &mut record)
                    .unwrap(),
            );
        }
        let seal = (256u64 << 20) as f64 / started.elapsed().as_secs_f64() / 1e9;
        println!("{name}: seal {seal:.2} GB/s per core");
    }
}

/// A connected pair over loopback TCP, in TLS or not: (client end, server end).
fn connected(identity: &TlsIdentity, tls: bool) -> (Stream, Stream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = Endpoint::parse(&listener.local_addr().unwrap().to_string()).unwrap();
    let security = ServerSecurity {
        tls: Some(identity.server_config().unwrap()),
        plaintext: Plaintext::Local,
    };
    let server = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        let mut stream = Stream::Tcp(socket);
        let route = accept_preamble(&mut stream, &security, None).unwrap();
        server_handshake(stream, &route, &security, None, "s", 1, [0; 32], |_, _| {
            Ok(())
        })
        .unwrap()
        .0
    });
    let connector = TlsConnector::new(&ClientSecurity {
        mode: if tls { TlsMode::On } else { TlsMode::Off },
        pins: vec![identity.fingerprint().unwrap()],
        ca_file: None,
    })
    .unwrap();
    let socket = Stream::connect(&endpoint, Duration::from_secs(5)).unwrap();
    let (client, _) = client_handshake(socket, &connector, &endpoint, None, "c", None).unwrap();
    (client, server.join().unwrap())
}

/// Moves `source` into `destination` striped in 1 MiB pieces over `lanes` connection pairs (a
/// writing and a reading thread each), `rounds` times; the median rate in GB/s.
fn striped(identity: &TlsIdentity, tls: bool, lanes: usize, rounds: usize) -> f64 {
    const SIZE: usize = 64 << 20;
    let source: Vec<u8> = (0..SIZE).map(|i| i as u8).collect();
    let mut destination = vec![0u8; SIZE];
    let pairs: Vec<(Stream, Stream)> = (0..lanes).map(|_| connected(identity, tls)).collect();
    let mut rates = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        std::thread::scope(|scope| {
            let pieces: Vec<(usize, &mut [u8])> =
                destination.chunks_mut(WRITE).enumerate().collect();
            let mut per_lane: Vec<Vec<&mut [u8]>> = (0..lanes).map(|_| Vec::new()).collect();
            for (i, piece) in pieces {
                per_lane[i % lanes].push(piece);
            }
            for (lane, ((client, server), mine)) in pairs.iter().zip(per_lane).enumerate() {
                let mut writer = client.try_clone().unwrap();
                let mut reader = server.try_clone().unwrap();
                let source = &source;
                scope.spawn(move || {
                    for piece in source.chunks(WRITE).skip(lane).step_by(lanes) {
                        writer.write_all(piece).unwrap();
                    }
                });
                scope.spawn(move || {
                    for piece in mine {
                        reader.read_exact(piece).unwrap();
                    }
                });
            }
        });
        rates.push(SIZE as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    assert!(source == destination, "the striped copy arrived intact");
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "striped") {
        let identity = TlsIdentity::generate(&["localhost".into()]).unwrap();
        for lanes in [1, 2, 4, 8] {
            let plain = striped(&identity, false, lanes, 9);
            let tls = striped(&identity, true, lanes, 9);
            println!(
                "64 MiB over {lanes} lanes: plaintext {plain:.2} GB/s, TLS {tls:.2} GB/s ({:.2})",
                tls / plain
            );
        }
        return;
    }
    let started = Instant::now();
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).unwrap();
    // aws-lc seeds its random generator on first use, once per process.
    println!(
        "first random bytes (aws-lc seeding its generator): {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    aead_speeds();
    let identity = TlsIdentity::generate(&["localhost".into()]).unwrap();
    for tls in [false, true] {
        let handshake_started = Instant::now();
        let (mut client, mut server) = connected(&identity, tls);
        let handshake = handshake_started.elapsed();
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; WRITE];
            let mut got = 0;
            while got < TOTAL {
                let n = server.read(&mut buf).unwrap();
                assert!(n > 0);
                got += n;
            }
        });
        let data = vec![7u8; WRITE];
        let started = Instant::now();
        for _ in 0..TOTAL / WRITE {
            client.write_all(&data).unwrap();
        }
        reader.join().unwrap();
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{}: connect and handshake {:.2} ms, then {:.2} GB/s",
            if tls { "TLS" } else { "plaintext" },
            handshake.as_secs_f64() * 1e3,
            TOTAL as f64 / seconds / 1e9
        );
    }
}

//! `rgpu bench link`: the link emulator (`RGPU_LINK`, crates/transport/src/link.rs) measured
//! against what it was asked for. For each emulated link: the median round trip of a 64-byte
//! ping-pong and the rate of a one-way bulk transfer, through the emulator over loopback TCP,
//! next to the requested figures (a requested RTT adds to the loopback round trip measured in
//! the same run; a requested rate is the most the link can carry). A benchmark, not a test:
//! it reports the errors, it does not judge them.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rgpu_transport::link::{emulate, LinkSpec};
use rgpu_transport::Stream;
use serde::Serialize;

use crate::median;

const PING_SIZE: usize = 64;

#[derive(clap::Args, Debug)]
#[command(about = "The link emulator (RGPU_LINK) against the figures it was asked for")]
pub struct LinkBenchArgs {
    /// Links to emulate, `;`-separated, each as RGPU_LINK takes it
    #[arg(
        long,
        default_value = "rtt=10us;rtt=50us;rtt=500us;rtt=5ms;rtt=50ms;bandwidth=100Mbit;bandwidth=1Gbit;bandwidth=10Gbit;bandwidth=40Gbit;rtt=50us,bandwidth=10Gbit"
    )]
    links: String,
    /// Round trips per ping-pong measurement.
    #[arg(long, default_value_t = 200)]
    pings: usize,
    /// Seconds each bulk transfer should take at the requested rate (its size follows).
    #[arg(long, default_value_t = 0.5)]
    bulk_seconds: f64,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-link.json")]
    json: std::path::PathBuf,
    /// Where to draw measured against requested figures as SVG (link-accuracy.svg).
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct LinkResult {
    link: String,
    requested_rtt_us: f64,
    loopback_rtt_us: f64,
    measured_rtt_us: f64,
    rtt_error_pct: Option<f64>,
    requested_gbps: Option<f64>,
    bulk_bytes: u64,
    measured_gbps: f64,
    rate_error_pct: Option<f64>,
}

pub fn run(args: LinkBenchArgs) -> Result<std::process::ExitCode, String> {
    let loopback = ping_pong(None, args.pings).map_err(|e| format!("loopback: {e}"))?;
    let loopback_rtt = median(&loopback);
    let mut results = Vec::new();
    let mut table = format!(
        "loopback TCP round trip (64 B): {loopback_rtt:.1} us (median of {})\n\
         {:<28} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}\n",
        args.pings, "link", "RTT want", "RTT got", "error", "Gbit/s want", "Gbit/s got", "error"
    );
    for text in args
        .links
        .split(';')
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let spec: LinkSpec = text.parse().map_err(|e| format!("{text}: {e}"))?;
        let rtt = median(&ping_pong(Some(spec), args.pings).map_err(|e| format!("{text}: {e}"))?);
        let requested_rtt = spec.rtt.as_secs_f64() * 1e6;
        let want_rtt = requested_rtt + loopback_rtt;
        let rtt_error = (requested_rtt > 0.0).then(|| (rtt - want_rtt) / want_rtt * 100.0);
        let rate = spec.bits_per_second.unwrap_or(10e9);
        let bytes = ((rate / 8.0 * args.bulk_seconds) as u64).clamp(1 << 20, 4 << 30);
        let gbps = bulk(spec, bytes).map_err(|e| format!("{text}: {e}"))?;
        let want_gbps = spec.bits_per_second.map(|b| b / 1e9);
        let rate_error = want_gbps.map(|want| (gbps - want) / want * 100.0);
        let pct = |e: Option<f64>| e.map_or("-".to_string(), |e| format!("{e:+.1}%"));
        table += &format!(
            "{text:<28} {:>10.1} {rtt:>10.1} {:>8} {:>10} {gbps:>10.3} {:>8}\n",
            want_rtt,
            pct(rtt_error),
            want_gbps.map_or("-".to_string(), |g| format!("{g:.3}")),
            pct(rate_error),
        );
        results.push(LinkResult {
            link: text.to_string(),
            requested_rtt_us: requested_rtt,
            loopback_rtt_us: loopback_rtt,
            measured_rtt_us: rtt,
            rtt_error_pct: rtt_error,
            requested_gbps: want_gbps,
            bulk_bytes: bytes,
            measured_gbps: gbps,
            rate_error_pct: rate_error,
        });
    }
    crate::output::write_stdout(&table)?;
    let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::write(&args.json, json).map_err(|e| format!("{}: {e}", args.json.display()))?;
    if let Some(dir) = &args.plot {
        crate::output::write_plots(dir, &[("link-accuracy.svg", plot(&results))])?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Measured over requested round trip and rate per link (1 is exact).
fn plot(results: &[LinkResult]) -> String {
    use crate::output::{bar_chart, Bar};
    let groups: Vec<(&str, Vec<Bar>)> = results
        .iter()
        .map(|r| {
            let mut bars = Vec::new();
            if let Some(e) = r.rtt_error_pct {
                bars.push(Bar {
                    label: "round trip",
                    color: "#1f77b4",
                    value: 1.0 + e / 100.0,
                });
            }
            if let Some(e) = r.rate_error_pct {
                bars.push(Bar {
                    label: "rate",
                    color: "#d62728",
                    value: 1.0 + e / 100.0,
                });
            }
            (r.link.as_str(), bars)
        })
        .collect();
    bar_chart("Link emulator: measured / requested", "1 = exact", &groups)
}

/// A connected pair over loopback: the client side behind `spec` (if any), the server side
/// plain, as a server sees an emulated client.
fn pair(spec: Option<LinkSpec>) -> io::Result<(Stream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    client.set_nodelay(true)?;
    let (server, _) = listener.accept()?;
    server.set_nodelay(true)?;
    let client = match spec {
        Some(spec) => emulate(Stream::Tcp(client), spec)?,
        None => Stream::Tcp(client),
    };
    Ok((client, server))
}

/// Round trips of a 64-byte message, µs each (after a few unmeasured ones).
fn ping_pong(spec: Option<LinkSpec>, pings: usize) -> io::Result<Vec<f64>> {
    let (mut client, mut server) = pair(spec)?;
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut buf = [0u8; PING_SIZE];
        loop {
            if server.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            server.write_all(&buf)?;
        }
    });
    let mut buf = [7u8; PING_SIZE];
    let mut times = Vec::with_capacity(pings);
    for i in 0..pings + 10 {
        let start = Instant::now();
        client.write_all(&buf)?;
        client.read_exact(&mut buf)?;
        if i >= 10 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    client.shutdown();
    let _ = echo.join();
    Ok(times)
}

/// Gbit/s of `bytes` sent one way through the link: from the first write until the receiver
/// has them all (it answers one byte, which crosses back; that half round trip is taken off).
fn bulk(spec: LinkSpec, bytes: u64) -> io::Result<f64> {
    let (mut client, mut server) = pair(Some(spec))?;
    let receiver = thread::spawn(move || -> io::Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < bytes {
            match server.read(&mut buf)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => got += n as u64,
            }
        }
        server.write_all(&[1])
    });
    let chunk = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        let n = chunk.len().min((bytes - sent) as usize);
        client.write_all(&chunk[..n])?;
        sent += n as u64;
    }
    let mut ack = [0u8; 1];
    client.read_exact(&mut ack)?;
    let took = start.elapsed().saturating_sub(spec.rtt);
    client.shutdown();
    receiver
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))??;
    Ok(bytes as f64 * 8.0 / took.max(Duration::from_nanos(1)).as_secs_f64() / 1e9)
}

//! `rgpu top`: live sessions of a server, from its metrics endpoint (`rgpu server --metrics`):
//! per session its client, requests (and per second since the last refresh), bulk bytes
//! received and the share of the time its worker spent serving.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
#[command(about = "Live sessions of a server, from its --metrics endpoint")]
pub struct TopArgs {
    /// The server's metrics address (host:port, as given to `rgpu server --metrics`).
    #[arg(long, value_name = "HOST:PORT", env = "RGPU_METRICS")]
    metrics: String,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print once and exit.
    #[arg(long)]
    once: bool,
}

/// One scrape: every sample's name with labels, and its value.
type Samples = HashMap<String, f64>;

pub fn run(args: TopArgs) -> Result<ExitCode, String> {
    let mut previous: Option<(Instant, Samples)> = None;
    loop {
        let samples = scrape(&args.metrics)?;
        let now = Instant::now();
        let text = render(&samples, previous.as_ref().map(|(t, s)| (now - *t, s)));
        if args.once {
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        // Clear the screen and go home, then the table.
        print!("\x1b[2J\x1b[H{text}");
        let _ = std::io::stdout().flush();
        previous = Some((now, samples));
        std::thread::sleep(Duration::from_secs_f64(args.interval.max(0.1)));
    }
}

fn scrape(address: &str) -> Result<Samples, String> {
    let fail = |e: std::io::Error| format!("metrics at {address}: {e}");
    let mut stream = TcpStream::connect(address).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(fail)?;
    let mut response = String::new();
    stream
        .take(16 << 20)
        .read_to_string(&mut response)
        .map_err(fail)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("metrics at {address}: not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "metrics at {address}: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(parse(body))
}

/// The samples of Prometheus text (comments skipped).
fn parse(body: &str) -> Samples {
    body.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A label's value in a sample name (`name{a="x",b="y"}`).
fn label<'a>(sample: &'a str, key: &str) -> Option<&'a str> {
    let start = sample.find(&format!("{key}=\""))? + key.len() + 2;
    let rest = &sample[start..];
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(&rest[..i]),
            _ => escaped = false,
        }
    }
    None
}

fn render(now: &Samples, before: Option<(Duration, &Samples)>) -> String {
    let value = |s: &Samples, k: &str| s.get(k).copied().unwrap_or(0.0);
    let mut out = format!(
        "sessions: {} active, {} started, {} ended ({} abnormally); requests {}\n\n",
        value(now, "rgpu_sessions_active"),
        value(now, "rgpu_sessions_started_total"),
        value(now, "rgpu_sessions_ended_total{how=\"normal\"}")
            + value(now, "rgpu_sessions_ended_total{how=\"abnormal\"}"),
        value(now, "rgpu_sessions_ended_total{how=\"abnormal\"}"),
        value(now, "rgpu_requests_total"),
    );
    out += &format!(
        "{:<20} {:<36} {:>10} {:>9} {:>12} {:>6} {:>10} {:>10}\n",
        "session", "client", "requests", "req/s", "bulk MiB", "busy%", "mem MiB", "queued KiB"
    );
    let mut rows: Vec<(&str, &str, f64, &String)> = now
        .iter()
        .filter(|(k, _)| k.starts_with("rgpu_session_requests_total{"))
        .filter_map(|(k, v)| Some((label(k, "session")?, label(k, "client")?, *v, k)))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (session, client, requests, key) in rows {
        let other = |what: &str| key.replacen("rgpu_session_requests_total", what, 1);
        let bulk = value(now, &other("rgpu_session_received_bulk_bytes_total"));
        let memory = value(now, &other("rgpu_session_memory_bytes"));
        let queued = value(now, &other("rgpu_session_queued_bytes"));
        let (rate, busy) = match before {
            Some((elapsed, then)) if then.contains_key(key.as_str()) => {
                let secs = elapsed.as_secs_f64().max(1e-3);
                let busy_key = other("rgpu_session_busy_seconds_total");
                (
                    format!("{:.1}", (requests - value(then, key)) / secs),
                    format!(
                        "{:.0}",
                        (value(now, &busy_key) - value(then, &busy_key)) / secs * 100.0
                    ),
                )
            }
            _ => ("-".to_string(), "-".to_string()),
        };
        out += &format!(
            "{session:<20} {:<36} {requests:>10} {rate:>9} {:>12.1} {busy:>6} {:>10.1} {:>10.1}\n",
            client.chars().take(36).collect::<String>(),
            bulk / (1 << 20) as f64,
            memory / (1 << 20) as f64,
            queued / 1024.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_becomes_a_table_of_sessions() {
        let body = "# HELP x\nrgpu_sessions_active 1\nrgpu_sessions_started_total 3\n\
            rgpu_sessions_ended_total{how=\"normal\"} 2\nrgpu_requests_total 50\n\
            rgpu_session_requests_total{session=\"9\",client=\"prog[4] \\\"x\\\"\"} 40\n\
            rgpu_session_received_bulk_bytes_total{session=\"9\",client=\"prog[4] \\\"x\\\"\"} 2097152\n\
            rgpu_session_busy_seconds_total{session=\"9\",client=\"prog[4] \\\"x\\\"\"} 0.5\n\
            rgpu_session_memory_bytes{session=\"9\",client=\"prog[4] \\\"x\\\"\"} 3145728\n\
            rgpu_session_queued_bytes{session=\"9\",client=\"prog[4] \\\"x\\\"\"} 2048\n";
        let now = parse(body);
        assert_eq!(now["rgpu_sessions_active"], 1.0);
        let mut then = now.clone();
        *then
            .get_mut("rgpu_session_requests_total{session=\"9\",client=\"prog[4] \\\"x\\\"\"}")
            .unwrap() = 20.0;
        *then
            .get_mut("rgpu_session_busy_seconds_total{session=\"9\",client=\"prog[4] \\\"x\\\"\"}")
            .unwrap() = 0.25;
        let text = render(&now, Some((Duration::from_secs(1), &then)));
        assert!(
            text.starts_with("sessions: 1 active, 3 started, 2 ended"),
            "{text}"
        );
        let row = text.lines().last().unwrap();
        assert!(row.starts_with("9 "), "{text}");
        assert!(row.contains("prog[4] \\\"x\\\""), "{text}");
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            &fields[fields.len() - 6..],
            ["40", "20.0", "2.0", "25", "3.0", "2.0"],
            "{text}"
        );
    }
}

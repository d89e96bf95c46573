//! Logging to stderr for rgpu's processes and the libraries loaded into programs: one format,
//! the level from `RGPU_LOG` (an env_logger filter).

/// A logger at the level `RGPU_LOG` names, else `default`; timestamps to the microsecond when
/// it logs debug or trace messages (debugging the fabric means ordering events microseconds
/// apart, across processes), or when `detailed`.
pub fn log_builder(default: &str, detailed: bool) -> env_logger::Builder {
    let env = env_logger::Env::new()
        .filter_or("RGPU_LOG", default)
        .write_style("RGPU_LOG_STYLE");
    let detailed = detailed
        || std::env::var("RGPU_LOG").is_ok_and(|v| v.contains("debug") || v.contains("trace"));
    let mut builder = env_logger::Builder::from_env(env);
    builder.format_target(false);
    if detailed {
        builder.format_timestamp_micros();
    }
    builder
}

/// Logging for a library in a program (warnings by default); the first call sets it up.
pub fn init_logging() {
    let _ = log_builder("warn", false).try_init();
}

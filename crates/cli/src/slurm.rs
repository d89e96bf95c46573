//! The servers of the SLURM job this command runs in. On each GPU node of a job, rgpu's
//! prolog (packaging/slurm/rgpu-prolog) starts a per-job `rgpu server` bound to the job's GPUs
//! and records it in the job's state directory, `$RGPU_SLURM_STATE/<job id>/` (default
//! /var/spool/rgpu/jobs, on a file system every node of the cluster shares):
//!
//! - `token`: the job's own token (readable by the job's user only);
//! - `servers/<node>`: one line, `<endpoint> <certificate fingerprint>`.
//!
//! A job step that names no servers (no --servers, no RGPU_SERVERS) uses these, so the user
//! writes neither servers nor token. In a heterogeneous job the steps see the leader's job id,
//! which the prolog uses for every component.

use std::path::{Path, PathBuf};

/// Where the prolog keeps per-job state when RGPU_SLURM_STATE does not say.
pub const DEFAULT_STATE_DIR: &str = "/var/spool/rgpu/jobs";

/// A job's servers, their certificates and the job's token.
#[derive(Debug, PartialEq, Eq)]
pub struct JobServers {
    pub servers: String,
    pub fingerprints: String,
    pub token_file: PathBuf,
}

/// The servers of the SLURM job in the environment (SLURM_JOB_ID), if its prolog started any.
pub fn job_servers() -> Result<Option<JobServers>, String> {
    match std::env::var("SLURM_JOB_ID") {
        Ok(job) => servers_of_job(job.trim()),
        Err(_) => Ok(None),
    }
}

/// The servers of job `job` (the id its steps see), if its prolog started any.
pub fn servers_of_job(job: &str) -> Result<Option<JobServers>, String> {
    let state = std::env::var_os("RGPU_SLURM_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    read_job(&state.join(job))
}

/// Reads a job's state directory; `None` where the job has none (no rgpu servers).
fn read_job(dir: &Path) -> Result<Option<JobServers>, String> {
    let listing = match std::fs::read_dir(dir.join("servers")) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", dir.join("servers").display())),
    };
    let mut entries: Vec<(String, String, String)> = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let node = entry.file_name().to_string_lossy().into_owned();
        // Only the records: the prolog's pid and log files sit beside them.
        if node.contains('.') {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        let mut words = text.split_whitespace();
        let (Some(endpoint), Some(fingerprint)) = (words.next(), words.next()) else {
            return Err(format!(
                "{}: expected `<endpoint> <fingerprint>`",
                entry.path().display()
            ));
        };
        entries.push((node, endpoint.to_string(), fingerprint.to_string()));
    }
    if entries.is_empty() {
        return Ok(None);
    }
    // Node order, so that device numbers are the same in every step.
    entries.sort();
    let join = |pick: fn(&(String, String, String)) -> &str| {
        entries.iter().map(pick).collect::<Vec<_>>().join(",")
    };
    Ok(Some(JobServers {
        servers: join(|e| &e.1),
        fingerprints: join(|e| &e.2),
        token_file: dir.join("token"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_servers_are_read_in_node_order() {
        let dir = std::env::temp_dir().join(format!("rgpu-slurm-test-{}", std::process::id()));
        let servers = dir.join("servers");
        std::fs::create_dir_all(&servers).unwrap();
        assert_eq!(read_job(&dir.join("absent")).unwrap(), None);
        assert_eq!(read_job(&dir).unwrap(), None, "no server yet");
        std::fs::write(servers.join("n3"), "10.0.0.13:4000 sha256:bb\n").unwrap();
        std::fs::write(servers.join("n2"), "10.0.0.12:4001 sha256:aa\n").unwrap();
        std::fs::write(servers.join("n2.pid"), "123\n").unwrap();
        let job = read_job(&dir).unwrap().unwrap();
        assert_eq!(job.servers, "10.0.0.12:4001,10.0.0.13:4000");
        assert_eq!(job.fingerprints, "sha256:aa,sha256:bb");
        assert_eq!(job.token_file, dir.join("token"));
        std::fs::write(servers.join("n4"), "garbage\n").unwrap();
        assert!(read_job(&dir).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

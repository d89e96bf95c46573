//! `rgpu cluster-status`: a SLURM cluster's nodes and GPUs, the jobs that hold them, and each
//! job's rgpu servers with the devices they serve (asked of the servers themselves).

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};

use crate::commands::devices::render_table;

#[derive(clap::Args, Debug)]
#[command(
    about = "Show a SLURM cluster's GPU nodes, the jobs holding them and each job's rgpu servers",
    long_about = "Show a SLURM cluster's nodes (state, partitions, GRES), the running jobs on \
                  each, and for every job with rgpu servers (started by rgpu's prolog) the \
                  devices they serve, asked of the servers with the job's token (root, or the \
                  job's own user, can read it). Uses sinfo, squeue and scontrol (SLURM_CONF is \
                  honoured) and the job state directory (RGPU_SLURM_STATE)."
)]
pub struct ClusterStatusArgs {}

/// One running job (or heterogeneous job component) as squeue shows it.
struct Job {
    /// The id job steps see (a heterogeneous job's leader).
    id: String,
    user: String,
    nodes: Vec<String>,
    gres: String,
}

pub fn run(_args: ClusterStatusArgs) -> Result<ExitCode, String> {
    let jobs = running_jobs()?;
    let mut rows = Vec::new();
    for line in slurm(&["sinfo", "-N", "-h", "-o", "%N|%t|%P|%G"])?.lines() {
        let fields: Vec<&str> = line.split('|').collect();
        let [node, state, partition, gres] = fields[..] else {
            continue;
        };
        let holders: Vec<String> = jobs
            .iter()
            .filter(|job| job.nodes.iter().any(|n| n == node))
            .map(|job| format!("{} ({}, {})", job.id, job.user, job.gres))
            .collect();
        rows.push([
            node.to_string(),
            state.to_string(),
            partition.to_string(),
            gres.to_string(),
            if holders.is_empty() {
                "-".into()
            } else {
                holders.join("; ")
            },
        ]);
    }
    let header = ["NODE", "STATE", "PARTITION", "GRES", "JOBS (USER, GRES)"].map(String::from);
    print!("{}", render_table(&header, &rows));

    // Each job with rgpu servers, once: the devices its servers serve.
    let mut with_servers: BTreeMap<String, &Job> = BTreeMap::new();
    for job in &jobs {
        with_servers.entry(job.id.clone()).or_insert(job);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find rgpu itself: {e}"))?;
    for (id, job) in with_servers {
        let Some(servers) = crate::slurm::servers_of_job(&id)? else {
            continue;
        };
        println!(
            "\njob {id} ({}): rgpu servers {}",
            job.user, servers.servers
        );
        let shown = Command::new(&exe)
            .arg("devices")
            .env("SLURM_JOB_ID", &id)
            .env_remove("RGPU_SERVERS")
            .output()
            .map_err(|e| format!("rgpu devices: {e}"))?;
        print!("{}", String::from_utf8_lossy(&shown.stdout));
        if !shown.status.success() {
            let why = String::from_utf8_lossy(&shown.stderr);
            println!("  (cannot ask them: {})", why.trim());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The running jobs, with their nodes listed one by one.
fn running_jobs() -> Result<Vec<Job>, String> {
    let mut jobs = Vec::new();
    for line in slurm(&["squeue", "-h", "-t", "RUNNING", "-o", "%i|%u|%N|%b"])?.lines() {
        let fields: Vec<&str> = line.split('|').collect();
        let [id, user, nodes, gres] = fields[..] else {
            continue;
        };
        // A heterogeneous job's components show as `LEADER+OFFSET`.
        let id = id.split('+').next().unwrap_or(id).to_string();
        let nodes = if nodes.is_empty() {
            Vec::new()
        } else {
            slurm(&["scontrol", "show", "hostnames", nodes])?
                .lines()
                .map(str::to_string)
                .collect()
        };
        jobs.push(Job {
            id,
            user: user.to_string(),
            nodes,
            gres: gres.to_string(),
        });
    }
    Ok(jobs)
}

/// Runs a SLURM command and returns what it printed.
fn slurm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e} (is this a SLURM cluster's node?)", args[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

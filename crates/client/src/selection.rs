//! Which of the servers' devices a program sees, from its environment (the same rules for
//! OpenCL and CUDA):
//!
//! - `RGPU_DEVICE_TYPES`: a comma list of `gpu`, `cpu`, `accelerator`: devices of other types
//!   are hidden (CUDA devices are GPUs).
//! - `RGPU_DEVICE_FILTER`: a comma list of name parts (case-insensitive): only devices whose
//!   name contains one of them are shown.
//! - `RGPU_DEVICES_PER_RANK=k`: the ranks of an MPI job (or the tasks of a SLURM step) each get
//!   `k` devices of their own: rank `r` sees devices `r*k .. r*k+k` of those left by the
//!   filters, so ranks never compete for one. The rank comes from `OMPI_COMM_WORLD_RANK`,
//!   `PMI_RANK` or `SLURM_PROCID`, the first one set.

use std::fmt;

/// What kind of device it is, for `RGPU_DEVICE_TYPES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Cpu,
    Accelerator,
    Other,
}

/// The environment's device selection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSelection {
    kinds: Option<Vec<DeviceKind>>,
    names: Option<Vec<String>>,
    /// `(devices per rank, this process's rank)`.
    per_rank: Option<(usize, usize)>,
}

/// A selection the environment asks for that cannot be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectionError(String);

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectionError {}

/// The variables a process's rank is read from, in order.
const RANK_VARIABLES: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];

impl DeviceSelection {
    /// The selection the process's environment asks for.
    pub fn from_env() -> Result<DeviceSelection, SelectionError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The selection from variables looked up by `var` (the environment, or a test's).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<DeviceSelection, SelectionError> {
        let list = |name: &str| {
            var(name).map(|v| {
                v.split(',')
                    .map(|item| item.trim().to_lowercase())
                    .filter(|item| !item.is_empty())
                    .collect::<Vec<String>>()
            })
        };
        let kinds = list("RGPU_DEVICE_TYPES")
            .map(|items| {
                items
                    .iter()
                    .map(|item| match item.as_str() {
                        "gpu" => Ok(DeviceKind::Gpu),
                        "cpu" => Ok(DeviceKind::Cpu),
                        "accelerator" => Ok(DeviceKind::Accelerator),
                        other => Err(SelectionError(format!(
                            "RGPU_DEVICE_TYPES: unknown device type {other:?} (gpu, cpu, \
                             accelerator)"
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let names = list("RGPU_DEVICE_FILTER");
        let per_rank = match var("RGPU_DEVICES_PER_RANK") {
            None => None,
            Some(value) => {
                let count = value
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&k| k > 0)
                    .ok_or_else(|| {
                        SelectionError(format!(
                            "RGPU_DEVICES_PER_RANK={value:?}: a number of devices (1 or more)"
                        ))
                    })?;
                let rank = RANK_VARIABLES
                    .iter()
                    .find_map(|name| var(name).map(|v| (name, v)))
                    .map(|(name, v)| {
                        v.trim().parse::<usize>().map_err(|_| {
                            SelectionError(format!("{name}={v:?} is not a rank number"))
                        })
                    })
                    .transpose()?;
                // No rank: a process that is not one of the job's ranks (`rgpu run --mpi --
                // mpirun ...` sets the variable for mpirun too, whose hwloc lists OpenCL
                // devices): it sees every device.
                if rank.is_none() {
                    log::debug!(
                        "RGPU_DEVICES_PER_RANK is set but none of {} is: not a rank, every \
                         device is seen",
                        RANK_VARIABLES.join(", ")
                    );
                }
                rank.map(|rank| (count, rank))
            }
        };
        Ok(DeviceSelection {
            kinds,
            names,
            per_rank,
        })
    }

    /// Whether a device of this name and kind passes the type and name filters.
    pub fn admits(&self, name: &str, kind: DeviceKind) -> bool {
        let kind_ok = self
            .kinds
            .as_ref()
            .is_none_or(|kinds| kinds.contains(&kind));
        let name = name.to_lowercase();
        let name_ok = self
            .names
            .as_ref()
            .is_none_or(|parts| parts.iter().any(|part| name.contains(part)));
        kind_ok && name_ok
    }

    /// The devices this process sees, in order: those the filters admit, then this rank's
    /// share of them. An error when the rank's share is beyond the devices there are.
    pub fn choose<T>(
        &self,
        devices: Vec<T>,
        describe: impl Fn(&T) -> (String, DeviceKind),
    ) -> Result<Vec<T>, SelectionError> {
        let admitted: Vec<T> = devices
            .into_iter()
            .filter(|device| {
                let (name, kind) = describe(device);
                self.admits(&name, kind)
            })
            .collect();
        let Some((count, rank)) = self.per_rank else {
            return Ok(admitted);
        };
        let total = admitted.len();
        let first = rank.saturating_mul(count);
        if first.saturating_add(count) > total {
            return Err(SelectionError(format!(
                "rank {rank} wants devices {first}..{} ({count} per rank), but the job has {total}",
                first.saturating_add(count)
            )));
        }
        Ok(admitted.into_iter().skip(first).take(count).collect())
    }

    /// Whether the environment selects anything (for the log).
    pub fn is_active(&self) -> bool {
        *self != DeviceSelection::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn selection(vars: &[(&str, &str)]) -> Result<DeviceSelection, SelectionError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DeviceSelection::from_vars(|name| vars.get(name).cloned())
    }

    fn devices() -> Vec<(String, DeviceKind)> {
        [
            ("NVIDIA H100", DeviceKind::Gpu),
            ("pthread-skylake", DeviceKind::Cpu),
            ("NVIDIA H100", DeviceKind::Gpu),
            ("NVIDIA A100", DeviceKind::Gpu),
        ]
        .iter()
        .map(|(n, k)| (n.to_string(), *k))
        .collect()
    }

    fn names(chosen: Vec<(String, DeviceKind)>) -> Vec<String> {
        chosen.into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn nothing_set_shows_everything() {
        let all = selection(&[]).unwrap();
        assert!(!all.is_active());
        assert_eq!(all.choose(devices(), |d| d.clone()).unwrap().len(), 4);
    }

    #[test]
    fn types_and_names_filter() {
        let gpus = selection(&[("RGPU_DEVICE_TYPES", "gpu")]).unwrap();
        assert_eq!(gpus.choose(devices(), |d| d.clone()).unwrap().len(), 3);
        let h100 = selection(&[("RGPU_DEVICE_FILTER", "h100")]).unwrap();
        assert_eq!(
            names(h100.choose(devices(), |d| d.clone()).unwrap()),
            ["NVIDIA H100", "NVIDIA H100"]
        );
        let cpus = selection(&[("RGPU_DEVICE_TYPES", "cpu, accelerator")]).unwrap();
        assert_eq!(
            names(cpus.choose(devices(), |d| d.clone()).unwrap()),
            ["pthread-skylake"]
        );
        assert!(selection(&[("RGPU_DEVICE_TYPES", "fpga")]).is_err());
    }

    #[test]
    fn ranks_get_distinct_devices() {
        let take = |rank: &str| {
            let chosen = selection(&[
                ("RGPU_DEVICE_TYPES", "gpu"),
                ("RGPU_DEVICES_PER_RANK", "1"),
                ("OMPI_COMM_WORLD_RANK", rank),
            ])
            .unwrap()
            .choose(devices().into_iter().enumerate().collect(), |(_, d)| {
                d.clone()
            });
            chosen.map(|c| c.into_iter().map(|(i, _)| i).collect::<Vec<_>>())
        };
        assert_eq!(take("0").unwrap(), [0]);
        assert_eq!(take("1").unwrap(), [2]);
        assert_eq!(take("2").unwrap(), [3]);
        assert!(take("3").is_err(), "beyond the job's devices");
        // SLURM's task id when MPI says nothing.
        let slurm = selection(&[("RGPU_DEVICES_PER_RANK", "2"), ("SLURM_PROCID", "1")]).unwrap();
        assert_eq!(slurm.choose(devices(), |d| d.clone()).unwrap().len(), 2);
        // No rank at all (mpirun itself, under `rgpu run --mpi -- mpirun`): every device.
        let launcher = selection(&[("RGPU_DEVICES_PER_RANK", "2")]).unwrap();
        let all = devices().len();
        assert_eq!(
            launcher.choose(devices(), |d| d.clone()).unwrap().len(),
            all
        );
        assert!(selection(&[("RGPU_DEVICES_PER_RANK", "0"), ("PMI_RANK", "0")]).is_err());
    }
}

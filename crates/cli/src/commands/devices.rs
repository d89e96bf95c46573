//! `rgpu devices`: list every device the rgpu platform shows, with its server.

use std::process::ExitCode;

use rgpu_cl_api::params::{self, format_value, DEVICE_INFO_PARAMS};
use rgpu_cl_api::sys::{
    CL_DEVICE_GLOBAL_MEM_SIZE, CL_DEVICE_MAX_COMPUTE_UNITS, CL_DEVICE_TYPE, CL_DEVICE_TYPE_ALL,
    CL_DEVICE_VERSION, CL_PLATFORM_NAME,
};
use rgpu_cl_api::{NativeOpenCl, CL_DEVICE_RGPU_SERVER, RGPU_PLATFORM_NAME};

use crate::rgpu_env::{ClientOptions, RgpuEnv};
use rgpu_bench::output::format_bytes;
use rgpu_cl_api::objects::{all_devices, NamedDevice};
use rgpu_client::CudaClient;

#[derive(clap::Args, Debug)]
#[command(
    about = "List the devices of the rgpu servers",
    long_about = "List every device of every server in --servers (or RGPU_SERVERS), as an \
                  OpenCL program run with `rgpu run` would see them in the `rgpu` platform, \
                  with the server that holds each."
)]
pub struct DevicesArgs {
    #[command(flatten)]
    client: ClientOptions,

    /// Also print every info parameter each device answers.
    #[arg(long)]
    all: bool,
}

pub fn run(args: DevicesArgs) -> Result<ExitCode, String> {
    let env = args.client.environment()?;
    env.apply_to_this_process();
    let native = NativeOpenCl::load(None)?;
    let devices = rgpu_devices(&native, &env)?;
    if devices.is_empty() {
        let selected = std::env::vars().any(|(name, _)| {
            [
                "RGPU_DEVICE_TYPES",
                "RGPU_DEVICE_FILTER",
                "RGPU_DEVICES_PER_RANK",
            ]
            .contains(&name.as_str())
        });
        if selected {
            return Err(
                "the rgpu platform has no devices: the device selection \
                        (RGPU_DEVICE_TYPES, RGPU_DEVICE_FILTER, RGPU_DEVICES_PER_RANK) leaves none"
                    .into(),
            );
        }
        return Err(format!(
            "the rgpu platform has no devices: none of the servers {} could be used (see the \
             messages above; -v shows more)",
            env.servers()
        ));
    }

    let rows: Vec<[String; 7]> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| summary_row(&native, index, device))
        .collect();
    let header = [
        "#", "DEVICE", "TYPE", "VERSION", "MEMORY", "UNITS", "SERVER",
    ]
    .map(String::from);
    let mut out = render_table(&header, &rows);
    out += &cuda_table();
    if args.all {
        for (index, device) in devices.iter().enumerate() {
            out += &format!("\ndevice {index}: {}\n", device.name);
            for (param, name, kind) in DEVICE_INFO_PARAMS {
                if let Ok(bytes) = native.device_info(device.device, *param) {
                    out += &format!("  {name:<56} {}\n", format_value(*kind, &bytes));
                }
            }
        }
    }
    rgpu_bench::output::write_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// The devices of the platform named `rgpu`; an error when that platform did not load.
/// The servers' CUDA GPUs as a CUDA program sees them (its device numbers), with the memory
/// in use and the utilization now (the servers' NVML); empty where no server has CUDA.
fn cuda_table() -> String {
    let Ok(found) = rgpu_client::find_cuda_devices(|_| {}) else {
        return String::new();
    };
    if found.devices.is_empty() {
        return String::new();
    }
    let rows: Vec<[String; 5]> = found
        .devices
        .iter()
        .enumerate()
        .map(|(index, device)| {
            let status = device
                .link
                .connection()
                .cuda()
                .get_device_status(device.remote_ordinal)
                .ok()
                .and_then(Result::ok);
            let memory = status.as_ref().and_then(|s| s.memory);
            let used = match memory {
                Some(m) => format!("{} / {}", format_bytes(m.used), format_bytes(m.total)),
                None => format!("? / {}", format_bytes(device.info.total_mem)),
            };
            let busy = status
                .and_then(|s| s.utilization)
                .map_or("?".into(), |u| format!("{}%", u.gpu));
            [
                index.to_string(),
                device.info.name.clone(),
                used,
                busy,
                device.link.endpoint().to_string(),
            ]
        })
        .collect();
    let header = ["#", "CUDA DEVICE", "MEMORY IN USE", "BUSY", "SERVER"].map(String::from);
    format!("\n{}", render_table(&header, &rows))
}

fn rgpu_devices(native: &NativeOpenCl, env: &RgpuEnv) -> Result<Vec<NamedDevice>, String> {
    let devices = all_devices(native, CL_DEVICE_TYPE_ALL)
        .map_err(|e| format!("listing OpenCL devices: {e}"))?;
    let rgpu_platform_loaded = native
        .platform_ids()
        .map_err(|e| format!("listing OpenCL platforms: {e}"))?
        .into_iter()
        .any(|platform| {
            native
                .platform_info_string(platform, CL_PLATFORM_NAME)
                .is_ok_and(|name| name == RGPU_PLATFORM_NAME)
        });
    if !rgpu_platform_loaded {
        return Err(format!(
            "the ICD loader ({}) did not load the rgpu platform from {}; \
             OCL_ICD_DEBUG=7 shows why",
            native.library_path().display(),
            env.icd_library().display()
        ));
    }
    Ok(devices
        .into_iter()
        .filter(|device| device.platform_name == RGPU_PLATFORM_NAME)
        .collect())
}

fn summary_row(native: &NativeOpenCl, index: usize, device: &NamedDevice) -> [String; 7] {
    let text = |param| {
        native
            .device_info_string(device.device, param)
            .unwrap_or_default()
    };
    let number = |param| native.device_info_u64(device.device, param).unwrap_or(0);
    [
        index.to_string(),
        device.name.clone(),
        params::device_type_names(number(CL_DEVICE_TYPE)),
        text(CL_DEVICE_VERSION),
        format_bytes(number(CL_DEVICE_GLOBAL_MEM_SIZE)),
        number(CL_DEVICE_MAX_COMPUTE_UNITS).to_string(),
        text(CL_DEVICE_RGPU_SERVER),
    ]
}

/// Left-aligned columns, two spaces apart.
pub(crate) fn render_table<const N: usize>(header: &[String; N], rows: &[[String; N]]) -> String {
    let mut widths = header.each_ref().map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(16 << 30), "16.0 GiB");
    }
}

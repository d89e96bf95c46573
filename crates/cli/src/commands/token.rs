//! `rgpu token new`: make the shared secret a server and its clients authenticate with.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Random bytes in a token: 256 bits, written as 64 hexadecimal characters.
const TOKEN_BYTES: usize = 32;

#[derive(clap::Args, Debug)]
#[command(about = "Make a token file for `rgpu server --token-file` and its clients")]
pub struct TokenArgs {
    #[command(subcommand)]
    action: TokenAction,
}

#[derive(clap::Subcommand, Debug)]
enum TokenAction {
    /// Write a new random token (256 bits, hex) to FILE, readable by its owner only (0600).
    ///
    /// Give the same file to the server (--token-file, RGPU_SERVER_TOKEN_FILE or token_file in
    /// its config) and copy it to each client machine (RGPU_TOKEN_FILE). The token never
    /// crosses the network: both sides prove they hold it.
    New {
        /// Where to write the token.
        file: PathBuf,
        /// Replace FILE if it exists (clients holding the old token are refused from then on).
        #[arg(long)]
        force: bool,
        /// Make FILE readable by this group too (mode 0640), e.g. the `rgpu` group of the
        /// packaged service when root writes /etc/rgpu/token.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
    },
}

pub fn run(args: TokenArgs) -> Result<ExitCode, String> {
    match args.action {
        TokenAction::New { file, force, group } => {
            if !force && file.symlink_metadata().is_ok() {
                return Err(format!(
                    "{} exists; --force replaces it (clients with the old token are then refused)",
                    file.display()
                ));
            }
            let gid = group.as_deref().map(group_id).transpose()?;
            write_token(&file, &new_token()?, gid)?;
            let mode = if gid.is_some() { "0640" } else { "0600" };
            eprintln!(
                "rgpu: wrote a new token to {} (mode {mode}); give it to the server \
                 (--token-file) and copy it to each client (RGPU_TOKEN_FILE)",
                file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::getrandom(&mut bytes).map_err(|e| format!("the OS random source: {e}"))?;
    Ok(hex::encode(bytes))
}

/// Writes `token` beside `path` with a restrictive mode from the start, then renames it into
/// place: the secret is never readable by others, not even for a moment, and a replaced token
/// is never half-written.
fn write_token(path: &Path, token: &str, gid: Option<libc::gid_t>) -> Result<(), String> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a file name", path.display()))?;
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", temp.display());
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| fail("cannot create", e))?;
        file.write_all(format!("{token}\n").as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| fail("cannot write", e))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&temp, None, Some(gid))
                .map_err(|e| fail("cannot change the group of", e))?;
            std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o640))
                .map_err(|e| fail("cannot change the mode of", e))?;
        }
        std::fs::rename(&temp, path)
            .map_err(|e| format!("cannot move the token into {}: {e}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

fn group_id(name: &str) -> Result<libc::gid_t, String> {
    let c_name = CString::new(name).map_err(|_| format!("bad group name {name:?}"))?;
    // SAFETY: a valid C string; the result is read at once, before any other getgr* call.
    let entry = unsafe { libc::getgrnam(c_name.as_ptr()) };
    if entry.is_null() {
        return Err(format!("no group named {name}"));
    }
    // SAFETY: non-null pointer from getgrnam, valid until the next getgr* call.
    Ok(unsafe { (*entry).gr_gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex_and_private() {
        let dir = std::env::temp_dir().join(format!("rgpu-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let first = new_token().unwrap();
        assert_eq!(first.len(), 2 * TOKEN_BYTES);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(first, new_token().unwrap());
        write_token(&path, &first, None).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let token = rgpu_transport::Token::from_file(&path).unwrap();
        assert_eq!(token.as_bytes(), first.as_bytes());
        // Replacing keeps the mode and leaves no temporary file behind.
        write_token(&path, &new_token().unwrap(), None).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

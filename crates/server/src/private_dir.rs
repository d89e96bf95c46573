//! The process's private directory: made with a random name (`mkdtemp`, mode 0700) the first
//! time it is needed, never a name in /tmp that another user could guess and plant first. A
//! session worker also works in it, so that a compiler resolving a relative `#include` finds
//! nothing of the server's (it starts empty: only sessions' received headers go there).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// The private directory, made now if it was not (`None`: it cannot be made; logged).
pub(crate) fn get() -> Option<&'static Path> {
    DIR.get_or_init(|| match make() {
        Ok(dir) => Some(dir),
        Err(e) => {
            log::error!("no private directory for received headers: {e}");
            None
        }
    })
    .as_deref()
}

fn make() -> Result<PathBuf, String> {
    let template = std::env::temp_dir().join("rgpu-worker-XXXXXX");
    let template = CString::new(template.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut bytes = template.into_bytes_with_nul();
    // SAFETY: a NUL-terminated template ending in XXXXXX, which mkdtemp fills in place.
    let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(std::io::Error::last_os_error().to_string());
    }
    bytes.pop();
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&bytes)))
}

/// A session worker works in the private directory from now on.
pub(crate) fn enter() -> Result<(), String> {
    let dir = get().ok_or("no private directory")?;
    std::env::set_current_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Removes the private directory and what is left in it (at the process's end).
pub(crate) fn remove() {
    if let Some(Some(dir)) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_directory_is_new_and_private() {
        let a = make().unwrap();
        let b = make().unwrap();
        assert_ne!(a, b, "random names");
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        for dir in [a, b] {
            std::fs::remove_dir(dir).unwrap();
        }
    }
}

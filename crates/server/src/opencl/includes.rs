//! Header directories of build options (`-I DIR`): the directory named is the client's, so the
//! client sends the headers it found there and the server builds against its own copy.

use std::path::{Component, Path, PathBuf};

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::IncludeDir;

use crate::opencl::native::ClResult;
use crate::session::Session;

impl Session {
    /// The session's directory for received headers (removed when the session ends), in the
    /// process's private directory (crate::private_dir: no name in /tmp anyone could guess).
    pub(crate) fn include_root(&self) -> ClResult<PathBuf> {
        // Session ids are per server; several servers may run in one process (tests).
        let server = std::sync::Arc::as_ptr(&self.shared) as usize;
        let private = crate::private_dir::get().ok_or(sys::CL_OUT_OF_RESOURCES)?;
        Ok(private.join(format!("s{}-{server:x}", self.id)))
    }

    /// Writes the client's headers under the session's directory and returns the options with
    /// each `-I` pointing at the copy.
    pub(crate) fn stage_includes(
        &self,
        options: &str,
        includes: &[IncludeDir],
    ) -> ClResult<String> {
        if includes.is_empty() {
            return Ok(options.to_string());
        }
        let root = self.include_root()?;
        let mut tokens: Vec<String> = options.split_whitespace().map(str::to_string).collect();
        for include in includes {
            // Named by content: a program built again with the same headers (pyopencl builds
            // many programs with its own -I) reuses the copy already written.
            let name = format!("{:016x}", content_hash(include));
            let copy = root.join(&name);
            if !copy.is_dir() {
                // Written aside and renamed, so a failed write never leaves a partial copy
                // that a later build would reuse.
                let partial = root.join(format!("{name}.partial"));
                let _ = std::fs::remove_dir_all(&partial);
                self.write_headers(&partial, &include.files)?;
                std::fs::rename(&partial, &copy).map_err(|_| sys::CL_OUT_OF_RESOURCES)?;
            }
            point_includes_at(&mut tokens, &include.dir, &copy.to_string_lossy());
        }
        Ok(tokens.join(" "))
    }

    fn write_headers(&self, dir: &Path, files: &[(String, Vec<u8>)]) -> ClResult<()> {
        std::fs::create_dir_all(dir).map_err(|_| sys::CL_OUT_OF_RESOURCES)?;
        for (relative, contents) in files {
            let path = contained(dir, relative).ok_or(sys::CL_INVALID_BUILD_OPTIONS)?;
            // A sent header may include only what the program may (confine.rs).
            let text = String::from_utf8_lossy(contents);
            let confined = super::confine::confine_source(&text);
            let contents = match &confined {
                std::borrow::Cow::Owned(changed) => changed.as_bytes(),
                std::borrow::Cow::Borrowed(_) => contents.as_slice(),
            };
            let written = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&path, contents));
            if let Err(e) = written {
                log::warn!(
                    "session {}: cannot stage header {}: {e}",
                    self.id,
                    path.display()
                );
                return Err(sys::CL_OUT_OF_RESOURCES);
            }
        }
        Ok(())
    }

    /// Removes the headers received for this session.
    pub(crate) fn remove_includes(&self) {
        let Ok(root) = self.include_root() else {
            return;
        };
        if root.exists() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

fn content_hash(include: &IncludeDir) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    include.files.hash(&mut hasher);
    hasher.finish()
}

/// `base/relative` if `relative` is a plain relative path (no `..`, not absolute).
fn contained(base: &Path, relative: &str) -> Option<PathBuf> {
    let relative = Path::new(relative);
    let plain = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    (plain && !relative.as_os_str().is_empty()).then(|| base.join(relative))
}

/// Rewrites `-I DIR` and `-IDIR` for this directory to `-I COPY`.
fn point_includes_at(tokens: &mut [String], dir: &str, copy: &str) {
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "-I" && tokens.get(i + 1).is_some_and(|t| t == dir) {
            tokens[i + 1] = copy.to_string();
            i += 1;
        } else if tokens[i].strip_prefix("-I") == Some(dir) {
            tokens[i] = format!("-I{copy}");
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_accepted() {
        let base = Path::new("/tmp/x");
        assert_eq!(
            contained(base, "a/b.h"),
            Some(PathBuf::from("/tmp/x/a/b.h"))
        );
        assert_eq!(contained(base, "../etc/passwd"), None);
        assert_eq!(contained(base, "/etc/passwd"), None);
        assert_eq!(contained(base, "a/../../b"), None);
        assert_eq!(contained(base, ""), None);
    }

    #[test]
    fn both_option_spellings_are_rewritten() {
        let mut tokens: Vec<String> = "-DX -I /client/inc -I/client/inc -I /other"
            .split_whitespace()
            .map(str::to_string)
            .collect();
        point_includes_at(&mut tokens, "/client/inc", "/srv/0");
        assert_eq!(tokens.join(" "), "-DX -I /srv/0 -I/srv/0 -I /other");
    }
}

//! The headers of a build's `-I` directories: those directories are on this machine, not
//! necessarily on the server's, so their headers travel with the build request.

use std::path::Path;

use rgpu_protocol::opencl::IncludeDir;

/// Files with these extensions are sent (what OpenCL sources include).
const HEADER_EXTENSIONS: &[&str] = &["h", "hh", "hpp", "hxx", "inc", "cl", "clh", "clc"];
/// Bounds on what one directory may send; a larger one (such as /usr/include) is left to the
/// server's own file system.
const MAX_DIR_BYTES: u64 = 16 << 20;
const MAX_DIR_FILES: usize = 4096;
const MAX_DEPTH: usize = 6;

/// The `-I` directories of `options` that exist here, with their headers.
pub fn collect(options: &str) -> Vec<IncludeDir> {
    let mut dirs: Vec<&str> = Vec::new();
    let mut tokens = options.split_whitespace();
    while let Some(token) = tokens.next() {
        let dir = match token.strip_prefix("-I") {
            Some("") => tokens.next(),
            Some(dir) => Some(dir),
            None => None,
        };
        if let Some(dir) = dir {
            if Path::new(dir).is_dir() && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs.into_iter()
        .filter_map(|dir| {
            let mut files = Vec::new();
            let mut bytes = 0;
            match read_headers(Path::new(dir), "", 0, &mut files, &mut bytes) {
                Ok(()) => Some(IncludeDir {
                    dir: dir.to_string(),
                    files,
                }),
                Err(why) => {
                    log::warn!("rgpu: headers of -I {dir} not sent ({why}); the server's own {dir} is used");
                    None
                }
            }
        })
        .collect()
}

fn read_headers(
    dir: &Path,
    prefix: &str,
    depth: usize,
    files: &mut Vec<(String, Vec<u8>)>,
    bytes: &mut u64,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        if path.is_dir() {
            read_headers(&path, &relative, depth + 1, files, bytes)?;
            continue;
        }
        let is_header = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| HEADER_EXTENSIONS.contains(&e));
        if !is_header {
            continue;
        }
        let contents = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        *bytes += contents.len() as u64;
        if *bytes > MAX_DIR_BYTES || files.len() >= MAX_DIR_FILES {
            return Err("too many header bytes or files".into());
        }
        files.push((relative, contents));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_existing_include_dirs_are_collected() {
        let dir = std::env::temp_dir().join(format!("rgpu-includes-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.h"), "#define A 1\n").unwrap();
        std::fs::write(dir.join("sub/b.cl"), "#define B 2\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not a header").unwrap();
        let d = dir.to_string_lossy();
        let options = format!("-DX -I {d} -I/nonexistent/dir -I{d}");
        let found = collect(&options);
        assert_eq!(found.len(), 1, "one existing directory, named twice");
        let mut names: Vec<&str> = found[0].files.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        assert_eq!(names, ["a.h", "sub/b.cl"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The headers of a build's `-I` directories: those directories are on this machine, not
//! necessarily on the server's, so their headers travel with the build request. A header a
//! source includes by its absolute path is this machine's file too: the source sent names it
//! by its file name, and its directory travels as a `-I` directory (the server builds with the
//! program's own files only: it refuses absolute includes).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use rgpu_protocol::opencl::IncludeDir;

/// Files with these extensions are sent (what OpenCL sources include).
const HEADER_EXTENSIONS: &[&str] = &["h", "hh", "hpp", "hxx", "inc", "cl", "clh", "clc"];
/// Bounds on what one directory may send; a larger one (such as /usr/include) is not sent, and
/// the server leaves its `-I` out (a build never reads the server's files).
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

/// `source` with each `#include` of a header on this machine named by its absolute path made
/// to name the file alone, and the directories of those headers (to send as `-I` directories,
/// [`with_include_dirs`]). A path this machine has no readable file at, or whose file name
/// another directory's header already took, is left as it is (the server refuses it).
pub fn localize_absolute(source: &str) -> (Cow<'_, str>, Vec<String>) {
    let mut dirs: HashMap<String, String> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut lines: Option<Vec<String>> = None;
    for (i, line) in source.split('\n').enumerate() {
        let Some((start, end)) = absolute_include(line) else {
            continue;
        };
        let path = Path::new(&line[start..end]);
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            continue;
        };
        let (dir, name) = (dir.to_string_lossy(), name.to_string_lossy());
        let readable = std::fs::File::open(path).is_ok() && path.is_file();
        let taken = dirs.get(name.as_ref()).is_some_and(|d| *d != dir);
        if !readable || taken || dir.contains(char::is_whitespace) {
            continue;
        }
        dirs.entry(name.to_string())
            .or_insert_with(|| dir.to_string());
        if !order.iter().any(|d| *d == dir) {
            order.push(dir.to_string());
        }
        let lines = lines.get_or_insert_with(|| source.split('\n').map(str::to_string).collect());
        lines[i] = format!("{}{name}{}", &line[..start], &line[end..]);
    }
    match lines {
        Some(lines) => (Cow::Owned(lines.join("\n")), order),
        None => (Cow::Borrowed(source), order),
    }
}

/// Where the absolute path of an `#include "/..."` or `#include </...>` line lies in it.
fn absolute_include(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let rest = rest.strip_prefix("include")?;
    let argument = rest.trim_start();
    let close = match argument.chars().next()? {
        '"' => '"',
        '<' => '>',
        _ => return None,
    };
    let start = line.len() - argument.len() + 1;
    let len = line[start..].find(close)?;
    line[start..]
        .starts_with('/')
        .then_some((start, start + len))
}

/// `options` with a `-I` for each of `dirs` (the headers a source included by absolute path).
pub fn with_include_dirs(options: &str, dirs: &[String]) -> String {
    let mut all = options.to_string();
    for dir in dirs {
        all.push_str(" -I ");
        all.push_str(dir);
    }
    all
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

    #[test]
    fn absolute_includes_of_local_headers_name_the_file_alone() {
        let dir = std::env::temp_dir().join(format!("rgpu-absolute-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("one.h"), "#define ONE 1\n").unwrap();
        let d = dir.display();
        let source = format!(
            "#include \"{d}/one.h\"\n  # include <{d}/one.h>\n#include \"/no/such/two.h\"\n\
             #include \"rel.h\"\nkernel void k() {{}}"
        );
        let (sent, dirs) = localize_absolute(&source);
        let lines: Vec<&str> = sent.split('\n').collect();
        assert_eq!(lines[0], "#include \"one.h\"");
        assert_eq!(lines[1], "  # include <one.h>");
        assert_eq!(
            lines[2], "#include \"/no/such/two.h\"",
            "no such file here: as it was"
        );
        assert_eq!(lines[3], "#include \"rel.h\"");
        assert_eq!(dirs, vec![d.to_string()]);
        assert_eq!(with_include_dirs("-DX", &dirs), format!("-DX -I {d}"));
        let (same, none) = localize_absolute("kernel void k() {}");
        assert!(matches!(same, Cow::Borrowed(_)) && none.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

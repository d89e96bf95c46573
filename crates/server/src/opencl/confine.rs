//! What a build may make the compiler read: the program's sources and the headers its client
//! sent (includes.rs), never the server's files. A worker's compiler runs with the worker's
//! rights, and its errors quote what it read (`#include "/etc/shadow"` once put lines of a
//! root-only file into the build log).
//!
//! - Sources and sent headers: an `#include` (or `#include_next`, `#import`, `#embed`) of an
//!   absolute path, of a path with a `..` component, or of a computed name becomes an `#error`
//!   saying so, on the same line: the build fails as any compile error does, with the reason
//!   in its log.
//! - Options: a `-I` the client did not send headers for (a directory not on the client) is
//!   dropped, as a compiler ignores a directory that does not exist; options that make the
//!   compiler read other files (`@file`, `-include`, `-isystem`, `-Xclang`, ...) are refused
//!   with `CL_INVALID_BUILD_OPTIONS`.

use std::borrow::Cow;
use std::path::Path;

use rgpu_cl_api::sys;

/// Directives that read a file named by their argument.
const READING_DIRECTIVES: [&str; 4] = ["include", "include_next", "import", "embed"];
/// Compiler options that read files or load code (prefixes; `-I` is handled apart).
const READING_OPTIONS: [&str; 14] = [
    "@",
    "-include",
    "-imacros",
    "-isystem",
    "-idirafter",
    "-iquote",
    "-iprefix",
    "-iwithprefix",
    "-isysroot",
    "--sysroot",
    "-Xclang",
    "-fplugin",
    "-load",
    "--include",
];

/// `text` with every directive that would read outside the program's own headers replaced by
/// an `#error` (borrowed unchanged when there is none).
pub(crate) fn confine_source(text: &str) -> Cow<'_, str> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out: Option<Vec<String>> = None;
    let mut i = 0;
    while i < lines.len() {
        // A logical line: physical lines joined by trailing backslashes.
        let mut end = i;
        while lines[end].trim_end_matches('\r').ends_with('\\') && end + 1 < lines.len() {
            end += 1;
        }
        let logical: String = lines[i..=end]
            .iter()
            .map(|l| l.trim_end_matches('\r').trim_end_matches('\\'))
            .collect();
        if let Some(why) = refused_directive(&logical) {
            let out = out.get_or_insert_with(|| lines.iter().map(|l| l.to_string()).collect());
            out[i] = format!("#error \"rgpu: {why}\"");
            for line in out.iter_mut().take(end + 1).skip(i + 1) {
                line.clear();
            }
        }
        i = end + 1;
    }
    match out {
        Some(lines) => Cow::Owned(lines.join("\n")),
        None => Cow::Borrowed(text),
    }
}

/// Why a logical line's directive may not run, if it may not.
fn refused_directive(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let name_len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let (name, argument) = rest.split_at(name_len);
    if !READING_DIRECTIVES.contains(&name) {
        return None;
    }
    let argument = argument.trim_start();
    let path = match argument.chars().next() {
        Some('"') => argument[1..].split('"').next(),
        Some('<') => argument[1..].split('>').next(),
        _ => {
            return Some(format!(
                "#{name} of a computed name is refused (the server's files are not the program's)"
            ))
        }
    }
    .unwrap_or_default();
    let outside =
        path.starts_with('/') || Path::new(path).components().any(|c| c.as_os_str() == "..");
    outside.then(|| {
        format!(
            "#{name} of {} is refused: a program includes its own headers only",
            path.replace(['"', '\\'], "")
        )
    })
}

/// The options with every `-I` outside `staged` (the session's copies of the client's header
/// directories) left out; `CL_INVALID_BUILD_OPTIONS` for an option that reads other files.
pub(crate) fn confine_options(options: &str, staged: &Path) -> Result<String, i32> {
    let mut kept: Vec<&str> = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        if READING_OPTIONS.iter().any(|o| word.starts_with(o)) {
            log::warn!("a build option that reads the server's files was refused: {word}");
            return Err(sys::CL_INVALID_BUILD_OPTIONS);
        }
        let Some(joined) = word.strip_prefix("-I") else {
            kept.push(word);
            continue;
        };
        let dir = match joined {
            "" => words.next().unwrap_or_default(),
            dir => dir,
        };
        if Path::new(dir).starts_with(staged) {
            kept.extend(["-I", dir]);
        } else {
            log::debug!("-I {dir}: not a directory the client sent; left out");
        }
    }
    Ok(kept.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_outside_the_program_become_errors_on_their_own_line() {
        let source = "#include \"mine.h\"\n  #  include </etc/shadow>\n#include \"a/../../x\"\n\
                      #define F \"/etc/passwd\"\n#include F\n#embed \"/root/k\"\n#inc\\\nlude \"/x\"\nkernel";
        let confined = confine_source(source);
        let lines: Vec<&str> = confined.split('\n').collect();
        assert_eq!(lines.len(), source.split('\n').count(), "line numbers kept");
        assert_eq!(lines[0], "#include \"mine.h\"");
        assert!(lines[1].starts_with("#error \"rgpu: #include of /etc/shadow is refused"));
        assert!(lines[2].starts_with("#error"), "{}", lines[2]);
        assert_eq!(lines[3], "#define F \"/etc/passwd\"");
        assert!(lines[4].contains("computed name"), "{}", lines[4]);
        assert!(
            lines[5].starts_with("#error \"rgpu: #embed"),
            "{}",
            lines[5]
        );
        assert!(
            lines[6].starts_with("#error"),
            "a continued directive: {}",
            lines[6]
        );
        assert_eq!(lines[7], "");
        assert_eq!(lines[8], "kernel");
        let clean = "#include \"a/b.h\"\n#include <c.h>\nkernel void k() {}";
        assert!(matches!(confine_source(clean), Cow::Borrowed(_)));
    }

    #[test]
    fn options_keep_sent_headers_only() {
        let staged = Path::new("/tmp/rgpu-server-1-s2");
        assert_eq!(
            confine_options("-DX -I /tmp/rgpu-server-1-s2/ab -I/usr/include -w", staged),
            Ok("-DX -I /tmp/rgpu-server-1-s2/ab -w".into())
        );
        for bad in [
            "@/etc/opts",
            "-include /etc/shadow",
            "-Xclang -load",
            "-isystem /root",
        ] {
            assert_eq!(
                confine_options(bad, staged),
                Err(sys::CL_INVALID_BUILD_OPTIONS),
                "{bad}"
            );
        }
    }
}

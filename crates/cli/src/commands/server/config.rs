//! The server's settings from their three sources: the command line, the environment and a
//! TOML config file, in that order of precedence, over the built-in defaults.
//!
//! clap already applies the first two and the defaults; it also knows, per setting, which of
//! them gave the value. The file fills in every setting that the command line and the
//! environment left alone. The merge goes through TOML tables, so a setting added to
//! [`ServerSettings`] is a config key (and shows in `--print-config`) with no code here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};
use serde::Deserialize as _;

use super::ServerSettings;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    Environment(String),
    File(PathBuf),
    Default,
    Unset,
}

/// The settings after the merge, with the source of each (by config key).
#[derive(Debug)]
pub struct Resolved {
    pub settings: ServerSettings,
    /// In the order the settings are declared (and listed by --help).
    sources: Vec<(String, Source)>,
    values: toml::Table,
}

/// One setting as clap declares it: its key (the argument id) and its environment variable.
struct Key {
    name: String,
    env: Option<String>,
}

fn keys() -> Vec<Key> {
    ServerSettings::augment_args(Command::new("rgpu-server"))
        .get_arguments()
        .map(|arg| Key {
            name: arg.get_id().to_string(),
            env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
        })
        .collect()
}

/// Merges `file` (if any) under what the command line and the environment set in `settings`.
pub fn resolve(
    settings: ServerSettings,
    matches: &ArgMatches,
    file: Option<&Path>,
) -> Result<Resolved, String> {
    let file_table = match file {
        Some(path) => read_file(path)?,
        None => toml::Table::new(),
    };
    let keys = keys();
    if let Some(unknown) = file_table
        .keys()
        .find(|k| !keys.iter().any(|key| &key.name == *k))
    {
        let known: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        return Err(format!(
            "{}: unknown setting `{unknown}` (known: {})",
            file.map(|p| p.display().to_string()).unwrap_or_default(),
            known.join(", ")
        ));
    }

    let mut values =
        toml::Table::try_from(&settings).map_err(|e| format!("settings as TOML: {e}"))?;
    let mut sources = Vec::new();
    for key in &keys {
        let given = matches.value_source(&key.name);
        let source = match (given, file_table.get(&key.name)) {
            (Some(ValueSource::CommandLine), _) => Source::CommandLine,
            (Some(ValueSource::EnvVariable), _) => {
                Source::Environment(key.env.clone().unwrap_or_default())
            }
            (_, Some(value)) => {
                values.insert(key.name.clone(), value.clone());
                Source::File(file.map(Path::to_path_buf).unwrap_or_default())
            }
            // An option without a default has no value at all (and no line in `values`).
            (_, None) if values.contains_key(&key.name) => Source::Default,
            (_, None) => Source::Unset,
        };
        sources.push((key.name.clone(), source));
    }
    let settings =
        ServerSettings::deserialize(toml::Value::Table(values.clone())).map_err(|e| {
            format!(
                "{}: {}",
                file.map(|p| p.display().to_string()).unwrap_or_default(),
                e.to_string().trim()
            )
        })?;
    Ok(Resolved {
        settings,
        sources,
        values,
    })
}

fn read_file(path: &Path) -> Result<toml::Table, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    text.parse::<toml::Table>()
        .map_err(|e| format!("config file {}: {e}", path.display()))
}

impl Resolved {
    /// The effective settings as a config file, each line saying where its value came from;
    /// settings with no value are listed commented out.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# rgpu server: effective settings (command line > environment > config file > \
             defaults)\n",
        );
        for (key, source) in &self.sources {
            let value = self
                .values
                .get(key)
                .filter(|_| *source != Source::Unset)
                .map(|v| v.to_string());
            let origin = match source {
                Source::CommandLine => "command line".to_string(),
                Source::Environment(var) => format!("environment: {var}"),
                Source::File(path) => format!("config file: {}", path.display()),
                Source::Default => "default".to_string(),
                Source::Unset => "not set".to_string(),
            };
            match value {
                Some(value) => {
                    let _ = writeln!(out, "{key} = {value}  # {origin}");
                }
                None => {
                    let _ = writeln!(out, "# {key} =  ({origin})");
                }
            }
        }
        out
    }

    #[cfg(test)]
    fn source(&self, key: &str) -> &Source {
        let found = self.sources.iter().find(|(name, _)| name == key);
        &found.expect("a declared setting").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        settings: ServerSettings,
    }

    fn resolve_with(args: &[&str], file_text: Option<&str>) -> Result<Resolved, String> {
        let matches = TestCli::command()
            .try_get_matches_from(std::iter::once("rgpu-server").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let cli = TestCli::from_arg_matches(&matches).map_err(|e| e.to_string())?;
        let dir = std::env::temp_dir().join(format!(
            "rgpu-config-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        let file = file_text.map(|text| {
            std::fs::write(&path, text).unwrap();
            path.as_path()
        });
        let result = resolve(cli.settings, &matches, file);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    // These tests never set the settings' environment variables; CI does not set them either.

    #[test]
    fn file_fills_what_the_command_line_leaves() {
        let r = resolve_with(
            &["--platform", "nvidia"],
            Some("listen = \"0.0.0.0:7450\"\nplatform = \"pocl\"\nno_cuda = true\n"),
        )
        .unwrap();
        assert_eq!(r.settings.listen, "0.0.0.0:7450");
        assert_eq!(r.settings.platform.as_deref(), Some("nvidia"));
        assert!(r.settings.no_cuda);
        assert_eq!(*r.source("platform"), Source::CommandLine);
        assert!(matches!(r.source("listen"), Source::File(_)));
        assert_eq!(*r.source("token_file"), Source::Unset);
    }

    #[test]
    fn defaults_without_a_file() {
        let r = resolve_with(&[], None).unwrap();
        assert_eq!(r.settings.listen, "127.0.0.1:7450");
        assert!(!r.settings.no_cuda);
        assert_eq!(*r.source("listen"), Source::Default);
        assert_eq!(*r.source("no_cuda"), Source::Default);
        let text = r.render();
        assert!(
            text.contains("listen = \"127.0.0.1:7450\"  # default"),
            "{text}"
        );
        assert!(text.contains("no_cuda = false  # default"), "{text}");
        assert!(text.contains("# token_file =  (not set)"), "{text}");
        // The rendering is itself a valid config file that gives the same settings.
        let again = resolve_with(&[], Some(&text)).unwrap();
        assert_eq!(again.settings.listen, "127.0.0.1:7450");
    }

    /// The packaged config (packaging/server.toml) documents every setting, each with its
    /// environment variable, and is itself a valid config.
    #[test]
    fn packaged_config_documents_every_setting() {
        let text = include_str!("../../../../../packaging/server.toml");
        for key in keys() {
            let line = format!("{} = ", key.name);
            assert!(
                text.lines()
                    .any(|l| l.trim_start_matches('#').starts_with(&line)),
                "packaging/server.toml does not show `{}`",
                key.name
            );
            if let Some(env) = &key.env {
                assert!(
                    text.contains(env.as_str()),
                    "packaging/server.toml lacks {env}"
                );
            }
        }
        let r = resolve_with(&[], Some(text)).unwrap();
        assert_eq!(r.settings.listen, "127.0.0.1:7450");
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors() {
        let err = resolve_with(&[], Some("lisen = \"x\"\n")).unwrap_err();
        assert!(err.contains("unknown setting `lisen`"), "{err}");
        let err = resolve_with(&[], Some("no_cuda = \"yes\"\n")).unwrap_err();
        assert!(err.contains("no_cuda") || err.contains("bool"), "{err}");
        let err = resolve_with(&[], Some("listen = \n")).unwrap_err();
        assert!(err.contains("config file"), "{err}");
    }
}

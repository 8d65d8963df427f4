//! `inboxd new rust|python|js NAME`: a folder that builds as it is.
//!
//! Everything is carried in this binary: the handler, its migration, its
//! settings, sample events with the end state they must leave, a README, the
//! WIT world and the SDK of this host's own version (the same files the
//! repository's guests build with, taken in at compile time), so a team
//! needs no checkout of the repository and its SDK matches its host.

use crate::cli::CliError;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The language: rust, python or js.
    #[arg(required_unless_present = "list")]
    pub template: Option<String>,
    /// The handler's name (a-z, 0-9, _), also the folder's unless --dir is given.
    #[arg(required_unless_present = "list")]
    pub name: Option<String>,
    /// The folder to write (default: ./NAME). It must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Show the templates and exit.
    #[arg(long)]
    pub list: bool,
}

/// One file of a template: where it goes in the folder, and its text
/// (`{{name}}` and the like are filled in).
type File = (&'static str, &'static str);

const WIT: File = ("wit/handler.wit", include_str!("../../../../wit/handler.wit"));

/// What every template has.
const COMMON: &[File] = &[
    WIT,
    ("README.md", include_str!("../../../templates/common/README.md")),
    (
        "migrations/0001_init.sql",
        include_str!("../../../templates/common/migrations/0001_init.sql"),
    ),
    (
        "settings.json",
        include_str!("../../../templates/common/settings.json"),
    ),
    (
        "events.jsonl",
        include_str!("../../../templates/common/events.jsonl"),
    ),
    (
        "expected.json",
        include_str!("../../../templates/common/expected.json"),
    ),
];

pub struct Template {
    pub name: &'static str,
    pub language: &'static str,
    /// The handler's source file, as the README names it.
    pub source: &'static str,
    /// What `inboxd build` runs, in a word for the README.
    pub build: &'static str,
    /// The template's own files, beside [`COMMON`].
    files: &'static [File],
    /// README rows for the files beside the common ones.
    readme_rows: &'static str,
}

pub const TEMPLATES: &[Template] = &[
    Template {
        name: "rust",
        language: "Rust",
        source: "src/lib.rs",
        build: "cargo build --release --target wasm32-wasip2",
        files: &[
            ("Cargo.toml", include_str!("../../../templates/rust/Cargo.toml")),
            (
                "rust-toolchain.toml",
                include_str!("../../../templates/rust/rust-toolchain.toml"),
            ),
            (".gitignore", include_str!("../../../templates/rust/gitignore")),
            ("src/lib.rs", include_str!("../../../templates/rust/src/lib.rs")),
            (
                "sdk/rust/Cargo.toml",
                include_str!("../../../templates/rust/sdk-Cargo.toml"),
            ),
            (
                "sdk/rust/src/lib.rs",
                include_str!("../../../../guests/sdk/src/lib.rs"),
            ),
            (
                "sdk/rust/src/error.rs",
                include_str!("../../../../guests/sdk/src/error.rs"),
            ),
            (
                "sdk/rust/src/event.rs",
                include_str!("../../../../guests/sdk/src/event.rs"),
            ),
            (
                "sdk/rust/src/log.rs",
                include_str!("../../../../guests/sdk/src/log.rs"),
            ),
            (
                "sdk/rust/src/outbox.rs",
                include_str!("../../../../guests/sdk/src/outbox.rs"),
            ),
            (
                "sdk/rust/src/sql.rs",
                include_str!("../../../../guests/sdk/src/sql.rs"),
            ),
        ],
        readme_rows: "| `Cargo.toml`, `rust-toolchain.toml` | the build, every version pinned |\n\
                      | `sdk/rust/`, `wit/` | the SDK and the WIT world of the inboxd that wrote this folder |",
    },
    Template {
        name: "python",
        language: "Python",
        source: "app.py",
        build: "componentize-py (installed in .venv from requirements.txt)",
        files: &[
            ("app.py", include_str!("../../../templates/python/app.py")),
            (
                "requirements.txt",
                include_str!("../../../../guests/python/requirements.txt"),
            ),
            (".gitignore", include_str!("../../../templates/python/gitignore")),
            (
                "inboxd_guest/__init__.py",
                include_str!("../../../../guests/python/inboxd_guest/__init__.py"),
            ),
            (
                "inboxd_guest/log.py",
                include_str!("../../../../guests/python/inboxd_guest/log.py"),
            ),
            (
                "inboxd_guest/outbox.py",
                include_str!("../../../../guests/python/inboxd_guest/outbox.py"),
            ),
            (
                "inboxd_guest/sql.py",
                include_str!("../../../../guests/python/inboxd_guest/sql.py"),
            ),
        ],
        readme_rows: "| `requirements.txt` | componentize-py, pinned |\n\
                      | `inboxd_guest/`, `wit/` | the helpers and the WIT world of the inboxd that wrote this folder |",
    },
    Template {
        name: "js",
        language: "JavaScript",
        source: "handler.js",
        build: "jco componentize (installed in node_modules from package.json)",
        files: &[
            ("handler.js", include_str!("../../../templates/js/handler.js")),
            ("package.json", include_str!("../../../templates/js/package.json")),
            (
                "bundle.config.js",
                include_str!("../../../../guests/js/bundle.config.js"),
            ),
            (".gitignore", include_str!("../../../templates/js/gitignore")),
            (
                "inboxd-guest/index.js",
                include_str!("../../../../guests/js/inboxd-guest/index.js"),
            ),
        ],
        readme_rows: "| `package.json` | jco and its WASI shim, pinned |\n\
                      | `inboxd-guest/`, `wit/` | the helpers and the WIT world of the inboxd that wrote this folder |",
    },
];

pub fn template(name: &str) -> Result<&'static Template, CliError> {
    TEMPLATES.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<&str> = TEMPLATES.iter().map(|t| t.name).collect();
        CliError::Usage(format!(
            "no template {name:?}: the templates are {}",
            names.join(", ")
        ))
    })
}

impl Template {
    /// Every file of the folder for handler `name`, filled in.
    pub fn render(&self, name: &str) -> Vec<(&'static str, String)> {
        COMMON
            .iter()
            .chain(self.files)
            .map(|(path, text)| (*path, self.fill(text, name)))
            .collect()
    }

    fn fill(&self, text: &str, name: &str) -> String {
        text.replace("{{name}}", name)
            .replace("{{package}}", &name.replace('_', "-"))
            .replace("{{language}}", self.language)
            .replace("{{template}}", self.name)
            .replace("{{source}}", self.source)
            .replace("{{build}}", self.build)
            .replace("{{files}}", self.readme_rows)
            .replace("{{version}}", env!("CARGO_PKG_VERSION"))
    }
}

pub fn new(args: NewArgs) -> Result<(), CliError> {
    if args.list {
        for t in TEMPLATES {
            println!("{:<8} a handler in {} ({})", t.name, t.language, t.source);
        }
        return Ok(());
    }
    let (Some(template_name), Some(name)) = (args.template.as_deref(), args.name.as_deref()) else {
        return Err(CliError::Usage("usage: inboxd new rust|python|js NAME".into()));
    };
    let template = template(template_name)?;
    if !crate::config::is_identifier(name) {
        return Err(CliError::Usage(format!(
            "{name:?} is not a handler name: use a-z, 0-9 and _, starting with a letter"
        )));
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(name));
    write_folder(&dir, &template.render(name))?;
    println!(
        "wrote {} ({} handler {name}); next:",
        dir.display(),
        template.language
    );
    println!("  cd {} && inboxd build", dir.display());
    println!(
        "  inboxd test target/{name}.wasm --migrations migrations --settings settings.json \
         --events events.jsonl --expect expected.json"
    );
    Ok(())
}

fn write_folder(dir: &Path, files: &[(&str, String)]) -> Result<(), CliError> {
    let failed =
        |path: &Path, e: std::io::Error| CliError::Failed(format!("cannot write {}: {e}", path.display()));
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| failed(dir, e))?;
        if entries.next().is_some() {
            return Err(CliError::Usage(format!(
                "{} exists and is not empty: pick another NAME or --dir",
                dir.display()
            )));
        }
    }
    for (relative, text) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| failed(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_fills_every_placeholder_and_names_its_source() {
        for t in TEMPLATES {
            let files = t.render("shop_orders");
            for (path, text) in &files {
                assert!(!text.contains("{{"), "{} {path} keeps a placeholder", t.name);
            }
            let paths: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
            assert!(paths.contains(&t.source), "{}: {paths:?}", t.name);
            assert!(paths.contains(&"wit/handler.wit") && paths.contains(&"expected.json"));
        }
    }

    #[test]
    fn a_folder_is_written_once_and_never_over_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("h");
        let files = template("rust").unwrap().render("h");
        write_folder(&dir, &files).unwrap();
        assert!(dir.join("sdk/rust/src/sql.rs").is_file());
        let again = write_folder(&dir, &files).unwrap_err().to_string();
        assert!(again.contains("exists and is not empty"), "{again}");
        let err = template("go").map(|_| ()).unwrap_err().to_string();
        assert_eq!(err, "no template \"go\": the templates are rust, python, js");
    }
}

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

/// A file of the repository (a path from `host/`), taken into the binary,
/// and where it goes in the handler's folder.
macro_rules! embed {
    ($to:literal, $from:literal) => {
        ($to, include_str!(concat!("../../../", $from)))
    };
}

/// One file of a template: where it goes in the folder, and its text
/// (`{{name}}` and the like are filled in).
type File = (&'static str, &'static str);

const WIT: File = embed!("wit/handler.wit", "../wit/handler.wit");

/// What every template has.
const COMMON: &[File] = &[
    WIT,
    embed!("README.md", "templates/common/README.md"),
    embed!(
        "migrations/0001_init.sql",
        "templates/common/migrations/0001_init.sql"
    ),
    embed!("events.jsonl", "templates/common/events.jsonl"),
    embed!("expected.json", "templates/common/expected.json"),
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
            embed!("Cargo.toml", "templates/rust/Cargo.toml"),
            embed!("rust-toolchain.toml", "templates/rust/rust-toolchain.toml"),
            embed!(".cargo/config.toml", "templates/rust/cargo/config.toml"),
            embed!("settings.json", "templates/rust/settings.json"),
            embed!(".gitignore", "templates/rust/gitignore"),
            embed!("src/lib.rs", "templates/rust/src/lib.rs"),
            embed!("sdk/rust/Cargo.toml", "templates/rust/sdk-Cargo.toml"),
            embed!("sdk/rust/src/lib.rs", "../guests/sdk/src/lib.rs"),
            embed!("sdk/rust/src/error.rs", "../guests/sdk/src/error.rs"),
            embed!("sdk/rust/src/event.rs", "../guests/sdk/src/event.rs"),
            embed!("sdk/rust/src/log.rs", "../guests/sdk/src/log.rs"),
            embed!("sdk/rust/src/outbox.rs", "../guests/sdk/src/outbox.rs"),
            embed!("sdk/rust/src/sql.rs", "../guests/sdk/src/sql.rs"),
        ],
        readme_rows: "| `Cargo.toml`, `rust-toolchain.toml`, `.cargo/config.toml` | the build, every version pinned, a 64 KiB stack |\n\
                      | `sdk/rust/`, `wit/` | the SDK and the WIT world of the inboxd that wrote this folder |",
    },
    Template {
        name: "python",
        language: "Python",
        source: "app.py",
        build: "componentize-py (installed in .venv from requirements.txt)",
        files: &[
            embed!("app.py", "templates/python/app.py"),
            embed!("settings.json", "templates/python/settings.json"),
            embed!("requirements.txt", "../guests/python/requirements.txt"),
            embed!(".gitignore", "templates/python/gitignore"),
            embed!(
                "inboxd_guest/__init__.py",
                "../guests/python/inboxd_guest/__init__.py"
            ),
            embed!("inboxd_guest/log.py", "../guests/python/inboxd_guest/log.py"),
            embed!(
                "inboxd_guest/outbox.py",
                "../guests/python/inboxd_guest/outbox.py"
            ),
            embed!("inboxd_guest/sql.py", "../guests/python/inboxd_guest/sql.py"),
        ],
        readme_rows: "| `requirements.txt` | componentize-py, pinned (settings.json keeps instances between events: a fresh one costs ~1 ms) |\n\
                      | `inboxd_guest/`, `wit/` | the helpers and the WIT world of the inboxd that wrote this folder |",
    },
    Template {
        name: "js",
        language: "JavaScript",
        source: "handler.js",
        build: "jco componentize (installed in node_modules from package.json)",
        files: &[
            embed!("handler.js", "templates/js/handler.js"),
            embed!("settings.json", "templates/js/settings.json"),
            embed!("package.json", "templates/js/package.json"),
            embed!("bundle.config.js", "../guests/js/bundle.config.js"),
            embed!(".gitignore", "templates/js/gitignore"),
            embed!("inboxd-guest/index.js", "../guests/js/inboxd-guest/index.js"),
        ],
        readme_rows: "| `package.json` | jco and its WASI shim, pinned (settings.json keeps instances between events: a fresh one costs ~1 ms) |\n\
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
            for common in ["wit/handler.wit", "expected.json", "settings.json", "README.md"] {
                assert!(paths.contains(&common), "{}: {paths:?}", t.name);
            }
        }
    }

    /// The language pages show each template's handler as `inboxd new`
    /// writes it for `shop`; a template changed without its page fails here.
    #[test]
    fn each_language_page_shows_its_template_as_written() {
        let pages = [
            ("rust", include_str!("../../../../docs/handlers/rust.md")),
            ("python", include_str!("../../../../docs/handlers/python.md")),
            ("js", include_str!("../../../../docs/handlers/js.md")),
        ];
        for (name, page) in pages {
            let t = template(name).unwrap();
            let files = t.render("shop");
            let (_, source) = files.iter().find(|(path, _)| *path == t.source).unwrap();
            assert!(
                page.contains(source.as_str()),
                "docs/handlers/{name}.md does not show {} as `inboxd new {name} shop` writes it",
                t.source
            );
            assert!(page.contains(&format!("inboxd new {name} shop")), "{name}");
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

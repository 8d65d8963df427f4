//! `inboxd build`: the language's own build, with the flags a handler needs,
//! into `target/NAME.wasm`, then `inboxd check` on the result.
//!
//! The language is read from the folder (`Cargo.toml`: Rust; `app.py`:
//! Python; `package.json`: JavaScript), as `inboxd new` wrote it. Tools are
//! installed where the folder pins them, on first use: componentize-py in
//! `.venv` from `requirements.txt`, jco in `node_modules` from
//! `package.json`; rustup adds the wasm32-wasip2 target from
//! `rust-toolchain.toml`.

use super::check::{CheckArgs, check};
use crate::cli::CliError;
use crate::cli::handler_files::HandlerFiles;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The handler's folder.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The handler's name (default: the folder's name).
    #[arg(long)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Language {
    Rust,
    Python,
    Js,
}

fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

pub async fn build(args: BuildArgs) -> Result<(), CliError> {
    let dir = args
        .dir
        .canonicalize()
        .map_err(|e| usage(format!("cannot open {}: {e}", args.dir.display())))?;
    let name = match &args.name {
        Some(name) => name.clone(),
        None => dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .replace('-', "_"),
    };
    if !crate::config::is_identifier(&name) {
        return Err(usage(format!("{name:?} is not a handler name: pass --name")));
    }
    let language = language(&dir)?;
    let out = dir.join("target").join(format!("{name}.wasm"));
    std::fs::create_dir_all(dir.join("target")).map_err(|e| CliError::Failed(e.to_string()))?;
    // The builds block; they are the whole of this command.
    let (build_dir, build_out) = (dir.clone(), out.clone());
    tokio::task::spawn_blocking(move || match language {
        Language::Rust => build_rust(&build_dir, &build_out),
        Language::Python => build_python(&build_dir, &build_out),
        Language::Js => build_js(&build_dir, &build_out),
    })
    .await
    .map_err(|e| CliError::Failed(format!("the build panicked: {e}")))??;
    println!("built {}", out.display());
    let optional = |file: &str| Some(dir.join(file)).filter(|p| p.exists());
    check(CheckArgs {
        files: HandlerFiles {
            component: out,
            topics: Vec::new(),
            migrations: optional("migrations"),
            settings: optional("settings.json"),
        },
        name: Some(name),
        database: None,
        json: false,
    })
    .await
}

fn language(dir: &Path) -> Result<Language, CliError> {
    let has = |file: &str| dir.join(file).is_file();
    if has("Cargo.toml") {
        Ok(Language::Rust)
    } else if has("app.py") {
        Ok(Language::Python)
    } else if has("package.json") {
        Ok(Language::Js)
    } else {
        Err(usage(format!(
            "{} has no Cargo.toml, app.py or package.json: is it a folder `inboxd new` wrote?",
            dir.display()
        )))
    }
}

/// Runs `program` in `dir` with its output on ours; a failure names the command.
fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), CliError> {
    let shown = format!("{program} {}", args.join(" "));
    eprintln!("inboxd build: {shown}");
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .map_err(|e| CliError::Failed(format!("cannot run {program}: {e} (is it installed?)")))?;
    if status.success() {
        Ok(())
    } else {
        Err(CliError::Failed(format!("`{shown}` failed ({status})")))
    }
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

fn build_rust(dir: &Path, out: &Path) -> Result<(), CliError> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).map_err(|e| usage(e.to_string()))?;
    let package = manifest
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("package")?.get("name")?.as_str().map(str::to_owned))
        .ok_or_else(|| usage("Cargo.toml has no [package] name"))?;
    run(dir, "cargo", &["build", "--release", "--target", "wasm32-wasip2"])?;
    // Cargo's own output folder, which CARGO_TARGET_DIR moves.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| dir.join(t))
        .unwrap_or_else(|| dir.join("target"));
    let built = target
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", package.replace('-', "_")));
    std::fs::copy(&built, out).map(drop).map_err(|e| {
        CliError::Failed(format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            out.display()
        ))
    })
}

fn build_python(dir: &Path, out: &Path) -> Result<(), CliError> {
    let tool = dir.join(".venv/bin/componentize-py");
    if !tool.is_file() {
        run(dir, "python3", &["-m", "venv", ".venv"])?;
        run(
            dir,
            &text(&dir.join(".venv/bin/pip")),
            &[
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                "requirements.txt",
            ],
        )?;
    }
    // -p .: the folder holds app.py and the inboxd_guest helpers.
    run(
        dir,
        &text(&tool),
        &[
            "-d",
            "wit",
            "-w",
            "handler",
            "componentize",
            "app",
            "-p",
            ".",
            "-o",
            &text(out),
        ],
    )
}

fn build_js(dir: &Path, out: &Path) -> Result<(), CliError> {
    let tool = dir.join("node_modules/.bin/jco");
    if !tool.is_file() {
        run(
            dir,
            "npm",
            &["install", "--no-audit", "--no-fund", "--loglevel=error"],
        )?;
    }
    // --bundle: the handler imports the inboxd-guest helpers. `-d http
    // fetch-event`: the host gives no wasi:http; stdio stays, so an uncaught
    // exception's stack reaches the dead letter.
    run(
        dir,
        &text(&tool),
        &[
            "componentize",
            "handler.js",
            "--bundle",
            "--bundle-config",
            "bundle.config.js",
            "--wit",
            "wit",
            "--world-name",
            "handler",
            "-d",
            "http",
            "fetch-event",
            "-o",
            &text(out),
        ],
    )
}
